"""The reconciler on this machine's real cgroup v1 tree: a process in a test cgroup, external
writes repaired within milliseconds, a stubborn writer detected as a fight."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nriplugin.kernel.cgroup import Cgroups
from nriplugin.node.assembly import Node
from nriplugin.node.hooks import QoSPlugin
from nriplugin.node.overlays import group_key
from nriplugin.nri import api_pb2 as api
from nriplugin.pacing.turns import Pacer
from nriplugin.reconciler import Reconciler
from nriplugin.reconciler.reconciler import BACKOFF_MIN, FIGHT_REPAIRS
from testkit.runtime_peer import make_container, make_pod

ROOT = Path("/sys/fs/cgroup")
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not (ROOT / "cpu" / "cpu.shares").exists(), reason="needs root + cgroup v1"
)
BATCH = (
    '{"containers":{"main":{"requests":{"kubernetes.io/batch-cpu":"500"},"limits":{"kubernetes.io/batch-cpu":"1k"}}}}'
)


class Recorder:
    def __init__(self) -> None:
        self.drifts: list[str] = []
        self.repairs: list[tuple[str, float]] = []
        self.conflicts: list[str] = []
        self.passes: list[int] = []

    def drift(self, resource: str) -> None:
        self.drifts.append(resource)

    def repaired(self, resource: str, seconds: float) -> None:
        self.repairs.append((resource, seconds))

    def write_error(self, errno: int) -> None:
        pass

    def conflict(self, resource: str, path: str) -> None:
        self.conflicts.append(resource)

    def pass_done(self, seconds: float, cpu_seconds: float, entries: int) -> None:
        self.passes.append(entries)


@pytest.fixture
def workload() -> Iterator[tuple[api.PodSandbox, api.Container, Path]]:
    top = f"nriplugin-rtest-{os.getpid()}"
    pod = make_pod(1, "BE", parent=f"/{top}/kubepods/besteffort/pod1")
    pod.annotations["node.koordinator.sh/extended-resource-spec"] = BATCH
    ctr = make_container(1, pod)
    with occupied(ctr.linux.cgroups_path.lstrip("/")) as cpu:
        yield pod, ctr, cpu


@contextlib.contextmanager
def occupied(rel: str) -> Iterator[Path]:
    """``rel`` made in the real cpu and memory hierarchies with a sleeping process in it (its
    cpu directory given); afterwards the process is killed by PID and every directory made,
    up to the top one, removed."""
    for c in ("cpu", "memory"):
        (ROOT / c / rel).mkdir(parents=True)
    proc = subprocess.Popen(["sleep", "60"])
    (ROOT / "cpu" / rel / "cgroup.procs").write_text(str(proc.pid))
    try:
        yield ROOT / "cpu" / rel
    finally:
        proc.kill()
        proc.wait()
        time.sleep(0.05)
        for c in ("cpu", "memory"):
            d = ROOT / c / rel
            while d != ROOT / c:
                d.rmdir()
                d = d.parent


async def running(pod: api.PodSandbox, ctr: api.Container, rec: Recorder) -> Reconciler:
    """A node on the real tree with one running container, and its reconciler started."""
    node = Node.create(cgroups=Cgroups(ROOT))
    r = Reconciler(
        node.desired, node.writer, node.model, observer=rec, resync_period=3600, pacer=Pacer(asyncio.get_running_loop())
    )
    node.model.container_started(pod, ctr)
    r.start(asyncio.get_running_loop())
    await until(lambda: not r.busy)  # the reconciler takes the model's news right after
    return r


async def until(cond, timeout: float = 3.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.005)


def test_external_writes_are_repaired(workload: tuple[api.PodSandbox, api.Container, Path]) -> None:
    pod, ctr, cpu = workload

    async def main() -> None:
        rec = Recorder()
        r = await running(pod, ctr, rec)
        try:
            r.full_pass()  # born wrong (no hook ran): the reconciler has set shares and quota
            assert (cpu / "cpu.shares").read_text().strip() == "512"
            assert (cpu / "cpu.cfs_quota_us").read_text().strip() == "100000"
            await asyncio.sleep(0.1)
            rec.repairs.clear()
            (cpu / "cpu.shares").write_text("1024")  # kubelet, another agent, a person
            await until(lambda: (cpu / "cpu.shares").read_text().strip() == "512")
            (cpu / "cpu.cfs_quota_us").write_text("50000")
            await until(lambda: (cpu / "cpu.cfs_quota_us").read_text().strip() == "100000")
            await until(lambda: len(rec.repairs) >= 2)
            assert {r for r, _ in rec.repairs} == {"cpu.shares", "cpu.cfs_quota_us"}
            assert all(lat < 2.0 for _, lat in rec.repairs)  # milliseconds in bench/reconcile.py
            assert rec.conflicts == []
        finally:
            r.stop()

    asyncio.run(main())


def test_a_stubborn_writer_is_a_fight(workload: tuple[api.PodSandbox, api.Container, Path]) -> None:
    pod, ctr, cpu = workload

    async def main() -> None:
        rec = Recorder()
        r = await running(pod, ctr, rec)
        r.full_pass()
        stop = threading.Event()

        def fighter() -> None:
            while not stop.is_set():
                (cpu / "cpu.shares").write_text("1024")
                time.sleep(0.02)

        t = threading.Thread(target=fighter)
        t.start()
        try:
            await asyncio.sleep(1.0)
        finally:
            stop.set()
            t.join()
            r.stop()
        assert rec.conflicts and set(rec.conflicts) == {"cpu.shares"}
        repairs = [x for x, _ in rec.repairs if x == "cpu.shares"]
        # backed off instead of looping: ~50 reverts, a handful of repairs per backoff round
        assert len(repairs) <= (FIGHT_REPAIRS + 1) * len(rec.conflicts)
        assert len(rec.drifts) > len(repairs)
        r.policy_changed()  # a new policy re-applies at once, backoff forgotten
        assert (cpu / "cpu.shares").read_text().strip() == "512"

    asyncio.run(main())


def shares_of(cpu: Path) -> str:
    return (cpu / "cpu.shares").read_text().strip()


def test_a_repair_held_back_by_the_backoff_is_made_when_it_ends(
    workload: tuple[api.PodSandbox, api.Container, Path],
) -> None:
    """Another writer rewrites cpu.shares every 100 ms for 3 s: a conflict, and once it stops
    the value comes back within the backoff in force, not at the next full pass."""
    pod, ctr, cpu = workload

    async def main() -> None:
        rec = Recorder()
        r = await running(pod, ctr, rec)
        r.full_pass()
        stop = threading.Event()

        def fighter() -> None:
            end = time.monotonic() + 3.0
            while time.monotonic() < end:
                (cpu / "cpu.shares").write_text("1024")
                time.sleep(0.1)
            stop.set()

        t = threading.Thread(target=fighter)
        t.start()
        try:
            while not stop.is_set():
                await asyncio.sleep(0.02)
            st = r.files[str(cpu / "cpu.shares")]
            left = max(0.0, st.blocked_until - time.monotonic())  # the backoff still in force
            stopped = time.monotonic()
            assert rec.conflicts and set(rec.conflicts) == {"cpu.shares"}
            await until(lambda: shares_of(cpu) == "512", timeout=left + 1.0)
            assert time.monotonic() - stopped <= max(left, BACKOFF_MIN) + 1.0
            assert r.passes == 1  # the held-back repair did it, not a full pass
        finally:
            t.join()
            r.stop()

    asyncio.run(main())


def test_an_overlay_is_kept_like_a_feature_and_withdrawn_quietly(
    workload: tuple[api.PodSandbox, api.Container, Path],
) -> None:
    """An overlay (a suppressed BE quota) rides in the hook's answers and is kept by the
    reconciler: an external write goes back to the overlay's value, not the feature's;
    withdrawing it restores the feature's value. Setting and withdrawing are not drift."""
    pod, ctr, cpu = workload

    async def main() -> None:
        rec = Recorder()
        node = Node.create(cgroups=Cgroups(ROOT))
        plugin = QoSPlugin(node)
        r = Reconciler(
            node.desired,
            node.writer,
            node.model,
            observer=rec,
            resync_period=3600,
            pacer=Pacer(asyncio.get_running_loop()),
        )
        r.start(asyncio.get_running_loop())
        quota = cpu / "cpu.cfs_quota_us"
        try:
            adj = plugin.create_container(pod, ctr)
            assert isinstance(adj, api.ContainerAdjustment)
            assert not adj.linux.resources.cpu.HasField("quota")  # v1, BE: written at StartContainer
            plugin.start_container(pod, ctr)
            assert quota.read_text().strip() == "100000"
            await until(lambda: not r.busy)  # the reconciler takes the model's news right after
            r.full_pass()
            assert quota.read_text().strip() == "100000"
            # the QoS manager suppresses BE: applied at once, quietly
            assert node.desired.set_overlay(ctr.id, "qos:cpuSuppress", {"cpu.cfs_quota_us": 30000}, "score 80")
            await until(lambda: quota.read_text().strip() == "30000")
            assert rec.drifts == [] and rec.repairs == [] and rec.conflicts == []
            # the hooks answer with the same merged state
            res = api.LinuxResources()
            res.cpu.quota.value = 100000
            (u,) = plugin.update_container(pod, ctr, res)
            assert u.linux.resources.cpu.quota.value == 30000
            intent = node.desired.intent(ctr.id)
            assert intent is not None
            s = intent.files[("cpu.cfs_quota_us", "")]
            assert (s.owner, s.why) == ("qos:cpuSuppress", "score 80")
            await asyncio.sleep(0.05)  # new facts from the update: applied (quietly) first
            # an external write is drift, repaired to the overlay's value
            quota.write_text("100000")
            await until(lambda: quota.read_text().strip() == "30000")
            assert rec.drifts == ["cpu.cfs_quota_us"] and [x for x, _ in rec.repairs] == ["cpu.cfs_quota_us"]
            # withdrawn: the feature's value comes back, again quietly
            assert node.desired.withdraw_overlay(ctr.id, "qos:cpuSuppress")
            await until(lambda: quota.read_text().strip() == "100000")
            assert len(rec.drifts) == 1 and len(rec.repairs) == 1 and rec.conflicts == []
            assert not node.desired.withdraw_overlay(ctr.id, "qos:cpuSuppress")  # nothing left
        finally:
            r.stop()

    asyncio.run(main())


