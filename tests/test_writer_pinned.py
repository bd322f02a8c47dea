"""The one writer pinned at its boundaries (the kept mutation score): the order of quota and
burst in one group (a rise, an equal value and a lift go first), whether a batch raises a
group's bandwidth (strictly, per period, with the kernel's default period), and what
:meth:`Writer.apply` reports for each value: written, refused, missing, rejected by the kernel."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from nriplugin.intent.core import BURST, PERIOD, QUOTA, Intent, Setting
from nriplugin.kernel.cgroup import Cgroups
from nriplugin.kernel.coresched import CoreSched
from nriplugin.kernel.probe import resctrl
from nriplugin.kernel.resctrl import ResctrlFS
from nriplugin.node.writer import Writer, children_first, depth, parents_first, period_of
from nriplugin.policy.model import Policy
from testkit.kernel_tree import resctrl_tree, v1_tree, v2_tree
from tests.test_coresched import Kernel

G = "kubepods/besteffort/pod1"


def quota(v: int | str) -> Setting:
    return Setting(QUOTA, v, "q")


def burst(v: int) -> Setting:
    return Setting(BURST, v, "b")


def period(v: int | str) -> Setting:
    return Setting(PERIOD, v, "p")


def writer_v1(tmp_path: Path, q: str = "-1", p: str | None = "100000") -> Writer:
    root = v1_tree(tmp_path, [G])
    (root / "cpu" / G / "cpu.cfs_quota_us").write_text(q + "\n")
    if p is None:
        (root / "cpu" / G / "cpu.cfs_period_us").unlink()
    else:
        (root / "cpu" / G / "cpu.cfs_period_us").write_text(p + "\n")
    return Writer(Cgroups(root), Policy)


# --- the order across groups -------------------------------------------------------------------


def test_depth_counts_the_components_below_the_root() -> None:
    assert depth("") == 0 and depth("/") == 0 and depth("kubepods") == 0
    assert depth("/kubepods/besteffort/") == 1 and depth("a/b/c") == 2 and depth("a/X") == 1


def test_children_first_and_parents_first_break_ties_by_key() -> None:
    groups = {"k1": "a", "k2": "a/b", "k3": "a/b/c", "k0": "x/y"}
    assert children_first(groups, groups.__getitem__) == ["k3", "k0", "k2", "k1"]
    assert parents_first(groups, groups.__getitem__) == ["k1", "k0", "k2", "k3"]


def test_period_of_takes_the_first_integer_period() -> None:
    assert period_of([quota(5000), period(50000)]) == 50000
    assert period_of([quota(5000)]) is None
    assert period_of([period("50000"), period(20000)]) == 20000  # a text value is no period


# --- the order in one group ------------------------------------------------------------------


def test_settings_without_quota_and_burst_are_sorted_by_key(tmp_path: Path) -> None:
    w = writer_v1(tmp_path, q="50000")
    shares = Setting("cpu.shares", 2, "s")
    assert w.order(G, [shares, quota(20000)]) == [quota(20000), shares]
    assert w.order(G, [burst(1000), shares]) == [burst(1000), shares]
    assert w.order(G, [shares, quota("x"), burst(1000)]) == [burst(1000), quota("x"), shares]
    rbps = "blkio.throttle.read_bps_device"
    sdb, sda = Setting(rbps, 100, "r", device="8:16"), Setting(rbps, 200, "r", device="8:0")
    assert w.order(G, [sdb, sda]) == [sda, sdb]  # by resource and device, not by value


@pytest.mark.parametrize(
    ("held", "want", "quota_first"),
    [
        ("50000", 60000, True),  # a rise: the quota first, so the burst fits under it
        ("50000", 50000, True),  # equal: the burst is checked against the same quota either way
        ("50000", 49999, False),  # a fall: the burst first, so it is never above the quota
        ("-1", 50000, False),  # from no limit: the burst (under any quota) first
        ("50000", -1, True),  # lifting the limit: first
        ("-1", -1, True),
    ],
)
def test_quota_and_burst_go_in_the_order_the_kernel_accepts(
    tmp_path: Path, held: str, want: int, quota_first: bool
) -> None:
    w = writer_v1(tmp_path, q=held)
    shares = Setting("cpu.shares", 2, "s")
    out = w.order(G, [shares, burst(1000), quota(want)])
    assert out == ([quota(want), burst(1000), shares] if quota_first else [burst(1000), quota(want), shares])


def test_a_group_without_a_quota_file_takes_the_burst_first(tmp_path: Path) -> None:
    w = writer_v1(tmp_path)
    (tmp_path / "cpu" / G / "cpu.cfs_quota_us").unlink()
    assert w.order(G, [quota(50000), burst(1000)]) == [burst(1000), quota(50000)]


# --- whether a batch raises a group's bandwidth ---------------------------------------------------


@pytest.mark.parametrize(
    ("held", "held_period", "settings", "rises"),
    [
        ("50000", "100000", [Setting("cpu.shares", 2, "s")], False),  # no quota set
        ("50000", "100000", [quota("50000")], False),  # not an integer quota
        ("-1", "100000", [quota(20000)], False),  # no limit now
        (str(2**62), "100000", [quota(2**62 + 5)], False),  # at 2^62: no limit either
        (str(2**62 - 1), "100000", [quota(2**62)], True),
        ("50000", "100000", [quota(-1)], True),  # lifting a limit
        ("0", "100000", [quota(1000)], True),  # above a held 0
        ("50000", "100000", [quota(0)], False),  # 0 is no lift
        ("50000", "100000", [quota(50000)], False),  # equal: not a rise
        ("50000", "100000", [quota(50001)], True),
        ("50000", "100000", [quota(25000), period(50000)], False),  # the same bandwidth
        ("50000", "100000", [quota(25001), period(50000)], True),
        ("100000", "200000", [quota(60000)], False),  # the group's own period: 0.3 < 0.5 cores
        ("100000", "200000", [quota(60000), period(100000)], True),  # 0.6 > 0.5 cores
        ("50000", None, [quota(60000), period(120000)], False),  # no period file: 100000
        ("50000", "0", [quota(60000), period(120000)], False),  # nor a 0 period
        ("50000", "0", [quota(60001), period(120000)], True),
        ("50000", "1", [quota(60000), period(2)], False),  # any positive period is the group's
        ("50000", "junk", [quota(60000), period(120000)], False),  # nor an unreadable one
        ("50000", None, [quota(60001), period(120000)], True),
    ],
)
def test_quota_rises_strictly_per_period(
    tmp_path: Path, held: str, held_period: str | None, settings: list[Setting], rises: bool
) -> None:
    w = writer_v1(tmp_path, q=held, p=held_period)
    assert w.quota_rises(G, settings) is rises


def test_quota_rises_is_false_for_a_group_it_cannot_read(tmp_path: Path) -> None:
    w = writer_v1(tmp_path, q="junk")
    assert w.quota_rises(G, [quota(-1)]) is False
    assert w.quota_rises("kubepods/gone", [quota(-1)]) is False


# --- what apply reports ----------------------------------------------------------------------------


def test_apply_writes_in_order_and_tells_what_the_kernel_took(tmp_path: Path) -> None:
    w = writer_v1(tmp_path, q="50000")
    written: list[tuple[str, str]] = []
    w.on_written = lambda g, r: written.append((g, r))
    out = w.apply(G, [Setting("cpu.shares", 1024, "s"), burst(1000), quota(20000)], "pod1")
    assert [(s.resource, r.status) for s, r in out] == [
        (BURST, "written"),
        (QUOTA, "written"),
        ("cpu.shares", "unchanged"),
    ]
    assert written == [(G, BURST), (G, QUOTA)]  # not the unchanged one
    assert (tmp_path / "cpu" / G / "cpu.cfs_quota_us").read_text() == "20000"
    out = w.apply(G, [quota(20000)], "pod1", force=True)
    assert [r.status for _, r in out] == ["written"] and written[-1] == (G, QUOTA)
    out = w.apply(G, [burst(1000), quota(30000)], "pod1")  # a rise over the group's 20000: quota first
    assert [s.resource for s, _ in out] == [QUOTA, BURST]


def test_a_burst_without_its_quota_waits_while_above_the_quota_in_force(tmp_path: Path) -> None:
    """A resize raised the limit; the runtime has not written the new quota yet: the burst
    worked out from it is held ("held", nothing written), not refused by the kernel."""
    w = writer_v1(tmp_path, q="50000")
    b = tmp_path / "cpu" / G / "cpu.cfs_burst_us"
    b.write_text("0\n")
    out = w.apply(G, [burst(50001), Setting("cpu.shares", 2, "s")], "pod1")
    assert [(s.resource, r.status) for s, r in out] == [(BURST, "held"), ("cpu.shares", "written")]
    assert b.read_text() == "0\n"
    assert [r.status for _, r in w.apply(G, [burst(50000)], "pod1")] == ["written"]  # at the quota: taken
    assert [r.status for _, r in w.apply(G, [burst(90000), quota(90000)], "pod1")] == ["written", "written"]
    assert [r.status for _, r in w.apply(G, [burst(10**9)], "pod1")[:1]] == ["held"]
    (tmp_path / "cpu" / G / "cpu.cfs_quota_us").write_text("-1\n")  # no limit: nothing to wait for
    assert [r.status for _, r in w.apply(G, [burst(10**9)], "pod1")] == ["written"]


def test_apply_without_on_written_still_writes(tmp_path: Path) -> None:
    w = writer_v1(tmp_path)
    assert [r.status for _, r in w.apply(G, [quota(20000)], "pod1")] == ["written"]


def test_apply_takes_the_period_from_the_settings_on_v2(tmp_path: Path) -> None:
    root = v2_tree(tmp_path, [G])
    w = Writer(Cgroups(root), Policy)
    w.apply(G, [quota(20000), period(50000)], "pod1")
    assert (root / G / "cpu.max").read_text() == "20000 50000"
    w.apply(G, [quota(30000)], "pod1", period=40000)
    assert (root / G / "cpu.max").read_text() == "30000 40000"
    w.apply(G, [quota(10000), period(50000)], "pod1", period=20000)  # the caller's period wins
    assert (root / G / "cpu.max").read_text() == "10000 20000"


def test_a_refused_value_is_counted_said_and_the_rest_written(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    w = writer_v1(tmp_path)
    reasons: list[str] = []
    w.on_invalid = reasons.append
    q = tmp_path / "cpu" / G / "cpu.cfs_quota_us"
    q.unlink()
    q.symlink_to(tmp_path / "elsewhere")  # never followed: refused
    with caplog.at_level(logging.WARNING, "nriplugin.node.writer"):
        out = w.apply(G, [Setting("cpu.shares", 2, "s"), quota(20000)], "ns/pod")
    assert [(s.resource, r.status) for s, r in out] == [("cpu.shares", "written")]  # the next goes on
    assert reasons == ["write_refused"]
    assert [r.getMessage() for r in caplog.records] == [
        f"ns/pod: not writing cpu.cfs_quota_us: refusing {q}: a symbolic link"
    ]
    assert not (tmp_path / "elsewhere").exists()


def test_a_missing_group_is_reported_not_warned(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    w = writer_v1(tmp_path)
    with caplog.at_level(logging.DEBUG, "nriplugin.node.writer"):
        out = w.apply("kubepods/gone", [quota(20000)], "ns/pod")
    assert [r.status for _, r in out] == ["missing"]
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.DEBUG, "ns/pod: cpu.cfs_quota_us: cgroup kubepods/gone does not exist")
    ]


REAL = Path("/sys/fs/cgroup")


@pytest.mark.skipif(os.geteuid() != 0 or not (REAL / "cpu" / "cpu.shares").exists(), reason="needs root + cgroup v1")
def test_a_value_the_kernel_rejects_is_warned_with_its_errno(caplog: pytest.LogCaptureFixture) -> None:
    """On this machine's real cpu controller: a child's quota above its parent's is refused."""
    parent = f"nriplugin-writer-{os.getpid()}"
    child = f"{parent}/c"
    (REAL / "cpu" / child).mkdir(parents=True)
    try:
        cg = Cgroups(REAL)
        assert cg.write(parent, QUOTA, 20000).status == "written"
        w = Writer(cg, Policy)
        with caplog.at_level(logging.WARNING, "nriplugin.node.writer"):
            out = w.apply(child, [quota(50000)], "ns/pod")
        assert [r.status for _, r in out] == ["rejected"]
        (rec,) = caplog.records
        assert rec.getMessage().startswith("ns/pod: cpu.cfs_quota_us rejected: Invalid argument writing '50000'")
        assert (rec.resource, rec.errno) == (QUOTA, 22)  # type: ignore[attr-defined]
    finally:
        (REAL / "cpu" / child).rmdir()
        (REAL / "cpu" / parent).rmdir()


