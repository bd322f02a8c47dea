"""Work after a hook's answer (``pacing/turns.py``, :meth:`Pacer.soon`): the take-in and the
news it causes run in one loop callback, in order, and give the loop back when their turn is
used up."""

from __future__ import annotations

import asyncio

import pytest

from nriplugin.pacing import turns
from nriplugin.pacing.turns import Pacer


def test_jobs_run_in_order_in_one_callback_with_the_jobs_they_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    order: list[str] = []
    callbacks: list[int] = []
    run = turns.AfterCallback._run

    def counted(self: turns.AfterCallback) -> None:
        callbacks.append(1)
        run(self)

    monkeypatch.setattr(turns.AfterCallback, "_run", counted)

    async def body() -> None:
        pacer = Pacer(asyncio.get_running_loop())

        def take_in() -> None:
            order.append("take-in")
            pacer.soon(order.append, "reconciler news")  # queued by a job: runs in the same callback

        pacer.soon(take_in)
        pacer.soon(order.append, "second")
        assert order == []  # after the current callback, not in it
        for _ in range(3):
            await asyncio.sleep(0)

    asyncio.run(body())
    assert order == ["take-in", "second", "reconciler news"]
    assert len(callbacks) == 1  # one loop callback for the three


def test_a_used_up_turn_gives_the_loop_back_and_the_rest_runs_after_what_is_ready() -> None:
    order: list[str] = []

    async def body() -> None:
        loop = asyncio.get_running_loop()
        pacer = Pacer(loop, turn=0.0)  # every turn is used up at once
        for i in range(3):
            pacer.soon(order.append, f"job {i}")
        loop.call_soon(order.append, "queued after")
        await asyncio.sleep(0)
        order.append("other callback")
        for _ in range(6):
            await asyncio.sleep(0)

    asyncio.run(body())
    assert order == ["job 0", "queued after", "other callback", "job 1", "job 2"]


def test_a_job_that_raises_does_not_stop_the_others(caplog: pytest.LogCaptureFixture) -> None:
    order: list[str] = []

    def bad() -> None:
        raise ValueError("boom")

    async def body() -> None:
        pacer = Pacer(asyncio.get_running_loop())
        pacer.soon(bad)
        pacer.soon(order.append, "after")
        for _ in range(4):
            await asyncio.sleep(0)
        pacer.soon(order.append, "later")  # the runner is not stuck
        for _ in range(3):
            await asyncio.sleep(0)

    asyncio.run(body())
    assert order == ["after", "later"]
    assert "boom" in caplog.text


def test_without_a_loop_now() -> None:
    order: list[str] = []
    pacer = Pacer()
    pacer.soon(order.append, "now")
    pacer.next_turn(order.append, "next turn: now too")
    assert order == ["now", "next turn: now too"]


def test_two_pacers_share_nothing() -> None:
    """No state outside the object: each pacer's jobs run in its own callbacks."""
    callbacks: list[str] = []

    async def body() -> None:
        loop = asyncio.get_running_loop()
        a, b = Pacer(loop), Pacer(loop)
        a.soon(callbacks.append, "a")
        b.soon(callbacks.append, "b")
        a.traffic.last_answer = 1.0
        assert b.traffic.last_answer == 0.0
        await asyncio.sleep(0)

    asyncio.run(body())
    assert callbacks == ["a", "b"]
