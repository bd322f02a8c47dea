"""CPUSuppress as a strategy, on the real desired state: what it writes (quota and period, never
the weight of the kubelet's group), in which order on cgroup v1 (the class ceiling before the
group when lowering, after it when raising), the cpuset policy's whole-CPU steps, switching
policy and turning it off."""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass, field

import pytest

from nriplugin.kernel.cgroup import Version
from nriplugin.node.model import pod_key
from nriplugin.node.overlays import group_key
from nriplugin.policy.model import Policy
from nriplugin.policy.qos import QoSClass
from nriplugin.qos.cpu_suppress import IDLE, SUPPRESS, CPUSuppressStrategy, Limiter, be_groups, be_target
from nriplugin.qos.levels import Level
from nriplugin.qos.sample import NodeSample
from nriplugin.qos.strategy import Capacity, Decision, Round
from tests.test_node_pinned import Scene

BE_GROUP = "kubepods/besteffort"


@dataclass
class Observed:
    limits: list[float] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    lifts: list[float | None] = field(default_factory=list)

    def round_done(self, seconds: float, collect_seconds: float) -> None:
        pass

    def scores(self, cpu: float, cpu_level: str, memory: float, memory_level: str) -> None:
        pass

    def be_limit(self, cores: float) -> None:
        self.limits.append(cores)

    def suppressed(self, reason: str) -> None:
        self.reasons.append(reason)

    def burst(self, granted: bool) -> None:
        pass

    def birth_lift(self, seconds: float | None) -> None:
        self.lifts.append(seconds)


class Host:
    """What CPUSuppress uses of its manager, with the real desired state of a :class:`Scene`."""

    def __init__(self, groups: list[str] | None = None, cpuset: bool = False, idle_file: bool = False) -> None:
        self.scene = Scene(cpuset=cpuset)
        self.model = self.scene.model
        self.desired = self.scene.d
        # a kernel before 5.15 unless asked: no cpu.idle (only a left one is given back)
        self.desired.caps.files["cpu.idle"] = idle_file
        self.observer = Observed()
        self.decisions: deque[Decision] = deque()
        self.groups = [BE_GROUP] if groups is None else groups
        self.owner = self
        self.collector = None
        self.eviction = None

    def own_group(self, path: str) -> str:
        return group_key(path)


def policy(idle: bool = False, **suppress: object) -> Policy:
    """The seed's formula (LS's whole request reserved at every level) and koordlet's 65 %
    usage budget, so the figures below are the seed's; the defaults have tests of their own.
    ``idle``: BE's tasks SCHED_IDLE (the default's; off here, so BE has a quota at every level
    in the tests that follow the quota)."""
    return Policy.model_validate(
        {
            "beProcess": {"schedIdle": idle},
            "qosManager": {
                "cpuSuppress": {"deadbandCores": 0.1, "raiseDelay": 1.0, "reserveLSRequestFrom": "LOW", **suppress}
            },
            "resourceUsedThresholdWithBE": {"cpuSuppressThresholdPercent": 65},
            "beMinCPUShares": 3,
        }
    )


def cap(non_be: float = 0.0, measured: bool = True) -> Capacity:
    return Capacity(4.0, 0.0, 2.0, ls_usage=0.0, be_usage=0.0, non_be_usage=non_be, be_measured=measured)


def round_at(t: float, level: Level, p: Policy, capacity: Capacity | None = None) -> Round:
    s = NodeSample(t=t, interval=1.0, ncpu=4, cpu_busy_cores=0.0, load1=0.0)
    return Round(t=t, sample=s, level=level, cpu_score=0, memory_score=0, policy=p, capacity=capacity)


def test_no_capacity_no_decision() -> None:
    h = Host()
    s = CPUSuppressStrategy(h)  # type: ignore[arg-type]
    r = round_at(0.0, Level.HIGH, policy())
    s.decide(r)
    assert (r.be_limit, r.be_target) == (None, None) and h.scene.told == []


def test_no_groups_nothing_written() -> None:
    h = Host(groups=[])
    s = CPUSuppressStrategy(h)  # type: ignore[arg-type]
    r = round_at(0.0, Level.HIGH, policy(), cap())
    s.decide(r)
    assert r.be_limit is None and r.be_target == pytest.approx(1.0)
    assert s.limiter.current is None and h.decisions == deque()


def test_the_usage_budget_waits_until_be_is_measured() -> None:
    """(4 - 2) x 1.0 = 2 at LOW; 4 x 65 % - 1.6 = 1.0 by usage: not applied until BE's group was
    read twice, though the target (for CPUEvict) already has it."""
    h = Host()
    s = CPUSuppressStrategy(h)  # type: ignore[arg-type]
    r = round_at(0.0, Level.LOW, policy(), cap(non_be=1.6, measured=False))
    s.decide(r)
    assert r.be_limit == pytest.approx(2.0) and r.be_target == pytest.approx(1.0)
    r = round_at(1.0, Level.LOW, policy(), cap(non_be=1.6))
    s.decide(r)
    assert r.be_limit == pytest.approx(1.0)


