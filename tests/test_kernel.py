"""The kernel layer on temporary trees (v1 and v2, both drivers) and on this machine's real
cgroup v1 files."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nriplugin.intent.core import Setting
from nriplugin.kernel import paths
from nriplugin.kernel.cgroup import Cgroups, InvalidValue, Version, shares_to_weight, weight_to_shares
from nriplugin.kernel.cpulist import format_cpulist, parse_cpulist
from nriplugin.kernel.probe import probe
from nriplugin.node.writer import Writer
from nriplugin.policy.model import Policy
from testkit.kernel_tree import resctrl_tree, sys_tree, v1_tree, v2_tree

POD_FS = "/kubepods/burstable/pod1234"
CTR_FS = "/kubepods/burstable/pod1234/abcd"
POD_SD = "kubepods-burstable-pod12_34.slice"
CTR_SD = "kubepods-burstable-pod12_34.slice:cri-containerd:abcd"


def test_paths_for_both_drivers() -> None:
    assert paths.relative(CTR_FS) == "kubepods/burstable/pod1234/abcd"
    assert paths.pod_dir(POD_SD) == "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12_34.slice"
    assert paths.container_dir(CTR_SD) == (
        "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12_34.slice/cri-containerd-abcd.scope"
    )
    assert paths.container_dir("", "/kubepods/pod1", "abcd") == "kubepods/pod1/abcd"


@pytest.mark.parametrize(
    "bad",
    [
        "/kubepods/../../etc",
        "/kubepods/./x",
        "../x",
        "/kubepods/a b",
        "/kubepods/x\0y",
        "",
        "a" * 5000,
        "kubepods--x.slice",
        "-kubepods.slice",
        "kubepods.slice:cri-containerd:../../x",
        "/kubepods/%2e%2e/x",
        "/kubepods/x\ny",
    ],
)
def test_hostile_paths_are_refused(bad: str) -> None:
    with pytest.raises(paths.BadCgroupPath):
        paths.container_dir(bad)


@given(st.integers(2, 262144))
def test_shares_weight_round_trip(shares: int) -> None:
    w = shares_to_weight(shares)
    assert 1 <= w <= 10000
    back = weight_to_shares(w)
    assert shares_to_weight(back) == w  # the inverse lands in the same weight bucket
    assert abs(back - shares) <= 27


@given(st.integers(2, 262143))
def test_shares_to_weight_is_monotonic(shares: int) -> None:
    assert shares_to_weight(shares) <= shares_to_weight(shares + 1)


def test_v1_write_read_and_validation(tmp_path: Path) -> None:
    root = v1_tree(tmp_path, ["kubepods/burstable/pod1234/abcd"])
    reported: list[tuple[str, str]] = []
    cg = Cgroups(root, on_unsupported=lambda r, why: reported.append((r, why)))
    assert cg.version is Version.V1
    g = paths.container_dir(CTR_FS)
    assert cg.write(g, "cpu.shares", 2).status == "written"
    assert (root / "cpu" / g / "cpu.shares").read_text() == "2"
    assert cg.read(g, "cpu.shares") == 2
    assert cg.write(g, "cpu.shares", 2).status == "unchanged"
    assert cg.write(g, "cpu.cfs_quota_us", -1).status == "unchanged"
    for resource, value in (
        ("cpu.shares", 1),
        ("cpu.shares", 10**9),
        ("cpu.cfs_quota_us", 5),
        ("cpu.shares", "2"),
        ("cpu.shares", True),
        ("cpu.bvt_warp_ns", 3),
        ("cpuset.cpus", "0\n1"),
    ):
        with pytest.raises(InvalidValue):
            cg.write(g, resource, value)
    # The kernel has no bvt: unsupported, reported once, never written again.
    assert cg.write(g, "cpu.bvt_warp_ns", 2).status == "unsupported"
    assert cg.write(g, "cpu.bvt_warp_ns", 1).status == "unsupported"
    assert [r for r, _ in reported] == ["cpu.bvt_warp_ns"]
    assert not (root / "cpu" / g / "cpu.bvt_warp_ns").exists()
    assert cg.write("kubepods/gone", "cpu.shares", 2).status == "missing"
    assert cg.write(g, "memory.oom.group", 1).status == "unsupported"  # no v1 file at all


def test_writes_never_leave_the_root(tmp_path: Path) -> None:
    root = v1_tree(tmp_path / "cg", ["kubepods"])
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "cpu.shares").write_text("1024")
    (root / "cpu" / "kubepods" / "evil").symlink_to(outside)
    cg = Cgroups(root)
    with pytest.raises(PermissionError):
        cg.write("kubepods/evil", "cpu.shares", 2)
    assert (outside / "cpu.shares").read_text() == "1024"
    # A file that is itself a link is refused by O_NOFOLLOW.
    (root / "cpu" / "kubepods" / "cpu.shares").unlink()
    (root / "cpu" / "kubepods" / "cpu.shares").symlink_to(outside / "cpu.shares")
    with pytest.raises(PermissionError):
        cg.write("kubepods", "cpu.shares", 2)
    assert (outside / "cpu.shares").read_text() == "1024"


def test_a_forgotten_group_is_checked_again_when_it_comes_back(tmp_path: Path) -> None:
    """Paths are checked once and cached; forget() (the pod left) drops a group's cached paths
    and the resolution of its directory, so a new group under the same name - here a link out
    of the root - is checked again and refused, in every controller."""
    import shutil

    root = v1_tree(tmp_path / "cg", ["kubepods", "kubepods/pod1", "kubepods/pod1/c1"])
    outside = tmp_path / "outside"
    (outside / "c1").mkdir(parents=True)
    (outside / "c1" / "cpu.shares").write_text("1024")
    (outside / "c1" / "memory.limit_in_bytes").write_text("1")
    cg = Cgroups(root)
    for ctrl in ("cpu", "memory"):
        cg.group_path("kubepods/pod1", ctrl)
        cg.group_path("kubepods/pod1/c1", ctrl)  # resolving it remembers its parent's resolution
    for ctrl in ("cpu", "memory"):  # the pod goes; another takes its name, as a link outside
        shutil.rmtree(root / ctrl / "kubepods" / "pod1")
        (root / ctrl / "kubepods" / "pod1").symlink_to(outside)
    cg.forget("kubepods/pod1/c1")
    cg.forget("kubepods/pod1")
    cg.forget("kubepods/never-looked-up")  # nothing cached: nothing to drop, no error
    for ctrl, resource in (("cpu", "cpu.shares"), ("memory", "memory.limit_in_bytes")):
        with pytest.raises(PermissionError):
            cg.group_path("kubepods/pod1", ctrl)
        with pytest.raises(PermissionError):
            cg.write("kubepods/pod1/c1", resource, 4096 if ctrl == "memory" else 2)
    assert (outside / "c1" / "cpu.shares").read_text() == "1024"


def test_a_root_of_slash_names_paths_from_slash() -> None:
    cg = Cgroups(Path("/"), version=Version.V1)
    assert cg.group_path("kubepods", "cpu", checked=False) == "/cpu/kubepods"
    v2 = Cgroups(Path("/"), version=Version.V2)
    assert v2.group_path("kubepods", checked=False) == "/kubepods" and v2.group_path("", checked=False) == "/"


def test_v2_names_and_conversions(tmp_path: Path) -> None:
    g = paths.container_dir(CTR_SD)
    root = v2_tree(tmp_path, ["kubepods.slice", g])
    cg = Cgroups(root)
    assert cg.version is Version.V2
    assert cg.write(g, "cpu.shares", 2).status == "written"
    assert (root / g / "cpu.weight").read_text() == "1"
    assert cg.read(g, "cpu.shares") == 2
    cg.write(g, "cpu.cfs_quota_us", 50000, period=100000)
    assert (root / g / "cpu.max").read_text() == "50000 100000"
    assert cg.read(g, "cpu.cfs_quota_us") == 50000 and cg.read(g, "cpu.cfs_period_us") == 100000
    cg.write(g, "cpu.cfs_quota_us", -1)
    assert (root / g / "cpu.max").read_text() == "max 100000" and cg.read(g, "cpu.cfs_quota_us") == -1
    cg.write(g, "memory.limit_in_bytes", -1)
    assert (root / g / "memory.max").read_text().strip() == "max"
    cg.write(g, "cpu.cfs_burst_us", 20000)
    assert (root / g / "cpu.max.burst").read_text() == "20000"
    assert cg.write(g, "memory.oom.group", 1).status == "written"
    assert cg.read(g, "blkio.weight") == 10  # io.weight "default 100"
    assert cg.supported("memory.min") and not cg.supported("cpu.bvt_warp_ns")


def test_probe_on_a_fake_node(tmp_path: Path) -> None:
    caps = probe(
        cgroup_root=v1_tree(tmp_path / "cg", ["kubepods"]),
        resctrl_root=resctrl_tree(tmp_path / "resctrl"),
        proc_root=tmp_path / "proc",
        sys_root=sys_tree(tmp_path / "sys", cores=4, smt=2, numa_nodes=2),
        core_sched=False,
    )
    assert caps.cgroup_version is Version.V1
    assert caps.controllers == ["blkio", "cpu", "cpuset", "memory", "pids"]
    assert caps.files["cpu.cfs_burst_us"] and not caps.files["cpu.bvt_warp_ns"]
    assert caps.resctrl.mounted and caps.resctrl.l3_closids == 16 and caps.resctrl.cache_ways == 11
    assert caps.resctrl.mb_granularity == 10
    assert not caps.psi
    t = caps.topology
    assert t.online == list(range(8)) and t.smt and t.siblings[1] == [1, 5]
    assert t.numa[0] == 0 and t.numa[3] == 1 and t.numa[7] == 1


@given(st.sets(st.integers(0, 200), max_size=40))
def test_cpulist_round_trip(cpus: set[int]) -> None:
    assert parse_cpulist(format_cpulist(cpus)) == sorted(cpus)


@pytest.mark.parametrize("bad", ["a", "3-1", "-1", "1,,2", "0-999999"])
def test_bad_cpulists(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_cpulist(bad)


REAL = Path("/sys/fs/cgroup")


@pytest.fixture
def real_cpu_group() -> Iterator[tuple[str, Path]]:
    """A group of its own in this machine's real cpu controller (its name and directory),
    removed afterwards."""
    group = f"nriplugin-test-{os.getpid()}"
    d = REAL / "cpu" / group
    d.mkdir()
    try:
        yield group, d
    finally:
        d.rmdir()


@pytest.mark.skipif(os.geteuid() != 0 or not (REAL / "cpu" / "cpu.shares").exists(), reason="needs root + cgroup v1")
def test_real_cgroup_v1(real_cpu_group: tuple[str, Path]) -> None:
    """On this machine's real cpu controller: writes land, read back, match, and nothing is left
    behind."""
    group, d = real_cpu_group
    cg = Cgroups(REAL)
    assert cg.write(group, "cpu.shares", 3).status == "written"
    assert (d / "cpu.shares").read_text().strip() == "3"
    assert cg.write(group, "cpu.cfs_quota_us", 20000).status == "written"
    assert cg.read(group, "cpu.cfs_quota_us") == 20000
    assert cg.matches(group, "cpu.cfs_quota_us", 20000) and not cg.matches(group, "cpu.cfs_quota_us", 30000)
    assert cg.write(group, "cpu.bvt_warp_ns", 1).status == "unsupported"  # not an Anolis kernel


@pytest.mark.skipif(os.geteuid() != 0 or not (REAL / "cpu" / "cpu.idle").exists(), reason="needs root + v1 cpu.idle")
def test_real_cgroup_v1_idle_group_keeps_the_kernels_idle_weight(real_cpu_group: tuple[str, Path]) -> None:
    """A v1 group with cpu.idle 1 (kernel 5.15 and later) reads its cpu.shares as 3 and refuses
    any weight written: the lowest weight wanted there is in place, the refusal is no error.
    cpu.idle 0 resets the weight to 1024, which is drift again."""
    group, d = real_cpu_group
    cg = Cgroups(REAL)
    assert cg.write(group, "cpu.shares", 2).status == "written"
    assert cg.write(group, "cpu.idle", 1).status == "written"
    assert (d / "cpu.shares").read_text().strip() == "3"
    assert cg.matches(group, "cpu.shares", 2)
    out = cg.write(group, "cpu.shares", 2)
    assert (out.status, out.errno) == ("unchanged", errno.EINVAL)
    assert out.detail == f"{d}: cpu.idle=1, the kernel keeps its weight"
    assert cg.write(group, "cpu.shares", 512).status == "unchanged"  # any weight: the kernel's word
    assert "cpu.shares" not in cg.unsupported
    assert cg.write(group, "cpu.idle", 0).status == "written"
    assert (d / "cpu.shares").read_text().strip() == "1024"
    assert not cg.matches(group, "cpu.shares", 2) and not cg.matches(group, "cpu.shares", 3)
    assert cg.write(group, "cpu.shares", 2).status == "written"


def test_an_idle_weight_is_known_by_cpu_idle_on_v1_and_by_the_weight_on_v2(tmp_path: Path) -> None:
    """Where the kernel refuses every weight written (an idle group), the refusal is no error:
    v1 tells by the group's ``cpu.idle``, v2 by its weight reading 0. A file that cannot be read
    tells nothing: not idle."""
    from nriplugin.kernel.cgroup import _idle_flag

    g = tmp_path / "g"
    g.mkdir()
    (g / "cpu.shares").write_text("3\n")
    assert not _idle_flag(g / "cpu.shares")  # no cpu.idle beside it
    for flag, idle in (("1", True), ("0", False)):
        (g / "cpu.idle").write_text(flag + "\n")
        assert _idle_flag(g / "cpu.shares") is idle
    v1 = Cgroups(v1_tree(tmp_path / "v1", ["a"]))
    assert v1._idle_weight("cpu.shares", g / "cpu.shares") is False  # cpu.idle 0 above
    assert v1._idle_weight("cpu.cfs_quota_us", g / "cpu.shares") is False  # only a weight is kept so
    v2 = Cgroups(v2_tree(tmp_path / "v2", ["a"]))
    weight = tmp_path / "v2" / "a" / "cpu.weight"
    for text, idle in (("0", True), ("1", False), ("100", False)):
        weight.write_text(text + "\n")
        assert v2._idle_weight("cpu.shares", weight) is idle
    assert v2._idle_weight("cpu.shares", tmp_path / "v2" / "gone" / "cpu.weight") is False


def test_a_v2_tree_without_groups_is_probed_once_for_a_new_groups_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nriplugin.kernel import cgroup

    probes: list[Path] = []

    def probe_child(root: Path) -> frozenset[str]:
        probes.append(root)
        return frozenset({"cpu.max", "cpu.weight"})

    monkeypatch.setattr(cgroup, "_probe_child", probe_child)
    cg = Cgroups(v2_tree(tmp_path / "v2"))
    assert cg.supported("cpu.cfs_quota_us") and cg.supported("cpu.shares")
    assert not cg.supported("memory.limit_in_bytes")
    assert probes == [tmp_path / "v2"]


def test_the_probe_group_that_cannot_be_removed_is_left_without_an_error(tmp_path: Path) -> None:
    """A probe group of the same name already there (and not empty): its files are the answer,
    and failing to remove it is not an error."""
    from nriplugin.kernel.cgroup import _probe_child

    left = tmp_path / f"nriplugin-probe-{os.getpid()}"
    left.mkdir()
    (left / "cpu.max").write_text("max 100000\n")
    assert _probe_child(tmp_path) == frozenset({"cpu.max"})
    assert left.is_dir()


def test_inotify_usage_counts_our_watches_against_the_user_limit(tmp_path: Path) -> None:
    from nriplugin.kernel.inotify import Inotify, usage, watches_of

    before = watches_of(os.getpid())
    ino = Inotify()
    try:
        for i in range(25):
            (tmp_path / str(i)).mkdir()
            ino.add(str(tmp_path / str(i)))
        assert watches_of(os.getpid()) == before + 25
        u = usage()
        limit = int(Path("/proc/sys/fs/inotify/max_user_watches").read_text())
        assert u["maxUserWatches"] == limit and u["watches"] >= 25
        assert u["watchHeadroom"] == limit - u["watches"] and u["instances"] >= 1
        assert any(h["pid"] == os.getpid() and h["watches"] >= 25 for h in u["topHolders"]) or len(u["topHolders"]) == 3
    finally:
        ino.close()
    assert watches_of(os.getpid()) == before


@pytest.mark.skipif(
    os.geteuid() != 0 or not (REAL / "cpu" / "cpu.cfs_burst_us").exists(),
    reason="needs root + cgroup v1 with CFS burst",
)
def test_real_burst_above_quota_is_rejected_not_unsupported() -> None:
    """The kernel's own EINVAL for a burst above the quota: 'rejected' (the feature exists)."""
    group = f"nriplugin-test-burst-{os.getpid()}"
    d = REAL / "cpu" / group
    d.mkdir()
    try:
        cg = Cgroups(REAL)
        assert cg.write(group, "cpu.cfs_quota_us", 20000).status == "written"
        assert cg.write(group, "cpu.cfs_burst_us", 10000).status == "written"
        bad = cg.write(group, "cpu.cfs_burst_us", 50000)
        assert bad.status == "rejected" and bad.errno == 22
        assert "cpu.cfs_burst_us" not in cg.unsupported and cg.read(group, "cpu.cfs_burst_us") == 10000
    finally:
        d.rmdir()


