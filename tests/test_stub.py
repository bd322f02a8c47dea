"""The stub against the in-process runtime peer, over real unix sockets."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from nriplugin.nri import api_pb2 as api
from nriplugin.nri import ttrpc
from nriplugin.nri.runtime import VENDORED, RuntimeCaps
from nriplugin.nri.stub import HookPolicy, Plugin, Stub, StubOptions, UnsafeOnRuntime, create_response, event_mask
from nriplugin.pacing.selector import PollClock
from nriplugin.pacing.traffic import HookTraffic
from testkit.runtime_peer import PeerCallError, RuntimePeer, make_container, make_pod


class Recorder:
    def __init__(self) -> None:
        self.done: list[str] = []
        self.failed: list[tuple[str, str, bool]] = []
        self.states: list[str] = []
        self.syncs: list[tuple[int, int]] = []
        self.refused: list[tuple[int, int]] = []

    def hook_done(self, event: str, seconds: float) -> None:
        self.done.append(event)

    def hook_failed(self, event: str, reason: str, fail_closed: bool) -> None:
        self.failed.append((event, reason, fail_closed))

    def connection_state(self, state: str) -> None:
        self.states.append(state)

    def synchronized(self, seconds: float, pods: int, containers: int) -> None:
        self.syncs.append((pods, containers))

    def message_refused(self, length: int, limit: int) -> None:
        self.refused.append((length, limit))


class SharesPlugin(Plugin):
    """BE gets shares 2; records what it saw."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self.synced: tuple[int, int] | None = None
        self.configured: tuple[str, str] | None = None

    def configure(self, config: str, runtime_name: str, runtime_version: str) -> None:
        self.configured = (runtime_name, runtime_version)

    def synchronize(self, pods: list[api.PodSandbox], containers: list[api.Container]) -> list[api.ContainerUpdate]:
        self.synced = (len(pods), len(containers))
        out = []
        for c in containers:
            u = api.ContainerUpdate(container_id=c.id)
            u.linux.resources.cpu.shares.value = 2
            out.append(u)
        return out[:1]

    def create_container(self, pod: api.PodSandbox, container: api.Container) -> api.ContainerAdjustment | None:
        self.seen.append(("create", container.id))
        if pod.labels.get("koordinator.sh/qosClass") != "BE":
            return None
        adj = api.ContainerAdjustment()
        adj.linux.resources.cpu.shares.value = 2
        return adj

    def run_pod_sandbox(self, pod: api.PodSandbox) -> None:
        self.seen.append(("run", pod.id))

    def remove_container(self, pod: api.PodSandbox, container: api.Container) -> None:
        self.seen.append(("remove", container.id))


def run(coro_fn: Callable[[Path], Awaitable[Any]], tmp_path: Path) -> Any:
    return asyncio.run(asyncio.wait_for(coro_fn(tmp_path), 30))


async def started(peer: RuntimePeer, plugin: Plugin, tmp: Path, **kw: Any) -> tuple[Stub, asyncio.Task[None]]:
    sock = str(tmp / "nri.sock")
    await peer.listen(sock)
    observer = kw.pop("observer", None)
    opts = StubOptions(socket_path=sock, backoff_initial=0.02, backoff_max=0.1, **kw)
    stub = Stub(plugin, opts, observer=observer)
    task = asyncio.ensure_future(stub.run())
    return stub, task


async def stopped(stub: Stub, task: asyncio.Task[None], peer: RuntimePeer) -> None:
    stub.stop()
    await asyncio.wait_for(task, 5)
    await peer.close()


def test_event_mask_is_derived_from_handlers() -> None:
    mask = event_mask(SharesPlugin())
    assert mask == (1 << (api.CREATE_CONTAINER - 1)) | (1 << (api.RUN_POD_SANDBOX - 1)) | (
        1 << (api.REMOVE_CONTAINER - 1)
    )

    class Nothing(Plugin):
        pass

    with pytest.raises(ValueError, match="no event handler"):
        Stub(Nothing())
    with pytest.raises(ValueError, match="two digits"):
        Stub(SharesPlugin(), StubOptions(idx="1"))


