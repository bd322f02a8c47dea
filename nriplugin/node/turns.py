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

from nriplugin.nri.transport import hook_waiting, last_answer

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


# Seconds without a hook answered after which a burst of hooks is over (the runtime sends the
# next request of a burst within its own turnaround, some 100 us; hooks through CRI come
# milliseconds apart).
SETTLE = 0.001

# Seconds work waits for a burst to end before it runs anyway.
LAG = 1.0

# While a burst goes on, the check for its end backs off, doubling up to this many settle times:
# a burst of any length costs a few dozen checks a second, not one per settle time (in a
# 3000-hook burst on the benchmark's 2-core machine the per-settle checks were the loop's
# largest other work, ~720 of ~14 µs each), and its work runs at most this long after it ends.
BACKOFF = 16


class Quiet:
    """Work that waits out a burst of hooks: it runs once no hook was answered for ``settle``
    seconds (:func:`~nriplugin.nri.transport.last_answer`), or ``lag`` seconds after the first
    of it was queued if the burst goes on that long; then through :func:`soon`. A job that
    does its work in turns queues its next turn here again: it runs at once while no hook
    was answered since the release, and waits again when one was (a burst that resumed). One
    timer while work waits, none per hook: due a ``settle`` after the last answer, and as the
    burst goes on at doubling intervals up to :data:`BACKOFF` settle times.

    Why: in a burst the runtime sends the next request within its turnaround of the last
    answer, and on a small node work done meanwhile takes CPU the runtime needs to send it,
    or holds the loop when it comes. Work whose result nothing needs before a later event (the
    take-in of containers created, not started) is done once the burst is over; whatever
    needs it sooner does it itself. Installed on the agent's loop (:func:`install_quiet`);
    elsewhere :func:`when_quiet` is :func:`soon`."""

    __slots__ = ("_jobs", "_released", "_since", "_timer", "_wait", "lag", "loop", "settle")

    def __init__(self, loop: asyncio.AbstractEventLoop, settle: float | None = None, lag: float | None = None) -> None:
        self._jobs: collections.deque[tuple[Callable[..., object], tuple[object, ...]]] = collections.deque()
        self._timer: asyncio.TimerHandle | None = None
        self._since = 0.0  # when the first waiting job was queued
        self._released = 0.0  # when the waiting work was last released
        self.loop = loop
        self.settle = SETTLE if settle is None else settle
        self.lag = LAG if lag is None else lag
        self._wait = self.settle  # the next check's distance while the burst goes on

    def call(self, fn: Callable[..., object], *args: object) -> None:
        if self._timer is None and last_answer() < self._released:  # still quiet since the release
            soon(fn, *args, loop=self.loop)
            return
        self._jobs.append((fn, args))
        if self._timer is None:
            self._since = time.perf_counter()
            self._timer = self.loop.call_later(self.settle, self._check)

    @property
    def waiting(self) -> int:
        return len(self._jobs)

    def _check(self) -> None:
        now = time.perf_counter()
        quiet_for = now - last_answer()
        if quiet_for < self.settle and now - self._since < self.lag:  # the burst goes on
            self._wait = min(2 * self._wait, BACKOFF * self.settle)
            delay = min(max(self.settle - quiet_for, self._wait), self._since + self.lag - now)
            self._timer = self.loop.call_later(delay, self._check)
            return
        self.release()

    def release(self) -> None:
        """Run the waiting work now (through :func:`soon`)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._wait = self.settle
        self._released = time.perf_counter()
        jobs = self._jobs
        while jobs:
            fn, args = jobs.popleft()
            soon(fn, *args, loop=self.loop)


_quiet: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Quiet] = weakref.WeakKeyDictionary()


def install_quiet(loop: asyncio.AbstractEventLoop, settle: float | None = None, lag: float | None = None) -> Quiet:
    """Work queued with :func:`when_quiet` on ``loop`` waits out bursts of hooks from now on."""
    q = _quiet[loop] = Quiet(loop, settle, lag)
    return q


def when_quiet(fn: Callable[..., object], *args: object) -> None:
    """Run ``fn(*args)`` once the running loop's burst of hooks is over (:class:`Quiet`); on a
    loop without :func:`install_quiet`, right after the current callback (:func:`soon`); with
    no loop, now."""
    try:
        runner = _quiet.get(asyncio.get_running_loop())
    except RuntimeError:
        runner = None
    if runner is None:
        soon(fn, *args)
    else:
        runner.call(fn, *args)