def test_a_cut_writes_the_ceiling_first_and_the_group_its_quota() -> None:
    h = Host()
    s = CPUSuppressStrategy(h)  # type: ignore[arg-type]
    r = round_at(5.0, Level.HIGH, policy(), cap())
    s.decide(r)  # (4 - 2) x 0.5 = 1 core
    g = group_key(BE_GROUP)
    be_keys = [pod_key(h.scene.be_pod.id), h.scene.be.id]
    assert h.scene.told == [be_keys, [g]]  # lowering: the children's ceiling before the group
    intent = h.desired.intent(g)
    assert intent is not None
    # the group's weight is the kubelet's: never written (beMinCPUShares is 3 here)
    assert (intent.get("cpu.cfs_quota_us"), intent.get("cpu.cfs_period_us"), intent.get("cpu.shares")) == (
        100000,
        100000,
        None,
    )
    assert intent.files[("cpu.cfs_quota_us", "")].owner == SUPPRESS
    assert h.desired.capped(h.scene.be.id)
    assert (h.observer.limits, h.observer.reasons) == ([1.0], ["HIGH"])
    why = "HIGH: (4 total - 2.00 LS request - 0 reserved) x 0.5"
    assert list(h.decisions) == [Decision(5.0, SUPPRESS, BE_GROUP, "1.00 cores", why)]
    assert r.be_limit == 1.0 and r.be_target == 1.0


def test_a_raise_moves_the_ceiling_and_the_groups_quota() -> None:
    """The ceiling is decided first either way; the one writer orders the files (children
    lowered before the group, raised after it)."""
    h = Host()
    s = CPUSuppressStrategy(h)  # type: ignore[arg-type]
    s.decide(round_at(0.0, Level.CRITICAL, policy(), cap()))  # 0.6
    h.scene.told.clear()
    s.decide(round_at(1.0, Level.LOW, policy(), cap()))  # 2.0: held
    assert h.scene.told == []
    s.decide(round_at(2.0, Level.LOW, policy(), cap()))
    g = group_key(BE_GROUP)
    assert [g] in h.scene.told
    intent = h.desired.intent(g)
    assert intent is not None and intent.get("cpu.cfs_quota_us") == 200000
    assert h.desired._caps[QoSClass.BE][0] == 2.0
    assert [d.value for d in h.decisions] == ["0.60 cores", "2.00 cores"]


def test_between_rounds_only_cuts() -> None:
    h = Host()
    s = CPUSuppressStrategy(h)  # type: ignore[arg-type]
    p = policy()
    s.decide(round_at(0.0, Level.MEDIUM, p, cap()))  # 1.6
    r = round_at(0.1, Level.MEDIUM, p, cap(non_be=2.5))  # usage: 2.6 - 2.5 = 0.1
    s.between_rounds(r)
    assert s.limiter.current == pytest.approx(0.1)
    s.between_rounds(round_at(5.0, Level.MEDIUM, p, cap()))
    assert s.limiter.current == pytest.approx(0.1)  # the fast path never raises
    s.between_rounds(round_at(6.0, Level.MEDIUM, p, None))
    assert s.limiter.current == pytest.approx(0.1)


def test_the_cpuset_policy_writes_whole_cpus_only_when_the_count_changes() -> None:
    h = Host(cpuset=True)
    s = CPUSuppressStrategy(h)  # type: ignore[arg-type]
    p = policy(policy="cpuset")
    s.decide(round_at(0.0, Level.HIGH, p, cap()))  # 1.0 core -> 1 CPU
    assert h.observer.limits == [1.0]
    assert [d.value for d in h.decisions] == ["1 CPU(s)"]
    assert h.decisions[0].why.endswith("x 0.5")
    intent = h.desired.intent(h.scene.be.id)
    assert intent is not None and intent.files[("cpuset.cpus", "")].owner == SUPPRESS
    assert h.desired.intent(group_key(BE_GROUP)) is not None
    assert h.desired.overlays.targets() == []  # no quota
    s.decide(round_at(1.0, Level.CRITICAL, p, cap()))  # 0.6: still one CPU, not written
    assert s.limiter.current == pytest.approx(0.6) and len(h.decisions) == 1
    s.decide(round_at(2.0, Level.MEDIUM, p, cap()))  # 1.6: held
    s.decide(round_at(3.0, Level.MEDIUM, p, cap()))
    assert [d.value for d in h.decisions] == ["1 CPU(s)", "2 CPU(s)"]
    assert h.observer.limits == [1.0, 2.0]


