"""ttrpc framing and the Request/Response envelope, sans-IO.

A ttrpc message on the wire is a 10-byte big-endian header followed by the payload::

    uint32 length | uint32 stream_id | uint8 type | uint8 flags | payload[length]

Type 1 is a Request, 2 a Response, 3 Data (streams, unused by NRI). Clients use odd stream
ids that only ever grow. The payload of a Request/Response is the protobuf envelope from
containerd/ttrpc ``request.proto`` (vendored in ``protos/ttrpc/``); the status in a Response
is ``google.rpc.Status`` (code 1, message 2). No I/O here; every malformed input raises
:class:`ProtocolError`.

Two limits, one per direction. What we *send* stays within ttrpc's 4 MiB convention
(:data:`MAX_MESSAGE`): the Go runtime discards anything larger. What we *receive* is bounded
separately (:data:`RECEIVE_BOUND`, 64 MiB by default): containerd 1.7 sends Synchronize in one
piece, which passes 4 MiB on a node with a few thousand pods. A message over the receive bound
is skipped unread (never buffered) and reported as :class:`TooLarge` once it has streamed
past, as Go's ttrpc does, so the stream stays usable and the request can be answered with an
error the sender reads (it is done writing by then).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from nriplugin.nri.errors import ProtocolError

HEADER = struct.Struct(">IIBB")
HEADER_LEN = HEADER.size  # 10
MAX_MESSAGE = 4 << 20  # ttrpc's messageLengthMax: the most we send (the runtime refuses more)
RECEIVE_BOUND = 64 << 20  # the most we accept by default (containerd 1.7's Synchronize is one message)


class MessageType(IntEnum):
    REQUEST = 1
    RESPONSE = 2
    DATA = 3


_REQUEST = int(MessageType.REQUEST)  # compared per message: a plain int is quicker than the enum


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


@dataclass(slots=True)  # made per message: not frozen (a frozen dataclass's __init__ costs 3x)
class Message:
    stream_id: int
    type: int
    flags: int
    payload: bytes | bytearray  # bytearray: a large message, filled in place as it arrived


@dataclass(frozen=True, slots=True)
class TooLarge:
    """A message longer than the receive bound: its payload is skipped, never buffered."""

    stream_id: int
    type: int
    length: int
    limit: int


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


def encode_message(stream_id: int, mtype: int, payload: bytes, flags: int = 0, limit: int = MAX_MESSAGE) -> bytes:
    if len(payload) > limit:
        raise ValueError(f"ttrpc message of {len(payload)} bytes exceeds the {limit}-byte limit")
    return HEADER.pack(len(payload), stream_id, mtype, flags) + payload


class MessageDecoder:
    """Turns a byte stream into ttrpc messages.

    Holds at most one partial message. A message that arrives whole in one chunk is sliced
    out of it (one copy); a larger one gets a buffer of its announced size as soon as its
    header is read and is filled in place, so a big message is copied once, whatever the
    chunking. A message over ``max_message`` is refused from its header: its payload is
    skipped as it streams past, then it is reported as :class:`TooLarge`. (A request that
    comes whole in one read does not come here: :meth:`Connection.whole_request` takes it.)
    """

    __slots__ = ("_body", "_error", "_filled", "_head", "_refused", "_skip", "_what", "max_message")

    def __init__(self, max_message: int = RECEIVE_BOUND) -> None:
        self._head = bytearray()  # a partial header
        self._body: bytearray | None = None  # the message being filled
        self._filled = 0
        self._what = (0, 0, 0)  # its stream id, type and flags
        self._skip = 0  # payload bytes of a refused message still to pass
        self._refused: TooLarge | None = None  # that message
        self._error: ProtocolError | None = None
        self.max_message = max_message

    @property
    def idle(self) -> bool:
        """Nothing held: the next byte is a message header."""
        return self._body is None and not self._head and not self._skip and self._error is None

    def feed(self, data: bytes | bytearray | memoryview) -> list[Message | TooLarge]:
        if self._error is not None:
            raise self._error
        view = memoryview(data)
        out: list[Message | TooLarge] = []
        pos, end = 0, len(view)
        while True:
            if self._skip:
                n = min(self._skip, end - pos)
                self._skip -= n
                pos += n
                if self._skip:
                    break
                if self._refused is not None:
                    out.append(self._refused)
                    self._refused = None
            body = self._body
            if body is not None:
                n = min(len(body) - self._filled, end - pos)
                body[self._filled : self._filled + n] = view[pos : pos + n]
                self._filled += n
                pos += n
                if self._filled < len(body):
                    break
                self._body = None
                out.append(Message(*self._what, body))
            head = self._head
            if head or end - pos < HEADER_LEN:
                take = min(HEADER_LEN - len(head), end - pos)
                head += view[pos : pos + take]
                pos += take
                if len(head) < HEADER_LEN:
                    break
                length, sid, mtype, flags = HEADER.unpack(head)
                head.clear()
            else:
                length, sid, mtype, flags = HEADER.unpack_from(view, pos)
                pos += HEADER_LEN
            if mtype not in (1, 2, 3):
                self._error = ProtocolError(f"unknown ttrpc message type {mtype} on stream {sid}")
                raise self._error
            if length > self.max_message:
                self._refused, self._skip = TooLarge(sid, mtype, length, self.max_message), length
            elif end - pos >= length:
                out.append(Message(sid, mtype, flags, bytes(view[pos : pos + length])))
                pos += length
            else:
                self._body, self._filled, self._what = bytearray(length), 0, (sid, mtype, flags)
        return out

    @property
    def buffered(self) -> int:
        """Bytes of the partial message held (its header included)."""
        return len(self._head) if self._body is None else HEADER_LEN + self._filled

    @property
    def skipping(self) -> int:
        """Bytes of a refused message still to pass."""
        return self._skip


# --- the envelope ----------------------------------------------------------------------------


def _envelope_classes() -> tuple[Any, Any, Any]:
    """Request, Response and KeyValue with the field layout of ttrpc's request.proto (status as
    google.rpc.Status). Built from a descriptor here, parsed by protobuf's C core: no generated
    module, and tests check the layout against the vendored .proto."""
    t = descriptor_pb2.FieldDescriptorProto
    f = descriptor_pb2.FileDescriptorProto(name="nriplugin/ttrpc.proto", package="nriplugin.ttrpc", syntax="proto3")

    def message(name: str, *fields: tuple[str, int, int, int, str]) -> None:
        m = f.message_type.add(name=name)
        for fname, number, ftype, label, type_name in fields:
            fd = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                fd.type_name = type_name

    opt, rep = t.LABEL_OPTIONAL, t.LABEL_REPEATED
    message("KeyValue", ("key", 1, t.TYPE_STRING, opt, ""), ("value", 2, t.TYPE_STRING, opt, ""))
    message(
        "Request",
        ("service", 1, t.TYPE_STRING, opt, ""),
        ("method", 2, t.TYPE_STRING, opt, ""),
        ("payload", 3, t.TYPE_BYTES, opt, ""),
        ("timeout_nano", 4, t.TYPE_INT64, opt, ""),
        ("metadata", 5, t.TYPE_MESSAGE, rep, ".nriplugin.ttrpc.KeyValue"),
    )
    message("Status", ("code", 1, t.TYPE_INT32, opt, ""), ("message", 2, t.TYPE_STRING, opt, ""))
    message(
        "Response",
        ("status", 1, t.TYPE_MESSAGE, opt, ".nriplugin.ttrpc.Status"),
        ("payload", 2, t.TYPE_BYTES, opt, ""),
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    get = message_factory.GetMessageClass
    return (
        get(pool.FindMessageTypeByName("nriplugin.ttrpc.Request")),
        get(pool.FindMessageTypeByName("nriplugin.ttrpc.Response")),
        get(pool.FindMessageTypeByName("nriplugin.ttrpc.KeyValue")),
    )


RequestPb, ResponsePb, KeyValuePb = _envelope_classes()


_ONE_BYTE = [bytes((n,)) for n in range(0x80)]  # the varints of one byte: every hook's answer has two


def varint(n: int) -> bytes:
    if 0 <= n < 0x80:
        return _ONE_BYTE[n]
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def encode_request(req: Request) -> bytes:
    m = RequestPb(service=req.service, method=req.method, payload=req.payload, timeout_nano=req.timeout_nano)
    for k, v in req.metadata:
        m.metadata.add(key=k, value=v)
    return m.SerializeToString()  # type: ignore[no-any-return]


def _parse(cls: Any, data: bytes | bytearray, what: str) -> Any:
    try:
        return cls.FromString(data)
    except DecodeError as exc:
        raise ProtocolError(f"malformed ttrpc {what}: {exc}") from exc


def _request_of(m: Any) -> Request:
    """A parsed envelope's request (the metadata read only where there is some)."""
    md = m.metadata
    return Request(m.service, m.method, m.payload, m.timeout_nano, [(kv.key, kv.value) for kv in md] if md else [])


