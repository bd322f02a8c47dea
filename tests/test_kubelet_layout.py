"""The test kubelet (testkit/kubelet.py) against kubelet's own numbers: the values it takes from
pod specs (kubernetes v1.35 ``pkg/kubelet/cm``), the files and order libcontainer writes them
in, its records and thread on a fake tree, and, as root on cgroup v1, the real kernel: pod
groups made and removed, and an idle QoS-class group refusing kubelet's weight the way it
broke a real node."""

from __future__ import annotations

import errno
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from nriplugin.kernel.cgroup import shares_to_weight, shares_to_weight_log
from testkit.containerd import remove_cgroups
from testkit.kubelet import (
    BEST_EFFORT,
    BURSTABLE,
    GUARANTEED,
    QUOTA_PERIOD,
    GroupConfig,
    Kubelet,
    KubeletExited,
    Resources,
    container_resources,
    cpu_weight,
    milli_cpu_to_quota,
    milli_cpu_to_shares,
    planned_writes,
    pod_config,
    qos_class,
    qos_configs,
)

MiB = 1 << 20
REAL = Path("/sys/fs/cgroup")


# -- kubelet's numbers ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("milli", "shares"),
    [(0, 2), (1, 2), (2, 2), (100, 102), (250, 256), (1000, 1024), (1500, 1536), (300000, 262144)],
)
def test_milli_cpu_to_shares_is_kubelets(milli: int, shares: int) -> None:
    assert milli_cpu_to_shares(milli) == shares


@pytest.mark.parametrize(("milli", "quota"), [(0, 0), (1, 1000), (10, 1000), (250, 25000), (2500, 250000)])
def test_milli_cpu_to_quota_is_kubelets(milli: int, quota: int) -> None:
    assert milli_cpu_to_quota(milli) == quota


def test_kubelet_writes_cgroup_v2_weights_with_its_linear_mapping() -> None:
    """kubelet converts the QoS and pod groups' shares itself (``getCPUWeight``): the repo's
    linear mapping, not the runtimes' newer quadratic-in-log one."""
    assert [cpu_weight(s) for s in (2, 1024, 1536, 262144, 10**6)] == [1, 39, 59, 10000, 10000]
    assert all(cpu_weight(s) == shares_to_weight(s) for s in range(2, 262145, 97))
    assert cpu_weight(1024) != shares_to_weight_log(1024)


@pytest.mark.parametrize(
    ("containers", "qos"),
    [
        ([Resources()], BEST_EFFORT),
        ([Resources(), Resources()], BEST_EFFORT),
        ([Resources(memory_request=MiB)], BURSTABLE),
        ([Resources(cpu_request=500, cpu_limit=1000)], BURSTABLE),
        ([Resources(cpu_limit=1000, memory_limit=MiB)], GUARANTEED),  # requests default to limits
        ([Resources(cpu_request=1000, cpu_limit=1000, memory_request=MiB, memory_limit=MiB)], GUARANTEED),
        ([Resources(cpu_limit=1000, memory_limit=MiB), Resources()], BURSTABLE),
        ([Resources(cpu_limit=1000)], BURSTABLE),  # no memory limit
    ],
)
def test_qos_class_is_get_pod_qos(containers: list[Resources], qos: str) -> None:
    assert qos_class(containers) == qos


def test_resources_a_spec_could_not_have_are_refused() -> None:
    bad: list[dict[str, int]] = [
        {"cpu_request": -1},
        {"cpu_request": 2000, "cpu_limit": 1000},
        {"memory_request": 2, "memory_limit": 1},
    ]
    for fields in bad:
        with pytest.raises(ValueError):
            Resources(**fields)


