"""CPUBurst as a strategy, on the real desired state: the raised quota and its period, the extra
that must fit in what is left of the node (an extra exactly equal to the headroom fits), what
bursts already take, the end of a burst, and off."""

from __future__ import annotations

import logging

import pytest

from nriplugin.policy.model import Policy
from nriplugin.policy.qos import QoSClass
from nriplugin.qos.collect import ContainerUsage
from nriplugin.qos.cpu_burst import BURST, CPUBurstStrategy
from nriplugin.qos.levels import Level
from nriplugin.qos.sample import NodeSample
from nriplugin.qos.strategy import Capacity, Decision, Round
from tests.test_qos_suppress_pinned import Host

CFG = Policy().qosManager.cpuBurst


class Usage:
    """What the collector measured of each container in the last round."""

    def __init__(self) -> None:
        self.by_container: dict[str, ContainerUsage] = {}


class BurstHost(Host):
    def __init__(self) -> None:
        super().__init__()
        self.collector = Usage()  # type: ignore[assignment]
        self.bursts: list[bool] = []
        self.observer.burst = self.bursts.append  # type: ignore[method-assign,assignment]

    def at_limit(self, key: str, qos: QoSClass = QoSClass.LS, limit: float | None = 2.0, used: float = 1.9) -> None:
        self.collector.by_container[key] = ContainerUsage(qos, "p", used, 0, 0, limit_cores=limit)  # type: ignore[attr-defined]


def cap(reserved: float = 0.0, non_be: float = 1.0) -> Capacity:
    return Capacity(4.0, reserved, 2.0, ls_usage=0.0, be_usage=0.0, non_be_usage=non_be)


def test_a_burst_raises_the_quota_by_the_ratio_and_keeps_the_period() -> None:
    h = BurstHost()
    ls = h.scene.ls.id  # quota 200000 per 100000: a 2-core limit
    h.at_limit(ls)
    s = CPUBurstStrategy(h)  # type: ignore[arg-type]
    assert s.burst(0.0, cap(), CFG) == pytest.approx(1.0)  # 2 x (1.5 - 1)
    intent = h.desired.intent(ls)
    assert intent is not None
    assert (intent.get("cpu.cfs_quota_us"), intent.get("cpu.cfs_period_us")) == (300000, 100000)
    assert intent.files[("cpu.cfs_quota_us", "")].owner == BURST
    assert h.bursts == []  # asked: counted once the kernel holds it
    why = "at its limit with the node idle: quota x1.5 for at most 10 s"
    assert list(h.decisions) == [Decision(0.0, BURST, "default/pod-2/main", "x1.5", why)]
    assert s.burst(1.0, cap(), CFG) == pytest.approx(1.0)  # still bursting: its extra still counts
    assert len(h.decisions) == 1


def test_an_extra_exactly_the_headroom_fits() -> None:
    h = BurstHost()
    h.at_limit(h.scene.ls.id)
    s = CPUBurstStrategy(h)  # type: ignore[arg-type]
    # idle 0.75 (BE left out, the reservation not): x1.5; headroom 4 - 2 - 1 = 1.0 = the extra
    assert s.burst(0.0, cap(reserved=2.0), CFG) == pytest.approx(1.0)
    h2 = BurstHost()
    h2.at_limit(h2.scene.ls.id)
    s2 = CPUBurstStrategy(h2)  # type: ignore[arg-type]
    assert s2.burst(0.0, cap(reserved=2.01), CFG) == 0.0  # 0.99 left: no burst
    assert h2.decisions == type(h2.decisions)() and h2.bursts == []


