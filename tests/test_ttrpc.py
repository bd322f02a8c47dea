"""The ttrpc codec: framing, the envelope (checked against protobuf itself), errors."""

from __future__ import annotations

import contextlib
import struct
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from nriplugin.nri import ttrpc
from nriplugin.nri.errors import ProtocolError

ROOT = Path(__file__).resolve().parent.parent


def _vendored_layout(tmp: Path) -> dict[str, list[tuple[str, int, int, bool]]]:
    """Field layout of Request/Response/KeyValue compiled from protos/ttrpc/request.proto."""
    from grpc_tools import protoc

    proto_dir = ROOT / "protos" / "ttrpc"
    # request.proto imports "proto/status.proto": ttrpc ships a placeholder there; on the wire
    # the field is google.rpc.Status, whose first two fields we supply the same way.
    (tmp / "proto").mkdir()
    (tmp / "proto" / "status.proto").write_text(
        'syntax = "proto3";\nmessage Status { int32 code = 1; string message = 2; }\n'
    )
    out = tmp / "set.pb"
    assert protoc.main(["protoc", f"-I{proto_dir}", f"-I{tmp}", f"--descriptor_set_out={out}", "request.proto"]) == 0
    fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    rep = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
    return {m.name: [(f.name, f.number, f.type, f.label == rep) for f in m.field] for m in fds.file[0].message_type}


def test_envelope_layout_matches_vendored_request_proto(tmp_path: Path) -> None:
    vendored = _vendored_layout(tmp_path)
    for cls in (ttrpc.RequestPb, ttrpc.ResponsePb, ttrpc.KeyValuePb):
        d = cls.DESCRIPTOR
        ours = [(f.name, f.number, f.type, f.is_repeated) for f in d.fields]
        assert ours == vendored[d.name], d.name


text = st.text(max_size=40)
requests = st.builds(
    ttrpc.Request,
    text,
    text,
    st.binary(max_size=300),
    st.integers(0, 2**63 - 1),
    st.lists(st.tuples(text, text), max_size=3),
)
responses = st.builds(ttrpc.Response, st.binary(max_size=300), st.integers(-(2**31), 2**31 - 1), text)


@given(requests)
def test_request_round_trip(req: ttrpc.Request) -> None:
    assert ttrpc.decode_request(ttrpc.encode_request(req)) == req


@given(responses)
def test_response_round_trip(resp: ttrpc.Response) -> None:
    assert ttrpc.decode_response(ttrpc.encode_response(resp)) == resp


def test_envelope_wire_bytes() -> None:
    """Known bytes, as Go's ttrpc writes them."""
    req = ttrpc.Request("nri.pkg.api.v1alpha1.Plugin", "Configure", b"\x0a\x00", 2_000_000_000)
    wire = ttrpc.encode_request(req)
    assert wire == (b"\x0a\x1bnri.pkg.api.v1alpha1.Plugin\x12\x09Configure\x1a\x02\x0a\x00\x20\x80\xa8\xd6\xb9\x07")
    assert ttrpc.encode_response(ttrpc.Response(b"", 12, "x")) == b"\x0a\x05\x08\x0c\x12\x01x"


def test_header_layout() -> None:
    msg = ttrpc.encode_message(7, ttrpc.MessageType.RESPONSE, b"abc", flags=4)
    assert msg == struct.pack(">IIBB", 3, 7, 2, 4) + b"abc"


@given(
    st.lists(
        st.tuples(st.integers(0, 2**32 - 1), st.sampled_from([1, 2, 3]), st.integers(0, 255), st.binary(max_size=200)),
        max_size=8,
    )
)
def test_stream_round_trip(msgs: list[tuple[int, int, int, bytes]]) -> None:
    wire = b"".join(ttrpc.encode_message(s, t, p, f) for s, t, f, p in msgs)
    got = messages(ttrpc.MessageDecoder().feed(wire))
    assert [(m.stream_id, m.type, m.flags, m.payload) for m in got] == [(s, t, f, p) for s, t, f, p in msgs]


def messages(got: list[ttrpc.Message | ttrpc.TooLarge]) -> list[ttrpc.Message]:
    assert all(isinstance(m, ttrpc.Message) for m in got)
    return [m for m in got if isinstance(m, ttrpc.Message)]


