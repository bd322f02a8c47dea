"""The kernel layer against values from independent sources, on temporary trees laid out like
the kernel's (no root, no cgroup v1 needed): every v1/v2 encode and decode, the range table,
file names, and drift detection (``Cgroups.matches``) in both versions.

Sources, named where they are used:
- runc ``libcontainer/cgroups/utils.go`` ConvertCPUSharesToCgroupV2Value (runc <= 1.2, and
  Kubernetes ``pkg/kubelet/cm/cgroup_manager_linux.go`` CpuSharesToCpuWeight /
  CpuWeightToCpuShares, from KEP-2254): weight = 1 + ((shares - 2) * 9999) // 262142 and
  shares = ((weight - 1) * 262142) // 9999 + 2.
- the kernel's ``Documentation/admin-guide/cgroup-v2.rst``: ``cpu.max`` is "$MAX $PERIOD",
  "max 100000" by default, cpu.weight in [1, 10000] (default 100), memory.{min,low,high,max}
  in bytes or "max", page-granular; ``io.max`` lines "$MAJ:$MIN rbps=N wbps=N riops=N
  wiops=N" (unset keys read "max"); ``io.weight`` "default 100" then "$MAJ:$MIN $WEIGHT".
- ``Documentation/admin-guide/cgroup-v1/``: cpu.shares (kernel MIN_SHARES 2, MAX_SHARES
  1 << 18), cfs_period_us in [1 ms, 1 s], cfs_quota_us >= 1 ms or -1, blkio.weight in
  [10, 1000], throttle files "MAJ:MIN N"; an unlimited memory.limit_in_bytes reads
  PAGE_COUNTER_MAX pages, 9223372036854771712 on 4 KiB pages.
- ``Documentation/admin-guide/cgroup-v1/pids.rst`` and cgroup-v2.rst: ``pids.max`` is a
  number or "max" (the default) in both versions; ``kernel/cgroup/pids.c`` refuses a limit
  below 0 or above PID_MAX_LIMIT (4 Mi on 64-bit).
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
from pathlib import Path

import pytest

from nriplugin.kernel.cgroup import (
    RESOURCES,
    Cgroups,
    InvalidValue,
    Version,
    detect_version,
    shares_to_weight,
    shares_to_weight_log,
    weight_to_shares,
    weight_to_shares_log,
)
from nriplugin.kernel.cpulist import format_cpulist, parse_cpulist
from nriplugin.kernel.probe import Resctrl, Topology, core_sched_supported, probe, topology
from nriplugin.kernel.probe import resctrl as resctrl_info
from testkit.kernel_tree import resctrl_tree, sys_tree, v1_tree, v2_tree

G = "kubepods.slice/kubepods-besteffort.slice/pod1.slice/cri-containerd-abc.scope"
V1G = "kubepods/besteffort/pod1/abc"


def runc_weight(shares: int) -> int:
    """runc <= 1.2 / kubelet (KEP-2254): cgroup v1 shares -> v2 weight."""
    return 1 + ((shares - 2) * 9999) // 262142


def kubelet_shares(weight: int) -> int:
    """kubelet's CpuWeightToCpuShares (KEP-2254): v2 weight -> v1 shares (rounds down)."""
    return ((weight - 1) * 262142) // 9999 + 2


# shares -> weight ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shares", "weight"),
    [
        (2, 1),  # kernel MIN_SHARES -> the least weight
        (3, 1),
        (28, 1),
        (29, 2),  # the first share count past one weight step (262142 / 9999 = 26.2)
        (102, 4),  # Kubernetes' 100m request
        (512, 20),
        (1024, 39),  # the v1 default: 39, not the v2 default 100 (the linear map's known skew)
        (2048, 79),
        (262143, 9999),
        (262144, 10000),  # kernel MAX_SHARES -> the largest weight
    ],
)
def test_shares_to_weight_matches_runc_and_kubelet(shares: int, weight: int) -> None:
    assert runc_weight(shares) == weight  # the table itself is the reference formula's
    assert shares_to_weight(shares) == weight


def test_shares_to_weight_equals_runc_on_the_whole_range() -> None:
    assert all(shares_to_weight(s) == runc_weight(s) for s in range(2, 262145))


@pytest.mark.parametrize(("shares", "weight"), [(0, 1), (1, 1), (-5, 1), (262145, 10000), (10**9, 10000)])
def test_shares_outside_the_kernel_range_are_clamped(shares: int, weight: int) -> None:
    assert shares_to_weight(shares) == weight


def test_weight_to_shares_is_the_least_share_count_of_that_weight() -> None:
    """kubelet's inverse rounds down, so its shares can map back one weight lower (39 -> 998 ->
    38); ours is the least share count runc maps to the same weight, so a value read back from
    v2 is never taken for drift. It is kubelet's value or one more."""
    least: dict[int, int] = {}
    for s in range(262144, 1, -1):
        least[runc_weight(s)] = s
    for w in range(1, 10001):
        got = weight_to_shares(w)
        assert got == least[w], w
        assert got - kubelet_shares(w) in (0, 1), w
    assert weight_to_shares(39) == 999 and kubelet_shares(39) == 998 and runc_weight(998) == 38
    assert (
        weight_to_shares(1) == 2
        and weight_to_shares(100) == 2598
        and kubelet_shares(100) == 2597
        and weight_to_shares(10000) == 262144
    )


@pytest.mark.parametrize(("weight", "shares"), [(0, 2), (-3, 2), (10001, 262144), (10**6, 262144)])
def test_weight_outside_the_kernel_range_is_clamped(weight: int, shares: int) -> None:
    assert weight_to_shares(weight) == shares


# runc 1.3.2+ / crun 1.23+ (opencontainers/cgroups ConvertCPUSharesToCgroupV2Value since its
# PR #20): a quadratic in log2(shares) through the minimum, the maximum and the defaults. Its
# test table (utils_test.go), and values of the formula as written there.
@pytest.mark.parametrize(
    ("shares", "weight"),
    [(1, 1), (2, 1), (3, 2), (512, 59), (1024, 100), (2048, 174), (262143, 10000), (262144, 10000), (262145, 10000)],
)
def test_the_log_mapping_matches_runc_1_3_2(shares: int, weight: int) -> None:
    assert shares_to_weight_log(shares) == weight


