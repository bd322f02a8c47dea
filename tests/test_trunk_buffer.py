"""The trunk reads into one buffer that every read overwrites (``nri/transport.py``): what the
protocol layers keep across reads must be their own copy."""

from __future__ import annotations

import asyncio

import pytest

from nriplugin.nri import api_pb2 as api
from nriplugin.nri import ttrpc
from nriplugin.nri.connection import NriConnection
from nriplugin.nri.transport import Trunk
from testkit.runtime_peer import make_container, make_pod


@pytest.mark.parametrize("pieces", [1, 2, 3, 7, 64])
def test_a_request_read_in_pieces_through_the_reused_buffer_arrives_intact(pieces: int) -> None:
    pod = make_pod(1, "BE")
    want = api.CreateContainerRequest(pod=pod, container=make_container(1, pod))
    runtime = NriConnection.runtime_side()
    _, wire = runtime.call("nri.pkg.api.v1alpha1.Plugin", "CreateContainer", want.SerializeToString())
    got: list[ttrpc.RequestReceived] = []

    async def main() -> None:
        trunk = Trunk(NriConnection(), got.append)
        step = -(-len(wire) // pieces)
        for start in range(0, len(wire), step):
            chunk = wire[start : start + step]
            buf = trunk.get_buffer(len(chunk))
            buf[: len(chunk)] = chunk
            trunk.buffer_updated(len(chunk))
            buf[:] = b"\xff" * len(buf)  # the next read overwrites it
        trunk.connection_lost(None)

    asyncio.run(main())
    assert len(got) == 1
    assert api.CreateContainerRequest.FromString(got[0].request.payload) == want