def test_split_at_every_byte_boundary() -> None:
    wire = ttrpc.encode_message(1, 1, b"x" * 50) + ttrpc.encode_message(3, 1, b"") + ttrpc.encode_message(5, 2, b"yz")
    for cut in range(len(wire) + 1):
        dec = ttrpc.MessageDecoder()
        got = messages(dec.feed(wire[:cut]) + dec.feed(wire[cut:]))
        assert [(m.stream_id, m.payload) for m in got] == [(1, b"x" * 50), (3, b""), (5, b"yz")]
        assert dec.buffered == 0
    dec = ttrpc.MessageDecoder()
    got = messages([m for b in wire for m in dec.feed(bytes([b]))])
    assert len(got) == 3


@pytest.mark.parametrize("chunk", [1, 7, 4096, 1 << 20])
def test_receive_bound_is_exact(chunk: int) -> None:
    """A message of exactly the bound is accepted; one byte more is refused from its header
    and skipped unread, and the stream goes on (the next message decodes)."""
    bound = 5000
    at = ttrpc.encode_message(1, 1, b"a" * bound, limit=bound)
    over = ttrpc.encode_message(3, 1, b"b" * (bound + 1), limit=bound + 1)
    after = ttrpc.encode_message(5, 1, b"c")
    wire = at + over + after
    dec = ttrpc.MessageDecoder(max_message=bound)
    got: list[ttrpc.Message | ttrpc.TooLarge] = []
    for i in range(0, len(wire), chunk):
        got += dec.feed(wire[i : i + chunk])
        assert dec.buffered <= ttrpc.HEADER_LEN + bound  # the refused one never buffered
    assert len(got) == 3
    assert isinstance(got[0], ttrpc.Message) and got[0].payload == b"a" * bound
    assert got[1] == ttrpc.TooLarge(3, 1, bound + 1, bound)
    assert isinstance(got[2], ttrpc.Message) and (got[2].stream_id, got[2].payload) == (5, b"c")
    assert dec.buffered == 0 and dec.skipping == 0


def test_too_large_is_skipped_unbuffered_then_reported() -> None:
    """Reported once it has streamed past, so an error answer reaches a sender that has
    finished writing (Go's ttrpc does the same)."""
    dec = ttrpc.MessageDecoder(max_message=100)
    assert dec.feed(struct.pack(">IIBB", 101, 7, 1, 0)) == [] and dec.skipping == 101
    assert dec.feed(b"x" * 60) == [] and dec.skipping == 41 and dec.buffered == 0
    got = dec.feed(b"y" * 41 + ttrpc.encode_message(9, 2, b"ok"))
    assert got == [ttrpc.TooLarge(7, 1, 101, 100), ttrpc.Message(9, 2, 0, b"ok")]


def test_default_bounds() -> None:
    """Sent: ttrpc's 4 MiB convention (what the runtime accepts); received: 64 MiB."""
    assert ttrpc.MAX_MESSAGE == 4 << 20 and ttrpc.RECEIVE_BOUND == 64 << 20
    assert ttrpc.MessageDecoder().max_message == ttrpc.RECEIVE_BOUND
    with pytest.raises(ValueError):
        ttrpc.encode_message(1, 1, b"\0" * (ttrpc.MAX_MESSAGE + 1))
    ttrpc.encode_message(1, 1, b"\0" * ttrpc.MAX_MESSAGE)


def test_large_message_in_many_chunks_is_filled_in_place() -> None:
    payload = bytes(range(256)) * 40_000  # ~10 MB, over ttrpc's 4 MiB convention
    wire = ttrpc.encode_message(1, 1, payload, limit=len(payload))
    dec = ttrpc.MessageDecoder()
    got = []
    for i in range(0, len(wire), 65536):
        got += dec.feed(memoryview(wire)[i : i + 65536])
    (m,) = got
    assert isinstance(m, ttrpc.Message) and m.payload == payload


def test_connection_refuses_a_request_over_the_bound() -> None:
    client = ttrpc.Connection(send_limit=1 << 20)
    server = ttrpc.Connection(max_message=1000)
    sid, big = client.send_request("svc", "Synchronize", b"p" * 2000)
    _, small = client.send_request("svc", "CreateContainer", b"q")
    evs = server.receive_data(big + small)
    assert isinstance(evs[0], ttrpc.RequestTooLarge) and evs[0].stream_id == sid
    assert "1000-byte receive bound" in evs[0].message
    assert isinstance(evs[1], ttrpc.RequestReceived) and evs[1].request.method == "CreateContainer"
    # A response over the bound fails the call it answers, with RESOURCE_EXHAUSTED.
    caller = ttrpc.Connection(max_message=100)
    sid, _ = caller.send_request("svc", "M", b"")
    (r,) = caller.receive_data(ttrpc.Connection().send_response(sid, b"r" * 200))
    assert isinstance(r, ttrpc.ResponseReceived) and r.response.code == ttrpc.Code.RESOURCE_EXHAUSTED