def test_pod_level_values_follow_resource_config_for_pod() -> None:
    both_limited = [Resources(cpu_request=500, cpu_limit=1000), Resources(cpu_request=1000, cpu_limit=1000)]
    want = GroupConfig(cpu_shares=1536, cpu_quota=200000, cpu_period=QUOTA_PERIOD)
    assert pod_config(BURSTABLE, both_limited) == want
    # one container without a CPU limit: no pod quota (its weight still sums the requests)
    one_unlimited = [Resources(cpu_request=500, cpu_limit=1000), Resources(cpu_request=1000)]
    assert pod_config(BURSTABLE, one_unlimited) == GroupConfig(cpu_shares=1536)
    # a memory limit on the pod only when every container has one
    mem = [Resources(cpu_request=100, memory_limit=64 * MiB), Resources(memory_limit=32 * MiB)]
    assert pod_config(BURSTABLE, mem) == GroupConfig(cpu_shares=102, memory=96 * MiB)
    assert pod_config(BURSTABLE, [*mem, Resources()]).memory is None
    guaranteed = [Resources(cpu_limit=1500, memory_limit=128 * MiB)]
    assert pod_config(GUARANTEED, guaranteed) == GroupConfig(
        cpu_shares=1536, cpu_quota=150000, cpu_period=QUOTA_PERIOD, memory=128 * MiB
    )
    assert pod_config(GUARANTEED, guaranteed, enforce_cpu_limits=False).cpu_quota == -1
    assert pod_config(BEST_EFFORT, [Resources()]) == GroupConfig(cpu_shares=2)


def test_qos_groups_weight_sums_the_burstable_pods_requests_only() -> None:
    pods = [
        (BURSTABLE, [Resources(cpu_request=1000, cpu_limit=2000)]),
        (BURSTABLE, [Resources(cpu_request=250), Resources(cpu_request=250)]),
        (GUARANTEED, [Resources(cpu_limit=4000, memory_limit=MiB)]),
        (BEST_EFFORT, [Resources()]),
    ]
    assert qos_configs(pods) == {
        "kubepods": GroupConfig(),
        "kubepods/burstable": GroupConfig(cpu_shares=1536),
        "kubepods/besteffort": GroupConfig(cpu_shares=2),
    }
    assert qos_configs([])["kubepods/burstable"] == GroupConfig(cpu_shares=2)  # MilliCPUToShares(0)


def test_a_containers_own_values_are_calculate_linux_resources() -> None:
    assert container_resources(Resources()) == (2, 0, QUOTA_PERIOD, 0)
    assert container_resources(Resources(cpu_limit=1000, memory_limit=MiB)) == (1024, 100000, QUOTA_PERIOD, MiB)
    assert container_resources(Resources(cpu_request=250, cpu_limit=2000)) == (256, 200000, QUOTA_PERIOD, 0)


def test_libcontainer_writes_memory_first_then_weight_then_bandwidth() -> None:
    cfg = GroupConfig(cpu_shares=1024, cpu_quota=200000, cpu_period=QUOTA_PERIOD, memory=64 * MiB)
    assert planned_writes(cfg, 1) == [
        ("memory", "memory.limit_in_bytes", str(64 * MiB)),
        ("cpu", "cpu.shares", "1024"),
        ("cpu", "cpu.cfs_period_us", "100000"),
        ("cpu", "cpu.cfs_quota_us", "200000"),
    ]
    assert planned_writes(cfg, 2) == [
        ("memory", "memory.max", str(64 * MiB)),
        ("cpu", "cpu.weight", "39"),
        ("cpu", "cpu.max", "200000 100000"),
    ]
    assert planned_writes(GroupConfig(cpu_shares=2), 1) == [("cpu", "cpu.shares", "2")]
    assert planned_writes(GroupConfig(cpu_shares=2), 2) == [("cpu", "cpu.weight", "1")]
    assert planned_writes(GroupConfig(cpu_shares=2, cpu_quota=-1, cpu_period=QUOTA_PERIOD), 2)[-1] == (
        "cpu",
        "cpu.max",
        "max 100000",
    )
    assert planned_writes(GroupConfig(), 1) == planned_writes(GroupConfig(), 2) == []


# -- records and the thread, on a fake tree --------------------------------------------------------