def test_register_configure_synchronize_and_events(tmp_path: Path) -> None:
    async def main(tmp: Path) -> None:
        pods = [make_pod(i, "BE" if i % 2 else "LS") for i in range(4)]
        ctrs = [make_container(i, p) for i, p in enumerate(pods)]
        peer = RuntimePeer(pods, ctrs)
        plugin = SharesPlugin()
        stub, task = await started(peer, plugin, tmp)
        s = await peer.next_session()
        assert (s.name, s.idx) == ("nriplugin", "10")
        assert s.events == event_mask(plugin)
        assert plugin.configured == ("runtime-peer", "v0.0.1")
        assert plugin.synced == (4, 4)
        assert [u.container_id for u in s.sync_updates] == [ctrs[0].id]
        await asyncio.wait_for(stub.ready.wait(), 1)

        be = make_pod(10, "BE")
        rsp = await s.create_container(be, make_container(10, be))
        assert rsp.adjust.linux.resources.cpu.shares.value == 2
        ls = make_pod(11, "LS")
        rsp = await s.create_container(ls, make_container(11, ls))
        assert not rsp.adjust.HasField("linux")
        await s.state_change(api.RUN_POD_SANDBOX, be)
        await s.state_change(api.REMOVE_CONTAINER, be, make_container(10, be))
        await s.state_change(api.STOP_CONTAINER, be, make_container(10, be))  # not subscribed: ignored
        assert plugin.seen == [
            ("create", make_container(10, be).id),
            ("create", make_container(11, ls).id),
            ("run", be.id),
            ("remove", make_container(10, be).id),
        ]
        await stopped(stub, task, peer)

    run(main, tmp_path)


def test_a_plugin_that_keeps_requests_gets_each_creates_wire_bytes(tmp_path: Path) -> None:
    """``keeps_requests``: create_container gets the request as the runtime sent it, besides
    the messages parsed from it (what such a plugin keeps until later)."""

    class Keeper(SharesPlugin):
        keeps_requests = True

        def __init__(self) -> None:
            super().__init__()
            self.kept: list[bytes] = []

        def create_container(  # type: ignore[override]
            self, pod: api.PodSandbox, container: api.Container, request: bytes
        ) -> api.ContainerAdjustment | None:
            self.kept.append(request)
            return super().create_container(pod, container)

    async def main(tmp: Path) -> None:
        peer = RuntimePeer()
        plugin = Keeper()
        stub, task = await started(peer, plugin, tmp)
        s = await peer.next_session()
        await asyncio.wait_for(stub.ready.wait(), 1)
        be = make_pod(10, "BE")
        rsp = await s.create_container(be, make_container(10, be))
        assert rsp.adjust.linux.resources.cpu.shares.value == 2  # answered as without it
        sent = api.CreateContainerRequest(pod=be, container=make_container(10, be)).SerializeToString()
        assert plugin.kept == [sent] and plugin.seen == [("create", make_container(10, be).id)]
        await stopped(stub, task, peer)

    run(main, tmp_path)


@pytest.mark.parametrize("clocked", [True, False])
def test_a_hooks_time_includes_its_wait_behind_other_work_on_the_loop(tmp_path: Path, clocked: bool) -> None:
    """The loop's PollClock starts a hook's time when its bytes could first be read: a request
    that sat 50 ms behind a blocking callback is recorded as at least 50 ms (what the runtime
    waited). Timed from when the loop got to it, the same wait is invisible."""
    poll = PollClock()
    waits: list[float] = []

    class Timed(Recorder):
        def hook_done(self, event: str, seconds: float) -> None:
            if event == "create_container":
                waits.append(seconds)

    async def main(tmp: Path) -> None:
        peer = RuntimePeer()
        stub, task = await started(
            peer, SharesPlugin(), tmp, observer=Timed(), **({"traffic": HookTraffic(poll)} if clocked else {})
        )
        s = await peer.next_session()
        await asyncio.wait_for(stub.ready.wait(), 1)
        be = make_pod(10, "BE")
        t0 = time.perf_counter()
        sent = asyncio.ensure_future(s.create_container(be, make_container(10, be)))
        # other work holds the loop right after the request's bytes went out (the runtime side
        # runs first: a callback queued before the bytes arrive, as the loop's own would)
        asyncio.get_running_loop().call_soon(time.sleep, 0.05)
        await sent
        took = time.perf_counter() - t0
        await stopped(stub, task, peer)
        assert took >= 0.05 and len(waits) == 1
        if clocked:
            assert 0.05 <= waits[0] <= took
        else:
            assert waits[0] < 0.05

    with asyncio.Runner(loop_factory=poll.loop) as runner:
        runner.run(asyncio.wait_for(main(tmp_path), 30))


def test_unknown_service_and_method_are_unimplemented(tmp_path: Path) -> None:
    async def main(tmp: Path) -> None:
        peer = RuntimePeer()
        stub, task = await started(peer, SharesPlugin(), tmp)
        s = await peer.next_session()
        with pytest.raises(PeerCallError) as e:
            await s.call("NoSuchMethod", b"")
        assert e.value.code == ttrpc.Code.UNIMPLEMENTED and "NoSuchMethod" in e.value.message
        assert s.transport is not None
        sid, data = s.conn.call("some.Other", "X", b"")
        fut = asyncio.get_running_loop().create_future()
        s.calls[sid] = fut
        s.transport.write(data)
        resp = await asyncio.wait_for(fut, 2)
        assert resp.code == ttrpc.Code.UNIMPLEMENTED and "some.Other" in resp.message
        with pytest.raises(PeerCallError) as e:
            await s.call("CreateContainer", b"\x0a\x05ab")  # truncated protobuf
        assert e.value.code == ttrpc.Code.INVALID_ARGUMENT
        # The connection survives all of that.
        pod = make_pod(1)
        assert (await s.create_container(pod, make_container(1, pod))).adjust.linux.resources.cpu.shares.value == 2
        await stopped(stub, task, peer)

    run(main, tmp_path)