def test_switching_policy_lifts_what_the_other_set() -> None:
    h = Host(cpuset=True)
    s = CPUSuppressStrategy(h)  # type: ignore[arg-type]
    s.decide(round_at(0.0, Level.HIGH, policy(), cap()))
    g = group_key(BE_GROUP)
    assert h.desired.overlays.targets() == [g] and h.desired.capped(h.scene.be.id)
    s.decide(round_at(1.0, Level.HIGH, policy(policy="cpuset"), cap()))
    # the decided ceiling goes (what BE's group still holds bounds it until the group rises)
    assert h.desired.overlays.targets() == [] and QoSClass.BE not in h.desired._caps
    assert s.limiter.writes == 2 and len(h.decisions) == 2  # reset: the cpuset limit written at once
    pool = h.desired.cpus.share_pool()
    s.decide(round_at(2.0, Level.HIGH, policy(), cap()))  # back: the whole pool again
    intent = h.desired.intent(h.scene.be.id)
    assert intent is not None
    from nriplugin.kernel.cpulist import format_cpulist

    assert intent.get("cpuset.cpus") == format_cpulist(pool)
    assert h.desired.overlays.targets() == [g]


def test_off_withdraws_once_and_says_so() -> None:
    h = Host()
    s = CPUSuppressStrategy(h)  # type: ignore[arg-type]
    assert s.off(0.0, "nothing held") is False and h.decisions == deque()
    s.decide(round_at(1.0, Level.HIGH, policy(), cap()))
    assert s.off(2.0, "the manager is off") is True
    assert h.desired.overlays.targets() == [] and QoSClass.BE not in h.desired._caps
    assert h.decisions[-1] == Decision(2.0, SUPPRESS, "all", "withdrawn", "the manager is off")
    assert s.limiter.current is None
    assert s.off(3.0, "again") is False
    s.decide(round_at(4.0, Level.HIGH, policy(), cap()))  # on again: written at once
    assert s.limiter.current == 1.0 and h.desired.overlays.targets() == [group_key(BE_GROUP)]


def test_off_lifts_a_cpuset_limit() -> None:
    h = Host(cpuset=True)
    s = CPUSuppressStrategy(h)  # type: ignore[arg-type]
    s.decide(round_at(0.0, Level.HIGH, policy(policy="cpuset"), cap()))
    assert s.off(1.0, "off") is True
    assert h.desired._cpusets[QoSClass.BE][0] is None
    assert h.decisions[-1].value == "withdrawn"


def test_the_limiter_takes_the_policys_deadband_delay_and_write_cap() -> None:
    h = Host()
    s = CPUSuppressStrategy(h)  # type: ignore[arg-type]
    p = policy(deadbandCores=0.3, raiseDelay=1.5, maxWritesPerMinute=1)
    s.decide(round_at(0.0, Level.HIGH, p, cap()))  # 1.0
    assert (s.limiter.deadband, s.limiter.relax_hold, s.limiter.max_relax_per_minute) == (0.3, 1.5, 1)
    s.decide(round_at(1.0, Level.CRITICAL, p, cap()))  # 0.6: 0.4 below, more than the deadband
    assert s.limiter.current == pytest.approx(0.6)
    s.decide(round_at(2.0, Level.LOW, p, cap()))  # 2.0: held 1.5 s
    s.decide(round_at(3.49, Level.LOW, p, cap()))
    assert s.limiter.current == pytest.approx(0.6)
    s.decide(round_at(3.5, Level.LOW, p, cap()))
    assert s.limiter.current == pytest.approx(2.0)  # the one reversal of the minute
    s.decide(round_at(4.0, Level.CRITICAL, p, cap()))
    for t in (5.0, 8.0, 12.0):
        s.decide(round_at(t, Level.LOW, p, cap()))
    assert s.limiter.current == pytest.approx(0.6)  # a second reversal within the minute waits
    s.decide(round_at(63.5, Level.LOW, p, cap()))
    assert s.limiter.current == pytest.approx(2.0)
    lower = Capacity(4.0, 0.0, 2.2, ls_usage=0.0, be_usage=0.0, non_be_usage=0.0)
    s.decide(round_at(64.0, Level.LOW, p, lower))  # 1.8: 0.2 below, within the policy's 0.3
    assert s.limiter.current == pytest.approx(2.0)


def test_a_write_is_logged_with_its_figures(caplog: pytest.LogCaptureFixture) -> None:
    h = Host()
    s = CPUSuppressStrategy(h)  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, "nriplugin.qos"):
        s.decide(round_at(0.0, Level.CRITICAL, policy(), cap()))  # 2 x 0.3 = 0.6
    rec = next(r for r in caplog.records if r.getMessage().startswith("BE limited to"))
    assert rec.getMessage() == "BE limited to 0.60 cores: CRITICAL: (4 total - 2.00 LS request - 0 reserved) x 0.3"
    assert (rec.be_limit_cores, rec.level, rec.policy) == (0.6, "CRITICAL", "cfsQuota")  # type: ignore[attr-defined]


