"""BE containers being born: from the runtime's CreateContainer to its StartContainer, which is
when the runtime's ``runc create`` runs.

runc's systemd driver on cgroup v1 freezes a new container's cgroup while it sets the unit's
properties, and gives up ("unable to freeze", a StartError the kubelet does not retry for a
Job's pod) when the tasks cannot run to reach the freezer: a BE group whose CFS quota is spent
for the period cannot. While a BE container is being born, BE's suppression lifts its quota
(``qos/cpu_suppress.py``); its tasks keep SCHED_IDLE meanwhile. A birth that never reaches
StartContainer (the runtime failed it) ends after ``longest`` seconds, so a failed start cannot
hold the lift.

The hooks say when a birth begins and ends (a dict entry, O(1)); what lifts and restores is a
listener told only when the first birth begins and the last one ends.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

LONGEST = 3.0  # seconds a birth may hold the lift without reaching StartContainer
MOST = 4096  # births followed at once: beyond it the oldest ends (a runtime that never starts them)


class Births:
    def __init__(self, longest: float = LONGEST, clock: Callable[[], float] = time.monotonic) -> None:
        self.longest = longest
        self.clock = clock
        self._since: OrderedDict[str, float] = OrderedDict()  # container id -> when its birth began
        self._listeners: list[Callable[[bool], None]] = []
        self.windows = 0  # times the first birth began (the lift's windows)
        self.expired = 0  # births ended by ``longest`` rather than by StartContainer or removal
        self._opened: float | None = None
        self._open_seconds = 0.0

    def subscribe(self, fn: Callable[[bool], None]) -> None:
        """``fn(True)`` when a first birth begins, ``fn(False)`` when the last one ends."""
        self._listeners.append(fn)

    @property
    def open(self) -> bool:
        return bool(self._since)

    def open_seconds(self) -> float:
        """How long births were in flight, in all, up to now."""
        now = self.clock()
        return self._open_seconds + (now - self._opened if self._opened is not None else 0.0)

    def begin(self, cid: str) -> None:
        now = self.clock()
        self._expire(now)
        was = bool(self._since)
        self._since[cid] = now
        self._since.move_to_end(cid)
        if len(self._since) > MOST:
            self._since.popitem(last=False)
        if not was:
            self.windows += 1
            self._opened = now
            self._tell(True)

    def end(self, cid: str) -> None:
        if self._since.pop(cid, None) is not None and not self._since:
            self._closed(self.clock())

    def expire(self) -> None:
        """End births older than ``longest`` (called between the QoS manager's rounds)."""
        if self._since:
            self._expire(self.clock())

    def _expire(self, now: float) -> None:
        since = self._since
        if not since:
            return
        while since and now - next(iter(since.values())) > self.longest:
            since.popitem(last=False)
            self.expired += 1
        if not since:
            self._closed(now)

    def _closed(self, now: float) -> None:
        if self._opened is not None:
            self._open_seconds += now - self._opened
            self._opened = None
        self._tell(False)

    def _tell(self, is_open: bool) -> None:
        for fn in self._listeners:
            fn(is_open)
