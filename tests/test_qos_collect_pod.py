"""QoS collection of pod-level CPU throttling on fake v1/v2 trees.

kubelet gives a pod whose containers all have CPU limits a quota of their sum on the pod's own
group, and a pod whose tasks spend it is throttled there: each container's own ``cpu.stat``
counts nothing. The collector reads the pod's ``cpu.stat`` once per round (only for a pod
whose group has a quota) and counts that throttling in the containers and in their class."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nriplugin.kernel.cgroup import Cgroups
from nriplugin.node.assembly import Node
from nriplugin.node.model import NodeModel
from nriplugin.nri import api_pb2 as api
from nriplugin.policy.qos import QoSClass
from nriplugin.qos.collect import Collector, ContainerUsage, _facts, _Round
from testkit.kernel_tree import proc_tree, v1_counters, v1_tree, v2_counters, v2_tree
from testkit.runtime_peer import make_container, make_pod
from tests.test_features import caps


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _group(c: api.Container) -> str:
    return c.linux.cgroups_path.lstrip("/")


def _pod_group(pod: api.PodSandbox) -> str:
    return pod.linux.cgroup_parent.lstrip("/")


def _limited(i: int, pod: api.PodSandbox, cores: float) -> api.Container:
    c = make_container(i, pod)
    c.linux.resources.cpu.quota.value = int(cores * 100000)
    c.linux.resources.cpu.period.value = 100000
    return c


def _v1_pod(root: Path, pod: api.PodSandbox, quota: int, periods: int = 0, throttled: int = 0) -> None:
    """A v1 pod group's counters and its quota (-1: none), as kubelet sets them."""
    group = _pod_group(pod)
    v1_counters(root, group, usage_ns=10**9, periods=periods, throttled=throttled)
    (root / "cpu" / group / "cpu.cfs_quota_us").write_text(f"{quota}\n")
    (root / "cpu" / group / "cpu.cfs_period_us").write_text("100000\n")


class Tree:
    """A v1 tree, a /proc at rest, a node and a collector whose pod-group reads are counted."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root = v1_tree(tmp_path / "cg")
        self.proc = proc_tree(tmp_path / "proc")
        self.node = Node.create(cgroups=Cgroups(self.root), caps=caps())
        self.clock = Clock()
        self.col = Collector(
            self.node.model, self.node.desired, self.node.writer.cgroups, self.proc, clock=self.clock, memory_every=1
        )
        self.cpu_reads: list[str] = []  # the groups whose CPU counters were read, in order
        self.quota_reads: list[tuple[str, str]] = []  # (group, resource) read from the cgroup tree
        cpu, read = self.col.stats.cpu, self.col.stats.cgroups.read

        def counted_cpu(group: str, throttling: bool = True, waiting: bool = False) -> Any:
            self.cpu_reads.append(group)
            return cpu(group, throttling, waiting)

        def counted_read(group: str, resource: str) -> Any:
            self.quota_reads.append((group, resource))
            return read(group, resource)

        monkeypatch.setattr(self.col.stats, "cpu", counted_cpu)
        monkeypatch.setattr(self.col.stats.cgroups, "read", counted_read)

    def start(self, pod: api.PodSandbox, *containers: api.Container) -> None:
        for c in containers:
            v1_counters(self.root, _group(c), usage_ns=10**9)
            self.node.model.container_started(pod, c)


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Tree]:
    t = Tree(tmp_path, monkeypatch)
    yield t
    t.col.close()


def test_pod_level_throttling_shows_in_its_container_and_its_class(tree: Tree) -> None:
    """A pod throttled at its own quota while its container's cpu.stat counts nothing (as
    under a real kubelet, a 1-CPU pod of spinners). The first reading has zero deltas; the
    pod's quota is known from it."""
    pod = make_pod(1, "LS")
    c = _limited(1, pod, 1.0)
    tree.start(pod, c)
    _v1_pod(tree.root, pod, quota=100000, periods=1000, throttled=10)
    v1_counters(tree.root, _group(c), usage_ns=10**9, periods=1000)
    first = tree.col.sample()
    u = tree.col.by_container[c.id]
    assert (u.throttled_ratio, u.pod_throttled_ratio, u.pod_limit_cores) == (0.0, 0.0, 1.0)
    assert first.usage("LS").throttled_ratio == 0.0

    tree.clock.t += 10.0
    v1_counters(tree.root, _group(c), usage_ns=11 * 10**9, periods=1100, throttled=0)
    _v1_pod(tree.root, pod, quota=100000, periods=1100, throttled=91)
    s = tree.col.sample()
    u = tree.col.by_container[c.id]
    assert u.pod_throttled_ratio == pytest.approx(0.81)
    assert u.throttled_ratio == pytest.approx(0.81)  # the pod's: its own is 0
    assert u.pod_limit_cores == 1.0 and u.limit_cores == 1.0
    assert s.usage("LS").throttled_ratio == pytest.approx(0.81)
    assert tree.col.tracked == 2  # the container's counters and its pod's

    # throttled more at its own quota than at the pod's: its own ratio
    tree.clock.t += 10.0
    v1_counters(tree.root, _group(c), usage_ns=21 * 10**9, periods=1200, throttled=50)
    _v1_pod(tree.root, pod, quota=100000, periods=1200, throttled=111)
    s = tree.col.sample()
    u = tree.col.by_container[c.id]
    assert u.throttled_ratio == pytest.approx(0.5) and u.pod_throttled_ratio == pytest.approx(0.2)
    assert s.usage("LS").throttled_ratio == pytest.approx(0.5)


