"""Runs INSIDE the VM (e2e/vm/test_vm.py starts it there): the kernel layer, the one writer and
the reconciler on a real cgroup v2 tree. Each test makes its groups under one top group and
removes them (killing its processes by PID) whatever happens.

What the fake tree (testkit/kernel_tree.py) cannot show and the kernel does: refusals
(``cpu.max.burst`` above the quota, a weight written to a ``cpu.idle`` group), its own
normalisation (``io.weight``'s "default N", page rounding), inotify on v2 files, PSI triggers.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nriplugin.intent.core import Setting
from nriplugin.kernel.cgroup import Cgroups, Version
from nriplugin.kernel.psi_trigger import open_trigger
from nriplugin.node.assembly import Node
from nriplugin.nri import api_pb2 as api
from nriplugin.pacing.turns import Pacer
from nriplugin.policy.cache import RuleCache
from nriplugin.policy.model import Policy
from nriplugin.reconciler import Reconciler
from testkit.runtime_peer import make_container, make_pod

ROOT = Path("/sys/fs/cgroup")
if os.environ.get("NRIPLUGIN_IN_VM") != "1":  # never collected on the host (not test_*.py)
    pytest.skip("runs inside the VM only (e2e/vm/test_vm.py)", allow_module_level=True)
CORE = Policy.model_validate({"resourceQOSStrategy": {"policies": {"cpuPolicy": "coreSched"}}})
BATCH = (
    '{"containers":{"main":{"requests":{"kubernetes.io/batch-cpu":"500"},"limits":{"kubernetes.io/batch-cpu":"1k"}}}}'
)


def raw_write(path: Path, text: str) -> int:
    """Write as a shell would; the errno the kernel answered (0: accepted)."""
    try:
        path.write_text(text)
    except OSError as exc:
        return exc.errno or -1
    return 0


@contextlib.contextmanager
def groups(*rels: str, procs: tuple[str, ...] = ()) -> Iterator[Path]:
    """Groups under a fresh top group (controllers enabled down to the parents); ``procs``: the
    groups that get a sleeping process. Afterwards the processes are killed and the groups go."""
    top = ROOT / f"vmtest-{os.getpid()}-{time.monotonic_ns()}"
    made: list[Path] = []
    started: list[subprocess.Popen[bytes]] = []
    try:
        for rel in rels:
            d = top / rel
            for rp in [*reversed(d.relative_to(ROOT).parents), d.relative_to(ROOT)]:
                g = ROOT / rp
                if g != ROOT and not g.exists():
                    g.mkdir()
                    made.append(g)
        for g in made:  # every controller, all the way down (before any process joins)
            if any(c.parent == g for c in made):
                (g / "cgroup.subtree_control").write_text("+cpu +cpuset +memory +io +pids")
        for rel in procs:
            proc = subprocess.Popen(["sleep", "300"])
            started.append(proc)
            (top / rel / "cgroup.procs").write_text(str(proc.pid))
        yield top
    finally:
        for proc in started:
            proc.kill()
            proc.wait()
        for g in sorted(made, key=lambda x: -len(x.parts)):
            for _ in range(50):  # a killed task leaves its group a moment later
                try:
                    g.rmdir()
                    break
                except OSError:
                    time.sleep(0.05)


def test_the_guest_is_cgroup_v2_with_every_controller() -> None:
    assert Cgroups(ROOT).version is Version.V2
    ctrls = set((ROOT / "cgroup.controllers").read_text().split())
    assert {"cpu", "cpuset", "memory", "io", "pids"} <= ctrls
    assert set((ROOT / "cgroup.subtree_control").read_text().split()) == ctrls


def test_every_resource_round_trips_through_the_kernel() -> None:
    """Each logical value written by the kernel layer reads back as written and as matching,
    through the kernel's own normalisation ("default N", page rounding, "max")."""
    values: list[tuple[str, int | str]] = [
        ("cpu.shares", 512),
        ("cpu.shares", 2),
        ("cpu.cfs_quota_us", 50000),
        ("cpu.cfs_burst_us", 20000),
        ("cpu.cfs_quota_us", -1),
        ("cpu.idle", 1),
        ("cpu.idle", 0),
        ("cpuset.cpus", "1"),
        ("cpuset.mems", "0"),
        ("memory.limit_in_bytes", 256 * 2**20 + 100),
        ("memory.limit_in_bytes", -1),
        ("memory.high", 200 * 2**20),
        ("memory.high", -1),
        ("memory.min", 10 * 2**20 + 1),
        ("memory.low", 20 * 2**20),
        ("memory.oom.group", 1),
        ("blkio.weight", 500),
        ("blkio.weight", 10),
    ]
    with groups("pod/c", procs=("pod/c",)) as top:
        cg = Cgroups(ROOT)
        group = f"{top.name}/pod/c"
        for resource, value in values:
            out = cg.write(group, resource, value, period=100000)
            assert out.status in ("written", "unchanged"), (resource, value, out)
            assert cg.matches(group, resource, value, period=100000), (resource, value, cg.read(group, resource))
        assert (top / "pod/c/io.weight").read_text().split() == ["default", "100"]  # blkio 10 -> io 100
        assert not cg.unsupported


