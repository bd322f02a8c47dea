"""One NRI trunk, sans-IO: the multiplexer plus a ttrpc connection on each conn.

Bytes in, ``(conn_id, event)`` out; requests and responses in, bytes out. The plugin side
serves on conn 1 and calls on conn 2; the runtime side (used by the test peer) is the mirror
image, so both are this one class with the roles as parameters.
"""

from __future__ import annotations

from collections.abc import Callable

from nriplugin.nri import mux, ttrpc


class NriConnection:
    __slots__ = ("_frame", "call_conn", "client", "demux", "serve_conn", "server")

    def __init__(
        self,
        serve_conn: int = mux.PLUGIN_SERVICE_CONN,
        call_conn: int = mux.RUNTIME_SERVICE_CONN,
        frame: Callable[[int, bytes], bytes] = mux.encode_for_runtime,
        max_message: int = ttrpc.RECEIVE_BOUND,
        send_limit: int = ttrpc.MAX_MESSAGE,
    ) -> None:
        self.demux = mux.Demultiplexer(frozenset({serve_conn, call_conn}))
        self.serve_conn = serve_conn
        self.call_conn = call_conn
        self.server = ttrpc.Connection(max_message, send_limit)
        self.client = ttrpc.Connection(max_message, send_limit)
        self._frame = frame

    @classmethod
    def runtime_side(cls) -> NriConnection:
        """The runtime's end of the trunk (for tests and benchmarks): serves on conn 2, and
        sends messages of any size, as containerd 1.7's ttrpc does (up to a mux frame)."""
        return cls(mux.RUNTIME_SERVICE_CONN, mux.PLUGIN_SERVICE_CONN, mux.encode_frame, send_limit=mux.MAX_FRAME)

    def receive_data(self, data: bytes | memoryview) -> list[ttrpc.Event]:
        """Feed trunk bytes; returns requests to serve and responses to our calls.

        Raises :class:`~nriplugin.nri.errors.ProtocolError` on a corrupt stream.
        """
        whole = self.demux.whole(data)
        if whole is not None and whole[0] == self.serve_conn:
            # The usual read, a hook's request in one frame, in one step (whole_request).
            request = self.server.whole_request(whole[1])
            if request is not None:
                return [request]
        # A whole frame declined (a response to our call, say) is the one chunk: not read again.
        events: list[ttrpc.Event] = []
        for conn_id, chunk in [whole] if whole is not None else self.demux.stream(data):
            if conn_id == self.serve_conn:
                # Only requests (and refused ones) travel this way; a stray response is dropped.
                events += [ev for ev in self.server.receive_data(chunk) if not isinstance(ev, ttrpc.ResponseReceived)]
            else:
                # Only responses to our calls; the peer has no service to call on this conn.
                events += [ev for ev in self.client.receive_data(chunk) if isinstance(ev, ttrpc.ResponseReceived)]
        return events

    def call(self, service: str, method: str, payload: bytes, timeout_nano: int = 0) -> tuple[int, bytes]:
        sid, msg = self.client.send_request(service, method, payload, timeout_nano)
        return sid, self._frame(self.call_conn, msg)

    def respond(self, stream_id: int, payload: bytes = b"", code: int = 0, message: str = "") -> bytes:
        return self._frame(self.serve_conn, self.server.send_response(stream_id, payload, code, message))

    def reject(self, bad: ttrpc.BadRequest | ttrpc.RequestTooLarge) -> bytes:
        """Bytes answering a request that could not be dispatched (on the conn it came from)."""
        return self.respond(bad.stream_id, code=bad.code, message=bad.message)
