"""Workloads for the private containerd that put a node under pressure (eviction's end-to-end
tests and benchmark): classes' labels, a pod growing its memory, spinners, and reading what the
kernel and the runtime say of them."""

from __future__ import annotations

from pathlib import Path

from testkit.containerd import CGROUP_FS, Containerd
from testkit.cri import msg

BE = {"koordinator.sh/qosClass": "BE"}
LS = {"koordinator.sh/qosClass": "LS"}
GiB = 1 << 30
# ~30 MB/s of anonymous memory: each dd reads 3 MB from /dev/zero into its buffer and blocks
# writing it to a pipe nobody reads, holding the buffer.
GROW = ["/bin/sh", "-c", "while :; do dd if=/dev/zero bs=3M count=1 2>/dev/null | sleep 100000 & sleep 0.1; done"]
SPIN_TWO = ["/bin/sh", "-c", "yes >/dev/null & yes >/dev/null"]
SPIN_FOUR = ["/bin/sh", "-c", "yes >/dev/null & yes >/dev/null & yes >/dev/null & yes >/dev/null"]
RUNNING = 1


def pods_root(rt: Containerd) -> Path:
    return CGROUP_FS / "memory" / rt.cgroup_root / "kubepods"


def limit_pods_root(rt: Containerd, limit: int = GiB) -> Path:
    """kubelet's node-allocatable cgroup: made before any pod, with its memory limit."""
    root = pods_root(rt)
    root.mkdir(parents=True, exist_ok=True)
    (root / "memory.limit_in_bytes").write_text(str(limit))
    return root


def oom_kills(root: Path) -> int:
    for line in (root / "memory.oom_control").read_text().splitlines():
        if line.startswith("oom_kill "):
            return int(line.split()[1])
    return 0


def running(rt: Containerd, cid: str) -> bool:
    assert rt.cri is not None
    try:
        st = rt.cri.call("ContainerStatus", msg("ContainerStatusRequest", container_id=cid)).status.state
    except Exception:
        return False
    return bool(st == RUNNING)