def test_the_kernel_refuses_a_burst_above_the_quota_and_the_writer_orders_around_it() -> None:
    """Refusal: cpu.max.burst above the quota in force (EINVAL), and a quota below the burst in
    force. The writer writes a falling quota after its (capped) burst, a rising one before."""
    with groups("pod/c") as top:
        d = top / "pod/c"
        assert raw_write(d / "cpu.max", "50000 100000") == 0
        assert raw_write(d / "cpu.max.burst", "60000") == errno.EINVAL
        assert raw_write(d / "cpu.max.burst", "40000") == 0
        assert raw_write(d / "cpu.max", "30000 100000") == errno.EINVAL
        node = Node.create(cgroups=Cgroups(ROOT))
        group = f"{top.name}/pod/c"
        for quota, burst in ((20000, 20000), (80000, 70000), (10000, 10000), (-1, 100000), (5000, 5000)):
            done = node.writer.apply(
                group, [Setting("cpu.cfs_quota_us", quota, "q"), Setting("cpu.cfs_burst_us", burst, "b")], "test"
            )
            assert [o.status for _, o in done] in (["written", "written"], ["written", "unchanged"]), done
            want = "max" if quota == -1 else str(quota)
            assert (d / "cpu.max").read_text().split() == [want, "100000"]
            assert (d / "cpu.max.burst").read_text().strip() == str(burst)


def test_an_idle_group_refuses_weights_and_the_agent_does_not_fight_it() -> None:
    """Refusal: once cpu.idle is 1 the kernel refuses any cpu.weight write (EINVAL) and reads
    the weight as 0. The default policy gives BE cpu.idle=1 *and* shares, so the kernel layer
    must take the idle group's weight as in place, not as drift to repair or an error."""
    with groups("pod/c", procs=("pod/c",)) as top:
        d = top / "pod/c"
        assert raw_write(d / "cpu.weight", "50") == 0
        assert raw_write(d / "cpu.idle", "1") == 0
        assert (d / "cpu.weight").read_text().strip() == "0"
        assert raw_write(d / "cpu.weight", "60") == errno.EINVAL
        cg = Cgroups(ROOT)
        group = f"{top.name}/pod/c"
        out = cg.write(group, "cpu.shares", 2048, force=True)
        assert out.status == "unchanged" and "idle" in out.detail, out
        assert cg.matches(group, "cpu.shares", 2048)
        assert raw_write(d / "cpu.idle", "0") == 0
        assert (d / "cpu.weight").read_text().strip() == "100"  # leaving idle resets the weight
        assert not cg.matches(group, "cpu.shares", 2048)


def test_memory_protection_above_the_parents_is_accepted_not_refused() -> None:
    """Absence of a refusal: memory.min/low above the parent's are accepted as written (the
    kernel caps the *effective* protection), so the reconciler sees no drift there."""
    with groups("pod/c") as top:
        cg = Cgroups(ROOT)
        assert raw_write(top / "pod/memory.min", str(2**20)) == 0
        for res in ("memory.min", "memory.low"):
            out = cg.write(f"{top.name}/pod/c", res, 64 * 2**20)
            assert out.status == "written", out
            assert cg.matches(f"{top.name}/pod/c", res, 64 * 2**20)


def test_cpuset_of_a_group_with_children_shrinks_without_refusal() -> None:
    """Absence of a refusal on v2 (v1 answers EBUSY): a parent's cpuset.cpus may drop a CPU
    its child holds; the child's cpuset.cpus stays as written and its effective set follows."""
    with groups("pod/c", procs=("pod/c",)) as top:
        cg = Cgroups(ROOT)
        assert cg.write(f"{top.name}/pod/c", "cpuset.cpus", "0").status in ("written", "unchanged")
        assert raw_write(top / "pod/cpuset.cpus", "1") == 0
        assert cg.matches(f"{top.name}/pod/c", "cpuset.cpus", "0")
        assert (top / "pod/c/cpuset.cpus.effective").read_text().strip() == "1"