def test_split_synchronize_echoes_more_and_takes_the_node_in_whole(tmp_path: Path) -> None:
    """NRI v0.8+ splits a large Synchronize: each part but the last is answered with ``more``
    echoed and no updates (the runtime checks both), the plugin is called once with the whole
    node, its updates go with the last answer, and hooks work after it."""

    async def main(tmp: Path) -> None:
        pods = [make_pod(i) for i in range(25)]
        ctrs = [make_container(i, p) for i, p in enumerate(pods)]
        peer = RuntimePeer(pods, ctrs, sync_chunk=10, nri="v0.12.5")
        plugin = SharesPlugin()
        stub, task = await started(peer, plugin, tmp)
        s = await peer.next_session()
        assert s.sync_error == "" and s.sync_parts == 3
        assert plugin.synced == (25, 25)  # one call with everything, after the last part
        assert [u.container_id for u in s.sync_updates] == [ctrs[0].id]
        be = make_pod(30, "BE")
        assert (await s.create_container(be, make_container(30, be))).adjust.linux.resources.cpu.shares.value == 2
        await stopped(stub, task, peer)

    run(main, tmp_path)


def test_a_split_synchronize_restarts_with_a_new_connection(tmp_path: Path) -> None:
    """Parts of a Synchronize that a dropped connection left unfinished are not carried over."""

    async def main(tmp: Path) -> None:
        stub = Stub(SharesPlugin(), StubOptions(socket_path=str(tmp / "none.sock")))
        stub._synchronize(api.SynchronizeRequest(pods=[make_pod(1)], more=True))
        assert len(stub._sync_pods) == 1
        with pytest.raises(OSError):
            await stub.connect_once()
        assert stub._sync_pods == [] and stub.caps == RuntimeCaps()

    run(main, tmp_path)


class SlowPlugin(Plugin):
    def __init__(self, delay: float, raise_: bool = False) -> None:
        self.delay = delay
        self.raise_ = raise_

    async def create_container(self, pod: api.PodSandbox, container: api.Container) -> api.ContainerAdjustment:
        await asyncio.sleep(self.delay)
        if self.raise_:
            raise RuntimeError("boom")
        adj = api.ContainerAdjustment()
        adj.linux.resources.cpu.shares.value = 2
        return adj


@pytest.mark.parametrize("fail_closed", [False, True])
def test_budget_and_failure_policy(tmp_path: Path, fail_closed: bool) -> None:
    async def main(tmp: Path) -> None:
        peer = RuntimePeer()
        rec = Recorder()
        plugin = SlowPlugin(1.0)
        sock = str(tmp / "nri.sock")
        await peer.listen(sock)
        policy = HookPolicy(budget=0.05, fail_closed=fail_closed)
        stub = Stub(plugin, StubOptions(socket_path=sock, policies={"create_container": policy}), observer=rec)
        task = asyncio.ensure_future(stub.run())
        s = await peer.next_session()
        pod = make_pod(1)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        if fail_closed:
            with pytest.raises(PeerCallError) as e:
                await s.create_container(pod, make_container(1, pod))
            assert e.value.code == ttrpc.Code.DEADLINE_EXCEEDED
        else:
            rsp = await s.create_container(pod, make_container(1, pod))
            assert not rsp.HasField("adjust")  # no adjustment: the container starts as requested
        assert loop.time() - t0 < 0.6  # answered at the 50 ms budget, not after the 1 s handler
        assert rec.failed == [("create_container", "timeout", fail_closed)]
        # A handler that raises: same policy.
        plugin.delay, plugin.raise_ = 0, True
        if fail_closed:
            with pytest.raises(PeerCallError, match="boom"):
                await s.create_container(pod, make_container(2, pod))
        else:
            await s.create_container(pod, make_container(2, pod))
        assert rec.failed[-1] == ("create_container", "error", fail_closed)
        # And a good one still works on the same connection.
        plugin.raise_ = False
        rsp = await s.create_container(pod, make_container(3, pod))
        assert rsp.adjust.linux.resources.cpu.shares.value == 2
        assert "create_container" in rec.done
        await stopped(stub, task, peer)

    run(main, tmp_path)


