"""The agent's event loop answers a request that arrived during a job's turn right after that
turn (``nri/transport.py``, :class:`IOFirstLoop`), not after the job's next turn too."""

from __future__ import annotations

import asyncio
import socket

import pytest

from nriplugin.nri.transport import IOFirstLoop, PollClock


def order_of_events(loop: asyncio.AbstractEventLoop) -> list[str]:
    """A job of three turns (each gives the loop back with ``sleep(0)``, as node-sized jobs
    do) and a request whose bytes arrive during the first turn."""
    a, b = socket.socketpair()
    order: list[str] = []

    def request() -> None:
        a.recv(16)
        order.append("request")
        loop.remove_reader(a)

    async def job() -> None:
        loop.add_reader(a, request)
        for i in range(3):
            order.append(f"turn {i}")
            if i == 0:
                b.send(b"x")
            await asyncio.sleep(0)
        await asyncio.sleep(0)

    try:
        loop.run_until_complete(job())
    finally:
        loop.close()
        a.close()
        b.close()
    return order


def test_a_request_that_arrived_during_a_turn_goes_before_the_next_turn() -> None:
    assert order_of_events(IOFirstLoop()) == ["turn 0", "request", "turn 1", "turn 2"]


def test_the_plain_loop_would_run_the_next_turn_first() -> None:
    """Why the agent's loop is not asyncio's own: there the request waits for two turns."""
    assert order_of_events(asyncio.SelectorEventLoop()) == ["turn 0", "turn 1", "request", "turn 2"]


def test_the_agents_loop_is_io_first_and_keeps_the_order_of_earlier_callbacks() -> None:
    loop = PollClock().loop()
    assert isinstance(loop, IOFirstLoop)
    seen: list[int] = []
    try:
        for i in range(5):
            loop.call_soon(seen.append, i)
        loop.call_soon(loop.stop)
        loop.run_forever()
    finally:
        loop.close()
    assert seen == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("requests", [1, 3])
def test_every_ready_socket_goes_before_the_next_turn(requests: int) -> None:
    loop = IOFirstLoop()
    pairs = [socket.socketpair() for _ in range(requests)]
    order: list[str] = []

    def reader(i: int) -> None:
        pairs[i][0].recv(16)
        order.append(f"request {i}")
        loop.remove_reader(pairs[i][0])

    async def job() -> None:
        for i, (a, _) in enumerate(pairs):
            loop.add_reader(a, reader, i)
        order.append("turn 0")
        for _, b in pairs:
            b.send(b"x")
        await asyncio.sleep(0)
        order.append("turn 1")
        await asyncio.sleep(0)

    try:
        loop.run_until_complete(job())
    finally:
        loop.close()
        for a, b in pairs:
            a.close()
            b.close()
    assert order[0] == "turn 0" and order[-1] == "turn 1"
    assert sorted(order[1:-1]) == [f"request {i}" for i in range(requests)]