def fake_v1(tmp: Path, root: str) -> Path:
    """The files kubelet's QoS-class groups have, as plain files (a tree that already exists:
    kubelet updates it, as after a restart)."""
    for ctrl in ("cpu", "memory"):
        (tmp / ctrl).mkdir()
        (tmp / ctrl / "cgroup.procs").write_text("")
        for group in ("kubepods", "kubepods/burstable", "kubepods/besteffort"):
            d = tmp / ctrl / root / group
            d.mkdir(parents=True)
            (d / ("cpu.shares" if ctrl == "cpu" else "memory.limit_in_bytes")).write_text("1024\n")
    return tmp


def test_the_periodic_rewrites_are_recorded_and_stop_with_the_thread(tmp_path: Path) -> None:
    fs = fake_v1(tmp_path, "node")
    kl = Kubelet("node", resync=0.02, cpu_milli=2000, memory=4 << 30, fs=fs, version=1)
    with kl:
        assert (fs / "cpu/node/kubepods/cpu.shares").read_text() == "2048"
        assert (fs / "memory/node/kubepods/memory.limit_in_bytes").read_text() == str(4 << 30)
        time.sleep(0.2)
    n = len(kl.writes())
    time.sleep(0.1)
    assert len(kl.writes()) == n  # nothing after stop
    periodic = kl.writes("kubepods/besteffort", file="cpu.shares")
    assert len([w for w in periodic if w.cause == "periodic"]) >= 3
    assert all(w.ok and w.value == "2" for w in periodic)  # the same value, written again and again
    assert kl.last_value("kubepods/burstable", "cpu.shares") == "2"
    assert kl.refused() == []
    assert not any(t.name == "test-kubelet" for t in threading.enumerate())


def test_a_refused_qos_write_is_recorded_and_a_restart_exits_as_kubelet_does(tmp_path: Path) -> None:
    fs = fake_v1(tmp_path, "node")
    kl = Kubelet("node", resync=3600, cpu_milli=2000, memory=4 << 30, fs=fs, version=1)
    kl.start()
    kl.stop()
    shares = fs / "cpu/node/kubepods/besteffort/cpu.shares"
    shares.unlink()
    shares.mkdir()  # any refusal will do: the kernel's is EINVAL, a directory's EISDIR
    assert not kl.update_qos()
    [w] = kl.refused()
    assert (w.group, w.file, w.value, w.errno) == ("kubepods/besteffort", "cpu.shares", "2", errno.EISDIR)
    assert w.error == f'failed to write "2": write {shares}: is a directory'
    with pytest.raises(KubeletExited, match=r"failed to update top level BestEffort QOS cgroup : failed to write"):
        kl.restart()
    assert kl.writes()[-1].cause == "restart"


def test_on_cgroup_v2_kubelet_writes_weights_and_cpu_max_and_enables_controllers(tmp_path: Path) -> None:
    """The v2 layout on a fake tree that already has kubelet's groups and one pod's: one
    hierarchy, ``cpu.weight`` by kubelet's mapping, ``cpu.max`` with the period, ``memory.max``,
    and each parent enabling its controllers for its children."""
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids\n")
    groups = ("", "kubepods", "kubepods/burstable", "kubepods/besteffort", "kubepods/burstable/podp")
    for group in groups:
        d = tmp_path / "node" / group
        d.mkdir(parents=True, exist_ok=True)
        for name in ("cgroup.subtree_control", "cpu.weight", "cpu.max", "memory.max"):
            (d / name).write_text("")
        (d / "cgroup.controllers").write_text("cpu memory\n")
    kl = Kubelet("node", resync=3600, cpu_milli=2000, memory=4 << 30, fs=tmp_path, version=2)
    with kl:
        kl.add_pod("p", BURSTABLE, {"a": Resources(cpu_request=250, cpu_limit=1500, memory_limit=64 * MiB)})
    node = tmp_path / "node"
    assert kl.group_path("kubepods") == node / "kubepods"
    assert (node / "kubepods/cpu.weight").read_text() == "79"  # 2 CPUs: 2048 shares
    assert (node / "kubepods/memory.max").read_text() == str(4 << 30)
    assert (node / "kubepods/besteffort/cpu.weight").read_text() == "1"
    assert (node / "kubepods/burstable/cpu.weight").read_text() == "10"  # 256 shares
    pod = node / "kubepods/burstable/podp"
    got = [(pod / f).read_text() for f in ("cpu.weight", "cpu.max", "memory.max")]
    assert got == ["10", "150000 100000", str(64 * MiB)]
    # a plain file keeps the last "+controller" written: each parent was given its controllers
    assert (node / "kubepods/cgroup.subtree_control").read_text() in ("+cpu", "+memory")
    assert kl.refused() == []