def test_a_write_says_the_cpu_score_and_its_terms_to_a_tenth(caplog: pytest.LogCaptureFixture) -> None:
    s = CPUSuppressStrategy(Host())  # type: ignore[arg-type]
    r = round_at(0.0, Level.CRITICAL, policy(), cap())
    r.cpu_score = 80.27
    r.cpu_terms = {"node": 30.04, "ls": 41.46, "trend": 8.14, "load": 0.63}
    with caplog.at_level(logging.INFO, "nriplugin.qos"):
        s.decide(r)
    rec = next(x for x in caplog.records if x.getMessage().startswith("BE limited to"))
    assert rec.getMessage().endswith(" x 0.3 [CPU score 80; last round's terms: node 30, ls 41, trend 8, load 1]")
    fields = {k: rec.__dict__[k] for k in ("cpu_score", "cpu_node", "cpu_ls", "cpu_trend", "cpu_load")}
    assert fields == {"cpu_score": 80.3, "cpu_node": 30.0, "cpu_ls": 41.5, "cpu_trend": 8.1, "cpu_load": 0.6}


def test_the_fast_path_never_begins_a_raise() -> None:
    h = Host()
    s = CPUSuppressStrategy(h)  # type: ignore[arg-type]
    p = policy()
    s.decide(round_at(0.0, Level.CRITICAL, p, cap()))  # 0.6
    for t in (1.0, 2.0, 3.0, 5.0):
        s.between_rounds(round_at(t, Level.LOW, p, cap()))  # 2.0 wanted, held past raiseDelay
    assert s.limiter.current == pytest.approx(0.6)


def test_the_cpuset_limits_reasons() -> None:
    h = Host(cpuset=True)
    s = CPUSuppressStrategy(h)  # type: ignore[arg-type]
    s.decide(round_at(0.0, Level.HIGH, policy(policy="cpuset"), cap()))
    why = "HIGH: (4 total - 2.00 LS request - 0 reserved) x 0.5; BE on 1 CPU(s) of the share pool"
    assert h.desired._cpusets[QoSClass.BE] == (1, SUPPRESS, why)
    s.off(1.0, "the manager is off")
    assert h.desired._cpusets[QoSClass.BE] == (None, SUPPRESS, "the manager is off: BE on the whole share pool again")


def test_the_ceiling_and_the_groups_quota_carry_the_limit_and_its_reasons() -> None:
    h = Host()
    s = CPUSuppressStrategy(h)  # type: ignore[arg-type]
    s.decide(round_at(0.0, Level.HIGH, policy(), cap()))  # lowering: 1.0
    assert h.desired._caps[QoSClass.BE] == (1.0, SUPPRESS, "BE's group is limited to 1.00 cores")
    intent = h.desired.intent(group_key(BE_GROUP))
    assert intent is not None
    assert intent.files[("cpu.cfs_quota_us", "")].why == "HIGH: (4 total - 2.00 LS request - 0 reserved) x 0.5"
    s.decide(round_at(1.0, Level.LOW, policy(), cap()))
    s.decide(round_at(2.0, Level.LOW, policy(), cap()))  # raising: 2.0
    assert h.desired._caps[QoSClass.BE] == (2.0, SUPPRESS, "BE's group is limited to 2.00 cores")


def test_the_observer_gets_the_limit_in_cores_or_cpus() -> None:
    h = Host()
    s = CPUSuppressStrategy(h)  # type: ignore[arg-type]
    s.decide(round_at(0.0, Level.CRITICAL, policy(), cap()))
    assert h.observer.limits == [pytest.approx(0.6)]
    h2 = Host(cpuset=True)
    s2 = CPUSuppressStrategy(h2)  # type: ignore[arg-type]
    s2.decide(round_at(0.0, Level.CRITICAL, policy(policy="cpuset"), cap()))
    assert h2.observer.limits == [1.0]


def test_every_group_is_named_in_the_decision() -> None:
    h = Host(groups=[BE_GROUP, "kubepods.slice/kubepods-besteffort.slice"])
    s = CPUSuppressStrategy(h)  # type: ignore[arg-type]
    s.decide(round_at(0.0, Level.HIGH, policy(), cap()))
    assert h.decisions[0].target == f"{BE_GROUP},kubepods.slice/kubepods-besteffort.slice"


