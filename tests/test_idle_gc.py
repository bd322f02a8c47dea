"""Garbage is collected when the agent's loop is idle, never in a hook
(``agent/idle_gc.py``, and the selector's idle moment in ``nri/transport.py``).

The collector's counts are the interpreter's own: each test starts from a full collection, so
the youngest generation's count is what the test allocated."""

from __future__ import annotations

import asyncio
import gc
import socket
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from nriplugin.agent.assembly import agent_loop
from nriplugin.agent.idle_gc import BACKSTOP, IdleCollector
from nriplugin.cli.main import build_parser
from nriplugin.pacing.selector import PollClock


class Node:
    """A tracked object that can be part of a reference cycle."""

    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture
def collector() -> Iterator[IdleCollector]:
    c = IdleCollector()
    c.install()
    gc.collect()
    try:
        yield c
    finally:
        c.uninstall()


def test_install_raises_the_automatic_threshold_and_uninstall_restores_it() -> None:
    before = gc.get_threshold()
    c = IdleCollector()
    c.install()
    try:
        assert gc.get_threshold() == (before[0] * BACKSTOP, before[1], before[2])
    finally:
        c.uninstall()
    assert gc.get_threshold() == before


def test_nothing_is_due_until_the_youngest_generation_passes_cpythons_threshold(collector: IdleCollector) -> None:
    kept = [Node() for _ in range(collector.thresholds[0] // 2)]
    assert collector.due() is None and not collector.idle() and collector.collections == 0
    kept += [Node() for _ in range(collector.thresholds[0])]
    assert collector.due() == 0
    assert collector.idle() and collector.collections == 1 and collector.due() is None


def test_older_generations_are_collected_as_often_as_cpython_would(collector: IdleCollector) -> None:
    """Once more young collections than threshold[1] have run since the last middle one, the
    next takes the middle generation with it, as CPython's own trigger does."""
    t0, t1, _ = collector.thresholds
    kept: list[Node] = []
    gens = []
    for _ in range(t1 + 2):
        kept += [Node() for _ in range(t0 + 1)]
        gens.append(collector.due())
        collector.idle()
    assert gens == [0] * (t1 + 1) + [1]
    assert gc.get_count()[1] == 0


def test_idle_frees_cyclic_garbage_that_the_raised_threshold_left(collector: IdleCollector) -> None:
    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b
    kept = [Node() for _ in range(collector.thresholds[0] * 2)]  # far below the backstop
    assert gone() is not None  # no automatic collection came
    assert collector.idle() and gone() is None
    assert kept


def test_the_agent_loop_collects_at_idle_and_gives_the_thresholds_back() -> None:
    before = gc.get_threshold()
    ns = build_parser().parse_args(["run"])
    with agent_loop(ns) as poll:
        assert isinstance(poll, PollClock) and poll.idle is not None
        assert gc.get_threshold()[0] == before[0] * BACKSTOP
    assert gc.get_threshold() == before


def burst_of_requests(poll: PollClock, requests: int, kept_per_request: int) -> tuple[int, int]:
    """A peer thread sends ``requests`` requests one at a time, each after the answer to the one
    before (as a runtime does); the loop's handler keeps ``kept_per_request`` new tracked objects
    per request. Returns the collections that ran inside the handler and outside it."""
    inside = [False]
    during, outside = [0], [0]

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            (during if inside[0] else outside)[0] += 1

    a, b = socket.socketpair()
    kept: list[Node] = []

    def peer() -> None:
        for _ in range(requests):
            b.sendall(b"q")
            b.recv(1)
        b.close()

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        a.setblocking(False)

        def readable() -> None:
            data = a.recv(1)
            if not data:
                loop.remove_reader(a)
                done.set_result(None)
                return
            inside[0] = True
            kept.extend(Node() for _ in range(kept_per_request))
            a.send(b"a")
            inside[0] = False

        loop.add_reader(a, readable)
        t = threading.Thread(target=peer)
        t.start()
        await done
        t.join()

    gc.callbacks.append(on_gc)
    try:
        with asyncio.Runner(loop_factory=poll.loop) as runner:
            runner.run(serve())
    finally:
        gc.callbacks.remove(on_gc)
        a.close()
        b.close()
    return during[0], outside[0]


def test_a_burst_of_hooks_carries_no_collection_and_one_follows_it() -> None:
    """2000 requests keeping 20 objects each: CPython's thresholds would collect ~57 times
    inside the handler (the control: a plain selector); the agent's loop collects only when
    it is idle — no request then pays for a collection."""
    gc.collect()
    during, _ = burst_of_requests(PollClock(), 2000, 20)
    assert during >= 40  # the control: without the collector, collections land in hooks
    ns = build_parser().parse_args(["run"])
    gc.collect()
    with agent_loop(ns) as poll:
        during, outside = burst_of_requests(poll, 2000, 20)
    assert during == 0 and outside >= 1