def decode_request(data: bytes | bytearray) -> Request:
    return _request_of(_parse(RequestPb, data, "request"))


def _ok_response(payload: bytes) -> bytes:
    """The usual answer's envelope, by hand: the payload field alone."""
    return b"\x12" + varint(len(payload)) + payload if payload else b""


def _status_response(payload: bytes, code: int, message: str) -> bytes:
    """An answer with a status (an error, or a message): the envelope's status field set."""
    m = ResponsePb(payload=payload)
    m.status.code = code
    m.status.message = message
    return m.SerializeToString()  # type: ignore[no-any-return]


def encode_response(resp: Response) -> bytes:
    if resp.code or resp.message:
        return _status_response(resp.payload, resp.code, resp.message)
    return _ok_response(resp.payload)


def decode_response(data: bytes | bytearray) -> Response:
    m = _parse(ResponsePb, data, "response")
    return Response(m.payload, m.status.code, m.status.message)


# --- one ttrpc connection, either side ------------------------------------------------------


# The events made per message are plain slotted dataclasses, not frozen ones: a frozen
# dataclass's __init__ sets each field through object.__setattr__ and costs several times as
# much, on every hook.


@dataclass(slots=True)
class RequestReceived:
    stream_id: int
    request: Request


@dataclass(slots=True)
class ResponseReceived:
    stream_id: int
    response: Response


