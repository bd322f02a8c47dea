"""The collector's arithmetic pinned at its edges: node CPU from two /proc/stat readings, PSI
stall deltas, a container's limit and request from its facts, and the per-class sums."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from nriplugin.kernel.cgroup import CFS_PERIOD_US, Cgroups
from nriplugin.kernel.stats import NO_STALL, ProcCpu, Psi, PsiLine
from nriplugin.node.assembly import Node
from nriplugin.node.model import NodeModel, Record
from nriplugin.nri import api_pb2 as api
from nriplugin.pacing.turns import Pacer
from nriplugin.policy.qos import QoSClass
from nriplugin.qos.collect import (
    Collector,
    ContainerUsage,
    _facts,
    _pressure,
    _Round,
    busy_cores,
)
from nriplugin.qos.sample import ClassUsage, NodeSample, Pressure
from testkit.kernel_tree import proc_tree, v1_counters, v1_tasks, v1_tree
from testkit.runtime_peer import make_container, make_pod
from tests.test_features import caps


def test_busy_cores_edges() -> None:
    a = ProcCpu(busy=100, total=1000, ncpu=4)
    assert busy_cores(None, a) == 0.0 and busy_cores(a, None) == 0.0
    assert busy_cores(a, ProcCpu(150, 1100, 4)) == pytest.approx(2.0)
    assert busy_cores(a, ProcCpu(150, 1100, 2)) == pytest.approx(1.0)  # the CPUs online now
    assert busy_cores(a, ProcCpu(100, 1100, 4)) == 0.0  # nothing busy
    assert busy_cores(a, ProcCpu(99, 1100, 4)) == 0.0  # busy went back: no rate
    assert busy_cores(a, ProcCpu(150, 1000, 4)) == 0.0  # no ticks passed
    assert busy_cores(a, ProcCpu(150, 900, 4)) == 0.0
    assert busy_cores(a, ProcCpu(300, 1100, 4)) == 4.0  # at most every CPU busy
    assert busy_cores(a, ProcCpu(200, 1100, 4)) == 4.0  # all ticks busy: exactly every CPU


def psi(some_avg: float, some_us: int, full_avg: float = 0.0, full_us: int = 0) -> Psi:
    return Psi(PsiLine(some_avg, 1.0, 2.0, some_us), PsiLine(full_avg, 3.0, 4.0, full_us))


def test_pressure_deltas_and_levels() -> None:
    assert _pressure(None, None) == Pressure()
    assert _pressure(psi(1, 10), None) == Pressure()
    assert _pressure(None, psi(5.0, 100, 2.0, 50)) == Pressure(5.0, 2.0, 0, 0)
    assert _pressure(psi(1, 100, 1, 40), psi(5.0, 160, 2.0, 50)) == Pressure(5.0, 2.0, 60, 10)
    assert _pressure(psi(1, 100, 1, 40), psi(5.0, 90, 2.0, 30)) == Pressure(5.0, 2.0, 0, 0)  # reset: no stall
    assert _pressure(Psi(NO_STALL, NO_STALL), psi(0, 7, 0, 3)) == Pressure(0, 0, 7, 3)


def record(qos: str, quota: int | None = None, period: int | None = None, shares: int = 1024) -> Record:
    m = NodeModel()
    pod = make_pod(1, qos)
    c = make_container(1, pod, shares=shares)
    if quota is not None:
        c.linux.resources.cpu.quota.value = quota
    if period is not None:
        c.linux.resources.cpu.period.value = period
    m.container_started(pod, c)
    r = m.get(c.id)
    assert r is not None
    return r


def test_facts_limit_request_and_throttling() -> None:
    assert CFS_PERIOD_US == 100000
    f = _facts(QoSClass.LS, record("LS", 50000, 200000, shares=512))
    assert (f.qos, f.limit, f.request, f.throttling) == (QoSClass.LS, 0.25, 0.5, True)
    assert f.group is not None and f.group.endswith(f"c{1:063d}")
    f = _facts(QoSClass.LS, record("LS", 150000))
    assert (f.limit, f.throttling) == (1.5, True)  # the default period
    f = _facts(QoSClass.LSR, record("LS", 100000))
    assert f.throttling
    f = _facts(QoSClass.BE, record("BE", 100000))
    assert (f.limit, f.throttling) == (1.0, False)  # only LS throttling matters
    for quota in (None, 0, -1):
        f = _facts(QoSClass.LS, record("LS", quota))
        assert (f.limit, f.throttling) == (None, False)
    assert _facts(QoSClass.BE, record("BE", shares=2)).request == pytest.approx(2 / 1024)


def test_a_round_sums_per_class() -> None:
    rnd = _Round()
    ls = _facts(QoSClass.LS, record("LS", 100000, shares=1024))
    ls2 = _facts(QoSClass.LS, record("LS", 50000, shares=512))
    be = _facts(QoSClass.BE, record("BE"))  # unlimited
    rnd.read("a", ls, ContainerUsage(QoSClass.LS, "p", 0.75, 100, 60), periods=10, throttled=1)
    rnd.read("b", ls2, ContainerUsage(QoSClass.LS, "p", 0.25, 50, 40), periods=30, throttled=3)
    before = ContainerUsage(QoSClass.BE, "q", 9.0, 700, 500)
    rnd.carried("c", be, before)
    u = rnd.by_class()
    assert u["LS"] == ClassUsage(
        containers=2,
        cpu_cores=1.0,
        cpu_request_cores=1.5,
        cpu_limit_cores=1.5,
        throttled_ratio=0.1,
        memory_bytes=150,
        rss_bytes=100,
    )
    # carried: its memory counts, its CPU is its group's (not added here); one unlimited: None
    assert u["BE"] == ClassUsage(
        containers=1, cpu_cores=0.0, cpu_request_cores=1.0, cpu_limit_cores=None, memory_bytes=700, rss_bytes=500
    )
    assert rnd.by_container == {
        "a": ContainerUsage(QoSClass.LS, "p", 0.75, 100, 60),
        "b": ContainerUsage(QoSClass.LS, "p", 0.25, 50, 40),
        "c": before,
    }


def test_no_periods_no_throttled_ratio() -> None:
    rnd = _Round()
    ls = _facts(QoSClass.LS, record("LS", 100000))
    rnd.read("a", ls, ContainerUsage(QoSClass.LS, "p", 0.5, 0, 0), periods=0, throttled=0)
    assert rnd.by_class()["LS"].throttled_ratio == 0.0


PSI = "some avg10=0.00 avg60=0.00 avg300=0.00 total={total}\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"


def test_a_groups_cpu_seconds_and_pressure_file(tmp_path: Path) -> None:
    from nriplugin.kernel.cgroup import Cgroups
    from nriplugin.node.desired import DesiredState
    from nriplugin.policy.cache import RuleCache
    from nriplugin.qos.collect import Collector
    from testkit.kernel_tree import v1_counters, v1_tree, v2_tree
    from tests.test_features import caps

    be = "kubepods/besteffort"
    root = v1_tree(tmp_path / "v1", [be])
    v1_counters(root, be, usage_ns=2_500_000_000)
    m = NodeModel()
    col = Collector(m, DesiredState(m, RuleCache(), caps()), Cgroups(root))
    assert col.group_cpu_seconds(be) == 2.5 and col.group_cpu_seconds("kubepods/gone") is None
    assert col.pressure_path(be) is None  # v1 alone: no per-group PSI
    col.close()
    (root / "unified" / be).mkdir(parents=True)  # a hybrid host: the unified hierarchy beside v1
    (root / "unified" / "cgroup.controllers").write_text("\n")
    col = Collector(m, DesiredState(m, RuleCache(), caps()), Cgroups(root))
    assert col.pressure_path(be) == f"{root}/unified/{be}/cpu.pressure"
    (root / "unified" / be / "cpu.pressure").write_text(PSI.format(total=1500))
    (root / "unified" / "kubepods" / "cpu.pressure").write_text(PSI.format(total=500))
    files = [f"{root}/unified/{be}/cpu.pressure", f"{root}/unified/kubepods/cpu.pressure"]
    assert col.stall_us(files) == 2000  # summed over the groups
    assert col.stall_us([f"{root}/unified/gone/cpu.pressure"]) is None
    col.close()
    v2 = v2_tree(tmp_path / "v2", [be])
    col = Collector(m, DesiredState(m, RuleCache(), caps()), Cgroups(v2))
    assert col.pressure_path(be) == f"{v2}/{be}/cpu.pressure"
    col.close()


# the collector on a temporary cgroup v1 tree: rounds pinned to the exact figure ---------------


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _group(c: api.Container) -> str:
    return c.linux.cgroups_path.lstrip("/")


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[tuple[Path, Path, Node, list[Collector]]]:
    """A v1 tree, a /proc at rest, a node, and the collectors a test makes (closed after it)."""
    root, proc = v1_tree(tmp_path / "cg"), proc_tree(tmp_path / "proc")
    made: list[Collector] = []
    yield root, proc, Node.create(cgroups=Cgroups(root), caps=caps()), made
    for col in made:
        col.close()


def _collector(
    node: Node, proc: Path, made: list[Collector], clock: Clock, memory_every: int = 1, pacer: Pacer | None = None
) -> Collector:
    col = Collector(
        node.model, node.desired, node.writer.cgroups, proc, clock=clock, memory_every=memory_every, pacer=pacer
    )
    made.append(col)
    return col


def test_a_limit_of_one_microsecond_is_a_limit() -> None:
    f = _facts(QoSClass.LS, record("LS", 1))
    assert (f.limit, f.throttling) == (1 / CFS_PERIOD_US, True)


def test_no_shares_requested_is_no_request() -> None:
    r = record("BE")
    assert r.container is not None
    r.container.linux.resources.cpu.ClearField("shares")
    assert _facts(QoSClass.BE, r).request == 0.0


def test_one_tick_passed_all_busy_is_every_cpu() -> None:
    assert busy_cores(ProcCpu(10, 100, 4), ProcCpu(11, 101, 4)) == 4.0
    assert busy_cores(ProcCpu(10, 100, 4), ProcCpu(10, 101, 4)) == 0.0


def test_carried_memory_adds_to_what_the_class_has() -> None:
    rnd = _Round()
    be = _facts(QoSClass.BE, record("BE"))
    rnd.read("a", be, ContainerUsage(QoSClass.BE, "p", 1.0, 100, 60), periods=0, throttled=0)
    rnd.carried("b", be, ContainerUsage(QoSClass.BE, "q", 2.0, 700, 500))
    rnd.carried("c", be, ContainerUsage(QoSClass.BE, "q", 2.0, 30, 20))
    u = rnd.by_class()["BE"]
    assert (u.containers, u.cpu_cores, u.memory_bytes, u.rss_bytes) == (3, 1.0, 830, 580)


def test_a_containers_rates_exactly_and_its_first_reading(tree: tuple[Path, Path, Node, list[Collector]]) -> None:
    """A container's first reading counts zero CPU, no periods and no throttling, in its own
    usage and in its class's sums; then cores are ns / 1e9 / seconds and the throttled ratio
    throttled / periods (one period is enough; none: 0); its limit is kept with it."""
    root, proc, node, made = tree
    pod = make_pod(1, "LS")
    old, new, free = make_container(1, pod), make_container(2, pod), make_container(3, pod)
    old.linux.resources.cpu.quota.value = 250000  # 2.5 cores
    new.linux.resources.cpu.quota.value = 50000
    v1_counters(root, _group(old), usage_ns=10**9, periods=100, throttled=50, memory=8 << 20, rss=4 << 20)
    v1_counters(root, _group(free), usage_ns=10**9, memory=8 << 20, rss=4 << 20)
    node.model.container_started(pod, old)
    node.model.container_started(pod, free)
    clock = Clock()
    col = _collector(node, proc, made, clock)
    col.sample()
    assert col.by_container[old.id] == ContainerUsage(QoSClass.LS, pod.id, 0.0, 8 << 20, 4 << 20, 2.5, 0.0)

    clock.t += 2.0
    v1_counters(root, _group(old), usage_ns=5 * 10**9, periods=110, throttled=55, memory=8 << 20, rss=4 << 20)
    v1_counters(root, _group(free), usage_ns=2 * 10**9, memory=8 << 20, rss=4 << 20)
    v1_counters(root, _group(new), usage_ns=9 * 10**9, periods=1000, throttled=1000, memory=8 << 20, rss=4 << 20)
    node.model.container_started(pod, new)
    s = col.sample()
    assert col.by_container[old.id] == ContainerUsage(QoSClass.LS, pod.id, 2.0, 8 << 20, 4 << 20, 2.5, 0.5)
    assert col.by_container[free.id].cpu_cores == 0.5 and col.by_container[free.id].throttled_ratio == 0.0
    assert col.by_container[new.id] == ContainerUsage(QoSClass.LS, pod.id, 0.0, 8 << 20, 4 << 20, 0.5, 0.0)
    assert s.usage("LS").throttled_ratio == 0.5  # 5 of 10 periods: the newcomer adds none
    assert s.usage("LS").cpu_cores == 2.5

    clock.t += 1.0
    v1_counters(root, _group(new), usage_ns=9 * 10**9, periods=1001, throttled=1001, memory=8 << 20, rss=4 << 20)
    col.sample()
    assert col.by_container[new.id].throttled_ratio == 1.0  # one period, throttled


def test_a_container_whose_memory_cannot_be_read_counts_none(tree: tuple[Path, Path, Node, list[Collector]]) -> None:
    root, proc, node, made = tree
    pod = make_pod(1, "LS")
    c = make_container(1, pod)
    v1_counters(root, _group(c), usage_ns=10**9)
    shutil.rmtree(root / "memory" / _group(c))
    node.model.container_started(pod, c)
    s = _collector(node, proc, made, Clock()).sample()
    assert (s.usage("LS").memory_bytes, s.usage("LS").rss_bytes) == (0, 0)
    assert (col_u := s.usage("LS")).containers == 1 and col_u.cpu_cores == 0.0


def test_the_nodes_counters_between_two_rounds(tree: tuple[Path, Path, Node, list[Collector]]) -> None:
    """Page scans by both reclaimers as differences (none moved: 0), swap as /proc/meminfo has
    it, an interval shorter than a second as it is."""
    _, proc, node, made = tree
    proc_tree(proc, swap_total_kb=4096, swap_free_kb=1024, pgscan_direct=10, pgscan_kswapd=1000)
    clock = Clock()
    col = _collector(node, proc, made, clock)
    first = col.sample()
    assert (first.swap_total, first.swap_free, first.pgscan_kswapd) == (4 << 20, 1 << 20, 0)
    clock.t += 0.5
    proc_tree(proc, swap_total_kb=4096, swap_free_kb=1024, pgscan_direct=10, pgscan_kswapd=1300)
    s = col.sample()
    assert (s.interval, s.pgscan_direct, s.pgscan_kswapd) == (0.5, 0, 300)


def test_no_meminfo_is_zero_memory_and_no_stat_keeps_the_cpu_count(
    tree: tuple[Path, Path, Node, list[Collector]], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, proc, node, made = tree
    (proc / "meminfo").unlink()
    (proc / "stat").unlink()
    s = _collector(node, proc, made, Clock()).sample()
    assert (s.mem_total, s.mem_available, s.swap_total, s.swap_free) == (0, 0, 0, 0)
    assert s.ncpu == os.cpu_count()
    monkeypatch.setattr(os, "cpu_count", lambda: None)  # unknown: one CPU
    assert _collector(node, proc, made, Clock()).sample().ncpu == 1


def test_the_fast_path_with_no_new_stall(tree: tuple[Path, Path, Node, list[Collector]]) -> None:
    _, proc, node, made = tree
    clock = Clock()
    col = _collector(node, proc, made, clock)
    proc_tree(proc, busy=100, idle=100, cpu_some_us=1000)
    col.fast()
    clock.t += 0.1
    f = col.fast()
    assert (f.t, f.psi_cpu_some_delta_us) == (1000.1, 0)


def _be_groups(root: Path, node: Node) -> tuple[list[str], api.Container, api.Container]:
    """Two BE QoS-level groups (say, besteffort on two pods roots) and an LS pod of two."""
    groups = ["kubepods/besteffort", "kubepods2/besteffort"]
    for g in groups:
        v1_counters(root, g, usage_ns=0)
    pod = make_pod(1, "LS")
    a, b = make_container(1, pod), make_container(2, pod)
    for c in (a, b):
        v1_counters(root, _group(c), usage_ns=0)
        node.model.container_started(pod, c)
    return groups, a, b


def test_be_groups_are_summed_exactly_from_their_first_round(tree: tuple[Path, Path, Node, list[Collector]]) -> None:
    root, proc, node, made = tree
    groups, _, _ = _be_groups(root, node)
    be = make_pod(2, "BE")
    c = make_container(3, be)
    v1_counters(root, _group(c), usage_ns=0)
    node.model.container_started(be, c)
    clock = Clock()
    col = _collector(node, proc, made, clock)
    v1_counters(root, groups[0], usage_ns=10**9)
    v1_counters(root, groups[1], usage_ns=3 * 10**9)
    first = col.sample(groups)
    assert (first.usage("BE").cpu_cores, first.be_cpu_seconds) == (0.0, 4.0)
    clock.t += 2.0
    v1_counters(root, groups[0], usage_ns=3 * 10**9)
    v1_counters(root, groups[1], usage_ns=9 * 10**9)
    s = col.sample(groups)
    assert (s.usage("BE").cpu_cores, s.be_cpu_seconds) == (4.0, 12.0)  # 8 s of CPU over 2 s


def test_a_leaver_closes_its_files_only(tree: tuple[Path, Path, Node, list[Collector]]) -> None:
    """When a container leaves, its kept files are closed; those of the containers that stay
    and of every BE group stay open (not re-opened each round)."""
    root, proc, node, made = tree
    groups, a, b = _be_groups(root, node)
    clock = Clock()
    col = _collector(node, proc, made, clock)
    col.sample(groups)
    owners = set(col.stats.files._owned) - {""}
    assert owners == {*groups, _group(a), _group(b)}
    node.model.container_removed(b.id)
    clock.t += 1.0
    col.sample(groups)
    assert set(col.stats.files._owned) - {""} == {*groups, _group(a)}


def test_the_async_round_takes_out_only_the_time_others_had(
    tree: tuple[Path, Path, Node, list[Collector]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``collect_seconds`` of an async round is its own reading time: every pause (another
    callback's turn, here 5 s on a fake clock each) is taken out, and each pause is one turn of
    the others (the loop is given back, not slept on). BE's groups are read as in one go."""
    import nriplugin.qos.collect as collect

    root, proc, node, made = tree
    groups, _, _ = _be_groups(root, node)
    now = [0.0]
    monkeypatch.setattr(collect, "time", type("FakeTime", (), {"perf_counter": staticmethod(lambda: now[0])}))
    col = _collector(node, proc, made, Clock(), pacer=Pacer(turn=0.0))  # a turn per container
    turns = 0

    async def round_with_others() -> NodeSample:
        nonlocal turns

        async def other() -> None:
            nonlocal turns
            while True:
                turns += 1
                now[0] += 5.0
                await asyncio.sleep(0)

        task = asyncio.ensure_future(other())
        await asyncio.sleep(0)
        turns, now[0] = 0, 0.0
        s = await col.sample_async(groups)
        task.cancel()
        return s

    s = asyncio.run(round_with_others())
    assert turns == 2  # two containers, a pause before each
    assert now[0] == 10.0 and s.collect_seconds == 0.0
    assert s.be_cpu_seconds == 0.0  # from the groups


