"""The QoS manager's loop with a scripted collector, on a tree laid out like the kernel's:
decisions become overlays on the BE group, the fast path cuts at once, a stationary load
writes nothing, disabling the manager gives BE its CPU back."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from nriplugin.kernel.cgroup import Cgroups, Version
from nriplugin.kernel.probe import Capabilities, Topology
from nriplugin.node.assembly import Node
from nriplugin.policy.cache import RuleCache
from nriplugin.policy.model import Policy
from nriplugin.policy.qos import QoSClass
from nriplugin.qos.collect import ContainerUsage, summed
from nriplugin.qos.cpu_suppress import IDLE
from nriplugin.qos.manager import BURST, SUPPRESS, QoSManager
from nriplugin.qos.sample import ClassUsage, FastSample, NodeSample
from nriplugin.reconciler import Reconciler
from testkit.kernel_tree import v1_tree, v2_tree
from testkit.runtime_peer import make_container, make_pod
from tests.test_features import caps
from tests.test_reconciler import occupied

BE_GROUP = "kubepods/besteffort"
PODS_ROOT = "kubepods"


@dataclass
class Script:
    """A node of 2 CPUs: LS requests one core; the test sets what LS and BE use."""

    t: float = 0.0
    ls: float = 0.0
    ls_request: float = 1.0
    be: float = 2.0
    be_seconds: float = 0.0
    ls_seconds: float = 0.0
    ls_wait: float = 0.0  # cores' worth of time LS's pods had a task waiting for a CPU
    ls_stall_us: float = 0.0
    pods_counter: bool = True  # the pods root's counter can be read
    fast_t: float | None = None  # the last fast sample's time
    ls_waits: bool | None = None  # whether the last round asked for LS's waits
    rounds: int = 0
    fast_reads: list[float] = field(default_factory=list)
    by_container: dict[str, ContainerUsage] = field(default_factory=dict)

    def advance(self, dt: float) -> None:
        self.t += dt
        self.be_seconds += self.be * dt
        self.ls_seconds += self.ls * dt
        self.ls_stall_us += self.ls_wait * dt * 1e6

    def sample(self, be_groups: Sequence[str] = (), ls_waits: bool = True) -> NodeSample:
        self.rounds += 1
        self.ls_waits = ls_waits
        return NodeSample(
            t=self.t,
            interval=1.0,
            ncpu=2,
            cpu_busy_cores=self.ls + self.be,
            load1=self.ls + self.be,
            mem_total=8 << 30,
            mem_available=6 << 30,
            by_class={
                "LS": ClassUsage(containers=1, cpu_cores=self.ls, cpu_request_cores=self.ls_request),
                "BE": ClassUsage(containers=1, cpu_cores=self.be),
            },
            be_cpu_seconds=self.be_seconds if be_groups else None,
        )

    async def sample_async(self, be_groups: Sequence[str] = (), ls_waits: bool = True) -> NodeSample:
        return self.sample(be_groups, ls_waits)

    def fast(self, sums: Sequence[Sequence[str]] = ()) -> FastSample:
        interval = 0.1 if self.fast_t is None else self.t - self.fast_t
        self.fast_t = self.t
        seconds = tuple(summed(self.group_cpu_seconds, groups) for groups in sums)
        return FastSample(t=self.t, interval=interval, cpu_busy_cores=self.ls + self.be, seconds=seconds)

    def wake(self, wait: float) -> float:
        return wait

    def group_cpu_seconds(self, group: str) -> float | None:
        """BE's QoS-level group's counter; the pods root's counts LS too."""
        if group == PODS_ROOT:
            return self.be_seconds + self.ls_seconds if self.pods_counter else None
        self.fast_reads.append(self.t)
        return self.be_seconds

    def pressure_path(self, group: str) -> str | None:
        return None  # cgroup v1

    def stall_us(self, files: Iterable[str]) -> int | None:
        """LS's waits, when the test gave its pods PSI files (as on v2 or a hybrid host)."""
        return int(self.ls_stall_us) if set(files) else None