@pytest.mark.skipif(os.geteuid() != 0 or not (REAL / "cpu" / "cpu.shares").exists(), reason="needs root + cgroup v1")
def test_a_falling_quota_lowers_the_groups_under_it_first(caplog: pytest.LogCaptureFixture) -> None:
    """On this machine's real cpu controller: groups the writer was never asked about, under the
    group it cuts, are lowered first (deepest first, each at its own period), so the cut is not
    refused; those at or under the new bandwidth, or unlimited, keep what they have."""
    parent = f"nriplugin-room-{os.getpid()}"
    values = {  # group: (quota, period) before; the cut is 30000 per 100000 (0.3 cores)
        "a": (80000, 100000),
        "a/deep": (60000, 100000),
        "b": (-1, 100000),
        "b/half": (45000, 50000),  # 0.9 cores at a 50 ms period: 15000 after
        "c": (30000, 100000),  # exactly the new bandwidth: kept
        "d": (20000, 100000),
    }
    made = [parent, *(f"{parent}/{g}" for g in values)]
    for g in made:
        (REAL / "cpu" / g).mkdir()
    try:
        for g, (q, p) in values.items():
            (REAL / "cpu" / parent / g / "cpu.cfs_period_us").write_text(str(p))
            (REAL / "cpu" / parent / g / "cpu.cfs_quota_us").write_text(str(q))
        (REAL / "cpu" / parent / "a" / "cpu.cfs_burst_us").write_text("50000")  # the kernel: burst <= quota
        w = Writer(Cgroups(REAL), Policy)
        with caplog.at_level(logging.INFO, "nriplugin.node.writer"):
            out = w.apply(parent, [quota(30000)], "besteffort")
        assert [r.status for _, r in out] == ["written"]
        have = {g: int((REAL / "cpu" / parent / g / "cpu.cfs_quota_us").read_text()) for g in values}
        assert have == {"a": 30000, "a/deep": 30000, "b": -1, "b/half": 15000, "c": 30000, "d": 20000}
        assert (REAL / "cpu" / parent / "a" / "cpu.cfs_burst_us").read_text().strip() == "30000"
        assert all(r.levelno == logging.INFO for r in caplog.records)
        said = sorted((r.group, r.old, r.new) for r in caplog.records)  # type: ignore[attr-defined]
        assert said == [
            (f"{parent}/a", 80000, 30000),
            (f"{parent}/a/deep", 60000, 30000),
            (f"{parent}/b/half", 45000, 15000),
        ]
        assert caplog.records[0].getMessage() == (
            f"besteffort: lowered {parent}/a/deep's cpu.cfs_quota_us from 60000 to 30000 first: cgroup v1 refuses"
            " a group's quota below a descendant's"
        )
    finally:
        for g in reversed(made):
            (REAL / "cpu" / g).rmdir()


