"""Long work on the event loop, in turns.

The loop that answers NRI hooks also runs the reconciler's passes, the QoS manager's rounds and
the inventory. A job whose size follows the node (a pass over every managed cgroup, a round
that reads every container) gives the loop back whenever it has held it for ``TURN`` seconds,
or sooner when a hook request is waiting on a trunk (it looks every ``LOOK`` seconds), so a
hook that arrives meanwhile waits for about one item, whatever the node's size.
Turns are measured in time, not in items: a slow item (a cgroup read that stalls) shortens its
turn instead of stretching it.
"""

from __future__ import annotations

import asyncio
import collections
import time
import weakref
from collections.abc import Callable

from nriplugin.nri.transport import hook_waiting

# Seconds a job may hold the loop before it lets a waiting hook in. 0.25 ms: on a node of 3000
# containers a QoS round is some 150 turns; halving them from 0.5 ms took the hook p99 there
# from 583 to 473 us (in process, 6 runs each) for one more loop iteration per turn (~15 us).
TURN = 0.00025


# Seconds between two looks for a waiting hook request within a turn. A look is one poll(2)
# of the trunks (under 1 us); a request that arrives mid-turn waits for the item in progress
# and at most this long, not for the rest of the turn.
LOOK = 10e-6


class Turn:
    """One job's clock: ``over()`` says when to give the loop back — its turn is used up, or
    a hook request is waiting on a trunk; ``restart()`` when the job has it again."""

    __slots__ = ("budget", "looked", "started")

    def __init__(self, budget: float | None = None) -> None:
        self.budget = TURN if budget is None else budget
        self.started = self.looked = time.perf_counter()

    def over(self) -> bool:
        now = time.perf_counter()
        if now - self.started >= self.budget:
            return True
        if now - self.looked < LOOK:
            return False
        self.looked = now
        return hook_waiting()

    def restart(self) -> None:
        self.started = self.looked = time.perf_counter()


class Soon:
    """Work for right after the current callback (a hook's answer goes first), run in one loop
    callback for as long as its turn lasts: a hook's take-in and the reconciler's news that it
    causes then cost one pass of the loop (a poll of every socket), not one each. Jobs run in
    the order given; a used-up turn or a waiting hook request ends the callback, and the rest
    runs in the next, after that request. One per loop (:func:`soon`); it holds no reference
    to its loop, so a closed loop and its runner go together."""

    __slots__ = ("_jobs", "_queued")

    def __init__(self) -> None:
        self._jobs: collections.deque[tuple[Callable[..., object], tuple[object, ...]]] = collections.deque()
        self._queued = False  # a callback is on the loop, or running

    def call(self, loop: asyncio.AbstractEventLoop, fn: Callable[..., object], *args: object) -> None:
        self._jobs.append((fn, args))
        if not self._queued:
            self._queued = True
            loop.call_soon(self._run)

    def _run(self) -> None:
        jobs = self._jobs
        turn = Turn()
        try:
            while jobs:
                fn, args = jobs.popleft()
                fn(*args)
                if jobs and turn.over():
                    break
        finally:  # a job that raised (the loop logs it) leaves the rest queued, not stuck
            if jobs:
                asyncio.get_running_loop().call_soon(self._run)
            else:
                self._queued = False


_soon: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Soon] = weakref.WeakKeyDictionary()


def soon(fn: Callable[..., object], *args: object, loop: asyncio.AbstractEventLoop | None = None) -> None:
    """Run ``fn(*args)`` right after the current callback, with the loop's other such work
    (:class:`Soon`); ``loop``: the one to run it on (default: the running loop). With no loop
    (tests, ``explain``), now."""
    if loop is None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            fn(*args)
            return
    runner = _soon.get(loop)
    if runner is None:
        runner = _soon[loop] = Soon()
    runner.call(loop, fn, *args)


# Seconds work may wait for the loop's quiet moment (:func:`when_quiet`) before it runs anyway.
LAG = 0.1


class Quiet:
    """Work that waits out a burst of hooks: it runs when the loop's selector is about to sleep
    (:meth:`moment`, the selector's ``idle``: no request came within the burst poll after the
    last answer), or ``lag`` seconds after the first of it was queued if that moment does not
    come, whichever is first. Either way it goes to :func:`soon`, so it runs a turn at a time
    with hooks answered in between.

    Why: in a burst the runtime sends the next request within its own turnaround of the last
    answer, and on a small node the agent's bookkeeping then competes with the runtime for
    the CPU it needs to send it. Work whose result nothing needs until a later event (the
    take-in of a container that was created but has not started) is done once the burst
    is over; whatever needs it sooner does it itself."""

    __slots__ = ("_jobs", "_timer", "lag", "loop")

    def __init__(self, lag: float | None = None) -> None:
        self._jobs: collections.deque[tuple[Callable[..., object], tuple[object, ...]]] = collections.deque()
        self._timer: asyncio.TimerHandle | None = None
        self.lag = LAG if lag is None else lag
        self.loop: asyncio.AbstractEventLoop | None = None  # the loop whose quiet moments these are

    def call(self, loop: asyncio.AbstractEventLoop, fn: Callable[..., object], *args: object) -> None:
        self._jobs.append((fn, args))
        if self._timer is None:
            self._timer = loop.call_later(self.lag, self._release)

    def moment(self) -> bool:
        """The loop is about to sleep: the waiting work is queued to run now. True if there was
        any (the loop must then not sleep). The first call binds this to the running loop:
        from then on :func:`when_quiet` on that loop waits for these moments."""
        if self.loop is None:
            self.loop = asyncio.get_running_loop()
            _quiet[self.loop] = self
        return self._release()

    def _release(self) -> bool:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        jobs = self._jobs
        if not jobs:
            return False
        while jobs:
            fn, args = jobs.popleft()
            soon(fn, *args, loop=self.loop)
        return True


_quiet: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Quiet] = weakref.WeakKeyDictionary()


def when_quiet(fn: Callable[..., object], *args: object) -> None:
    """Run ``fn(*args)`` when the running loop is next quiet (:class:`Quiet`); on a loop
    without quiet moments, right after the current callback (:func:`soon`); with no loop, now."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        fn(*args)
        return
    runner = _quiet.get(loop)
    if runner is None:
        soon(fn, *args, loop=loop)
    else:
        runner.call(loop, fn, *args)
