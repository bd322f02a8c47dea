"""The runtime side of NRI, in-process, for tests and benchmarks.

It speaks the protocol over real sockets (a listening unix socket, or one end of a
socketpair handed to the plugin as an inherited fd) using the same sans-IO codecs from the
other side, and behaves like containerd's NRI adaptation at a chosen NRI version (``nri``):
the plugin calls RegisterPlugin, the runtime answers, calls Configure (v0.12: with its NRI
version; an event it does not know in the subscription is refused), then Synchronize (split
with ``more`` when ``sync_chunk`` is set: v0.8 and later), then sends events (v0.12: the
dedicated RPC, falling back to StateChange when the plugin answers UNIMPLEMENTED); the plugin
may call UpdateContainers at any time.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nriplugin.nri import api_pb2 as api
from nriplugin.nri import ttrpc
from nriplugin.nri.connection import NriConnection
from nriplugin.nri.errors import ProtocolError
from nriplugin.nri.stub import PLUGIN_SERVICE, RUNTIME_SERVICE, Plugin, Stub, StubOptions

# NRI v0.12's dedicated RPC per event (the ones testkit drives through ``notify``).
DEDICATED: dict[int, tuple[str, type[Any]]] = {
    api.RUN_POD_SANDBOX: ("RunPodSandbox", api.RunPodSandboxRequest),
    api.STOP_POD_SANDBOX: ("StopPodSandbox", api.StopPodSandboxRequest),
    api.REMOVE_POD_SANDBOX: ("RemovePodSandbox", api.RemovePodSandboxRequest),
    api.POST_CREATE_CONTAINER: ("PostCreateContainer", api.PostCreateContainerRequest),
    api.START_CONTAINER: ("StartContainer", api.StartContainerRequest),
    api.POST_START_CONTAINER: ("PostStartContainer", api.PostStartContainerRequest),
    api.POST_UPDATE_CONTAINER: ("PostUpdateContainer", api.PostUpdateContainerRequest),
    api.REMOVE_CONTAINER: ("RemoveContainer", api.RemoveContainerRequest),
    api.POST_UPDATE_POD_SANDBOX: ("PostUpdatePodSandbox", api.PostUpdatePodSandboxRequest),
}


def nri_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.lstrip("v").split("."))


def known_events(version: str) -> int:
    """The event mask a runtime of NRI ``version`` accepts: events 1-11, and 12-14 from v0.10."""
    last = api.VALIDATE_CONTAINER_ADJUSTMENT if nri_tuple(version) >= (0, 10) else api.REMOVE_CONTAINER
    return (1 << last) - 1


class PeerCallError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclass
class PluginSession:
    """One connected plugin, as the runtime sees it."""

    peer: RuntimePeer
    conn: NriConnection = field(default_factory=NriConnection.runtime_side)
    transport: asyncio.Transport | None = None
    registered: asyncio.Event = field(default_factory=asyncio.Event)
    synchronized: asyncio.Event = field(default_factory=asyncio.Event)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    name: str = ""
    idx: str = ""
    events: int = 0
    sync_updates: list[api.ContainerUpdate] = field(default_factory=list)
    sync_error: str = ""
    calls: dict[int, asyncio.Future[ttrpc.Response]] = field(default_factory=dict)
    protocol_error: Exception | None = None
    plugin_nri: str = ""  # the NRI version the plugin said at registration
    sync_parts: int = 0  # Synchronize requests sent (more than one: split)
    fallbacks: list[str] = field(default_factory=list)  # dedicated RPCs answered UNIMPLEMENTED

    async def call(self, method: str, msg: bytes, timeout: float | None = None) -> bytes:
        timeout = self.peer.request_timeout if timeout is None else timeout
        assert self.transport is not None
        sid, data = self.conn.call(PLUGIN_SERVICE, method, msg, int(timeout * 1e9))
        fut: asyncio.Future[ttrpc.Response] = asyncio.get_running_loop().create_future()
        self.calls[sid] = fut
        self.transport.write(data)
        try:
            resp = await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            self.conn.client.abandon(sid)
            self.calls.pop(sid, None)
            raise
        if resp.code:
            raise PeerCallError(resp.code, resp.message)
        return resp.payload

    async def create_container(self, pod: api.PodSandbox, ctr: api.Container) -> api.CreateContainerResponse:
        req = api.CreateContainerRequest(pod=pod, container=ctr)
        return api.CreateContainerResponse.FromString(await self.call("CreateContainer", req.SerializeToString()))

    async def update_container(
        self, pod: api.PodSandbox, ctr: api.Container, res: api.LinuxResources
    ) -> api.UpdateContainerResponse:
        req = api.UpdateContainerRequest(pod=pod, container=ctr, linux_resources=res)
        return api.UpdateContainerResponse.FromString(await self.call("UpdateContainer", req.SerializeToString()))

    async def state_change(self, event: api.Event, pod: api.PodSandbox, ctr: api.Container | None = None) -> None:
        evt = api.StateChangeEvent(event=event, pod=pod)
        if ctr is not None:
            evt.container.CopyFrom(ctr)
        await self.call("StateChange", evt.SerializeToString())

    async def notify(self, event: api.Event, pod: api.PodSandbox, ctr: api.Container | None = None) -> None:
        """An event that carries nothing back, as the runtime sends it: NRI v0.12 calls the
        dedicated RPC and falls back to StateChange on UNIMPLEMENTED; older ones StateChange."""
        rpc = DEDICATED.get(event)
        if rpc is not None and nri_tuple(self.peer.nri) >= (0, 12):
            name, cls = rpc
            req = cls(pod=pod) if ctr is None else cls(pod=pod, container=ctr)
            try:
                await self.call(name, req.SerializeToString())
                return
            except PeerCallError as exc:
                if exc.code != ttrpc.Code.UNIMPLEMENTED:
                    raise
                self.fallbacks.append(name)
        await self.state_change(event, pod, ctr)

    async def update_pod_sandbox(self, pod: api.PodSandbox, res: api.LinuxResources) -> None:
        """NRI v0.10+: a dedicated RPC from the start (no StateChange fallback)."""
        req = api.UpdatePodSandboxRequest(pod=pod, linux_resources=res)
        await self.call("UpdatePodSandbox", req.SerializeToString())

    def subscribed(self, event: int) -> bool:
        return bool(self.events & (1 << (event - 1)))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class _Proto(asyncio.Protocol):
    def __init__(self, session: PluginSession) -> None:
        self.s = session

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.s.transport = transport

    def data_received(self, data: bytes) -> None:
        s = self.s
        try:
            events = s.conn.receive_data(data)
        except ProtocolError as exc:
            s.protocol_error = exc
            assert s.transport is not None
            s.transport.abort()
            return
        for ev in events:
            if isinstance(ev, ttrpc.ResponseReceived):
                fut = s.calls.pop(ev.stream_id, None)
                if fut is not None and not fut.done():
                    fut.set_result(ev.response)
            elif isinstance(ev, ttrpc.RequestReceived):
                s.peer.spawn(s.peer._serve(s, ev))
            else:
                assert s.transport is not None
                s.transport.write(s.conn.reject(ev))

    def connection_lost(self, exc: Exception | None) -> None:
        for fut in self.s.calls.values():
            if not fut.done():
                fut.set_exception(ConnectionResetError("plugin went away"))
        self.s.closed.set()


class RuntimePeer:
    def __init__(
        self,
        pods: list[api.PodSandbox] | None = None,
        containers: list[api.Container] | None = None,
        request_timeout: float = 2.0,
        sync_chunk: int = 0,
        synchronize: bool = True,
        nri: str = "v0.6.1",
        runtime: tuple[str, str] = ("runtime-peer", "v0.0.1"),
    ) -> None:
        self.pods = pods or []
        self.containers = containers or []
        self.request_timeout = request_timeout
        self.sync_chunk = sync_chunk  # >0: split Synchronize with `more`, as NRI v0.8+ does
        if sync_chunk and nri_tuple(nri) < (0, 8):
            raise ValueError(f"NRI {nri} does not split Synchronize")
        self.nri = nri
        self.runtime = runtime  # name and version said in Configure
        self.do_synchronize = synchronize
        self.sessions: list[PluginSession] = []  # configured (and synchronized) ones
        self.all_sessions: list[PluginSession] = []  # every connection, refused ones too
        self.updates: list[api.UpdateContainersRequest] = []
        self.fail_updates: set[str] = set()
        self.update_delay = 0.0
        self.new_session: asyncio.Queue[PluginSession] = asyncio.Queue()
        self.server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Future[None]] = set()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # serving the Runtime service ------------------------------------------------------------

    async def _serve(self, s: PluginSession, ev: ttrpc.RequestReceived) -> None:
        r = ev.request
        assert s.transport is not None
        if r.service != RUNTIME_SERVICE:
            s.transport.write(s.conn.respond(ev.stream_id, code=ttrpc.Code.UNIMPLEMENTED, message=r.service))
            return
        if r.method == "RegisterPlugin":
            req = api.RegisterPluginRequest.FromString(r.payload)
            if not req.plugin_name or len(req.plugin_idx) != 2 or not req.plugin_idx.isdigit():
                s.transport.write(s.conn.respond(ev.stream_id, code=ttrpc.Code.INVALID_ARGUMENT, message="bad id"))
                return
            s.name, s.idx, s.plugin_nri = req.plugin_name, req.plugin_idx, req.NRI_version
            s.transport.write(s.conn.respond(ev.stream_id, api.Empty().SerializeToString()))
            self.spawn(self._configure_and_sync(s))
        elif r.method == "UpdateContainers":
            req2 = api.UpdateContainersRequest.FromString(r.payload)
            if self.update_delay:
                await asyncio.sleep(self.update_delay)
            self.updates.append(req2)
            failed = [u for u in req2.update if u.container_id in self.fail_updates]
            out = api.UpdateContainersResponse(failed=failed).SerializeToString()
            s.transport.write(s.conn.respond(ev.stream_id, out))
        else:
            s.transport.write(s.conn.respond(ev.stream_id, code=ttrpc.Code.UNIMPLEMENTED, message=r.method))

    async def _configure_and_sync(self, s: PluginSession) -> None:
        try:
            cfg = api.ConfigureRequest(config="", runtime_name=self.runtime[0], runtime_version=self.runtime[1])
            if nri_tuple(self.nri) >= (0, 8):
                cfg.request_timeout = int(self.request_timeout * 1000)
                cfg.registration_timeout = 5000
            if nri_tuple(self.nri) >= (0, 12):
                cfg.NRI_version = self.nri
            # Fields a runtime of this version does not know never reach the plugin.
            rpl = api.ConfigureResponse.FromString(await s.call("Configure", cfg.SerializeToString()))
            valid = known_events(self.nri)
            if rpl.events & ~valid:
                raise PeerCallError(3, f"invalid plugin events 0x{rpl.events & ~valid:x}")
            s.events = rpl.events or valid
            s.registered.set()
            if self.do_synchronize:
                await self._synchronize(s)
            s.synchronized.set()
            self.sessions.append(s)
            await self.new_session.put(s)
        except (PeerCallError, TimeoutError, ConnectionError) as exc:
            s.sync_error = str(exc)
            s.close()

    async def _synchronize(self, s: PluginSession) -> None:
        pods, ctrs = self.pods, self.containers
        n = self.sync_chunk or max(len(pods), len(ctrs), 1)
        chunks = [(pods[i : i + n], ctrs[i : i + n]) for i in range(0, max(len(pods), len(ctrs)) or 1, n)]
        for i, (p, c) in enumerate(chunks):
            more = i < len(chunks) - 1
            req = api.SynchronizeRequest(pods=p, containers=c, more=more)
            rpl = api.SynchronizeResponse.FromString(await s.call("Synchronize", req.SerializeToString()))
            s.sync_parts += 1
            # As containerd/nri's adaptation: a part must be answered with `more` echoed and nothing else.
            if more and (rpl.update or not rpl.more):
                raise PeerCallError(9, "plugin does not handle split sync requests")
            s.sync_updates += list(rpl.update)

    # listening ------------------------------------------------------------------------------

    def _factory(self) -> _Proto:
        s = PluginSession(self)
        self.all_sessions.append(s)
        return _Proto(s)

    async def listen(self, path: str) -> None:
        self.server = await asyncio.get_running_loop().create_unix_server(self._factory, path)

    async def adopt(self, sock: socket.socket) -> None:
        """Serve a plugin on our end of a socketpair (pre-registered mode)."""
        await asyncio.get_running_loop().create_unix_connection(self._factory, sock=sock)

    async def next_session(self, timeout: float = 5.0) -> PluginSession:
        return await asyncio.wait_for(self.new_session.get(), timeout)

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            with contextlib.suppress(Exception):
                await self.server.wait_closed()
            self.server = None
        for s in self.all_sessions:
            s.close()


async def over_the_wire(
    tmp: Path, plugin: Plugin, nri: str, runtime: tuple[str, str], body: Callable[[PluginSession], Awaitable[Any]]
) -> Any:
    """``body`` run against ``plugin`` (behind the real stub) by a runtime of NRI ``nri``
    (saying ``runtime`` in Configure) over a real connection in ``tmp``."""
    peer = RuntimePeer(nri=nri, runtime=runtime)
    sock = str(tmp / "nri.sock")
    await peer.listen(sock)
    stub = Stub(plugin, StubOptions(socket_path=sock, backoff_initial=0.02, backoff_max=0.1))
    task = asyncio.ensure_future(stub.run())
    try:
        return await body(await peer.next_session())
    finally:
        stub.stop()
        await asyncio.wait_for(task, 5)
        await peer.close()


def make_pod(i: int, qos: str | None = "BE", parent: str | None = None) -> api.PodSandbox:
    uid = f"0000{i:04d}-aaaa-bbbb-cccc-{i:012d}"
    labels = {"io.kubernetes.pod.name": f"pod-{i}", "io.kubernetes.pod.namespace": "default"}
    if qos:
        labels["koordinator.sh/qosClass"] = qos
    parent = parent or (f"/kubepods/besteffort/pod{uid}" if qos == "BE" else f"/kubepods/burstable/pod{uid}")
    pod = api.PodSandbox(id=f"{i:064d}", name=f"pod-{i}", uid=uid, namespace="default", labels=labels)
    pod.linux.cgroup_parent = parent
    return pod


def make_container(i: int, pod: api.PodSandbox, shares: int = 1024) -> api.Container:
    c = api.Container(id=f"c{i:063d}", pod_sandbox_id=pod.id, name="main", state=api.CONTAINER_RUNNING)
    c.linux.resources.cpu.shares.value = shares
    c.linux.cgroups_path = f"{pod.linux.cgroup_parent}/c{i:063d}"
    return c


def make_lsr(i: int, quota: int, status: str | None = None) -> tuple[api.PodSandbox, api.Container]:
    """An LSR pod with one container asking ``quota`` / 100000 CPUs (a candidate for exclusive
    cores); ``status``: Koordinator's scheduling decision annotation."""
    pod = make_pod(i, "LSR")
    if status is not None:
        pod.annotations["scheduling.koordinator.sh/resource-status"] = status
    ctr = make_container(i, pod)
    ctr.linux.resources.cpu.quota.value = quota
    ctr.linux.resources.cpu.period.value = 100000
    return pod, ctr