def test_runtime_timeout_caps_the_budget(tmp_path: Path) -> None:
    """The request's own deadline (timeout_nano) wins over a longer policy budget."""

    async def main(tmp: Path) -> None:
        peer = RuntimePeer()
        rec = Recorder()
        sock = str(tmp / "nri.sock")
        await peer.listen(sock)
        stub = Stub(SlowPlugin(1.0), StubOptions(socket_path=sock, default_policy=HookPolicy(budget=5)), observer=rec)
        task = asyncio.ensure_future(stub.run())
        s = await peer.next_session()
        pod = make_pod(1)
        req = api.CreateContainerRequest(pod=pod, container=make_container(1, pod)).SerializeToString()
        t0 = asyncio.get_running_loop().time()
        await s.call("CreateContainer", req, timeout=0.5)
        assert asyncio.get_running_loop().time() - t0 < 0.5
        assert rec.failed == [("create_container", "timeout", False)]
        await stopped(stub, task, peer)

    run(main, tmp_path)


def test_update_containers_outside_and_inside_handlers(tmp_path: Path) -> None:
    async def main(tmp: Path) -> None:
        peer = RuntimePeer(nri="v0.12.5")
        peer.fail_updates = {"bad"}
        calls: list[str] = []

        class Pusher(Plugin):
            stub: Stub

            async def create_container(self, pod: api.PodSandbox, container: api.Container) -> None:
                try:
                    await self.stub.update_containers([api.ContainerUpdate(container_id="x")])
                except RuntimeError as exc:
                    calls.append(str(exc))

        plugin = Pusher()
        stub, task = await started(peer, plugin, tmp)
        plugin.stub = stub
        s = await peer.next_session()
        u1 = api.ContainerUpdate(container_id="good")
        u1.linux.resources.cpu.shares.value = 2
        failed = await stub.update_containers([u1, api.ContainerUpdate(container_id="bad")])
        assert [f.container_id for f in failed] == ["bad"]
        assert peer.updates[0].update[0].linux.resources.cpu.shares.value == 2
        pod = make_pod(1)
        await s.create_container(pod, make_container(1, pod))
        assert calls and "inside an NRI event handler" in calls[0]
        assert len(peer.updates) == 1  # the in-handler call never reached the runtime
        await stopped(stub, task, peer)
        with pytest.raises(ConnectionError):
            await stub.update_containers([u1])

    run(main, tmp_path)


@pytest.mark.parametrize(
    ("nri", "runtime"),
    [("v0.6.1", ("containerd", "1.7.24")), ("v0.8.0", ("containerd", "2.1.9")), ("v0.12.0", ("containerd", "2.3.0"))],
)
def test_update_containers_is_refused_where_it_can_deadlock_the_runtime(
    tmp_path: Path, nri: str, runtime: tuple[str, str]
) -> None:
    """NRI before v0.12.1 holds its adaptation lock while the runtime takes its own for a
    plugin's UpdateContainers, the reverse of every container event (containerd#13733): the
    stub refuses the call there with the reason, and nothing reaches the runtime."""

    async def main(tmp: Path) -> None:
        peer = RuntimePeer(nri=nri, runtime=runtime)
        stub, task = await started(peer, SharesPlugin(), tmp)
        await peer.next_session()
        assert not stub.caps.supports("plugin_updates")
        with pytest.raises(UnsafeOnRuntime, match=r"containerd#13733.*not sent"):
            await stub.update_containers([api.ContainerUpdate(container_id="x")])
        await asyncio.sleep(0.05)
        assert peer.updates == []
        await stopped(stub, task, peer)

    run(main, tmp_path)


def test_reconnect_after_runtime_restart(tmp_path: Path) -> None:
    async def main(tmp: Path) -> None:
        rec = Recorder()
        sock = str(tmp / "nri.sock")
        plugin = SharesPlugin()
        stub = Stub(plugin, StubOptions(socket_path=sock, backoff_initial=0.02, backoff_max=0.1), observer=rec)
        task = asyncio.ensure_future(stub.run())
        await asyncio.sleep(0.2)  # no runtime yet: retrying
        assert stub.connections == 0 and not stub.ready.is_set()
        for round_ in range(3):
            peer = RuntimePeer([make_pod(round_)], [make_container(round_, make_pod(round_))])
            await peer.listen(sock)
            s = await peer.next_session()
            await asyncio.wait_for(stub.ready.wait(), 2)
            pod = make_pod(100 + round_)
            assert (
                await s.create_container(pod, make_container(100, pod))
            ).adjust.linux.resources.cpu.shares.value == 2
            await peer.close()  # runtime goes away
            os.unlink(sock)
            await asyncio.wait_for(s.closed.wait(), 2)
            await asyncio.sleep(0.05)
            assert not stub.ready.is_set()
        assert stub.connections == 3
        assert rec.states.count("registered") == 3
        stub.stop()
        await asyncio.wait_for(task, 2)

    run(main, tmp_path)