def test_a_pod_with_two_containers_is_counted_once(tree: Tree) -> None:
    """Each container counts its own periods, throttled in its own share or its pod's,
    whichever is higher: a pod's throttling is neither added once per container nor beside
    them. Pod A (two containers, a 3-core quota) throttled in half its periods, one of its
    containers in 80 % of its own; pod B (one container) not at all."""
    a = make_pod(1, "LS")
    a1, a2 = _limited(1, a, 2.0), _limited(2, a, 1.0)
    b = make_pod(2, "LS")
    b1 = _limited(3, b, 1.0)
    tree.start(a, a1, a2)
    tree.start(b, b1)
    _v1_pod(tree.root, a, quota=300000)
    _v1_pod(tree.root, b, quota=100000)
    tree.col.sample()

    tree.clock.t += 1.0
    _v1_pod(tree.root, a, quota=300000, periods=10, throttled=5)
    v1_counters(tree.root, _group(a1), usage_ns=2 * 10**9, periods=10, throttled=0)
    v1_counters(tree.root, _group(a2), usage_ns=2 * 10**9, periods=4, throttled=0)  # less busy
    _v1_pod(tree.root, b, quota=100000, periods=10, throttled=0)
    v1_counters(tree.root, _group(b1), usage_ns=2 * 10**9, periods=10, throttled=0)
    tree.cpu_reads.clear()
    s = tree.col.sample()
    assert tree.cpu_reads.count(_pod_group(a)) == 1  # once per pod, not per container
    by = tree.col.by_container
    assert [by[k.id].throttled_ratio for k in (a1, a2, b1)] == [0.5, 0.5, 0.0]
    assert by[a1.id].pod_limit_cores == by[a2.id].pod_limit_cores == 3.0 and by[b1.id].pod_limit_cores == 1.0
    # (10 x 0.5 + 4 x 0.5 + 10 x 0) / (10 + 4 + 10)
    assert s.usage("LS").throttled_ratio == pytest.approx(7 / 24)

    tree.clock.t += 1.0
    _v1_pod(tree.root, a, quota=300000, periods=20, throttled=10)
    v1_counters(tree.root, _group(a1), usage_ns=3 * 10**9, periods=20, throttled=8)  # 80 % at its own
    v1_counters(tree.root, _group(a2), usage_ns=3 * 10**9, periods=14, throttled=0)
    _v1_pod(tree.root, b, quota=100000, periods=20, throttled=0)
    v1_counters(tree.root, _group(b1), usage_ns=3 * 10**9, periods=20, throttled=0)
    s = tree.col.sample()
    assert [tree.col.by_container[k.id].throttled_ratio for k in (a1, a2)] == [0.8, 0.5]
    assert s.usage("LS").throttled_ratio == pytest.approx((8 + 5) / 30)

    # pod A alone: its own ratio, whatever the number of its containers
    tree.node.model.container_removed(b1.id)
    tree.clock.t += 1.0
    _v1_pod(tree.root, a, quota=300000, periods=30, throttled=15)
    v1_counters(tree.root, _group(a1), usage_ns=4 * 10**9, periods=30, throttled=8)
    v1_counters(tree.root, _group(a2), usage_ns=4 * 10**9, periods=24, throttled=0)
    assert tree.col.sample().usage("LS").throttled_ratio == pytest.approx(0.5)
    assert tree.col.tracked == 3  # a1, a2, pod A: B's pod counter went with it