def test_unknown_message_type() -> None:
    with pytest.raises(ProtocolError, match="unknown ttrpc message type 9"):
        ttrpc.MessageDecoder().feed(struct.pack(">IIBB", 0, 1, 9, 0))


def test_truncated_input_waits_without_events() -> None:
    dec = ttrpc.MessageDecoder()
    wire = ttrpc.encode_message(1, 1, b"hello")
    assert dec.feed(wire[:-1]) == []
    assert dec.buffered == len(wire) - 1


@pytest.mark.parametrize(
    "bad",
    [
        b"\x0a\x05ab",  # length runs past the end
        b"\x80",  # truncated varint key
        b"\x0a",  # missing length
        b"\x00\x00",  # field number 0
        b"\x0f",  # wire type 7
        b"\x2a\x02\x0a\xff",  # metadata entry with a truncated key
        b"\x0a\x02\xff\xfe",  # service not UTF-8
        b"\x20" + b"\xff" * 11,  # varint too long
    ],
)
def test_malformed_request(bad: bytes) -> None:
    with pytest.raises(ProtocolError):
        ttrpc.decode_request(bad)


@pytest.mark.parametrize(
    "bad", [b"\x0a\x03\x08", b"\x12\x05ab", b"\x0a\x02\x12\x01", b"\x0a\x01\x0a", b"\x0a\x04\x12\x02\xff\xfe"]
)
def test_malformed_response(bad: bytes) -> None:
    with pytest.raises(ProtocolError):
        ttrpc.decode_response(bad)


@settings(max_examples=300)
@given(st.lists(st.binary(max_size=64), max_size=20))
def test_random_bytes_raise_one_error_or_nothing(chunks: list[bytes]) -> None:
    """Whatever arrives, the decoder returns messages or raises ProtocolError; its buffer is
    bounded by one maximal message."""
    dec = ttrpc.MessageDecoder(max_message=256)
    for c in chunks:
        try:
            dec.feed(c)
        except ProtocolError:
            return
        assert dec.buffered < ttrpc.HEADER_LEN + 256 + 64


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_random_envelopes(data: bytes) -> None:
    for fn in (ttrpc.decode_request, ttrpc.decode_response):
        with contextlib.suppress(ProtocolError):
            fn(data)


def test_connection_stream_ids_and_errors() -> None:
    client, server = ttrpc.Connection(), ttrpc.Connection()
    s1, m1 = client.send_request("svc", "M", b"p")
    s2, m2 = client.send_request("svc", "M", b"q")
    assert (s1, s2) == (1, 3)
    evs = server.receive_data(m1 + m2)
    assert [type(e) for e in evs] == [ttrpc.RequestReceived] * 2
    # Re-used and even stream ids are answered with an error, not dispatched.
    bad = server.receive_data(ttrpc.encode_message(3, 1, ttrpc.encode_request(ttrpc.Request("s", "m"))))
    assert isinstance(bad[0], ttrpc.BadRequest) and bad[0].code == ttrpc.Code.INVALID_ARGUMENT
    bad = server.receive_data(ttrpc.encode_message(8, 1, b""))
    assert isinstance(bad[0], ttrpc.BadRequest) and "odd" in bad[0].message
    bad = server.receive_data(ttrpc.encode_message(9, 1, b"\x0a\x09"))
    assert isinstance(bad[0], ttrpc.BadRequest) and "malformed" in bad[0].message
    # Responses: matched to pending calls; late answers to abandoned calls dropped.
    client.abandon(s2)
    got = client.receive_data(server.send_response(s1, b"ok") + server.send_response(s2, b"late"))
    assert len(got) == 1 and isinstance(got[0], ttrpc.ResponseReceived) and got[0].response.payload == b"ok"
    err = server.send_response(5, code=ttrpc.Code.UNIMPLEMENTED, message="method X")
    client.send_request("svc", "X", b"")
    (r,) = client.receive_data(err)
    assert isinstance(r, ttrpc.ResponseReceived) and r.response.code == 12 and r.response.message == "method X"
    with pytest.raises(ProtocolError, match="streams"):
        server.receive_data(ttrpc.encode_message(11, ttrpc.MessageType.DATA, b""))