def test_the_log_mapping_is_monotonic_and_its_inverse_is_the_least_share_count() -> None:
    least: dict[int, int] = {}
    prev = 0
    for s in range(262144, 1, -1):
        w = shares_to_weight_log(s)
        least[w] = s
    for s in range(2, 262145):
        w = shares_to_weight_log(s)
        assert w >= prev
        prev = w
    for w, s in least.items():
        assert weight_to_shares_log(w) == s, w


def test_v2_weights_follow_the_runtimes_mapping_and_either_is_not_drift(tmp_path: Path) -> None:
    """Which mapping the runtime used is learned from a container it just created; until then
    (and for values written before) either mapping's weight of the desired shares matches."""
    root = tmp_path / "cg"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpu memory\n")
    for g in ("a", "b"):
        (root / g).mkdir()
    cg = Cgroups(root)
    assert cg.version is Version.V2 and cg.weight_mapping == "linear"
    (root / "a" / "cpu.weight").write_text("100\n")  # runc 1.3.2 gave 1024 shares weight 100
    assert cg.matches("a", "cpu.shares", 1024) is True  # not drift, whatever we assume
    (root / "a" / "cpu.weight").write_text("1\n")
    assert cg.learn_weight_mapping("a", 2) is None  # both map 2 shares to 1: nothing learned
    (root / "a" / "cpu.weight").write_text("100\n")
    assert cg.learn_weight_mapping("a", 1024) == "log" and cg.weight_learned
    assert cg.encode("cpu.shares", 1024) == "100"
    assert cg.decode("cpu.shares", "100") == 1012  # the least shares of weight 100 (1012..1024 all are)
    (root / "b" / "cpu.weight").write_text("39\n")
    assert cg.learn_weight_mapping("b", 1024) is None  # learned once
    assert cg.matches("b", "cpu.shares", 1024) is True and cg.matches("b", "cpu.shares", 2048) is False
    old = Cgroups(root)
    assert old.learn_weight_mapping("b", 1024) == "linear" and old.encode("cpu.shares", 1024) == "39"


# the range table -------------------------------------------------------------------------------

# resource: (v1 controller, v1 file, v2 file, lo, hi, unlimited) from the kernel docs above
# (cpu.bvt_warp_ns / cpu.idle: Alibaba Cloud Linux's group identity [-1, 2]; cpu.idle 0/1 since 5.15).
TABLE: dict[str, tuple[str | None, str | None, str | None, int | None, int | None, int | None]] = {
    "cpu.shares": ("cpu", "cpu.shares", "cpu.weight", 2, 262144, None),
    "cpu.cfs_quota_us": ("cpu", "cpu.cfs_quota_us", "cpu.max", 1000, 2**44, -1),
    "cpu.cfs_period_us": ("cpu", "cpu.cfs_period_us", "cpu.max", 1000, 1_000_000, None),
    "cpu.cfs_burst_us": ("cpu", "cpu.cfs_burst_us", "cpu.max.burst", 0, 2**44, None),
    "cpu.bvt_warp_ns": ("cpu", "cpu.bvt_warp_ns", "cpu.bvt_warp_ns", -1, 2, None),
    "cpu.idle": ("cpu", "cpu.idle", "cpu.idle", 0, 1, None),
    "cpuset.cpus": ("cpuset", "cpuset.cpus", "cpuset.cpus", None, None, None),
    "cpuset.mems": ("cpuset", "cpuset.mems", "cpuset.mems", None, None, None),
    "memory.limit_in_bytes": ("memory", "memory.limit_in_bytes", "memory.max", 4096, 2**62, -1),
    "memory.min": ("memory", "memory.min", "memory.min", 0, 2**62, None),
    "memory.low": ("memory", "memory.low", "memory.low", 0, 2**62, None),
    "memory.high": ("memory", "memory.high", "memory.high", 0, 2**62, -1),
    "memory.oom.group": (None, None, "memory.oom.group", 0, 1, None),
    "memory.soft_limit_in_bytes": ("memory", "memory.soft_limit_in_bytes", None, 0, 2**62, -1),
    "blkio.throttle.read_bps_device": ("blkio", "blkio.throttle.read_bps_device", "io.max", None, None, None),
    "blkio.throttle.write_bps_device": ("blkio", "blkio.throttle.write_bps_device", "io.max", None, None, None),
    "blkio.throttle.read_iops_device": ("blkio", "blkio.throttle.read_iops_device", "io.max", None, None, None),
    "blkio.throttle.write_iops_device": ("blkio", "blkio.throttle.write_iops_device", "io.max", None, None, None),
    "blkio.weight": ("blkio", "blkio.weight", "io.weight", 10, 1000, None),
    "pids.max": ("pids", "pids.max", "pids.max", 0, 4 * 1024 * 1024, -1),
}


def test_the_range_table_is_the_kernels() -> None:
    assert set(RESOURCES) == set(TABLE)
    for name, (ctrl, v1, v2, lo, hi, unlimited) in TABLE.items():
        r = RESOURCES[name]
        assert r.v1 == ((ctrl, v1) if ctrl and v1 else None), name
        assert (r.v2, r.lo, r.hi, r.unlimited) == (v2, lo, hi, unlimited), name


@pytest.mark.parametrize("name", [n for n, t in TABLE.items() if t[3] is not None])
def test_range_bounds_are_inclusive(name: str) -> None:
    r = RESOURCES[name]
    assert r.lo is not None and r.hi is not None
    assert r.check(r.lo) == r.lo and r.check(r.hi) == r.hi
    for bad in (r.lo - 1, r.hi + 1):
        if bad == r.unlimited:
            continue
        with pytest.raises(InvalidValue, match=rf"{name}={bad} is outside \[{r.lo}, {r.hi}\]"):
            r.check(bad)
    if r.unlimited is not None:
        assert r.check(r.unlimited) == r.unlimited


@pytest.mark.parametrize("bad", ["1000", 1000.0, True, None, [1]])
def test_integer_resources_take_integers_only(bad: object) -> None:
    with pytest.raises(InvalidValue, match=r"cpu\.cfs_quota_us: expected an integer"):
        RESOURCES["cpu.cfs_quota_us"].check(bad)  # type: ignore[arg-type]


def test_string_resources_take_one_line() -> None:
    r = RESOURCES["cpuset.cpus"]
    assert r.check("0-3\n") == "0-3\n" and r.check("x" * 4096) == "x" * 4096
    for bad in ("0\n1", "0-3\n\t", "0\nX", "x" * 4097, 5):
        with pytest.raises(InvalidValue, match=r"cpuset\.cpus: expected a single-line string"):
            r.check(bad)