def v1_groups(tmp_path: Path, groups: dict[str, tuple[int, int]]) -> Path:
    """A v1 tree with ``G`` (quota -1, period 100000) and groups under it: name -> (quota, period)."""
    root = v1_tree(tmp_path, [G, *(f"{G}/{g}" for g in groups)])
    for g, (q, p) in groups.items():
        (root / "cpu" / G / g / "cpu.cfs_quota_us").write_text(f"{q}\n")
        (root / "cpu" / G / g / "cpu.cfs_period_us").write_text(f"{p}\n")
    return root


def quotas(root: Path, *groups: str) -> list[str]:
    return [(root / "cpu" / G / g / "cpu.cfs_quota_us").read_text().strip() for g in groups]


def test_fit_descendants_lowers_deepest_first_past_groups_already_within(tmp_path: Path) -> None:
    """Bottom-up: a group within the new bandwidth (``c/ok``, exactly at it) or unlimited
    (``c/free``) is passed over, not the end of the walk; the group itself is never written."""
    root = v1_groups(tmp_path, {"c": (150000, 100000), "c/ok": (30000, 100000), "c/free": (-1, 100000)})
    (root / "cpu" / G / "cpu.cfs_quota_us").write_text("70000\n")
    assert Cgroups(root).fit_descendants(G + "/", 30000, 100000) == [(f"{G}/c", 150000, 30000)]
    assert quotas(root, "c", "c/ok", "c/free") == ["30000", "30000", "-1"]
    assert (root / "cpu" / G / "cpu.cfs_quota_us").read_text() == "70000\n"