@pytest.fixture
def qos_group() -> Iterator[str]:
    """A QoS-level group like kubepods/besteffort, with a process in it."""
    rel = f"nriplugin-rtest-{os.getpid()}/kubepods/besteffort"
    with occupied(rel):
        yield rel


def test_a_qos_level_group_is_owned_and_repaired_like_a_container(qos_group: str) -> None:
    """The BE parent has no pod or container behind it: its values are overlays only, it is
    watched and repaired like a container, and withdrawing restores what it had before."""

    async def main() -> None:
        rec = Recorder()
        node = Node.create(cgroups=Cgroups(ROOT))
        r = Reconciler(
            node.desired,
            node.writer,
            node.model,
            observer=rec,
            resync_period=3600,
            pacer=Pacer(asyncio.get_running_loop()),
        )
        r.start(asyncio.get_running_loop())
        cpu = ROOT / "cpu" / qos_group
        quota = cpu / "cpu.cfs_quota_us"
        try:
            assert quota.read_text().strip() == "-1"
            key = r.own_group(qos_group)
            assert key == group_key(qos_group) and key in r.entries
            node.desired.set_overlay(key, "qos:cpuSuppress", {"cpu.cfs_quota_us": 150000}, "BE limit 1.5 CPU")
            await until(lambda: quota.read_text().strip() == "150000")
            quota.write_text("-1")  # someone lifts the limit
            await until(lambda: quota.read_text().strip() == "150000")
            assert rec.drifts == ["cpu.cfs_quota_us"] and len(rec.repairs) == 1
            node.desired.withdraw_overlay(key, "qos:cpuSuppress")
            await until(lambda: quota.read_text().strip() == "-1")  # as it was before
            assert len(rec.drifts) == 1 and rec.conflicts == []
        finally:
            r.stop()

    asyncio.run(main())


