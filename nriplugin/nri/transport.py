"""The thin asyncio driver of :class:`NriConnection` over a unix socket or an inherited fd.

All protocol decisions live in the sans-IO layers; this only moves bytes, resolves call
futures and hands incoming requests to a callback. It is an ``asyncio.Protocol`` (not
streams) so a request is dispatched straight from ``data_received`` with no extra task hop.

A hook's time starts when its bytes could first have been read, not when the loop got to
them: the loop's clock bounds that moment (:class:`TrunkTraffic`, ``arrival``), and so does
the trunk's last answer (the runtime sends a plugin one request at a time: NRI's adaptation
holds its lock across each event). So the hook-latency histogram includes the time a request
sat behind other work on the loop — what the runtime waits for, and what a plugin-side timer
alone cannot see.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from typing import Protocol

from nriplugin.nri import ttrpc
from nriplugin.nri.connection import NriConnection
from nriplugin.nri.errors import ProtocolError


class CallError(Exception):
    """A call to the peer was answered with an error status."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{ttrpc.Code(code).name if code in ttrpc.Code._value2member_map_ else code}: {message}")
        self.code = code
        self.message = message


READ_BUFFER = 256 * 1024  # one read's most (asyncio's own read size)


class TrunkTraffic(Protocol):
    """What a trunk tells the loop it shares, and asks it (the agent's is
    :class:`nriplugin.pacing.traffic.HookTraffic`: work sharing the loop ends its turn when a
    request waits, and waits out a burst of hooks)."""

    def arrival(self) -> float:
        """When the bytes being handled could first have been read (perf_counter time)."""
        ...

    def opened(self, fd: int) -> None: ...
    def closed(self, fd: int) -> None: ...
    def answered(self, at: float) -> None: ...


class Unshared:
    """A trunk whose loop runs nothing else worth telling: a request's time starts when it
    is handled."""

    arrival = staticmethod(time.perf_counter)

    def opened(self, fd: int) -> None:
        pass

    def closed(self, fd: int) -> None:
        pass

    def answered(self, at: float) -> None:
        pass


class Trunk(asyncio.BufferedProtocol):
    """The trunk's end in this process. A buffered protocol: every read goes into one buffer
    allocated once (a plain protocol gets a fresh 256 KiB bytes object per read, and allocating
    it costs more than the read itself)."""

    def __init__(
        self,
        conn: NriConnection,
        on_request: Callable[[ttrpc.RequestReceived], None],
        on_refused: Callable[[ttrpc.RequestTooLarge], None] | None = None,
        traffic: TrunkTraffic | None = None,
    ) -> None:
        """``traffic``: the loop's clock of arrivals, told when this trunk opens, answers and
        closes (default: :class:`Unshared`)."""
        self.conn = conn
        self.on_request = on_request
        self.on_refused = on_refused  # a request over the receive bound (answered with an error here)
        self.transport: asyncio.Transport | None = None
        loop = asyncio.get_running_loop()
        self.closed: asyncio.Future[Exception | None] = loop.create_future()
        self._calls: dict[int, asyncio.Future[ttrpc.Response]] = {}
        self.traffic: TrunkTraffic = Unshared() if traffic is None else traffic
        self._arrival = self.traffic.arrival
        self._answered = 0.0  # when the last answer went out: the next request came after it
        self.arrived = 0.0  # perf_counter time the request being handled could first be read
        self._buffer = memoryview(bytearray(READ_BUFFER))
        self._fd = -1  # the socket's number while connected (told to the traffic)

    # asyncio.BufferedProtocol -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's are not asyncio.Transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.fileno() >= 0:
            self._fd = sock.fileno()
            self.traffic.opened(self._fd)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self._buffer[:nbytes])

    def data_received(self, data: bytes | memoryview) -> None:
        """Bytes read from the trunk (a view of the read buffer: nothing here keeps it)."""
        self.arrived = max(self._arrival(), self._answered)
        try:
            events = self.conn.receive_data(data)
        except ProtocolError as exc:
            self._fail(exc)
            return
        for ev in events:
            if isinstance(ev, ttrpc.RequestReceived):
                self.on_request(ev)
            elif isinstance(ev, ttrpc.ResponseReceived):
                fut = self._calls.pop(ev.stream_id, None)
                if fut is not None and not fut.done():
                    fut.set_result(ev.response)
            else:
                self.write(self.conn.reject(ev))
                if isinstance(ev, ttrpc.RequestTooLarge) and self.on_refused is not None:
                    self.on_refused(ev)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._fd >= 0:  # before asyncio closes the socket: its number may be reused
            self.traffic.closed(self._fd)
        self._fd = -1
        err = exc or ConnectionResetError("NRI connection closed by peer")
        for fut in self._calls.values():
            if not fut.done():
                fut.set_exception(err)
        self._calls.clear()
        if not self.closed.done():
            self.closed.set_result(exc)

    # API ----------------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def respond(self, stream_id: int, payload: bytes = b"", code: int = 0, message: str = "") -> None:
        self.write(self.conn.respond(stream_id, payload, code, message))
        self._answered = time.perf_counter()
        self.traffic.answered(self._answered)

    async def call(self, service: str, method: str, payload: bytes, timeout: float) -> bytes:
        """Call ``service/method`` on the peer; returns the response payload or raises."""
        if self.transport is None or self.transport.is_closing():
            raise ConnectionResetError("NRI connection is closed")
        sid, data = self.conn.call(service, method, payload, int(timeout * 1e9))
        fut: asyncio.Future[ttrpc.Response] = asyncio.get_running_loop().create_future()
        self._calls[sid] = fut
        self.write(data)
        try:
            resp = await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            self._calls.pop(sid, None)
            self.conn.client.abandon(sid)
            raise
        if resp.code:
            raise CallError(resp.code, resp.message)
        return resp.payload

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _fail(self, exc: Exception) -> None:
        if not self.closed.done():
            self.closed.set_result(exc)
        if self.transport is not None:
            self.transport.abort()


async def open_trunk(
    on_request: Callable[[ttrpc.RequestReceived], None],
    *,
    path: str | None = None,
    fd: int | None = None,
    max_message: int = ttrpc.RECEIVE_BOUND,
    on_refused: Callable[[ttrpc.RequestTooLarge], None] | None = None,
    traffic: TrunkTraffic | None = None,
) -> Trunk:
    """Connect to the runtime by socket path, or adopt an inherited connected socket fd."""
    loop = asyncio.get_running_loop()
    conn = NriConnection(max_message=max_message)
    if fd is not None:
        sock = socket.socket(fileno=fd)
        _, proto = await loop.create_unix_connection(lambda: Trunk(conn, on_request, on_refused, traffic), sock=sock)
    elif path is not None:
        _, proto = await loop.create_unix_connection(lambda: Trunk(conn, on_request, on_refused, traffic), path)
    else:
        raise ValueError("need a socket path or an inherited fd")
    return proto
