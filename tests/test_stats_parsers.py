"""The kernel counter parsers against the formats the kernel documents, in table tests.

Sources: proc(5) for /proc/stat (user nice system idle iowait irq softirq steal guest
guest_nice, in ticks; guest time is already in user), /proc/loadavg and /proc/meminfo (kB);
``Documentation/accounting/psi.rst`` ("some avg10=0.00 avg60=0.00 avg300=0.00 total=0", and
"full" — absent from cpu before 5.13); ``Documentation/admin-guide/cgroup-v2.rst`` (cpu.stat
usage_usec, nr_periods, nr_throttled, throttled_usec; memory.current; memory.stat anon, file);
``Documentation/admin-guide/cgroup-v1/`` (cpuacct.usage in ns; cpu.stat throttled_time in ns;
memory.stat rss, cache and the hierarchical total_*); ``Documentation/admin-guide/mm`` and
mm/vmstat.c for /proc/vmstat's pgscan counters (per zone before 4.8).
"""

from __future__ import annotations

import math
import resource

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nriplugin.kernel import stats
from nriplugin.kernel.stats import (
    NO_STALL,
    CpuStat,
    MemInfo,
    MemStat,
    ProcCpu,
    Psi,
    PsiLine,
    field,
    parse_int,
    parse_loadavg,
    parse_meminfo,
    parse_pgscan,
    parse_proc_stat,
    parse_psi,
    parse_psi_some_total,
    parse_v1_cpu,
    parse_v1_memory,
    parse_v2_cpu,
    parse_v2_memory,
)

PROC_STAT = (
    "cpu  10 20 30 400 50 6 7 8 9 1\n"
    "cpu0 5 10 15 200 25 3 3 4 4 0\n"
    "cpu1 5 10 15 200 25 3 4 4 5 1\n"
    "intr 12345 0 0\nctxt 999\nbtime 1700000000\n"
)


def test_proc_stat() -> None:
    # busy = user + nice + system + irq + softirq + steal = 10+20+30+6+7+8; total adds idle, iowait
    assert parse_proc_stat(PROC_STAT) == ProcCpu(81, 531, 2)
    assert parse_proc_stat("cpu  1 2 3 4\n") == ProcCpu(6, 10, 1)  # before 2.5.41: no iowait
    assert parse_proc_stat("cpu  1 2 3\n") is None
    assert parse_proc_stat("cpu  1 2 3 4 5") == ProcCpu(6, 15, 1)  # one line, no per-cpu lines
    assert parse_proc_stat("cpu  1 2 3 4 5 6 7 8\ncpu0 1 2 3 4 5 6 7 8\n") == ProcCpu(27, 36, 1)
    # zeros are counts too; a short first line does not borrow the next line's fields
    assert parse_proc_stat("cpu  0 0 0 0 0 0 0 0 0 0\n") == ProcCpu(0, 0, 1)
    assert parse_proc_stat("cpu  1 0 3 4 0\ncpu0 1 0 3 4 0\n") == ProcCpu(4, 8, 1)
    assert parse_proc_stat("\ncpu  1 2 3 4 5\n") is None  # the first line is the aggregate or nothing
    for bad in ("", "cpu0 1 2 3 4 5\n", "intr 1 2 3 4 5\n", "cpu  1 2 x 4 5\n", "cpu  1 2 -3 4 5\n"):
        assert parse_proc_stat(bad) is None, bad


@pytest.mark.parametrize(
    ("text", "value"),
    [("0.52 0.58 0.59 1/467 12345\n", 0.52), ("12.00 1 1 1/1 1", 12.0), ("0", 0.0)],
)
def test_loadavg(text: str, value: float) -> None:
    assert parse_loadavg(text) == value


@pytest.mark.parametrize("bad", ["", "x 1 2", "-1.0 0 0", "nan 0 0", "inf 0 0"])
def test_loadavg_refuses(bad: str) -> None:
    assert parse_loadavg(bad) is None


CPU_PSI = "some avg10=1.50 avg60=1.00 avg300=0.50 total=12345\nfull avg10=0.25 avg60=0.00 avg300=0.00 total=67\n"


