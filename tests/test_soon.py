"""Work after a hook's answer (``node/turns.py``, :func:`soon`): the take-in and the news it
causes run in one loop callback, in order, and give the loop back when their turn is used up."""

from __future__ import annotations

import asyncio

import pytest

from nriplugin.node import turns
from nriplugin.node.turns import soon


def test_jobs_run_in_order_in_one_callback_with_the_jobs_they_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    order: list[str] = []
    callbacks: list[int] = []
    run = turns.Soon._run

    def counted(self: turns.Soon) -> None:
        callbacks.append(1)
        run(self)

    monkeypatch.setattr(turns.Soon, "_run", counted)

    def take_in() -> None:
        order.append("take-in")
        soon(order.append, "reconciler news")  # queued by a job: runs in the same callback

    async def body() -> None:
        soon(take_in)
        soon(order.append, "second")
        assert order == []  # after the current callback, not in it
        for _ in range(3):
            await asyncio.sleep(0)

    asyncio.run(body())
    assert order == ["take-in", "second", "reconciler news"]
    assert len(callbacks) == 1  # one loop callback for the three


def test_a_used_up_turn_gives_the_loop_back_and_the_rest_runs_next(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(turns, "TURN", 0.0)  # every turn is used up at once
    order: list[str] = []

    async def body() -> None:
        for i in range(3):
            soon(order.append, f"job {i}")
        await asyncio.sleep(0)
        order.append("other callback")
        for _ in range(4):
            await asyncio.sleep(0)

    asyncio.run(body())
    assert order == ["job 0", "other callback", "job 1", "job 2"]


def test_a_job_that_raises_does_not_stop_the_others(caplog: pytest.LogCaptureFixture) -> None:
    order: list[str] = []

    def bad() -> None:
        raise ValueError("boom")

    async def body() -> None:
        soon(bad)
        soon(order.append, "after")
        for _ in range(3):
            await asyncio.sleep(0)
        soon(order.append, "later")  # the runner is not stuck
        for _ in range(3):
            await asyncio.sleep(0)

    asyncio.run(body())
    assert order == ["after", "later"]
    assert "boom" in caplog.text


def test_without_a_loop_now() -> None:
    order: list[str] = []
    soon(order.append, "now")
    assert order == ["now"]
