"""CPUEvict and MemoryEvict against worked examples (a 64-core CPU emergency, a leaking pod), the
victim ranking, and the evictor's rules (order, PDB refusals, rate limit, no repeats,
dry run, pending credit)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from nriplugin.kernel.cgroup import Cgroups
from nriplugin.kernel.stats import Stats, WorkingSet
from nriplugin.node.assembly import Node
from nriplugin.nri import api_pb2 as api
from nriplugin.policy.cache import RuleCache
from nriplugin.policy.model import Policy
from nriplugin.policy.qos import QoSClass
from nriplugin.qos.collect import Collector
from nriplugin.qos.eviction.cpu import CpuConfig, CpuEvictDecider, CpuFacts, emergency_release, satisfaction_release
from nriplugin.qos.eviction.evictor import EvictionOutcome, Evictor
from nriplugin.qos.eviction.loop import Eviction
from nriplugin.qos.eviction.memory import MemoryConfig, MemoryEvictDecider, MemoryFacts, release
from nriplugin.qos.eviction.victims import (
    Candidate,
    EvictionPlan,
    Release,
    fewest,
    label_priority,
    rank_cpu,
    rank_memory,
)
from nriplugin.qos.levels import Level
from nriplugin.qos.node_resource import capacity
from nriplugin.qos.strategy import Round
from testkit.kernel_tree import v1_tree
from testkit.runtime_peer import make_container, make_pod
from tests.test_features import caps

GiB, MiB = 1 << 30, 1 << 20


def be(n: int, **kw: object) -> Candidate:
    return Candidate(uid=f"u{n}", namespace="batch", name=f"be-{n}", qos=QoSClass.BE, **kw)  # type: ignore[arg-type]


# the 64-core CPUEvict case ----------------------------------------------------------------------


def cpu_case() -> tuple[CpuFacts, list[Candidate]]:
    """T=20:00:15: 64 cores, 4 for the system, BE suppressed to 8, LS at 52 and stalled; ten
    BE pods of 3 cores each, with priorities 0-9 (Koordinator's label)."""
    facts = CpuFacts(
        t=100.0,
        level=4,
        score=92.0,
        suppressed=True,
        total=64.0,
        system_reserved=4.0,
        ls_usage=52.0,
        be_usage=8.0,
        ls_stall=0.13,
    )
    pods = [be(i, priority=i, cpu_cores=3.0, started=float(i)) for i in range(10)]
    return facts, pods


def test_the_cpu_case_evicts_the_three_lowest_priority_pods_freeing_9_cores() -> None:
    facts, pods = cpu_case()
    rel = emergency_release(facts, CpuConfig())
    assert rel is not None and rel.amount == pytest.approx(8.1, abs=0.05)  # 1.2 x 6.76: "release 8 CPU"
    ev = CpuEvictDecider(CpuConfig(sustain=1.0))
    assert ev.decide(facts, pods) is None  # not yet sustained
    plan = ev.decide(_at(facts, 101.0), pods)
    assert plan is not None
    chosen = plan.chosen()
    assert [c.name for c in chosen] == ["be-0", "be-1", "be-2"]
    assert sum(c.cpu_cores for c in chosen) == 9.0
    assert fewest(pods, rel.amount, lambda c: c.cpu_cores) == 3


def _at(f: CpuFacts, t: float) -> CpuFacts:
    from dataclasses import replace

    return replace(f, t=t)


def test_cpu_evict_needs_every_condition_and_waits_out_its_cooldown() -> None:
    facts, pods = cpu_case()
    cfg = CpuConfig(sustain=0.0, cooldown=60.0)
    from dataclasses import replace

    assert emergency_release(replace(facts, score=85.0), cfg) is None  # CRITICAL only
    assert emergency_release(replace(facts, suppressed=False), cfg) is None  # suppression first
    assert emergency_release(replace(facts, ls_stall=0.02), cfg) is None  # LS is fine
    assert emergency_release(replace(facts, ls_stall=0.0, ls_throttled=0.5), cfg) is not None  # throttled LS
    assert emergency_release(replace(facts, ls_usage=30.0), cfg) is None  # LS has room
    ev = CpuEvictDecider(cfg)
    assert ev.decide(facts, pods) is not None
    ev.evicted(facts.t)
    assert ev.decide(_at(facts, facts.t + 30), pods) is None
    assert ev.decide(_at(facts, facts.t + 61), pods) is not None


def test_cpu_ranking_is_priority_then_usage_then_newest_and_never_ls() -> None:
    ls = Candidate("l", "web", "api", QoSClass.LS, priority=-5, cpu_cores=9.0)
    lsr = Candidate("r", "web", "db", QoSClass.LSR, priority=-5, cpu_cores=9.0)
    sysp = Candidate("s", "kube-system", "dns", QoSClass.SYSTEM, cpu_cores=9.0)
    pods = [be(1, priority=5, cpu_cores=1.0), be(2, cpu_cores=1.0, started=1.0), be(3, cpu_cores=1.0, started=2.0)]
    pods.append(be(4, cpu_cores=2.0))
    ranked = rank_cpu([ls, lsr, sysp, *pods])
    assert [c.name for c in ranked] == ["be-4", "be-3", "be-2", "be-1"]


def test_a_quiet_or_small_be_pod_is_not_a_cpu_victim() -> None:
    """A pod that frees next to nothing is never a victim: idle (under a millicore), or under
    5 % of the 8.1-core release (0.41 cores: 5.1 %, 0.4: 4.9 %) while another covers that."""
    facts, _ = cpu_case()
    pods = [be(1, cpu_cores=0.0002), be(2, cpu_cores=0.4), be(3, cpu_cores=0.41), be(4, cpu_cores=1.0)]
    plan = CpuEvictDecider(CpuConfig(sustain=0.0)).decide(facts, pods)
    assert plan is not None and [c.name for c in plan.victims] == ["be-4", "be-3"]


def test_when_no_be_pod_covers_a_share_of_the_release_the_one_that_frees_most_still_goes() -> None:
    """BE cut to its floor cannot cover 5 % of the release: the pods that free most are still
    victims (LS starves, BE takes what it can), but one that frees next to nothing beside
    them (under 5 % of the best) is not."""
    facts, _ = cpu_case()
    pods = [be(1, cpu_cores=0.0002), be(2, cpu_cores=0.004), be(3, cpu_cores=0.1), be(4, cpu_cores=0.09)]
    plan = CpuEvictDecider(CpuConfig(sustain=0.0)).decide(facts, pods)
    assert plan is not None and [c.name for c in plan.victims] == ["be-3", "be-4"]
    assert plan.chosen() == plan.victims[:2]


def test_koordinator_be_satisfaction_variant() -> None:
    cfg = CpuConfig(satisfaction_lower=40, satisfaction_upper=60, window=10)
    # BE asked for 10 cores, gets a 3-core limit and uses all of it: 30 % satisfied
    rel = satisfaction_release(10.0, 3.0, 2.9, cfg)
    assert rel is not None and rel.amount == pytest.approx(3.0)  # 10 x (60% - 30%)
    assert satisfaction_release(10.0, 3.0, 1.0, cfg) is None  # BE does not use what it has
    assert satisfaction_release(10.0, 5.0, 5.0, cfg) is None  # 50 % > lower
    ev = CpuEvictDecider(cfg)
    pods = [be(i, cpu_request_cores=2.0, cpu_cores=0.6) for i in range(5)]
    facts = CpuFacts(0.0, 1, 50.0, True, 16.0, 0.0, 4.0, 3.0, be_request=10.0, be_limit=3.0)
    assert ev.decide(facts, pods) is None  # a third of the window first
    plan = ev.decide(_at(facts, 4.0), pods)
    assert plan is not None and plan.unit == "request" and len(plan.chosen()) == 2


def test_policy_accepts_the_nodeslo_satisfaction_fields() -> None:
    p = Policy.model_validate(
        {
            "resourceUsedThresholdWithBE": {
                "cpuEvictBESatisfactionLowerPercent": 40,
                "cpuEvictBESatisfactionUpperPercent": 60,
                "cpuEvictBEUsageThresholdPercent": 90,
                "cpuEvictTimeWindowSeconds": 30,
            },
            "qosManager": {"eviction": {"dryRun": True, "maxPerMinute": 3}, "memoryEvict": {"oomHorizon": "15s"}},
        }
    )
    assert p.qosManager.eviction.dryRun and p.qosManager.memoryEvict.oomHorizon == 15.0


# the leaking-pod case ----------------------------------------------------------------------------


def test_the_leak_case_evicts_the_leaking_pod_alone() -> None:
    """Day 1 08:11: 120 GB node at 100 GB used, pressure at EMERGENCY; BE pod A has grown to
    16 GB at 500 MB/hour; a larger BE pod that does not grow stays."""
    cfg = MemoryConfig(threshold_percent=85, lower_percent=80, score_threshold=85)
    facts = MemoryFacts(t=0.0, capacity=120 * GiB, used=100 * GiB, score=90.0)
    rel = release(facts, cfg)
    assert rel is not None and rel.trigger == "pressure"
    assert rel.amount == pytest.approx(1.3 * (100 - 96) * GiB)
    a = be(1, freeable_bytes=16 * GiB, growth_bytes_per_min=500 * MiB / 60)
    big = be(2, freeable_bytes=20 * GiB)
    small = be(3, freeable_bytes=2 * GiB)
    plan = MemoryEvictDecider(cfg).decide(facts, [small, big, a])
    assert plan is not None
    assert [c.name for c in plan.victims] == ["be-1", "be-2", "be-3"]  # the leak first
    assert [c.name for c in plan.chosen()] == ["be-1"]


def test_memory_triggers_threshold_and_oom_risk_and_credit_pending() -> None:
    cfg = MemoryConfig()  # 70 % / 68 %
    assert release(MemoryFacts(0, GiB, int(0.5 * GiB)), cfg) is None
    r = release(MemoryFacts(0, GiB, int(0.72 * GiB)), cfg)
    assert r is not None and r.trigger == "threshold"
    assert r.amount == pytest.approx(1.3 * 0.04 * GiB, rel=1e-6)
    # 40 % used but growing 100 MiB/s: the limit is 6 s away
    r = release(MemoryFacts(0, GiB, int(0.4 * GiB), growth=100 * MiB), cfg)
    assert r is not None and r.trigger == "oom_risk"
    assert r.amount == pytest.approx(1000 * MiB - 0.6 * GiB, rel=1e-3)
    # a victim on its way out covers the rest
    assert release(MemoryFacts(0, GiB, int(0.72 * GiB), pending=100 * MiB), cfg) is None
    # pressure without a working set above the lower percent: page cache, nothing to evict
    assert release(MemoryFacts(0, GiB, int(0.3 * GiB), critical=True), cfg) is None


def test_under_oom_risk_a_growing_pod_counts_what_it_would_add() -> None:
    cfg = MemoryConfig()
    facts = MemoryFacts(0, GiB, int(0.6 * GiB), growth=60 * MiB)  # 6.8 s to the limit
    grower = be(1, freeable_bytes=200 * MiB, growth_bytes_per_min=60 * 60 * MiB)
    other = be(2, freeable_bytes=300 * MiB)
    plan = MemoryEvictDecider(cfg).decide(facts, [other, grower])
    assert plan is not None and plan.horizon == 10.0 and not plan.urgent
    assert [c.name for c in plan.chosen()] == ["be-1"]  # 200 MiB + 10 s of 60 MiB/s
    fast = MemoryFacts(0, GiB, int(0.8 * GiB), growth=60 * MiB)  # 3.4 s: no time for grace
    urgent = MemoryEvictDecider(cfg).decide(fast, [other, grower])
    assert urgent is not None and urgent.urgent


def test_growth_is_sustained_growth_not_a_jump() -> None:
    m = MemoryEvictDecider()
    for i in range(5):
        m.observe(float(i), (100 + 30 * i) * MiB)
    assert m.growth() == pytest.approx(30 * MiB)
    jump = MemoryEvictDecider()  # 450 MiB of pods starting at once, then steady
    for t, used in ((0.0, 50), (1.0, 300), (2.0, 500), (3.0, 500), (4.0, 500), (5.0, 500)):
        jump.observe(t, used * MiB)
    assert jump.growth() == 0.0


def test_oom_risk_takes_only_growing_pods() -> None:
    facts = MemoryFacts(0, GiB, int(0.4 * GiB), growth=100 * MiB)
    steady = [be(1, freeable_bytes=200 * MiB), be(2, freeable_bytes=150 * MiB)]
    assert MemoryEvictDecider().decide(facts, steady) is None  # nothing that grows: nothing to stop


def test_memory_ranking_never_takes_ls() -> None:
    ls = Candidate("l", "web", "api", QoSClass.LS, freeable_bytes=50 * GiB, growth_bytes_per_min=1e9)
    assert rank_memory([ls, be(1, freeable_bytes=MiB)]) == [be(1, freeable_bytes=MiB)]


def test_label_priority_is_untrusted() -> None:
    assert label_priority({"koordinator.sh/priority": "5500"}) == 5500
    assert label_priority({"koordinator.sh/priority": "high"}) is None
    assert label_priority({"koordinator.sh/priority": "9" * 40}) is None
    assert label_priority(None) is None


# the evictor ------------------------------------------------------------------------------------


@dataclass
class Scripted:
    """A backend answering from a script (the Eviction API's outcomes), recording calls."""

    answers: dict[str, EvictionOutcome] = field(default_factory=dict)
    calls: list[tuple[str, int]] = field(default_factory=list)

    async def evict(
        self, ns: str, name: str, uid: str, grace_seconds: int, reason: str, message: str
    ) -> EvictionOutcome:
        self.calls.append((name, grace_seconds))
        return self.answers.get(name, EvictionOutcome.EVICTED)


@dataclass
class Clock:
    t: float = 0.0

    def __call__(self) -> float:
        return self.t


def cpu_plan(pods: list[Candidate], amount: float) -> EvictionPlan:
    return EvictionPlan("CPUEvict", Release(amount, "emergency", "test"), pods, "cores")


def test_a_pdb_refusal_spares_that_pod_and_the_next_goes() -> None:
    cluster, runtime = Scripted({"be-0": EvictionOutcome.BLOCKED}), Scripted()
    clock = Clock()
    ev = Evictor(cluster=cluster, runtime=runtime, clock=clock)
    pods = [be(i, cpu_cores=3.0) for i in range(4)]
    done = asyncio.run(ev.execute(cpu_plan(pods, 5.0), {}))
    assert [c.name for c in done] == ["be-1", "be-2"]
    assert [n for n, _ in cluster.calls] == ["be-0", "be-1", "be-2"] and not runtime.calls
    assert not ev.eligible(pods[0])  # retried after retry_after
    assert not ev.eligible(pods[1])  # evicted: not again within 2 minutes
    clock.t = 31.0
    ev.settle(lambda p: None)
    assert ev.eligible(pods[0]) and not ev.eligible(pods[1])
    clock.t = 121.0
    ev.settle(lambda p: None)
    assert ev.eligible(pods[1])


def test_urgent_plans_go_through_the_runtime_without_grace() -> None:
    cluster, runtime = Scripted(), Scripted()
    ev = Evictor(cluster=cluster, runtime=runtime)
    plan = EvictionPlan("MemoryEvict", Release(MiB, "oom_risk", "t"), [be(1, freeable_bytes=GiB)], "bytes", urgent=True)
    asyncio.run(ev.execute(plan, {}))
    assert runtime.calls == [("be-1", 0)] and not cluster.calls
    asyncio.run(ev.execute(cpu_plan([be(2, cpu_cores=1.0)], 0.5), {}))
    assert cluster.calls == [("be-2", 5)]  # not urgent: the cluster, with the grace period


def test_rate_limit_and_dry_run() -> None:
    runtime = Scripted()
    ev = Evictor(runtime=runtime, max_per_minute=2)
    done = asyncio.run(ev.execute(cpu_plan([be(i, cpu_cores=1.0) for i in range(5)], 5.0), {}))
    assert len(done) == 2 and len(runtime.calls) == 2
    dry = Evictor(runtime=runtime, dry_run=True)
    done = asyncio.run(dry.execute(cpu_plan([be(9, cpu_cores=1.0)], 0.5), {}))
    assert [c.name for c in done] == ["be-9"] and len(runtime.calls) == 2 and not dry.pending


def memory_plan(pods: list[Candidate], amount: int) -> EvictionPlan:
    return EvictionPlan("MemoryEvict", Release(amount, "threshold", "t"), pods, "bytes")


def test_a_failing_backend_is_backed_off_not_replaced_by_the_next_pod(caplog: pytest.LogCaptureFixture) -> None:
    """CRI unreachable: the best victim's eviction fails; nobody else is evicted in its place,
    the failure is counted and logged once for the plan, and no plan is made until the
    back-off (1 s, doubling) ends; then the same pod is tried again, and a success resets it."""

    @dataclass
    class Failing(Scripted):
        down: bool = True

        async def evict(
            self, ns: str, name: str, uid: str, grace_seconds: int, reason: str, message: str
        ) -> EvictionOutcome:
            self.calls.append((name, grace_seconds))
            if self.down:
                raise ConnectionError("connect: no such file or directory")
            return EvictionOutcome.EVICTED

    @dataclass
    class Counts:
        failed: list[tuple[str, str]] = field(default_factory=list)
        done: list[str] = field(default_factory=list)

        def evicted(self, strategy: str, reason: str, dry_run: bool) -> None:
            self.done.append(strategy)

        def eviction_failed(self, backend: str, outcome: str) -> None:
            self.failed.append((backend, outcome))

    counts = Counts()
    clock, runtime = Clock(), Failing()
    ev = Evictor(runtime=runtime, clock=clock, observer=counts)
    pods = [be(1, freeable_bytes=400 * MiB), be(2, freeable_bytes=200 * MiB), be(3, freeable_bytes=100 * MiB)]
    caplog.set_level(logging.INFO, "nriplugin.qos.evict")
    assert asyncio.run(ev.execute(memory_plan(pods, 500 * MiB), {})) == []
    assert runtime.calls == [("be-1", 5)] and counts.failed == [("runtime", "error")]
    failed = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert len(failed) == 1 and "nobody else is evicted" in failed[0] and "no such file" in failed[0]
    assert ev.busy("MemoryEvict") and ev.busy("CPUEvict")  # backing off: no plans
    clock.t = 1.0
    assert not ev.busy("MemoryEvict")
    asyncio.run(ev.execute(memory_plan(pods, 500 * MiB), {}))
    assert [n for n, _ in runtime.calls] == ["be-1", "be-1"] and ev.failures == 2
    clock.t = 2.5
    assert ev.busy("MemoryEvict")  # 2 s after the second failure
    clock.t, runtime.down = 3.0, False
    done = asyncio.run(ev.execute(memory_plan(pods, 500 * MiB), {}))
    assert [c.name for c in done] == ["be-1", "be-2"] and ev.failures == 0 and len(counts.failed) == 2
    assert counts.done == ["MemoryEvict", "MemoryEvict"]
    assert not ev.busy("MemoryEvict")


def test_a_pod_that_frees_next_to_nothing_is_never_a_victim() -> None:
    """MemoryEvict never plans a quiet pod that frees about 0 MiB, and the evictor skips a
    victim under 5 % of the release even when a plan lists it."""
    facts = MemoryFacts(0, GiB, int(0.75 * GiB))  # release 1.3 x 7 % of 1 GiB = 93 MiB
    quiet = be(1, freeable_bytes=200 * 1024)
    small = be(2, freeable_bytes=4 * MiB)
    assert MemoryEvictDecider().decide(facts, [quiet, small]) is None
    plan = MemoryEvictDecider().decide(facts, [quiet, small, be(3, freeable_bytes=300 * MiB)])
    assert plan is not None and [c.name for c in plan.victims] == ["be-3"]
    runtime = Scripted()
    asyncio.run(Evictor(runtime=runtime).execute(memory_plan([quiet, small], 100 * MiB), {}))
    assert runtime.calls == []


def test_pending_releases_are_credited_until_the_victim_is_gone() -> None:
    ev = Evictor(runtime=Scripted())
    plan = EvictionPlan("MemoryEvict", Release(MiB, "threshold", "t"), [be(1, freeable_bytes=300 * MiB)], "bytes")
    asyncio.run(ev.execute(plan, {"u1": "kubepods/besteffort/pod1"}))
    held = {"u1": 250.0 * MiB}
    assert ev.settle(lambda p: held.get(p.uid)) == 250 * MiB
    del held["u1"]
    assert ev.settle(lambda p: held.get(p.uid)) == 0 and not ev.pending


# the glue: facts from the node model and the kernel's files ------------------------------------


def working_set_reads(stats: Stats) -> list[str]:
    """The groups whose working set is read through ``stats`` from now on, in order."""
    reads: list[str] = []
    real = stats.working_set

    def counted(group: str) -> WorkingSet | None:
        reads.append(group)
        return real(group)

    stats.working_set = counted  # type: ignore[method-assign]
    return reads


@dataclass
class MemoryTree:
    """A tree laid out like the kernel's v1 memory hierarchy: the pods root, an LS pod and two
    BE pods, each with one container."""

    root: Path
    pods: list[api.PodSandbox]
    containers: list[api.Container]

    @classmethod
    def make(cls, tmp_path: Path) -> MemoryTree:
        pods = [make_pod(1, "LS"), make_pod(2, "BE"), make_pod(3, "BE")]
        containers = [make_container(i, p) for i, p in enumerate(pods, 1)]
        groups = ["kubepods", *[p.linux.cgroup_parent.lstrip("/") for p in pods]]
        groups += [c.linux.cgroups_path.lstrip("/") for c in containers]
        return cls(v1_tree(tmp_path, groups, extra={"cpuacct": {"cpuacct.usage": "0"}}), pods, containers)

    def memory(self, group: str, usage: int, limit: int | None = None) -> None:
        d = self.root / "memory" / group
        (d / "memory.usage_in_bytes").write_text(f"{usage}\n")
        (d / "memory.stat").write_text(f"cache 0\nrss {usage}\ntotal_rss {usage}\ntotal_inactive_file 0\n")
        if limit:
            (d / "memory.limit_in_bytes").write_text(f"{limit}\n")

    def pod_memory(self, i: int, usage: int) -> None:
        """The pod and its one container."""
        self.memory(self.pods[i].linux.cgroup_parent.lstrip("/"), usage)
        self.memory(self.containers[i].linux.cgroups_path.lstrip("/"), usage)


def test_memory_check_reads_the_pods_root_and_evicts_the_leaking_be_pod(tmp_path: Path) -> None:
    """A 1 GiB pods root at 75 %, an LS pod and two BE pods, one of which grows. The
    collector's rounds give the pods' growth (no reads of their own), and the check evicts the
    grower through the backend."""
    tree = MemoryTree.make(tmp_path)
    rules = RuleCache()
    cg = Cgroups(tree.root)
    node = Node.create(rules, caps=caps(), cgroups=cg)
    for p, c in zip(tree.pods, tree.containers, strict=True):
        node.model.container_started(p, c)
    clock = Clock(100.0)
    backend = Scripted()
    ev = Evictor(runtime=backend, clock=clock)
    coll = Collector(node.model, node.desired, cg, clock=clock, memory_every=2)
    evn = Eviction(
        node.model, node.desired, cg, coll.stats, rules, ev, ["kubepods"], usage=lambda: coll.by_container, clock=clock
    )
    evn.meminfo_total = lambda: 8 * GiB
    tree.pod_memory(0, 300 * MiB)
    tree.pod_memory(1, 250 * MiB)
    reads = working_set_reads(coll.stats)

    async def run() -> None:
        for step in range(9):  # the leak grows 10 MiB a second; memory read every other round
            clock.t = 100.0 + step
            tree.pod_memory(2, (100 + 10 * step) * MiB)
            tree.memory("kubepods", (600 + 10 * step) * MiB, limit=GiB)
            sample = coll.sample()
            assert sample.memory_read == (step % 2 == 0)
            r = Round(sample.t, sample, Level.LOW, 0.0, 0.0, rules.policy, capacity=capacity(sample), be_target=2.0)
            evn.cpu_round(r)  # CPUEvict's turn, then MemoryEvict's, as the manager runs them
            evn.memory_round(r)
            facts = evn.last_facts
            assert facts is not None and facts.capacity == GiB
            assert not backend.calls  # under 70 % of 1 GiB: nothing yet
        assert set(reads) == {"kubepods"}  # no pod group read while nothing is to be done
        clock.t = 109.0
        tree.memory("kubepods", 780 * MiB, limit=GiB)  # over 70 %
        tree.pod_memory(2, 190 * MiB)
        evn.memory_check()
        await asyncio.sleep(0.01)  # the evictor's task

    asyncio.run(run())
    coll.close()
    assert backend.calls == [(tree.pods[2].name, 5)]  # the leaking pod, not the larger steady one
    assert tree.pods[2].uid in ev.pending


def test_the_cluster_client_is_a_backend_and_its_outcomes_are_understood() -> None:
    from nriplugin.cluster.eviction import ApiEvictionOutcome, ApiEvictionResult, ApiEvictor
    from nriplugin.qos.eviction.evictor import Backend, outcome

    def backend(b: ApiEvictor) -> Backend:  # mypy checks the client against the protocol
        return b

    assert backend is not None
    assert outcome(ApiEvictionOutcome(ApiEvictionResult.BLOCKED, 429, "budget")) is EvictionOutcome.BLOCKED
    assert outcome(ApiEvictionResult.GONE) is EvictionOutcome.GONE and outcome("nonsense") is EvictionOutcome.ERROR

    @dataclass
    class Api:
        calls: list[str] = field(default_factory=list)

        async def evict(
            self, ns: str, name: str, uid: str, grace: int, reason: str, message: str
        ) -> ApiEvictionOutcome:
            self.calls.append(name)
            if name == "be-0":
                return ApiEvictionOutcome(
                    ApiEvictionResult.BLOCKED, 429, "Cannot evict pod as it would violate the pod's disruption budget"
                )
            return ApiEvictionOutcome(ApiEvictionResult.EVICTED, 201, "")

    api: list[Api] = []  # the cluster side comes up later than the evictor
    ev = Evictor(runtime=Scripted(), cluster_of=lambda: api[0] if api else None)
    api.append(Api())
    done = asyncio.run(ev.execute(cpu_plan([be(0, cpu_cores=2.0), be(1, cpu_cores=2.0)], 1.0), {}))
    assert [c.name for c in done] == ["be-1"] and api[0].calls == ["be-0", "be-1"]


def test_cluster_priorities_come_first() -> None:
    from nriplugin.cluster.pods import PodInfo
    from nriplugin.qos.eviction.loop import ClusterPriorities

    info = {"u1": PodInfo("u1", "b", "x", priority=None, koord_priority=5500), "u2": PodInfo("u2", "b", "y", 10, 1)}

    class Pods:
        def by_uid(self, uid: str) -> PodInfo | None:
            return info.get(uid)

    p = ClusterPriorities(lambda: Pods())
    assert (p.priority("u1"), p.priority("u2"), p.priority("u3")) == (5500, 10, None)
    assert ClusterPriorities(lambda: None).priority("u1") is None