def test_a_psi_trigger_fires_on_a_groups_cpu_pressure() -> None:
    """The kernel wakes a trigger on a group's cpu.pressure when its tasks stall (this
    machine's host kernel refuses triggers)."""
    with groups("ls") as top:
        trig, why = open_trigger(str(top / "ls/cpu.pressure"), 50_000, 500_000)
        assert trig is not None, why
        (top / "ls/cpu.max").write_text("10000 100000")  # throttled: it stalls at once
        busy: list[subprocess.Popen[bytes]] = []

        async def main() -> float:
            fired = asyncio.Event()
            trig.start(asyncio.get_running_loop(), fired.set)
            t0 = time.monotonic()
            for _ in range(3):
                p = subprocess.Popen(["sh", "-c", f"echo $$ > {top}/ls/cgroup.procs; while :; do :; done"])
                busy.append(p)
            await asyncio.wait_for(fired.wait(), 20)
            return time.monotonic() - t0

        try:
            took = asyncio.run(main())
        finally:
            for p in busy:
                p.kill()
                p.wait()
            trig.close()
        print(f"PSI trigger fired {took:.2f} s after the busy loops started")


class Recorder:
    def __init__(self) -> None:
        self.repairs: list[tuple[str, float]] = []
        self.conflicts: list[str] = []
        self.errors: list[int] = []

    def drift(self, resource: str) -> None:
        pass

    def repaired(self, resource: str, seconds: float) -> None:
        self.repairs.append((resource, seconds))

    def write_error(self, errno: int) -> None:
        self.errors.append(errno)

    def conflict(self, resource: str, path: str) -> None:
        self.conflicts.append(resource)

    def pass_done(self, seconds: float, cpu_seconds: float, entries: int) -> None:
        pass


async def until(cond: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_the_reconciler_repairs_v2_files_through_inotify() -> None:
    """A BE container under the coreSched CPU policy (cpu.idle=1 with batch shares and quota) on the real
    v2 tree: born wrong, set by a full pass with no refusal; a cpu.max and a cpu.idle changed
    by someone else come back through inotify; the idle group's weight is not fought."""
    with groups("kubepods/besteffort/pod1/c", procs=("kubepods/besteffort/pod1/c",)) as top:
        pod = make_pod(1, "BE", parent=f"/{top.name}/kubepods/besteffort/pod1")
        pod.annotations["node.koordinator.sh/extended-resource-spec"] = BATCH
        ctr = make_container(1, pod)
        ctr.linux.cgroups_path = f"/{top.name}/kubepods/besteffort/pod1/c"
        d = top / "kubepods/besteffort/pod1/c"
        asyncio.run(_repairs(pod, ctr, d))


async def _repairs(pod: api.PodSandbox, ctr: api.Container, d: Path) -> None:
    rec = Recorder()
    node = Node.create(RuleCache(CORE), cgroups=Cgroups(ROOT))
    r = Reconciler(
        node.desired, node.writer, node.model, observer=rec, resync_period=3600, pacer=Pacer(asyncio.get_running_loop())
    )
    node.model.container_started(pod, ctr)
    r.start(asyncio.get_running_loop())
    try:
        await until(lambda: not r.busy)
        r.full_pass()
        assert (d / "cpu.idle").read_text().strip() == "1"
        assert (d / "cpu.max").read_text().split() == ["100000", "100000"]
        await asyncio.sleep(0.3)
        rec.repairs.clear()
        (d / "cpu.max").write_text("max 100000")  # kubelet, another agent, a person
        await until(lambda: (d / "cpu.max").read_text().split()[0] == "100000")
        (d / "cpu.idle").write_text("0")
        await until(lambda: (d / "cpu.idle").read_text().strip() == "1")
        await until(lambda: len(rec.repairs) >= 2)
        assert {x for x, _ in rec.repairs} >= {"cpu.cfs_quota_us", "cpu.idle"}
        print("repairs (resource, seconds):", rec.repairs)
        r.full_pass()  # nothing left to write: the idle group's weight 0 is not drift
        await asyncio.sleep(0.5)
        assert rec.conflicts == [] and rec.errors == [], (rec.conflicts, rec.errors)
    finally:
        r.stop()