@pytest.mark.skipif(
    os.geteuid() != 0 or not (REAL / "cpu" / "cpu.cfs_burst_us").exists(),
    reason="needs root + cgroup v1 with CFS burst",
)
def test_real_resize_the_burst_waits_for_the_runtimes_quota_then_lands() -> None:
    """A resize raised the limit: the burst worked out from the new quota is held while the
    old quota is in force (no EINVAL from the kernel), and written once the runtime wrote it."""
    group = f"nriplugin-test-resize-{os.getpid()}"
    d = REAL / "cpu" / group
    d.mkdir()
    try:
        cg = Cgroups(REAL)
        w = Writer(cg, Policy)
        assert cg.write(group, "cpu.cfs_quota_us", 50000).status == "written"
        rejected: list[str] = []
        w.on_invalid = rejected.append
        out = w.apply(group, [Setting("cpu.cfs_burst_us", 100000, "from the new quota")], "ctr")
        assert [r.status for _, r in out] == ["held"] and cg.read(group, "cpu.cfs_burst_us") == 0
        assert cg.write(group, "cpu.cfs_quota_us", 100000).status == "written"  # the runtime's
        out = w.apply(group, [Setting("cpu.cfs_burst_us", 100000, "from the new quota")], "ctr")
        assert [r.status for _, r in out] == ["written"] and cg.read(group, "cpu.cfs_burst_us") == 100000
        assert rejected == []
    finally:
        d.rmdir()