def test_exactly_one_live_connection(tmp_path: Path) -> None:
    async def main(tmp: Path) -> None:
        peer = RuntimePeer()
        stub, task = await started(peer, SharesPlugin(), tmp)
        await peer.next_session()
        await asyncio.sleep(0.3)
        assert stub.connections == 1 and len(peer.sessions) == 1
        await stopped(stub, task, peer)

    run(main, tmp_path)


def test_registration_refused_is_retried(tmp_path: Path) -> None:
    """A runtime that never answers RegisterPlugin: the stub gives up on that connection
    after the registration timeout and tries again, never holding two connections."""

    async def main(tmp: Path) -> None:
        sock = str(tmp / "nri.sock")
        accepted: list[socket.socket] = []
        srv = socket.socket(socket.AF_UNIX)
        srv.bind(sock)
        srv.listen(8)
        srv.setblocking(False)
        import nriplugin.nri.stub as stubmod

        old = stubmod.REGISTRATION_TIMEOUT
        stubmod.REGISTRATION_TIMEOUT = 0.1
        try:
            stub = Stub(SharesPlugin(), StubOptions(socket_path=sock, backoff_initial=0.01, backoff_max=0.02))
            task = asyncio.ensure_future(stub.run())
            loop = asyncio.get_running_loop()
            for _ in range(2):
                c, _ = await asyncio.wait_for(loop.sock_accept(srv), 2)
                accepted.append(c)
                c.setblocking(False)
                assert await asyncio.wait_for(loop.sock_recv(c, 100), 2)  # the RegisterPlugin call
                # the stub closes this connection after its timeout
                assert await asyncio.wait_for(loop.sock_recv(c, 100), 2) == b""
            stub.stop()
            await asyncio.wait_for(task, 2)
        finally:
            stubmod.REGISTRATION_TIMEOUT = old
            for c in accepted:
                c.close()
            srv.close()

    run(main, tmp_path)


def test_protocol_error_drops_the_connection_and_reconnects(tmp_path: Path) -> None:
    async def main(tmp: Path) -> None:
        peer = RuntimePeer()
        stub, task = await started(peer, SharesPlugin(), tmp)
        s = await peer.next_session()
        assert s.transport is not None
        s.transport.write(b"\x00\x00\x00\x01\xff\xff\xff\xff")  # frame far over the limit
        await asyncio.wait_for(s.closed.wait(), 2)
        s2 = await peer.next_session()
        assert s2 is not s and stub.connections == 2
        await stopped(stub, task, peer)

    run(main, tmp_path)


def test_inherited_fd_mode(tmp_path: Path) -> None:
    """Pre-registered mode: the runtime hands over one end of a socketpair; Configure but
    no Synchronize (containerd 1.7), and the plugin exits when the runtime closes it."""

    async def main(tmp: Path) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        peer = RuntimePeer(synchronize=False)
        await peer.adopt(ours)
        os.environ.update({"NRI_PLUGIN_SOCKET": str(theirs.detach()), "NRI_PLUGIN_NAME": "pre", "NRI_PLUGIN_IDX": "42"})
        try:
            opts = StubOptions.from_env()
        finally:
            for k in ("NRI_PLUGIN_SOCKET", "NRI_PLUGIN_NAME", "NRI_PLUGIN_IDX"):
                del os.environ[k]
        stub = Stub(SharesPlugin(), opts)
        task = asyncio.ensure_future(stub.run())
        s = await peer.next_session()
        assert (s.name, s.idx) == ("pre", "42")
        await asyncio.wait_for(stub.ready.wait(), 2)
        pod = make_pod(1)
        assert (await s.create_container(pod, make_container(1, pod))).adjust.linux.resources.cpu.shares.value == 2
        s.close()
        await asyncio.wait_for(task, 2)  # returns: nothing to reconnect to
        assert stub.connections == 1

    run(main, tmp_path)


@pytest.mark.parametrize("raw", ["abc", "\u00b3", "-1"])
def test_invalid_fd_in_environment(raw: str) -> None:
    """Not a number, or a digit only to Unicode ("³"): a clear error, not int()'s."""
    os.environ["NRI_PLUGIN_SOCKET"] = raw
    try:
        with pytest.raises(ValueError, match="NRI_PLUGIN_SOCKET"):
            StubOptions.from_env()
    finally:
        del os.environ["NRI_PLUGIN_SOCKET"]


@pytest.mark.parametrize("idx", ["1", "123", "ab", "\u00b9\u00b2", "\u0661\u0662"])
def test_a_plugin_index_is_two_ascii_digits(idx: str) -> None:
    from nriplugin.nri.stub import check_identity

    check_identity("nriplugin", "07")
    with pytest.raises(ValueError, match="two digits"):
        check_identity("nriplugin", idx)