def test_the_ratio_follows_the_idle_share_and_its_settings() -> None:
    h = BurstHost()
    h.at_limit(h.scene.ls.id)
    s = CPUBurstStrategy(h)  # type: ignore[arg-type]
    assert s.burst(0.0, cap(non_be=3.0), CFG) == pytest.approx(0.6)  # idle 0.25: x1.3
    h = BurstHost()
    h.at_limit(h.scene.ls.id)
    s = CPUBurstStrategy(h)  # type: ignore[arg-type]
    assert s.burst(0.0, cap(non_be=3.3), CFG) == 0.0  # idle 0.175: none
    b = CFG.model_copy(
        update={"burstRatio": 2.0, "fullBurstNodeCPUIdle": 0.5, "burstDuration": 4.0, "burstCooldown": 1.0}
    )
    h = BurstHost()
    h.at_limit(h.scene.ls.id)
    s = CPUBurstStrategy(h)  # type: ignore[arg-type]
    assert s.burst(0.0, Capacity(8.0, 0.0, 2.0, 0.0, 0.0, 1.0), b) == pytest.approx(2.0)  # idle 7/8 > 0.5: x2
    assert (s.burster.duration, s.burster.cooldown) == (4.0, 1.0)


def test_no_cpus_no_idle_no_burst() -> None:
    h = BurstHost()
    h.at_limit(h.scene.ls.id)
    s = CPUBurstStrategy(h)  # type: ignore[arg-type]
    assert s.burst(0.0, Capacity(0.0, 0.0, 0.0, 0.0, 0.0, 0.0), CFG) == 0.0


def test_only_ls_containers_with_a_limit_burst() -> None:
    h = BurstHost()
    h.at_limit(h.scene.be.id, qos=QoSClass.BE)
    h.at_limit("nolimit", limit=None)
    h.at_limit("zero", limit=0.0)
    s = CPUBurstStrategy(h)  # type: ignore[arg-type]
    assert s.burst(0.0, cap(), CFG) == 0.0
    assert s.burster.bursting() == {} and h.decisions == type(h.decisions)()


def test_a_burst_ends_and_gives_its_extra_back() -> None:
    h = BurstHost()
    ls = h.scene.ls.id
    h.at_limit(ls)
    s = CPUBurstStrategy(h)  # type: ignore[arg-type]
    s.burst(0.0, cap(), CFG)
    h.at_limit(ls, used=0.5)  # no longer at its limit
    assert s.burst(1.0, cap(), CFG) == 0.0
    intent = h.desired.intent(ls)
    assert intent is not None and intent.get("cpu.cfs_quota_us") == 200000  # the runtime's again
    assert h.bursts == []  # never verified as held: neither granted nor ended counted
    assert h.decisions[-1].value == "x1"


def test_bursts_granted_count_against_the_next_ones() -> None:
    """Two LS containers at a 2-core limit: the first takes 1 core of the 2 left, the second
    fits exactly in what remains; a third would not."""
    h = BurstHost()
    ls = h.scene.ls.id
    h.at_limit(ls)
    s = CPUBurstStrategy(h)  # type: ignore[arg-type]
    assert s.burst(0.0, cap(reserved=1.0), CFG) == pytest.approx(1.0)  # headroom 4 - 1 - 1 = 2
    h.at_limit("other")  # not in the node model: counted, no overlay
    assert s.burst(1.0, cap(reserved=1.0), CFG) == pytest.approx(2.0)  # 2 - 1 already granted = 1: fits
    h.at_limit("third")
    assert s.burst(2.0, cap(reserved=1.0), CFG) == pytest.approx(2.0)  # nothing left
    assert set(s.burster.bursting()) == {ls, "other"}
    del h.collector.by_container["other"]  # type: ignore[attr-defined]
    assert s.burst(3.0, cap(reserved=1.0), CFG) == pytest.approx(2.0)  # third takes the freed core
    assert set(s.burster.bursting()) == {ls, "third"}


def test_a_burst_of_a_container_gone_from_usage_counts_nothing() -> None:
    h = BurstHost()
    h.at_limit("x")
    s = CPUBurstStrategy(h)  # type: ignore[arg-type]
    s.burst(0.0, cap(), CFG)
    s.burster.step(0.0, "ghost", True, 1.5)  # bursting, but no longer measured
    h.at_limit("x", used=0.0)
    assert s.burst(1.0, cap(), CFG) == 0.0