def test_fit_descendants_reads_nothing_for_a_group_without_descendants(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A container's group (a leaf: every BE container's start on v1 writes its quota) costs
    one listing: not its own period, not its own quota."""
    root = v1_tree(tmp_path, [G])
    cg = Cgroups(root)
    opened: list[str] = []
    real_open = os.open

    def counted(path: str, *args: int) -> int:
        opened.append(path)
        return real_open(path, *args)

    monkeypatch.setattr(os, "open", counted)
    assert cg.fit_descendants(G, 20000) == []
    assert opened == []


def test_fit_descendants_never_goes_under_the_kernels_1ms(tmp_path: Path) -> None:
    root = v1_groups(tmp_path, {"c1": (50000, 100000), "c2": (1000, 100000)})
    (root / "cpu" / G / "cpu.cfs_period_us").write_text("1000000\n")
    cg = Cgroups(root)
    assert cg.fit_descendants(G, 1000) == [(f"{G}/c1", 50000, 1000)]  # 0.1 ms per 100 ms: 1 ms
    assert quotas(root, "c1", "c2") == ["1000", "1000"]
    (root / "cpu" / G / "c1" / "cpu.cfs_quota_us").write_text("50000\n")
    assert cg.fit_descendants(G, 999, 100000) == []  # the kernel's to refuse: nothing is moved for it
    assert quotas(root, "c1") == ["50000"]


def test_fit_descendants_uses_the_groups_own_period_when_none_is_given(tmp_path: Path) -> None:
    root = v1_groups(tmp_path, {"c": (80000, 100000)})
    period = root / "cpu" / G / "cpu.cfs_period_us"
    period.write_text("50000\n")
    assert Cgroups(root).fit_descendants(G, 20000) == [(f"{G}/c", 80000, 40000)]  # 0.4 cores
    for unusable in ("0", "-5"):  # no period the kernel has: its default, 100 ms
        period.write_text(unusable + "\n")
        (root / "cpu" / G / "c" / "cpu.cfs_quota_us").write_text("80000\n")
        assert Cgroups(root).fit_descendants(G, 20000) == [(f"{G}/c", 80000, 20000)]
    period.write_text("1\n")  # any positive period is the group's: 1 ms per 1 µs is no limit to c
    (root / "cpu" / G / "c" / "cpu.cfs_quota_us").write_text("80000\n")
    assert Cgroups(root).fit_descendants(G, 1000) == []


def test_fit_descendants_lowers_a_burst_above_the_new_quota_first(tmp_path: Path) -> None:
    groups = {g: (80000, 100000) for g in ("c", "d", "e", "f")}
    root = v1_groups(tmp_path, groups)
    (root / "cpu" / G / "c" / "cpu.cfs_burst_us").write_text("50000\n")
    (root / "cpu" / G / "d" / "cpu.cfs_burst_us").write_text("20000\n")  # under the new quota: kept
    (root / "cpu" / G / "e" / "cpu.cfs_burst_us").unlink()  # a kernel without burst
    (root / "cpu" / G / "f" / "cpu.cfs_burst_us").write_text("some\n")  # unreadable: the quota still goes
    assert len(Cgroups(root).fit_descendants(G, 30000, 100000)) == 4
    assert quotas(root, "c", "d", "e", "f") == ["30000"] * 4
    assert (root / "cpu" / G / "c" / "cpu.cfs_burst_us").read_text() == "30000"
    assert (root / "cpu" / G / "d" / "cpu.cfs_burst_us").read_text() == "20000\n"


def test_fit_descendants_passes_over_groups_it_cannot_read_or_write(tmp_path: Path) -> None:
    """Deepest first, so each odd group below is met before the one above it that can be lowered."""
    root = v1_groups(tmp_path, {"a": (50000, 100000), "b": (50000, 100000), "c": (50000, 100000)})
    for name, odd in (("a/odd", "cpu.cfs_quota_us"), ("b/odd", "cpu.cfs_period_us")):
        (root / "cpu" / G / name).mkdir()
        (root / "cpu" / G / name / odd).write_text("many\n")
        (
            root / "cpu" / G / name / ("cpu.cfs_period_us" if odd == "cpu.cfs_quota_us" else "cpu.cfs_quota_us")
        ).write_text("90000\n")
    (root / "cpu" / G / "c" / "gone").mkdir()  # no files: gone meanwhile
    (root / "cpu" / G / "c" / "ro").mkdir()  # its quota cannot be written (a directory stands in the file's place)
    (root / "cpu" / G / "c" / "ro" / "cpu.cfs_period_us").write_text("100000\n")
    (root / "cpu" / G / "c" / "ro" / "cpu.cfs_quota_us").mkdir()
    cg = Cgroups(root)
    assert cg.fit_descendants(G, -1, 100000) == []  # a lift needs no room
    assert sorted(cg.fit_descendants(G, 10000, 100000)) == [(f"{G}/{g}", 50000, 10000) for g in ("a", "b", "c")]
    assert (root / "cpu" / G / "a" / "odd" / "cpu.cfs_quota_us").read_text() == "many\n"


def test_fit_descendants_does_nothing_on_v2(tmp_path: Path) -> None:
    v2 = v2_tree(tmp_path, [G, f"{G}/c"])
    (v2 / G / "c" / "cpu.max").write_text("50000 100000\n")
    assert Cgroups(v2).fit_descendants(G, 10000, 100000) == []
    assert (v2 / G / "c" / "cpu.max").read_text() == "50000 100000\n"


def test_apply_makes_room_only_for_a_finite_quota(tmp_path: Path) -> None:
    w = writer_v1(tmp_path, q="90000")
    (tmp_path / "cpu" / G / "c").mkdir()
    child = tmp_path / "cpu" / G / "c" / "cpu.cfs_quota_us"
    child.write_text("90000\n")
    (tmp_path / "cpu" / G / "c" / "cpu.cfs_period_us").write_text("100000\n")
    w.apply(G, [quota(-1), Setting("cpu.shares", 4096, "s")], "be")  # no quota, and not a quota
    assert child.read_text() == "90000\n"
    w.apply(G, [quota(40000), period(50000)], "be")  # 0.8 cores at the new period, not 0.4 at the old
    assert child.read_text() == "80000"


# --- task groups ---------------------------------------------------------------------------------


def test_join_puts_a_new_containers_init_in_its_resctrl_group(tmp_path: Path) -> None:
    root = resctrl_tree(tmp_path / "resctrl")
    (root / "BE").mkdir()
    (root / "BE" / "tasks").write_text("")  # the kernel makes it with the group
    fs = ResctrlFS(root, resctrl(root))
    cg = v1_tree(tmp_path / "cg", [G])
    (cg / "cpu" / G / "tasks").write_text("11\n12\n")
    policy = Policy.model_validate({"resourceQOSStrategy": {"beClass": {"resctrlQOS": {"catRangeEndPercent": 30}}}})
    w = Writer(Cgroups(cg), lambda: policy, resctrl_fs=fs)
    intent = Intent(resctrl_group=Setting("resctrl.group", "BE", "r"))
    w.join(intent, G, 4242, "ns/pod")
    assert (root / "BE" / "tasks").read_text().split() == ["4242"]
    assert (root / "BE" / "schemata").read_text() == fs.schemata(0, 30, 100)
    w.join(intent, G, 0, "ns/pod")  # a container that ran already: every thread of its cgroup
    assert sorted((root / "BE" / "tasks").read_text().split()) == ["11", "12", "4242"]


def test_ensure_resctrl_groups_makes_each_class_group_or_says_why_not(tmp_path: Path) -> None:
    reasons: list[str] = []
    cg = Cgroups(v1_tree(tmp_path / "cg", [G]))
    assert Writer(cg, Policy, on_invalid=reasons.append).ensure_resctrl_groups({"BE": "L3:0=f"}) == "no resctrl mount"
    root = resctrl_tree(tmp_path / "resctrl")
    w = Writer(cg, Policy, resctrl_fs=ResctrlFS(root, resctrl(root)), on_invalid=reasons.append)
    assert w.ensure_resctrl_groups({"BE": "L3:0=f\n"}) is None
    assert (root / "BE" / "schemata").read_text() == "L3:0=f\n"
    assert w.ensure_resctrl_groups({"LS": "L3:0=ff\n", "../x": "L3:0=f\n"}) == (
        "resctrl group ../x: invalid resctrl group name '../x'"
    )
    assert reasons == ["resctrl"]


def test_a_resctrl_group_that_cannot_be_joined_is_counted_and_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = resctrl_tree(tmp_path / "resctrl")
    fs = ResctrlFS(root, resctrl(root))
    reasons: list[str] = []
    w = Writer(Cgroups(v1_tree(tmp_path / "cg", [G])), Policy, resctrl_fs=fs, on_invalid=reasons.append)
    with caplog.at_level(logging.WARNING, "nriplugin.node.writer"):
        w.join(Intent(resctrl_group=Setting("resctrl.group", "../x", "r")), G, 4242, "ns/pod")
        w.join(Intent(resctrl_group=Setting("resctrl.group", "BE", "r")), G, 0, "ns/pod")  # no threads: nothing
    assert reasons == ["resctrl"]
    (rec,) = caplog.records
    assert rec.getMessage() == "ns/pod: cannot join resctrl group ../x: invalid resctrl group name '../x'"
    assert not (root / "BE").exists()


def test_a_group_whose_tasks_cannot_be_listed_is_said(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = resctrl_tree(tmp_path / "resctrl")
    w = Writer(Cgroups(v1_tree(tmp_path / "cg", [G])), Policy, resctrl_fs=ResctrlFS(root, resctrl(root)))
    (tmp_path / "cg" / "cpu" / G / "tasks").mkdir()  # unreadable as a list: an OSError
    with caplog.at_level(logging.WARNING, "nriplugin.node.writer"):
        w.join(Intent(resctrl_group=Setting("resctrl.group", "BE", "r")), G, 0, "ns/pod")
    (rec,) = caplog.records
    assert rec.getMessage().startswith("ns/pod: cannot list tasks: [Errno 21] Is a directory")


def test_join_gives_a_core_scheduling_group_its_processes(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Against the model of the kernel's PR_SCHED_CORE (this kernel has none): the new
    container's init, or every process of a container that ran already (not its threads)."""
    k = Kernel({100: [100, 101], 200: [200], 300: [300, 301]})
    cg = v1_tree(tmp_path, [G])
    (cg / "cpu" / G / "cgroup.procs").write_text("200\n300\n")
    (cg / "cpu" / G / "tasks").write_text("200\n300\n301\n")
    reasons: list[str] = []
    w = Writer(Cgroups(cg), Policy, coresched=CoreSched(k), on_invalid=reasons.append)
    intent = Intent(core_sched_group=Setting("core.sched", "class:BE", "c"))
    w.join(intent, G, 100, "ns/pod")
    w.join(intent, G, 0, "ns/pod")
    assert k.cookies[100] == k.cookies[101] == k.cookies[200] == k.cookies[300] == k.cookies[301] != 0
    assert {pid for _, pid in k.calls if pid} == {100, 200, 300}  # processes, not their threads
    (cg / "cpu" / G / "cgroup.procs").write_text("0\n")  # no pid the kernel could take
    with caplog.at_level(logging.WARNING, "nriplugin.node.writer"):
        w.join(intent, G, 0, "ns/pod")
    assert reasons == ["core_sched"]
    assert [r.getMessage() for r in caplog.records] == [
        "ns/pod: cannot give core scheduling group class:BE: invalid pid 0"
    ]


