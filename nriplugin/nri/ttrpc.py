"""ttrpc framing and the Request/Response envelope, sans-IO.

A ttrpc message on the wire is a 10-byte big-endian header followed by the payload::

    uint32 length | uint32 stream_id | uint8 type | uint8 flags | payload[length]

Type 1 is a Request, 2 a Response, 3 Data (streams, unused by NRI). Clients use odd stream
ids that only ever grow. The payload of a Request/Response is the protobuf envelope from
containerd/ttrpc ``request.proto`` (vendored in ``protos/ttrpc/``); the status in a Response
is ``google.rpc.Status`` (code 1, message 2). No I/O here; every malformed input raises
:class:`ProtocolError`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

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


def encode_request(req: Request) -> bytes:
    m = RequestPb(service=req.service, method=req.method, payload=req.payload, timeout_nano=req.timeout_nano)
    for k, v in req.metadata:
        m.metadata.add(key=k, value=v)
    return m.SerializeToString()  # type: ignore[no-any-return]


def decode_request(data: bytes) -> Request:
    try:
        m = RequestPb.FromString(data)
    except DecodeError as exc:
        raise ProtocolError(f"malformed ttrpc request: {exc}") from exc
    return Request(m.service, m.method, m.payload, m.timeout_nano, [(kv.key, kv.value) for kv in m.metadata])


def encode_response(resp: Response) -> bytes:
    m = ResponsePb(payload=resp.payload)
    if resp.code or resp.message:
        m.status.code = resp.code
        m.status.message = resp.message
    return m.SerializeToString()  # type: ignore[no-any-return]


def decode_response(data: bytes) -> Response:
    try:
        m = ResponsePb.FromString(data)
    except DecodeError as exc:
        raise ProtocolError(f"malformed ttrpc response: {exc}") from exc
    return Response(m.payload, m.status.code, m.status.message)


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
