"""ttrpc framing and the Request/Response envelope, sans-IO.

A ttrpc message on the wire is a 10-byte big-endian header followed by the payload::

    uint32 length | uint32 stream_id | uint8 type | uint8 flags | payload[length]

Type 1 is a Request, 2 a Response, 3 Data (streams, unused by NRI). Clients use odd stream
ids that only ever grow. The payload of a Request/Response is the protobuf envelope from
containerd/ttrpc ``request.proto`` (vendored in ``protos/ttrpc/`` for reference); the status
in a Response is ``google.rpc.Status`` (code 1, message 2). The envelope has five fields, so
it is encoded here by hand: no generated code, no I/O, every malformed input raises
:class:`ProtocolError`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from enum import IntEnum

from .errors import ProtocolError

HEADER = struct.Struct(">IIBB")
HEADER_LEN = HEADER.size  # 10
MAX_MESSAGE = 4 << 20  # ttrpc's messageLengthMax


class MessageType(IntEnum):
    REQUEST = 1
    RESPONSE = 2
    DATA = 3


class Code(IntEnum):
    """gRPC status codes used on ttrpc."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14


@dataclass(frozen=True, slots=True)
class Message:
    stream_id: int
    type: int
    flags: int
    payload: bytes


@dataclass(slots=True)
class Request:
    service: str
    method: str
    payload: bytes = b""
    timeout_nano: int = 0
    metadata: list[tuple[str, str]] = field(default_factory=list)


@dataclass(slots=True)
class Response:
    payload: bytes = b""
    code: int = 0
    message: str = ""


def encode_message(stream_id: int, mtype: int, payload: bytes, flags: int = 0) -> bytes:
    if len(payload) > MAX_MESSAGE:
        raise ValueError(f"ttrpc message of {len(payload)} bytes exceeds the {MAX_MESSAGE}-byte limit")
    return HEADER.pack(len(payload), stream_id, mtype, flags) + payload


class MessageDecoder:
    """Turns a byte stream into ttrpc messages; holds at most one partial message."""

    __slots__ = ("_buf", "_error", "max_message")

    def __init__(self, max_message: int = MAX_MESSAGE) -> None:
        self._buf = bytearray()
        self._error: ProtocolError | None = None
        self.max_message = max_message

    def feed(self, data: bytes) -> list[Message]:
        if self._error is not None:
            raise self._error
        buf = self._buf
        buf += data
        out: list[Message] = []
        pos = 0
        end = len(buf)
        while end - pos >= HEADER_LEN:
            length, sid, mtype, flags = HEADER.unpack_from(buf, pos)
            if length > self.max_message:
                self._error = ProtocolError(
                    f"ttrpc message length {length} on stream {sid} exceeds the {self.max_message}-byte limit"
                )
                raise self._error
            if mtype not in (1, 2, 3):
                self._error = ProtocolError(f"unknown ttrpc message type {mtype} on stream {sid}")
                raise self._error
            if end - pos - HEADER_LEN < length:
                break
            start = pos + HEADER_LEN
            out.append(Message(sid, mtype, flags, bytes(buf[start : start + length])))
            pos = start + length
        if pos:
            del buf[:pos]
        return out

    @property
    def buffered(self) -> int:
        return len(self._buf)


# --- protobuf wire helpers for the envelope ------------------------------------------------


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    end = len(data)
    while True:
        if pos >= end:
            raise ProtocolError("truncated varint in ttrpc envelope")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise ProtocolError("varint too long in ttrpc envelope")


def _fields(data: bytes) -> list[tuple[int, int, int | bytes]]:
    """Split a protobuf message into (field number, wire type, value); skips nothing."""
    out: list[tuple[int, int, int | bytes]] = []
    pos = 0
    end = len(data)
    while pos < end:
        key, pos = _read_varint(data, pos)
        num, wt = key >> 3, key & 7
        if num == 0:
            raise ProtocolError("field number 0 in ttrpc envelope")
        if wt == 0:
            val, pos = _read_varint(data, pos)
            out.append((num, wt, val))
        elif wt == 2:
            n, pos = _read_varint(data, pos)
            if n > end - pos:
                raise ProtocolError("length-delimited field runs past the end of the ttrpc envelope")
            out.append((num, wt, bytes(data[pos : pos + n])))
            pos += n
        elif wt == 1:
            if pos + 8 > end:
                raise ProtocolError("truncated fixed64 in ttrpc envelope")
            pos += 8
        elif wt == 5:
            if pos + 4 > end:
                raise ProtocolError("truncated fixed32 in ttrpc envelope")
            pos += 4
        else:
            raise ProtocolError(f"unsupported wire type {wt} in ttrpc envelope")
    return out


def _str(value: int | bytes, what: str) -> str:
    if not isinstance(value, bytes):
        raise ProtocolError(f"{what} has the wrong wire type")
    try:
        return value.decode()
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"{what} is not valid UTF-8") from exc


def _bytes(value: int | bytes, what: str) -> bytes:
    if not isinstance(value, bytes):
        raise ProtocolError(f"{what} has the wrong wire type")
    return value