def seed_dict() -> dict[str, object]:
    return {
        "qosManager": {"cpuSuppress": {"reserveLSRequestFrom": "LOW", "quotaFrom": "LOW"}},
        "resourceUsedThresholdWithBE": {"cpuSuppressThresholdPercent": 65},
    }


def seed_policy() -> Policy:
    """The seed's suppression formula (LS's whole request reserved at every level, a quota at
    every level) and koordlet's 65 % usage budget: the loop's figures below are worked in them.
    The defaults (LS's use reserved below HIGH, 90 %, no quota below HIGH while BE runs
    SCHED_IDLE) have their own tests (test_qos_suppress_pinned.py)."""
    return Policy.model_validate(seed_dict())


def node_with_pods(
    tmp_path: Path, policy: Policy | None = None, capabilities: Capabilities | None = None
) -> tuple[Node, Reconciler, QoSManager, Script, Path]:
    be = make_pod(1, "BE", parent=f"/{BE_GROUP}/pod1")
    ls = make_pod(2, "LS", parent="/kubepods/burstable/pod2")
    ctrs = [make_container(1, be), make_container(2, ls)]
    ctrs[1].linux.resources.cpu.quota.value = 100000  # LS: limit one core
    ctrs[1].linux.resources.cpu.period.value = 100000
    root = v1_tree(tmp_path, [BE_GROUP, "kubepods/burstable"] + [c.linux.cgroups_path.lstrip("/") for c in ctrs])
    (root / "cpu" / BE_GROUP / "cpu.cfs_quota_us").write_text("-1")
    rules = RuleCache(policy or seed_policy())
    node = Node.create(rules, caps=capabilities or caps(), cgroups=Cgroups(root))
    rec = Reconciler(node.desired, node.writer, node.model, watch=False, resync_period=3600)
    for pod, c in ((be, ctrs[0]), (ls, ctrs[1])):
        node.model.container_started(pod, c)
    script = Script()
    mgr = QoSManager(node.model, node.desired, rec, script, rules)
    return node, rec, mgr, script, root / "cpu" / BE_GROUP / "cpu.cfs_quota_us"


def test_be_group_is_found_from_the_model(tmp_path: Path) -> None:
    node, _, mgr, _, _ = node_with_pods(tmp_path)
    assert mgr.pods.refresh() and mgr.pods.be() == [BE_GROUP] and mgr.pods.ls() == set()  # no PSI on v1
    mgr.pods.pressure_path = lambda group: f"/sys/fs/cgroup/{group}/cpu.pressure"  # as on cgroup v2
    node.model.pod_seen(make_pod(4, "LS", parent="/kubepods/burstable/pod4"))
    assert mgr.pods.refresh() and mgr.pods.ls() == {"/sys/fs/cgroup/kubepods/burstable/pod4/cpu.pressure"}
    assert not mgr.pods.refresh()  # nothing came or went
    other = make_pod(3, "BE", parent="/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod3.slice")
    node.model.pod_seen(other)
    assert mgr.pods.refresh() and mgr.pods.be() == sorted([BE_GROUP, "kubepods.slice/kubepods-besteffort.slice"])
    node.model.pod_removed(other.id)
    node.model.pod_removed(make_pod(2, "LS").id)
    node.model.pod_removed(make_pod(4, "LS").id)
    assert mgr.pods.refresh() and mgr.pods.be() == [BE_GROUP] and mgr.pods.ls() == set()