def test_a_refused_request_still_uses_up_its_stream_id() -> None:
    """A request skipped for its size was sent on a stream the client cannot use again: a
    later request on that id is a re-use. An even id (not a client's) moves nothing."""
    server = ttrpc.Connection(max_message=100)
    small = ttrpc.encode_request(ttrpc.Request("svc", "M"))
    big = ttrpc.encode_message(5, 1, b"x" * 101, limit=101)
    (refused,) = server.receive_data(big)
    assert refused == ttrpc.RequestTooLarge(5, 101, 100)
    assert refused.message == "request of 101 bytes exceeds this plugin's 100-byte receive bound"
    (again,) = server.receive_data(ttrpc.encode_message(5, 1, small))
    assert isinstance(again, ttrpc.BadRequest) and "re-used" in again.message
    (even,) = server.receive_data(ttrpc.encode_message(8, 1, b"x" * 101, limit=101))
    assert even == ttrpc.RequestTooLarge(8, 101, 100)
    (ok,) = server.receive_data(ttrpc.encode_message(7, 1, small))
    assert isinstance(ok, ttrpc.RequestReceived) and ok.stream_id == 7


def test_refused_messages_keep_the_events_before_them() -> None:
    server = ttrpc.Connection(max_message=100)
    wire = ttrpc.encode_message(1, 1, ttrpc.encode_request(ttrpc.Request("svc", "A")))
    wire += ttrpc.encode_message(3, 1, b"x" * 200, limit=200)
    wire += ttrpc.encode_message(5, 1, ttrpc.encode_request(ttrpc.Request("svc", "B")))
    evs = server.receive_data(wire)
    assert [type(e) for e in evs] == [ttrpc.RequestReceived, ttrpc.RequestTooLarge, ttrpc.RequestReceived]
    assert [e.stream_id for e in evs] == [1, 3, 5]


def test_a_response_over_the_bound_fails_its_call_once() -> None:
    """The call ends with RESOURCE_EXHAUSTED, on its stream, and is no longer pending: a
    second answer on that stream is dropped like any late one."""
    caller = ttrpc.Connection(max_message=100)
    sid, _ = caller.send_request("svc", "M", b"")
    too_big = ttrpc.encode_message(sid, 2, b"r" * 150, limit=150)
    (r,) = caller.receive_data(too_big)
    text = "response of 150 bytes exceeds the 100-byte receive bound"
    assert r == ttrpc.ResponseReceived(sid, ttrpc.Response(b"", ttrpc.Code.RESOURCE_EXHAUSTED, text))
    assert caller.pending == 0
    assert caller.receive_data(too_big) == []
    assert caller.receive_data(ttrpc.Connection().send_response(sid, b"late")) == []


def test_a_data_message_over_the_bound_is_still_a_protocol_error() -> None:
    conn = ttrpc.Connection(max_message=10)
    with pytest.raises(ProtocolError, match="data message on stream 3: streams are not supported"):
        conn.receive_data(ttrpc.encode_message(3, ttrpc.MessageType.DATA, b"d" * 11))


def test_send_limit_is_the_connections_own() -> None:
    """Both directions use the connection's limit, not ttrpc's 4 MiB default: a peer that
    accepts more (the runtime-side test peer) can be sent more, and a smaller limit refuses
    a request before it becomes pending or takes a stream id."""
    small = ttrpc.Connection(send_limit=100)
    with pytest.raises(ValueError, match="100-byte limit"):
        small.send_request("svc", "M", b"x" * 200)
    assert small.pending == 0
    sid, _ = small.send_request("svc", "M", b"")
    assert sid == 1 and small.pending == 1
    big = ttrpc.Connection(send_limit=8 << 20)
    payload = b"r" * (ttrpc.MAX_MESSAGE + 1)
    (m,) = ttrpc.MessageDecoder().feed(big.send_response(1, payload))
    assert isinstance(m, ttrpc.Message) and ttrpc.decode_response(m.payload).payload == payload
    _, wire = big.send_request("svc", "M", payload)
    (m,) = ttrpc.MessageDecoder().feed(wire)
    assert isinstance(m, ttrpc.Message) and ttrpc.decode_request(m.payload).payload == payload


def test_a_fresh_decoder_holds_nothing() -> None:
    dec = ttrpc.MessageDecoder()
    assert (dec.buffered, dec.skipping) == (0, 0)
    assert dec.feed(b"") == [] and (dec.buffered, dec.skipping) == (0, 0)


@pytest.mark.parametrize("size", [0, 1, 127, 128, 300, 16383, 16384, 1 << 21])
def test_an_ok_response_encoded_by_hand_is_what_protobuf_encodes(size: int) -> None:
    """The usual answer skips protobuf: its bytes must be protobuf's, at every varint length."""
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
    m = ttrpc.ResponsePb(payload=payload)
    assert ttrpc.encode_response(ttrpc.Response(payload)) == m.SerializeToString()
    assert ttrpc.decode_response(ttrpc.encode_response(ttrpc.Response(payload))).payload == payload