def _int(value: int | bytes, what: str, bits: int = 64) -> int:
    if not isinstance(value, int):
        raise ProtocolError(f"{what} has the wrong wire type")
    value &= (1 << 64) - 1
    if value >= 1 << 63:
        value -= 1 << 64
    if bits == 32:
        value = ((value + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)
    return value


def _ld(num: int, data: bytes) -> bytes:
    return _varint(num << 3 | 2) + _varint(len(data)) + data


def encode_request(req: Request) -> bytes:
    out = _ld(1, req.service.encode()) + _ld(2, req.method.encode())
    if req.payload:
        out += _ld(3, req.payload)
    if req.timeout_nano:
        out += _varint(4 << 3) + _varint(req.timeout_nano)
    for k, v in req.metadata:
        out += _ld(5, _ld(1, k.encode()) + _ld(2, v.encode()))
    return out


def decode_request(data: bytes) -> Request:
    req = Request("", "")
    for num, _wt, val in _fields(data):
        if num == 1:
            req.service = _str(val, "request service")
        elif num == 2:
            req.method = _str(val, "request method")
        elif num == 3:
            req.payload = _bytes(val, "request payload")
        elif num == 4:
            req.timeout_nano = _int(val, "request timeout")
        elif num == 5:
            key = value = ""
            for n2, _w2, v2 in _fields(_bytes(val, "request metadata")):
                if n2 == 1:
                    key = _str(v2, "metadata key")
                elif n2 == 2:
                    value = _str(v2, "metadata value")
            req.metadata.append((key, value))
    return req


def encode_response(resp: Response) -> bytes:
    out = b""
    if resp.code or resp.message:
        status = b""
        if resp.code:
            status += _varint(1 << 3) + _varint(resp.code)
        if resp.message:
            status += _ld(2, resp.message.encode())
        out += _ld(1, status)
    if resp.payload:
        out += _ld(2, resp.payload)
    return out


def decode_response(data: bytes) -> Response:
    resp = Response()
    for num, _wt, val in _fields(data):
        if num == 1:
            for n2, _w2, v2 in _fields(_bytes(val, "response status")):
                if n2 == 1:
                    resp.code = _int(v2, "status code", bits=32)
                elif n2 == 2:
                    resp.message = _str(v2, "status message")
        elif num == 2:
            resp.payload = _bytes(val, "response payload")
    return resp


# --- one ttrpc connection, either side ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RequestReceived:
    stream_id: int
    request: Request


@dataclass(frozen=True, slots=True)
class ResponseReceived:
    stream_id: int
    response: Response


@dataclass(frozen=True, slots=True)
class BadRequest:
    """A request the server must answer with an error status (it cannot be dispatched)."""

    stream_id: int
    code: int
    message: str


Event = RequestReceived | ResponseReceived | BadRequest


class Connection:
    """One ttrpc connection: a client (sends requests) and/or server (answers them).

    ttrpc is symmetric on the wire; NRI uses one client and one server per multiplexed
    connection, but each side here accepts both roles so the runtime peer in the tests can
    reuse it.
    """

    __slots__ = ("_decoder", "_last_peer_stream", "_next_stream", "_pending")

    def __init__(self, max_message: int = MAX_MESSAGE) -> None:
        self._decoder = MessageDecoder(max_message)
        self._next_stream = 1
        self._last_peer_stream = 0
        self._pending: set[int] = set()

    def send_request(self, service: str, method: str, payload: bytes, timeout_nano: int = 0) -> tuple[int, bytes]:
        sid = self._next_stream
        self._next_stream += 2
        self._pending.add(sid)
        body = encode_request(Request(service, method, payload, timeout_nano))
        return sid, encode_message(sid, MessageType.REQUEST, body)

    def send_response(self, stream_id: int, payload: bytes = b"", code: int = 0, message: str = "") -> bytes:
        body = encode_response(Response(payload, code, message))
        if len(body) > MAX_MESSAGE:
            body = encode_response(
                Response(b"", Code.RESOURCE_EXHAUSTED, f"response of {len(body)} bytes exceeds the ttrpc limit")
            )
        return encode_message(stream_id, MessageType.RESPONSE, body)

    def abandon(self, stream_id: int) -> None:
        """Forget a request we stopped waiting for; a late response is then dropped."""
        self._pending.discard(stream_id)

    @property
    def pending(self) -> int:
        return len(self._pending)

    def receive_data(self, data: bytes) -> list[Event]:
        events: list[Event] = []
        for msg in self._decoder.feed(data):
            if msg.type == MessageType.REQUEST:
                sid = msg.stream_id
                if sid % 2 != 1:
                    events.append(
                        BadRequest(sid, Code.INVALID_ARGUMENT, "stream id must be odd for client-initiated streams")
                    )
                    continue
                if sid <= self._last_peer_stream:
                    events.append(
                        BadRequest(sid, Code.INVALID_ARGUMENT, "stream id cannot be re-used and must increment")
                    )
                    continue
                self._last_peer_stream = sid
                try:
                    req = decode_request(msg.payload)
                except ProtocolError as exc:
                    events.append(BadRequest(sid, Code.INVALID_ARGUMENT, f"malformed request: {exc}"))
                    continue
                events.append(RequestReceived(sid, req))
            elif msg.type == MessageType.RESPONSE:
                if msg.stream_id not in self._pending:
                    continue  # late answer to an abandoned request
                self._pending.discard(msg.stream_id)
                events.append(ResponseReceived(msg.stream_id, decode_response(msg.payload)))
            else:
                raise ProtocolError(f"ttrpc data message on stream {msg.stream_id}: streams are not supported")
        return events
