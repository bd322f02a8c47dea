"""The NRI multiplexer codec."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nriplugin.nri import mux, ttrpc
from nriplugin.nri.connection import NriConnection
from nriplugin.nri.errors import ProtocolError


def frames(wire: bytes) -> list[tuple[int, int]]:
    """(conn, length) of each frame in ``wire``."""
    out, pos = [], 0
    while pos < len(wire):
        cid, n = struct.unpack_from(">II", wire, pos)
        out.append((cid, n))
        pos += 8 + n
    assert pos == len(wire)
    return out


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 4097, 8192, 100_000, 4 << 20])
def test_runtime_framing_rule(size: int) -> None:
    """Up to 4096 bytes in one frame; larger: a 4096-byte frame, then the rest."""
    msg = bytes(range(256)) * (size // 256) + b"z" * (size % 256)
    wire = mux.encode_for_runtime(2, msg)
    expected = [(2, size)] if size <= 4096 else [(2, 4096), (2, size - 4096)]
    assert frames(wire) == expected
    (got,) = [b"".join(d for _, d in mux.Demultiplexer().feed(wire))]
    assert got == msg


@given(st.lists(st.tuples(st.sampled_from([1, 2]), st.binary(max_size=300)), max_size=10))
def test_round_trip(chunks: list[tuple[int, bytes]]) -> None:
    wire = b"".join(mux.encode_frame(c, d) for c, d in chunks)
    assert mux.Demultiplexer().feed(wire) == chunks


def test_split_at_every_byte_boundary() -> None:
    wire = mux.encode_frame(1, b"a" * 20) + mux.encode_frame(2, b"") + mux.encode_frame(1, b"bc")
    for cut in range(len(wire) + 1):
        d = mux.Demultiplexer()
        assert d.feed(wire[:cut]) + d.feed(wire[cut:]) == [(1, b"a" * 20), (2, b""), (1, b"bc")]


def test_unknown_conns_are_dropped_and_counted() -> None:
    d = mux.Demultiplexer()
    wire = mux.encode_frame(7, b"junk") + mux.encode_frame(1, b"ok") + mux.encode_frame(99, b"")
    assert d.feed(wire) == [(1, b"ok")]
    assert d.dropped_frames == 2 and d.buffered == 0


def test_reserved_conn_and_oversize() -> None:
    with pytest.raises(ProtocolError, match="reserved"):
        mux.Demultiplexer().feed(struct.pack(">II", 0, 0))
    d = mux.Demultiplexer(max_frame=100)
    with pytest.raises(ProtocolError, match="exceeds"):
        d.feed(struct.pack(">II", 1, 101))
    with pytest.raises(ProtocolError):
        d.feed(b"")
    with pytest.raises(ValueError):
        mux.encode_frame(0, b"")


def test_truncated_frame_waits() -> None:
    d = mux.Demultiplexer()
    assert d.feed(mux.encode_frame(1, b"abcdef")[:-2]) == []
    assert d.buffered == 12


@settings(max_examples=300)
@given(st.lists(st.binary(max_size=64), max_size=20))
def test_random_bytes_bounded(chunks: list[bytes]) -> None:
    d = mux.Demultiplexer(max_frame=512)
    for c in chunks:
        try:
            d.feed(c)
        except ProtocolError:
            return
        assert d.buffered < 8 + 512 + 64


@settings(max_examples=200)
@given(st.binary(max_size=400))
def test_random_bytes_through_the_whole_stack(data: bytes) -> None:
    """Random trunk bytes: events or one ProtocolError, never another exception."""
    conn = NriConnection()
    with contextlib.suppress(ProtocolError):
        conn.receive_data(data)


def test_message_spanning_frames_through_the_stack() -> None:
    """A ttrpc request split over many tiny mux frames, mixed with frames for other conns."""
    runtime = NriConnection.runtime_side()
    plugin = NriConnection()
    _, wire_msg = runtime.client.send_request("svc", "Method", b"p" * 9000)
    wire = b""
    for i in range(0, len(wire_msg), 7):
        wire += mux.encode_frame(1, wire_msg[i : i + 7]) + mux.encode_frame(5, b"noise")
    (ev,) = plugin.receive_data(wire)
    assert isinstance(ev, ttrpc.RequestReceived) and ev.request.payload == b"p" * 9000
    # The answer is framed for the Go runtime's 4 KiB reader.
    out = plugin.respond(ev.stream_id, b"r" * 5000)
    assert [n for _, n in frames(out)] == [4096, len(out) - 8 - 4096 - 8]


def test_stream_hands_on_pieces_as_they_arrive() -> None:
    """stream(): payload bytes per conn as soon as they arrive, frames of unknown conns
    skipped; only a partial header is ever held."""
    wire = mux.encode_frame(1, b"a" * 100) + mux.encode_frame(7, b"junk") + mux.encode_frame(2, b"") + b""
    wire += mux.encode_frame(2, b"bc") + mux.encode_frame(1, b"d")
    for step in (1, 5, 30, len(wire)):
        d = mux.Demultiplexer()
        got: dict[int, bytes] = {1: b"", 2: b""}
        for i in range(0, len(wire), step):
            for conn_id, piece in d.stream(wire[i : i + step]):
                assert piece and isinstance(piece, memoryview)
                got[conn_id] += bytes(piece)
            assert d.buffered < mux.HEADER_LEN
        assert got == {1: b"a" * 100 + b"d", 2: b"bc"} and d.dropped_frames == 1


def test_a_request_in_one_frame_is_what_it_is_byte_by_byte() -> None:
    """The usual read (a hook's request in one whole frame, taken in one step) gives the
    events the same bytes give read one at a time; a response in one frame still reaches
    its call; a frame while part of another is held is not mistaken for a whole one."""
    runtime = NriConnection.runtime_side()
    _, first = runtime.client.send_request("svc", "Create", b"c" * 3000)
    _, second = runtime.client.send_request("svc", "Start", b"s")
    wire = mux.encode_frame(1, first) + mux.encode_frame(1, second)
    whole, byte_by_byte = NriConnection(), NriConnection()
    got = whole.receive_data(wire[: 8 + len(first)]) + whole.receive_data(wire[8 + len(first) :])
    slow = [ev for i in range(len(wire)) for ev in byte_by_byte.receive_data(wire[i : i + 1])]
    assert got == slow and [type(e) for e in got] == [ttrpc.RequestReceived] * 2
    assert [e.request.method for e in got if isinstance(e, ttrpc.RequestReceived)] == ["Create", "Start"]
    sid, _ = whole.call("svc", "Register", b"")
    (answer,) = whole.receive_data(mux.encode_frame(2, runtime.server.send_response(sid, b"ok")))
    assert answer == ttrpc.ResponseReceived(sid, ttrpc.Response(b"ok"))
    d = mux.Demultiplexer()
    assert d.stream(mux.encode_frame(1, b"abc")[:5]) == []
    assert d.whole(mux.encode_frame(1, b"xyz")) is None


def test_whole_is_the_usual_read_and_nothing_else() -> None:
    """Demultiplexer.whole: one whole, non-empty frame for a known conn with nothing held
    (what NriConnection takes in one step); anything else is None, and changes nothing."""
    d = mux.Demultiplexer(max_frame=10)
    got = d.whole(mux.encode_frame(2, b"x"))
    assert got is not None and got[0] == 2 and bytes(got[1]) == b"x"
    at_bound = d.whole(mux.encode_frame(1, b"y" * 10))
    assert at_bound is not None and bytes(at_bound[1]) == b"y" * 10
    one = mux.encode_frame(1, b"x")
    for data in (mux.encode_frame(1, b""), mux.encode_frame(7, b"x"), one + b"\x00", one[:-1]):
        assert d.whole(data) is None, data
    assert d.whole(struct.pack(">II", 1, 11) + b"z" * 11) is None  # over max_frame
    assert d.stream(mux.encode_frame(1, b"")) == [] and d.buffered == 0
    midway = mux.Demultiplexer()
    assert [bytes(p) for _, p in midway.stream(mux.encode_frame(1, b"abc")[:10])] == [b"ab"]
    assert midway.whole(one) is None
    assert [bytes(p) for _, p in midway.stream(b"c")] == [b"c"]
    broken = mux.Demultiplexer()
    with pytest.raises(ProtocolError):
        broken.stream(struct.pack(">II", 0, 0))
    assert broken.whole(one) is None