def test_psi() -> None:
    assert parse_psi(CPU_PSI) == Psi(PsiLine(1.5, 1.0, 0.5, 12345), PsiLine(0.25, 0.0, 0.0, 67))
    old = "some avg10=0.00 avg60=0.00 avg300=0.00 total=5\n"  # cpu before Linux 5.13: no full line
    assert parse_psi(old) == Psi(PsiLine(0.0, 0.0, 0.0, 5), NO_STALL)
    assert PsiLine(0.0, 0.0, 0.0, 0) == NO_STALL
    assert parse_psi("full avg10=1 avg60=1 avg300=1 total=1\n") is None  # no some line
    assert parse_psi("some avg10=1 avg60=1 total=1\n") is None  # a key missing
    assert parse_psi("some avg10=x avg60=1 avg300=1 total=1\n") is None
    assert parse_psi("some avg10=1 avg60=1 avg300=1 total=-1\n") is None
    assert parse_psi("some avg10=-1 avg60=1 avg300=1 total=1\n") is None
    assert parse_psi("some avg10=1 avg60=nan avg300=1 total=1\n") is None
    assert parse_psi("some avg10=1 avg60=1 avg300=inf total=1\n") is None
    bad_full = "some avg10=1 avg60=1 avg300=1 total=1\nfull avg10=1 avg60=1 avg300=1 total=-1\n"
    assert parse_psi(bad_full) == Psi(PsiLine(1.0, 1.0, 1.0, 1), NO_STALL)
    assert parse_psi_some_total(CPU_PSI) == 12345
    assert parse_psi_some_total("some avg10=0.00 avg60=0.00 avg300=0.00 total=77") == 77  # no newline
    assert parse_psi_some_total("full avg10=0 avg60=0 avg300=0 total=1\n") is None
    assert parse_psi_some_total("some avg10=0.00\n") is None
    assert parse_psi_some_total("some total=x\n") is None


@given(
    st.lists(st.floats(0, 100, allow_nan=False), min_size=6, max_size=6),
    st.integers(0, 2**63),
    st.integers(0, 2**63),
)
def test_psi_round_trip(avgs: list[float], some: int, full: int) -> None:
    """What the kernel prints (two decimals) is what is read back."""
    a = [round(x, 2) for x in avgs]
    text = (
        f"some avg10={a[0]:.2f} avg60={a[1]:.2f} avg300={a[2]:.2f} total={some}\n"
        f"full avg10={a[3]:.2f} avg60={a[4]:.2f} avg300={a[5]:.2f} total={full}\n"
    )
    assert parse_psi(text) == Psi(PsiLine(a[0], a[1], a[2], some), PsiLine(a[3], a[4], a[5], full))
    assert parse_psi_some_total(text) == some


MEMINFO = (
    "MemTotal:       16303428 kB\nMemFree:         1234567 kB\nMemAvailable:   8000000 kB\n"
    "Buffers:          102400 kB\nSwapTotal:       2097148 kB\nSwapFree:        1048576 kB\n"
    "HugePages_Total:       0\n"
)


def test_meminfo() -> None:
    assert parse_meminfo(MEMINFO) == MemInfo(16303428 * 1024, 8000000 * 1024, 2097148 * 1024, 1048576 * 1024)
    assert parse_meminfo("MemTotal: 100 kB\n") == MemInfo(102400, 0, 0, 0)  # before 3.14: no MemAvailable
    assert parse_meminfo("MemAvailable: 100 kB\n") is None
    assert parse_meminfo("MemTotal: x kB\nMemAvailable: 5 kB\n") is None
    assert parse_meminfo("MemTotal: 1 kB\nSwapFree: x kB\n\nMemTotal:\n") == MemInfo(1024, 0, 0, 0)
    assert parse_meminfo("") is None
    assert parse_meminfo("MemTotal: 100\n") == MemInfo(102400, 0, 0, 0)  # a value without its unit
    assert parse_meminfo("MemTotal: 1 kB\nSwapTotal: x kB\nSwapFree: 5 kB\n") == MemInfo(1024, 0, 0, 5120)