# files -----------------------------------------------------------------------------------------


def test_file_names_v1(tmp_path: Path) -> None:
    cg = Cgroups(v1_tree(tmp_path, [V1G]))
    for name, (ctrl, v1, _, _, _, _) in TABLE.items():
        if ctrl is None:
            with pytest.raises(KeyError, match=f"{name} has no cgroup v1 file"):
                cg.file(V1G, name)
        else:
            assert cg.file(V1G, name) == tmp_path / str(ctrl) / V1G / str(v1)
    assert cg.group_dir(V1G, "memory") == tmp_path / "memory" / V1G
    assert cg.group_path("", "cpu") == f"{tmp_path}/cpu"
    assert cg.group_path(V1G, "cpu", checked=False) == f"{tmp_path}/cpu/{V1G}"
    assert cg.group_path("", "cpu", checked=False) == f"{tmp_path}/cpu"


def test_file_names_v2(tmp_path: Path) -> None:
    cg = Cgroups(v2_tree(tmp_path, [G]))
    for name, (_, _, v2, _, _, _) in TABLE.items():
        if v2 is None:
            with pytest.raises(KeyError, match=f"{name} has no cgroup v2 file"):
                cg.file(G, name)
        else:
            assert cg.file(G, name) == tmp_path / G / v2
    assert cg.group_dir(G, "memory") == tmp_path / G  # one unified directory for every controller
    assert cg.group_path(G, "cpu", checked=False) == f"{tmp_path}/{G}"
    assert cg.group_path("", "cpu", checked=False) == str(tmp_path)
    assert cg.group_path("") == str(tmp_path)


def test_threads_and_processes_files(tmp_path: Path) -> None:
    """v1: ``tasks`` of the cpu hierarchy; v2: ``cgroup.threads``; both: ``cgroup.procs``."""
    v1 = v1_tree(tmp_path / "v1", [V1G])
    (v1 / "cpu" / V1G / "tasks").write_text("10\n11\n12\n")
    (v1 / "cpu" / V1G / "cgroup.procs").write_text("10\n")
    (v1 / "memory" / V1G / "tasks").write_text("99\n")
    cg1 = Cgroups(v1)
    assert cg1.threads(V1G) == [10, 11, 12] and cg1.threads(V1G, processes=True) == [10]
    v2 = v2_tree(tmp_path / "v2", [G])
    (v2 / G / "cgroup.threads").write_text("20\n21\n")
    (v2 / G / "cgroup.procs").write_text("20\n")
    (v2 / G / "tasks").write_text("77\n")  # not a v2 file: must not be read
    cg2 = Cgroups(v2)
    assert cg2.threads(G) == [20, 21] and cg2.threads(G, processes=True) == [20]
    assert cg2.threads("kubepods.slice/gone") == [] and cg1.threads("gone") == []


def test_version_detection(tmp_path: Path) -> None:
    assert detect_version(v2_tree(tmp_path / "v2")) is Version.V2
    assert detect_version(v1_tree(tmp_path / "v1")) is Version.V1
    hybrid = tmp_path / "hybrid"  # a unified mount with no controllers in it is not v2
    hybrid.mkdir()
    (hybrid / "cgroup.controllers").write_text("\n")
    assert detect_version(hybrid) is Version.V1


# encode / decode -------------------------------------------------------------------------------

V2_ENCODE = [
    ("cpu.shares", 2, None, "1"),
    ("cpu.shares", 1024, None, "39"),
    ("cpu.shares", 262144, None, "10000"),
    ("cpu.cfs_quota_us", 50000, 100000, "50000 100000"),
    ("cpu.cfs_quota_us", 20000, 50000, "20000 50000"),  # the period is the caller's, not 100000
    ("cpu.cfs_quota_us", 50000, None, "50000 100000"),  # the kernel default period
    ("cpu.cfs_quota_us", -1, 50000, "max 50000"),
    ("cpu.cfs_quota_us", -1, None, "max 100000"),
    ("cpu.cfs_burst_us", 20000, None, "20000"),
    ("memory.limit_in_bytes", 1 << 30, None, "1073741824"),
    ("memory.limit_in_bytes", -1, None, "max"),
    ("memory.high", 512 << 20, None, "536870912"),
    ("memory.high", -1, None, "max"),
    ("memory.low", 0, None, "0"),
    ("memory.min", 4096, None, "4096"),
    ("memory.oom.group", 1, None, "1"),
    ("blkio.weight", 10, None, "100"),  # io.weight [1, 10000] is blkio.weight [10, 1000] x 10
    ("blkio.weight", 1000, None, "10000"),
    ("cpuset.cpus", "0-3,8", None, "0-3,8"),
    ("blkio.throttle.read_bps_device", "8:16 2097152", None, "8:16 rbps=2097152"),
    ("blkio.throttle.write_bps_device", "8:16 1048576", None, "8:16 wbps=1048576"),
    ("blkio.throttle.read_iops_device", "253:0 120", None, "253:0 riops=120"),
    ("blkio.throttle.write_iops_device", "253:0 120", None, "253:0 wiops=120"),
    ("pids.max", 1024, None, "1024"),
    ("pids.max", -1, None, "max"),
]


@pytest.mark.parametrize(("resource", "value", "period", "text"), V2_ENCODE)
def test_v2_encode(tmp_path: Path, resource: str, value: int | str, period: int | None, text: str) -> None:
    cg = Cgroups(v2_tree(tmp_path, [G]))
    assert cg.encode(resource, value, period) == text
    assert cg.write(G, resource, value, period=period, force=True).status == "written"
    assert (tmp_path / G / str(RESOURCES[resource].v2)).read_text() == text


V1_ENCODE = [
    ("cpu.shares", 1024, "1024"),
    ("cpu.cfs_quota_us", -1, "-1"),
    ("cpu.cfs_quota_us", 50000, "50000"),
    ("memory.limit_in_bytes", -1, "-1"),
    ("memory.soft_limit_in_bytes", 1 << 20, "1048576"),
    ("blkio.weight", 500, "500"),
    ("blkio.throttle.read_bps_device", "8:16 2097152", "8:16 2097152"),
    ("pids.max", 512, "512"),
    ("pids.max", -1, "max"),  # v1's pids keeps the word (its other limits take -1)
]