def test_a_round_takes_a_pods_ratio_into_its_containers_own_periods() -> None:
    """The arithmetic alone: a container's throttled periods become its periods times the
    higher ratio; one that ran no period (idle, or new) stays at 0 and adds nothing, but
    learns its pod's figures; a container of another pod is left as it was."""
    m = NodeModel()
    pod, other = make_pod(1, "LS"), make_pod(2, "LS")
    cs = [_limited(1, pod, 1.0), _limited(2, pod, 1.0), _limited(3, pod, 1.0), _limited(4, other, 1.0)]
    for c in cs:
        m.container_started(pod if c.pod_sandbox_id == pod.id else other, c)
    facts = [_facts(QoSClass.LS, r) for c in cs if (r := m.get(c.id)) is not None]
    rnd = _Round()
    for (key, owner, periods, throttled), f in zip(
        (("busy", pod, 10, 0), ("own", pod, 10, 9), ("idle", pod, 0, 0), ("else", other, 10, 1)), facts, strict=True
    ):
        u = ContainerUsage(QoSClass.LS, owner.id, 0.5, 0, 0, 1.0, throttled / periods if periods else 0.0)
        rnd.read(key, f, u, periods, throttled)
    rnd.pod_throttled(pod.id, 0.4, 3.0)
    by = rnd.by_container
    assert [by[k].throttled_ratio for k in ("busy", "own", "idle", "else")] == [0.4, 0.9, 0.0, 0.1]
    assert by["idle"].pod_throttled_ratio == 0.4 and by["idle"].pod_limit_cores == 3.0
    assert by["else"].pod_limit_cores is None and by["else"].pod_throttled_ratio == 0.0
    assert rnd.by_class()["LS"].throttled_ratio == pytest.approx((4 + 9 + 0 + 1) / 30)


def test_a_pod_without_a_quota_costs_no_read(tree: Tree) -> None:
    """A pod with a container without a limit (kubelet gives it no quota) is never looked at;
    one whose containers all have limits but whose group has no quota is looked at once (its
    quota), then never again while its containers' limits stay; a pod with a quota costs one
    read of its counters per round."""
    free = make_pod(1, "LS")
    f1, f2 = _limited(1, free, 1.0), make_container(2, free)  # f2 unlimited
    none = make_pod(2, "LS")
    n1, n2 = _limited(3, none, 1.0), _limited(4, none, 1.0)
    quota = make_pod(3, "LS")
    q1 = _limited(5, quota, 1.0)
    tree.start(free, f1, f2)
    tree.start(none, n1, n2)
    tree.start(quota, q1)
    _v1_pod(tree.root, free, quota=-1)
    _v1_pod(tree.root, none, quota=-1)  # e.g. kubelet's cpuCFSQuota off
    _v1_pod(tree.root, quota, quota=100000)
    for _ in range(5):
        tree.clock.t += 1.0
        tree.col.sample()
    pods = {_pod_group(p) for p in (free, none, quota)}
    assert [g for g in tree.cpu_reads if g in pods] == [_pod_group(quota)] * 5
    assert tree.quota_reads == [
        (_pod_group(none), "cpu.cfs_quota_us"),  # then no period: no quota
        (_pod_group(quota), "cpu.cfs_quota_us"),
        (_pod_group(quota), "cpu.cfs_period_us"),
    ]
    assert tree.col.by_container[f1.id].pod_limit_cores is None
    assert tree.col.by_container[n1.id].pod_limit_cores is None
    assert tree.col.by_container[f2.id].pod_limit_cores is None and tree.col.by_container[f2.id].limit_cores is None
    assert tree.col.tracked == 5 + 1  # five containers and the one pod with a quota