def test_a_falling_quota_goes_after_the_burst_on_the_real_kernel(qos_group: str) -> None:
    """The kernel refuses a quota below the burst in force (EINVAL), and a burst above the
    quota: lowering an LS container's quota under its burst only works in the writer's order
    (burst first, capped at the new quota); raising it again, quota first."""
    rel = f"{qos_group}/ls"
    for c in ("cpu", "memory"):
        (ROOT / c / rel).mkdir()
    cpu = ROOT / "cpu" / rel
    try:
        (cpu / "cpu.cfs_quota_us").write_text("100000")
        pod = make_pod(7, "LS", parent=f"/{qos_group}")
        ctr = make_container(7, pod)
        ctr.linux.cgroups_path = f"/{rel}"
        ctr.linux.resources.cpu.quota.value = 100000
        node = Node.create(cgroups=Cgroups(ROOT))
        r = Reconciler(node.desired, node.writer, node.model, watch=False, resync_period=3600)
        node.model.container_started(pod, ctr)  # no loop here: the reconciler converges it at once
        assert (cpu / "cpu.cfs_burst_us").read_text().strip() == "100000"  # the feature: 100% of quota
        with pytest.raises(OSError):  # what a quota-first writer would meet
            (cpu / "cpu.cfs_quota_us").write_text("30000")
        node.desired.set_overlay(ctr.id, "qos:cpuSuppress", {"cpu.cfs_quota_us": 30000}, "test")  # applied now
        assert (cpu / "cpu.cfs_quota_us").read_text().strip() == "30000"
        assert (cpu / "cpu.cfs_burst_us").read_text().strip() == "30000"
        node.desired.withdraw_overlay(ctr.id, "qos:cpuSuppress")
        assert (cpu / "cpu.cfs_quota_us").read_text().strip() == "100000"  # what the runtime asked
        assert (cpu / "cpu.cfs_burst_us").read_text().strip() == "100000"
        assert r.check(ctr.id) == 0  # and nothing left to do
    finally:
        for c in ("cpu", "memory"):
            (ROOT / c / rel).rmdir()


