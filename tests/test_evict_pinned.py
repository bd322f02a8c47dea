"""Eviction pinned at its boundaries (the kept mutation score): which pods are candidates and in
which order (ties included), what share of a release is meaningful (5 %, inclusive), when
CPUEvict's conditions hold (thresholds inclusive, sustain and cooldown to the second, the
satisfaction window), and MemoryEvict's triggers, release and growth estimate."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import tempfile
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from nriplugin.cri import api_pb2 as cri
from nriplugin.cri.client import AsyncCRI
from nriplugin.kernel.cgroup import Cgroups
from nriplugin.kernel.stats import Stats
from nriplugin.node.assembly import Node
from nriplugin.policy.cache import RuleCache
from nriplugin.policy.model import Policy
from nriplugin.policy.qos import QoSClass
from nriplugin.qos.collect import ContainerUsage
from nriplugin.qos.eviction.cpu import (
    MIN_CORES,
    RELEASE_FACTOR,
    CpuConfig,
    CpuEvictDecider,
    CpuFacts,
    emergency_release,
    satisfaction_release,
    shortage,
    suffering,
)
from nriplugin.qos.eviction.evictor import (
    BACKOFF_MAX,
    BACKOFF_MIN,
    Answer,
    EvictionOutcome,
    Evictor,
    RuntimeBackend,
    outcome,
)
from nriplugin.qos.eviction.loop import LADDER, MIN_GAP, Eviction, cpu_facts
from nriplugin.qos.eviction.memory import MemoryConfig, MemoryEvictDecider, MemoryFacts, release, seconds_to_limit
from nriplugin.qos.eviction.victims import (
    LEAK_BYTES_PER_MIN,
    MIN_SHARE,
    Candidate,
    EvictionPlan,
    Release,
    evictable,
    fewest,
    label_priority,
    leaking,
    listed,
    pick,
    rank_cpu,
    rank_memory,
)
from nriplugin.qos.levels import Level
from nriplugin.qos.sample import ClassUsage, NodeSample, Pressure
from nriplugin.qos.strategy import Capacity, Round
from testkit.cri_standin import FakeRuntime, serving
from tests.test_evict import MemoryTree, cpu_case, working_set_reads
from tests.test_features import caps

MiB, GiB = 1 << 20, 1 << 30


def be(n: int, **kw: object) -> Candidate:
    return Candidate(uid=f"u{n}", namespace="batch", name=f"be-{n}", qos=QoSClass.BE, **kw)  # type: ignore[arg-type]


def names(cs: list[Candidate]) -> list[str]:
    return [c.name for c in cs]


# --- victims -------------------------------------------------------------------------------------


def test_constants() -> None:
    assert MIN_SHARE == 0.05 and LEAK_BYTES_PER_MIN == 5 << 20 and RELEASE_FACTOR == 1.2 and MIN_CORES == 0.001


def test_a_candidate_is_said_as_namespace_and_name() -> None:
    assert be(1).who == "batch/be-1"


def test_only_be_pods_are_evictable() -> None:
    assert evictable(be(1))
    for q in QoSClass:
        if q is not QoSClass.BE:
            assert not evictable(Candidate("u", "n", "p", q))


def test_a_plans_share_is_in_its_unit() -> None:
    c = be(1, cpu_cores=2.0, cpu_request_cores=3.0, freeable_bytes=100, growth_bytes_per_min=600.0)
    rel = Release(10.0, "t", "w")
    assert EvictionPlan("s", rel, [], "cores").share(c) == 2.0
    assert EvictionPlan("s", rel, [], "request").share(c) == 3.0
    assert EvictionPlan("s", rel, [], "bytes").share(c) == 100  # no horizon: no growth counted
    assert EvictionPlan("s", rel, [], "bytes", horizon=30.0).share(c) == 100 + 600 / 60 * 30
    shrinking = replace(c, growth_bytes_per_min=-600.0)
    assert EvictionPlan("s", rel, [], "bytes", horizon=30.0).share(shrinking) == 100  # shrinking frees no more


def test_a_meaningful_share_is_five_percent_inclusive() -> None:
    rel = Release(10.0, "t", "w")
    big = be(9, cpu_cores=5.0)
    plan = EvictionPlan("s", rel, [big], "cores")
    assert plan.meaningful(be(1, cpu_cores=0.5))  # 5 % of 10 exactly
    assert not plan.meaningful(be(2, cpu_cores=0.49))
    assert not plan.meaningful(be(3, cpu_cores=0.0))
    assert not EvictionPlan("s", Release(0.0, "t", "w"), [], "cores").meaningful(
        be(3)
    )  # nothing freed is never meaningful
    mem = EvictionPlan("s", Release(1000.0, "t", "w"), [], "bytes")
    assert mem.meaningful(be(4, freeable_bytes=50)) and not mem.meaningful(be(5, freeable_bytes=49))


def test_when_no_cpu_candidate_covers_five_percent_the_bar_is_five_percent_of_the_best() -> None:
    rel = Release(100.0, "t", "w")
    pods = [be(1, cpu_cores=2.0), be(2, cpu_cores=0.1), be(3, cpu_cores=0.09)]
    plan = EvictionPlan("s", rel, pods, "cores")
    assert [plan.meaningful(c) for c in pods] == [True, True, False]  # the bar: 0.1
    alone = EvictionPlan("s", rel, [], "cores")
    assert alone.meaningful(be(4, cpu_cores=1.0))  # no victims listed: the pod itself is the best
    outsider = be(5, cpu_cores=3.0)  # larger than every listed victim: its own share sets the bar
    assert plan.meaningful(outsider) and not EvictionPlan("s", rel, [*pods, outsider], "cores").meaningful(pods[1])
    assert EvictionPlan("s", Release(100.0, "t", "w"), [be(6, cpu_cores=5.0)], "cores").meaningful(be(7, cpu_cores=5.0))
    assert not EvictionPlan("s", rel, [be(6, cpu_cores=5.0)], "cores").meaningful(be(7, cpu_cores=4.99))
    mem = EvictionPlan("s", Release(1000.0, "t", "w"), [be(8, freeable_bytes=40)], "bytes")
    assert not mem.meaningful(be(8, freeable_bytes=40))  # memory has no such fallback


def test_chosen_takes_the_meaningful_victims_until_the_release_is_covered() -> None:
    rel = Release(3.0, "t", "w")
    pods = [be(1, cpu_cores=0.1), be(2, cpu_cores=2.0), be(3, cpu_cores=1.0), be(4, cpu_cores=1.0)]
    assert names(EvictionPlan("s", rel, pods, "cores").chosen()) == ["be-2", "be-3"]


def test_label_priority_is_untrusted_and_bounded() -> None:
    assert label_priority(None) is None and label_priority({}) is None
    assert label_priority({"koordinator.sh/priority": " 7 "}) == 7
    assert label_priority({"koordinator.sh/priority": "-3"}) == -3
    assert label_priority({"koordinator.sh/priority": "123456789012"}) == 123456789012  # 12 characters
    assert label_priority({"koordinator.sh/priority": "1234567890123"}) is None
    assert label_priority({"koordinator.sh/priority": "high"}) is None
    assert label_priority({"priority": "5"}) is None


def test_cpu_ranking_ties() -> None:
    pods = [
        be(5, priority=1, cpu_cores=9.0),
        be(4, cpu_cores=1.0, started=1.0),
        be(3, cpu_cores=1.0, started=2.0),
        be(2, cpu_cores=2.0),
        be(1, cpu_cores=1.0, started=2.0),  # ties with be-3 all along: by uid
        Candidate("l", "web", "api", QoSClass.LS, priority=-9),
    ]
    assert names(rank_cpu(pods)) == ["be-2", "be-1", "be-3", "be-4", "be-5"]
    assert names(rank_cpu([be(7, priority=-1), be(6, priority=0)])) == ["be-7", "be-6"]


def test_leaking_is_strictly_above_the_rate() -> None:
    assert not leaking(be(1, growth_bytes_per_min=float(LEAK_BYTES_PER_MIN)))
    assert leaking(be(1, growth_bytes_per_min=LEAK_BYTES_PER_MIN + 1.0))
    assert leaking(be(1, growth_bytes_per_min=11.0), 10.0) and not leaking(be(1, growth_bytes_per_min=10.0), 10.0)


def test_memory_ranking_ties() -> None:
    leak = LEAK_BYTES_PER_MIN + 1.0
    pods = [
        be(6, priority=-5, freeable_bytes=10 * MiB),
        be(5, priority=3, growth_bytes_per_min=leak),
        be(4, freeable_bytes=MiB, started=1.0),
        be(3, freeable_bytes=MiB, started=2.0),
        be(2, freeable_bytes=2 * MiB),
        be(1, freeable_bytes=MiB, started=2.0),
        Candidate("l", "web", "api", QoSClass.LS, growth_bytes_per_min=leak * 10),
    ]
    assert names(rank_memory(pods)) == ["be-5", "be-6", "be-2", "be-1", "be-3", "be-4"]
    assert names(rank_memory(pods, leak_bytes_per_min=leak)) == ["be-6", "be-2", "be-1", "be-3", "be-4", "be-5"]


def test_pick_stops_once_enough_is_freed_and_skips_what_frees_nothing() -> None:
    pods = [be(1, cpu_cores=0.0), be(2, cpu_cores=-1.0), be(3, cpu_cores=1.0), be(4, cpu_cores=1.0), be(5)]
    assert names(pick(pods, 2.0, lambda c: c.cpu_cores)) == ["be-3", "be-4"]  # exactly 2: done
    assert names(pick(pods, 1.0, lambda c: c.cpu_cores)) == ["be-3"]
    assert names(pick(pods, 5.0, lambda c: c.cpu_cores)) == ["be-3", "be-4"]  # all fall short
    assert pick(pods, 0.0, lambda c: c.cpu_cores) == []


def test_fewest() -> None:
    pods = [be(1, cpu_cores=1.0), be(2, cpu_cores=3.0), be(3, cpu_cores=2.0), be(4, cpu_cores=0.0)]
    pods.append(Candidate("l", "web", "api", QoSClass.LS, cpu_cores=100.0))
    amount = lambda c: c.cpu_cores  # noqa: E731
    assert fewest(pods, 0.0, amount) == 0 and fewest(pods, -1.0, amount) == 0
    assert fewest(pods, 3.0, amount) == 1 and fewest(pods, 3.1, amount) == 2 and fewest(pods, 5.0, amount) == 2
    assert fewest(pods, 6.0, amount) == 3 and fewest(pods, 6.1, amount) == -1
    assert fewest([be(1, cpu_cores=-1.0), be(2, cpu_cores=5.0)], 5.5, amount) == -1


def test_listed_takes_a_list_or_a_function() -> None:
    pods = [be(1)]
    assert listed(pods) is pods and listed(lambda: pods) is pods


# --- CPUEvict ----------------------------------------------------------------------------------


def facts(**kw: object) -> CpuFacts:
    """The 64-core case (``cpu_case``): 4 for the system, BE at 8, LS at 52 and stalled 13 %."""
    return replace(cpu_case()[0], **kw)  # type: ignore[arg-type]


def test_shortage_takes_the_larger_of_reserved_and_used_by_the_system() -> None:
    assert shortage(facts()) == pytest.approx((52 * 1.13, 52.0, 52 * 0.13))
    assert shortage(facts(other_usage=6.0))[1] == 50.0
    assert shortage(facts(ls_throttled=0.2))[0] == pytest.approx(52 * 1.2)
    assert shortage(facts(be_usage=70.0))[1] == 0.0  # never negative


def test_suffering_thresholds_are_inclusive() -> None:
    cfg = CpuConfig()
    assert suffering(facts(ls_stall=0.1), cfg) and not suffering(facts(ls_stall=0.099), cfg)
    assert suffering(facts(ls_stall=0.0, ls_throttled=0.2), cfg)
    assert not suffering(facts(ls_stall=0.0, ls_throttled=0.199), cfg)


def test_the_emergency_release_and_its_reason() -> None:
    cfg = CpuConfig()
    rel = emergency_release(facts(score=90.0), cfg)  # the threshold itself is EMERGENCY
    assert rel is not None and rel.trigger == "emergency" and rel.amount == pytest.approx(1.2 * 52 * 0.13)
    assert rel.why == (
        "CPU score 90 >= 90, BE suppressed, LS stalled 13% / throttled 0%: LS wants 58.76 cores, has 52.00 "
        "(64 - 4.00 system - 8.00 BE); release 1.2 x 6.76 = 8.11 cores"
    )
    assert emergency_release(facts(score=89.99), cfg) is None
    assert emergency_release(facts(total=70.0, ls_usage=50.0, ls_stall=0.25, be_usage=3.5), cfg) is None  # no shortage
    other = emergency_release(facts(), replace(cfg, release_factor=2.0))
    assert other is not None and other.amount == pytest.approx(2 * 52 * 0.13)
    # BE's group SCHED_IDLE: LS's waits are not BE's, however short LS is
    assert emergency_release(facts(score=100.0, be_idle=True, ls_stall=0.5), cfg) is None


def test_the_satisfaction_release_boundaries() -> None:
    cfg = CpuConfig(satisfaction_lower=40, satisfaction_upper=60)
    assert satisfaction_release(10.0, 3.0, 2.9, CpuConfig()) is None  # not configured
    assert satisfaction_release(10.0, 3.0, 2.9, replace(cfg, satisfaction_upper=None)) is None
    assert satisfaction_release(0.0, 3.0, 2.9, cfg) is None and satisfaction_release(10.0, 0.0, 0.0, cfg) is None
    assert satisfaction_release(10.0, 3.0, 2.7, cfg) is not None  # 90 % of its limit: used
    assert satisfaction_release(10.0, 3.0, 2.69, cfg) is None
    small = satisfaction_release(10.0, 0.5, 0.0, cfg)  # under a core: its use is not asked
    assert small is not None and small.amount == pytest.approx(5.5)
    at = satisfaction_release(10.0, 4.0, 4.0, cfg)  # 40 %: at the lower percent, inclusive
    assert at is not None and at.amount == pytest.approx(2.0) and at.trigger == "be_satisfaction"
    assert at.why == (
        "BE satisfaction 40% (limit 4.00 / request 10.00) <= 40% with BE using 4.00 cores; "
        "release 10.00 x (60% - 40%) = 2.00 requested cores"
    )
    assert satisfaction_release(10.0, 4.01, 4.01, cfg) is None
    assert satisfaction_release(10.0, 4.0, 4.0, replace(cfg, satisfaction_upper=40)) is None  # nothing to give
    assert satisfaction_release(10.0, 4.0, 4.0, replace(cfg, satisfaction_upper=40.5)) is not None
    assert satisfaction_release(10.0, 1.0, 1.0, replace(cfg, be_usage_threshold=100)) is not None


def test_sustain_and_cooldown_to_the_second() -> None:
    pods = [be(i, cpu_cores=3.0) for i in range(4)]
    ev = CpuEvictDecider(CpuConfig(sustain=2.0, cooldown=60.0))
    assert ev.decide(facts(t=100.0), pods) is None
    assert ev.decide(facts(t=101.9), pods) is None
    assert ev.decide(facts(t=102.0), pods) is not None  # held 2 s: sustained
    assert ev.decide(facts(t=103.0, score=50.0), pods) is None  # the conditions break: start again
    assert ev.decide(facts(t=104.0), pods) is None and ev.decide(facts(t=106.0), pods) is not None
    ev.evicted(106.0)
    assert ev.last_evicted == 106.0
    assert ev.decide(facts(t=165.9), pods) is None
    assert ev.decide(facts(t=166.0), pods) is not None  # 60 s after: the cooldown is over
    assert CpuEvictDecider().cfg == CpuConfig()


def test_an_emergency_plan_leaves_out_idle_pods_and_is_in_cores() -> None:
    pods = [be(1, cpu_cores=0.001, priority=-1), be(2, cpu_cores=0.000999, priority=-2), be(3, cpu_cores=3.0)]
    plan = CpuEvictDecider(CpuConfig(sustain=0.0)).decide(facts(), lambda: pods)
    assert plan is not None and plan.unit == "cores" and plan.strategy == "CPUEvict"
    assert names(plan.victims) == ["be-3"]  # 0.001 is a share under 5 % of the best
    assert plan.release.trigger == "emergency"
    tiny = [be(1, cpu_cores=0.001), be(2, cpu_cores=0.000999)]
    plan = CpuEvictDecider(CpuConfig(sustain=0.0)).decide(facts(), tiny)
    assert plan is not None and names(plan.victims) == ["be-1"]  # a millicore is not idle
    assert CpuEvictDecider(CpuConfig(sustain=0.0)).decide(facts(), [be(2, cpu_cores=0.0009)]) is None


def sat_facts(t: float, limit: float | None = 3.0, usage: float = 3.0, request: float = 10.0) -> CpuFacts:
    return facts(t=t, score=10.0, be_request=request, be_limit=limit, be_usage=usage)


def test_the_satisfaction_variant_needs_a_third_of_its_window() -> None:
    cfg = CpuConfig(satisfaction_lower=40, satisfaction_upper=60, window=30.0, sustain=0.0)
    pods = [be(1, cpu_request_cores=2.0), be(2, cpu_request_cores=2.0, priority=-1), be(3)]
    ev = CpuEvictDecider(cfg)
    assert ev.decide(sat_facts(0.0), pods) is None
    assert ev.decide(sat_facts(9.9), pods) is None  # under a third of 30 s
    plan = ev.decide(sat_facts(10.0), pods)
    assert plan is not None and plan.unit == "request" and plan.release.trigger == "be_satisfaction"
    assert names(plan.victims) == ["be-2", "be-1"] and plan.release.amount == pytest.approx(3.0)
    assert ev.decide(sat_facts(11.0, limit=None), pods) is None  # no limit: the window starts again
    assert ev.decide(sat_facts(12.0), pods) is None and ev.decide(sat_facts(21.9), pods) is None
    assert ev.decide(sat_facts(22.0), pods) is not None
    assert CpuEvictDecider(cfg).decide(sat_facts(0.0), []) is None


def test_the_satisfaction_release_is_the_smaller_of_the_window_and_now() -> None:
    cfg = CpuConfig(satisfaction_lower=40, satisfaction_upper=60, window=30.0)
    pods = [be(1, cpu_request_cores=5.0)]
    ev = CpuEvictDecider(cfg)
    ev.decide(sat_facts(0.0, limit=1.0, usage=1.0), pods)
    plan = ev.decide(sat_facts(10.0, limit=3.0), pods)  # average limit 2 (4 released), now 3 (3)
    assert plan is not None and plan.release.amount == pytest.approx(3.0)
    ev = CpuEvictDecider(cfg)
    ev.decide(sat_facts(0.0, limit=3.0), pods)
    plan = ev.decide(sat_facts(10.0, limit=1.0, usage=1.0), pods)  # average 2 (4), now 1 (5)
    assert plan is not None and plan.release.amount == pytest.approx(4.0)
    ev = CpuEvictDecider(cfg)
    ev.decide(sat_facts(0.0, limit=5.0), pods)
    assert ev.decide(sat_facts(10.0, limit=3.0), pods) is None  # the average (40 %... 4 cores) is fine
    ev = CpuEvictDecider(cfg)
    ev.decide(sat_facts(0.0, limit=3.0), pods)
    assert ev.decide(sat_facts(10.0, limit=5.0), pods) is None  # now it is fine


def test_the_satisfaction_window_drops_what_is_older_than_it() -> None:
    cfg = CpuConfig(satisfaction_lower=40, satisfaction_upper=60, window=30.0)
    pods = [be(1, cpu_request_cores=5.0)]
    ev = CpuEvictDecider(cfg)
    ev.decide(sat_facts(0.0, limit=0.2, usage=0.2), pods)  # leaves the window at 30 s and after
    ev.decide(sat_facts(20.0, limit=3.0), pods)
    plan = ev.decide(sat_facts(30.0, limit=3.0), pods)  # (0.2 + 3 + 3) / 3 kept: 30 s is in the window
    assert plan is not None and plan.release.amount == pytest.approx(3.0)
    ev.decide(sat_facts(0.0, limit=0.2, usage=0.2), pods)  # an older reading is kept as it comes
    plan = ev.decide(sat_facts(30.1, limit=3.0), pods)
    assert plan is not None and plan.release.amount == pytest.approx(3.0)


# --- MemoryEvict -------------------------------------------------------------------------------


def test_the_lower_mark_defaults_to_two_under_the_threshold_within_zero_and_it() -> None:
    assert MemoryConfig().lower == 68.0
    assert MemoryConfig(threshold_percent=1.0).lower == 0.0
    assert MemoryConfig(lower_percent=50.0).lower == 50.0
    assert MemoryConfig(lower_percent=80.0).lower == 70.0
    assert MemoryConfig(lower_percent=-5.0).lower == 0.0


def test_seconds_to_limit() -> None:
    assert seconds_to_limit(MemoryFacts(0.0, 1000, 500)) is None
    assert seconds_to_limit(MemoryFacts(0.0, 1000, 500, growth=-1.0)) is None
    assert seconds_to_limit(MemoryFacts(0.0, 1000, 500, growth=50.0)) == 10.0
    assert seconds_to_limit(MemoryFacts(0.0, 1000, 1200, growth=50.0)) == 0.0


def test_memory_triggers_are_inclusive() -> None:
    cfg = MemoryConfig()
    cap = 1000 * MiB
    assert release(MemoryFacts(0.0, 0, 10), cfg) is None
    at = release(MemoryFacts(0.0, cap, 700 * MiB), cfg)
    assert at is not None and at.trigger == "threshold"
    assert at.amount == pytest.approx(1.3 * 20 * MiB)
    assert at.why == "pods use 700 of 1000 MiB (70%): release 1.3 x (700 - 68% = 680) MiB = 26 MiB"
    assert release(MemoryFacts(0.0, cap, 700 * MiB - 1), cfg) is None
    oom = release(MemoryFacts(0.0, cap, 690 * MiB, growth=31 * MiB), cfg)  # the limit in 10 s exactly
    assert oom is not None and oom.trigger == "oom_risk" and oom.amount == pytest.approx(1.3 * 10 * MiB)
    assert release(MemoryFacts(0.0, cap, 690 * MiB, growth=30.9 * MiB), cfg) is None
    score = release(MemoryFacts(0.0, cap, 690 * MiB, score=85.0), cfg)
    assert score is not None and score.trigger == "pressure"
    assert score.why == (
        "pods use 690 of 1000 MiB (69%), pressure score 85: release 1.3 x (690 - 68% = 680) MiB = 13 MiB"
    )
    assert release(MemoryFacts(0.0, cap, 690 * MiB, score=84.9), cfg) is None
    crit = release(MemoryFacts(0.0, cap, 690 * MiB, critical=True), cfg)
    assert (
        crit is not None
        and crit.trigger == "pressure"
        and crit.why.endswith("(69%), kernel reports critical pressure: release 1.3 x (690 - 68% = 680) MiB = 13 MiB")
    )
    assert release(MemoryFacts(0.0, cap, 600 * MiB, critical=True), cfg) is None  # under the lower mark


def test_the_memory_release_growth_and_pending() -> None:
    cfg = MemoryConfig()
    cap = 1000 * MiB
    rel = release(MemoryFacts(0.0, cap, 800 * MiB, growth=10 * MiB), cfg)  # 100 within 10 s, 200 left
    assert rel is not None and rel.trigger == "threshold" and rel.amount == pytest.approx(1.3 * 120 * MiB)
    assert rel.why == (
        "pods use 800 of 1000 MiB (80%), growing 10.0 MiB/s (limit in 20.0 s): release 1.3 x (800 - 68% = 680) MiB"
        " = 156 MiB"
    )
    rel = release(MemoryFacts(0.0, cap, 700 * MiB, growth=60 * MiB), cfg)  # 600 in 10 s, 300 left
    assert rel is not None and rel.amount == pytest.approx(300 * MiB)
    assert rel.why == (
        "pods use 700 of 1000 MiB (70%), growing 60.0 MiB/s (limit in 5.0 s): release 1.3 x (700 - 68% = 680) MiB"
        " or the growth within 10 s = 300 MiB"
    )
    rel = release(MemoryFacts(0.0, cap, 800 * MiB, pending=100 * MiB), cfg)
    assert rel is not None and rel.amount == pytest.approx(56 * MiB)
    assert rel.why.endswith("= 680) MiB, less 100 MiB on its way out = 56 MiB")
    assert release(MemoryFacts(0.0, cap, 800 * MiB, pending=156 * MiB), cfg) is None
    assert release(MemoryFacts(0.0, cap, 800 * MiB, pending=int(156 * MiB) - 1), cfg) is not None
    rel = release(MemoryFacts(0.0, cap, 800 * MiB), replace(cfg, release_factor=1.0, lower_percent=50))
    assert rel is not None and rel.amount == pytest.approx(300 * MiB)
    rel = release(MemoryFacts(0.0, cap, 700 * MiB, growth=1.0), cfg)  # far from the limit: by level
    assert rel is not None and rel.amount == pytest.approx(1.3 * 20 * MiB)


def test_growth_is_the_smaller_of_two_steps_once_they_are_spanned() -> None:
    m = MemoryEvictDecider(rate_window=10.0)
    assert m.observe(0.0, 0) == 0.0 and m.observe(1.0, 100) == 0.0
    assert m.observe(2.0, 200) == 0.0  # one step spanned, not two
    assert m.observe(4.0, 600) == pytest.approx(100.0)  # 200/2 s before, 400/2 s now: the smaller
    assert m.observe(4.0, 99999) == pytest.approx(100.0)  # a reading at the same time is dropped
    assert m.observe(3.0, 99999) == pytest.approx(100.0)  # and an older one
    m = MemoryEvictDecider()
    for t, u in [(0.0, 1000), (2.0, 600), (4.0, 400)]:
        m.observe(t, u)
    assert m.growth() == 0.0  # shrinking is no growth
    m = MemoryEvictDecider()
    for t, u in [(0.0, 0), (1.0, 0), (3.0, 300), (5.0, 700)]:
        m.observe(t, u)
    assert m.growth() == pytest.approx(150.0)  # a: t=3 (2 s back), b: t=1 (2 s before it): min(200, 150)
    assert m.growth(step=3.0) == 0.0  # a at t=1, nothing 3 s before it


def test_old_readings_leave_the_window_but_two_stay() -> None:
    m = MemoryEvictDecider(rate_window=4.0)
    for t, u in [(0.0, 0), (2.0, 200), (4.0, 400)]:
        m.observe(t, u)
    assert m.growth() == pytest.approx(100.0)
    m.observe(4.5, 450)  # t=0 is 4.5 s back: gone; t=2 stays (2.5 s)
    assert m.growth() == 0.0  # two steps are no longer spanned
    m = MemoryEvictDecider(rate_window=4.0)
    for t, u in [(0.0, 0), (2.0, 200), (4.0, 400)]:
        m.observe(t, u)
    assert m.observe(100.0, 10_000) == 0.0  # the last two kept: one step only
    m = MemoryEvictDecider(rate_window=4.0)
    for t, u in [(0.0, 0), (2.0, 200), (4.0, 600)]:
        m.observe(t, u)
    assert m.growth() == pytest.approx(100.0)  # 4 s back is inside a 4 s window


def test_memory_decide_horizon_urgency_and_growing_victims() -> None:
    cap = 1000 * MiB
    leak = LEAK_BYTES_PER_MIN + 1.0
    pods = [be(1, freeable_bytes=100 * MiB), be(2, freeable_bytes=50 * MiB, growth_bytes_per_min=leak)]
    ev = MemoryEvictDecider()
    plan = ev.decide(MemoryFacts(0.0, cap, 800 * MiB), pods)
    assert plan is not None and plan.strategy == "MemoryEvict" and plan.unit == "bytes"
    assert plan.horizon == 0.0 and not plan.urgent and names(plan.victims) == ["be-2", "be-1"]
    plan = ev.decide(MemoryFacts(0.0, cap, 690 * MiB, growth=31 * MiB), lambda: pods)  # 10 s: the horizon
    assert plan is not None and plan.horizon == 10.0 and not plan.urgent and names(plan.victims) == ["be-2"]
    plan = ev.decide(MemoryFacts(0.0, cap, 800 * MiB, growth=40 * MiB), pods)  # 5 s: urgent
    assert plan is not None and plan.urgent and plan.horizon == 10.0 and names(plan.victims) == ["be-2", "be-1"]
    plan = ev.decide(MemoryFacts(0.0, cap, 800 * MiB, growth=39 * MiB), pods)
    assert plan is not None and not plan.urgent
    plan = ev.decide(MemoryFacts(0.0, cap, 700 * MiB, growth=1 * MiB), pods)  # 300 s away: no horizon
    assert plan is not None and plan.horizon == 0.0
    assert ev.decide(MemoryFacts(0.0, cap, 600 * MiB), pods) is None
    steady = [be(1, freeable_bytes=500 * MiB), be(3, growth_bytes_per_min=float(LEAK_BYTES_PER_MIN))]
    assert ev.decide(MemoryFacts(0.0, cap, 690 * MiB, growth=31 * MiB), steady) is None  # no pod grows
    assert ev.decide(MemoryFacts(0.0, cap, 800 * MiB), [be(4, freeable_bytes=MiB)]) is None  # frees too little
    custom = MemoryEvictDecider(MemoryConfig(leak_bytes_per_min=1.0))
    plan = custom.decide(
        MemoryFacts(0.0, cap, 800 * MiB),
        [be(5, freeable_bytes=100 * MiB), be(6, growth_bytes_per_min=2.0, freeable_bytes=60 * MiB)],
    )
    assert plan is not None and names(plan.victims) == ["be-6", "be-5"]
    assert MemoryEvictDecider().cfg == MemoryConfig() and MemoryEvictDecider().rate_window == 10.0


# --- the evictor -------------------------------------------------------------------------------


@dataclass
class Backend:
    """A backend answering from a script (the Eviction API's outcomes), recording every call."""

    answers: dict[str, object] = field(default_factory=dict)
    calls: list[tuple[str, str, str, int, str, str]] = field(default_factory=list)

    async def evict(self, ns: str, name: str, uid: str, grace_seconds: int, reason: str, message: str) -> object:
        self.calls.append((ns, name, uid, grace_seconds, reason, message))
        answer = self.answers.get(name, EvictionOutcome.EVICTED)
        if isinstance(answer, Exception):
            raise answer
        return answer


@dataclass
class Gated(Backend):
    """A backend whose evictions wait until ``gate`` is set (a slow Eviction API)."""

    gate: asyncio.Event = field(default_factory=asyncio.Event)

    async def evict(self, ns: str, name: str, uid: str, grace_seconds: int, reason: str, message: str) -> object:
        await self.gate.wait()
        return EvictionOutcome.EVICTED


@dataclass
class Clock:
    t: float = 0.0

    def __call__(self) -> float:
        return self.t


@dataclass
class Counts:
    failed: list[tuple[str, str]] = field(default_factory=list)
    done: list[tuple[str, str, bool]] = field(default_factory=list)

    def evicted(self, strategy: str, reason: str, dry_run: bool) -> None:
        self.done.append((strategy, reason, dry_run))

    def eviction_failed(self, backend: str, outcome: str) -> None:
        self.failed.append((backend, outcome))


def cpu_plan(pods: list[Candidate], amount: float, **kw: object) -> EvictionPlan:
    return EvictionPlan("CPUEvict", Release(amount, "emergency", "LS starves"), pods, "cores", **kw)  # type: ignore[arg-type]


def mem_plan(pods: list[Candidate], amount: float, **kw: object) -> EvictionPlan:
    return EvictionPlan("MemoryEvict", Release(amount, "threshold", "too full"), pods, "bytes", **kw)  # type: ignore[arg-type]


def run(ev: Evictor, plan: EvictionPlan, groups: dict[str, str] | None = None) -> list[str]:
    return names(asyncio.run(ev.execute(plan, groups or {})))


def test_outcome_reads_enums_values_and_results() -> None:
    assert outcome(EvictionOutcome.BLOCKED) is EvictionOutcome.BLOCKED and outcome("gone") is EvictionOutcome.GONE
    assert outcome(Answer(EvictionOutcome.EVICTED)) is EvictionOutcome.EVICTED
    assert outcome(Answer(EvictionOutcome.ERROR, "x")) is EvictionOutcome.ERROR
    assert outcome("nonsense") is EvictionOutcome.ERROR and outcome(None) is EvictionOutcome.ERROR
    assert BACKOFF_MIN == 1.0 and BACKOFF_MAX == 60.0


def test_the_evictor_defaults() -> None:
    ev = Evictor()
    assert (ev.dry_run, ev.max_per_minute, ev.grace_seconds) == (False, 10, 5)
    assert (ev.repeat_after, ev.retry_after, ev.pending_timeout) == (120.0, 30.0, 60.0)
    assert ev.failures == 0 and not ev.backing_off() and not ev.busy("CPUEvict")


def test_what_the_backend_is_told(caplog: pytest.LogCaptureFixture) -> None:
    cluster = Backend()
    ev = Evictor(cluster=cluster, runtime=Backend())
    with caplog.at_level(logging.WARNING, "nriplugin.qos.evict"):
        assert run(ev, cpu_plan([be(1, cpu_cores=1.5)], 1.0)) == ["be-1"]
    message = "CPUEvict (emergency): LS starves; this pod frees about 1.50 cores"
    assert cluster.calls == [("batch", "be-1", "u1", 5, "emergency", message)]
    (rec,) = caplog.records
    assert rec.getMessage() == f"evicting batch/be-1 via cluster (grace 5 s): {message}"
    assert (rec.strategy, rec.trigger, rec.victim, rec.uid, rec.via, rec.grace_seconds, rec.dry_run) == (  # type: ignore[attr-defined]
        "CPUEvict",
        "emergency",
        "batch/be-1",
        "u1",
        "cluster",
        5,
        False,
    )
    runtime = Backend()
    ev = Evictor(runtime=runtime)
    run(ev, mem_plan([be(2, freeable_bytes=300 * MiB)], 100 * MiB))
    assert runtime.calls[0][3:] == (5, "threshold", "MemoryEvict (threshold): too full; this pod frees about 300 MiB")


def test_the_backend_chosen() -> None:
    cluster, runtime, late = Backend(), Backend(), Backend()
    run(Evictor(cluster=cluster, runtime=runtime), cpu_plan([be(1, cpu_cores=1.0)], 1.0, urgent=True))
    assert [c[1] for c in runtime.calls] == ["be-1"] and runtime.calls[0][3] == 0 and not cluster.calls
    ev = Evictor(cluster=cluster, runtime=None)
    run(ev, cpu_plan([be(2, cpu_cores=1.0)], 1.0, urgent=True))
    assert [c[1] for c in cluster.calls] == ["be-2"] and cluster.calls[0][3] == 0  # no runtime: the cluster
    assert ev.history[-1]["via"] == "cluster"
    ev = Evictor(cluster=cluster, runtime=runtime, cluster_of=lambda: late)
    run(ev, cpu_plan([be(3, cpu_cores=1.0)], 1.0))
    assert [c[1] for c in late.calls] == ["be-3"]  # the cluster side as it is now
    ev = Evictor(cluster=cluster, runtime=runtime, cluster_of=lambda: None)
    run(ev, cpu_plan([be(4, cpu_cores=1.0)], 1.0))
    assert [c[1] for c in runtime.calls] == ["be-1", "be-4"]  # not running (yet): the runtime


def test_no_backend_at_all_is_a_failure(caplog: pytest.LogCaptureFixture) -> None:
    counts = Counts()
    ev = Evictor(observer=counts)
    with caplog.at_level(logging.WARNING, "nriplugin.qos.evict"):
        assert run(ev, cpu_plan([be(1, cpu_cores=1.0)], 1.0)) == []
    assert counts.failed == [("none", "error")] and ev.failures == 1
    assert "via none failed (no eviction backend)" in caplog.records[-1].getMessage()


def test_dry_run_evicts_nothing_and_says_what_it_would(caplog: pytest.LogCaptureFixture) -> None:
    runtime, counts = Backend(), Counts()
    ev = Evictor(runtime=runtime, dry_run=True, observer=counts)
    with caplog.at_level(logging.WARNING, "nriplugin.qos.evict"):
        assert run(ev, cpu_plan([be(1, cpu_cores=1.0)], 1.0)) == ["be-1"]
    assert runtime.calls == [] and not ev.pending and counts.done == [("CPUEvict", "emergency", True)]
    (rec,) = caplog.records
    assert rec.getMessage() == (
        "dry run: would evict batch/be-1 via runtime: CPUEvict (emergency): LS starves; this pod frees about 1.00 cores"
    )
    assert rec.dry_run is True  # type: ignore[attr-defined]
    assert not ev.eligible(be(1))  # counted as evicted: not again within repeat_after


def test_a_backend_that_raises_has_failed_and_backs_off_doubling(caplog: pytest.LogCaptureFixture) -> None:
    clock, counts = Clock(), Counts()
    runtime = Backend({"be-1": ConnectionError("refused")})
    ev = Evictor(runtime=runtime, clock=clock, observer=counts)
    pods = [be(1, cpu_cores=2.0), be(2, cpu_cores=2.0)]
    with caplog.at_level(logging.WARNING, "nriplugin.qos.evict"):
        assert run(ev, cpu_plan(pods, 3.0)) == []
    (rec,) = [r for r in caplog.records if "failed" in r.getMessage()]
    assert rec.getMessage() == (
        "CPUEvict: evicting batch/be-1 via runtime failed (ConnectionError: refused); nobody else is evicted "
        "in its place; trying again in 1 s (failure 1 in a row)"
    )
    assert (rec.strategy, rec.victim, rec.via, rec.failures) == ("CPUEvict", "batch/be-1", "runtime", 1)  # type: ignore[attr-defined]
    assert counts.failed == [("runtime", "error")] and ev.backing_off()
    clock.t = 0.999
    assert ev.busy("MemoryEvict")
    clock.t = 1.0
    assert not ev.backing_off() and not ev.busy("MemoryEvict")  # the retry time itself: over
    waits = []
    for _ in range(8):
        run(ev, cpu_plan(pods, 3.0))
        waits.append(round(ev._retry_at - clock.t, 3))
        clock.t = ev._retry_at
    assert waits == [2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0] and ev.failures == 9
    runtime.answers.clear()
    assert run(ev, cpu_plan(pods, 3.0)) == ["be-1", "be-2"] and ev.failures == 0


def test_an_answer_without_detail_is_said_as_is(caplog: pytest.LogCaptureFixture) -> None:
    ev = Evictor(runtime=Backend({"be-1": "teapot"}))
    with caplog.at_level(logging.WARNING, "nriplugin.qos.evict"):
        run(ev, cpu_plan([be(1, cpu_cores=1.0)], 1.0))
    assert "failed (teapot);" in caplog.records[-1].getMessage()
    ev = Evictor(runtime=Backend({"be-1": Answer(EvictionOutcome.ERROR, "CRI down")}))
    with caplog.at_level(logging.WARNING, "nriplugin.qos.evict"):
        run(ev, cpu_plan([be(1, cpu_cores=1.0)], 1.0))
    assert "failed (CRI down);" in caplog.records[-1].getMessage()


def test_blocked_and_gone_pods_make_way_for_the_next(caplog: pytest.LogCaptureFixture) -> None:
    clock, counts = Clock(), Counts()
    runtime = Backend({"be-1": EvictionOutcome.BLOCKED, "be-2": EvictionOutcome.GONE})
    ev = Evictor(runtime=runtime, clock=clock, observer=counts, max_per_minute=2)
    pods = [be(i, cpu_cores=1.0) for i in range(1, 5)]
    with caplog.at_level(logging.INFO, "nriplugin.qos.evict"):
        assert run(ev, cpu_plan(pods, 2.0)) == ["be-3", "be-4"]  # refusals give their token back
    assert counts.failed == [("runtime", "blocked"), ("runtime", "gone")] and ev.failures == 0
    assert "CPUEvict: batch/be-1 refused (disruption budget); trying the next" in caplog.messages
    assert ev.eligible(pods[1]) and not ev.eligible(pods[0])  # only a refusal is retried later
    clock.t = 29.9
    assert not ev.eligible(pods[0])
    clock.t = 30.0
    assert ev.eligible(pods[0])


def test_a_plan_stops_once_covered_and_says_what_it_could_not_free(caplog: pytest.LogCaptureFixture) -> None:
    runtime = Backend()
    ev = Evictor(runtime=runtime)
    pods = [be(i, cpu_cores=1.0) for i in range(1, 5)]
    with caplog.at_level(logging.WARNING, "nriplugin.qos.evict"):
        assert run(ev, cpu_plan(pods, 2.0)) == ["be-1", "be-2"]  # 2 of 2: covered
    assert not [m for m in caplog.messages if "freed" in m]
    caplog.clear()
    with caplog.at_level(logging.WARNING, "nriplugin.qos.evict"):
        assert run(ev, cpu_plan(pods, 2.5)) == ["be-3", "be-4"]
    assert caplog.messages[-1] == "CPUEvict: freed 2.00 of 2.50 cores; no more candidates this round"
    caplog.clear()
    with caplog.at_level(logging.WARNING, "nriplugin.qos.evict"):
        assert run(ev, mem_plan([be(5, freeable_bytes=100 * MiB)], 150 * MiB)) == ["be-5"]
    assert caplog.messages[-1] == "MemoryEvict: freed 100.00 of 150.00 MiB; no more candidates this round"


def test_the_rate_limit_is_a_minute_wide(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    ev = Evictor(runtime=Backend(), clock=clock, max_per_minute=2)
    with caplog.at_level(logging.WARNING, "nriplugin.qos.evict"):
        assert run(ev, cpu_plan([be(i, cpu_cores=1.0) for i in range(1, 4)], 3.0)) == ["be-1", "be-2"]
    rec = caplog.records[-2]
    assert rec.getMessage() == "CPUEvict: eviction rate limit (2 a minute) reached; batch/be-3 waits"
    assert (rec.strategy, rec.victim) == ("CPUEvict", "batch/be-3")  # type: ignore[attr-defined]
    clock.t = 59.9
    assert run(ev, cpu_plan([be(3, cpu_cores=1.0)], 1.0)) == []
    clock.t = 60.0
    assert run(ev, cpu_plan([be(3, cpu_cores=1.0), be(4, cpu_cores=1.0), be(5, cpu_cores=1.0)], 3.0)) == [
        "be-3",
        "be-4",
    ]


def test_what_is_booked_for_an_evicted_pod() -> None:
    clock, counts, seen = Clock(5.0), Counts(), []
    ev = Evictor(
        runtime=Backend(), clock=clock, observer=counts, on_evicted=lambda p, c: seen.append(f"{p.strategy}:{c.name}")
    )
    pod = be(1, freeable_bytes=100 * MiB, growth_bytes_per_min=60.0 * MiB)
    run(ev, mem_plan([pod], 50 * MiB, horizon=10.0), {"u1": "kubepods/besteffort/pod1"})
    p = ev.pending["u1"]
    assert (p.uid, p.who, p.strategy, p.unit, p.since, p.group) == (
        "u1",
        "batch/be-1",
        "MemoryEvict",
        "bytes",
        5.0,
        "kubepods/besteffort/pod1",
    )
    assert p.expected == p.held == 100 * MiB  # what it holds, not what it would have grown by
    assert seen == ["MemoryEvict:be-1"] and counts.done == [("MemoryEvict", "threshold", False)]
    assert list(ev.history) == [
        {"t": 5.0, "strategy": "MemoryEvict", "trigger": "threshold", "victim": "batch/be-1", "via": "runtime"}
    ]
    run(ev, cpu_plan([be(2, cpu_cores=1.5)], 1.0))
    assert ev.pending["u2"].expected == ev.pending["u2"].held == 1.5 and ev.pending["u2"].group is None
    assert not ev.eligible(be(2))  # pending (and just evicted)


def test_eligibility_to_the_second() -> None:
    clock = Clock()
    ev = Evictor(runtime=Backend(), clock=clock, pending_timeout=1000.0)
    run(ev, cpu_plan([be(1, cpu_cores=1.0)], 1.0))
    ev.pending.clear()
    clock.t = 119.9
    assert not ev.eligible(be(1))
    clock.t = 120.0
    assert ev.eligible(be(1))


def test_settle_credits_the_held_and_drops_the_gone(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    ev = Evictor(runtime=Backend(), clock=clock)
    run(ev, mem_plan([be(1, freeable_bytes=300 * MiB)], 100 * MiB))
    run(ev, cpu_plan([be(2, cpu_cores=2.0)], 1.0))
    held: dict[str, float] = {"u1": 250.0 * MiB, "u2": 1.5}
    assert ev.settle(lambda p: held.get(p.uid)) == 250 * MiB
    assert ev.settle(lambda p: held.get(p.uid), unit="cores") == 1.5
    clock.t = 2.5
    held["u1"] = 0.0
    caplog.clear()
    with caplog.at_level(logging.INFO, "nriplugin.qos.evict"):
        assert ev.settle(lambda p: held.get(p.uid)) == 0.0
    (rec,) = caplog.records
    assert rec.getMessage() == "MemoryEvict: batch/be-1 gone after 2.5 s, freed about 250 MiB (expected 300 MiB)"
    assert (rec.strategy, rec.victim, rec.seconds, rec.freed) == ("MemoryEvict", "batch/be-1", 2.5, 250 * MiB)  # type: ignore[attr-defined]
    assert list(ev.pending) == ["u2"]
    clock.t = 60.0
    assert ev.settle(lambda p: held.get(p.uid), unit="cores") == 1.5  # 60 s: still waited for
    clock.t = 60.1
    caplog.clear()
    with caplog.at_level(logging.INFO, "nriplugin.qos.evict"):
        assert ev.settle(lambda p: held.get(p.uid), unit="cores") == 0.0
    assert caplog.messages == ["CPUEvict: batch/be-2 gone after 60.1 s, freed about 1.50 cores (expected 2.00 cores)"]
    assert not ev.pending


def test_settle_forgets_refusals_and_evictions_when_they_expire() -> None:
    clock = Clock()
    ev = Evictor(runtime=Backend({"be-1": EvictionOutcome.BLOCKED}), clock=clock)
    run(ev, cpu_plan([be(1, cpu_cores=1.0), be(2, cpu_cores=1.0)], 1.0))
    clock.t = 29.9
    ev.settle(lambda p: None)
    assert "u1" in ev._blocked
    clock.t = 30.0
    ev.settle(lambda p: None)
    assert "u1" not in ev._blocked and "u2" in ev._last
    clock.t = 119.9
    ev.settle(lambda p: None)
    assert "u2" in ev._last
    clock.t = 120.0
    ev.settle(lambda p: None)
    assert "u2" not in ev._last


def test_submit_runs_one_plan_per_strategy_and_close_cancels_it() -> None:
    slow = Gated()
    gate = slow.gate

    async def scenario() -> None:
        ev = Evictor(runtime=slow)
        assert ev.submit(cpu_plan([be(1, cpu_cores=1.0)], 1.0))
        assert ev.busy("CPUEvict") and not ev.busy("MemoryEvict")
        assert not ev.submit(cpu_plan([be(2, cpu_cores=1.0)], 1.0))
        assert ev.submit(mem_plan([be(3, freeable_bytes=MiB)], MiB), {"u3": "g3"})
        await asyncio.sleep(0)
        assert len(ev._tasks) == 2
        gate.set()
        for _ in range(5):
            await asyncio.sleep(0)
        assert not ev._tasks and not ev.busy("CPUEvict") and ev.pending["u3"].group == "g3"
        gate.clear()
        assert ev.submit(cpu_plan([be(4, cpu_cores=1.0)], 1.0))
        await asyncio.sleep(0)
        await ev.close()
        assert not ev._tasks and not ev.busy("CPUEvict") and "u4" not in ev.pending

    asyncio.run(scenario())


# --- the glue: facts, configuration, candidates, the pods' growth --------------------------------


def a_round(
    *,
    interval: float = 1.0,
    some_us: int = 0,
    be_limit: float | None = 4.0,
    be_target: float | None = 4.0,
    capacity: Capacity | None = None,
    by_class: dict[str, ClassUsage] | None = None,
    policy: Policy | None = None,
) -> Round:
    sample = NodeSample(
        t=50.0,
        interval=interval,
        ncpu=8,
        cpu_busy_cores=7.0,
        load1=1.0,
        psi_cpu=Pressure(some_delta_us=some_us),
        by_class=by_class or {},
    )
    cap = capacity if capacity is not None else Capacity(8.0, 1.0, 4.0, 3.0, 2.0, 5.0)
    return Round(
        50.0,
        sample,
        Level.EMERGENCY,
        91.0,
        10.0,
        policy or Policy(),
        capacity=cap,
        be_limit=be_limit,
        be_target=be_target,
    )


def test_cpu_facts_from_a_round() -> None:
    r = a_round(
        some_us=900_000,  # the node's PSI: not used where the LS classes' own stall is known (v2)
        by_class={
            "LS": ClassUsage(throttled_ratio=0.3, stall_ratio=0.25),
            "LSR": ClassUsage(throttled_ratio=0.1, stall_ratio=0.125),
            "BE": ClassUsage(cpu_request_cores=6.0, throttled_ratio=0.9, stall_ratio=0.95),
        },
    )
    f = cpu_facts(r)
    assert f == CpuFacts(
        t=50.0,
        level=Level.EMERGENCY,
        score=91.0,
        suppressed=True,
        total=8.0,
        system_reserved=1.0,
        ls_usage=3.0,
        be_usage=2.0,
        other_usage=2.0,  # non-BE 5 - LS 3
        ls_stall=0.25,  # the most of the LS classes' own
        ls_throttled=0.3,  # LS classes only: BE's throttling is its limit doing its job
        be_request=6.0,
        be_limit=4.0,
    )
    assert cpu_facts(replace(r, be_idle=True)) == replace(f, be_idle=True)
    assert cpu_facts(replace(r, capacity=None)) is None


def test_cpu_facts_stall_is_ls_own_and_the_nodes_share_only_without_it() -> None:
    """The LS classes' own wait (v2 PSI, v1 run delay), the node's ignored (it counts BE's
    waits, those at the agent's own quota included). No LS wait read: the node's share, at
    most 1."""
    lsr_only = {"LS": ClassUsage(), "LSR": ClassUsage(stall_ratio=0.4)}
    assert cpu_facts(a_round(some_us=1_000_000, by_class=lsr_only)).ls_stall == 0.4  # type: ignore[union-attr]
    calm = {"LS": ClassUsage(stall_ratio=0.0)}
    assert cpu_facts(a_round(some_us=1_000_000, by_class=calm)).ls_stall == 0.0  # type: ignore[union-attr]
    assert cpu_facts(a_round(some_us=3_000_000)).ls_stall == 1.0  # type: ignore[union-attr]
    assert cpu_facts(a_round(interval=2.0, some_us=1_000_000)).ls_stall == 0.5  # type: ignore[union-attr]
    assert cpu_facts(a_round(interval=0.0, some_us=1_000_000)).ls_stall == 0.0  # type: ignore[union-attr]
    assert cpu_facts(a_round()).ls_throttled == 0.0  # type: ignore[union-attr]
    low = Capacity(8.0, 1.0, 4.0, 3.0, 2.0, 1.0)  # non-BE under LS: no other usage
    assert cpu_facts(a_round(capacity=low)).other_usage == 0.0  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("limit", "target", "suppressed"),
    [(4.2, 4.0, True), (4.21, 4.0, False), (3.0, 4.0, True), (None, 4.0, False), (4.0, None, False)],
)
def test_be_counts_as_suppressed_within_the_deadband(
    limit: float | None, target: float | None, suppressed: bool
) -> None:
    f = cpu_facts(a_round(be_limit=limit, be_target=target))  # the deadband: 0.2 cores
    assert f is not None and f.suppressed is suppressed


def eviction_scene(tmp_path: Path, policy: Policy | None = None, **kw: object) -> tuple[Eviction, MemoryTree, Clock]:
    tree = MemoryTree.make(tmp_path)
    rules = RuleCache(policy or Policy())
    cg = Cgroups(tree.root)
    node = Node.create(rules, caps=caps(), cgroups=cg)
    for p, c in zip(tree.pods, tree.containers, strict=True):
        node.model.container_started(p, c)
    clock = Clock(100.0)
    ev = Evictor(runtime=Backend(), clock=clock)
    evn = Eviction(node.model, node.desired, cg, Stats(cg), rules, ev, ["/kubepods/"], clock=clock, **kw)  # type: ignore[arg-type]
    return evn, tree, clock


def test_the_policy_configures_the_evictor_and_both_strategies(tmp_path: Path) -> None:
    p = Policy.model_validate(
        {
            "qosManager": {
                "eviction": {
                    "dryRun": True,
                    "maxPerMinute": 3,
                    "gracePeriodSeconds": 7,
                    "repeatAfter": 11,
                    "retryAfter": 13,
                },
                "cpuEvict": {
                    "evictThreshold": 80,
                    "evictCooldown": 30,
                    "sustain": 4,
                    "stallThreshold": 0.3,
                    "throttleThreshold": 0.4,
                    "releaseFactor": 1.5,
                },
                "memoryEvict": {
                    "evictThreshold": 75,
                    "memoryGrowthThreshold": 2,
                    "releaseFactor": 1.1,
                    "oomHorizon": 20,
                    "urgentSeconds": 3,
                },
            },
            "resourceUsedThresholdWithBE": {
                "memoryEvictThresholdPercent": 60,
                "memoryEvictLowerPercent": 55,
                "cpuEvictBESatisfactionLowerPercent": 30,
                "cpuEvictBESatisfactionUpperPercent": 50,
                "cpuEvictBEUsageThresholdPercent": 80,
                "cpuEvictTimeWindowSeconds": 20,
            },
        }
    )
    evn, _, _ = eviction_scene(tmp_path, p)
    evn._configure_evictor()
    ev = evn.evictor
    assert (ev.dry_run, ev.max_per_minute, ev.grace_seconds, ev.repeat_after, ev.retry_after) == (True, 3, 7, 11, 13)
    assert evn._cpu_config() == CpuConfig(
        threshold=80,
        cooldown=30,
        sustain=4,
        stall_threshold=0.3,
        throttle_threshold=0.4,
        release_factor=1.5,
        satisfaction_lower=30,
        satisfaction_upper=50,
        be_usage_threshold=80.0,
        window=20.0,
    )
    assert evn._memory_config() == MemoryConfig(
        threshold_percent=60.0,
        lower_percent=55.0,
        score_threshold=75,
        horizon=20,
        urgent=3,
        release_factor=1.1,
        leak_bytes_per_min=2 * MiB,
    )
    evn, _, _ = eviction_scene(tmp_path / "defaults")
    evn._configure_evictor()
    assert not evn.evictor.dry_run
    assert evn._cpu_config() == CpuConfig()
    assert evn._memory_config() == MemoryConfig(leak_bytes_per_min=5 * MiB)
    assert evn.roots == ["kubepods"]
    evn, _, _ = eviction_scene(tmp_path / "forced", force_dry_run=True)
    evn._configure_evictor()
    assert evn.evictor.dry_run


def usage(pod: str, rss: int, qos: QoSClass = QoSClass.BE, cpu: float = 0.0) -> ContainerUsage:
    return ContainerUsage(qos, pod, cpu, rss, rss)


def test_a_pods_growth_is_the_smaller_of_its_two_halves_once_it_spans_four_seconds(tmp_path: Path) -> None:
    now: dict[str, ContainerUsage] = {}
    evn, _, _ = eviction_scene(tmp_path, usage=lambda: now)
    for t, rss in [(0.0, 0), (1.0, 60), (2.0, 120)]:
        now = {"c1": usage("p1", rss), "c2": usage("p1", rss), "c3": usage("ls", rss * 9, QoSClass.LS)}
        evn.observe_pods(t)
    assert evn._pod_growth("p1") == 0.0  # 2 s: too early
    assert evn._pod_growth("ls") == 0.0 and "ls" not in evn._pod_mem  # BE pods only
    for t, rss in [(3.0, 180), (4.0, 200)]:
        now = {"c1": usage("p1", rss), "c2": usage("p1", rss)}
        evn.observe_pods(t)
    # both containers: 0, 120, 240, 360, 400 at 0-4 s; the middle point t=2: min(120, 80) a second
    assert evn._pod_growth("p1") == pytest.approx(80 * 60)
    evn.observe_pods(4.0)  # a second reading at the same time is not a point
    assert len(evn._pod_mem["p1"]) == 5
    now = {}
    evn.observe_pods(5.0)
    assert "p1" not in evn._pod_mem and evn._pod_growth("p1") == 0.0


def test_a_pods_growth_never_shrinks_below_zero_and_keeps_a_minute(tmp_path: Path) -> None:
    now: dict[str, ContainerUsage] = {}
    evn, _, _ = eviction_scene(tmp_path, usage=lambda: now)
    for t, rss in [(0.0, 500), (2.0, 400), (4.0, 300)]:
        now = {"c": usage("p", rss)}
        evn.observe_pods(t)
    assert evn._pod_growth("p") == 0.0
    for t in range(5, 70):
        now = {"c": usage("p", 1000 + 10 * t)}
        evn.observe_pods(float(t))
    pts = evn._pod_mem["p"]
    assert pts[0][0] == 9.0 and pts[-1][0] == 69.0  # 60 s back from 69 is kept, 8 s is not
    assert evn._pod_growth("p") == pytest.approx(600.0)
    evn._pod_mem["q"] = deque([(0.0, 0), (0.0, 0), (4.0, 100)])  # no middle point
    assert evn._pod_growth("q") == 0.0
    evn._pod_mem["r"] = deque([(0.0, 0), (3.9, 100), (3.95, 100)])
    assert evn._pod_growth("r") == 0.0  # under 4 s of readings
    evn._pod_mem["s"] = deque([(0.0, 0), (2.0, 100), (4.0, 200)])
    assert evn._pod_growth("s") == pytest.approx(50 * 60)
    evn._pod_mem["t"] = deque([(0.0, 0), (4.0, 100)])
    assert evn._pod_growth("t") == 0.0  # two points are no trend


def test_candidates_are_the_be_pods_with_their_usage_requests_and_priorities(tmp_path: Path) -> None:
    now: dict[str, ContainerUsage] = {}
    evn, tree, _ = eviction_scene(tmp_path, usage=lambda: now)
    be2, be3 = tree.pods[1], tree.pods[2]
    now = {
        "a": usage(be2.id, 0, cpu=0.5),
        "b": usage(be2.id, 0, cpu=0.25),
        "c": usage(be3.id, 0, cpu=1.0),
        "d": usage(tree.pods[0].id, 0, QoSClass.LS, cpu=3.0),
    }
    tree.pod_memory(1, 300 * MiB)
    tree.pod_memory(2, 100 * MiB)
    cands = {c.name: c for c in evn.candidates(memory=False)}
    assert set(cands) == {be2.name, be3.name}  # never the LS pod
    c2 = cands[be2.name]
    assert (c2.uid, c2.namespace, c2.qos, c2.cpu_cores, c2.sandbox_id) == (
        be2.uid,
        be2.namespace,
        QoSClass.BE,
        0.75,
        be2.id,
    )
    assert c2.freeable_bytes == 0 and c2.growth_bytes_per_min == 0.0  # memory not read for CPU
    assert c2.priority == 0
    mem = {c.name: c for c in evn.candidates(memory=True)}
    assert mem[be2.name].freeable_bytes == 300 * MiB and mem[be3.name].freeable_bytes == 100 * MiB
    assert evn._pod_groups == {be2.uid: be2.linux.cgroup_parent.strip("/"), be3.uid: be3.linux.cgroup_parent.strip("/")}


def test_memory_check_sizes_the_node_from_the_pods_root_and_meminfo(tmp_path: Path) -> None:
    evn, tree, _ = eviction_scene(tmp_path)
    tree.memory("kubepods", 500 * MiB, limit=GiB)
    evn.meminfo_total = lambda: 8 * GiB
    f = evn.memory_check()
    assert f is not None and (f.capacity, f.used, f.t) == (GiB, 500 * MiB, 100.0) and evn.last_facts == f
    evn.meminfo_total = lambda: 512 * MiB
    assert evn.memory_check().capacity == 512 * MiB  # type: ignore[union-attr]
    evn.meminfo_total = lambda: 0
    assert evn.memory_check().capacity == GiB  # type: ignore[union-attr]
    evn._critical = True  # the kernel reported critical pressure
    f = evn.memory_check()
    assert f is not None and f.critical and not evn.memory_check().critical  # type: ignore[union-attr]
    evn.memory_score = 42.0
    assert evn.memory_check().score == 42.0  # type: ignore[union-attr]
    off = Policy.model_validate({"qosManager": {"memoryEvict": {"enabled": False}}})
    evn.rules.set(off, "test")
    assert evn.memory_check() is None


def test_memory_check_without_a_pods_root_measures_nothing(tmp_path: Path) -> None:
    evn, _, _ = eviction_scene(tmp_path)
    evn.roots = ["nowhere"]
    assert evn.memory_check() is None and evn.last_facts is None


def test_a_memory_event_schedules_one_check_at_most_every_min_gap(tmp_path: Path) -> None:
    evn, tree, clock = eviction_scene(tmp_path)
    tree.memory("kubepods", 500 * MiB, limit=GiB)
    checks: list[float] = []
    real = evn.memory_check

    def check() -> MemoryFacts | None:
        checks.append(clock.t)
        return real()

    evn.memory_check = check  # type: ignore[method-assign]

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        evn._fired("kubepods:usage1")
        assert evn._scheduled is not None and not evn._critical
        evn._fired("kubepods:pressure")  # coalesced into the one scheduled
        assert evn._critical and [w for _, w in evn.wakeups] == ["kubepods:usage1", "kubepods:pressure"]
        await asyncio.sleep(0.02)
        assert checks == [100.0] and evn._scheduled is None and not evn._critical
        clock.t = 100.01  # 10 ms after the check: the next waits out the gap
        t0 = loop.time()
        evn._fired("kubepods:usage2")
        assert evn._scheduled is not None and evn._scheduled.when() - t0 == pytest.approx(0.04, abs=0.005)
        evn.stop()
        assert evn._scheduled is None

    asyncio.run(scenario())
    assert MIN_GAP == 0.05


def test_a_failing_event_check_is_logged_not_raised(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    evn, _, _ = eviction_scene(tmp_path)

    def boom() -> MemoryFacts | None:
        raise RuntimeError("boom")

    evn.memory_check = boom  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR, "nriplugin.qos.evict"):
        evn._event_check()
    assert caplog.messages == ["memory check failed"] and evn._scheduled is None


# --- the runtime backend, against CRI's RuntimeService on a unix socket --------------------------


def cri_pod(rt: FakeRuntime, pid: str, ns: str, name: str, uid: str, containers: dict[str, int]) -> None:
    sb = cri.PodSandbox(id=pid, state=cri.SANDBOX_READY)
    sb.metadata.name, sb.metadata.uid, sb.metadata.namespace = name, uid, ns
    rt.pods[pid] = (sb, {})
    for cid, state in containers.items():
        rt.containers[cid] = (cri.Container(id=cid, pod_sandbox_id=pid, state=state), {})  # type: ignore[arg-type]


def test_the_runtime_backend_stops_the_pods_containers_then_its_sandbox() -> None:
    rt = FakeRuntime()
    running, created, exited = cri.CONTAINER_RUNNING, cri.CONTAINER_CREATED, cri.CONTAINER_EXITED
    cri_pod(rt, "p1", "batch", "be-1", "u1", {"c1": running, "c2": created, "c3": exited})
    cri_pod(rt, "p2", "batch", "be-2", "u2", {"c4": running})
    cri_pod(rt, "p3", "batch", "raw", "", {"c5": running})  # not kubelet's: no uid
    cri_pod(rt, "p4", "other", "be-1", "", {"c6": running})
    cri_pod(rt, "p5", "batch", "be-1", "u1b", {"c7": running})  # the same name, another pod (uid)
    with tempfile.TemporaryDirectory(prefix="nriplugin-cri-") as d:
        sock = f"{d}/cri.sock"

        async def main() -> None:
            client = AsyncCRI(sock)
            backend = RuntimeBackend(client, timeout=3.0)
            try:
                assert backend.name == "runtime" and backend.timeout == 3.0
                assert await backend.evict("batch", "be-1", "u1", 7, "threshold", "m") is EvictionOutcome.EVICTED
                assert sorted(rt.stopped[:2]) == [("container", "c1", 7), ("container", "c2", 7)]
                assert rt.stopped[2:] == [("pod", "p1", 0)]  # the sandbox after its containers
                given = dict(rt.deadlines)  # 3 s (not the client's 5); a stop's grace on top
                assert 2.0 < given["ListPodSandbox"] < 4.0 and 2.0 < given["ListContainers"] < 4.0  # type: ignore[operator]
                assert 9.0 < given["StopContainer"] < 11.0 and 2.0 < given["StopPodSandbox"] < 4.0  # type: ignore[operator]
                assert (
                    await backend.evict("batch", "be-1", "u1", 7, "threshold", "m") is EvictionOutcome.GONE
                )  # stopped
                assert await backend.evict("batch", "nobody", "u9", 7, "threshold", "m") is EvictionOutcome.GONE
                rt.stopped.clear()
                assert await backend.evict("batch", "raw", "", 0, "oom_risk", "m") is EvictionOutcome.EVICTED
                assert rt.stopped == [("container", "c5", 0), ("pod", "p3", 0)]  # by namespace and name
                rt.fail = "StopPodSandbox"
                answer = await backend.evict("batch", "be-2", "u2", 5, "threshold", "m")
                assert isinstance(answer, Answer) and answer.result is EvictionOutcome.ERROR
                assert "StopPodSandbox: the runtime is going away" in answer.detail and "\n" not in answer.detail
                rt.fail_detail = " and says so at length" * 20
                answer = await backend.evict("batch", "be-2", "u2", 5, "threshold", "m")
                assert isinstance(answer, Answer) and len(answer.detail) == 300
            finally:
                await client.close()

        with serving(rt, sock):
            asyncio.run(main())
        assert RuntimeBackend(AsyncCRI(sock)).timeout == 10.0


# --- boundaries the first mutation runs showed unpinned -------------------------------------------


def test_a_plan_for_less_than_one_unit() -> None:
    pods = [be(1, cpu_cores=1.0)]
    assert fewest(pods, 0.5, lambda c: c.cpu_cores) == 1  # a fraction of a core still needs a pod
    rel = emergency_release(facts(ls_usage=50.0, ls_stall=0.1, be_usage=5.5), CpuConfig())  # short by 0.5
    assert rel is not None and rel.amount == pytest.approx(0.6)
    assert release(MemoryFacts(0.0, 1, 1), MemoryConfig()) is not None  # any positive capacity
    assert seconds_to_limit(MemoryFacts(0.0, 1000, 500, growth=0.5)) == 1000.0  # any growth


def test_bes_own_use_is_asked_from_one_core_of_limit() -> None:
    cfg = CpuConfig(satisfaction_lower=40, satisfaction_upper=60)
    assert satisfaction_release(10.0, 1.0, 0.5, cfg) is None  # 1 core, half used: more would not help
    assert satisfaction_release(10.0, 1.5, 0.5, cfg) is None
    assert satisfaction_release(10.0, 0.99, 0.0, cfg) is not None  # under a core: not asked
    small = satisfaction_release(0.5, 0.1, 0.1, cfg)  # half a core requested
    assert small is not None and small.amount == pytest.approx(0.2)
    assert satisfaction_release(10.0, 4.0, 4.0, replace(cfg, satisfaction_upper=40.2)) is not None


def test_the_window_holds_exactly_its_length() -> None:
    cfg = CpuConfig(satisfaction_lower=40, satisfaction_upper=60, window=30.0)
    pods = [be(1, cpu_request_cores=5.0)]

    def amount(last: float) -> float:
        ev = CpuEvictDecider(cfg)
        ev.decide(sat_facts(0.0, limit=3.9, usage=3.9), pods)
        ev.decide(sat_facts(20.0, limit=2.0, usage=2.0), pods)
        plan = ev.decide(sat_facts(last, limit=2.0, usage=2.0), pods)
        assert plan is not None
        return plan.release.amount

    assert amount(30.0) == pytest.approx(10 * (0.6 - 7.9 / 30))  # 30 s back: in; the average is smaller
    assert amount(30.1) == pytest.approx(4.0)  # out: the average is now's


def test_the_window_starts_again_while_the_variant_is_half_configured() -> None:
    pods = [be(1, cpu_request_cores=5.0)]
    ev = CpuEvictDecider(CpuConfig(satisfaction_upper=60, window=30.0))
    for t in range(0, 21, 5):
        assert ev.decide(sat_facts(float(t)), pods) is None
    ev.cfg = CpuConfig(satisfaction_lower=40, satisfaction_upper=60, window=30.0)  # a reload completes it
    assert ev.decide(sat_facts(21.0), pods) is None  # no history yet


def test_on_a_tie_the_windows_release_is_said() -> None:
    cfg = CpuConfig(satisfaction_lower=40, satisfaction_upper=60, window=30.0)
    ev = CpuEvictDecider(cfg)
    pods = [be(1, cpu_request_cores=5.0)]
    ev.decide(sat_facts(0.0, usage=3.0), pods)
    plan = ev.decide(sat_facts(10.0, usage=2.8), pods)
    assert plan is not None and plan.release.amount == pytest.approx(3.0)
    assert "with BE using 2.90 cores" in plan.release.why  # the window's average, not now's 2.80


def test_the_growth_is_not_said_when_it_only_ties_the_level() -> None:
    cfg = MemoryConfig(lower_percent=50.0, release_factor=1.0)
    rel = release(MemoryFacts(0.0, 1000 * MiB, 700 * MiB, growth=50 * MiB), cfg)  # 200 MiB either way
    assert rel is not None and rel.amount == 200 * MiB and "or the growth" not in rel.why


def test_growth_steps_are_measured_in_time() -> None:
    m = MemoryEvictDecider()
    for t, u in [(0.0, 0), (1.0, 0), (2.0, 100), (3.0, 200), (4.0, 300)]:
        m.observe(t, u)
    assert m.growth() == pytest.approx(50.0)  # b is 2 s before a (t=0), not the reading next to it
    m = MemoryEvictDecider()
    for t, u in [(0.0, 0), (2.0, 400), (4.0, 600)]:
        m.observe(t, u)
    assert m.growth() == pytest.approx(100.0)  # slowing: now's rate is the smaller
    m.observe(4.0, 10_000)  # a second reading at the same time is dropped, not taken as now
    assert m.growth() == pytest.approx(100.0)
    m = MemoryEvictDecider(rate_window=4.0)
    for t, u in [(1.0, 0), (3.0, 200), (5.0, 600)]:
        m.observe(t, u)
    assert m.growth() == pytest.approx(100.0)  # 4 s back from 5: kept


def test_a_success_during_the_back_off_ends_it() -> None:
    clock = Clock()
    ev = Evictor(runtime=Backend({"be-1": EvictionOutcome.ERROR}), clock=clock)
    run(ev, cpu_plan([be(1, cpu_cores=1.0)], 1.0))
    assert ev.backing_off()
    clock.t = 0.5
    run(ev, cpu_plan([be(2, cpu_cores=1.0)], 1.0))  # a plan carried out directly: it succeeds
    assert ev.failures == 0 and not ev.backing_off()


def test_execute_marks_its_strategy_busy_while_it_runs() -> None:
    slow = Gated()
    gate = slow.gate

    async def scenario() -> None:
        ev = Evictor(runtime=slow)
        task = asyncio.create_task(ev.execute(cpu_plan([be(1, cpu_cores=1.0)], 1.0), {}))
        await asyncio.sleep(0)
        assert ev.busy("CPUEvict")
        gate.set()
        await task
        assert not ev.busy("CPUEvict")

    asyncio.run(scenario())


def test_settle_sums_every_victim_still_held_and_times_them_from_their_eviction(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock(1.0)
    ev = Evictor(runtime=Backend(), clock=clock)
    run(ev, mem_plan([be(1, freeable_bytes=300 * MiB)], 100 * MiB))
    run(ev, mem_plan([be(2, freeable_bytes=200 * MiB)], 100 * MiB))
    run(ev, mem_plan([be(3, freeable_bytes=100 * MiB)], 50 * MiB))
    run(ev, cpu_plan([be(4, cpu_cores=2.0)], 1.0))
    held: dict[str, float] = {"u2": 150.0 * MiB, "u3": 50.0 * MiB, "u4": 1.0}
    clock.t = 3.55555
    caplog.clear()
    with caplog.at_level(logging.INFO, "nriplugin.qos.evict"):
        assert ev.settle(lambda p: held.get(p.uid)) == 200 * MiB  # u1 gone first; the others still count
    (rec,) = caplog.records
    assert "gone after 2.6 s" in rec.getMessage() and rec.seconds == 2.556  # type: ignore[attr-defined]
    assert sorted(ev.pending) == ["u2", "u3", "u4"]  # a CPU victim held at 1 (its group still there)
    assert ev.settle(lambda p: held.get(p.uid), unit="cores") == 1.0
    clock.t = 120.9
    ev.settle(lambda p: held.get(p.uid))
    assert "u1" in ev._last
    clock.t = 121.0
    ev.settle(lambda p: None)
    assert "u1" not in ev._last


# --- the kernel's memory notifications, armed per pods root ---------------------------------------


def armed_scene(tmp_path: Path, pressure: bool = True) -> tuple[Eviction, MemoryTree]:
    evn, tree, _ = eviction_scene(tmp_path)
    d = tree.root / "memory" / "kubepods"
    (d / "cgroup.event_control").write_text("")  # the kernel's; takes "<eventfd> <fd> <args>"
    if pressure:
        (d / "memory.pressure_level").write_text("")
    tree.memory("kubepods", 500 * MiB, limit=GiB)
    evn.meminfo_total = lambda: 8 * GiB
    return evn, tree


def test_the_pods_root_is_armed_at_the_ladder_and_the_threshold(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    evn, _ = armed_scene(tmp_path)

    async def scenario() -> None:
        with caplog.at_level(logging.INFO, "nriplugin.qos.evict"):
            evn.start(asyncio.get_running_loop())
            evn._arm()  # the same capacity and threshold: nothing armed again
        marks = tuple(int(GiB * p / 100) for p in (50, 60, 70, 80, 90, 95))
        assert LADDER == (50.0, 60.0, 80.0, 90.0, 95.0) and evn._armed == {"kubepods": marks}
        assert caplog.messages == [
            "memory events armed on kubepods: usage at 512, 614, 716, 819, 921, 972 MiB, critical pressure"
        ]
        evn.meminfo_total = lambda: 512 * MiB  # the smaller of MemTotal and the root's limit
        caplog.clear()
        with caplog.at_level(logging.INFO, "nriplugin.qos.evict"):
            evn._arm()
        assert evn._armed["kubepods"] == tuple(int(512 * MiB * p / 100) for p in (50, 60, 70, 80, 90, 95))
        assert len(caplog.messages) == 1
        evn.meminfo_total = lambda: 0  # MemTotal unknown: the limit
        evn._arm()
        assert evn._armed["kubepods"] == marks
        evn.rules.set(Policy.model_validate({"resourceUsedThresholdWithBE": {"memoryEvictThresholdPercent": 75}}), "t")
        evn._arm()
        assert evn._armed["kubepods"] == tuple(int(GiB * p / 100) for p in (50, 60, 75, 80, 90, 95))
        evn.stop()
        assert evn._armed == {} and evn._events is None

    asyncio.run(scenario())


def test_what_cannot_be_armed_is_said_and_the_rounds_check_it(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    evn, tree = armed_scene(tmp_path, pressure=False)

    async def scenario() -> None:
        with caplog.at_level(logging.INFO, "nriplugin.qos.evict"):
            evn.start(asyncio.get_running_loop())
        d = tree.root / "memory" / "kubepods"
        assert caplog.messages == [
            f"memory events on kubepods: {d}/memory.pressure_level: No such file or directory; "
            "the 1 s rounds check it too"
        ]
        assert "kubepods" in evn._armed  # said once: not tried again at every round
        evn.stop()

    asyncio.run(scenario())


def test_a_root_without_memory_or_capacity_is_not_armed(tmp_path: Path) -> None:
    evn, tree = armed_scene(tmp_path)

    async def scenario() -> None:
        evn.roots = ["kubepods", "nowhere"]
        evn.meminfo_total = lambda: 0
        tree.memory("kubepods", 500 * MiB, limit=None)
        (tree.root / "memory" / "kubepods" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
        evn.start(asyncio.get_running_loop())  # no limit and no MemTotal: no capacity to arm at
        assert evn._armed == {}
        evn.meminfo_total = lambda: GiB
        evn.roots = ["nowhere", "kubepods"]  # a root that is not there does not stop the next
        evn._arm()
        assert list(evn._armed) == ["kubepods"]  # MemTotal alone sizes an unlimited root
        from testkit.kernel_tree import v1_group

        v1_group(tree.root, "extra")
        tree.memory("extra", 10 * MiB, limit=GiB)
        (tree.root / "memory" / "extra" / "cgroup.event_control").write_text("")
        evn.roots = ["kubepods", "extra"]  # one armed already, the next still armed
        evn._arm()
        assert sorted(evn._armed) == ["extra", "kubepods"]
        evn.stop()
        evn._arm()  # stopped: nothing to arm with
        assert evn._armed == {}

    asyncio.run(scenario())


def test_cpu_round_evicts_through_the_evictor_and_starts_the_cooldown(tmp_path: Path) -> None:
    now: dict[str, ContainerUsage] = {}
    evn, tree, clock = eviction_scene(tmp_path, usage=lambda: now)
    backend = Backend()
    evn.evictor.runtime = backend
    now = {"a": usage(tree.pods[1].id, 0, cpu=3.0), "b": usage(tree.pods[2].id, 0, cpu=2.9)}

    def r(t: float, **kw: object) -> Round:
        sample = NodeSample(
            t=t, interval=1.0, ncpu=8, cpu_busy_cores=8.0, load1=8.0, by_class={"LS": ClassUsage(stall_ratio=0.5)}
        )
        cap = Capacity(8.0, 1.0, 4.0, 4.0, 3.0, 5.0)  # LS 4 stalled half the time: short of 2, release 2.4
        base = Round(t, sample, Level.EMERGENCY, 95.0, 0.0, Policy(), capacity=cap, be_limit=2.0, be_target=2.0)
        return replace(base, **kw)  # type: ignore[arg-type]

    async def scenario() -> None:
        clock.t = 100.0
        evn.cpu_round(r(100.0, capacity=None))  # no capacity: nothing
        assert evn.cpu._since is None
        evn.cpu_round(r(100.0))
        assert not evn.plans  # 2 s to be sustained
        clock.t = 102.0
        evn.evictor._busy.add("CPUEvict")  # a plan still under way: no other
        evn.cpu_round(r(102.0))
        assert not evn.plans
        evn.evictor._busy.clear()
        evn.cpu_round(r(102.0))
        await asyncio.sleep(0.01)
        ((t, plan),) = evn.plans
        assert (
            t == 102.0 and plan.strategy == "CPUEvict" and names(plan.victims) == [tree.pods[1].name, tree.pods[2].name]
        )
        assert [c[1] for c in backend.calls] == [tree.pods[1].name]
        assert evn.cpu.last_evicted == 102.0  # the cooldown starts at the eviction
        assert evn.evictor.pending[tree.pods[1].uid].group == tree.pods[1].linux.cgroup_parent.strip("/")

    asyncio.run(scenario())


def test_memory_check_evicts_credits_what_is_on_its_way_out_and_sums_the_roots(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from testkit.kernel_tree import v1_group

    evn, tree, clock = eviction_scene(tmp_path)
    backend = Backend()
    evn.evictor.runtime = backend
    v1_group(tree.root, "extra")
    tree.memory("kubepods", 700 * MiB, limit=GiB)
    tree.memory("extra", 100 * MiB, limit=GiB)
    evn.roots = ["kubepods", "extra"]
    evn.meminfo_total = lambda: 8 * GiB
    tree.pod_memory(1, 300 * MiB)
    tree.pod_memory(2, 10 * MiB)

    async def scenario() -> None:
        f = evn.memory_check()  # 800 MiB of 2 GiB: under 70 %
        assert f is not None and (f.used, f.capacity, f.pending) == (800 * MiB, 2 * GiB, 0)
        tree.memory("extra", 800 * MiB, limit=GiB)
        clock.t = 101.0
        with caplog.at_level(logging.INFO, "nriplugin.qos.evict"):
            f = evn.memory_check()  # 1500 of 2048 MiB: over 70 %
        await asyncio.sleep(0.01)
        (said,) = [r for r in caplog.records if r.getMessage().startswith("MemoryEvict: ")]
        assert said.getMessage() == f"MemoryEvict: {evn.plans[0][1].release.why}"
        assert said.trigger == "threshold"  # type: ignore[attr-defined]
        ((_, plan),) = evn.plans
        assert plan.strategy == "MemoryEvict" and [c[1] for c in backend.calls] == [tree.pods[1].name]
        uid = tree.pods[1].uid
        assert evn.evictor.pending[uid].group == tree.pods[1].linux.cgroup_parent.strip("/")
        tree.pod_memory(1, 120 * MiB)  # on its way out
        clock.t = 102.0
        evn.evictor._busy.add("MemoryEvict")  # no new plan while one is under way
        f = evn.memory_check()
        assert f is not None and f.pending == 120 * MiB and len(evn.plans) == 1
        evn.evictor._busy.clear()
        tree.pod_memory(1, 0)  # gone: nothing left charged
        f = evn.memory_check()
        assert f is not None and f.pending == 0 and uid not in evn.evictor.pending

    asyncio.run(scenario())


def test_a_pods_growth_edges(tmp_path: Path) -> None:
    evn, _, _ = eviction_scene(tmp_path)
    evn._pod_mem["late"] = deque([(10.0, 0), (11.0, 100), (12.0, 200)])
    assert evn._pod_growth("late") == 0.0  # 2 s of readings, whenever they start
    evn._pod_mem["slow-start"] = deque([(0.0, 100), (2.0, 150), (4.0, 300)])
    assert evn._pod_growth("slow-start") == pytest.approx(25 * 60)  # the first half's 25 B/s
    now: dict[str, ContainerUsage] = {}
    evn.usage = lambda: now
    for t, rss in [(0.0, 0), (1.0, 60), (100.0, 6000)]:
        now = {"c": usage("three", rss)}
        evn.observe_pods(t)
    assert evn._pod_growth("three") == pytest.approx(60 * 60)  # three readings stay, however old
    for t, rss in [(0.0, 150), (1.0, 100), (2.0, 200), (100.0, 200 + 98 * 500)]:
        now = {"c": usage("four", rss)}
        evn.observe_pods(t)
    assert [p[0] for p in evn._pod_mem["four"]] == [1.0, 2.0, 100.0]  # a fourth pushes the oldest out
    assert evn._pod_growth("four") == pytest.approx(100 * 60)


def test_candidates_take_requests_from_shares_and_priorities_from_the_cluster_then_labels(tmp_path: Path) -> None:
    evn, tree, _ = eviction_scene(tmp_path)
    be2, be3 = tree.pods[1], tree.pods[2]
    c2, c3 = tree.containers[1], tree.containers[2]
    c2.linux.resources.cpu.shares.value = 2048
    c3.linux.resources.cpu.shares.value = 2  # kubelet's minimum for BE: no request
    be3.labels["koordinator.sh/priority"] = "5"
    be2.labels["koordinator.sh/priority"] = "7"
    model = evn.model
    for p, c in ((be2, c2), (be3, c3)):
        model.container_started(p, c)

    class Cluster:
        def priority(self, uid: str) -> int | None:
            return {be2.uid: -3}.get(uid)

    evn.priorities = Cluster()
    cands = {c.name: c for c in evn.candidates(memory=False)}
    assert cands[be2.name].cpu_request_cores == 2.0 and cands[be3.name].cpu_request_cores == 0.0
    assert cands[be2.name].priority == -3  # the cluster's, over the label
    assert cands[be3.name].priority == 5  # no cluster priority: the label
    assert cands[be2.name].cpu_cores == 0.0  # no usage measured
    since = {r.pod.name: r.since for _, r in model.containers()}
    assert cands[be2.name].started == pytest.approx(since[be2.name], abs=5.0)
    evn.priorities = None
    assert {c.name: c.priority for c in evn.candidates(memory=False)} == {be2.name: 7, be3.name: 5}


def test_the_node_memory_is_meminfos_by_default(tmp_path: Path) -> None:
    evn, _, _ = eviction_scene(tmp_path)
    m = evn.stats.meminfo()
    assert m is not None and evn.meminfo_total() == m.total > 0


def test_an_evictions_own_defaults(tmp_path: Path) -> None:
    class Cluster:
        def priority(self, uid: str) -> int | None:
            return None

    cluster = Cluster()
    evn, _, _ = eviction_scene(tmp_path, priorities=cluster)
    assert evn.priorities is cluster and evn.memory_score == 0.0 and evn._critical is False
    assert evn.wakeups.maxlen == 100 and evn.plans.maxlen == 20 and evn._pod_groups == {}


# --- the notifications' names, what cannot be armed, and cgroup v2 ------------------------------


def test_every_notification_is_armed_under_its_own_name_and_fires_as_it(tmp_path: Path) -> None:
    evn, _ = armed_scene(tmp_path)

    async def scenario() -> None:
        evn.start(asyncio.get_running_loop())
        assert evn._events is not None
        assert evn._events.names() == ["kubepods:pressure", *(f"kubepods:usage{i}" for i in range(6))]
        evn.stop()

    asyncio.run(scenario())


def test_a_root_that_refuses_every_notification_says_each_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """No ``cgroup.event_control`` (a memory controller that cannot notify): one line lists every
    refusal, in order, and the root counts as armed (the rounds check it)."""
    evn, tree = armed_scene(tmp_path)
    d = tree.root / "memory" / "kubepods"
    (d / "cgroup.event_control").unlink()

    async def scenario() -> None:
        with caplog.at_level(logging.INFO, "nriplugin.qos.evict"):
            evn.start(asyncio.get_running_loop())
        marks = [int(GiB * p / 100) for p in (50, 60, 70, 80, 90, 95)]
        why = [
            f"{d}/cgroup.event_control refused memory.usage_in_bytes {b}: No such file or directory (ENOENT)"
            for b in marks
        ]
        why.append(
            f"{d}/cgroup.event_control refused memory.pressure_level critical,hierarchy: "
            "No such file or directory (ENOENT)"
        )
        assert caplog.messages == [f"memory events on kubepods: {'; '.join(why)}; the 1 s rounds check it too"]
        assert list(evn._armed) == ["kubepods"] and evn._events is not None and len(evn._events) == 0
        evn.stop()

    asyncio.run(scenario())


def test_a_root_outside_the_tree_or_without_capacity_does_not_stop_the_next(tmp_path: Path) -> None:
    from testkit.kernel_tree import v1_group

    evn, tree = armed_scene(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (tree.root / "memory" / "escape").symlink_to(outside)  # resolves out of the cgroup root
    v1_group(tree.root, "unlimited")
    tree.memory("unlimited", 10 * MiB)
    (tree.root / "memory" / "unlimited" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    evn.meminfo_total = lambda: 0  # with no MemTotal, an unlimited root has no capacity

    async def scenario() -> None:
        evn.roots = ["escape", "unlimited", "kubepods"]
        evn.start(asyncio.get_running_loop())
        assert list(evn._armed) == ["kubepods"]
        evn.stop()

    asyncio.run(scenario())


def v2_scene(tmp_path: Path, events: bool = True, pressure: bool = True) -> tuple[Eviction, Path]:
    """A cgroup v2 pods root of 1 GiB at 500 MiB. Its ``memory.pressure`` is a FIFO: a file that
    takes a PSI trigger and can be polled, as the kernel's does (it never fires)."""
    from testkit.kernel_tree import v2_tree

    root = v2_tree(tmp_path / "cg", ["kubepods"])
    d = root / "kubepods"
    (d / "memory.current").write_text(f"{500 * MiB}\n")
    (d / "memory.max").write_text(f"{GiB}\n")
    (d / "memory.stat").write_text(f"anon {400 * MiB}\nfile {100 * MiB}\ninactive_file 0\n")
    if events:
        (d / "memory.events").write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n")
    if pressure:
        os.mkfifo(d / "memory.pressure")
    rules = RuleCache()
    cg = Cgroups(root)
    node = Node.create(rules, caps=caps(), cgroups=cg)
    evn = Eviction(node.model, node.desired, cg, Stats(cg), rules, Evictor(runtime=Backend()), ["/kubepods/"])
    evn.meminfo_total = lambda: 8 * GiB
    return evn, d


def test_cgroup_v2_arms_memory_events_and_a_psi_trigger_and_fires_on_events(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    evn, d = v2_scene(tmp_path)
    checks: list[str] = []
    evn.memory_check = lambda: checks.append("check")  # type: ignore[method-assign]

    async def scenario() -> None:
        with caplog.at_level(logging.INFO, "nriplugin.qos.evict"):
            evn.start(asyncio.get_running_loop())
        assert evn._events is not None and evn._events.names() == ["kubepods:events", "kubepods:pressure"]
        assert caplog.messages == [
            "memory events armed on kubepods: usage at 512, 614, 716, 819, 921, 972 MiB, critical pressure"
        ]
        (d / "memory.events").write_text("low 0\nhigh 1\nmax 0\noom 0\noom_kill 0\n")  # the kernel's update
        for _ in range(100):
            await asyncio.sleep(0.01)
            if checks:
                break
        assert [w for _, w in evn.wakeups] == ["kubepods:events"] and checks == ["check"]
        evn.stop()

    asyncio.run(scenario())


def test_cgroup_v2_without_events_or_pressure_says_both(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    evn, d = v2_scene(tmp_path, events=False, pressure=False)

    async def scenario() -> None:
        with caplog.at_level(logging.INFO, "nriplugin.qos.evict"):
            evn.start(asyncio.get_running_loop())
        assert caplog.messages == [
            f"memory events on kubepods: {d}/memory.events: no such file; "
            f"{d}/memory.pressure: No such file or directory; the 1 s rounds check it too"
        ]
        assert list(evn._armed) == ["kubepods"]
        evn.stop()

    asyncio.run(scenario())


def test_a_pods_cpu_request_sums_its_containers_shares_above_two(tmp_path: Path) -> None:
    """A BE pod's request is the sum over its containers of shares / 1024, a container at the
    kernel's minimum of 2 shares (no request) adding nothing; a BE pod with no container yet
    requests nothing."""
    from testkit.runtime_peer import make_container, make_pod

    evn, tree, _ = eviction_scene(tmp_path)
    be2 = tree.pods[1]
    for i, shares in ((11, 3), (12, 2), (13, 512)):
        evn.model.container_started(be2, make_container(i, be2, shares=shares))
    empty = make_pod(9, "BE")
    evn.model.pod_seen(empty)
    cands = {c.name: c for c in evn.candidates(memory=False)}
    assert cands[be2.name].cpu_request_cores == 1.0 + 3 / 1024 + 0.5
    assert cands[tree.pods[2].name].cpu_request_cores == 1.0
    assert cands[empty.name].cpu_request_cores == 0.0


def test_a_cpu_round_reads_no_pods_memory(tmp_path: Path) -> None:
    """CPUEvict ranks by CPU: its candidates are made without reading a pod's memory files."""
    now: dict[str, ContainerUsage] = {}
    evn, tree, clock = eviction_scene(tmp_path, usage=lambda: now)
    now = {"a": usage(tree.pods[1].id, 0, cpu=3.0), "b": usage(tree.pods[2].id, 0, cpu=2.9)}
    tree.pod_memory(1, 300 * MiB)
    reads = working_set_reads(evn.stats)
    sample = NodeSample(
        t=100.0, interval=1.0, ncpu=8, cpu_busy_cores=8.0, load1=8.0, by_class={"LS": ClassUsage(stall_ratio=0.5)}
    )
    cap = Capacity(8.0, 1.0, 4.0, 4.0, 3.0, 5.0)

    async def scenario() -> None:
        for t in (100.0, 102.0):
            clock.t = t
            evn.cpu_round(
                Round(
                    t,
                    replace(sample, t=t),
                    Level.EMERGENCY,
                    95.0,
                    0.0,
                    Policy(),
                    capacity=cap,
                    be_limit=2.0,
                    be_target=2.0,
                )
            )
        await asyncio.sleep(0.01)
        ((_, plan),) = evn.plans
        assert all(c.freeable_bytes == 0 for c in plan.victims)

    asyncio.run(scenario())
    assert reads == []


def test_a_pods_points_are_its_containers_rss_summed_exactly(tmp_path: Path) -> None:
    now = {"c1": usage("p", 100), "c2": usage("p", 20), "c3": usage("q", 7)}
    evn, _, _ = eviction_scene(tmp_path, usage=lambda: now)
    evn.observe_pods(1.0)
    assert {p: list(v) for p, v in evn._pod_mem.items()} == {"p": [(1.0, 120)], "q": [(1.0, 7)]}


def test_a_cpu_victim_on_its_way_out_is_reported_with_its_share(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A CPU victim is not measured per pod: while its group is there it holds the share it was
    evicted for (not counted as bytes), and its leaving reports that share."""
    from nriplugin.qos.eviction.evictor import Pending

    evn, tree, clock = eviction_scene(tmp_path)
    group = tree.pods[1].linux.cgroup_parent.strip("/")
    tree.pod_memory(1, 300 * MiB)
    evn.evictor.pending["u"] = Pending("u", "batch/be", "CPUEvict", 2.5, "cores", 100.0, group, 2.5)
    assert evn._settle() == 0.0 and evn.evictor.pending["u"].held == 2.5
    evn.stats.close()  # tmpfs reads a removed file through a kept descriptor; cgroupfs does not
    shutil.rmtree(tree.root / "memory" / group)
    clock.t = 103.0
    with caplog.at_level(logging.INFO, "nriplugin.qos.evict"):
        assert evn._settle() == 0.0
    assert caplog.messages == ["CPUEvict: batch/be gone after 3.0 s, freed about 2.50 cores (expected 2.50 cores)"]
    assert not evn.evictor.pending


def test_a_batch_sized_be_pods_cpu_request_is_its_batch_cpu(tmp_path: Path) -> None:
    """A BE pod sized by Koordinator's batch resources asks kubelet for no CPU (its container
    has kubelet's 2 shares): eviction sees the batch-cpu it was scheduled with, not 0."""
    evn, tree, _ = eviction_scene(tmp_path)
    sized, plain = tree.pods[1], tree.pods[2]
    name = tree.containers[1].name
    spec = {"containers": {name: {"requests": {"kubernetes.io/batch-cpu": "1500"}, "limits": {}}}}
    sized.annotations["node.koordinator.sh/extended-resource-spec"] = json.dumps(spec)
    for c in tree.containers[1:3]:
        c.linux.resources.cpu.shares.value = 2
    requests = {c.name: c.cpu_request_cores for c in evn.candidates(memory=False)}
    assert requests == {sized.name: 1.5, plain.name: 0.0}