def test_a_resized_pod_has_its_quota_read_again(tree: Tree) -> None:
    pod = make_pod(1, "LS")
    c = _limited(1, pod, 1.0)
    tree.start(pod, c)
    _v1_pod(tree.root, pod, quota=100000)
    tree.col.sample()
    assert tree.col.by_container[c.id].pod_limit_cores == 1.0
    # in-place resize: kubelet raises the pod's quota with its container's
    _v1_pod(tree.root, pod, quota=200000)
    tree.col.sample()
    assert tree.col.by_container[c.id].pod_limit_cores == 1.0  # limits unchanged: not read again
    resized = api.LinuxResources()
    resized.cpu.quota.value = 200000
    assert tree.node.model.container_updated(c.id, resized)
    tree.col.sample()
    assert tree.col.by_container[c.id].pod_limit_cores == 2.0 and tree.col.by_container[c.id].limit_cores == 2.0


def test_on_v2_a_pods_throttling_is_read_from_its_cpu_stat(tmp_path: Path) -> None:
    root, proc = v2_tree(tmp_path / "cg"), proc_tree(tmp_path / "proc")
    node = Node.create(cgroups=Cgroups(root), caps=caps())
    pod = make_pod(1, "LSR")
    c1, c2 = _limited(1, pod, 1.0), _limited(2, pod, 0.5)
    group = _pod_group(pod)
    for c in (c1, c2):
        v2_counters(root, _group(c), usage_ns=10**9, periods=100)
        node.model.container_started(pod, c)
    v2_counters(root, group, usage_ns=2 * 10**9, periods=100, throttled=10)
    (root / group / "cpu.max").write_text("150000 100000\n")
    clock = Clock()
    col = Collector(node.model, node.desired, Cgroups(root), proc, clock=clock, memory_every=1)
    try:
        col.sample()
        clock.t += 2.0
        for c in (c1, c2):
            v2_counters(root, _group(c), usage_ns=2 * 10**9, periods=120, throttled=1)
        v2_counters(root, group, usage_ns=4 * 10**9, periods=120, throttled=15)
        s = col.sample()
        u = col.by_container[c1.id]
        assert (u.pod_limit_cores, u.pod_throttled_ratio, u.throttled_ratio) == (1.5, 0.25, 0.25)
        assert s.usage("LSR").throttled_ratio == pytest.approx(0.25)
    finally:
        col.close()


# BE's request --------------------------------------------------------------------------------

BATCH_SPEC = "node.koordinator.sh/extended-resource-spec"


def _batch(cpu: str, name: str = "main") -> str:
    return json.dumps({"containers": {name: {"requests": {"kubernetes.io/batch-cpu": cpu}, "limits": {}}}})


def test_be_request_is_the_batch_cpu_request_where_there_is_one(tmp_path: Path) -> None:
    """A BE pod sized by Koordinator's batch resources asks kubelet for no CPU (the runtime is
    asked for kubelet's minimum shares): its request is its batch-cpu, which the agent gives
    it shares for (batch.py). A BE pod without one counts its shares as before; an annotation
    that cannot be used, or one for another container, is no batch request."""
    root, proc = v1_tree(tmp_path / "cg"), proc_tree(tmp_path / "proc")
    node = Node.create(cgroups=Cgroups(root), caps=caps())
    sized = make_pod(1, "BE")
    sized.annotations[BATCH_SPEC] = _batch("500")
    plain = make_pod(2, "BE")
    bad = make_pod(3, "BE")
    bad.annotations[BATCH_SPEC] = _batch("lots")
    other = make_pod(4, "BE")
    other.annotations[BATCH_SPEC] = _batch("700", name="sidecar")
    ls = make_pod(5, "LS")
    ls.annotations[BATCH_SPEC] = _batch("900")  # batch resources are BE's only
    for i, pod in enumerate((sized, plain, bad, other, ls), start=1):
        c = make_container(i, pod, shares=2 if pod is not ls else 512)
        v1_counters(root, _group(c), usage_ns=10**9)
        node.model.container_started(pod, c)
    col = Collector(node.model, node.desired, Cgroups(root), proc, clock=Clock(), memory_every=1)
    try:
        s = col.sample()
    finally:
        col.close()
    assert s.usage("BE").containers == 4
    assert s.usage("BE").cpu_request_cores == pytest.approx(0.5 + 3 * 2 / 1024)
    assert s.usage("LS").cpu_request_cores == pytest.approx(0.5)