@dataclass(frozen=True, slots=True)
class BadRequest:
    """A request the server must answer with an error status (it cannot be dispatched)."""

    stream_id: int
    code: int
    message: str


@dataclass(frozen=True, slots=True)
class RequestTooLarge:
    """A request over the receive bound, skipped unread: answer it with an error (or drop the
    connection); the stream itself is intact."""

    stream_id: int
    length: int
    limit: int

    code = Code.RESOURCE_EXHAUSTED

    @property
    def message(self) -> str:
        return f"request of {self.length} bytes exceeds this plugin's {self.limit}-byte receive bound"


Event = RequestReceived | ResponseReceived | BadRequest | RequestTooLarge


class Connection:
    """One ttrpc connection: a client (sends requests) and/or server (answers them).

    ttrpc is symmetric on the wire; NRI uses one client and one server per multiplexed
    connection, but each side here accepts both roles so the runtime peer in the tests can
    reuse it.
    """

    __slots__ = ("_decoder", "_last_peer_stream", "_next_stream", "_pending", "send_limit")

    def __init__(self, max_message: int = RECEIVE_BOUND, send_limit: int = MAX_MESSAGE) -> None:
        self._decoder = MessageDecoder(max_message)
        self.send_limit = send_limit
        self._next_stream = 1
        self._last_peer_stream = 0
        self._pending: set[int] = set()

    def send_request(self, service: str, method: str, payload: bytes, timeout_nano: int = 0) -> tuple[int, bytes]:
        sid = self._next_stream
        body = encode_request(Request(service, method, payload, timeout_nano))
        wire = encode_message(sid, MessageType.REQUEST, body, limit=self.send_limit)  # raises first: nothing pends
        self._next_stream += 2
        self._pending.add(sid)
        return sid, wire

    def send_response(self, stream_id: int, payload: bytes = b"", code: int = 0, message: str = "") -> bytes:
        body = _status_response(payload, code, message) if code or message else _ok_response(payload)
        if len(body) > self.send_limit:  # callers fit their answers (stub.py); this is the last guard
            body = _status_response(
                b"", Code.RESOURCE_EXHAUSTED, f"response of {len(body)} bytes exceeds the ttrpc limit"
            )
        return encode_message(stream_id, MessageType.RESPONSE, body, limit=self.send_limit)

    def abandon(self, stream_id: int) -> None:
        """Forget a request we stopped waiting for; a late response is then dropped."""
        self._pending.discard(stream_id)

    @property
    def pending(self) -> int:
        return len(self._pending)

    def whole_request(self, data: bytes | bytearray | memoryview) -> RequestReceived | None:
        """The usual read, decoded in one step: ``data`` is exactly one whole request with a
        new odd stream id, and nothing partial is held. The envelope is parsed straight from
        ``data`` (no copy of the message first; the parse copies what it keeps, so ``data``
        may be a view of a buffer that is reused). None, with nothing changed, for anything
        else, a request that does not parse included: :meth:`receive_data` takes that the
        general way and reports what is wrong. Saves most of what the general way costs for a
        usual CreateContainer (the chunk lists, the message object, the copy)."""
        if len(data) < HEADER_LEN or not self._decoder.idle:
            return None
        length, sid, mtype, _flags = HEADER.unpack_from(data)
        if (
            mtype != _REQUEST
            or length + HEADER_LEN != len(data)
            or length > self._decoder.max_message
            or sid % 2 != 1
            or sid <= self._last_peer_stream
        ):
            return None
        try:
            m = RequestPb.FromString(memoryview(data)[HEADER_LEN:])
        except DecodeError:
            return None
        self._last_peer_stream = sid
        return RequestReceived(sid, _request_of(m))

    def receive_data(self, data: bytes | bytearray | memoryview) -> list[Event]:
        request = self.whole_request(data)
        if request is not None:
            return [request]
        events: list[Event] = []
        for msg in self._decoder.feed(data):
            if isinstance(msg, TooLarge):
                events += self._too_large(msg)
            elif msg.type == MessageType.REQUEST:
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

    def _too_large(self, msg: TooLarge) -> list[Event]:
        sid = msg.stream_id
        if msg.type == MessageType.REQUEST:
            if sid % 2 == 1 and sid > self._last_peer_stream:
                self._last_peer_stream = sid
            return [RequestTooLarge(sid, msg.length, msg.limit)]
        if msg.type == MessageType.RESPONSE:
            if sid not in self._pending:
                return []
            self._pending.discard(sid)
            text = f"response of {msg.length} bytes exceeds the {msg.limit}-byte receive bound"
            return [ResponseReceived(sid, Response(b"", Code.RESOURCE_EXHAUSTED, text))]
        raise ProtocolError(f"ttrpc data message on stream {sid}: streams are not supported")