def test_pgscan() -> None:
    new = "nr_free_pages 1\npgscan_kswapd 100\npgscan_direct 20\npgscan_khugepaged 3\npgscan_direct_throttle 7\n"
    assert parse_pgscan(new) == (20, 100)
    old = (
        "pgsteal_normal 1\npgscan_kswapd_dma 1\npgscan_kswapd_normal 2\npgscan_kswapd_movable 3\n"
        "pgscan_direct_dma 10\npgscan_direct_normal 20\npgscan_direct_movable 30\npgscan_direct_throttle 5\n"
    )
    assert parse_pgscan(old) == (60, 6)  # per-zone counters before 4.8, summed
    assert parse_pgscan("pgscan_direct 4\npgscan_kswapd 5\n") == (4, 5)  # first line
    assert parse_pgscan("pgscan_direct x\npgscan_kswapd 5\npgscan_anon 9\n") == (0, 5)
    assert parse_pgscan("nr_free_pages 1\n") == (0, 0)
    assert parse_pgscan("") == (0, 0)


def test_field_and_int() -> None:
    text = "nr_periods 10\nnr_throttled 3\nthrottled_time 5000\nnr_bursts 0"
    assert field(text, "nr_periods") == 10 and field(text, "nr_throttled") == 3
    assert field(text, "throttled_time") == 5000 and field(text, "nr_bursts") == 0  # last line, no newline
    assert field(text, "throttled") is None and field(text, "nr_period") is None and field(text, "bursts") is None
    assert field("total_rss 1\nrss 2\n", "rss") == 2  # a whole key, not the end of another
    assert field("rss x\n", "rss") is None
    assert field("\nrss 5", "rss") == 5  # found after a newline at the very start
    assert parse_int(" 42\n") == 42 and parse_int("") is None and parse_int("4 2") is None


V2_CPU_STAT = (
    "usage_usec 2000\nuser_usec 1500\nsystem_usec 500\nnr_periods 10\nnr_throttled 3\n"
    "throttled_usec 700\nnr_bursts 1\nburst_usec 9\n"
)


def test_cgroup_cpu() -> None:
    assert parse_v2_cpu(V2_CPU_STAT) == CpuStat(2_000_000, 10, 3, 700_000)  # µs -> ns
    no_ctrl = "usage_usec 2000\nuser_usec 1500\nsystem_usec 500\n"  # cpu controller not enabled
    assert parse_v2_cpu(no_ctrl) == CpuStat(2_000_000, 0, 0, 0)
    assert parse_v2_cpu("user_usec 5\n") is None
    v1_stat = "nr_periods 10\nnr_throttled 3\nthrottled_time 700000\n"  # ns already
    assert parse_v1_cpu("123456789\n", v1_stat) == CpuStat(123456789, 10, 3, 700000)
    assert parse_v1_cpu("123456789\n", None) == CpuStat(123456789, 0, 0, 0)
    assert parse_v1_cpu("123456789\n", "") == CpuStat(123456789)
    assert parse_v1_cpu("5", "nr_bursts 0\n") == CpuStat(5, 0, 0, 0)
    assert parse_v1_cpu("x", v1_stat) is None
    assert CpuStat(1) == CpuStat(1, 0, 0, 0)


def test_cgroup_memory() -> None:
    v2 = "anon 100\nfile 50\nkernel 7\nshmem 0\n"
    assert parse_v2_memory("300\n", v2) == MemStat(300, 100, 50)
    assert parse_v2_memory("300\n", None) == MemStat(300, 0, 0)
    assert parse_v2_memory("300\n", "kernel 1\n") == MemStat(300, 0, 0)
    assert parse_v2_memory("x", v2) is None
    own = "cache 50\nrss 100\nmapped_file 1\n"
    assert parse_v1_memory("300\n", own) == MemStat(300, 100, 50)
    hier = own + "total_cache 500\ntotal_rss 1000\n"  # a pod's group: its children counted
    assert parse_v1_memory("3000\n", hier) == MemStat(3000, 1000, 500)
    assert parse_v1_memory("3000\n", "total_rss 0\nrss 9\ntotal_cache 0\ncache 9\n") == MemStat(3000, 0, 0)
    assert parse_v1_memory("300\n", None) == MemStat(300, 0, 0)
    assert parse_v1_memory("300\n", "swap 1\n") == MemStat(300, 0, 0)
    assert parse_v1_memory("", own) is None


