"""The work one NRI hook costs the agent as users run it, counted rather than timed.

The real agent (``nriplugin run``: the stub, the hook adapter, the reconciler, the QoS manager,
network QoS, the CRI inventory, metrics) runs in this process on an event loop whose clock can
be stopped; the runtime (``RuntimePeer``, the NRI runtime side) runs in a thread of its own on
its own loop, over a real unix socket. While the clock is stopped no timer fires (no periodic
round, resync or fast path), so what the agent's thread does between a request arriving and
the loop going idle again is exactly what that one event caused: the hook itself and every
callback it left behind (listeners, queued passes, wakeups). That work is counted with
``sys.setprofile`` in the agent's thread — Python function calls, and the file-system calls
made from Python — so the count is the same on a busy machine and a quiet one, and it can be
compared between a node of 300 and one of 3000 containers.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import socket
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import nriplugin
from nriplugin.nri import api_pb2 as api
from testkit.kernel_tree import v1_group, v1_tree
from testkit.runtime_peer import PluginSession, RuntimePeer

T = TypeVar("T")

# C functions that reach the kernel's file system (what "I/O it does not need" means here).
FILE_CALLS = frozenset(
    {"open", "stat", "lstat", "listdir", "scandir", "read", "write", "access", "readlink", "mkdir", "rmdir"}
)


class StoppableClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose ``time()`` can be held: no timer comes due while it is."""

    held: float | None = None

    def time(self) -> float:
        return self.held if self.held is not None else super().time()


PACKAGE = str(Path(nriplugin.__file__).parent) + "/"


@dataclass
class Work:
    """What the agent's code did for one event, wherever the loop entered it: the bytecode
    instructions executed in and under the package's own functions (a loop over the node's
    containers shows here even inside a comprehension), the calls they made, and their
    file-system calls. The loop's own turns are not the agent's work. (A copy made in C,
    ``list(d)``, is not seen: such copies are looked for in review.)"""

    opcodes: int = 0
    calls: int = 0  # Python function calls (and generator resumptions)
    files: collections.Counter[str] = field(default_factory=collections.Counter)  # FILE_CALLS by name
    by_function: collections.Counter[str] = field(default_factory=collections.Counter, repr=False)  # opcodes
    _depth: int = field(default=0, repr=False)
    _pdepth: int = field(default=0, repr=False)

    def trace(self, frame: FrameType, event: str, arg: Any) -> Any:
        """``sys.settrace``: a frame of ours (or one it called) is traced to the opcode."""
        if not self._depth and not frame.f_code.co_filename.startswith(PACKAGE):
            return None
        self._depth += 1
        self.calls += 1
        frame.f_trace_opcodes = True
        code = frame.f_code
        name = f"{code.co_filename.rsplit('/', 2)[-1]}:{code.co_name}"

        def local(frame: FrameType, event: str, arg: Any) -> Any:
            if event == "opcode":
                self.opcodes += 1
                self.by_function[name] += 1
            elif event == "return":
                self._depth -= 1
            return local

        return local

    def profile(self, frame: FrameType, event: str, arg: Any) -> None:
        """``sys.setprofile``: the C functions our frames call that reach the file system."""
        if event == "call":
            if self._pdepth or frame.f_code.co_filename.startswith(PACKAGE):
                self._pdepth += 1
        elif event == "return":
            if self._pdepth:
                self._pdepth -= 1
        elif event == "c_call" and self._pdepth and getattr(arg, "__name__", "") in FILE_CALLS:
            self.files[arg.__name__] += 1

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        sys.settrace(self.trace)
        sys.setprofile(self.profile)
        try:
            yield
        finally:
            sys.setprofile(None)
            sys.settrace(None)

    def top(self, n: int = 25) -> str:
        return "\n".join(f"{c:6d} {f}" for f, c in self.by_function.most_common(n))