def test_the_logged_limit_is_rounded_to_a_thousandth(caplog: pytest.LogCaptureFixture) -> None:
    h = Host()
    s = CPUSuppressStrategy(h)  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, "nriplugin.qos"):
        s.decide(round_at(0.0, Level.LOW, policy(), cap(non_be=1.23456)))  # 4 x 65 % - 1.23456
    rec = next(r for r in caplog.records if r.getMessage().startswith("BE limited to"))
    assert rec.be_limit_cores == 1.365  # type: ignore[attr-defined]


def test_a_one_percent_usage_budget_counts() -> None:
    t = be_target(Capacity(100.0, 0.0, 0.0, 0.0, 0.0, 0.0), 1.0, "LOW", usage_threshold_percent=1)
    assert t.cores == pytest.approx(1.0)


def test_switching_back_from_cpuset_says_why() -> None:
    h = Host(cpuset=True)
    s = CPUSuppressStrategy(h)  # type: ignore[arg-type]
    s.decide(round_at(0.0, Level.HIGH, policy(policy="cpuset"), cap()))
    s.decide(round_at(1.0, Level.HIGH, policy(), cap()))
    why = "the suppression policy is now cfsQuota: BE on the whole share pool again"
    assert h.desired._cpusets[QoSClass.BE] == (None, SUPPRESS, why)
    assert s.off(2.0, "off") is True  # the quota
    assert s.off(3.0, "off") is False  # nothing left: the cpuset was lifted, not held


def test_a_target_exactly_the_deadband_above_begins_no_hold() -> None:
    lim = Limiter(deadband=0.25, relax_hold=1.0)
    lim.step(0.0, 1.0)
    assert lim.step(0.0, 1.25) is None
    assert lim.step(0.5, 3.0) is None  # the hold begins here, not at 0
    assert lim.step(1.49, 3.0) is None
    assert lim.step(1.5, 3.0) == 3.0


def test_a_raise_to_exactly_the_deadband_above_is_not_written() -> None:
    lim = Limiter(deadband=0.25, relax_hold=1.0)
    lim.step(0.0, 1.0)
    assert lim.step(1.0, 3.0) is None
    assert lim.step(1.5, 1.25, tighten_only=True) is None  # the lowest of the hold: 1.25
    assert lim.step(2.0, 3.0) is None  # up to 1.25 is not more than the deadband: the hold restarts
    assert lim.current == 1.0
    assert lim.step(3.0, 3.0) == 3.0


def test_be_groups_under_either_driver_and_any_slashes() -> None:
    assert be_groups(["/top/kubepods/", "a/b/kubepods.slice", "kubepods.slice/"]) == [
        "top/kubepods/besteffort",
        "a/b/kubepods.slice/kubepods-besteffort.slice",
        "kubepods.slice/kubepods-besteffort.slice",
    ]
    assert be_groups([]) == []


def test_the_groups_bound_be_while_it_is_cut() -> None:
    """Each of BE's groups bounds BE's ceiling: in this scene the kernel holds 777 / 777 us, one
    core, so a 2-core limit is in force at 1 core until the group is written."""
    h = Host()
    s = CPUSuppressStrategy(h)  # type: ignore[arg-type]
    s.decide(round_at(0.0, Level.LOW, policy(), cap()))
    assert h.desired._caps[QoSClass.BE][0] == 2.0
    assert h.desired._in_force[QoSClass.BE] == (1.0, SUPPRESS, "its QoS-level group holds 1.00 cores")


def idle_host(idle_file: bool = True, version: Version = Version.V2) -> Host:
    h = Host(idle_file=idle_file)
    h.desired.caps.cgroup_version = version
    return h


@pytest.mark.parametrize("version", [Version.V1, Version.V2])
def test_a_cpu_idle_left_on_bes_group_is_given_back_with_the_kubelets_weight_once(version: Version) -> None:
    """An older agent's ``beGroupIdle`` left ``cpu.idle`` 1 on the kubelet's besteffort group
    (the kernel then refuses the kubelet's weight writes): the first round puts 0 back with
    the kubelet's lowest weight, and the values stay once the give-back's overlay is gone."""
    h = idle_host(version=version)
    g = group_key(BE_GROUP)
    held = {"cpu.idle": 1}
    h.desired.current = lambda key, resource: held.get(resource) if key == g else None
    s = CPUSuppressStrategy(h)  # type: ignore[arg-type]
    s.decide(round_at(0.0, Level.LOW, policy(idle=True), cap()))
    intent = h.desired.intent(g)
    assert intent is not None
    assert (intent.get("cpu.idle"), intent.get("cpu.shares")) == (0, 2)
    assert not h.desired.overlays.targets(IDLE)  # withdrawn: the baseline carries the values
    told = len(h.scene.told)
    held["cpu.idle"] = 0
    s.decide(round_at(1.0, Level.LOW, policy(idle=True), cap()))
    assert len(h.scene.told) == told  # checked once per group