def test_join_leaves_a_task_group_it_has_no_backend_or_no_group_for(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = resctrl_tree(tmp_path / "resctrl")
    cg = v1_tree(tmp_path / "cg", [G])
    k = Kernel({100: [100]})
    both = Writer(Cgroups(cg), Policy, resctrl_fs=ResctrlFS(root, resctrl(root)), coresched=CoreSched(k))
    both.join(Intent(), G, 100, "ns/pod")  # neither group wanted
    assert k.calls == [] and not any(p.is_dir() and p.name != "info" for p in root.iterdir())
    neither = Writer(Cgroups(cg), Policy)
    intent = Intent(resctrl_group=Setting("resctrl.group", "BE", "r"), core_sched_group=Setting("c", "class:BE", "c"))
    neither.join(intent, G, 100, "ns/pod")  # no backends: nothing, and no error
    (cg / "cpu" / G / "cgroup.procs").unlink()
    (cg / "cpu" / G / "cgroup.procs").mkdir()
    with caplog.at_level(logging.WARNING, "nriplugin.node.writer"):
        both.join(Intent(core_sched_group=Setting("c", "class:BE", "c")), G, 0, "ns/pod")
    assert [r.getMessage().split(": ")[:2] for r in caplog.records] == [["ns/pod", "cannot list tasks"]]
