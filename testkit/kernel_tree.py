"""Temporary trees laid out like the kernel's: cgroup v1 (per-controller hierarchies) and v2
(unified), /sys CPU topology and a resctrl mount, for tests that cannot use the real thing."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

V1_FILES = {
    "cpu": {
        "cpu.shares": "1024",
        "cpu.cfs_quota_us": "-1",
        "cpu.cfs_period_us": "100000",
        "cpu.cfs_burst_us": "0",
        "cpu.idle": "0",
    },
    "cpuset": {"cpuset.cpus": "0-3", "cpuset.mems": "0"},
    "memory": {"memory.limit_in_bytes": "9223372036854771712"},
    "blkio": {"blkio.weight": "500"},
    "pids": {"pids.max": "max"},
}
V2_FILES = {
    "cpu.weight": "100",
    "cpu.max": "max 100000",
    "cpu.max.burst": "0",
    "cpu.idle": "0",
    "cpuset.cpus": "",
    "cpuset.mems": "",
    "memory.min": "0",
    "memory.low": "0",
    "memory.high": "max",
    "memory.max": "max",
    "memory.oom.group": "0",
    "io.weight": "default 100",
    "io.max": "",
    "pids.max": "max",
}


def v1_group(root: Path, group: str, extra: dict[str, dict[str, str]] | None = None) -> None:
    files = {c: dict(f) for c, f in V1_FILES.items()}
    for c, f in (extra or {}).items():
        files.setdefault(c, {}).update(f)
    for ctrl, fs in files.items():
        d = root / ctrl / group
        d.mkdir(parents=True, exist_ok=True)
        (d / "cgroup.procs").write_text("")
        for name, value in fs.items():
            (d / name).write_text(value + "\n")


def v1_tree(root: Path, groups: Sequence[str] = (), extra: dict[str, dict[str, str]] | None = None) -> Path:
    v1_group(root, "", extra)
    for g in groups:
        v1_group(root, g, extra)
    return root


def v2_tree(root: Path, groups: Sequence[str] = ()) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (root / "cgroup.procs").write_text("")
    for g in groups:
        d = root / g
        d.mkdir(parents=True, exist_ok=True)
        for name, value in V2_FILES.items():
            (d / name).write_text(value + "\n")
    return root


def sys_tree(root: Path, cores: int = 4, smt: int = 2, numa_nodes: int = 1) -> Path:
    """CPUs numbered like Linux on x86: thread t of core c is cpu c + t*cores."""
    cpu = root / "devices" / "system" / "cpu"
    n = cores * smt
    cpu.mkdir(parents=True, exist_ok=True)
    (cpu / "online").write_text(f"0-{n - 1}\n")
    per_node = max(1, cores // numa_nodes)
    for c in range(n):
        core = c % cores
        t = cpu / f"cpu{c}" / "topology"
        t.mkdir(parents=True)
        sib = [core + k * cores for k in range(smt)]
        (t / "thread_siblings_list").write_text(",".join(map(str, sib)) + "\n")
        (t / "core_id").write_text(f"{core}\n")
        (t / "physical_package_id").write_text(f"{core // per_node}\n")
        (cpu / f"cpu{c}" / f"node{core // per_node}").mkdir()
    return root


def resctrl_tree(root: Path, closids: int = 16, cbm_mask: str = "7ff", mb: bool = True) -> Path:
    (root / "info" / "L3").mkdir(parents=True)
    (root / "schemata").write_text(f"L3:0={cbm_mask}\n" + ("MB:0=100\n" if mb else ""))
    (root / "tasks").write_text("")
    (root / "info" / "L3" / "num_closids").write_text(f"{closids}\n")
    (root / "info" / "L3" / "cbm_mask").write_text(f"{cbm_mask}\n")
    (root / "info" / "L3" / "min_cbm_bits").write_text("1\n")
    if mb:
        (root / "info" / "MB").mkdir()
        (root / "info" / "MB" / "num_closids").write_text("8\n")
        (root / "info" / "MB" / "min_bandwidth").write_text("10\n")
        (root / "info" / "MB" / "bandwidth_gran").write_text("10\n")
    return root


def v1_counters(
    root: Path,
    group: str,
    usage_ns: int = 0,
    periods: int = 0,
    throttled: int = 0,
    memory: int = 0,
    rss: int = 0,
    cache: int = 0,
) -> None:
    """A v1 group's statistics files, as the kernel writes them: ``cpuacct.usage`` in the
    cpuacct hierarchy, ``cpu.stat`` in cpu, ``memory.usage_in_bytes``/``memory.stat`` in memory.
    Call again to advance the counters."""
    for ctrl in ("cpu", "cpuacct", "memory"):
        (root / ctrl / group).mkdir(parents=True, exist_ok=True)
    (root / "cpuacct" / group / "cpuacct.usage").write_text(f"{usage_ns}\n")
    (root / "cpu" / group / "cpu.stat").write_text(
        f"nr_periods {periods}\nnr_throttled {throttled}\nthrottled_time {throttled * 1000}\n"
        "nr_bursts 0\nburst_time 0\n"
    )
    (root / "memory" / group / "memory.usage_in_bytes").write_text(f"{memory}\n")
    (root / "memory" / group / "memory.stat").write_text(
        f"cache {cache}\nrss {rss}\nrss_huge 0\nshmem 0\nmapped_file 0\n"
        "hierarchical_memory_limit 9223372036854771712\n"
        f"total_cache {cache}\ntotal_rss {rss}\ntotal_rss_huge 0\ntotal_shmem 0\n"
    )


def v1_tasks(root: Path, proc: Path, group: str, run_delay_ns: dict[int, int]) -> None:
    """A v1 group's tasks (its ``tasks`` file in the cpu hierarchy) and each task's
    ``/proc/<tid>/schedstat`` with its run-queue wait. Call again to move or replace them."""
    (root / "cpu" / group).mkdir(parents=True, exist_ok=True)
    (root / "cpu" / group / "tasks").write_text("".join(f"{tid}\n" for tid in run_delay_ns))
    for tid, ns in run_delay_ns.items():
        (proc / str(tid)).mkdir(parents=True, exist_ok=True)
        (proc / str(tid) / "schedstat").write_text(f"123456789 {ns} 42\n")


def v2_counters(
    root: Path,
    group: str,
    usage_ns: int = 0,
    periods: int = 0,
    throttled: int = 0,
    memory: int = 0,
    rss: int = 0,
    cache: int = 0,
    cpu_some_us: int = 0,
) -> None:
    """A v2 group's statistics files (``cpu.stat`` in µs, ``memory.current``, ``memory.stat``,
    ``cpu.pressure``), as the kernel writes them. Call again to advance the counters."""
    d = root / group
    d.mkdir(parents=True, exist_ok=True)
    us = usage_ns // 1000
    (d / "cpu.stat").write_text(
        f"usage_usec {us}\nuser_usec {us // 2}\nsystem_usec {us - us // 2}\n"
        f"nr_periods {periods}\nnr_throttled {throttled}\nthrottled_usec {throttled}\nnr_bursts 0\nburst_usec 0\n"
    )
    (d / "memory.current").write_text(f"{memory}\n")
    (d / "memory.stat").write_text(f"anon {rss}\nfile {cache}\nkernel 0\nkernel_stack 0\npagetables 0\nshmem 0\n")
    (d / "cpu.pressure").write_text(
        f"some avg10=0.00 avg60=0.00 avg300=0.00 total={cpu_some_us}\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    )


def proc_tree(
    root: Path,
    *,
    busy: int = 0,
    idle: int = 0,
    ncpu: int = 2,
    load1: float = 0.0,
    cpu_some_us: int = 0,
    memory_some_us: int = 0,
    memory_full_us: int = 0,
    mem_total_kb: int = 8 * 1024 * 1024,
    mem_available_kb: int = 6 * 1024 * 1024,
    swap_total_kb: int = 0,
    swap_free_kb: int = 0,
    pgscan_direct: int = 0,
    pgscan_kswapd: int = 0,
) -> Path:
    """A /proc with the files node collection reads (``busy``/``idle`` in ticks, busy split
    over user and system). Call again to advance the counters."""
    (root / "pressure").mkdir(parents=True, exist_ok=True)
    user, system = busy - busy // 3, busy // 3
    cpus = "".join(f"cpu{i} {user // ncpu} 0 {system // ncpu} {idle // ncpu} 0 0 0 0 0 0\n" for i in range(ncpu))
    (root / "stat").write_text(f"cpu  {user} 0 {system} {idle} 0 0 0 0 0 0\n{cpus}intr 0\nctxt 0\n")
    (root / "loadavg").write_text(f"{load1:.2f} 0.50 0.25 1/100 1234\n")
    (root / "pressure" / "cpu").write_text(
        f"some avg10=1.50 avg60=1.00 avg300=0.50 total={cpu_some_us}\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    )
    (root / "pressure" / "memory").write_text(
        f"some avg10=2.00 avg60=1.00 avg300=0.50 total={memory_some_us}\n"
        f"full avg10=1.00 avg60=0.50 avg300=0.25 total={memory_full_us}\n"
    )
    (root / "meminfo").write_text(
        f"MemTotal:       {mem_total_kb} kB\nMemFree:        {mem_available_kb // 2} kB\n"
        f"MemAvailable:   {mem_available_kb} kB\nBuffers:           1024 kB\n"
        f"SwapTotal:      {swap_total_kb} kB\nSwapFree:       {swap_free_kb} kB\n"
    )
    (root / "vmstat").write_text(
        f"nr_free_pages 1000\npgscan_kswapd {pgscan_kswapd}\npgscan_direct {pgscan_direct}\n"
        "pgscan_khugepaged 0\npgscan_direct_throttle 7\npgscan_anon 0\npgscan_file 0\n"
    )
    return root
