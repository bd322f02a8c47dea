"""Inventory without NRI: CRI's view converted to NRI messages (checked against a real gRPC
server speaking the vendored CRI api), adoption of unknown containers and pruning of removed
ones, and new cgroup directories noticed on this machine's real cgroup v1 tree."""

from __future__ import annotations

import asyncio
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from nriplugin.cri import api_pb2 as cri
from nriplugin.cri.client import AsyncCRI
from nriplugin.inventory.cri import BadStatus, CriInventory, container_from_cri, pod_from_cri
from nriplugin.kernel.cgroup import Cgroups
from nriplugin.node.assembly import Node
from nriplugin.nri import api_pb2 as api
from nriplugin.pacing.turns import Pacer
from nriplugin.reconciler import Reconciler
from testkit.cri_standin import FakeRuntime
from testkit.runtime_peer import make_container, make_pod

ROOT = Path("/sys/fs/cgroup")
real_v1 = pytest.mark.skipif(
    os.geteuid() != 0 or not (ROOT / "cpu" / "cpu.shares").exists(), reason="needs root + cgroup v1"
)
CID = "ab" * 32
PID = "cd" * 32


def sandbox(pod_id: str = PID, labels: dict[str, str] | None = None) -> Any:
    sb = cri.PodSandbox(id=pod_id, state=cri.SANDBOX_READY, labels=labels or {"koordinator.sh/qosClass": "BE"})
    sb.metadata.name, sb.metadata.uid, sb.metadata.namespace = "batch", "uid-1", "default"
    sb.annotations["a"] = "b"
    return sb


def pod_info(parent: str) -> dict[str, Any]:
    """The shape containerd 1.7 returns (recorded from the private containerd)."""
    return {
        "pid": 4242,
        "config": {"metadata": {"name": "batch"}, "linux": {"cgroup_parent": parent}},
        "runtimeSpec": {"linux": {"cgroupsPath": parent + "/" + PID}},
    }


def container(cid: str = CID, state: Any = cri.CONTAINER_RUNNING, pod_id: str = PID) -> Any:
    c = cri.Container(id=cid, pod_sandbox_id=pod_id, state=state)
    c.metadata.name = "main"
    return c


def container_info(path: str, pid: int = 4343, resources: Any = None) -> dict[str, Any]:
    if resources is None:
        resources = {"cpu": {"shares": 1024, "quota": 50000, "period": 100000}, "memory": {"limit": 1 << 26}}
    return {"sandboxID": PID, "pid": pid, "runtimeSpec": {"linux": {"cgroupsPath": path, "resources": resources}}}


# conversion -------------------------------------------------------------------------------


def test_pod_and_container_convert_to_what_the_hooks_see() -> None:
    parent = "/kubepods/besteffort/poduid-1"
    pod = pod_from_cri(sandbox(), pod_info(parent))
    assert (pod.id, pod.name, pod.uid, pod.namespace) == (PID, "batch", "uid-1", "default")
    assert pod.labels["koordinator.sh/qosClass"] == "BE" and pod.annotations["a"] == "b"
    assert pod.linux.cgroup_parent == parent and pod.pid == 4242
    c = container_from_cri(container(), container_info(f"{parent}/{CID}"))
    assert (c.id, c.pod_sandbox_id, c.name, c.state, c.pid) == (CID, PID, "main", api.CONTAINER_RUNNING, 4343)
    assert c.linux.cgroups_path == f"{parent}/{CID}"
    r = c.linux.resources
    assert (r.cpu.shares.value, r.cpu.quota.value, r.cpu.period.value, r.memory.limit.value) == (
        1024,
        50000,
        100000,
        1 << 26,
    )
    assert not r.cpu.cpus  # not in the spec: not invented
    created = container_from_cri(container(state=cri.CONTAINER_CREATED), container_info("/x/y", pid=0))
    assert created.state == api.CONTAINER_CREATED and created.pid == 0


@pytest.mark.parametrize(
    "bad",
    [
        {"pid": 1},  # no spec at all
        {"runtimeSpec": {"linux": {"cgroupsPath": 7}}},
        {"runtimeSpec": {"linux": {"cgroupsPath": ""}}},
        {"runtimeSpec": []},
    ],
)
def test_a_container_status_without_a_cgroup_path_is_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(BadStatus, match="no cgroups path"):
        container_from_cri(container(), bad)


def test_hostile_values_in_the_status_are_dropped_not_passed_on() -> None:
    weird = {"cpu": {"shares": -5, "quota": True, "period": 1 << 70, "cpus": 3}, "memory": {"limit": "lots"}}
    c = container_from_cri(container(), container_info("/a/b", pid=-1, resources=weird))
    r = c.linux.resources
    assert not r.cpu.HasField("shares") and not r.cpu.HasField("quota") and not r.cpu.HasField("period")
    assert not r.cpu.cpus and not r.memory.HasField("limit") and c.pid == 0
    with pytest.raises(BadStatus, match="cgroup parent"):
        pod_from_cri(sandbox(), {"config": {"linux": {"cgroup_parent": ["/"]}}})