@pytest.mark.parametrize("idle_file", [True, False])
def test_no_cpu_idle_overlay_and_be_idle_follows_the_policy_whatever_the_kernel(idle_file: bool) -> None:
    """BE's idle class is its tasks' (``beProcess.schedIdle``): nothing goes on the kubelet's
    group, with or without ``cpu.idle`` in the kernel; the round tells CPUEvict."""
    for idle in (True, False):
        h = idle_host(idle_file=idle_file)
        s = CPUSuppressStrategy(h)  # type: ignore[arg-type]
        r = round_at(0.0, Level.LOW, policy(idle=idle), cap())
        s.decide(r)
        assert r.be_idle is idle
        intent = h.desired.intent(group_key(BE_GROUP))
        assert intent is None or intent.get("cpu.idle") is None
        assert not h.desired.overlays.targets(IDLE)


def calm_ls(ls_usage: float = 0.5) -> Capacity:
    """4 CPUs, LS requesting 2 and using ``ls_usage``, the system 0.2 besides."""
    return Capacity(4.0, 0.0, 2.0, ls_usage=ls_usage, be_usage=0.0, non_be_usage=ls_usage + 0.2)


def reserve_from(level: str) -> Policy:
    """The default policy (a 90 % usage budget) with the LS request reserved from ``level``, BE's
    tasks not idle (so the bounds apply below ``quotaFrom`` too)."""
    return Policy.model_validate(
        {"beProcess": {"schedIdle": False}, "qosManager": {"cpuSuppress": {"reserveLSRequestFrom": level}}}
    )


@pytest.mark.parametrize(
    ("level", "cores", "why"),
    [
        (Level.LOW, 2.9, "4 x 90% - 0.70 used by LS and the system (the level's bound, 3.50, is looser)"),
        (Level.MEDIUM, 2.8, "MEDIUM: (4 total - 0.50 LS use - 0 reserved) x 0.8"),
        (Level.HIGH, 1.0, "HIGH: (4 total - 2.00 LS request - 0 reserved) x 0.5"),
        (Level.CRITICAL, 0.6, "CRITICAL: (4 total - 2.00 LS request - 0 reserved) x 0.3"),
    ],
)
def test_reserve_from_high_keeps_what_ls_uses_below_high_and_its_request_from_high(
    level: Level, cores: float, why: str
) -> None:
    """``reserveLSRequestFrom: HIGH``: LS's request reserved from HIGH up (the boundary is
    inclusive), what LS uses below it."""
    t = CPUSuppressStrategy(Host()).target(round_at(0.0, level, reserve_from("HIGH")), calm_ls())  # type: ignore[arg-type]
    assert t.cores == pytest.approx(cores) and t.why == why


def test_the_defaults_are_high_and_90_and_the_request_is_reserved_whenever_ls_uses_more() -> None:
    s = CPUSuppressStrategy(Host())  # type: ignore[arg-type]
    p = Policy()
    assert p.qosManager.cpuSuppress.reserveLSRequestFrom == "HIGH"
    assert p.resourceUsedThresholdWithBE.cpuSuppressThresholdPercent == 90
    t = s.target(round_at(0.0, Level.MEDIUM, reserve_from("HIGH")), calm_ls())
    assert t.cores == pytest.approx(2.8) and t.why == "MEDIUM: (4 total - 0.50 LS use - 0 reserved) x 0.8"
    assert (
        Policy.model_validate({"qosManager": {"profile": "latency-first"}}).qosManager.cpuSuppress.reserveLSRequestFrom
        == "LOW"
    )
    throughput = Policy.model_validate({"qosManager": {"profile": "throughput-first"}})
    assert throughput.qosManager.cpuSuppress.reserveLSRequestFrom == "CRITICAL"
    t = s.target(round_at(0.0, Level.LOW, reserve_from("LOW")), calm_ls(), usage_known=False)  # the seed's formula
    assert t.cores == pytest.approx(2.0) and t.why == "LOW: (4 total - 2.00 LS request - 0 reserved) x 1"
    t = s.target(round_at(0.0, Level.MEDIUM, reserve_from("HIGH")), calm_ls(3.0), usage_known=False)
    assert t.cores == pytest.approx(1.6) and t.why == "MEDIUM: (4 total - 2.00 LS request - 0 reserved) x 0.8"
    t = s.target(round_at(0.0, Level.HIGH, reserve_from("CRITICAL")), calm_ls(), usage_known=False)
    assert t.cores == pytest.approx(1.75) and t.why == "HIGH: (4 total - 0.50 LS use - 0 reserved) x 0.5"
    with pytest.raises(ValueError, match="reserveLSRequestFrom"):
        reserve_from("SOMETIMES")