@given(requests, st.integers(0, 2**30))
def test_a_whole_request_is_taken_in_one_step_as_in_pieces(req: ttrpc.Request, n: int) -> None:
    """The usual read (one whole request) decodes in one step to what the general way makes
    of the same bytes in two reads, and uses up its stream id the same way."""
    sid = 2 * n + 1
    wire = ttrpc.encode_message(sid, 1, ttrpc.encode_request(req))
    whole, pieces = ttrpc.Connection(), ttrpc.Connection()
    got = whole.whole_request(wire)
    assert got == ttrpc.RequestReceived(sid, req)
    assert pieces.receive_data(wire[:-1]) == [] and pieces.receive_data(wire[-1:]) == [got]
    for conn in (whole, pieces):
        (again,) = conn.receive_data(wire)
        assert isinstance(again, ttrpc.BadRequest) and "re-used" in again.message


def test_what_is_not_one_new_request_is_left_to_the_general_way_untouched() -> None:
    ok = ttrpc.encode_request(ttrpc.Request("svc", "M", b"p"))
    one = ttrpc.encode_message(1, 1, ok)
    cases = {
        "a response": ttrpc.encode_message(1, 2, b""),
        "two requests": one + ttrpc.encode_message(3, 1, ok),
        "part of one": one[:-1],
        "part of a header": one[:9],
        "an even stream id": ttrpc.encode_message(2, 1, ok),
        "a malformed envelope": ttrpc.encode_message(1, 1, b"\x0a\x09"),
        "over the bound": ttrpc.encode_message(1, 1, ok + b"\x00" * 100, limit=200),
    }
    for what, wire in cases.items():
        conn, fresh = ttrpc.Connection(max_message=100), ttrpc.Connection(max_message=100)
        assert conn.whole_request(wire) is None, what
        assert conn.receive_data(wire) == fresh.receive_data(wire), what
    # A used stream id, and a request arriving while part of another is held.
    conn, request = ttrpc.Connection(), ttrpc.Request("svc", "M", b"p")
    assert conn.receive_data(ttrpc.encode_message(5, 1, ok)) == [ttrpc.RequestReceived(5, request)]
    assert conn.whole_request(ttrpc.encode_message(5, 1, ok)) is None
    held = ttrpc.encode_message(7, 1, ok)
    assert conn.receive_data(held[:-2]) == []
    assert conn.whole_request(ttrpc.encode_message(9, 1, ok)) is None
    assert conn.receive_data(held[-2:]) == [ttrpc.RequestReceived(7, request)]


def test_a_whole_request_read_from_a_reused_buffer_keeps_its_bytes() -> None:
    """The transport reads into one buffer it reuses (transport.Trunk): the request parsed
    straight from a view of it must own what it holds."""
    req = ttrpc.Request("svc", "Method", b"payload" * 50, 7, [("k", "v")])
    buf = bytearray(ttrpc.encode_message(1, 1, ttrpc.encode_request(req)))
    got = ttrpc.Connection().whole_request(memoryview(buf))
    buf[:] = bytes(len(buf))
    assert got == ttrpc.RequestReceived(1, req)


def test_varint_is_protobufs() -> None:
    for n in [*range(1, 300), 16383, 16384, 2**31, 2**63 - 1]:
        assert ttrpc.RequestPb(timeout_nano=n).SerializeToString() == b"\x20" + ttrpc.varint(n), n
    assert ttrpc.varint(0) == b"\x00"


def test_a_whole_request_at_the_bound_is_taken_and_one_over_it_is_refused() -> None:
    req = ttrpc.Request("svc", "M", b"p" * 120)
    env = ttrpc.encode_request(req)
    wire = ttrpc.encode_message(1, 1, env)
    assert ttrpc.Connection(max_message=len(env)).whole_request(wire) == ttrpc.RequestReceived(1, req)
    over = ttrpc.Connection(max_message=len(env) - 1)
    assert over.whole_request(wire) is None
    assert over.receive_data(wire) == [ttrpc.RequestTooLarge(1, len(env), len(env) - 1)]


def test_an_error_answer_keeps_its_code_message_and_payload() -> None:
    server, client = ttrpc.Connection(), ttrpc.Connection()
    for payload, code, message in ((b"partial", ttrpc.Code.NOT_FOUND, ""), (b"", 0, "why"), (b"", 3, "bad")):
        sid, _ = client.send_request("svc", "M", b"")
        (r,) = client.receive_data(server.send_response(sid, payload, code, message))
        assert r == ttrpc.ResponseReceived(sid, ttrpc.Response(payload, code, message))
