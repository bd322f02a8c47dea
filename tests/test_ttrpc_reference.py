"""ttrpc and the NRI multiplexer against their reference implementations' constants and byte
layouts, at the limits, and with several messages per read.

Sources: containerd/ttrpc ``channel.go`` (10-byte header: uint32 length, uint32 stream id,
uint8 type, uint8 flags, big-endian; messageLengthMax 4 MiB; types request 1, response 2,
data 3), ``server.go`` (odd, increasing client stream ids, else codes.InvalidArgument with
these messages), ``request.proto`` (Request: service 1, method 2, payload 3, timeout_nano 4,
metadata 5; Response: status 1, payload 2; google.rpc.Status: code 1, message 2);
grpc-go ``codes/codes.go`` (the numeric status codes); containerd/nri
``pkg/net/multiplex/mux.go`` (8-byte header: uint32 conn id, uint32 length; conn 0 reserved,
plugin service conn 1, runtime service conn 2; frames up to 1 << 24 bytes).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nriplugin.nri import mux, ttrpc
from nriplugin.nri.errors import ProtocolError

# grpc-go codes/codes.go
GRPC_CODES = {
    "OK": 0,
    "CANCELLED": 1,
    "UNKNOWN": 2,
    "INVALID_ARGUMENT": 3,
    "DEADLINE_EXCEEDED": 4,
    "NOT_FOUND": 5,
    "RESOURCE_EXHAUSTED": 8,
    "FAILED_PRECONDITION": 9,
    "UNIMPLEMENTED": 12,
    "INTERNAL": 13,
    "UNAVAILABLE": 14,
}


def messages(out: list[ttrpc.Message | ttrpc.TooLarge]) -> list[ttrpc.Message]:
    """What a decoder gave, every item a whole message (no refusal)."""
    assert all(isinstance(m, ttrpc.Message) for m in out), out
    return [m for m in out if isinstance(m, ttrpc.Message)]


def test_status_codes_are_grpcs() -> None:
    assert {c.name: c.value for c in ttrpc.Code} == GRPC_CODES


def test_ttrpc_constants() -> None:
    assert ttrpc.HEADER_LEN == 10 and ttrpc.MAX_MESSAGE == 4 << 20
    assert (ttrpc.MessageType.REQUEST, ttrpc.MessageType.RESPONSE, ttrpc.MessageType.DATA) == (1, 2, 3)


def test_header_layout() -> None:
    assert ttrpc.encode_message(5, 1, b"abc") == b"\x00\x00\x00\x03\x00\x00\x00\x05\x01\x00abc"
    assert ttrpc.encode_message(0x01020304, 2, b"", flags=7) == b"\x00\x00\x00\x00\x01\x02\x03\x04\x02\x07"


# request.proto / google.rpc.Status, encoded by hand (tag = field << 3 | wire type)
ENVELOPES = [
    (
        ttrpc.Request("s", "m", b"p", 5, [("k", "v")]),
        b"\x0a\x01s\x12\x01m\x1a\x01p\x20\x05\x2a\x06\x0a\x01k\x12\x01v",
    ),
    (
        ttrpc.Request("nri.pkg.api.v1alpha1.Plugin", "Configure"),
        b"\x0a\x1bnri.pkg.api.v1alpha1.Plugin\x12\x09Configure",
    ),
]


@pytest.mark.parametrize(("req", "wire"), ENVELOPES)
def test_request_envelope_bytes(req: ttrpc.Request, wire: bytes) -> None:
    assert ttrpc.encode_request(req) == wire
    assert ttrpc.decode_request(wire) == req


@pytest.mark.parametrize(
    ("resp", "wire"),
    [
        (ttrpc.Response(b"x", 5, "no"), b"\x0a\x06\x08\x05\x12\x02no\x12\x01x"),
        (ttrpc.Response(b"x"), b"\x12\x01x"),  # OK: no status at all
        (ttrpc.Response(b"", 0, "m"), b"\x0a\x03\x12\x01m"),
        (ttrpc.Response(b"", 13, ""), b"\x0a\x02\x08\x0d"),
    ],
)
def test_response_envelope_bytes(resp: ttrpc.Response, wire: bytes) -> None:
    assert ttrpc.encode_response(resp) == wire
    assert ttrpc.decode_response(wire) == resp


@pytest.mark.parametrize("bad", [b"\x0a\x05ab", b"\xff", b"\x0a"])
def test_malformed_envelopes(bad: bytes) -> None:
    with pytest.raises(ProtocolError, match="malformed ttrpc request"):
        ttrpc.decode_request(bad)
    with pytest.raises(ProtocolError, match="malformed ttrpc response"):
        ttrpc.decode_response(bad)


def test_message_limit_is_inclusive() -> None:
    """The receive bound: a message of exactly the bound is taken; one byte more is skipped
    unread (its payload never buffered), reported, and the stream goes on."""
    dec = ttrpc.MessageDecoder(max_message=16)
    assert dec.feed(ttrpc.encode_message(1, 1, b"x" * 16)) == [ttrpc.Message(1, 1, 0, b"x" * 16)]
    assert dec.feed(ttrpc.encode_message(3, 1, b"y" * 17)) == [ttrpc.TooLarge(3, 1, 17, 16)]
    assert dec.buffered == 0
    assert dec.feed(ttrpc.encode_message(5, 1, b"z")) == [ttrpc.Message(5, 1, 0, b"z")]
    assert ttrpc.MessageDecoder().max_message == ttrpc.RECEIVE_BOUND == 64 << 20
    assert len(ttrpc.encode_message(1, 1, b"x" * ttrpc.MAX_MESSAGE)) == ttrpc.HEADER_LEN + ttrpc.MAX_MESSAGE
    with pytest.raises(ValueError, match="exceeds"):
        ttrpc.encode_message(1, 1, b"x" * (ttrpc.MAX_MESSAGE + 1))


def test_unknown_type_is_refused() -> None:
    for mtype in (0, 4, 255):
        dec = ttrpc.MessageDecoder()
        with pytest.raises(ProtocolError, match=f"unknown ttrpc message type {mtype} on stream 9"):
            dec.feed(ttrpc.HEADER.pack(0, 9, mtype, 0))


def test_several_messages_in_one_read_and_a_partial_one() -> None:
    msgs = [ttrpc.encode_message(i, 1 + i % 3, bytes([i]) * i) for i in (1, 3, 5)]
    tail = ttrpc.encode_message(7, 2, b"abcdef")
    dec = ttrpc.MessageDecoder()
    got = messages(dec.feed(b"".join(msgs) + tail[:12]))
    assert [(m.stream_id, m.type, m.payload) for m in got] == [
        (1, 2, b"\x01"),
        (3, 1, b"\x03" * 3),
        (5, 3, b"\x05" * 5),
    ]
    assert dec.buffered == 12
    assert dec.feed(tail[12:]) == [ttrpc.Message(7, 2, 0, b"abcdef")] and dec.buffered == 0


@given(
    st.lists(st.tuples(st.integers(0, 2**32 - 1), st.sampled_from([1, 2, 3]), st.binary(max_size=40)), max_size=8),
    st.lists(st.integers(1, 30), max_size=30),
)
def test_any_split_gives_the_same_messages(msgs: list[tuple[int, int, bytes]], cuts: list[int]) -> None:
    wire = b"".join(ttrpc.encode_message(sid, t, p) for sid, t, p in msgs)
    dec = ttrpc.MessageDecoder()
    got: list[ttrpc.Message] = []
    pos = 0
    for n in [*cuts, len(wire)]:
        got += messages(dec.feed(wire[pos : pos + n]))
        pos += n
    got += messages(dec.feed(wire[pos:]))
    assert [(m.stream_id, m.type, m.payload) for m in got] == msgs and dec.buffered == 0


def request(sid: int, body: bytes | None = None) -> bytes:
    payload = ttrpc.encode_request(ttrpc.Request("svc", "M", b"")) if body is None else body
    return ttrpc.encode_message(sid, ttrpc.MessageType.REQUEST, payload)


def test_server_refuses_bad_stream_ids_and_goes_on() -> None:
    """ttrpc server.go: InvalidArgument for an even or a re-used stream id; the other messages
    of the same read are still handled."""
    conn = ttrpc.Connection()
    events = conn.receive_data(request(2) + request(5) + request(5) + request(3) + request(7, b"\xff") + request(9))
    bad = events.pop(4)
    assert isinstance(bad, ttrpc.BadRequest) and (bad.stream_id, bad.code) == (7, 3)
    assert bad.message.startswith("malformed request: malformed ttrpc request")
    assert events == [
        ttrpc.BadRequest(2, 3, "stream id must be odd for client-initiated streams"),
        ttrpc.RequestReceived(5, ttrpc.Request("svc", "M")),
        ttrpc.BadRequest(5, 3, "stream id cannot be re-used and must increment"),
        ttrpc.BadRequest(3, 3, "stream id cannot be re-used and must increment"),
        ttrpc.RequestReceived(9, ttrpc.Request("svc", "M")),
    ]


def test_client_streams_responses_and_late_answers() -> None:
    conn = ttrpc.Connection()
    sids = [conn.send_request("svc", "M", b"")[0] for _ in range(3)]
    assert sids == [1, 3, 5] and conn.pending == 3
    sid, wire = conn.send_request("svc", "M", b"p", timeout_nano=7)
    assert sid == 7
    assert ttrpc.MessageDecoder().feed(wire) == [
        ttrpc.Message(7, 1, 0, ttrpc.encode_request(ttrpc.Request("svc", "M", b"p", 7)))
    ]
    conn.abandon(3)
    assert conn.pending == 3
    answer = ttrpc.encode_response(ttrpc.Response(b"r", 5, "gone"))
    back = b"".join(ttrpc.encode_message(s, 2, answer) for s in (3, 1, 99, 5))
    assert conn.receive_data(back) == [
        ttrpc.ResponseReceived(1, ttrpc.Response(b"r", 5, "gone")),
        ttrpc.ResponseReceived(5, ttrpc.Response(b"r", 5, "gone")),
    ]
    assert conn.pending == 1  # 7 still waits
    assert conn.receive_data(ttrpc.encode_message(1, 2, answer)) == []  # answered once only
    with pytest.raises(ProtocolError, match="data message on stream 11"):
        ttrpc.Connection().receive_data(ttrpc.encode_message(11, 3, b""))


def test_responses_at_and_over_the_limit() -> None:
    conn = ttrpc.Connection()
    ok = conn.send_response(1, b"a", 0, "")
    assert ok == ttrpc.encode_message(1, 2, b"\x12\x01a")
    over = ttrpc.MAX_MESSAGE  # the envelope's own bytes push it past the limit
    wire = conn.send_response(3, b"x" * over)
    (msg,) = messages(ttrpc.MessageDecoder().feed(wire))
    resp = ttrpc.decode_response(msg.payload)
    assert (msg.stream_id, resp.payload, resp.code) == (3, b"", 8)
    assert resp.message == f"response of {over + 5} bytes exceeds the ttrpc limit"
    fits = ttrpc.MAX_MESSAGE - 5  # payload + 1 tag + 4 length bytes == the limit exactly
    (big,) = messages(ttrpc.MessageDecoder().feed(conn.send_response(5, b"y" * fits)))
    assert len(big.payload) == ttrpc.MAX_MESSAGE and ttrpc.decode_response(big.payload).payload == b"y" * fits


# the multiplexer -------------------------------------------------------------------------------


def test_mux_constants_and_layout() -> None:
    assert mux.HEADER_LEN == 8 and mux.MAX_FRAME == 1 << 24
    assert (mux.PLUGIN_SERVICE_CONN, mux.RUNTIME_SERVICE_CONN, mux.RUNTIME_READ_BUFFER) == (1, 2, 4096)
    assert mux.encode_frame(2, b"ab") == b"\x00\x00\x00\x02\x00\x00\x00\x02ab"
    with pytest.raises(ValueError, match=r"^conn id 0 is reserved$"):
        mux.encode_frame(0, b"")
    assert len(mux.encode_frame(1, b"x" * mux.MAX_FRAME)) == 8 + mux.MAX_FRAME
    with pytest.raises(ValueError, match="exceeds"):
        mux.encode_frame(1, b"x" * (mux.MAX_FRAME + 1))


@pytest.mark.parametrize(
    ("size", "frames"), [(0, [0]), (4095, [4095]), (4096, [4096]), (4097, [4096, 1]), (10000, [4096, 5904])]
)
def test_frames_for_the_runtimes_4k_reader(size: int, frames: list[int]) -> None:
    message = bytes(range(256)) * (size // 256) + bytes(size % 256)
    wire = mux.encode_for_runtime(1, message)
    d = mux.Demultiplexer()
    got = d.feed(wire)
    assert [len(b) for _, b in got] == frames and b"".join(b for _, b in got) == message
    assert all(c == 1 for c, _ in got)


def test_demux_several_frames_unknown_conns_and_limits() -> None:
    d = mux.Demultiplexer(max_frame=8)
    wire = mux.encode_frame(1, b"a") + mux.encode_frame(7, b"zz") + mux.encode_frame(2, b"x" * 8) + b"\x00\x00"
    assert d.feed(wire) == [(1, b"a"), (2, b"x" * 8)]
    assert d.dropped_frames == 1 and d.buffered == 2
    assert d.feed(b"\x00\x01\x00\x00\x00\x01q") == [(1, b"q")] and d.buffered == 0
    with pytest.raises(ProtocolError, match="9 bytes for conn 1 exceeds 8"):
        d.feed(mux.HEADER.pack(1, 9))
    with pytest.raises(ProtocolError):
        d.feed(b"")
    zero = mux.Demultiplexer()
    with pytest.raises(ProtocolError, match=r"^mux frame for reserved conn 0$"):
        zero.feed(mux.HEADER.pack(0, 0))


def test_defaults_of_requests_and_responses() -> None:
    conn = ttrpc.Connection()
    _, wire = conn.send_request("svc", "M", b"")
    (msg,) = messages(ttrpc.MessageDecoder().feed(wire))
    assert ttrpc.decode_request(msg.payload).timeout_nano == 0 and msg.payload == b"\x0a\x03svc\x12\x01M"
    assert conn.send_response(9) == ttrpc.encode_message(9, 2, b"")  # OK, empty: an empty envelope