def test_the_policys_level_names_are_the_levels_in_their_order() -> None:
    """``reserveLSRequestFrom`` is validated against the policy's own list of names, which the
    strategy looks up in ``Level``: the two must agree."""
    from typing import get_args

    from nriplugin.policy.model import LevelName

    assert get_args(LevelName) == tuple(level.name for level in Level)


def unquoted_policy(quota_from: str = "HIGH") -> Policy:
    return policy(idle=True, quotaFrom=quota_from)


def test_below_quota_from_an_idle_be_group_has_no_quota_and_from_it_the_bounds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """BE's tasks SCHED_IDLE, ``quotaFrom: HIGH``: no quota at LOW and MEDIUM (-1 written, so a
    previous agent's cut goes too, and no ceiling on BE's pods), the level's bound from HIGH on
    (inclusive), at once; back below HIGH the quota is lifted like any raise, after the hold."""
    h = idle_host()
    s = CPUSuppressStrategy(h)  # type: ignore[arg-type]
    p, g = unquoted_policy(), group_key(BE_GROUP)
    r = round_at(0.0, Level.LOW, p, cap())
    with caplog.at_level(logging.INFO, "nriplugin.qos"):
        s.decide(r)
    intent = h.desired.intent(g)
    assert intent is not None and intent.get("cpu.cfs_quota_us") == -1 and intent.get("cpu.idle") is None
    assert intent.files[("cpu.cfs_quota_us", "")].owner == SUPPRESS
    assert QoSClass.BE not in h.desired._caps  # no decided ceiling on BE's pods
    assert (r.be_limit, r.be_target) == (None, None)  # CPUEvict: BE is not suppressed
    why = "LOW: below quotaFrom HIGH, BE runs SCHED_IDLE without a quota"
    assert list(h.decisions) == [Decision(0.0, SUPPRESS, BE_GROUP, "no quota", why)]
    assert h.observer.limits == [math.inf]
    rec = next(x for x in caplog.records if x.getMessage().startswith("BE not limited"))
    assert rec.getMessage() == f"BE not limited (no quota): {why}"
    assert rec.be_limit_cores is None  # type: ignore[attr-defined]
    writes = s.limiter.writes
    s.decide(round_at(1.0, Level.MEDIUM, p, cap()))
    s.between_rounds(round_at(1.1, Level.MEDIUM, p, cap(non_be=2.5)))  # the usage budget is not in force
    assert s.limiter.writes == writes and len(h.decisions) == 1
    r = round_at(2.0, Level.HIGH, p, cap())
    s.decide(r)  # (4 - 2) x 0.5 = 1 core, at once
    intent = h.desired.intent(g)
    assert intent is not None and intent.get("cpu.cfs_quota_us") == 100000
    assert h.desired._caps[QoSClass.BE][0] == 1.0 and (r.be_limit, r.be_target) == (1.0, 1.0)
    s.between_rounds(round_at(2.1, Level.HIGH, p, cap(non_be=2.5)))  # 4 x 65 % - 2.5: cut by the fast path
    assert s.limiter.current == pytest.approx(0.1)
    s.decide(round_at(3.0, Level.MEDIUM, p, cap()))  # the hold begins
    s.decide(round_at(3.9, Level.MEDIUM, p, cap()))
    assert s.limiter.current == pytest.approx(0.1)
    s.decide(round_at(4.0, Level.MEDIUM, p, cap()))  # held raiseDelay (1 s): lifted
    intent = h.desired.intent(g)
    assert intent is not None and intent.get("cpu.cfs_quota_us") == -1
    assert QoSClass.BE not in h.desired._caps and s.limiter.current == math.inf
    assert [d.value for d in h.decisions] == ["no quota", "1.00 cores", "0.10 cores", "no quota"]


@pytest.mark.parametrize(
    ("idle", "quota_from", "mode", "quota"),
    [
        (False, "HIGH", "cfsQuota", 200000),  # BE's tasks not SCHED_IDLE: the quota stays
        (True, "LOW", "cfsQuota", 200000),  # a quota at every level
        (True, "MEDIUM", "cfsQuota", -1),  # LOW is below MEDIUM
    ],
)
def test_the_quota_goes_only_where_be_is_idle_and_below_quota_from(
    idle: bool, quota_from: str, mode: str, quota: int
) -> None:
    h = idle_host()
    s = CPUSuppressStrategy(h)  # type: ignore[arg-type]
    s.decide(round_at(0.0, Level.LOW, policy(idle=idle, quotaFrom=quota_from), cap()))  # (4 - 2) x 1.0 = 2 cores
    intent = h.desired.intent(group_key(BE_GROUP))
    assert intent is not None and intent.get("cpu.cfs_quota_us") == quota


