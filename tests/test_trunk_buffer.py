"""The trunk reads into one buffer that every read overwrites (``nri/transport.py``): what the
protocol layers keep across reads must be their own copy."""

from __future__ import annotations

import asyncio

import pytest

from nriplugin.nri import api_pb2 as api
from nriplugin.nri import ttrpc
from nriplugin.nri.connection import NriConnection
from nriplugin.nri.transport import Trunk
from nriplugin.pacing.traffic import HookTraffic
from nriplugin.pacing.turns import Turn
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


def test_the_traffic_sees_bytes_on_a_connected_trunk_and_forgets_it_when_it_closes() -> None:
    """What ends a job's turn early (``pacing/traffic.py``): bytes waiting on a trunk's socket,
    before the loop has read them; once the trunk is gone its socket number is not polled."""
    import socket

    traffic = HookTraffic()

    async def main() -> list[bool]:
        loop = asyncio.get_running_loop()
        ours, runtime = socket.socketpair()
        transport, _ = await loop.create_unix_connection(
            lambda: Trunk(NriConnection(), lambda ev: None, traffic=traffic), sock=ours
        )
        seen = [traffic.waiting()]
        runtime.send(b"\0")  # a request's first byte, not read yet: nothing ran the loop
        seen.append(traffic.waiting())
        turn = Turn(traffic.waiting, budget=60.0)
        turn.looked -= 1.0  # due for a look
        seen.append(turn.over())
        transport.close()
        await asyncio.sleep(0)  # connection_lost
        seen.append(traffic.waiting())
        runtime.close()
        return seen

    assert asyncio.run(main()) == [False, True, True, False]


def test_a_turn_does_not_end_for_bytes_on_other_sockets() -> None:
    import socket

    traffic = HookTraffic()
    a, b = socket.socketpair()
    try:
        b.send(b"x")
        turn = Turn(traffic.waiting, budget=60.0)
        turn.looked -= 1.0
        assert not traffic.waiting() and not turn.over()
    finally:
        a.close()
        b.close()


def test_an_answer_is_told_to_the_traffic_of_its_trunk_alone() -> None:
    """The last answer is the trunk's traffic's, not the process's: two agents' loops (or a
    test's) do not see each other's hooks."""
    ours, other = HookTraffic(), HookTraffic()

    async def main() -> None:
        trunk = Trunk(NriConnection(), lambda ev: None, traffic=ours)
        trunk.respond(1)

    asyncio.run(main())
    assert ours.last_answer > 0 and other.last_answer == 0