def realistic_pod(i: int, qos: str) -> tuple[api.PodSandbox, api.Container]:
    """A pod with one container as kubelet and containerd make them (labels, annotations,
    environment, mounts; BE with Koordinator's batch resources), like the runtime bench's."""
    uid = f"0000{i:04d}-aaaa-bbbb-cccc-{i:012d}"
    parent = f"/kubepods/{'besteffort' if qos == 'BE' else 'burstable'}/pod{uid}"
    labels = {
        "app": f"svc-{i % 17}",
        "io.kubernetes.pod.name": f"pod-{i}",
        "io.kubernetes.pod.namespace": "default",
        "io.kubernetes.pod.uid": uid,
        "koordinator.sh/qosClass": qos,
        "pod-template-hash": "7d9f8c6b5",
    }
    ann = {"kubernetes.io/config.source": "api", "prometheus.io/scrape": "true", "prometheus.io/port": "9090"}
    if qos == "BE":
        ann["node.koordinator.sh/extended-resource-spec"] = (
            '{"containers":{"main":{"limits":{"kubernetes.io/batch-cpu":"1k","kubernetes.io/batch-memory":"512Mi"},'
            '"requests":{"kubernetes.io/batch-cpu":"500","kubernetes.io/batch-memory":"256Mi"}}}}'
        )
    pod = api.PodSandbox(id=f"{i:064d}", name=f"pod-{i}", uid=uid, namespace="default", labels=labels, annotations=ann)
    pod.linux.cgroup_parent = parent
    pod.linux.cgroups_path = f"{parent}/{i:064d}"
    cid = f"c{i:063d}"
    c = api.Container(id=cid, pod_sandbox_id=pod.id, name="main", state=api.CONTAINER_RUNNING)
    c.labels.update({"io.kubernetes.container.name": "main", "io.kubernetes.pod.uid": uid})
    c.args.extend(["/bin/server", "--port=8080"])
    c.env.extend([f"SERVICE_{k}_PORT=tcp://10.96.0.{k}:80" for k in range(12)])
    for m in ("/etc/hosts", "/etc/hostname", "/etc/resolv.conf", "/var/run/secrets/kubernetes.io/serviceaccount"):
        c.mounts.add(destination=m, type="bind", source=f"/var/lib/kubelet/pods/{uid}{m}", options=["rbind", "rw"])
    r = c.linux.resources
    r.cpu.shares.value = 2 if qos == "BE" else 1024
    r.cpu.period.value = 100000
    if qos != "BE":
        r.cpu.quota.value = 200000
        r.memory.limit.value = 512 << 20
    c.linux.cgroups_path = f"{parent}/{cid}"
    return pod, c


def node_of(n: int) -> tuple[list[api.PodSandbox], list[api.Container]]:
    """``n`` pods of one container each, LS/BE/LSR in turn (what Synchronize hands over)."""
    pods, ctrs = [], []
    for i in range(n):
        p, c = realistic_pod(100000 + i, ("LS", "BE", "LSR")[i % 3])
        pods.append(p)
        ctrs.append(c)
    return pods, ctrs


class RuntimeThread:
    """The runtime side on a loop of its own, in a thread (its work is not the agent's)."""

    def __init__(self, peer: RuntimePeer) -> None:
        self.peer = peer
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="runtime", daemon=True)
        self.thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.submit(self.peer.close()).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@dataclass
