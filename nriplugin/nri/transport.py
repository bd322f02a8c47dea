"""The thin asyncio driver of :class:`NriConnection` over a unix socket or an inherited fd.

All protocol decisions live in the sans-IO layers; this only moves bytes, resolves call
futures and hands incoming requests to a callback. It is an ``asyncio.Protocol`` (not
streams) so a request is dispatched straight from ``data_received`` with no extra task hop.

A hook's time starts when its bytes could first have been read, not when the loop got to
them: :class:`PollClock`, the loop's selector, bounds that moment (see its docstring), and so
does the trunk's last answer (the runtime sends a plugin one request at a time: NRI's
adaptation holds its lock across each event). So the hook-latency histogram includes the time
a request sat behind other work on the loop — what the runtime waits for, and what a
plugin-side timer alone cannot see.
"""

from __future__ import annotations

import asyncio
import collections
import os
import select
import selectors
import socket
import time
from collections.abc import Callable

from nriplugin.nri import ttrpc
from nriplugin.nri.connection import NriConnection
from nriplugin.nri.errors import ProtocolError


class CallError(Exception):
    """A call to the peer was answered with an error status."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{ttrpc.Code(code).name if code in ttrpc.Code._value2member_map_ else code}: {message}")
        self.code = code
        self.message = message


BURST_POLL = 200e-6  # seconds a poll looks without sleeping while requests come back to back


class PollClock(selectors.DefaultSelector):
    """The event loop's selector, noting when the bytes of each turn can have arrived, and
    keeping the loop awake through a burst of requests.

    A request read in a turn arrived after the previous poll returned (else that poll would
    have reported it). Each poll first looks without waiting: what is ready then arrived while
    the loop was busy with other callbacks, at the earliest when that busy spell began, and
    that moment is taken (a bound that errs towards the runtime's view, never below it). Only
    when nothing is ready does the poll sleep; what wakes it arrived as it woke. (How long a
    poll took says nothing: one that finds bytes ready can take tens of microseconds.)

    A thread woken from sleep handles its request on cold caches, after a wake-up that costs
    tens of microseconds on a VM. The runtime sends a plugin one request at a time, so in a
    burst (a workload scaled up, a node draining) the next request follows the answer within
    the runtime's own turnaround. So while requests come back to back — the last sleeping poll
    after an answer (:meth:`answered`) was woken by I/O within ``burst_poll`` — a poll looks
    without sleeping for up to ``burst_poll`` before it sleeps, as Go's scheduler spins before
    parking a thread, and gives the CPU way between looks (:meth:`_give_way`). The first
    look that finds nothing ends the burst: outside bursts (hooks milliseconds apart) the loop
    sleeps at once, and a burst costs at most ``burst_poll`` of CPU beyond its own work.
    ``burst_poll`` 0: never.

    ``idle``, when given, runs just before a poll would sleep, outside bursts (the agent
    collects garbage there, :mod:`nriplugin.agent.idle_gc`); it returns whether it did work,
    and bytes found ready after it arrived while it ran.
    """

    def __init__(self, burst_poll: float = BURST_POLL, idle: Callable[[], bool] | None = None) -> None:
        super().__init__()
        self.burst_poll = burst_poll
        self.idle = idle
        self._returned = self._now()
        self.arrived = self._returned  # the earliest the bytes of this turn can have arrived
        self.burst = False  # the last sleeping poll after an answer was woken by I/O within burst_poll
        self._answer = False  # a request was answered since the last sleeping poll
        self.spun = 0.0  # seconds spent looking without sleeping (the burst's CPU cost)

    @staticmethod
    def _now() -> float:
        return time.perf_counter()

    def _poll(self, timeout: float | None) -> list[tuple[selectors.SelectorKey, int]]:
        return super().select(timeout)

    def arrival(self) -> float:
        return self.arrived

    def answered(self) -> None:
        """The trunk answered a request: only I/O soon after an answer is a burst of hooks (a
        quick reply to one of the agent's own calls, or a file event, is not)."""
        self._answer = True

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._poll(0)
        if ready or timeout == 0:
            self.arrived = self._returned  # ready before this poll: came while the loop was busy
        else:
            began = self._now()
            if self.burst and self.burst_poll > 0:
                ready = self._spin(began, self.burst_poll if timeout is None else min(self.burst_poll, timeout))
            if not ready and self.idle is not None:
                quiet = self._now()
                if self.idle():
                    ready = self._poll(0)
                    self.arrived = quiet  # came while idle work ran
            if not ready:
                left = None if timeout is None else max(0.0, timeout - (self._now() - began))
                ready = self._poll(left)
                self.arrived = self._now()  # woke it
            self.burst = bool(ready) and self._answer and self.arrived - began <= self.burst_poll
            self._answer = False
        self._returned = self._now()
        return ready

    def _spin(self, began: float, span: float) -> list[tuple[selectors.SelectorKey, int]]:
        """Look without sleeping until something is ready or ``span`` has passed, giving the
        CPU way between looks; what is found arrived after the look before it."""
        looked = began
        while True:
            ready = self._poll(0)
            now = self._now()
            if ready:
                self.arrived = looked
                break
            looked = now
            if now - began >= span:
                break
            self._give_way()
        self.spun += now - began
        return ready

    @staticmethod
    def _give_way() -> None:
        """sched_yield(2) between looks: a thread that can run on this CPU (the runtime's
        own, its garbage collector's) runs now, not after the look; with none the call
        returns at once. On 2 CPUs a plain spinner held a CPU the runtime needed to send the
        next request: in two runs of six alternating in-process rounds (bench/hook_latency's
        burst) the runtime's p99 was 455 and 470 us with this, 553 and 634 us without (p50 166
        and 178 us against 156 and 187)."""
        os.sched_yield()

    def loop(self) -> asyncio.AbstractEventLoop:
        """A new event loop on this selector (I/O first: :class:`IOFirstLoop`)."""
        return IOFirstLoop(self)


class IOFirstLoop(asyncio.SelectorEventLoop):
    """An event loop that runs what a poll found ready (a hook's request) before the callbacks
    queued earlier.

    Node-sized jobs give the loop back between turns of 0.25 ms (``await asyncio.sleep(0)``),
    which queues the job's next turn before the loop polls; asyncio would then run that turn
    before the I/O the poll found, so a request that arrived during one turn waited for that
    turn and the next. Here it waits for at most the turn in progress. The order among the
    earlier callbacks, and among the I/O callbacks, is kept."""

    def _process_events(self, event_list: list[tuple[selectors.SelectorKey, int]]) -> None:
        ready: collections.deque[asyncio.Handle] = self._ready  # type: ignore[attr-defined]
        queued = len(ready)
        super()._process_events(event_list)  # type: ignore[misc]
        if queued and len(ready) > queued:
            ready.rotate(len(ready) - queued)


READ_BUFFER = 256 * 1024  # one read's most (asyncio's own read size)

# The trunks' sockets, polled without waiting by :func:`hook_waiting`.
_trunks = select.poll()
_trunk_fds: set[int] = set()
_last_answer = 0.0  # perf_counter time of the last answer on any trunk (:func:`last_answer`)


def last_answer() -> float:
    """When a trunk last answered a request (perf_counter time; 0: never): work that waits out
    a burst of hooks (``node/turns.py``, ``Quiet``) tells from it whether the burst is over."""
    return _last_answer


def hook_waiting() -> bool:
    """Whether a runtime's bytes are waiting on a trunk (a hook request, most likely): a job
    that shares the loop with the hooks ends its turn early then (``node/turns.py``). One
    poll(2) of the trunks alone, under a microsecond: the loop's own selector would also
    report the inotify events the agent's own cgroup writes raise."""
    if not _trunk_fds:
        return False
    return any(ev & (select.POLLIN | select.POLLHUP | select.POLLERR) for _, ev in _trunks.poll(0))


class Trunk(asyncio.BufferedProtocol):
    """The trunk's end in this process. A buffered protocol: every read goes into one buffer
    allocated once (a plain protocol gets a fresh 256 KiB bytes object per read, and allocating
    it cost more than the read itself: 17 us of the 20 us a hook request's read took)."""

    def __init__(
        self,
        conn: NriConnection,
        on_request: Callable[[ttrpc.RequestReceived], None],
        on_refused: Callable[[ttrpc.RequestTooLarge], None] | None = None,
        arrival: Callable[[], float] = time.perf_counter,
        answered: Callable[[], None] | None = None,
    ) -> None:
        """``arrival``: when the bytes being handled could first have been read (the loop's
        :meth:`PollClock.arrival`; without one, the moment they are handled); ``answered``:
        told of every answer (:meth:`PollClock.answered`)."""
        self.conn = conn
        self.on_request = on_request
        self.on_refused = on_refused  # a request over the receive bound (answered with an error here)
        self.transport: asyncio.Transport | None = None
        loop = asyncio.get_running_loop()
        self.closed: asyncio.Future[Exception | None] = loop.create_future()
        self._calls: dict[int, asyncio.Future[ttrpc.Response]] = {}
        self._arrival = arrival
        self._on_answer = answered
        self._answered = 0.0  # when the last answer went out: the next request came after it
        self.arrived = 0.0  # perf_counter time the request being handled could first be read
        self._buffer = memoryview(bytearray(READ_BUFFER))
        self._fd = -1  # the socket's number while connected (hook_waiting polls it)

    # asyncio.BufferedProtocol -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's are not asyncio.Transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.fileno() >= 0:
            self._fd = sock.fileno()
            _trunks.register(self._fd, select.POLLIN)
            _trunk_fds.add(self._fd)

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
        if self._fd in _trunk_fds:  # before asyncio closes the socket: its number may be reused
            _trunk_fds.discard(self._fd)
            _trunks.unregister(self._fd)
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
        global _last_answer
        self.write(self.conn.respond(stream_id, payload, code, message))
        self._answered = _last_answer = time.perf_counter()
        if self._on_answer is not None:
            self._on_answer()

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
    arrival: Callable[[], float] = time.perf_counter,
    answered: Callable[[], None] | None = None,
) -> Trunk:
    """Connect to the runtime by socket path, or adopt an inherited connected socket fd."""
    loop = asyncio.get_running_loop()
    conn = NriConnection(max_message=max_message)
    if fd is not None:
        sock = socket.socket(fileno=fd)
        _, proto = await loop.create_unix_connection(
            lambda: Trunk(conn, on_request, on_refused, arrival, answered), sock=sock
        )
    elif path is not None:
        _, proto = await loop.create_unix_connection(
            lambda: Trunk(conn, on_request, on_refused, arrival, answered), path
        )
    else:
        raise ValueError("need a socket path or an inherited fd")
    return proto