def test_rounds_limit_be_cut_fast_and_give_back_after_the_hold(tmp_path: Path) -> None:
    node, _, mgr, s, quota = node_with_pods(tmp_path)
    mgr.round()  # LS idle: the level's bound, (2 - 1 - 0) x 1.0 = 1 core
    assert quota.read_text() == "100000"
    intent = node.desired.intent(f"group:{BE_GROUP}")
    assert intent is not None and intent.files[("cpu.cfs_quota_us", "")].owner == SUPPRESS
    s.advance(0.1)
    mgr.fast_round()  # first fast sample: a baseline only
    s.ls, s.be = 1.0, 1.0  # LS spins one core
    s.advance(0.1)
    assert mgr.fast_round() is True  # 100 ms later: the rise seen, followed
    s.advance(0.02)
    mgr.fast_round()  # measured inside the rise: 2 x 65% - 1.0 = 0.3 core, at once
    assert quota.read_text() == "30000"
    assert s.rounds == 1  # no full round was needed
    s.ls, s.be = 0.0, 0.3
    for _ in range(10):  # LS idle again: held back for raiseDelay (2 s), then given back
        s.advance(0.1)
        mgr.fast_round()
    assert quota.read_text() == "30000"
    for _ in range(3):
        s.advance(1.0)
        mgr.round()
    assert quota.read_text() == "100000"
    assert [d.value for d in mgr.decisions] == ["1.00 cores", "0.30 cores", "1.00 cores"]


def test_a_full_round_reads_bes_groups_for_the_usage_budget(tmp_path: Path) -> None:
    """The usage budget waits for BE's groups' counter read twice by full rounds, then bounds
    BE: LS using 0.6, 2 x 65 % - 0.6 = 0.7 core, under the level's 1 core."""
    _, _, mgr, s, quota = node_with_pods(tmp_path)
    s.ls = 0.6
    mgr.round()
    assert quota.read_text() == "100000"  # BE's counter read once: the level's bound alone
    s.advance(1.0)
    mgr.round()
    assert quota.read_text() == "70000"


def test_a_stationary_noisy_load_writes_nothing(tmp_path: Path) -> None:
    _, _, mgr, s, _ = node_with_pods(tmp_path)
    s.ls = 0.6  # LS's peak: BE's groups read twice, the usage budget holds BE at 2 x 65 % - 0.6
    mgr.round()
    s.advance(1.0)
    mgr.round()
    assert mgr.limiter.current == pytest.approx(0.7)
    writes = mgr.limiter.writes
    for i in range(600):  # a minute of 100 ms steps, LS wobbling by +-0.1 core
        s.ls = 0.5 + (0.1 if i % 2 else -0.1)
        s.advance(0.1)
        mgr.round() if i % 10 == 0 else mgr.fast_round()
    assert mgr.limiter.writes == writes


def test_disabling_the_manager_gives_be_its_cpu_back(tmp_path: Path) -> None:
    node, _, mgr, _, quota = node_with_pods(tmp_path)
    mgr.round()
    assert quota.read_text() == "100000"
    node.rules.set(Policy.model_validate({"qosManager": {"enable": False}}), "test")
    mgr.round()
    assert quota.read_text() == "-1"  # as it was before the manager
    assert not node.desired.overlays.targets(SUPPRESS)


def test_a_restarted_agent_takes_over_the_cut_and_gives_back_no_limit(tmp_path: Path) -> None:
    """BE's group holds a previous agent's cut (0.1 cores) when this one starts: BE's pods are
    capped at it before any round; disabling the manager later restores no limit (kubelet's),
    not the cut the group held at start."""
    node, _, mgr, _, quota = node_with_pods(tmp_path)
    quota.write_text("10000")
    assert node.desired.learn_held(QoSClass.BE, ["kubepods/besteffort"]) == {BE_GROUP: 0.1}
    assert node.desired.capped(make_container(1, make_pod(1, "BE")).id)
    mgr.round()  # LS idle: one core, the group first, then its children
    assert quota.read_text() == "100000"
    node.rules.set(Policy.model_validate({"qosManager": {"enable": False}}), "test")
    mgr.round()
    assert quota.read_text() == "-1"
    assert not node.desired.capped(make_container(1, make_pod(1, "BE")).id)