class Running:
    """The agent running in this process, and the runtime session that serves it."""

    loop: StoppableClockLoop
    runtime: RuntimeThread
    session: PluginSession
    agent: Any  # nriplugin.agent.Agent

    async def settle(self) -> None:
        """Until the agent's loop has nothing left to do: no ready callback, no worker thread
        about to hand one back."""
        for _ in range(3):
            quiet = 0
            while quiet < 3:
                await asyncio.sleep(0)
                quiet = quiet + 1 if not self.loop._ready else 0  # type: ignore[attr-defined]
            await asyncio.to_thread(time.sleep, 0.005)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """The agent's clock held for a whole series of events (no periodic work between them
        either: what each event costs does not depend on where a round fell)."""
        was = self.loop.held
        self.loop.held = self.loop.time() if was is None else was
        try:
            yield
        finally:
            self.loop.held = was

    async def work_of(self, event: Callable[[PluginSession], Coroutine[Any, Any, object]]) -> Work:
        """The work the agent's thread does for one runtime event, counted with the clock held."""
        with self.held():
            await self.settle()
            work = Work()
            with work.counting():
                await asyncio.wrap_future(self.runtime.submit(event(self.session)))
                await self.settle()
        return work


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def first_decisions(port: int, rounds: int = 3, timeout: float = 30.0) -> None:
    """Until the QoS manager has made its first decisions (``rounds`` rounds, as its metrics
    say): BE's limit, set in its first rounds, changes what a BE event costs, so every node
    must be measured after them, however long a larger node takes to start."""
    url = f"http://127.0.0.1:{port}/metrics"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read().decode())
        for line in text.splitlines():
            if (
                line.startswith("nriplugin_qos_decision_latency_milliseconds_count")
                and float(line.split()[-1]) >= rounds
            ):
                return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"the QoS manager made no {rounds} rounds in {timeout:.0f} s")


def quiet_proc(path: Path) -> Path:
    """A /proc of an idle 2-CPU node that never changes: the QoS manager's state (levels, BE's
    limit) must not depend on what else the machine running the tests is doing, or the same
    event would cost different work in two runs."""
    path.mkdir(parents=True)
    (path / "stat").write_text(
        "cpu  1000 0 1000 100000 0 0 0 0 0 0\ncpu0 500 0 500 50000 0 0 0 0 0 0\ncpu1 500 0 500 50000 0 0 0 0 0 0\n"
    )
    (path / "loadavg").write_text("0.10 0.10 0.10 1/100 1\n")
    (path / "meminfo").write_text(
        "MemTotal:       25165824 kB\nMemFree:        20971520 kB\nMemAvailable:   20971520 kB\n"
    )
    (path / "vmstat").write_text("pgscan_kswapd 0\npgscan_direct 0\n")
    return path


@contextlib.asynccontextmanager
async def running_agent(tmp: Path, known: int, *extra: str) -> AsyncIterator[Running]:
    """``nriplugin run`` with its defaults (QoS manager, reconciler, network QoS, metrics on)
    on a cgroup v1 tree laid out like the kernel's and a still /proc (:func:`quiet_proc`),
    connected to a runtime that synchronizes ``known`` running containers (their cgroups exist
    for the first 60). Stopped on exit."""
    from nriplugin.agent.assembly import Agent
    from nriplugin.cli.main import build_parser

    loop = asyncio.get_running_loop()
    assert isinstance(loop, StoppableClockLoop)
    root = v1_tree(tmp / "cgroup", ["kubepods", "kubepods/besteffort", "kubepods/burstable"])
    pods, ctrs = node_of(known)
    for p, c in list(zip(pods, ctrs, strict=True))[:60]:
        v1_group(root, p.linux.cgroup_parent.strip("/"))
        v1_group(root, c.linux.cgroups_path.strip("/"))
    proc = quiet_proc(tmp / "proc")
    sock = str(tmp / "nri.sock")
    peer = RuntimePeer(pods, ctrs)
    runtime = RuntimeThread(peer)
    runtime.submit(peer.listen(sock)).result(10)
    ns = build_parser().parse_args(
        [
            *("run", "--socket", sock, "--cgroup-root", str(root), "--proc-root", str(proc), "--cri-socket", ""),
            *("--metrics-address", f"127.0.0.1:{(port := free_port())}", *extra),
        ]
    )
    agent = Agent(ns)
    task = loop.create_task(agent.run())
    try:
        session = await asyncio.wrap_future(runtime.submit(peer.next_session(timeout=60)))
        await asyncio.sleep(0.3)  # start-up work (the full pass) done
        await first_decisions(port)
        yield Running(loop, runtime, session, agent)
    finally:
        agent.on_signal()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 10)
        runtime.close()


def run_on_stoppable_loop(coro: Coroutine[Any, Any, T]) -> T:
    loop = StoppableClockLoop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()


@contextlib.contextmanager
def temporary_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="nriplugin-hookwork-") as d:
        yield Path(d)