@pytest.mark.parametrize(("resource", "value", "text"), V1_ENCODE)
def test_v1_encode(tmp_path: Path, resource: str, value: int | str, text: str) -> None:
    cg = Cgroups(v1_tree(tmp_path, [V1G]))
    assert cg.encode(resource, value, 50000) == text  # a period never leaks into a v1 file


@pytest.mark.parametrize("bad", ["8:16", "8:16 -1", "x:16 5", "8:16 5 6", "8:16 9223372036854775808", "12345:1 5"])
def test_device_rules_are_validated(tmp_path: Path, bad: str) -> None:
    for cg in (Cgroups(v1_tree(tmp_path / "v1")), Cgroups(v2_tree(tmp_path / "v2"))):
        with pytest.raises(InvalidValue, match="expected 'MAJOR:MINOR N'"):
            cg.encode("blkio.throttle.read_bps_device", bad)
    assert Cgroups(v2_tree(tmp_path / "v2")).encode("blkio.throttle.read_bps_device", "8:16 9223372036854775807")


V2_DECODE = [
    ("cpu.cfs_quota_us", "max 100000\n", -1),
    ("cpu.cfs_period_us", "max 100000\n", 100000),
    ("cpu.cfs_quota_us", "20000 50000", 20000),
    ("cpu.cfs_period_us", "20000 50000", 50000),
    ("cpu.shares", "1", 2),
    ("cpu.shares", "39", 999),
    ("cpu.shares", "100", 2598),  # the v2 default weight
    ("cpu.shares", "10000", 262144),
    ("memory.limit_in_bytes", "max\n", -1),
    ("memory.limit_in_bytes", "1073741824\n", 1 << 30),
    ("memory.high", "max", -1),
    ("memory.low", "max", -1),
    ("memory.min", "0", 0),
    ("cpu.cfs_burst_us", "0", 0),
    ("blkio.weight", "default 100\n", 10),
    ("blkio.weight", "default 500\n8:16 200\n", 50),
    ("blkio.weight", "250", 25),
    ("cpuset.cpus", " 0-3\n", "0-3"),
    ("pids.max", "max\n", -1),
    ("pids.max", "4096\n", 4096),
    (
        "blkio.throttle.read_bps_device",
        "8:16 rbps=2097152 wbps=max riops=max wiops=120\n",
        "8:16 rbps=2097152 wbps=max riops=max wiops=120",
    ),
]


@pytest.mark.parametrize(("resource", "text", "value"), V2_DECODE)
def test_v2_decode(tmp_path: Path, resource: str, text: str, value: int | str) -> None:
    cg = Cgroups(v2_tree(tmp_path, [G]))
    assert cg.decode(resource, text) == value
    (tmp_path / G / str(RESOURCES[resource].v2)).write_text(text)
    assert cg.read(G, resource) == value


V1_DECODE = [
    ("cpu.shares", "1024\n", 1024),
    ("cpu.cfs_quota_us", "-1\n", -1),
    ("cpu.cfs_period_us", "100000\n", 100000),
    ("memory.limit_in_bytes", "9223372036854771712\n", 9223372036854771712),
    ("blkio.weight", "500\n", 500),
    ("cpuset.cpus", "0-3\n", "0-3"),
    ("pids.max", "max\n", -1),
    ("pids.max", "512\n", 512),
]


@pytest.mark.parametrize(("resource", "text", "value"), V1_DECODE)
def test_v1_decode(tmp_path: Path, resource: str, text: str, value: int | str) -> None:
    cg = Cgroups(v1_tree(tmp_path, [V1G]))
    assert cg.decode(resource, text) == value
    ctrl, name = RESOURCES[resource].v1 or ("", "")
    (tmp_path / ctrl / V1G / name).write_text(text)
    assert cg.read(V1G, resource) == value


