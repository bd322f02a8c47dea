"""The event loop's selector: when a turn's bytes can have arrived, and awake through a burst.

A hook's time starts when its bytes could first have been read, not when the loop got to
them: :class:`PollClock` bounds that moment (see its docstring), so the hook-latency histogram
includes the time a request sat behind other work on the loop — what the runtime waits for,
and what a plugin-side timer alone cannot see.
"""

from __future__ import annotations

import asyncio
import os
import selectors
import time
from collections.abc import Callable

BURST_POLL = 200e-6  # seconds a poll looks without sleeping while requests come back to back


class PollClock(selectors.DefaultSelector):
    """The event loop's selector, noting when the bytes of each turn can have arrived, and
    keeping the loop awake through a burst of requests.

    A request read in a turn arrived after the previous poll returned (else that poll would
    have reported it). Each poll first looks without waiting: what is ready then arrived while
    the loop was busy with other callbacks, at the earliest when that busy spell began, and
    that moment is taken (a bound that errs towards the runtime's view, never below it). Only
    when nothing is ready does the poll sleep; what wakes it arrived as it woke. (How long a
    poll took says nothing: one that finds bytes ready is not slower for it.)

    A thread woken from sleep handles its request on cold caches, after a wake-up that is
    costly on a VM. The runtime sends a plugin one request at a time, so in a burst (a
    workload scaled up, a node draining) the next request follows the answer within the
    runtime's own turnaround. So while requests come back to back — the last sleeping poll
    after an answer (:meth:`answered`) was woken by I/O within ``burst_poll`` — a poll looks
    without sleeping for up to ``burst_poll`` before it sleeps, as Go's scheduler spins before
    parking a thread, and gives the CPU way between looks (:meth:`_give_way`). The first
    look that finds nothing ends the burst: outside bursts (hooks milliseconds apart) the loop
    sleeps at once, and a burst costs at most ``burst_poll`` of CPU beyond its own work.
    ``burst_poll`` 0: never.

    ``idle``, when given, runs just before a poll would sleep, outside bursts (the agent
    collects garbage there, :mod:`nriplugin.agent.idle_gc`); it returns whether it did work,
    and bytes found ready after it arrived while it ran.
    """

    def __init__(self, burst_poll: float = BURST_POLL, idle: Callable[[], bool] | None = None) -> None:
        super().__init__()
        self.burst_poll = burst_poll
        self.idle = idle
        self._returned = self._now()
        self.arrived = self._returned  # the earliest the bytes of this turn can have arrived
        self.burst = False  # the last sleeping poll after an answer was woken by I/O within burst_poll
        self._answer = False  # a request was answered since the last sleeping poll
        self.spun = 0.0  # seconds spent looking without sleeping (the burst's CPU cost)

    @staticmethod
    def _now() -> float:
        return time.perf_counter()

    def _poll(self, timeout: float | None) -> list[tuple[selectors.SelectorKey, int]]:
        return super().select(timeout)

    def arrival(self) -> float:
        return self.arrived

    def answered(self) -> None:
        """A trunk answered a request: only I/O soon after an answer is a burst of hooks (a
        quick reply to one of the agent's own calls, or a file event, is not)."""
        self._answer = True

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._poll(0)
        if ready or timeout == 0:
            self.arrived = self._returned  # ready before this poll: came while the loop was busy
        else:
            began = self._now()
            if self.burst and self.burst_poll > 0:
                ready = self._spin(began, self.burst_poll if timeout is None else min(self.burst_poll, timeout))
            if not ready and self.idle is not None:
                quiet = self._now()
                if self.idle():
                    ready = self._poll(0)
                    self.arrived = quiet  # came while idle work ran
            if not ready:
                left = None if timeout is None else max(0.0, timeout - (self._now() - began))
                ready = self._poll(left)
                self.arrived = self._now()  # woke it
            self.burst = bool(ready) and self._answer and self.arrived - began <= self.burst_poll
            self._answer = False
        self._returned = self._now()
        return ready

    def _spin(self, began: float, span: float) -> list[tuple[selectors.SelectorKey, int]]:
        """Look without sleeping until something is ready or ``span`` has passed, giving the
        CPU way between looks; what is found arrived after the look before it."""
        looked = began
        while True:
            ready = self._poll(0)
            now = self._now()
            if ready:
                self.arrived = looked
                break
            looked = now
            if now - began >= span:
                break
            self._give_way()
        self.spun += now - began
        return ready

    @staticmethod
    def _give_way() -> None:
        """sched_yield(2) between looks: a thread that can run on this CPU (the runtime's
        own, its garbage collector's) runs now, not after the look; with none the call
        returns at once. On a small machine a plain spinner holds a CPU the runtime needs
        to send the next request, and the runtime's tail grows (bench/hook_latency's burst,
        docs/hook-path.md)."""
        os.sched_yield()

    def loop(self) -> asyncio.AbstractEventLoop:
        """A new event loop on this selector (asyncio's own loop: the order of its callbacks
        is the pacer's business, :meth:`nriplugin.pacing.turns.Pacer.give_way`)."""
        return asyncio.SelectorEventLoop(self)
