"""Bounded history for the QoS manager: fixed-size ring buffers of (t, value) for the trends
(5 minutes of node CPU, LS RSS), and per-key counter readings for deltas, kept only for keys
the node model still has. Memory is allocated up front or bounded by the model: it does not
grow with uptime or container churn.
"""

from __future__ import annotations

import operator
from array import array
from collections.abc import Container, Iterator


class Series:
    """A ring buffer of ``capacity`` points, preallocated (two ``array('d')``).

    Points kept are at least ``min_interval`` apart: a point that comes sooner replaces the
    newest one's value and time (the latest is always current), so ``capacity * min_interval``
    seconds are covered however often the manager samples (PSI wake-ups add rounds)."""

    __slots__ = ("_anchor", "_head", "_n", "_t", "_v", "capacity", "min_interval")

    def __init__(self, capacity: int, min_interval: float = 0.0) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.min_interval = min_interval
        self._t = array("d", bytes(8 * capacity))
        self._v = array("d", bytes(8 * capacity))
        self._n = 0
        self._head = 0  # where the next point goes
        self._anchor = 0.0  # when the newest slot was started (min_interval counts from here)

    def __len__(self) -> int:
        return self._n

    def append(self, t: float, value: float) -> None:
        if self._n and t - self._anchor < self.min_interval:
            last = (self._head - 1) % self.capacity
            self._t[last], self._v[last] = t, value
            return
        self._t[self._head], self._v[self._head] = t, value
        self._head = (self._head + 1) % self.capacity
        self._n = min(self._n + 1, self.capacity)
        self._anchor = t

    def latest(self) -> tuple[float, float] | None:
        if not self._n:
            return None
        last = (self._head - 1) % self.capacity
        return self._t[last], self._v[last]

    def points(self, since: float | None = None) -> list[tuple[float, float]]:
        """Oldest first; only those at or after ``since`` when given."""
        out = list(self._iter())
        if since is not None:
            out = [p for p in out if p[0] >= since]
        return out

    def _iter(self) -> Iterator[tuple[float, float]]:
        start = (self._head - self._n) % self.capacity
        for i in range(self._n):
            j = (start + i) % self.capacity
            yield self._t[j], self._v[j]

    def clear(self) -> None:
        self._n = self._head = 0


class Counters:
    """The last reading of cumulative counters per key (a container's CPU time, throttled
    periods), to turn them into increases over the interval.

    :meth:`advance` answers None for a key's first reading, and also when a counter went
    backwards (a recreated cgroup): no delta can be trusted then, the reading is the new base.
    :meth:`retain` drops every key the caller no longer has, so memory follows the node model."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, tuple[int, ...]]] = {}

    def __len__(self) -> int:
        return len(self._last)

    def __contains__(self, key: object) -> bool:
        return key in self._last

    def advance(self, key: str, t: float, values: tuple[int, ...]) -> tuple[float, tuple[int, ...]] | None:
        """Record ``values`` at ``t``; return (seconds, increases) since the previous reading."""
        prev = self._last.get(key)
        self._last[key] = (t, values)
        if prev is None or len(prev[1]) != len(values):
            return None
        pt, pv = prev
        deltas = tuple(map(operator.sub, values, pv))
        if t <= pt or min(deltas, default=0) < 0:
            return None
        return t - pt, deltas

    def retain(self, keys: Container[str]) -> int:
        """Forget every key not in ``keys``; returns how many were forgotten."""
        gone = [k for k in self._last if k not in keys]
        for k in gone:
            del self._last[k]
        return len(gone)
