"""The scheduler's tick: the instants at which the kernel's CPU counters are current.

A task that runs without a break is charged its CPU time (``cpuacct.usage``, ``cpu.stat``
``usage_usec``, /proc/stat) at each tick of the CPU it runs on, or when it is switched out. A
counter read between two ticks lags the truth by up to a tick per CPU running such a task, so a
rate over a short interval between two arbitrary reads is off by up to a tick at each end: at
HZ 250, ±0.13 cores over 30 ms, which the fast path would read as LS's load changing. Every CPU
ticks at the same instants (unless booted with ``skew_tick``), so counters read just after a tick
are current to that tick on every other CPU, and a rate over the interval between two such ticks
has no lag at either end. The reading CPU's own task was charged when the reader woke (it was
switched out), so what is left is the reader's lateness past the tick, well under a tick.

CLOCK_MONOTONIC_COARSE moves once a tick: its resolution is the tick's period, and the instant it
moves is a tick, found once by watching it (the phase holds since boot). A move is taken only
when it is seen within BRACKET_NS of the read before it: a watcher preempted between two reads
(a busy node) would see it late, and is given the next tick instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

COARSE = 6  # CLOCK_MONOTONIC_COARSE on Linux (the time module does not name it)
AFTER_NS = 200_000  # a sample this long after a tick: every CPU's tick handler has charged its task
PERIOD_NS = (100_000, 20_000_000)  # the periods taken for a tick (HZ 10000 to 50); others: no tick
WATCH_TICKS = 10  # how long the probe watches for a move it sees in time, in periods
BRACKET_NS = 20_000  # a move seen no later than this after the read before it is a tick's instant

Clock = Callable[[], int]  # ns


def _coarse() -> int:
    return time.clock_gettime_ns(COARSE)


@dataclass(frozen=True, slots=True)
class Tick:
    """The tick's period and its phase on the monotonic clock (ns)."""

    period_ns: int
    phase_ns: int

    @classmethod
    def probe(
        cls, clock: Clock = time.monotonic_ns, coarse: Clock = _coarse, resolution: float | None = None
    ) -> Tick | None:
        """The tick, watched on the coarse clock (None: no coarse clock, a resolution that is
        no tick's, or a clock that did not move while watched)."""
        try:
            res = time.clock_getres(COARSE) if resolution is None else resolution
            period = round(res * 1e9)
            if not PERIOD_NS[0] <= period <= PERIOD_NS[1]:
                return None
            start = coarse()
            before = clock()
            deadline = before + WATCH_TICKS * period
            while True:
                c = coarse()
                t = clock()
                if c != start:
                    if t - before <= BRACKET_NS:
                        return cls(period, t % period)
                    start = c  # seen late (the watcher was preempted): the next move
                if t > deadline:
                    return None
                before = t
        except OSError:
            return None

    def last(self, t: float) -> float:
        """The last tick at or before ``t`` (monotonic seconds)."""
        return self._last(round(t * 1e9)) / 1e9

    def _last(self, ns: int) -> int:
        return ns - (ns - self.phase_ns) % self.period_ns

    def wake(self, now: float, since: float, wait: float) -> float:
        """Seconds from ``now`` until the sample ``wait`` after the one at tick ``since``: just
        past the last tick within ``wait`` of it, or past the next tick if that one is gone."""
        target = self._last(round(since * 1e9) + round(wait * 1e9))
        now_ns = round(now * 1e9)
        if target + AFTER_NS <= now_ns:
            target = self._last(now_ns) + self.period_ns
        return (target + AFTER_NS - now_ns) / 1e9