def test_failed_synchronize_drops_the_connection_and_retries(tmp_path: Path) -> None:
    """The runtime ignores a plugin whose Synchronize failed; the stub must not sit on that
    dead connection but register again."""

    class FlakySync(SharesPlugin):
        calls = 0

        def synchronize(self, pods: list[api.PodSandbox], containers: list[api.Container]) -> list[api.ContainerUpdate]:
            FlakySync.calls += 1
            if FlakySync.calls == 1:
                raise RuntimeError("state not loaded yet")
            return super().synchronize(pods, containers)

    async def main(tmp: Path) -> None:
        pods = [make_pod(1)]
        peer = RuntimePeer(pods, [make_container(1, pods[0])])
        stub, task = await started(peer, FlakySync(), tmp)
        s = await peer.next_session()
        assert FlakySync.calls == 2 and stub.connections == 2 and s.sync_error == ""
        assert stub.ready.is_set()
        await stopped(stub, task, peer)

    run(main, tmp_path)


def test_placeholder_registers_first_and_holds_requests(tmp_path: Path) -> None:
    """Start-up: register with a light placeholder, answer Configure with the real plugin's
    events once it is loaded."""

    class Placeholder(Plugin):
        def create_container(self, pod: api.PodSandbox, container: api.Container) -> None:
            return None

    async def main(tmp: Path) -> None:
        sock = str(tmp / "nri.sock")
        peer = RuntimePeer([make_pod(1)], [make_container(1, make_pod(1))])
        await peer.listen(sock)
        stub = Stub(Placeholder(), StubOptions(socket_path=sock), placeholder=True)
        task = asyncio.ensure_future(stub.run())
        for _ in range(200):
            if peer.sessions or stub.connections:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        assert not stub.ready.is_set()  # Configure is held until the real plugin is there
        real = SharesPlugin()
        stub.replace_plugin(real)
        s = await peer.next_session()
        assert s.events == event_mask(real) and real.synced == (1, 1)
        await stopped(stub, task, peer)

    run(main, tmp_path)


class ManyUpdates(SharesPlugin):
    """Answers Synchronize with updates for every container, each carrying ~1 KB."""

    def synchronize(self, pods: list[api.PodSandbox], containers: list[api.Container]) -> list[api.ContainerUpdate]:
        self.synced = (len(pods), len(containers))
        out = []
        for c in containers:
            u = api.ContainerUpdate(container_id=c.id)
            u.linux.resources.unified["x.note"] = "n" * 1000
            out.append(u)
        return out


def big_node(n: int, note: int) -> tuple[list[api.PodSandbox], list[api.Container]]:
    pods = [make_pod(i, "BE") for i in range(n)]
    for p in pods:
        p.annotations["kubectl.kubernetes.io/last-applied-configuration"] = "{" + "a" * note + "}"
    return pods, [make_container(i, p) for i, p in enumerate(pods)]


@pytest.mark.parametrize("nri", ["v0.12.5", "v0.6.1"])
def test_synchronize_over_4mib_is_accepted_and_an_answer_over_4mib_is_split(
    tmp_path: Path, nri: str, caplog: pytest.LogCaptureFixture
) -> None:
    """containerd 1.7 sends Synchronize whole (here ~5.5 MB, over ttrpc's 4 MiB): accepted.
    Our answer (~5 MB of updates) would be refused by the runtime: what fits goes in the
    answer, the rest follows in UpdateContainers calls, each within 4 MiB, nothing lost. Not
    on an NRI before v0.12.1, where a plugin's UpdateContainers can deadlock the runtime: the
    rest is left out, said once in the log (the agent's reconciler writes those files)."""

    async def main(tmp: Path) -> None:
        pods, ctrs = big_node(4500, 1000)
        assert api.SynchronizeRequest(pods=pods, containers=ctrs).ByteSize() > ttrpc.MAX_MESSAGE
        peer = RuntimePeer(pods, ctrs, request_timeout=10, nri=nri)
        plugin = ManyUpdates()
        stub, task = await started(peer, plugin, tmp)
        s = await peer.next_session(10)
        assert s.sync_error == "" and plugin.synced == (4500, 4500)
        answered = [u.container_id for u in s.sync_updates]
        assert 0 < len(answered) < 4500  # what fits
        if nri == "v0.6.1":
            await asyncio.sleep(0.2)
            assert peer.updates == []
            left = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
            assert len(left) == 1 and f"{4500 - len(answered)} updates left out" in left[0], left
            await stopped(stub, task, peer)
            return
        for _ in range(200):
            if len(s.sync_updates) + sum(len(r.update) for r in peer.updates) >= 4500:
                break
            await asyncio.sleep(0.02)
        pushed = [u.container_id for r in peer.updates for u in r.update]
        assert pushed  # split, both ways used
        assert sorted(answered + pushed) == sorted(c.id for c in ctrs)  # each exactly once
        assert all(r.ByteSize() <= ttrpc.MAX_MESSAGE for r in peer.updates)
        await stopped(stub, task, peer)

    run(main, tmp_path)