def test_ls_at_its_limit_bursts_first_and_be_gets_what_is_left(tmp_path: Path) -> None:
    node, _, mgr, s, quota = node_with_pods(tmp_path)
    ls_key = make_container(2, make_pod(2, "LS")).id
    ls_quota = tmp_path / "cpu" / "kubepods/burstable/pod2" / ls_key / "cpu.cfs_quota_us"
    ls_quota.write_text("100000")
    s.ls, s.be = 0.95, 0.5  # LS at its 1-core limit, half the node idle (BE left out)
    s.by_container = {ls_key: ContainerUsage(QoSClass.LS, "pod2", 0.95, 0, 0, limit_cores=1.0)}
    mgr.round()
    assert ls_quota.read_text() == "150000"  # 1.5x: more than 30 % idle
    intent = node.desired.intent(ls_key)
    assert intent is not None and intent.files[("cpu.cfs_quota_us", "")].owner == BURST
    # BE within what is left: (2 - 1 request - 0.5 burst) x 0.8 (MEDIUM: LS at 95 % of its
    # request) = 0.4; the usage budget waits until BE's own usage has been read twice
    assert quota.read_text() == "40000"
    for _ in range(10):  # at most burstDuration (10 s)
        s.advance(1.0)
        mgr.round()
    assert ls_quota.read_text() == "100000"  # back to its limit, then a 30 s cooldown
    assert [d.owner for d in mgr.decisions if d.owner == BURST] == [BURST, BURST]
    s.advance(1.0)
    mgr.round()
    assert ls_quota.read_text() == "100000"


def test_no_burst_when_the_node_is_busy(tmp_path: Path) -> None:
    _, _, mgr, s, _ = node_with_pods(tmp_path)
    ls_key = make_container(2, make_pod(2, "LS")).id
    s.ls, s.be = 1.7, 0.3  # 15 % idle, BE left out
    s.by_container = {ls_key: ContainerUsage(QoSClass.LS, "pod2", 0.95, 0, 0, limit_cores=1.0)}
    mgr.round()
    assert not mgr.burster.bursting()


def test_a_removed_pod_takes_its_containers_out_of_the_model(tmp_path: Path) -> None:
    node, _, _, _, _ = node_with_pods(tmp_path)
    ls = make_pod(2, "LS", parent="/kubepods/burstable/pod2")
    node.model.pod_removed(ls.id)
    assert make_container(2, ls).id not in node.model and f"pod:{ls.id}" not in node.model


def test_the_cpuset_policy_moves_be_between_whole_cpus_and_lifts_cleanly(tmp_path: Path) -> None:
    """cpuset: BE's containers on as many CPUs of the share pool as the limit rounded up;
    switching to cfsQuota puts the whole pool back and limits the group's quota instead."""
    four = caps(**{"cpuset.cpus": True})
    four.topology = Topology(online=[0, 1, 2, 3], siblings={c: [c] for c in range(4)})
    policy = Policy.model_validate({"qosManager": {"cpuSuppress": {"policy": "cpuset"}}})
    node, _, mgr, s, quota = node_with_pods(tmp_path, policy, four)
    be_key = make_container(1, make_pod(1, "BE", parent=f"/{BE_GROUP}/pod1")).id
    cpus = tmp_path / "cpuset" / BE_GROUP / "pod1" / be_key / "cpuset.cpus"
    s.ls_request = 0.0  # the level's bound is the whole node: the usage budget decides
    mgr.round()  # 2 x 65 % - 0 = 1.3 cores -> 2 CPUs, the highest first
    assert cpus.read_text() == "2-3"
    assert quota.read_text().strip() == "-1"  # no quota under the cpuset policy
    s.advance(0.1)
    mgr.fast_round()
    s.ls, s.be = 1.0, 1.0
    s.advance(0.1)
    mgr.fast_round()  # LS spins a core: followed
    s.advance(0.02)
    mgr.fast_round()  # 0.3 core -> one CPU, at once
    assert cpus.read_text() == "3"
    writes = mgr.limiter.writes
    for i in range(100):  # LS wobbling around its core: same count, nothing written
        s.ls = 1.0 + (0.05 if i % 2 else -0.05)
        s.advance(0.1)
        mgr.round() if i % 10 == 0 else mgr.fast_round()
    assert cpus.read_text() == "3" and mgr.limiter.writes == writes
    back = {"qosManager": {"cpuSuppress": {"quotaFrom": "LOW"}}}  # cfsQuota, a quota at every level
    node.rules.set(Policy.model_validate(back), "test")
    mgr.round()
    assert cpus.read_text() == "0-3"  # the whole share pool again
    assert quota.read_text() != "-1"
    node.rules.set(Policy.model_validate({"qosManager": {"enable": False}}), "test")
    mgr.round()
    assert cpus.read_text() == "0-3" and quota.read_text() == "-1"


