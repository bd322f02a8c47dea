"""The 5-minute trends of the pressure scores, kept incrementally: a round adds one sample and
drops the expired ones in O(1), instead of walking five minutes of samples (300 at 1 s) for
each trend every round, which cost more than the rest of a round's decisions together.

:class:`WindowSlope` is the least-squares slope over a sliding time window (running sums,
re-based on the oldest point now and then so the sums keep their precision over days);
:class:`Ewma` averages the way the kernel averages load1. :class:`Trends` holds the series the
scores need. Values are stored raw (cores, bytes) and scaled when read, so a change in the
node's CPU count or memory size applies to the whole window, as it would to a recomputation.
"""

from __future__ import annotations

import math
from collections import deque

from nriplugin.qos.sample import LS_CLASSES, NodeSample

TREND_WINDOW = 300.0  # seconds: five minutes, long enough for a trend, short enough to follow it
LOAD_TIME = 60.0  # seconds: load1's time constant

Point = tuple[float, float]


class WindowSlope:
    """Least-squares slope of (t, value) points over the last ``window`` seconds (relative to
    the newest point). Non-finite values are left out."""

    __slots__ = ("_n", "_origin", "_pts", "_st", "_stt", "_stv", "_sv", "window")

    def __init__(self, window: float = TREND_WINDOW) -> None:
        self.window = window
        self._pts: deque[Point] = deque()
        self._origin = 0.0
        self._n = 0
        self._st = self._sv = self._stt = self._stv = 0.0

    def __len__(self) -> int:
        return self._n

    def add(self, t: float, v: float) -> None:
        if not math.isfinite(v):
            self._expire(t)
            return
        if not self._pts:
            self._origin = t
        elif t - self._origin > 4 * self.window:
            self._rebase()
        self._pts.append((t, v))
        self._sum(t, v, 1.0)
        self._expire(t)

    def per_minute(self) -> float:
        """The slope per minute; 0 with fewer than two points or no spread in time."""
        n = self._n
        if n < 2:
            return 0.0
        sxx = self._stt - self._st * self._st / n
        # the spread of equal times is 0 up to rounding: no slope rather than noise over ~0
        if sxx <= 1e-9 * max(1.0, self._stt):
            return 0.0
        return 60.0 * (self._stv - self._st * self._sv / n) / sxx

    def _sum(self, t: float, v: float, sign: float) -> None:
        x = t - self._origin
        self._n += int(sign)
        self._st += sign * x
        self._sv += sign * v
        self._stt += sign * x * x
        self._stv += sign * x * v

    def _expire(self, t_end: float) -> None:
        pts = self._pts
        while pts and pts[0][0] < t_end - self.window:
            t, v = pts.popleft()
            self._sum(t, v, -1.0)
        if not pts:
            self._n = 0
            self._st = self._sv = self._stt = self._stv = 0.0

    def _rebase(self) -> None:
        """Recompute the sums from the points kept, about the oldest one."""
        self._origin = self._pts[0][0] if self._pts else 0.0
        self._n = 0
        self._st = self._sv = self._stt = self._stv = 0.0
        for t, v in self._pts:
            self._sum(t, v, 1.0)


class Ewma:
    """The exponentially weighted average at the newest point: each step weighs the old
    average by exp(-dt/τ), as the kernel's load average does. 0 before the first point."""

    __slots__ = ("_t", "time_constant", "value")

    def __init__(self, time_constant: float = LOAD_TIME) -> None:
        self.time_constant = time_constant
        self.value = 0.0
        self._t: float | None = None

    def add(self, t: float, v: float) -> None:
        if self._t is None:
            self.value, self._t = v, t
            return
        tc = self.time_constant
        a = math.exp(-max(0.0, t - self._t) / tc) if tc > 0 else 0.0
        self.value = self.value * a + v * (1.0 - a)
        self._t = t


def ls_rss(sample: NodeSample) -> int:
    return sum(sample.usage(q).rss_bytes for q in LS_CLASSES)


class Trends:
    """The series the pressure scores take trends of, one :meth:`add` per round."""

    __slots__ = ("be_cores", "be_load", "node_cores", "rss")

    def __init__(self, window: float = TREND_WINDOW) -> None:
        self.node_cores = WindowSlope(window)  # node CPU busy
        self.be_cores = WindowSlope(window)  # BE's usage (left out of the score)
        self.be_load = Ewma(LOAD_TIME)  # BE's usage averaged like load1
        self.rss = WindowSlope(window)  # the RSS of LSE + LSR + LS

    def add(self, s: NodeSample) -> None:
        """One round. The first one has no CPU figures (no interval to take a rate over): its
        zeros would fake a rising trend, so only its memory counts. LS RSS is the collector's
        held figure where there is one, so an LS pod starting is not LS memory growing."""
        if s.interval > 0:
            be = s.usage("BE").cpu_cores
            self.node_cores.add(s.t, s.cpu_busy_cores)
            self.be_cores.add(s.t, be)
            self.be_load.add(s.t, be)
        self.rss.add(s.t, float(ls_rss(s)) if s.ls_rss_held is None else s.ls_rss_held)