def test_what_differs_between_hierarchies_is_asked_of_the_kernel_layer(tmp_path: Path) -> None:
    """The hook adapter, the reconciler and eviction ask these; none compares versions."""
    assert Version.V2.unified and not Version.V1.unified
    assert Version.V1.parent_caps_quota and not Version.V2.parent_caps_quota
    assert Version.V1.controllers == ("cpu", "cpuset", "memory", "blkio") and Version.V2.controllers == ("",)
    v1, v2 = Cgroups(tmp_path, version=Version.V1), Cgroups(tmp_path, version=Version.V2)
    assert v1.unified_entry("cpu.cfs_quota_us", 50000) is None
    assert v2.unified_entry("cpu.cfs_quota_us", 50000) == ("cpu.max", "50000 100000")
    assert v2.unified_entry("no.such.file", 1) is None
    assert v2.weight_to_learn and not v1.weight_to_learn
    assert v1.hierarchy is Version.V1


@pytest.mark.parametrize(
    ("groups", "found"),
    [
        (["kubepods", "kubepods/besteffort", "system.slice"], ["kubepods"]),
        (["kubepods.slice", "kubepods.slice/kubepods-besteffort.slice"], ["kubepods.slice"]),
        # kind: the kubelet's cgroupRoot /kubelet with the systemd driver, and with cgroupfs
        (
            ["system.slice", "kubelet.slice", "kubelet.slice/kubelet-kubepods.slice"],
            ["kubelet.slice/kubelet-kubepods.slice"],
        ),
        (["kubelet", "kubelet/kubepods", "kubelet/kubepods/burstable"], ["kubelet/kubepods"]),
        (["system.slice", "user.slice", "kubelet.slice"], []),  # no pods group yet
    ],
)
@pytest.mark.parametrize("version", [Version.V1, Version.V2])
def test_the_pods_roots_are_found_where_the_kubelet_put_them(
    tmp_path: Path, version: Version, groups: list[str], found: list[str]
) -> None:
    tree = v1_tree(tmp_path, groups) if version is Version.V1 else v2_tree(tmp_path, groups)
    assert Cgroups(tree, version=version).pods_roots() == found
