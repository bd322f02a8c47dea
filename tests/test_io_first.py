"""A hook request that arrived during a job's turn is answered right after that turn, not after
the job's next turn too (``pacing/turns.py``, :func:`give_way` and :func:`next_turn`), on
asyncio's own loop."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

import pytest

from nriplugin.pacing.selector import PollClock
from nriplugin.pacing.traffic import HookTraffic
from nriplugin.pacing.turns import Pacer


def order_of_events(
    give_way: Callable[[Pacer], Awaitable[None]], loop: asyncio.AbstractEventLoop | None = None
) -> list[str]:
    """A job of three turns (each gives the loop back with ``give_way``, as node-sized jobs
    do) and a request whose bytes arrive on a trunk during the first turn."""
    loop = asyncio.SelectorEventLoop() if loop is None else loop
    a, b = socket.socketpair()
    traffic = HookTraffic()
    traffic.opened(a.fileno())
    pacer = Pacer(loop, traffic)
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
            await give_way(pacer)
        await give_way(pacer)

    try:
        loop.run_until_complete(job())
    finally:
        loop.close()
        a.close()
        b.close()
    return order


def test_a_request_that_arrived_during_a_turn_goes_before_the_next_turn() -> None:
    assert order_of_events(Pacer.give_way) == ["turn 0", "request", "turn 1", "turn 2"]


def test_so_it_does_on_the_agents_loop() -> None:
    assert order_of_events(Pacer.give_way, PollClock().loop()) == ["turn 0", "request", "turn 1", "turn 2"]


def test_a_bare_yield_would_run_the_next_turn_first() -> None:
    """Why a turn looks for a waiting request after its yield: asyncio runs what was queued
    before a poll ahead of the I/O it finds, so after a bare yield the request waits for two
    turns."""

    async def bare(pacer: Pacer) -> None:
        await asyncio.sleep(0)

    assert order_of_events(bare) == ["turn 0", "turn 1", "request", "turn 2"]


def test_with_no_request_waiting_a_turn_costs_one_loop_iteration() -> None:
    """The second yield is the hook's: a job alone on the loop goes on after one."""
    loop = asyncio.SelectorEventLoop()
    pacer = Pacer(loop, HookTraffic())
    order: list[str] = []

    async def job(name: str) -> None:
        for i in range(3):
            order.append(f"{name}{i}")
            await pacer.give_way()

    async def both() -> None:
        await asyncio.gather(job("a"), job("b"))

    try:
        loop.run_until_complete(both())
    finally:
        loop.close()
    assert order == ["a0", "b0", "a1", "b1", "a2", "b2"]


@pytest.mark.parametrize("requests", [1, 3])
def test_every_waiting_request_goes_before_the_next_turn_of_a_callback_job(requests: int) -> None:
    """The callback form (a job that ends its turn and queues the rest, as the reconciler's
    batches and the take-in do)."""
    loop = asyncio.SelectorEventLoop()
    pairs = [socket.socketpair() for _ in range(requests)]
    traffic = HookTraffic()
    pacer = Pacer(loop, traffic)
    order: list[str] = []

    def reader(i: int) -> None:
        pairs[i][0].recv(16)
        order.append(f"request {i}")
        loop.remove_reader(pairs[i][0])

    def turn(i: int) -> None:
        order.append(f"turn {i}")
        if i == 0:
            for _, b in pairs:
                b.send(b"x")
            pacer.next_turn(turn, 1)
        else:
            loop.stop()

    for i, (a, _) in enumerate(pairs):
        traffic.opened(a.fileno())
        loop.add_reader(a, reader, i)
    loop.call_soon(turn, 0)
    try:
        loop.run_forever()
    finally:
        loop.close()
        for a, b in pairs:
            a.close()
            b.close()
    assert order[0] == "turn 0" and order[-1] == "turn 1"
    assert sorted(order[1:-1]) == [f"request {i}" for i in range(requests)]


def test_the_next_turn_keeps_the_order_of_what_was_queued_before() -> None:
    loop = asyncio.SelectorEventLoop()
    pacer = Pacer(loop)
    seen: list[int] = []
    try:
        for i in range(3):
            loop.call_soon(seen.append, i)
        pacer.next_turn(seen.append, 9)
        loop.call_soon(seen.append, 3)
        loop.call_soon(loop.stop)
        loop.run_forever()
    finally:
        loop.close()
    assert seen == [0, 1, 2, 9, 3]