def test_decide_passes_the_extra_on_and_between_rounds_keeps_it() -> None:
    h = BurstHost()
    h.at_limit(h.scene.ls.id)
    s = CPUBurstStrategy(h)  # type: ignore[arg-type]
    smp = NodeSample(t=0.0, interval=1.0, ncpu=4, cpu_busy_cores=1.0, load1=0.0)
    r = Round(t=0.0, sample=smp, level=Level.LOW, cpu_score=0, memory_score=0, policy=Policy(), capacity=cap())
    s.decide(r)
    assert r.burst_extra == pytest.approx(1.0) and s.extra == pytest.approx(1.0)
    r2 = Round(t=0.5, sample=smp, level=Level.LOW, cpu_score=0, memory_score=0, policy=Policy())
    s.between_rounds(r2)
    assert r2.burst_extra == pytest.approx(1.0)
    r3 = Round(t=1.0, sample=smp, level=Level.LOW, cpu_score=0, memory_score=0, policy=Policy())
    s.decide(r3)  # no capacity: the last extra stands
    assert r3.burst_extra == pytest.approx(1.0)
    assert not CPUBurstStrategy.configured(
        Policy.model_validate({"qosManager": {"cpuBurst": {"enabled": False}}}).qosManager
    )
    assert CPUBurstStrategy.configured(Policy().qosManager) and CPUBurstStrategy.needs_capacity


def test_off_withdraws_every_burst() -> None:
    h = BurstHost()
    ls = h.scene.ls.id
    h.at_limit(ls)
    s = CPUBurstStrategy(h)  # type: ignore[arg-type]
    assert s.off(0.0, "nothing") is False and len(h.decisions) == 0
    s.burst(0.0, cap(), CFG)
    assert s.off(1.0, "the manager is off") is True
    intent = h.desired.intent(ls)
    assert intent is not None and intent.get("cpu.cfs_quota_us") == 200000
    assert h.decisions[-1] == Decision(1.0, BURST, ls[:12], "x1", "the manager is off")
    assert s.extra == 0.0 and s.burster.bursting() == {}
    s.burst(2.0, cap(), CFG)  # forgotten: no cooldown, bursts again at once
    assert s.burster.bursting() == {ls: 1.5}


def test_a_burst_is_logged_with_its_ratio(caplog: pytest.LogCaptureFixture) -> None:
    h = BurstHost()
    h.at_limit(h.scene.ls.id)
    s = CPUBurstStrategy(h)  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, "nriplugin.qos"):
        s.burst(0.0, cap(), CFG)
    rec = next(r for r in caplog.records if "CPU burst" in r.getMessage())
    assert (
        rec.getMessage()
        == "default/pod-2/main: CPU burst x1.5 asked: at its limit with the node idle: quota x1.5 for at most 10 s"
    )
    assert rec.ratio == 1.5  # type: ignore[attr-defined]


def test_a_burst_keeps_the_runtimes_period_and_its_reason() -> None:
    h = BurstHost()
    ls = h.scene.ls
    ls.linux.resources.cpu.quota.value = 100000
    ls.linux.resources.cpu.period.value = 50000  # 2 cores in 50 ms periods
    h.scene.model.container_updated(ls.id, ls.linux.resources)
    h.at_limit(ls.id)
    s = CPUBurstStrategy(h)  # type: ignore[arg-type]
    s.burst(0.0, cap(), CFG)
    intent = h.desired.intent(ls.id)
    assert intent is not None
    assert (intent.get("cpu.cfs_quota_us"), intent.get("cpu.cfs_period_us")) == (150000, 50000)
    assert intent.files[("cpu.cfs_quota_us", "")].why == "at its limit with the node idle: quota x1.5 for at most 10 s"


