"""PSI triggers: the kernel wakes us when tasks stalled on a resource for more than a threshold
within a window (``some 50000 500000`` in ``/proc/pressure/cpu`` or a cgroup v2 group's
``cpu.pressure``), instead of our polling for it. The wake-up comes as POLLPRI, which asyncio's
reader callbacks (EPOLLIN) never see, so each trigger has an epoll of its own whose fd the
event loop watches.

Kernels may refuse a trigger (this project's test machines answer EINVAL to any trigger on
``/proc/pressure/*``): :func:`open_trigger` then returns None and why, and the QoS manager's
30 ms fast path carries the reaction alone.
"""

from __future__ import annotations

import asyncio
import errno
import os
import select
from collections.abc import Callable
from dataclasses import dataclass

MIN_WINDOW_US, MAX_WINDOW_US = 500_000, 10_000_000  # the kernel's bounds for a trigger's window


def trigger_line(kind: str, stall_us: int, window_us: int) -> str:
    """The text that arms a trigger; the kernel's own bounds are checked here first."""
    if kind not in ("some", "full"):
        raise ValueError(f"trigger kind must be some or full, got {kind!r}")
    if not MIN_WINDOW_US <= window_us <= MAX_WINDOW_US:
        raise ValueError(f"window {window_us} us outside [{MIN_WINDOW_US}, {MAX_WINDOW_US}]")
    if not 0 < stall_us <= window_us:
        raise ValueError(f"stall {stall_us} us must be within (0, window {window_us}]")
    return f"{kind} {stall_us} {window_us}"


@dataclass
class Trigger:
    path: str
    fd: int
    epoll: select.epoll
    loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop, on_fire: Callable[[], None]) -> None:
        def ready() -> None:
            self.epoll.poll(0)  # drain: the trigger stays armed
            on_fire()

        self.loop = loop
        loop.add_reader(self.epoll.fileno(), ready)

    def close(self) -> None:
        if self.loop is not None:
            self.loop.remove_reader(self.epoll.fileno())
            self.loop = None
        self.epoll.close()
        os.close(self.fd)


def open_trigger(path: str, stall_us: int = 50_000, window_us: int = 500_000) -> tuple[Trigger | None, str]:
    """Arm a trigger on a pressure file; (None, why) when the kernel or the file refuses."""
    line = trigger_line("some", stall_us, window_us)
    try:
        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError as exc:
        return None, f"{path}: {exc.strerror}"
    try:
        os.write(fd, line.encode() + b"\0")
    except OSError as exc:
        os.close(fd)
        why = "this kernel does not accept PSI triggers" if exc.errno == errno.EINVAL else exc.strerror
        return None, f"{path}: {why} ({errno.errorcode.get(exc.errno or 0, exc.errno)})"
    ep = select.epoll()
    try:
        ep.register(fd, select.EPOLLPRI)
    except OSError as exc:  # not a pollable pressure file (a regular file, say)
        ep.close()
        os.close(fd)
        return None, f"{path}: cannot be polled ({exc.strerror})"
    return Trigger(path, fd, ep), ""


class PressureWatch:
    """Triggers on many pressure files (the LS groups' ``cpu.pressure`` on cgroup v2) behind
    one epoll, kept in step with a set of paths: :meth:`follow` arms the new ones and closes
    the ones no longer wanted. A refused path is remembered and not tried again until it
    leaves the set, so a kernel that refuses costs one attempt per group, not one per round."""

    def __init__(self, stall_us: int = 50_000, window_us: int = 500_000, limit: int = 256) -> None:
        self.line = trigger_line("some", stall_us, window_us).encode() + b"\0"
        self.limit = limit  # triggers kept at most (each is an open file)
        self.epoll = select.epoll()
        self.fds: dict[str, int] = {}
        self.refused: dict[str, str] = {}  # path -> why
        self.loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop, on_fire: Callable[[], None]) -> None:
        def ready() -> None:
            self.epoll.poll(0)  # drain: the triggers stay armed
            on_fire()

        self.loop = loop
        loop.add_reader(self.epoll.fileno(), ready)

    def follow(self, paths: set[str]) -> None:
        for path in [p for p in self.fds if p not in paths]:
            fd = self.fds.pop(path)
            self.epoll.unregister(fd)
            os.close(fd)
        for path in [p for p in self.refused if p not in paths]:
            del self.refused[path]
        for path in sorted(paths):
            if path in self.fds or path in self.refused:
                continue
            if len(self.fds) >= self.limit:
                self.refused[path] = f"more than {self.limit} groups watched"
                continue
            why = self._arm(path)
            if why:
                self.refused[path] = why

    def _arm(self, path: str) -> str:
        try:
            fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_NOFOLLOW)
        except OSError as exc:
            return exc.strerror or str(exc)
        try:
            os.write(fd, self.line)
        except OSError as exc:
            os.close(fd)
            return "this kernel does not accept PSI triggers" if exc.errno == errno.EINVAL else str(exc.strerror)
        return self.watch(path, fd)

    def watch(self, path: str, fd: int) -> str:
        """Watch an armed trigger's fd (any fd that signals POLLPRI); takes ownership of it."""
        try:
            self.epoll.register(fd, select.EPOLLPRI)
        except OSError as exc:  # not pollable (a regular file, say)
            os.close(fd)
            return f"cannot be polled ({exc.strerror})"
        self.fds[path] = fd
        return ""

    def close(self) -> None:
        if self.loop is not None:
            self.loop.remove_reader(self.epoll.fileno())
            self.loop = None
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()
        self.epoll.close()
