"""The hooks' traffic, as the work sharing their loop needs to know it.

The transport tells a :class:`HookTraffic` when a trunk opens and closes and when it answers
a request; long work asks it whether a request is waiting (end the turn now) and when the
last answer went out (is the burst of hooks over). The agent creates one and hands it to both,
so who shares what is in the constructor calls, not in a module's globals.
"""

from __future__ import annotations

import select
import time

from nriplugin.pacing.selector import PollClock

_READY = select.POLLIN | select.POLLHUP | select.POLLERR


class HookTraffic:
    """The trunks' sockets, their last answer, and the loop's clock of arrivals.

    ``clock``: the loop's selector (when a request's bytes could first have been read, and
    told of every answer so that it stays awake through a burst); without one, a request's
    time starts when it is handled."""

    __slots__ = ("_fds", "_trunks", "arrival", "clock", "last_answer")

    def __init__(self, clock: PollClock | None = None) -> None:
        self.clock = clock
        self.arrival = time.perf_counter if clock is None else clock.arrival
        self._trunks = select.poll()
        self._fds: set[int] = set()
        self.last_answer = 0.0  # perf_counter time of the last answer on any trunk (0: never)

    def opened(self, fd: int) -> None:
        """A trunk connected on socket ``fd``."""
        if fd not in self._fds:
            self._fds.add(fd)
            self._trunks.register(fd, select.POLLIN)

    def closed(self, fd: int) -> None:
        """A trunk's socket closes (told before asyncio closes it: its number may be reused)."""
        if fd in self._fds:
            self._fds.discard(fd)
            self._trunks.unregister(fd)

    def answered(self, at: float) -> None:
        """A trunk answered a request at ``at`` (perf_counter time)."""
        self.last_answer = at
        if self.clock is not None:
            self.clock.answered()

    def waiting(self) -> bool:
        """Whether a runtime's bytes are waiting on a trunk (a hook request, most likely): a job
        that shares the loop with the hooks ends its turn early then. One poll(2) of the trunks
        alone: the loop's own selector would also report the inotify events the agent's own
        cgroup writes raise."""
        if not self._fds:
            return False
        return any(ev & _READY for _, ev in self._trunks.poll(0))
