"""The NRI connection multiplexer, sans-IO.

NRI runs two ttrpc connections over one unix socket (the "trunk"). Each frame is an 8-byte
big-endian header, ``uint32 conn_id | uint32 length``, then ``length`` bytes. Conn 1 carries
the plugin's ttrpc *server* (the runtime calls Configure, Synchronize, hooks), conn 2 the
plugin's ttrpc *client* (RegisterPlugin, UpdateContainers). A conn is a byte stream: a ttrpc
message may be split over several frames and a frame may hold parts of several messages.

The runtime's side reads a conn through a 4 KiB buffer and breaks the connection when one
frame is larger than the read buffer (containerd/nri#102). :func:`encode_for_runtime` therefore
sends a message of up to 4096 bytes as one frame and a larger one as a 4096-byte frame
followed by the rest: the runtime's buffered reader then reads the rest straight into the
message buffer, which always fits.
"""

from __future__ import annotations

import struct

from nriplugin.nri.errors import ProtocolError

HEADER = struct.Struct(">II")
HEADER_LEN = HEADER.size  # 8
PLUGIN_SERVICE_CONN = 1  # the plugin serves, the runtime calls
RUNTIME_SERVICE_CONN = 2  # the runtime serves, the plugin calls
MAX_FRAME = 1 << 24  # the Go mux refuses to write larger frames
RUNTIME_READ_BUFFER = 4096


def encode_frame(conn_id: int, data: bytes) -> bytes:
    if conn_id == 0:
        raise ValueError("conn id 0 is reserved")
    if len(data) > MAX_FRAME:
        raise ValueError(f"mux frame of {len(data)} bytes exceeds {MAX_FRAME}")
    return HEADER.pack(conn_id, len(data)) + data


def encode_for_runtime(conn_id: int, message: bytes) -> bytes:
    """Frame one complete ttrpc message so the Go runtime's 4 KiB reader accepts it."""
    if len(message) <= RUNTIME_READ_BUFFER:
        return HEADER.pack(conn_id, len(message)) + message
    head = message[:RUNTIME_READ_BUFFER]
    rest = message[RUNTIME_READ_BUFFER:]
    return HEADER.pack(conn_id, len(head)) + head + HEADER.pack(conn_id, len(rest)) + rest


class Demultiplexer:
    """Splits the trunk's byte stream into (conn id, bytes) chunks.

    :meth:`stream` hands each frame's payload on as it arrives, as views of the input with no
    copy (a conn is a byte stream: where its frames end means nothing), so a message of
    megabytes is never held here; :meth:`feed` returns whole frames. Frames for conns not in
    ``known`` are dropped and counted (the Go mux does the same) rather than buffered, so a
    confused peer cannot make memory grow.
    """

    __slots__ = ("_conn", "_error", "_frame", "_head", "_left", "dropped_frames", "known", "max_frame")

    def __init__(self, known: frozenset[int] = frozenset({1, 2}), max_frame: int = MAX_FRAME) -> None:
        self._head = bytearray()  # a partial frame header
        self._left = self._conn = 0  # the frame being read: its payload bytes still to come, its conn (0: dropped)
        self._frame = bytearray()  # feed() only: the frame so far
        self._error: ProtocolError | None = None
        self.known = known
        self.max_frame = max_frame
        self.dropped_frames = 0

    def whole(self, data: bytes | memoryview) -> tuple[int, memoryview] | None:
        """The usual read (the runtime sends a request as one write): ``data`` is exactly one
        whole, non-empty frame for a known conn and nothing partial is held. Its conn and
        payload (a view of ``data``); None otherwise. Nothing changes either way."""
        if not self._left and not self._head and self._error is None and len(data) > HEADER_LEN:
            conn_id, length = HEADER.unpack_from(data)
            if length + HEADER_LEN == len(data) and conn_id in self.known and length <= self.max_frame:
                return conn_id, memoryview(data)[HEADER_LEN:]
        return None

    def stream(self, data: bytes | memoryview) -> list[tuple[int, memoryview]]:
        """The payload bytes in ``data``, per conn, in order (a frame may come in pieces). A
        whole frame is one piece; the caller that wants it without the general way asks
        :meth:`whole` first (NriConnection.receive_data)."""
        return [(c, piece) for c, piece, _end in self._pieces(data) if piece]

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """Whole frames, in order."""
        out: list[tuple[int, bytes]] = []
        for conn_id, piece, end in self._pieces(data):
            if end and not self._frame:
                out.append((conn_id, bytes(piece)))
                continue
            self._frame += piece
            if end:
                out.append((conn_id, bytes(self._frame)))
                self._frame.clear()
        return out

    def _pieces(self, data: bytes | memoryview) -> list[tuple[int, memoryview, bool]]:
        if self._error is not None:
            raise self._error
        view = memoryview(data)
        out: list[tuple[int, memoryview, bool]] = []
        pos, end = 0, len(view)
        while True:
            if self._left:
                n = min(self._left, end - pos)
                self._left -= n
                if self._conn:
                    out.append((self._conn, view[pos : pos + n], not self._left))
                pos += n
                if self._left:
                    break
            if pos == end:
                break
            head, start = self._head, pos
            pos = min(end, pos + HEADER_LEN - len(head))
            head += view[start:pos]
            if len(head) < HEADER_LEN:
                break
            conn_id, length = HEADER.unpack(head)
            head.clear()
            if length > self.max_frame:
                self._error = ProtocolError(f"mux frame of {length} bytes for conn {conn_id} exceeds {self.max_frame}")
                raise self._error
            if conn_id == 0:
                self._error = ProtocolError("mux frame for reserved conn 0")
                raise self._error
            if conn_id in self.known:
                self._conn = conn_id
            else:
                self.dropped_frames += 1
                self._conn = 0
            self._left = length
            if not length and self._conn:  # an empty frame: nothing to read, but feed() reports it
                out.append((conn_id, view[pos:pos], True))
        return out

    @property
    def buffered(self) -> int:
        """Bytes held: a partial header, and for :meth:`feed` the frame so far."""
        return len(self._head) + (HEADER_LEN + len(self._frame) if self._frame else 0)
