"""Long work on the event loop, in turns, and work that waits for the hooks.

The loop that answers NRI hooks also runs the reconciler's passes, the QoS manager's rounds and
the inventory. A job whose size follows the node (a pass over every managed cgroup, a round
that reads every container) gives the loop back whenever it has held it for ``TURN`` seconds,
or sooner when a hook request is waiting on a trunk (it looks every ``LOOK`` seconds), so a
hook that arrives meanwhile waits for about one item, whatever the node's size.
Turns are measured in time, not in items: a slow item (a cgroup read that stalls) shortens its
turn instead of stretching it.

The agent creates one :class:`Pacer` on its loop and hands it to everything that does such
work; code with no loop (``explain``, tests) uses ``Pacer()``, which runs every job when given.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable

from nriplugin.pacing.traffic import HookTraffic

# Seconds a job may hold the loop before it lets a waiting hook in: short enough that a hook
# arriving mid-job waits for little, long enough that the turns' own cost (one loop iteration
# each) stays small next to the work (docs/hook-path.md).
TURN = 0.00025


# Seconds between two looks for a waiting hook request within a turn. A look is one poll(2)
# of the trunks; a request that arrives mid-turn waits for the item in progress and at most
# this long, not for the rest of the turn.
LOOK = 10e-6

# Seconds without a hook answered after which a burst of hooks is over: the runtime sends the
# next request of a burst within its own turnaround, well under this; hooks through CRI come
# further apart.
SETTLE = 0.001

# Seconds work waits for a burst to end before it runs anyway.
LAG = 1.0

# While a burst goes on, the check for its end backs off, doubling up to this many settle times:
# a burst of any length costs a few dozen checks a second, not one per settle time (checks per
# settle time were the loop's largest other work in a long burst), and its work runs at most
# this long after it ends.
BACKOFF = 16

Job = tuple[Callable[..., object], tuple[object, ...]]


class Turn:
    """One job's clock: ``over()`` says when to give the loop back — its turn is used up, or
    a hook request is waiting (``waiting``); ``restart()`` when the job has it again."""

    __slots__ = ("budget", "looked", "started", "waiting")

    def __init__(self, waiting: Callable[[], bool], budget: float | None = None) -> None:
        self.waiting = waiting
        self.budget = TURN if budget is None else budget
        self.started = self.looked = time.perf_counter()

    def over(self) -> bool:
        now = time.perf_counter()
        if now - self.started >= self.budget:
            return True
        if now - self.looked < LOOK:
            return False
        self.looked = now
        return self.waiting()

    def restart(self) -> None:
        self.started = self.looked = time.perf_counter()


async def give_way(waiting: Callable[[], bool]) -> None:
    """Give the loop back between two turns of a job, so that a hook request the next poll
    finds runs before the job goes on. asyncio runs the callbacks queued before a poll ahead
    of the I/O that poll finds, and a yield queues the job's next step before the poll; so
    when that step finds a request ``waiting`` (read by a callback now queued behind it), it
    yields once more, behind the request. With no request waiting the job goes on at once:
    the order costs a loop iteration only when a hook needs it. (The public way to the order
    a hook needs: the loop is asyncio's own.)"""
    await asyncio.sleep(0)
    if waiting():
        await asyncio.sleep(0)


def next_turn(
    loop: asyncio.AbstractEventLoop, waiting: Callable[[], bool], fn: Callable[..., object], *args: object
) -> None:
    """Run ``fn(*args)`` in a later callback, behind a hook request the next poll finds: the
    callback form of :func:`give_way`."""
    loop.call_soon(_behind_hooks, loop, waiting, fn, args)


def _behind_hooks(
    loop: asyncio.AbstractEventLoop, waiting: Callable[[], bool], fn: Callable[..., object], args: tuple[object, ...]
) -> None:
    if waiting():  # its reader is queued behind this callback: go behind it
        loop.call_soon(fn, *args)
    else:
        fn(*args)


class AfterCallback:
    """Work for right after the current callback (a hook's answer goes first), run in one loop
    callback for as long as its turn lasts: a hook's take-in and the reconciler's news that it
    causes then cost one pass of the loop (a poll of every socket), not one each. Jobs run in
    the order given; a used-up turn or a waiting hook request ends the callback, and the rest
    runs in a later one, after that request."""

    __slots__ = ("_jobs", "_queued", "loop", "turn", "waiting")

    def __init__(self, loop: asyncio.AbstractEventLoop, turn: Callable[[], Turn], waiting: Callable[[], bool]) -> None:
        self.loop = loop
        self.turn = turn
        self.waiting = waiting
        self._jobs: collections.deque[Job] = collections.deque()
        self._queued = False  # a callback is on the loop, or running

    def call(self, fn: Callable[..., object], *args: object) -> None:
        self._jobs.append((fn, args))
        if not self._queued:
            self._queued = True
            self.loop.call_soon(self._run)

    def _run(self) -> None:
        jobs = self._jobs
        turn = self.turn()
        try:
            while jobs:
                fn, args = jobs.popleft()
                fn(*args)
                if jobs and turn.over():
                    break
        finally:  # a job that raised (the loop logs it) leaves the rest queued, not stuck
            if jobs:
                next_turn(self.loop, self.waiting, self._run)
            else:
                self._queued = False


class BurstWait:
    """Work that waits out a burst of hooks: it runs once no hook was answered for ``settle``
    seconds (:attr:`HookTraffic.last_answer`), or ``lag`` seconds after the first of it was
    queued if the burst goes on that long; then through ``then`` (right after the current
    callback). A job that does its work in turns queues its next turn here again: it runs at
    once while no hook was answered since the release, and waits again when one was (a burst
    that resumed). One timer while work waits, none per hook: due a ``settle`` after the last
    answer, and as the burst goes on at doubling intervals up to :data:`BACKOFF` settle times.

    Why: in a burst the runtime sends the next request within its turnaround of the last
    answer, and on a small node work done meanwhile takes CPU the runtime needs to send it,
    or holds the loop when it comes. Work whose result nothing needs before a later event (the
    take-in of containers created, not started) is done once the burst is over; whatever
    needs it sooner does it itself."""

    __slots__ = ("_jobs", "_released", "_since", "_timer", "_wait", "lag", "loop", "settle", "then", "traffic")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        traffic: HookTraffic,
        then: AfterCallback,
        settle: float = SETTLE,
        lag: float = LAG,
    ) -> None:
        self._jobs: collections.deque[Job] = collections.deque()
        self._timer: asyncio.TimerHandle | None = None
        self._since = 0.0  # when the first waiting job was queued
        self._released = 0.0  # when the waiting work was last released
        self.loop = loop
        self.traffic = traffic
        self.then = then
        self.settle = settle
        self.lag = lag
        self._wait = settle  # the next check's distance while the burst goes on

    def call(self, fn: Callable[..., object], *args: object) -> None:
        if self._timer is None and self.traffic.last_answer < self._released:  # still quiet since the release
            self.then.call(fn, *args)
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
        quiet_for = now - self.traffic.last_answer
        if quiet_for < self.settle and now - self._since < self.lag:  # the burst goes on
            self._wait = min(2 * self._wait, BACKOFF * self.settle)
            delay = min(max(self.settle - quiet_for, self._wait), self._since + self.lag - now)
            self._timer = self.loop.call_later(delay, self._check)
            return
        self.release()

    def release(self) -> None:
        """Run the waiting work now (right after the current callback)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._wait = self.settle
        self._released = time.perf_counter()
        jobs = self._jobs
        while jobs:
            fn, args = jobs.popleft()
            self.then.call(fn, *args)


class Pacer:
    """How long work shares one event loop with the hooks: the agent creates one and hands it
    to the hook adapter, the reconciler, the QoS manager, the inventory and network QoS.

    ``loop``: the loop they share (None: no loop, every job runs when given: ``explain``,
    tests); ``traffic``: what the transport tells of the hooks (a turn ends early when a
    request waits); ``wait_out_bursts``: :meth:`when_quiet` work waits until a burst of hooks
    is over (:class:`BurstWait`, with ``settle`` and ``lag``), else it runs right after the
    current callback; ``turn``: a turn's length in seconds (default :data:`TURN`)."""

    __slots__ = ("_after", "_bursts", "loop", "traffic", "turn_seconds")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop | None = None,
        traffic: HookTraffic | None = None,
        *,
        wait_out_bursts: bool = False,
        settle: float = SETTLE,
        lag: float = LAG,
        turn: float | None = None,
    ) -> None:
        self.loop = loop
        self.traffic = HookTraffic() if traffic is None else traffic
        self.turn_seconds = turn
        self._after = None if loop is None else AfterCallback(loop, self.turn, self.traffic.waiting)
        self._bursts = (
            BurstWait(loop, self.traffic, self._after, settle, lag)
            if wait_out_bursts and loop is not None and self._after is not None
            else None
        )

    def turn(self) -> Turn:
        """A job's clock, started now."""
        return Turn(self.traffic.waiting, self.turn_seconds)

    async def give_way(self) -> None:
        """Give the loop back between two turns of a job: a waiting hook goes first
        (:func:`give_way`)."""
        await give_way(self.traffic.waiting)

    def soon(self, fn: Callable[..., object], *args: object) -> None:
        """Run ``fn(*args)`` right after the current callback, with the loop's other such work
        (:class:`AfterCallback`); with no loop, now."""
        if self._after is None:
            fn(*args)
        else:
            self._after.call(fn, *args)

    def next_turn(self, fn: Callable[..., object], *args: object) -> None:
        """Run ``fn(*args)`` in a later callback (a job's next turn), behind a hook request the
        next poll finds (:func:`next_turn`); with no loop, now."""
        if self.loop is None:
            fn(*args)
        else:
            next_turn(self.loop, self.traffic.waiting, fn, *args)

    def when_quiet(self, fn: Callable[..., object], *args: object) -> None:
        """Run ``fn(*args)`` once the burst of hooks is over (:class:`BurstWait`); without
        ``wait_out_bursts``, right after the current callback; with no loop, now."""
        if self._bursts is None:
            self.soon(fn, *args)
        else:
            self._bursts.call(fn, *args)

    @property
    def bursts(self) -> BurstWait | None:
        """The work waiting out a burst of hooks (None: none waits)."""
        return self._bursts