def test_a_message_over_the_bound_is_refused_counted_and_not_retried_in_a_loop(tmp_path: Path) -> None:
    async def main(tmp: Path) -> None:
        pods, ctrs = big_node(300, 1000)  # ~400 KB, over this stub's 64 KiB bound
        peer = RuntimePeer(pods, ctrs)
        obs = Recorder()
        sock = str(tmp / "nri.sock")
        await peer.listen(sock)
        opts = StubOptions(socket_path=sock, backoff_initial=0.01, max_message=64 << 10, refused_retry=60)
        stub = Stub(SharesPlugin(), opts, observer=obs)
        task = asyncio.ensure_future(stub.run())
        for _ in range(200):
            if obs.refused and "disconnected" in obs.states:
                break
            await asyncio.sleep(0.01)
        assert len(obs.refused) == 1 and obs.refused[0][1] == 64 << 10 and obs.refused[0][0] > 64 << 10
        await asyncio.sleep(0.5)  # 50 backoffs' worth: still one connection, no loop
        assert stub.connections == 1 and len(obs.refused) == 1 and not stub.ready.is_set()
        t0 = time.monotonic()
        await stopped(stub, task, peer)  # the long wait ends at once on stop()
        assert time.monotonic() - t0 < 1

    run(main, tmp_path)


class PodPlugin(SharesPlugin):
    """Handles the pod-update events of NRI v0.10+ besides the v0.6 ones; records caps."""

    caps: RuntimeCaps | None = None

    def runtime_caps(self, caps: RuntimeCaps) -> None:
        self.caps = caps

    def update_pod_sandbox(self, pod: api.PodSandbox, resources: api.LinuxResources) -> None:
        self.seen.append(("update_pod", f"{pod.id[-2:]}:{resources.cpu.shares.value}"))

    def post_update_pod_sandbox(self, pod: api.PodSandbox) -> None:
        self.seen.append(("post_update_pod", pod.id[-2:]))

    def start_container(self, pod: api.PodSandbox, container: api.Container) -> None:
        self.seen.append(("start", container.id[-2:]))


def bit(*events: int) -> int:
    return sum(1 << (e - 1) for e in events)


V06_EVENTS = bit(api.RUN_POD_SANDBOX, api.CREATE_CONTAINER, api.START_CONTAINER, api.REMOVE_CONTAINER)
POD_UPDATE = bit(api.UPDATE_POD_SANDBOX, api.POST_UPDATE_POD_SANDBOX)


@pytest.mark.parametrize(
    ("nri", "subscribed", "source"),
    [("v0.6.1", V06_EVENTS, "assumed"), ("v0.12.5", V06_EVENTS | POD_UPDATE, "runtime")],
)
def test_subscription_is_cut_to_the_events_the_runtime_knows(
    tmp_path: Path, nri: str, subscribed: int, source: str
) -> None:
    """A runtime refuses events it does not know at registration: a v0.6 runtime is offered the
    v0.6 events only, a v0.12 runtime (which says its version in Configure) all handled ones."""

    async def main(tmp: Path) -> None:
        peer = RuntimePeer(nri=nri)
        plugin = PodPlugin()
        stub, task = await started(peer, plugin, tmp)
        s = await peer.next_session()
        assert s.sync_error == "" and s.events == subscribed
        assert s.plugin_nri == VENDORED  # ours, said at registration
        assert plugin.caps is stub.caps and (stub.caps.nri_version, stub.caps.source) == (nri, source)
        await stopped(stub, task, peer)

    run(main, tmp_path)


def test_a_plugin_of_events_the_runtime_does_not_know_fails_configure(tmp_path: Path) -> None:
    """Zero would mean "all events" to the runtime: Configure fails with a reason instead."""

    class OnlyPodUpdates(Plugin):
        def update_pod_sandbox(self, pod: api.PodSandbox, resources: api.LinuxResources) -> None: ...

    async def main(tmp: Path) -> None:
        peer = RuntimePeer(nri="v0.6.1")
        stub, task = await started(peer, OnlyPodUpdates(), tmp)
        for _ in range(100):
            if any(ses.sync_error for ses in peer.all_sessions):
                break
            await asyncio.sleep(0.02)
        assert any("knows none of the events" in ses.sync_error for ses in peer.all_sessions)
        await stopped(stub, task, peer)

    run(main, tmp_path)


