"""What this node's kernel can do: the capability matrix behind `nriplugin doctor` and every
feature's "can this work here" check. Probed once; all roots injectable."""

from __future__ import annotations

import ctypes
import errno
import os
from dataclasses import dataclass, field
from pathlib import Path

from nriplugin.kernel.cgroup import RESOURCES, Cgroups, Version
from nriplugin.kernel.cpulist import parse_cpulist


@dataclass
class Resctrl:
    mounted: bool = False
    l3_closids: int = 0
    l3_cbm_mask: str = ""  # hex, e.g. "7ff" -> 11 cache ways
    l3_min_cbm_bits: int = 1
    mb_closids: int = 0
    mb_min_bandwidth: int = 0
    mb_granularity: int = 0

    @property
    def cache_ways(self) -> int:
        return bin(int(self.l3_cbm_mask, 16)).count("1") if self.l3_cbm_mask else 0


@dataclass
class Topology:
    online: list[int] = field(default_factory=list)
    siblings: dict[int, list[int]] = field(default_factory=dict)  # cpu -> its SMT siblings (sorted)
    core: dict[int, tuple[int, int]] = field(default_factory=dict)  # cpu -> (package, core id)
    numa: dict[int, int] = field(default_factory=dict)  # cpu -> NUMA node

    @property
    def smt(self) -> bool:
        return any(len(s) > 1 for s in self.siblings.values())


@dataclass
class Capabilities:
    cgroup_version: Version
    controllers: list[str]
    files: dict[str, bool]  # logical resource -> the kernel has it
    resctrl: Resctrl
    psi: bool
    core_sched: bool
    topology: Topology


def topology(sys_root: Path = Path("/sys")) -> Topology:
    cpu_dir = sys_root / "devices" / "system" / "cpu"
    online = parse_cpulist((cpu_dir / "online").read_text()) if (cpu_dir / "online").exists() else []
    topo = Topology(online=online)
    for c in online:
        t = cpu_dir / f"cpu{c}" / "topology"
        try:
            topo.siblings[c] = parse_cpulist((t / "thread_siblings_list").read_text())
            topo.core[c] = (int((t / "physical_package_id").read_text()), int((t / "core_id").read_text()))
        except (OSError, ValueError):
            topo.siblings[c], topo.core[c] = [c], (0, c)
        nodes = [p.name for p in (cpu_dir / f"cpu{c}").glob("node[0-9]*")]
        topo.numa[c] = int(nodes[0][4:]) if nodes else 0
    return topo


def resctrl(root: Path = Path("/sys/fs/resctrl")) -> Resctrl:
    r = Resctrl()
    if not (root / "schemata").exists():
        return r
    r.mounted = True

    def num(p: Path) -> int:
        try:
            return int(p.read_text().strip())
        except (OSError, ValueError):
            return 0

    l3, mb = root / "info" / "L3", root / "info" / "MB"
    if l3.is_dir():
        r.l3_closids = num(l3 / "num_closids")
        r.l3_cbm_mask = (l3 / "cbm_mask").read_text().strip() if (l3 / "cbm_mask").exists() else ""
        r.l3_min_cbm_bits = num(l3 / "min_cbm_bits") or 1
    if mb.is_dir():
        r.mb_closids = num(mb / "num_closids")
        r.mb_min_bandwidth = num(mb / "min_bandwidth")
        r.mb_granularity = num(mb / "bandwidth_gran")
    return r


def core_sched_supported() -> bool:
    """prctl(PR_SCHED_CORE, PR_SCHED_CORE_GET) on ourselves: EINVAL when the kernel lacks it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        cookie = ctypes.c_ulong(0)
        rc = libc.prctl(62, 0, 0, 0, ctypes.byref(cookie))  # PR_SCHED_CORE, PR_SCHED_CORE_GET, pid 0, PIDTYPE_PID
    except (OSError, AttributeError):
        return False
    return rc == 0 or ctypes.get_errno() not in (errno.EINVAL, errno.ENOSYS)


def probe(
    cgroup_root: Path = Path("/sys/fs/cgroup"),
    resctrl_root: Path = Path("/sys/fs/resctrl"),
    proc_root: Path = Path("/proc"),
    sys_root: Path = Path("/sys"),
    core_sched: bool | None = None,
) -> Capabilities:
    cg = Cgroups(cgroup_root)
    assert cg.version is not None
    if cg.version is Version.V2:
        controllers = (cgroup_root / "cgroup.controllers").read_text().split()
    else:
        # v1: one mounted hierarchy per controller; "systemd" and "unified" are not controllers.
        controllers = sorted(
            p.name
            for p in cgroup_root.iterdir()
            if p.is_dir()
            and not p.is_symlink()
            and (p / "cgroup.procs").exists()
            and p.name not in ("systemd", "unified")
        )
    return Capabilities(
        cgroup_version=cg.version,
        controllers=controllers,
        files={name: cg.supported(name) for name in RESOURCES},
        resctrl=resctrl(resctrl_root),
        psi=os.access(proc_root / "pressure" / "cpu", os.R_OK),
        core_sched=core_sched_supported() if core_sched is None else core_sched,
        topology=topology(sys_root),
    )