# a real gRPC server speaking CRI --------------------------------------------------------------


class Taker:
    def __init__(self) -> None:
        self.adopted: list[list[str]] = []
        self.pruned: list[set[str]] = []

    def observe(self, pods: list[api.PodSandbox], containers: list[api.Container]) -> int:
        if containers:
            self.adopted.append([c.id for c in containers])
        return len(containers)

    def prune(self, live: set[str], listed_at: float) -> int:
        self.pruned.append(live)
        return 0

    def pending(self) -> int:
        return 0

    def knows(self, key: str, running: bool = False) -> bool:
        return False


@pytest.fixture
def sock() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="nriplugin-cri-") as d:
        yield f"{d}/cri.sock"


def test_inventory_against_a_grpc_server(sock: str) -> None:
    rt = FakeRuntime()
    parent = "/kubepods/besteffort/poduid-1"
    rt.pods[PID] = (sandbox(), pod_info(parent))
    rt.containers[CID] = (container(state=cri.CONTAINER_CREATED), container_info(f"{parent}/{CID}", pid=0))
    exited = "ef" * 32
    rt.containers[exited] = (container(exited, cri.CONTAINER_EXITED), container_info(f"{parent}/{exited}"))

    async def main() -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((rt.handlers(),))
        server.add_insecure_port(f"unix://{sock}")
        await server.start()
        taker = Taker()
        inv = CriInventory(AsyncCRI(sock), taker, period=3600)
        try:
            assert await inv.run_once()
            assert taker.adopted == [[CID]]  # the exited one is not adopted
            assert taker.pruned == [{CID, f"pod:{PID}"}]
            assert rt.calls.count("ContainerStatus") == 1 and rt.calls.count("PodSandboxStatus") == 1
            ctrs = (await inv.snapshot()).containers  # cached: no new status calls
            assert rt.calls.count("ContainerStatus") == 1 and ctrs[0].pid == 0
            rt.containers[CID] = (container(), container_info(f"{parent}/{CID}", pid=99))  # started
            ctrs = (await inv.snapshot()).containers
            assert ctrs[0].pid == 99 and ctrs[0].state == api.CONTAINER_RUNNING
            # A runtime that answers garbage for one container: that one is skipped, the rest stay.
            bad = "12" * 32
            rt.containers[bad] = (container(bad), {})
            rt.raw_info[bad] = "[" * 5000
            ctrs = (await inv.snapshot()).containers
            assert [c.id for c in ctrs] == [CID]
            asked = rt.calls.count("ContainerStatus")
            await inv.snapshot()  # not asked again (nor logged again) until its state changes
            assert rt.calls.count("ContainerStatus") == asked
        finally:
            await inv.client.close()
            await server.stop(None)
        # Nobody listening: a clear False, no exception, and it says so once.
        down = CriInventory(AsyncCRI(sock, timeout=1.0), taker)
        try:
            assert not await down.run_once() and down.errors == 1
        finally:
            await down.client.close()

    asyncio.run(main())


def test_what_nri_already_told_is_not_asked_of_the_runtime_again(sock: str) -> None:
    """After Synchronize the node model knows the node: an inventory lists it (two calls) and
    asks the verbose status only of what it does not know, or knows only as created."""
    from nriplugin.node.model import NodeModel

    rt = FakeRuntime()
    pods = [make_pod(i, "BE") for i in range(3)]
    ctrs = [make_container(i, p) for i, p in enumerate(pods)]
    rt.add_node(pods, ctrs)
    model = NodeModel()
    model.observe(pods[:2], ctrs[:2])  # told: two pods, running
    model.container_created(pods[1], make_container(7, pods[1]))
    created = make_container(7, pods[1])
    created.state = api.CONTAINER_CREATED
    rt.add_node([], [created])
    rt.containers[created.id][0].state = cri.CONTAINER_RUNNING  # started since: its pid is news

    async def main() -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((rt.handlers(),))
        server.add_insecure_port(f"unix://{sock}")
        await server.start()
        inv = CriInventory(AsyncCRI(sock), model, period=3600)
        try:
            assert await inv.run_once()
        finally:
            await inv.client.close()
            await server.stop(None)

    asyncio.run(main())
    assert rt.calls.count("PodSandboxStatus") == 1  # the third pod
    assert rt.calls.count("ContainerStatus") == 2  # the third pod's container, and the one that started
    assert ctrs[2].id in model and model.knows(created.id, running=True)