def test_v012_dedicated_rpcs_are_served(tmp_path: Path) -> None:
    """A v0.12 runtime calls one RPC per event and falls back to StateChange only on
    UNIMPLEMENTED: every dedicated RPC is answered (none falls back), events the plugin did
    not subscribe to are answered empty, and methods it does not know are UNIMPLEMENTED."""

    async def main(tmp: Path) -> None:
        peer = RuntimePeer(nri="v0.12.5")
        plugin = PodPlugin()
        stub, task = await started(peer, plugin, tmp)
        s = await peer.next_session()
        pod, ctr = make_pod(7, "BE"), make_container(7, make_pod(7, "BE"))
        await s.notify(api.RUN_POD_SANDBOX, pod)
        await s.notify(api.START_CONTAINER, pod, ctr)
        res = api.LinuxResources()
        res.cpu.shares.value = 512
        await s.update_pod_sandbox(pod, res)
        await s.notify(api.POST_UPDATE_POD_SANDBOX, pod)
        await s.notify(api.REMOVE_CONTAINER, pod, ctr)
        for ev in (api.STOP_POD_SANDBOX, api.POST_START_CONTAINER):  # not subscribed
            await s.notify(ev, pod, None if ev == api.STOP_POD_SANDBOX else ctr)
        assert s.fallbacks == []
        assert plugin.seen == [
            ("run", pod.id),
            ("start", ctr.id[-2:]),
            ("update_pod", "07:512"),
            ("post_update_pod", "07"),
            ("remove", ctr.id),
        ]
        with pytest.raises(PeerCallError) as e:
            await s.call("ValidateContainerAdjustment", api.ValidateContainerAdjustmentRequest().SerializeToString())
        assert e.value.code == ttrpc.Code.UNIMPLEMENTED
        await stopped(stub, task, peer)

    run(main, tmp_path)


def test_pod_update_over_state_change_from_a_v010_runtime(tmp_path: Path) -> None:
    """Runtimes before v0.12 do not say their NRI version: containerd's is inferred from its
    own (2.2.0 vendors v0.10, which knows the pod-update events), and events without a
    dedicated RPC there come over StateChange."""

    async def main(tmp: Path) -> None:
        peer = RuntimePeer(nri="v0.10.0", runtime=("containerd", "v2.2.0"))
        plugin = PodPlugin()
        stub, task = await started(peer, plugin, tmp)
        s = await peer.next_session()
        assert s.events == V06_EVENTS | POD_UPDATE
        assert (stub.caps.nri_version, stub.caps.source) == ("v0.10.0", "inferred")
        pod = make_pod(8)
        await s.notify(api.POST_UPDATE_POD_SANDBOX, pod)
        await s.state_change(api.UPDATE_POD_SANDBOX, pod)
        assert plugin.seen == [("post_update_pod", "08"), ("update_pod", "08:0")]
        await stopped(stub, task, peer)

    run(main, tmp_path)


@pytest.mark.parametrize("size", ["empty", "usual", "long"])
def test_an_adjustment_alone_is_answered_as_the_response_message_would_encode_it(size: str) -> None:
    """CreateContainer's usual answer is framed by hand; the runtime must read exactly what
    protobuf would have written (a body over 127 bytes takes a two-byte length)."""
    adj = api.ContainerAdjustment()
    if size != "empty":
        adj.linux.resources.cpu.shares.value = 2
        adj.linux.resources.cpu.quota.value = 100_000
        adj.linux.resources.memory.limit.value = 1 << 30
    if size == "long":
        for i in range(6):  # repeated, not a map: a map's order is not fixed
            adj.mounts.add(destination=f"/data/{i}", source=f"/var/lib/example/{i}", type="bind")
    wire = create_response(adj, lambda rest: pytest.fail("nothing to push"))
    assert wire == api.CreateContainerResponse(adjust=adj).SerializeToString()
    assert api.CreateContainerResponse.FromString(wire).adjust == adj
    assert (len(adj.SerializeToString()) > 127) == (size == "long")


def test_the_trunk_tells_of_every_answer(tmp_path: Path) -> None:
    """The loop's clock hears of each answer (how it knows a burst of hooks from other I/O)."""
    told: list[float] = []

    class Told(HookTraffic):
        def answered(self, at: float) -> None:
            told.append(at)

    async def main(tmp: Path) -> None:
        peer = RuntimePeer()
        stub, task = await started(peer, SharesPlugin(), tmp, traffic=Told())
        s = await peer.next_session()
        await asyncio.wait_for(stub.ready.wait(), 1)
        before = len(told)  # Configure and Synchronize were answered too
        for i in range(3):
            be = make_pod(20 + i, "BE")
            await s.create_container(be, make_container(20 + i, be))
        assert len(told) == before + 3 and before >= 2
        await stopped(stub, task, peer)

    run(main, tmp_path)