def test_limiting_the_be_group_below_a_pods_batch_limit_works_both_ways(qos_group: str) -> None:
    """cgroup v1 refuses a parent's quota below a child's (and a child's above its parent's):
    limiting BE's group to 0.3 cores while a BE pod has a 1-core batch limit lowers the pod and
    its container first, raising it back restores them after the group; a container born
    meanwhile gets its quota at StartContainer, as the group is then (the group cut again in
    between: the kernel refuses the birth value). Nothing is left refused or retrying."""
    from nriplugin.node.hooks import QoSPlugin
    from nriplugin.policy.qos import QoSClass

    pod = make_pod(3, "BE", parent=f"/{qos_group}/pod3")
    pod.annotations["node.koordinator.sh/extended-resource-spec"] = BATCH  # 1-core limit
    ctr = make_container(3, pod)
    rel = ctr.linux.cgroups_path.lstrip("/")
    late = make_container(4, pod)
    late_rel = late.linux.cgroups_path.lstrip("/")
    for c in ("cpu", "memory"):
        (ROOT / c / rel).mkdir(parents=True)
    cpu = ROOT / "cpu"
    try:
        node = Node.create(cgroups=Cgroups(ROOT))
        plugin = QoSPlugin(node)
        r = Reconciler(node.desired, node.writer, node.model, watch=False, resync_period=3600)
        plugin.run_pod_sandbox(pod)
        node.model.container_started(pod, ctr)  # no loop: converged at once
        group = r.own_group(qos_group)
        assert (cpu / rel / "cpu.cfs_quota_us").read_text().strip() == "100000"
        assert (cpu / f"{qos_group}/pod3" / "cpu.cfs_quota_us").read_text().strip() == "100000"
        node.desired.set_ceiling(QoSClass.BE, 0.3, "qos:cpuSuppress", "test")
        node.desired.set_overlay(group, "qos:cpuSuppress", {"cpu.cfs_quota_us": 30000}, "test")
        for g in (qos_group, f"{qos_group}/pod3", rel):
            assert (cpu / g / "cpu.cfs_quota_us").read_text().strip() == "30000", g
        adj = plugin.create_container(pod, late)  # born while BE is limited: no quota at birth
        assert adj is not None and not isinstance(adj, tuple) and not adj.linux.resources.cpu.HasField("quota")
        (cpu / late_rel).mkdir()  # runc creates its cgroup; then the group is cut further
        node.desired.set_ceiling(QoSClass.BE, 0.2, "qos:cpuSuppress", "test")
        node.desired.set_overlay(group, "qos:cpuSuppress", {"cpu.cfs_quota_us": 20000}, "test")
        with pytest.raises(OSError) as refused:  # what runc's write of the birth value meets
            (cpu / late_rel / "cpu.cfs_quota_us").write_text("30000")
        assert refused.value.errno == errno.EINVAL
        plugin.start_container(pod, late)  # written now, as the group is
        assert (cpu / late_rel / "cpu.cfs_quota_us").read_text().strip() == "20000"
        node.desired.set_overlay(group, "qos:cpuSuppress", {"cpu.cfs_quota_us": 150000}, "test")
        node.desired.withdraw_ceiling(QoSClass.BE)  # the group rose first: its children may follow
        assert (cpu / qos_group / "cpu.cfs_quota_us").read_text().strip() == "150000"
        assert (cpu / f"{qos_group}/pod3" / "cpu.cfs_quota_us").read_text().strip() == "100000"
        assert (cpu / rel / "cpu.cfs_quota_us").read_text().strip() == "100000"
        assert r.full_pass() == 0
        assert not [f for f in r.files.values() if f.refused and f.retry is not None]
    finally:
        if (cpu / late_rel).exists():
            (cpu / late_rel).rmdir()
        for c in ("cpu", "memory"):
            d = ROOT / c / rel
            while d != ROOT / c / qos_group:
                d.rmdir()
                d = d.parent


