"""The cyclic garbage collector runs when the event loop is idle, not in a hook.

CPython collects its youngest generation after every 700 net allocations of tracked objects
(its default threshold), wherever the program is. In a burst of hooks that puts a collection
in a few answers of every hundred, longer when the middle generation goes too: the hook
path's tail is those pauses. :class:`IdleCollector` raises the automatic threshold to a backstop and
collects, generation by generation as CPython would, when the loop is about to sleep (the
selector's idle moment, :class:`nriplugin.pacing.selector.PollClock`). A loop that never
idles still collects at the backstop, so memory stays bounded.
"""

from __future__ import annotations

import gc

BACKSTOP = 100  # the automatic youngest-generation threshold, as a multiple of the usual one


class IdleCollector:
    """Collects at idle what CPython's own thresholds would have collected by now."""

    def __init__(self, backstop: int = BACKSTOP) -> None:
        self.thresholds = gc.get_threshold()  # CPython's thresholds: what "due" means here
        self.backstop = backstop
        self.collections = 0  # collections run at idle

    def install(self) -> None:
        """Raise the automatic threshold of the youngest generation to the backstop."""
        t0, t1, t2 = self.thresholds
        gc.set_threshold(t0 * self.backstop, t1, t2)

    def uninstall(self) -> None:
        gc.set_threshold(*self.thresholds)

    def due(self) -> int | None:
        """The oldest generation whose count is over CPython's threshold (None: nothing due)."""
        counts = gc.get_count()
        if counts[0] <= self.thresholds[0]:
            return None
        gen = 0
        for g in (1, 2):
            if counts[g] > self.thresholds[g]:
                gen = g
        return gen

    def idle(self) -> bool:
        """The loop is about to sleep: run the collection that is due; True if one ran."""
        gen = self.due()
        if gen is None or not gc.isenabled():
            return False
        gc.collect(gen)
        self.collections += 1
        return True