def test_a_container_that_never_starts_does_not_make_the_inventory_poll_forever(sock: str) -> None:
    rt = FakeRuntime()
    rt.pods[PID] = (sandbox(), pod_info("/kubepods/besteffort/poduid-1"))
    rt.containers[CID] = (container(state=cri.CONTAINER_CREATED), container_info("/x/" + CID, pid=0))

    class Waiting(Taker):
        def pending(self) -> int:
            return 1  # never starts

    async def lists(hooks_live: bool, seconds: float) -> int:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((rt.handlers(),))
        server.add_insecure_port(f"unix://{sock}")
        await server.start()
        rt.calls.clear()
        inv = CriInventory(AsyncCRI(sock), Waiting(), period=3600, min_interval=0.05, hooks_live=lambda: hooks_live)
        task = asyncio.ensure_future(inv.run())
        await asyncio.sleep(seconds)
        task.cancel()
        await inv.client.close()
        await server.stop(None)
        return rt.calls.count("ListContainers")

    # NRI down: looks again at 0.5, 1.5, 3.5 s (backing off), not every 0.5 s
    assert 3 <= asyncio.run(lists(False, 3.0)) <= 4
    # NRI up: StartContainer will tell; no polling at all
    assert asyncio.run(lists(True, 1.5)) == 1


def test_a_failing_adoption_does_not_stop_the_inventory(sock: str) -> None:
    rt = FakeRuntime()
    rt.pods[PID] = (sandbox(), pod_info("/kubepods/besteffort/poduid-1"))

    class Broken(Taker):
        def observe(self, pods: list[api.PodSandbox], containers: list[api.Container]) -> int:
            raise RuntimeError("a bug")

    async def main() -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((rt.handlers(),))
        server.add_insecure_port(f"unix://{sock}")
        await server.start()
        inv = CriInventory(AsyncCRI(sock), Broken(), period=0.1, min_interval=0.01)
        task = asyncio.ensure_future(inv.run())
        try:
            await until(lambda: inv.errors >= 2)  # logged, and tried again
            assert not task.done()
        finally:
            task.cancel()
            await inv.client.close()
            await server.stop(None)

    asyncio.run(main())


# adoption on the real cgroup v1 tree ---------------------------------------------------------


