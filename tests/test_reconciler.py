"""The reconciler on this machine's real cgroup v1 tree: a process in a test cgroup, external
writes repaired within milliseconds, a stubborn writer detected as a fight."""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nriplugin.kernel.cgroup import Cgroups
from nriplugin.nri import api_pb2 as api
from nriplugin.plugin import QoSPlugin
from nriplugin.reconciler import Reconciler
from nriplugin.reconciler.reconciler import FIGHT_REPAIRS
from tests.runtime_peer import make_container, make_pod

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
    rel = ctr.linux.cgroups_path.lstrip("/")
    for c in ("cpu", "memory"):
        (ROOT / c / rel).mkdir(parents=True)
    proc = subprocess.Popen(["sleep", "60"])
    (ROOT / "cpu" / rel / "cgroup.procs").write_text(str(proc.pid))
    try:
        yield pod, ctr, ROOT / "cpu" / rel
    finally:
        proc.kill()
        proc.wait()
        time.sleep(0.05)
        for c in ("cpu", "memory"):
            d = ROOT / c / rel
            while d != ROOT / c:
                d.rmdir()
                d = d.parent


async def until(cond, timeout: float = 3.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.005)


def test_external_writes_are_repaired(workload: tuple[api.PodSandbox, api.Container, Path]) -> None:
    pod, ctr, cpu = workload

    async def main() -> None:
        rec = Recorder()
        plugin = QoSPlugin(cgroups=Cgroups(ROOT))
        r = Reconciler(plugin.intent, plugin.cgroups, observer=rec, resync_period=3600, version=plugin.state_version)
        r.track(pod, ctr)
        r.start(asyncio.get_running_loop())
        try:
            assert r.full_pass() >= 1  # born wrong (no hook ran): shares and quota set
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
        plugin = QoSPlugin(cgroups=Cgroups(ROOT))
        r = Reconciler(plugin.intent, plugin.cgroups, observer=rec, resync_period=3600)
        r.track(pod, ctr)
        r.start(asyncio.get_running_loop())
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