def test_on_cgroup_v2_the_ls_pods_pressure_is_watched(tmp_path: Path) -> None:
    """cgroup v2: the manager arms a trigger on each LS pod's ``cpu.pressure`` (not BE's), and
    follows the pods; a temp tree's regular files are refused, once, and the reason kept."""
    import asyncio

    from nriplugin.qos.collect import Collector

    be = make_pod(1, "BE", parent=f"/{BE_GROUP}/pod1")
    ls = make_pod(2, "LS", parent="/kubepods/burstable/pod2")
    ctrs = [make_container(1, be), make_container(2, ls)]
    groups = [BE_GROUP, "kubepods/burstable", "kubepods/besteffort/pod1", "kubepods/burstable/pod2"]
    root = v2_tree(tmp_path, groups + [c.linux.cgroups_path.lstrip("/") for c in ctrs])
    for g in groups:
        (root / g / "cpu.pressure").write_text("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    rules = RuleCache(Policy())
    node = Node.create(rules, caps=caps(), cgroups=Cgroups(root))
    rec = Reconciler(node.desired, node.writer, node.model, watch=False, resync_period=3600)
    for pod, c in ((be, ctrs[0]), (ls, ctrs[1])):
        node.model.container_started(pod, c)
    col = Collector(node.model, node.desired, Cgroups(root))
    mgr = QoSManager(node.model, node.desired, rec, col, rules, psi_path=None)

    async def main() -> None:
        mgr.start(asyncio.get_running_loop())
        try:
            mgr.round()
            assert mgr.ls_pressure is not None
            assert set(mgr.ls_pressure.refused) == {str(root / "kubepods/burstable/pod2/cpu.pressure")}
            node.model.pod_removed(ls.id)
            mgr.round()
            assert not mgr.ls_pressure.refused
        finally:
            mgr.stop()
            col.close()

    asyncio.run(main())


def test_on_cgroup_v2_bes_group_never_gets_cpu_idle_and_a_left_one_is_given_back(tmp_path: Path) -> None:
    """The kubelet writes the weight of its besteffort group; ``cpu.idle`` 1 there makes the
    kernel refuse it. The manager never sets it (BE's tasks run SCHED_IDLE instead), and one an
    older agent left is put back to 0 with the kubelet's weight (1: MinShares 2 converted)."""
    be = make_pod(1, "BE", parent=f"/{BE_GROUP}/pod1")
    ls = make_pod(2, "LS", parent="/kubepods/burstable/pod2")
    ctrs = [make_container(1, be), make_container(2, ls)]
    root = v2_tree(tmp_path, [BE_GROUP, "kubepods/burstable"] + [c.linux.cgroups_path.lstrip("/") for c in ctrs])
    capabilities = caps()
    capabilities.cgroup_version = Version.V2
    rules = RuleCache(Policy())
    node = Node.create(rules, caps=capabilities, cgroups=Cgroups(root))
    rec = Reconciler(node.desired, node.writer, node.model, watch=False, resync_period=3600)
    for pod, c in ((be, ctrs[0]), (ls, ctrs[1])):
        node.model.container_started(pod, c)
    mgr = QoSManager(node.model, node.desired, rec, Script(), rules)
    idle, weight = root / BE_GROUP / "cpu.idle", root / BE_GROUP / "cpu.weight"
    mgr.round()
    assert idle.read_text().strip() == "0" and not node.desired.overlays.targets(IDLE)
    before = weight.read_text()
    idle.write_text("1\n")  # what an older agent's beGroupIdle left
    mgr2 = QoSManager(node.model, node.desired, rec, Script(), rules)  # the next agent's manager
    mgr2.round()
    assert idle.read_text().strip() == "0"
    assert weight.read_text().strip() == "1" != before.strip()
    assert (root / "kubepods/burstable/cpu.idle").read_text().strip() == "0"  # LS's group: untouched


def test_on_cgroup_v1_the_manager_writes_no_weight_to_bes_group(tmp_path: Path) -> None:
    """BE's group gets its quota; its weight stays the kubelet's whatever beMinCPUShares says."""
    node, _, mgr, _, quota = node_with_pods(tmp_path, Policy.model_validate({**seed_dict(), "beMinCPUShares": 5}))
    cpu = quota.parent
    (cpu / "cpu.shares").write_text("2\n")  # the kubelet's
    mgr.round()
    assert quota.read_text() == "100000"  # the manager ran
    assert (cpu / "cpu.shares").read_text().strip() == "2"
    assert (cpu / "cpu.idle").read_text().strip() == "0"
    assert not node.desired.overlays.targets(IDLE)


REAL = Path("/sys/fs/cgroup")


@pytest.mark.skipif(
    os.geteuid() != 0 or not (REAL / "cpu" / "cpu.idle").exists(), reason="needs root + cgroup v1 with cpu.idle"
)
def test_on_the_real_v1_tree_the_kubelets_weight_writes_are_taken_while_be_is_cut() -> None:
    """The real kernel, the default's way: a ``cpu.idle`` 1 an older agent left on BE's group is
    given back (0, the kubelet's weight 2, not the 1024 the kernel resets it to); while BE is
    cut the kubelet's own write of its weight is taken; BE's running task runs SCHED_IDLE; the
    manager off, the quota is lifted."""
    top = f"nriplugin-qtest-{os.getpid()}"
    be = make_pod(1, "BE", parent=f"/{top}/kubepods/besteffort/pod1")
    ctr = make_container(1, be)
    with occupied(ctr.linux.cgroups_path.lstrip("/")) as cpu:
        group = cpu.parent.parent
        (group / "cpu.idle").write_text("1")
        rules = RuleCache(seed_policy())
        node = Node.create(rules, cgroups=Cgroups(REAL))
        rec = Reconciler(node.desired, node.writer, node.model, watch=False, resync_period=3600)
        node.model.container_started(be, ctr, existing=True)
        mgr = QoSManager(node.model, node.desired, rec, Script(), rules)
        mgr.round()
        assert (group / "cpu.idle").read_text().strip() == "0"
        assert (group / "cpu.cfs_quota_us").read_text().strip() == "100000"  # (2 - 1 LS) x 1.0
        assert (group / "cpu.shares").read_text().strip() == "2"
        (group / "cpu.shares").write_text("2")  # the kubelet's periodic update: taken
        (pid,) = [int(p) for p in (cpu / "cgroup.procs").read_text().split()]
        assert os.sched_getscheduler(pid) == os.SCHED_IDLE
        assert rec.rejections == 0
        rules.set(Policy.model_validate({"qosManager": {"enable": False}}), "test")
        mgr.round()
        assert (group / "cpu.cfs_quota_us").read_text().strip() == "-1"
        assert rec.rejections == 0