@given(st.text(max_size=300))
def test_parsers_never_raise_and_return_their_types(text: str) -> None:
    """Any text: a value of the documented type or None, never an exception."""
    assert parse_proc_stat(text) is None or isinstance(parse_proc_stat(text), ProcCpu)
    load = parse_loadavg(text)
    assert load is None or (math.isfinite(load) and load >= 0)
    psi = parse_psi(text)
    assert psi is None or (isinstance(psi, Psi) and psi.some.total_us >= 0 and psi.full.total_us >= 0)
    assert parse_meminfo(text) is None or isinstance(parse_meminfo(text), MemInfo)
    direct, kswapd = parse_pgscan(text)
    assert isinstance(direct, int) and isinstance(kswapd, int)
    assert parse_v2_cpu(text) is None or isinstance(parse_v2_cpu(text), CpuStat)
    assert parse_v1_memory(text, text) is None or isinstance(parse_v1_memory(text, text), MemStat)


def test_nofile_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """A quarter of the soft RLIMIT_NOFILE, at most 4096; none when the limit cannot be read."""
    asked: list[int] = []
    for soft, want in ((1024, 256), (1_048_576, 4096), (16384, 4096), (16380, 4095), (3, 0)):

        def getrlimit(which: int, s: int = soft) -> tuple[int, int]:
            asked.append(which)
            return s, s

        monkeypatch.setattr("nriplugin.kernel.stats.resource.getrlimit", getrlimit)
        assert stats._nofile_budget() == want
    assert set(asked) == {resource.RLIMIT_NOFILE}
    monkeypatch.setattr("nriplugin.kernel.stats.resource.getrlimit", lambda _r: (resource.RLIM_INFINITY, 0))
    assert stats._nofile_budget() == 4096

    def broken(_r: int) -> tuple[int, int]:
        raise OSError("no limits")

    monkeypatch.setattr("nriplugin.kernel.stats.resource.getrlimit", broken)
    assert stats._nofile_budget() == 0


# memory limits and working sets (what eviction and the memory events compare) ---------------------

# A v1 memory.stat as this machine's kernel writes it (trimmed): the group's own counters, then
# the hierarchical total_* ones that count its children too.
V1_STAT = """cache 9576448
rss 6004736
inactive_file 1048576
active_file 491520
hierarchical_memory_limit 9223372036854771712
total_cache 2119868416
total_rss 47349760
total_inactive_file 743309312
total_active_file 1376559104
"""
V2_STAT = "anon 268435456\nfile 536870912\ninactive_file 402653184\nactive_file 134217728\n"


@pytest.mark.parametrize(
    ("text", "limit"),
    [
        ("1073741824\n", 1 << 30),
        ("4096", 4096),
        ("max\n", None),  # v2: no limit
        ("9223372036854771712\n", None),  # v1's "no limit": PAGE_COUNTER_MAX pages
        (str(stats.UNLIMITED_V1), None),
        (str(stats.UNLIMITED_V1 - 4096), stats.UNLIMITED_V1 - 4096),  # huge, but a limit
        ("0", None),
        ("-1", None),
        ("", None),
        ("garbage", None),
    ],
)
def test_parse_limit(text: str, limit: int | None) -> None:
    assert stats.parse_limit(text) == limit


def test_working_set_is_usage_minus_inactive_file_hierarchical_on_v1() -> None:
    usage = 2119868416 + 47349760
    assert stats.working_set(usage, V1_STAT, v2=False) == usage - 743309312  # total_, not the own 1 MiB
    own_only = "cache 9576448\nrss 6004736\ninactive_file 1048576\n"  # a kernel without total_*
    assert stats.working_set(16 << 20, own_only, v2=False) == (16 << 20) - 1048576
    assert stats.working_set(1 << 30, V2_STAT, v2=True) == (1 << 30) - 402653184
    assert stats.working_set(1 << 30, "anon 1\n", v2=True) == 1 << 30  # nothing inactive
    assert stats.working_set(5 << 20, None, v2=False) == 5 << 20  # no memory.stat: usage
    assert stats.working_set(5 << 20, "", v2=True) == 5 << 20
    assert stats.working_set(1 << 20, V1_STAT, v2=False) == 0  # racing counters: never negative
    assert stats.working_set(1 << 30, V1_STAT, v2=True) == (1 << 30) - 1048576  # v2: the plain key
