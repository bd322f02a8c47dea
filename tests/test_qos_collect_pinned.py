"""The collector's arithmetic pinned at its edges: node CPU from two /proc/stat readings, PSI
stall deltas, a container's limit and request from its facts, and the per-class sums."""

from __future__ import annotations

from pathlib import Path

import pytest

from nriplugin.kernel.stats import NO_STALL, ProcCpu, Psi, PsiLine
from nriplugin.node.model import NodeModel, Record
from nriplugin.policy.qos import QoSClass
from nriplugin.qos.collect import DEFAULT_PERIOD_US, ContainerUsage, _facts, _pressure, _Round, busy_cores
from nriplugin.qos.sample import ClassUsage, Pressure
from testkit.runtime_peer import make_container, make_pod


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
    assert DEFAULT_PERIOD_US == 100000
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
    assert col.pressure_path(be) is None  # v1: no per-group PSI
    col.close()
    v2 = v2_tree(tmp_path / "v2", [be])
    col = Collector(m, DesiredState(m, RuleCache(), caps()), Cgroups(v2))
    assert col.pressure_path(be) == f"{v2}/{be}/cpu.pressure"
    col.close()