def test_memory_all_page_cache_is_none_in_use(tree: tuple[Path, Path, Node, list[Collector]]) -> None:
    root, proc, node, made = tree
    pod = make_pod(1, "LS")
    c = make_container(1, pod)
    v1_counters(root, _group(c), usage_ns=10**9, memory=8 << 20, rss=0, cache=8 << 20)
    node.model.container_started(pod, c)
    s = _collector(node, proc, made, Clock()).sample()
    assert (s.usage("LS").memory_bytes, s.usage("LS").rss_bytes) == (0, 0)


def test_on_v2_an_ls_containers_own_cpu_pressure_is_its_stall(tmp_path: Path) -> None:
    """cgroup v2: each LS container's own ``cpu.pressure`` "some" total, as a share of the
    interval (at most 1; zero the first time); the class's is the mean over its containers.
    BE's is not read (its waits are its limit's doing), and v1 has none."""
    from testkit.kernel_tree import v2_counters, v2_tree

    root, proc = v2_tree(tmp_path / "cg"), proc_tree(tmp_path / "proc")
    node = Node.create(cgroups=Cgroups(root), caps=caps())
    ls_pod, be_pod = make_pod(1, "LS"), make_pod(2, "BE")
    a, b, be = make_container(1, ls_pod), make_container(2, ls_pod), make_container(3, be_pod)
    z = make_container(4, ls_pod)  # its first reading is 0 (as a counter that never moved reads)
    for c, waited in ((a, 1_000_000), (b, 0), (be, 0), (z, 0)):
        v2_counters(root, _group(c), usage_ns=10**9, cpu_some_us=waited)
    for pod, c in ((ls_pod, a), (ls_pod, b), (be_pod, be), (ls_pod, z)):
        node.model.container_started(pod, c)
    clock = Clock()
    made: list[Collector] = []
    col = _collector(node, proc, made, clock)
    try:
        s = col.sample()
        assert col.by_container[a.id].stall_ratio == 0.0 and s.usage("LS").stall_ratio == 0.0
        clock.t += 2.0
        v2_counters(root, _group(a), usage_ns=2 * 10**9, cpu_some_us=1_500_000)  # 0.5 s of 2
        v2_counters(root, _group(b), usage_ns=2 * 10**9, cpu_some_us=4_100_000)  # more than the interval
        v2_counters(root, _group(be), usage_ns=2 * 10**9, cpu_some_us=2_000_000)
        v2_counters(root, _group(z), usage_ns=2 * 10**9, cpu_some_us=1_000_000)  # from 0: 0.5 s of 2
        s = col.sample()
        assert col.by_container[a.id].stall_ratio == 0.25
        assert col.by_container[b.id].stall_ratio == 1.0
        assert col.by_container[z.id].stall_ratio == 0.5
        assert s.usage("LS").stall_ratio == pytest.approx((0.25 + 1.0 + 0.5) / 3)
        assert col.by_container[be.id].stall_ratio is None and s.usage("BE").stall_ratio is None
    finally:
        col.close()