@pytest.fixture
def top() -> Iterator[str]:
    name = f"nriplugin-itest-{os.getpid()}"
    yield name
    for c in ("cpu", "cpuset", "memory", "blkio"):
        base = ROOT / c / name
        if base.is_dir():
            for d in sorted((p for p in base.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
                d.rmdir()
            base.rmdir()


BATCH = (
    '{"containers":{"main":{"requests":{"kubernetes.io/batch-cpu":"500"},"limits":{"kubernetes.io/batch-cpu":"1k"}}}}'
)


def be_pod(i: int, top: str) -> api.PodSandbox:
    pod = make_pod(i, "BE", parent=f"/{top}/kubepods/besteffort/pod{i}")
    pod.annotations["node.koordinator.sh/extended-resource-spec"] = BATCH
    return pod


def mkdirs(rel: str) -> None:
    for c in ("cpu", "memory"):
        (ROOT / c / rel.lstrip("/")).mkdir(parents=True, exist_ok=True)


def read(rel: str, name: str) -> str:
    return (ROOT / "cpu" / rel.lstrip("/") / name).read_text().strip()


@real_v1
def test_adopt_converges_unknown_containers_and_prune_forgets_removed_ones(top: str) -> None:
    async def main() -> None:
        node = Node.create(cgroups=Cgroups(ROOT))
        model = node.model
        rec = Reconciler(node.desired, node.writer, model, resync_period=3600, pacer=Pacer(asyncio.get_running_loop()))
        rec.start(asyncio.get_running_loop())
        try:
            pods = [be_pod(i, top) for i in (1, 2)]
            ctrs = [make_container(i, p) for i, p in zip((1, 2), pods, strict=True)]
            for c in ctrs:
                mkdirs(c.linux.cgroups_path)
            model.container_started(pods[0], ctrs[0])  # known from NRI already
            known = model.get(ctrs[0].id)
            assert model.observe(pods, ctrs) == 1  # only the unknown one is adopted
            assert model.get(ctrs[0].id) is known  # what NRI told us stands
            await until(lambda: read(ctrs[1].linux.cgroups_path, "cpu.shares") == "512")  # converged at once
            assert read(ctrs[1].linux.cgroups_path, "cpu.cfs_quota_us") == "100000"
            assert {ctrs[1].id, f"pod:{pods[1].id}", f"pod:{pods[0].id}"} <= set(rec.entries)
            # The runtime no longer has container 2 (a removal we missed): forgotten; an entry
            # known after the listing began stays.
            listed_at = time.monotonic()
            late = make_container(3, pods[0])
            model.container_created(pods[0], late)
            assert model.prune({ctrs[0].id, f"pod:{pods[0].id}"}, listed_at) == 1  # containers
            # The reconciler lets go soon after (its work runs in short turns, more of them on a
            # busy machine).
            await until(lambda: ctrs[1].id not in rec.entries and f"pod:{pods[1].id}" not in rec.entries)
            assert late.id in rec.entries and ctrs[0].id in rec.entries
            assert ctrs[1].id not in model and late.id in model
        finally:
            rec.stop()

    asyncio.run(main())


async def until(cond: Callable[[], bool], timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.005)


@real_v1
def test_new_directories_are_noticed(top: str) -> None:
    """New pod and container cgroups under the pod root are reported; a container tracked
    before its cgroup existed (adopted while CREATED) converges as soon as runc makes it."""

    async def main() -> None:
        seen: list[str] = []
        node = Node.create(cgroups=Cgroups(ROOT))
        model = node.model
        rec = Reconciler(
            node.desired,
            node.writer,
            model,
            resync_period=3600,
            roots=[f"{top}/kubepods"],
            on_new_dir=seen.append,
            pacer=Pacer(asyncio.get_running_loop()),
        )
        rec.start(asyncio.get_running_loop())
        try:
            # The pod root does not exist yet (the agent started before kubelet): it is
            # awaited; made in one go with a pod in it, it is reported, then the pod's
            # containers are.
            assert not (ROOT / "cpu" / top).exists()
            mkdirs(f"{top}/kubepods/besteffort/pod9")
            await until(lambda: f"{top}/kubepods" in seen)
            cid = "9" * 64
            mkdirs(f"{top}/kubepods/besteffort/pod9/{cid}")
            await until(lambda: f"{top}/kubepods/besteffort/pod9/{cid}" in seen)
            # Known (adopted) but not started: while runc builds its cgroup (the pod and the
            # container appear in one go, faster than our watch on the new pod directory)
            # nothing is touched, because runc reads back what it writes and would fail the
            # start; once the runtime shows it running, it converges.
            pod = be_pod(7, top)
            ctr = make_container(7, pod)
            ctr.state = api.CONTAINER_CREATED
            model.observe([pod], [ctr])
            await until(lambda: not rec.busy)  # the reconciler takes the model's news right after
            assert ctr.id in rec.entries and model.pending() == 1
            proc = subprocess.Popen(["sleep", "30"])
            try:
                mkdirs(ctr.linux.cgroups_path)
                (ROOT / "cpu" / ctr.linux.cgroups_path.lstrip("/") / "cgroup.procs").write_text(str(proc.pid))
                (ROOT / "cpu" / ctr.linux.cgroups_path.lstrip("/") / "cpu.shares").write_text("2")  # runc
                await asyncio.sleep(0.2)
                assert read(ctr.linux.cgroups_path, "cpu.shares") == "2"  # runc's value, not fought
                ctr.state = api.CONTAINER_RUNNING
                model.observe([pod], [ctr])
                assert model.pending() == 0
                await until(lambda: read(ctr.linux.cgroups_path, "cpu.shares") == "512")
                assert read(ctr.linux.cgroups_path, "cpu.cfs_quota_us") == "100000"
                (ROOT / "cpu" / ctr.linux.cgroups_path.lstrip("/") / "cpu.shares").write_text("1024")
                await until(lambda: read(ctr.linux.cgroups_path, "cpu.shares") == "512")  # watched now
                # A container tracked (not pending) before its cgroup exists converges when it appears.
                ctr2 = make_container(8, pod)
                model.container_started(pod, ctr2)
                mkdirs(ctr2.linux.cgroups_path)
                await until(lambda: read(ctr2.linux.cgroups_path, "cpu.shares") == "512")
                assert rec.passes == 0  # inotify and the inventory did it, not a full pass
                # Removed directories leave no watch behind; a removed pod root is awaited
                # again and noticed when kubelet makes it anew.
                pod9 = ROOT / "cpu" / top / "kubepods" / "besteffort" / "pod9"
                (pod9 / cid).rmdir()
                pod9.rmdir()
                await until(lambda: str(pod9) not in rec._watches and str(pod9) not in rec._new_dirs)
            finally:
                proc.kill()
                proc.wait()
                await asyncio.sleep(0.05)
            for c in ("cpu", "memory"):  # kubelet goes away and takes the whole pod root with it
                base = ROOT / c / top / "kubepods"
                for d in sorted((p for p in base.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                    d.rmdir()
                base.rmdir()
            await until(lambda: str(ROOT / "cpu" / top / "kubepods") not in rec._new_dirs)  # seen to go
            assert str(ROOT / "cpu" / top) in rec._awaiting  # and awaited again
            seen.clear()
            mkdirs(f"{top}/kubepods/burstable/pod10")
            await until(lambda: f"{top}/kubepods" in seen)
        finally:
            rec.stop()

    asyncio.run(main())