def test_a_batch_in_the_wrong_order_still_lands(qos_group: str) -> None:
    """Changes made in one callback are applied as one batch, in the kernel's order: raising BE's
    group and lifting its children's ceiling, made children first, is written parent first,
    so the kernel refuses nothing and nothing waits out a backoff."""
    from nriplugin.policy.qos import QoSClass

    pod = make_pod(5, "BE", parent=f"/{qos_group}/pod5")
    pod.annotations["node.koordinator.sh/extended-resource-spec"] = BATCH  # 1-core limit
    ctr = make_container(5, pod)
    rel = ctr.linux.cgroups_path.lstrip("/")
    for c in ("cpu", "memory"):
        (ROOT / c / rel).mkdir(parents=True)
    cpu = ROOT / "cpu"

    async def main() -> None:
        node = Node.create(cgroups=Cgroups(ROOT))
        r = Reconciler(
            node.desired, node.writer, node.model, resync_period=3600, pacer=Pacer(asyncio.get_running_loop())
        )
        r.start(asyncio.get_running_loop())
        try:
            node.desired.set_ceiling(QoSClass.BE, 0.3, "qos:cpuSuppress", "test")
            node.model.container_started(pod, ctr)
            group = r.own_group(qos_group)
            node.desired.set_overlay(group, "qos:cpuSuppress", {"cpu.cfs_quota_us": 30000}, "test")
            await until(lambda: (cpu / rel / "cpu.cfs_quota_us").read_text().strip() == "30000")
            await asyncio.sleep(0.05)
            node.desired.withdraw_ceiling(QoSClass.BE)  # children first: the kernel would refuse
            node.desired.set_overlay(group, "qos:cpuSuppress", {"cpu.cfs_quota_us": 150000}, "test")
            await until(lambda: (cpu / rel / "cpu.cfs_quota_us").read_text().strip() == "100000", timeout=0.5)
            assert (cpu / qos_group / "cpu.cfs_quota_us").read_text().strip() == "150000"
            assert r.rejections == 0  # the batch raised the group first
            assert not [f for f in r.files.values() if f.refused]
        finally:
            r.stop()

    try:
        asyncio.run(main())
    finally:
        for c in ("cpu", "memory"):
            d = ROOT / c / rel
            while d != ROOT / c / qos_group:
                d.rmdir()
                d = d.parent