def test_the_end_of_a_burst_withdraws_the_overlay() -> None:
    h = BurstHost()
    ls = h.scene.ls.id
    h.at_limit(ls)
    s = CPUBurstStrategy(h)  # type: ignore[arg-type]
    s.burst(0.0, cap(), CFG)
    assert h.desired.overlays.targets(BURST) == [ls]
    h.at_limit(ls, used=0.5)
    s.burst(1.0, cap(), CFG)
    assert h.desired.overlays.targets(BURST) == []


def test_a_burst_late_in_the_clock_lasts_its_duration() -> None:
    from nriplugin.qos.cpu_burst import Burster

    b = Burster(duration=10.0, cooldown=5.0)
    assert b.step(100.0, "k", True, 1.5) is not None
    assert b.step(109.0, "k", True, 1.5) is None  # 9 s in: still bursting
    c = b.step(101.0 + 9.5, "k", True, 1.5)
    assert c is not None and c.key == "k" and "at most the burst duration" in c.why
    b.step(200.0, "j", True, 1.5)
    c = b.step(201.0, "j", False, 1.5)
    assert c is not None and c.key == "j" and "no longer needed or idle gone" in c.why


def test_before_any_round_no_extra_is_granted() -> None:
    h = BurstHost()
    s = CPUBurstStrategy(h)  # type: ignore[arg-type]
    smp = NodeSample(t=0.0, interval=1.0, ncpu=4, cpu_busy_cores=1.0, load1=0.0)
    r = Round(t=0.0, sample=smp, level=Level.LOW, cpu_score=0, memory_score=0, policy=Policy())
    s.between_rounds(r)
    assert r.burst_extra == 0.0 and s.extra == 0.0


def test_no_cpus_ends_a_burst() -> None:
    h = BurstHost()
    h.at_limit("a")
    s = CPUBurstStrategy(h)  # type: ignore[arg-type]
    s.burst(0.0, cap(), CFG)
    assert s.burster.bursting() == {"a": 1.5}
    assert s.burst(1.0, Capacity(0.0, 0.0, 0.0, 0.0, 0.0, 0.0), CFG) == 0.0
    assert s.burster.bursting() == {}


def test_the_full_ratio_takes_the_policys_idle_share() -> None:
    h = BurstHost()
    h.at_limit("a")
    s = CPUBurstStrategy(h)  # type: ignore[arg-type]
    b = CFG.model_copy(update={"fullBurstNodeCPUIdle": 0.5})
    assert s.burst(0.0, cap(non_be=2.4), b) == pytest.approx(0.6)  # idle 0.4: not above 0.5, x1.3


def test_a_be_container_listed_first_does_not_end_the_walk() -> None:
    h = BurstHost()
    h.at_limit("be", qos=QoSClass.BE)
    h.at_limit("ls")
    s = CPUBurstStrategy(h)  # type: ignore[arg-type]
    assert s.burst(0.0, cap(), CFG) == pytest.approx(1.0)
    assert s.burster.bursting() == {"ls": 1.5}


def test_one_burst_ending_gives_back_only_its_extra() -> None:
    h = BurstHost()
    h.at_limit("a")
    h.at_limit("b")
    s = CPUBurstStrategy(h)  # type: ignore[arg-type]
    assert s.burst(0.0, cap(), CFG) == pytest.approx(2.0)  # headroom 3: both fit
    h.at_limit("a", used=0.5)
    assert s.burst(1.0, cap(), CFG) == pytest.approx(1.0)


def test_a_grant_in_a_round_leaves_less_headroom_for_the_next_container() -> None:
    h = BurstHost()
    h.at_limit("a")
    h.at_limit("b")
    s = CPUBurstStrategy(h)  # type: ignore[arg-type]
    assert s.burst(0.0, cap(reserved=2.0), CFG) == pytest.approx(1.0)  # headroom 1: one of them
    assert list(s.burster.bursting()) == ["a"]


