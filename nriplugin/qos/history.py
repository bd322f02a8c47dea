"""Per-key counter readings for the QoS manager's deltas, kept only for keys the node model
still has: memory is bounded by the model and does not grow with uptime or container churn.
(The 5-minute trends are kept incrementally in ``trends.py``.)
"""

from __future__ import annotations

import operator
from collections.abc import Container


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