def test_on_v1_an_ls_containers_stall_is_its_tasks_run_queue_wait(
    tree: tuple[Path, Path, Node, list[Collector]],
) -> None:
    """cgroup v1 has no per-group PSI: an LS container's stall is its tasks' ``run_delay``
    summed, as a share of the interval (at most 1). A task that exits keeps what it waited, a
    new one counts from 0, a reused tid that reads lower is a new task. BE's is not read."""
    root, proc, node, made = tree
    ls_pod, be_pod = make_pod(1, "LS"), make_pod(2, "BE")
    a, b, be = make_container(1, ls_pod), make_container(2, ls_pod), make_container(3, be_pod)
    for c in (a, b, be):
        v1_counters(root, _group(c), usage_ns=10**9)
    v1_tasks(root, proc, _group(a), {101: 5_000_000_000, 102: 0})
    v1_tasks(root, proc, _group(b), {201: 0})
    v1_tasks(root, proc, _group(be), {301: 0})
    for pod, c in ((ls_pod, a), (ls_pod, b), (be_pod, be)):
        node.model.container_started(pod, c)
    clock = Clock()
    col = _collector(node, proc, made, clock)
    s = col.sample()
    assert col.by_container[a.id].stall_ratio == 0.0  # the first reading: where the counter starts
    clock.t += 2.0
    for c in (a, b, be):
        v1_counters(root, _group(c), usage_ns=2 * 10**9)
    # a: 101 waited 0.4 s more, 102 exited (its wait stays), 103 is new and waited 0.2 s
    v1_tasks(root, proc, _group(a), {101: 5_400_000_000, 103: 200_000_000})
    v1_tasks(root, proc, _group(b), {201: 3_000_000_000})  # more than the interval: capped
    v1_tasks(root, proc, _group(be), {301: 2_000_000_000})
    s = col.sample()
    assert col.by_container[a.id].stall_ratio == pytest.approx(0.3)
    assert col.by_container[a.id].cpu_cores == pytest.approx(0.5)  # an exit does not lose the round
    assert col.by_container[b.id].stall_ratio == 1.0
    assert s.usage("LS").stall_ratio == pytest.approx((0.3 + 1.0) / 2)
    assert col.by_container[be.id].stall_ratio is None and s.usage("BE").stall_ratio is None
    clock.t += 1.0
    v1_tasks(root, proc, _group(a), {101: 100_000_000})  # 101 exited, its tid reused: 0.1 s new
    col.sample()
    assert col.by_container[a.id].stall_ratio == pytest.approx(0.1)


def test_on_v1_a_group_without_a_readable_tasks_file_has_no_stall(
    tree: tuple[Path, Path, Node, list[Collector]],
) -> None:
    root, proc, node, made = tree
    pod = make_pod(1, "LS")
    c = make_container(1, pod)
    v1_counters(root, _group(c), usage_ns=10**9)
    node.model.container_started(pod, c)
    clock = Clock()
    col = _collector(node, proc, made, clock)
    col.sample()
    clock.t += 1.0
    s = col.sample()
    assert col.by_container[c.id].stall_ratio is None and s.usage("LS").stall_ratio is None
    assert s.usage("LS").cpu_cores == 0.0  # the usage counter did not move; it was still read
