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