def test_the_cpuset_policy_limits_be_at_every_level_even_when_it_is_idle() -> None:
    h = idle_host()
    s = CPUSuppressStrategy(h)  # type: ignore[arg-type]
    p = policy(quotaFrom="HIGH", policy="cpuset")
    assert not s.unquoted(round_at(0.0, Level.LOW, p, cap()))
    s.decide(round_at(0.0, Level.LOW, p, cap()))  # 2 cores: 2 CPUs
    assert [d.value for d in h.decisions] == ["2 CPU(s)"]


def test_quota_from_defaults_to_high_and_follows_the_profiles() -> None:
    assert Policy().qosManager.cpuSuppress.quotaFrom == "HIGH"
    got = {
        name: Policy.model_validate({"qosManager": {"profile": name}}).qosManager.cpuSuppress.quotaFrom
        for name in ("balanced", "latency-first", "throughput-first")
    }
    assert got == {"balanced": "HIGH", "latency-first": "MEDIUM", "throughput-first": "CRITICAL"}
    with pytest.raises(ValueError, match="quotaFrom"):
        unquoted_policy("SOMETIMES")


def test_a_kernel_layer_that_never_probed_cpu_idle_gives_nothing_back() -> None:
    """No ``cpu.idle`` entry at all in the capabilities is a kernel without the file: nothing
    to give back, whatever a read says; BE's tasks are still idle, so no quota at LOW."""
    h = idle_host()
    del h.desired.caps.files["cpu.idle"]
    h.desired.current = lambda key, resource: 1
    s = CPUSuppressStrategy(h)  # type: ignore[arg-type]
    s.decide(round_at(0.0, Level.LOW, unquoted_policy(), cap()))
    intent = h.desired.intent(group_key(BE_GROUP))
    assert intent is not None and intent.get("cpu.idle") is None and intent.get("cpu.cfs_quota_us") == -1


def test_ls_using_exactly_its_request_is_reserved_as_its_request() -> None:
    """The boundary of the LS reserve: a use equal to the request keeps the request (inclusive)."""
    c = Capacity(4.0, 0.0, 2.0, ls_usage=2.0, be_usage=0.0, non_be_usage=2.0)
    t = be_target(c, 0.8, "MEDIUM", ls_reserve=2.0)
    assert t.cores == pytest.approx(1.6) and t.why == "MEDIUM: (4 total - 2.00 LS request - 0 reserved) x 0.8"


def test_a_be_birth_lifts_the_groups_quota_until_the_last_one_started() -> None:
    """runc's systemd driver freezes a new container's cgroup: a BE group out of quota cannot
    freeze. From the first birth to the last start the group has no quota; the ceiling on BE's
    children with quotas stays; then the cut is back."""
    h = Host()
    s = CPUSuppressStrategy(h)  # type: ignore[arg-type]
    births = h.model.births
    g = group_key(BE_GROUP)
    births.begin("x")  # not cut yet: nothing to lift
    births.end("x")
    assert h.observer.lifts == [] and g not in h.desired.overlays
    s.decide(round_at(5.0, Level.HIGH, policy(), cap()))  # 1 core
    h.scene.told.clear()
    births.begin("a")
    births.begin("b")
    intent = h.desired.intent(g)
    assert intent is not None and intent.get("cpu.cfs_quota_us") == -1
    assert "while a BE container is born" in intent.files[("cpu.cfs_quota_us", "")].why
    assert h.desired.capped(h.scene.be.id)  # children with a quota stay under the ceiling
    assert h.scene.told == [[g]] and h.observer.lifts == [None]
    births.end("a")
    assert h.desired.intent(g).get("cpu.cfs_quota_us") == -1  # type: ignore[union-attr]
    births.end("b")
    assert h.desired.intent(g).get("cpu.cfs_quota_us") == 100000  # type: ignore[union-attr]
    assert len(h.observer.lifts) == 2 and isinstance(h.observer.lifts[1], float)
    assert h.observer.limits == [1.0]  # the decided limit never moved


def test_a_cut_decided_during_a_birth_waits_for_it() -> None:
    h = Host()
    s = CPUSuppressStrategy(h)  # type: ignore[arg-type]
    h.model.births.begin("a")
    s.decide(round_at(5.0, Level.HIGH, policy(), cap()))
    g = group_key(BE_GROUP)
    assert h.desired.intent(g).get("cpu.cfs_quota_us") == -1  # type: ignore[union-attr]
    h.model.births.end("a")
    assert h.desired.intent(g).get("cpu.cfs_quota_us") == 100000  # type: ignore[union-attr]


def test_births_lift_nothing_under_the_cpuset_policy() -> None:
    h = Host(cpuset=True)
    s = CPUSuppressStrategy(h)  # type: ignore[arg-type]
    s.decide(round_at(5.0, Level.HIGH, policy(policy="cpuset"), cap()))
    h.scene.told.clear()
    h.model.births.begin("a")
    assert h.scene.told == [] and h.observer.lifts == []