def test_v1_has_no_max_keyword(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        Cgroups(v1_tree(tmp_path)).decode("memory.limit_in_bytes", "max")


def test_read_of_a_missing_file_or_resource_is_none(tmp_path: Path) -> None:
    cg = Cgroups(v1_tree(tmp_path, [V1G]))
    assert cg.read(V1G, "memory.oom.group") is None  # no v1 file at all
    assert cg.read(V1G, "cpu.bvt_warp_ns") is None  # not on this kernel
    assert cg.read("kubepods/gone", "cpu.shares") is None


def test_reads_never_follow_a_link(tmp_path: Path) -> None:
    root = v2_tree(tmp_path / "cg", [G])
    secret = tmp_path / "secret"
    secret.write_text("123456\n")
    (root / G / "memory.max").unlink()
    (root / G / "memory.max").symlink_to(secret)
    cg = Cgroups(root)
    with pytest.raises(OSError) as info:
        cg.read(G, "memory.limit_in_bytes")
    assert info.value.errno == errno.ELOOP
    with pytest.raises(OSError) as info:
        cg.matches(G, "memory.limit_in_bytes", 123456)
    assert info.value.errno == errno.ELOOP


# drift detection -------------------------------------------------------------------------------

# (resource, what the file holds, the desired value, period, matches?)
V2_MATCHES = [
    ("cpu.shares", "39", 1024, None, True),
    ("cpu.shares", "39", 1000, None, True),  # same weight bucket: the kernel cannot tell them apart
    ("cpu.shares", "40", 1024, None, False),
    ("cpu.shares", "1", 2, None, True),
    ("cpu.cfs_quota_us", "50000 100000", 50000, 100000, True),
    ("cpu.cfs_quota_us", "50000 50000", 50000, 100000, True),  # the period is its own resource
    ("cpu.cfs_quota_us", "40000 100000", 50000, 100000, False),
    ("cpu.cfs_quota_us", "max 100000", -1, None, True),
    ("cpu.cfs_quota_us", "max 100000", 50000, None, False),
    ("cpu.cfs_quota_us", "50000 100000", -1, None, False),
    ("cpu.cfs_period_us", "max 100000", 100000, None, True),
    ("cpu.cfs_period_us", "max 50000", 100000, None, False),
    ("memory.limit_in_bytes", "max", -1, None, True),
    ("memory.limit_in_bytes", "1073741824", -1, None, False),
    ("memory.limit_in_bytes", "max", 1 << 30, None, False),
    ("memory.limit_in_bytes", "1073741824", 1 << 30, None, True),
    ("memory.limit_in_bytes", "1073741824", (1 << 30) + 100, None, True),  # page-rounded by the kernel
    ("memory.limit_in_bytes", "1073741824", (1 << 30) + 4096, None, False),
    ("memory.limit_in_bytes", "1073741824", (1 << 30) - 4096, None, False),
    ("memory.high", "max", -1, None, True),
    ("memory.high", "536870912", 512 << 20, None, True),
    ("memory.high", "max", 512 << 20, None, False),
    ("memory.low", "4096", 4097, None, True),
    ("memory.low", "4096", 8191, None, True),
    ("memory.low", "4096", 8192, None, False),
    ("memory.min", "0", 4095, None, True),
    ("cpu.cfs_burst_us", "20000", 20000, None, True),
    ("cpu.cfs_burst_us", "20001", 20000, None, False),
    ("memory.oom.group", "1", 1, None, True),
    ("memory.oom.group", "0", 1, None, False),
    ("blkio.weight", "default 100", 10, None, True),
    ("blkio.weight", "default 500", 50, None, True),
    ("blkio.weight", "default 100", 50, None, False),
    ("cpuset.cpus", "0,1,2,3", "0-3", None, True),  # the kernel's list form is not drift
    ("cpuset.cpus", "0-2", "0-3", None, False),
    ("cpuset.cpus", "", "0-3", None, False),
    ("cpuset.mems", "0-1", "0,1", None, True),
    ("cpuset.cpus", "junk", "0-3", None, False),
    ("blkio.throttle.read_bps_device", "8:16 rbps=2097152 wbps=max riops=max wiops=120", "8:16 2097152", None, True),
    ("blkio.throttle.write_iops_device", "8:16 rbps=2097152 wbps=max riops=max wiops=120", "8:16 120", None, True),
    ("blkio.throttle.write_iops_device", "8:16 rbps=2097152 wbps=max riops=max wiops=120", "8:16 121", None, False),
    ("blkio.throttle.write_bps_device", "8:16 rbps=2097152 wbps=max riops=max wiops=120", "8:16 2097152", None, False),
    ("blkio.throttle.read_bps_device", "8:0 rbps=1 wbps=max\n8:16 rbps=2097152 wbps=max", "8:16 2097152", None, True),
    ("blkio.throttle.read_bps_device", "8:0 rbps=2097152 wbps=max", "8:16 2097152", None, False),
    ("blkio.throttle.read_bps_device", "", "8:16 2097152", None, False),
]


@pytest.mark.parametrize(("resource", "text", "value", "period", "want"), V2_MATCHES)
def test_v2_drift_is_judged_in_the_files_terms(
    tmp_path: Path, resource: str, text: str, value: int | str, period: int | None, want: bool
) -> None:
    cg = Cgroups(v2_tree(tmp_path, [G]))
    (tmp_path / G / str(RESOURCES[resource].v2)).write_text(text + "\n")
    assert cg.matches(G, resource, value, period) is want


V1_MATCHES = [
    ("cpu.shares", "1024", 1024, True),
    ("cpu.shares", "1023", 1024, False),
    ("cpu.shares", "1025", 1024, False),
    ("cpu.cfs_quota_us", "-1", -1, True),
    ("cpu.cfs_quota_us", "50000", 50000, True),
    ("cpu.cfs_quota_us", "50000", -1, False),
    ("memory.limit_in_bytes", "9223372036854771712", -1, True),  # PAGE_COUNTER_MAX pages: unlimited
    ("memory.limit_in_bytes", str(2**62), -1, True),
    ("memory.limit_in_bytes", str(2**62 - 4096), -1, False),
    ("memory.limit_in_bytes", "536870912", 512 << 20, True),
    ("memory.limit_in_bytes", "536870912", (512 << 20) + 1, True),
    ("memory.limit_in_bytes", "536870912", (512 << 20) - 1, False),
    ("memory.soft_limit_in_bytes", "9223372036854771712", -1, True),
    ("memory.soft_limit_in_bytes", "4096", -1, False),
    ("blkio.weight", "500", 500, True),
    ("blkio.weight", "501", 500, False),
    ("blkio.throttle.read_bps_device", "8:16 2097152\n8:0 1", "8:16 2097152", True),
    ("blkio.throttle.read_bps_device", "8:16 2097153", "8:16 2097152", False),
    ("cpuset.cpus", "0-3", "0,1,2,3", True),
    ("cpu.shares", "garbage", 1024, False),
]


@pytest.mark.parametrize(("resource", "text", "value", "want"), V1_MATCHES)
def test_v1_drift_is_judged_in_the_files_terms(
    tmp_path: Path, resource: str, text: str, value: int | str, want: bool
) -> None:
    cg = Cgroups(v1_tree(tmp_path, [V1G]))
    ctrl, name = RESOURCES[resource].v1 or ("", "")
    (tmp_path / ctrl / V1G).mkdir(parents=True, exist_ok=True)
    (tmp_path / ctrl / V1G / name).write_text(text + "\n")
    assert cg.matches(V1G, resource, value) is want


def test_matches_is_none_when_there_is_nothing_to_compare(tmp_path: Path) -> None:
    v1 = Cgroups(v1_tree(tmp_path / "v1", [V1G]))
    assert v1.matches("kubepods/gone", "cpu.shares", 2) is None  # the cgroup went away
    assert v1.matches(V1G, "cpu.bvt_warp_ns", 1) is None  # the kernel has no such file
    assert v1.matches(V1G, "memory.oom.group", 1) is None  # v1 has no such resource
    (tmp_path / "v1" / "cpu" / V1G / "cpu.shares").unlink()
    (tmp_path / "v1" / "cpu" / V1G / "cpu.shares").mkdir()
    (tmp_path / "v1" / "cpu" / V1G / "cpu.idle").unlink()
    (tmp_path / "v1" / "cpu" / V1G / "cpu.idle").write_text("0\n")
    v2 = Cgroups(v2_tree(tmp_path / "v2", [G]))
    assert v2.matches(G, "memory.soft_limit_in_bytes", 0) is None
    (tmp_path / "v2" / "notadir").write_text("")
    assert v2.matches("notadir", "cpu.shares", 2) is None  # a file where a group should be


def test_matches_validates_the_desired_value(tmp_path: Path) -> None:
    cg = Cgroups(v2_tree(tmp_path, [G]))
    with pytest.raises(InvalidValue):
        cg.matches(G, "cpu.shares", 1)


# writes ----------------------------------------------------------------------------------------


def test_v2_write_skips_unchanged_and_force_rewrites(tmp_path: Path) -> None:
    cg = Cgroups(v2_tree(tmp_path, [G]))
    f = tmp_path / G / "memory.max"
    assert cg.write(G, "memory.limit_in_bytes", -1).status == "unchanged"  # the tree says "max"
    assert cg.write(G, "memory.limit_in_bytes", 1 << 30).status == "written"
    assert f.read_text() == "1073741824"
    assert cg.write(G, "memory.limit_in_bytes", 1 << 30).status == "unchanged"
    f.write_text("0\n")  # ... and the file is rewritten whatever it held when forced
    os.utime(f, (0, 0))
    assert cg.write(G, "memory.limit_in_bytes", 1 << 30, force=True).status == "written"
    assert f.read_text() == "1073741824"
    # A write replaces the file's text, never appends to it.
    assert cg.write(G, "memory.high", 4096).status == "written"
    assert (tmp_path / G / "memory.high").read_text() == "4096"


def test_a_missing_file_is_unsupported_once(tmp_path: Path) -> None:
    reported: list[tuple[str, str]] = []
    cg = Cgroups(v2_tree(tmp_path, [G]), on_unsupported=lambda r, why: reported.append((r, why)))
    out = cg.write(G, "cpu.bvt_warp_ns", 1)
    assert (out.status, out.errno) == ("unsupported", errno.ENOENT)
    assert reported == [("cpu.bvt_warp_ns", "cpu.bvt_warp_ns does not exist on this kernel")]
    assert cg.write(G, "cpu.bvt_warp_ns", 2).status == "unsupported" and len(reported) == 1
    assert cg.unsupported == {"cpu.bvt_warp_ns"}
    assert not (tmp_path / G / "cpu.bvt_warp_ns").exists()
    out = cg.write(G, "memory.soft_limit_in_bytes", 0)  # no v2 file at all
    assert out.status == "unsupported" and reported[-1] == (
        "memory.soft_limit_in_bytes",
        "memory.soft_limit_in_bytes has no cgroup v2 file",
    )
    gone = cg.write("kubepods.slice/gone", "cpu.shares", 2)
    assert (gone.status, gone.errno) == ("missing", errno.ENOENT) and "kubepods.slice/gone" in gone.detail


def refusing(monkeypatch: pytest.MonkeyPatch, target: Path, err: int) -> None:
    """The kernel's refusal of one write (EINVAL and friends), which a temporary tree cannot
    produce: ``os.write`` fails with ``err`` for ``target`` only."""
    real = os.write

    def write(fd: int, data: bytes) -> int:
        if os.readlink(f"/proc/self/fd/{fd}") == str(target):
            raise OSError(err, os.strerror(err))
        return real(fd, data)

    monkeypatch.setattr("nriplugin.kernel.cgroup.os.write", write)


@pytest.mark.parametrize("err", [errno.EINVAL, errno.EPERM, errno.EACCES, errno.EOPNOTSUPP])
def test_a_refused_write_of_a_feature_the_kernel_lacks_is_unsupported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, err: int
) -> None:
    """The file exists in the group but not at the top of the hierarchy (the probe's place):
    the kernel's refusal means the feature is missing, reported once and never written again."""
    root = v1_tree(tmp_path, [V1G])
    (root / "cpu" / V1G / "cpu.bvt_warp_ns").write_text("0\n")
    target = root / "cpu" / V1G / "cpu.bvt_warp_ns"
    refusing(monkeypatch, target, err)
    reported: list[str] = []
    cg = Cgroups(root, on_unsupported=lambda r, why: reported.append(f"{r}: {why}"))
    out = cg.write(V1G, "cpu.bvt_warp_ns", 2)
    assert (out.status, out.errno) == ("unsupported", err)
    assert reported == [f"cpu.bvt_warp_ns: {os.strerror(err)} writing cpu.bvt_warp_ns"]
    assert cg.write(V1G, "cpu.bvt_warp_ns", 1).status == "unsupported" and len(reported) == 1