# -- the real kernel (cgroup v1) --------------------------------------------------------------------

real_v1 = pytest.mark.skipif(
    os.geteuid() != 0 or not (REAL / "cpu" / "cpu.shares").exists(), reason="needs root + cgroup v1"
)


@pytest.fixture
def real_root() -> Iterator[str]:
    root = f"nriplugin-kubelet-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        yield root
    finally:
        remove_cgroups(root)
        assert not [h for h in REAL.iterdir() if (h / root).exists()]


@real_v1
def test_pod_groups_get_kubelets_values_in_the_kernel_and_go_with_the_pod(real_root: str) -> None:
    with Kubelet(real_root, resync=3600) as kl:
        ls = kl.add_pod("ls", BURSTABLE, {"a": Resources(cpu_request=250, cpu_limit=1000, memory_limit=64 * MiB)})
        be = kl.add_pod("be", BEST_EFFORT, {"a": Resources()})
        assert (ls, be) == ("kubepods/burstable/podls", "kubepods/besteffort/podbe")
        cpu, mem = kl.group_path(ls), kl.group_path(ls, "memory")
        assert [(cpu / f).read_text().strip() for f in ("cpu.shares", "cpu.cfs_quota_us", "cpu.cfs_period_us")] == [
            "256",
            "100000",
            "100000",
        ]
        assert (mem / "memory.limit_in_bytes").read_text().strip() == str(64 * MiB)
        cpuset = kl.group_path(ls, "cpuset")  # a task could join it: CPUs and memory nodes set
        assert (cpuset / "cpuset.cpus").read_text().strip() and (cpuset / "cpuset.mems").read_text().strip()
        assert (kl.group_path(be) / "cpu.shares").read_text().strip() == "2"
        assert (kl.group_path(be) / "cpu.cfs_quota_us").read_text().strip() == "-1"
        assert (kl.group_path("kubepods/burstable") / "cpu.shares").read_text().strip() == "256"
        assert kl.refused() == []
        kl.remove_pod("ls")
        assert not cpu.exists() and not mem.exists() and not cpuset.exists()
        assert (kl.group_path("kubepods/burstable") / "cpu.shares").read_text().strip() == "2"


@pytest.mark.skipif(os.geteuid() != 0 or not (REAL / "cpu" / "cpu.idle").exists(), reason="needs root + v1 cpu.idle")
def test_an_idle_besteffort_group_refuses_kubelets_weight_and_kubelet_exits_on_restart(real_root: str) -> None:
    """What broke a real node: with ``cpu.idle`` 1 on kubelet's besteffort group the kernel
    refuses every weight written there, so each QoS update fails and a restarted kubelet
    exits. The harness must see exactly that."""
    kl = Kubelet(real_root, resync=3600)
    kl.start()
    kl.stop()
    idle = kl.group_path("kubepods/besteffort") / "cpu.idle"
    idle.write_text("1")
    assert not kl.update_qos()
    [w] = kl.refused()
    assert (w.group, w.file, w.value, w.errno) == ("kubepods/besteffort", "cpu.shares", "2", errno.EINVAL)
    with pytest.raises(KubeletExited, match=r'BestEffort QOS cgroup : failed to write "2": .*: invalid argument'):
        kl.restart()
    idle.write_text("0")
    kl.restart()  # the kernel takes the weight again
    kl.stop()
    assert kl.writes()[-1].ok