def kernel(h: BurstHost, held: dict[tuple[str, str], int]) -> None:
    """What the kernel holds (key, resource) -> value; anything else reads as not there."""
    h.desired.current = lambda key, resource: held.get((key, resource))


def test_a_burst_counts_as_granted_once_the_kernel_holds_it() -> None:
    h = BurstHost()
    ls = h.scene.ls.id
    held = {(ls, "cpu.cfs_quota_us"): 200000}
    kernel(h, held)
    h.at_limit(ls)
    s = CPUBurstStrategy(h)  # type: ignore[arg-type]
    s.burst(0.0, cap(), CFG)
    held[(ls, "cpu.cfs_quota_us")] = 300000  # the writer wrote it
    s._verify(1.0)
    assert h.bursts == [True]
    h.at_limit(ls, used=0.5)
    s.burst(2.0, cap(), CFG)
    assert h.bursts == [True, False]  # ended: counted once


def test_a_burst_the_kernel_did_not_take_is_withdrawn_and_not_counted(caplog: pytest.LogCaptureFixture) -> None:
    h = BurstHost()
    ls = h.scene.ls.id
    kernel(h, {(ls, "cpu.cfs_quota_us"): 200000})  # the raise was refused: the old quota stays
    h.at_limit(ls)
    s = CPUBurstStrategy(h)  # type: ignore[arg-type]
    s.burst(0.0, cap(), CFG)
    with caplog.at_level(logging.WARNING, "nriplugin.qos"):
        s._verify(1.0)
    assert h.bursts == [] and s.burster.bursting() == {} and h.desired.overlays.targets(BURST) == []
    assert any(
        "CPU burst not in force: cpu.cfs_quota_us reads 200000, asked 300000" in r.getMessage() for r in caplog.records
    )
    s.burst(2.0, cap(), CFG)
    assert s.burster.bursting() == {}  # cooldown


def test_under_a_pod_quota_the_pod_is_raised_first_and_lowered_last() -> None:
    """The kubelet's pod-level quota (the sum of the limits): the pod gets the container's
    extra in its own period, told before the container when raised and after it when ending;
    the pod's own quota comes back when no container of it bursts."""
    from nriplugin.node.model import pod_key

    h = BurstHost()
    ls = h.scene.ls.id
    pk = pod_key(h.scene.ls_pod.id)
    kernel(h, {(pk, "cpu.cfs_quota_us"): 250000, (pk, "cpu.cfs_period_us"): 100000, (ls, "cpu.cfs_quota_us"): 200000})
    h.at_limit(ls)
    s = CPUBurstStrategy(h)  # type: ignore[arg-type]
    h.scene.told.clear()
    s.burst(0.0, cap(), CFG)
    assert h.scene.told == [[pk], [ls]]
    pod = h.desired.intent(pk)
    assert pod is not None and (pod.get("cpu.cfs_quota_us"), pod.get("cpu.cfs_period_us")) == (350000, 100000)
    assert pod.files[("cpu.cfs_quota_us", "")].owner == BURST
    h.scene.told.clear()
    h.at_limit(ls, used=0.5)
    s.burst(1.0, cap(), CFG)
    assert h.scene.told == [[ls], [pk]]
    assert h.desired.overlays.targets(BURST) == []
    pod = h.desired.intent(pk)
    assert pod is None or pod.get("cpu.cfs_quota_us") in (None, 250000)


def test_a_pod_without_a_quota_of_its_own_is_left_alone() -> None:
    from nriplugin.node.model import pod_key

    h = BurstHost()
    ls = h.scene.ls.id
    pk = pod_key(h.scene.ls_pod.id)
    kernel(h, {(pk, "cpu.cfs_quota_us"): -1})
    h.at_limit(ls)
    s = CPUBurstStrategy(h)  # type: ignore[arg-type]
    s.burst(0.0, cap(), CFG)
    assert h.desired.overlays.targets(BURST) == [ls]