def test_a_refused_value_of_a_supported_feature_is_rejected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """EINVAL for a file the kernel has (a value out of its own bounds): rejected, retried later."""
    root = v1_tree(tmp_path, [V1G])
    refusing(monkeypatch, root / "cpu" / V1G / "cpu.cfs_burst_us", errno.EINVAL)
    cg = Cgroups(root)
    out = cg.write(V1G, "cpu.cfs_burst_us", 50000)
    assert (out.status, out.errno) == ("rejected", errno.EINVAL)
    assert "'50000'" in out.detail and "cpu.cfs_burst_us" in out.detail and cg.unsupported == set()


def test_other_write_errors_are_rejected_even_for_a_missing_feature(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = v1_tree(tmp_path, [V1G])
    (root / "cpu" / V1G / "cpu.bvt_warp_ns").write_text("0\n")
    refusing(monkeypatch, root / "cpu" / V1G / "cpu.bvt_warp_ns", errno.EBUSY)
    cg = Cgroups(root)
    out = cg.write(V1G, "cpu.bvt_warp_ns", 1)
    assert (out.status, out.errno) == ("rejected", errno.EBUSY) and cg.unsupported == set()


def test_supported_probes_the_top_of_the_hierarchy(tmp_path: Path) -> None:
    v1 = Cgroups(v1_tree(tmp_path / "v1", [V1G]))
    assert v1.supported("cpu.cfs_burst_us") and v1.supported("blkio.weight")
    assert not v1.supported("cpu.bvt_warp_ns") and not v1.supported("memory.oom.group")
    assert not v1.supported("memory.min")  # mainline v1
    # v2: the root has no cpu.max/memory.max; the probe looks one level down, at kubepods first.
    root = v2_tree(tmp_path / "v2", ["a.slice", "kubepods.slice"])
    (root / "a.slice" / "cpu.bvt_warp_ns").write_text("0\n")
    (root / "kubepods.slice" / "memory.min").unlink()
    v2 = Cgroups(root)
    assert not v2.supported("memory.min") and not v2.supported("cpu.bvt_warp_ns")
    assert v2.supported("memory.max" and "memory.limit_in_bytes") and not v2.supported("memory.soft_limit_in_bytes")


@pytest.mark.parametrize("first", ["kubepods.slice", "kubepods", "system.slice"])
def test_v2_probe_prefers_the_pods_hierarchy(tmp_path: Path, first: str) -> None:
    root = v2_tree(tmp_path, ["0.slice", first])
    (root / first / "cpu.idle").unlink()
    assert not Cgroups(root).supported("cpu.idle")  # judged at `first`, not at 0.slice


def test_v2_probe_falls_back_to_the_first_directory(tmp_path: Path) -> None:
    root = v2_tree(tmp_path, ["b.slice", "c.slice"])
    (root / "a-file").write_text("")
    (root / "c.slice" / "cpu.idle").unlink()
    assert Cgroups(root).supported("cpu.idle")  # b.slice, the first directory by name
    (root / "b.slice" / "cpu.idle").unlink()
    assert not Cgroups(root).supported("cpu.idle")
    empty = tmp_path / "empty"
    v2_tree(empty)
    assert not Cgroups(empty).supported("cpu.idle")
    assert not Cgroups(tmp_path / "nowhere", version=Version.V2).supported("cpu.idle")


def test_a_write_error_without_errno_is_rejected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = v1_tree(tmp_path, [V1G])

    def write(fd: int, data: bytes) -> int:
        raise OSError("no errno")

    monkeypatch.setattr("nriplugin.kernel.cgroup.os.write", write)
    out = Cgroups(root).write(V1G, "cpu.shares", 3)
    assert (out.status, out.errno) == ("rejected", 0)


def test_a_linked_file_is_never_written(tmp_path: Path) -> None:
    root = v2_tree(tmp_path / "cg", [G])
    target = tmp_path / "target"
    target.write_text("100\n")
    (root / G / "cpu.weight").unlink()
    (root / G / "cpu.weight").symlink_to(target)
    with pytest.raises(PermissionError, match=r"refusing .*/cpu\.weight: a symbolic link"):
        Cgroups(root).write(G, "cpu.shares", 2, force=True)
    assert target.read_text() == "100\n"


# the capability probe --------------------------------------------------------------------------

# cpu lists as the kernel prints them (Documentation/admin-guide/cputopology.rst, cpuset(7))
CPULISTS = [
    ("0-3,8,10-11", [0, 1, 2, 3, 8, 10, 11]),
    ("0", [0]),
    ("0-0", [0]),
    ("3,1,2", [1, 2, 3]),
    ("1,1-2", [1, 2]),
    ("  0-1\n", [0, 1]),
    ("", []),
    ("\n", []),
    ("0-65536", list(range(65537))),  # the widest range taken
]


@pytest.mark.parametrize(("text", "cpus"), CPULISTS)
def test_cpulists(text: str, cpus: list[int]) -> None:
    assert parse_cpulist(text) == cpus


@pytest.mark.parametrize("bad", ["0-65537", "-1", "2-1", "a", "1,,2", "1-", "0x1", "1 2"])
def test_bad_cpulists_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_cpulist(bad)


@pytest.mark.parametrize(
    ("cpus", "text"),
    [([0, 1, 2, 3, 8, 10, 11], "0-3,8,10-11"), ([], ""), ([5], "5"), ([3, 1, 2, 2], "1-3"), ([0, 2, 4], "0,2,4")],
)
def test_cpulists_are_written_as_the_kernel_writes_them(cpus: list[int], text: str) -> None:
    assert format_cpulist(cpus) == text


def test_topology_from_sys(tmp_path: Path) -> None:
    t = topology(sys_tree(tmp_path, cores=2, smt=2, numa_nodes=2))
    assert t.online == [0, 1, 2, 3] and t.smt
    assert t.siblings == {0: [0, 2], 1: [1, 3], 2: [0, 2], 3: [1, 3]}
    assert t.core == {0: (0, 0), 1: (1, 1), 2: (0, 0), 3: (1, 1)}
    assert t.numa == {0: 0, 1: 1, 2: 0, 3: 1}
    # a CPU whose topology cannot be read is its own core on package 0, node 0
    cpu = tmp_path / "devices" / "system" / "cpu"
    (cpu / "cpu1" / "topology" / "core_id").write_text("x\n")
    (cpu / "cpu3" / "topology" / "thread_siblings_list").unlink()
    (cpu / "cpu3" / "node1").rmdir()
    t = topology(tmp_path)
    assert t.siblings[1] == [1] and t.core[1] == (0, 1) and t.siblings[3] == [3] and t.core[3] == (0, 3)
    assert t.numa[3] == 0 and t.numa[1] == 1
    single = topology(sys_tree(tmp_path / "one", cores=2, smt=1))
    assert not single.smt and single.siblings == {0: [0], 1: [1]}
    assert topology(tmp_path / "none") == Topology()


def test_resctrl_info(tmp_path: Path) -> None:
    r = resctrl_info(resctrl_tree(tmp_path / "a", closids=16, cbm_mask="7ff"))
    assert r == Resctrl(True, 16, "7ff", 1, 8, 10, 10) and r.cache_ways == 11
    assert resctrl_info(tmp_path / "none") == Resctrl() and Resctrl().cache_ways == 0
    b = resctrl_tree(tmp_path / "b", cbm_mask="ff0", mb=False)
    (b / "info" / "L3" / "min_cbm_bits").write_text("2\n")
    (b / "info" / "L3" / "num_closids").write_text("junk\n")
    r = resctrl_info(b)
    assert (r.mounted, r.l3_closids, r.l3_min_cbm_bits, r.cache_ways, r.mb_closids) == (True, 0, 2, 8, 0)
    (b / "info" / "L3" / "min_cbm_bits").write_text("0\n")
    (b / "info" / "L3" / "cbm_mask").unlink()
    r = resctrl_info(b)
    assert r.l3_min_cbm_bits == 1 and r.l3_cbm_mask == "" and r.cache_ways == 0
    c = tmp_path / "c"
    c.mkdir()
    (c / "schemata").write_text("MB:0=100\n")  # mounted, no info directory
    assert resctrl_info(c) == Resctrl(mounted=True)


def test_probe_v2_and_v1_controllers(tmp_path: Path) -> None:
    v2 = v2_tree(tmp_path / "v2", ["kubepods.slice"])
    proc = tmp_path / "proc"
    (proc / "pressure").mkdir(parents=True)
    (proc / "pressure" / "cpu").write_text("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    caps = probe(v2, tmp_path / "no-resctrl", proc, sys_tree(tmp_path / "sys"), core_sched=True)
    assert caps.cgroup_version is Version.V2 and caps.controllers == ["cpuset", "cpu", "io", "memory", "pids"]
    assert caps.psi and caps.core_sched and not caps.resctrl.mounted
    assert (
        caps.files["memory.min"] and not caps.files["memory.soft_limit_in_bytes"] and set(caps.files) == set(RESOURCES)
    )
    v1 = v1_tree(tmp_path / "v1", ["kubepods"])
    (v1 / "systemd").mkdir()
    (v1 / "systemd" / "cgroup.procs").write_text("")
    (v1 / "unified").mkdir()
    (v1 / "unified" / "cgroup.procs").write_text("")
    (v1 / "misc").mkdir()  # no cgroup.procs: not a mounted hierarchy
    (v1 / "cpuacct").symlink_to(v1 / "cpu")  # cpu,cpuacct's alias
    (v1 / "file").write_text("")
    caps = probe(v1, tmp_path / "no-resctrl", tmp_path / "no-proc", sys_tree(tmp_path / "sys1"), core_sched=False)
    assert caps.controllers == ["blkio", "cpu", "cpuset", "memory", "pids"] and not caps.psi and not caps.core_sched
    assert caps.topology.online == list(range(8))


def test_a_path_that_climbs_out_is_refused(tmp_path: Path) -> None:
    """paths.relative refuses "..", and the kernel layer checks again on its own."""
    for cg, base in (
        (Cgroups(v1_tree(tmp_path / "v1", ["kubepods"])), "cpu"),
        (Cgroups(v2_tree(tmp_path / "v2", ["kubepods"])), ""),
    ):
        for group in ("kubepods/../..", "kubepods/../../..", ".."):
            with pytest.raises(PermissionError, match="resolves outside"):
                cg.group_path(group)
        assert cg.group_path("kubepods/..") == (f"{cg.root}/{base}/kubepods/.." if base else f"{cg.root}/kubepods/..")


def test_a_bad_device_rule_is_named_in_the_error(tmp_path: Path) -> None:
    cg = Cgroups(v2_tree(tmp_path))
    with pytest.raises(InvalidValue, match=r"blkio\.throttle\.read_bps_device: expected 'MAJOR:MINOR N', got '8:16'$"):
        cg.encode("blkio.throttle.read_bps_device", "8:16")
    long = "8:16 " + "1" * 70
    with pytest.raises(InvalidValue) as info:
        cg.encode("blkio.throttle.read_bps_device", long)
    assert str(info.value).endswith(f"got {long[:60]!r}")


class FakeLibc:
    """prctl as the kernel answers it (include/uapi/linux/prctl.h: PR_SCHED_CORE 62,
    PR_SCHED_CORE_GET 0; PIDTYPE_PID 0): a return code and an errno."""

    def __init__(self, rc: int, err: int) -> None:
        self.rc, self.err = rc, err
        self.calls: list[tuple[object, ...]] = []
        self.opened: dict[str, object] = {}

    def dll(self, name: object, **kwargs: object) -> FakeLibc:
        self.opened = {"name": name, **kwargs}
        return self

    def prctl(self, *args: object) -> int:
        self.calls.append((*args[:4], type(args[4]).__name__ if len(args) > 4 else None))
        ctypes.set_errno(self.err)
        return self.rc


@pytest.mark.parametrize(
    ("rc", "err", "supported"),
    [
        (0, 0, True),
        (0, errno.EINVAL, True),
        (-1, errno.EINVAL, False),
        (-1, errno.ENOSYS, False),
        (-1, errno.EPERM, True),
        (-1, errno.ESRCH, True),
    ],
)
def test_core_sched_probe(monkeypatch: pytest.MonkeyPatch, rc: int, err: int, supported: bool) -> None:
    """The kernel's answer decides, through libc's errno (a kernel without core scheduling
    says EINVAL, an old libc/kernel ENOSYS; anything else means the call exists)."""
    libc = FakeLibc(rc, err)
    monkeypatch.setattr("nriplugin.kernel.probe.ctypes.CDLL", libc.dll)
    assert core_sched_supported() is supported
    # the cookie is written through a pointer (CArgObject is ctypes.byref's type); on success
    # errno keeps whatever an earlier call left there, so only a failed call's errno counts
    assert libc.calls == [(62, 0, 0, 0, "CArgObject")] and libc.opened == {"name": None, "use_errno": True}


def test_core_sched_probe_without_libc(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_libc(*_a: object, **_k: object) -> object:
        raise OSError("no libc")

    monkeypatch.setattr("nriplugin.kernel.probe.ctypes.CDLL", no_libc)
    assert core_sched_supported() is False


def test_probe_asks_about_core_scheduling_unless_told(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, sys_root = v1_tree(tmp_path / "cg"), sys_tree(tmp_path / "sys")
    for answer in (True, False):
        monkeypatch.setattr("nriplugin.kernel.probe.core_sched_supported", lambda a=answer: a)
        assert probe(root, tmp_path, tmp_path, sys_root).core_sched is answer
        assert probe(root, tmp_path, tmp_path, sys_root, core_sched=not answer).core_sched is (not answer)


def test_cpulist_errors_and_wide_ids() -> None:
    assert parse_cpulist("70000") == [70000] and parse_cpulist("70000-70001") == [70000, 70001]
    with pytest.raises(ValueError, match=r"^bad cpu list '2-1'$"):
        parse_cpulist("2-1")
    long = "3-1," + "0," * 60
    with pytest.raises(ValueError, match=f"^bad cpu list {re.escape(repr(long.strip()[:80]))}$"):
        parse_cpulist(long)


@pytest.mark.parametrize("name", ["cg X", "cg "])
def test_the_root_is_taken_verbatim(tmp_path: Path, name: str) -> None:
    root = v2_tree(tmp_path / name, [G])
    cg = Cgroups(root)
    assert cg.group_path(G) == f"{root}/{G}" and cg.group_path(G, checked=False) == f"{root}/{G}"
    assert cg.write(G, "cpu.shares", 2, force=True).status == "written"
    assert (root / G / "cpu.weight").read_text() == "1"


def test_v1_a_file_the_root_group_lacks_is_probed_one_level_down(tmp_path: Path) -> None:
    """The v1 root group has no ``pids.max`` (the kernel gives it only to children): the file
    is looked for in a child, as v2's are."""
    root = v1_tree(tmp_path, ["kubepods"])
    (root / "pids" / "pids.max").unlink()
    assert Cgroups(root).supported("pids.max")
    (root / "pids" / "kubepods" / "pids.max").unlink()
    assert not Cgroups(root).supported("pids.max")
