"""Memory notifications from the kernel, so memory eviction wakes when memory moves instead of
on a tick (kubelet looks every 10 s and misses fast OOMs, kubernetes#31362).

cgroup v1 (``cgroup.event_control``, one eventfd per registration):
- usage thresholds: ``"<eventfd> <fd of memory.usage_in_bytes> <bytes>"``; the eventfd counts
  each crossing, up or down (the kernel checks every 128 charged pages per CPU, so a crossing
  is seen within about half a MiB);
- pressure levels: ``"<eventfd> <fd of memory.pressure_level> <low|medium|critical>[,<mode>]"``;
  under reclaim it fires in storms (hundreds a second), so a wake-up only sets a flag.
cgroup v2: ``memory.events`` changes (high, max, oom, oom_kill) through inotify, and a PSI
trigger on the group's ``memory.pressure`` (POLLPRI, see ``psi_trigger.py``).

Everything is driven by the asyncio loop (``loop.add_reader``); the callback gets the name of
what fired. A registration the kernel refuses is returned as a reason, never raised, so the
caller can fall back to its rounds and say why once.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from nriplugin.kernel.cgroup import Version
from nriplugin.kernel.inotify import IN_MODIFY, Inotify
from nriplugin.kernel.psi_trigger import Trigger, open_trigger

LEVELS = ("low", "medium", "critical")
MODES = ("default", "hierarchy", "local")

Fired = Callable[[str], None]


def control_line(efd: int, target_fd: int, arg: str) -> str:
    """The text written to ``cgroup.event_control``; checked here, since a bad line is EINVAL."""
    if efd < 0 or target_fd < 0:
        raise ValueError("file descriptors must be >= 0")
    if not arg or any(ch.isspace() for ch in arg) or len(arg) > 64:
        raise ValueError(f"bad event argument {arg!r:.80}")
    return f"{efd} {target_fd} {arg}"


def pressure_arg(level: str, mode: str = "default") -> str:
    if level not in LEVELS:
        raise ValueError(f"pressure level must be one of {', '.join(LEVELS)}, got {level!r}")
    if mode not in MODES:
        raise ValueError(f"pressure mode must be one of {', '.join(MODES)}, got {mode!r}")
    return level if mode == "default" else f"{level},{mode}"


@dataclass
class _Reg:
    name: str
    fds: list[int]  # closed on cancel; the first is the one the loop watches
    drain: Callable[[], None]
    extra: Trigger | Inotify | None = None


@dataclass
class MemoryEvents:
    """Registrations on memory cgroup directories (absolute paths, already confined to the
    cgroup root by the caller), all delivered to ``on_fire`` on ``loop``."""

    loop: asyncio.AbstractEventLoop
    on_fire: Fired
    _regs: dict[str, _Reg] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self._regs)

    def watch_group(self, name: str, group_dir: str, version: Version, marks: tuple[int, ...]) -> list[str]:
        """Fire ``name``-prefixed events as the group's memory runs short, the way its
        hierarchy can tell: on cgroup v1 its usage crossing each of ``marks`` and the
        kernel's critical pressure (hierarchy); on v2 its ``memory.events`` and a memory PSI
        trigger (v2 has no usage thresholds). The pressure event is ``<name>:pressure``.
        Returns why not, for each that could not be armed."""
        if version is Version.V1:
            whys = [self.v1_threshold(f"{name}:usage{i}", group_dir, b) for i, b in enumerate(marks)]
            whys.append(self.v1_pressure(f"{name}:pressure", group_dir, "critical", "hierarchy"))
        else:
            whys = [self.v2_events(f"{name}:events", group_dir), self.v2_pressure(f"{name}:pressure", group_dir)]
        return [why for why in whys if why]

    # cgroup v1 ---------------------------------------------------------------------------------

    def v1_threshold(self, name: str, group_dir: str, bytes_: int) -> str | None:
        """Fire ``name`` whenever the group's usage crosses ``bytes_``. Returns why not."""
        if bytes_ <= 0:
            return f"{name}: threshold must be > 0, got {bytes_}"
        return self._v1(name, group_dir, "memory.usage_in_bytes", str(int(bytes_)))

    def v1_pressure(self, name: str, group_dir: str, level: str = "critical", mode: str = "hierarchy") -> str | None:
        """Fire ``name`` at the kernel's memory pressure ``level`` (reclaim in the group or,
        with ``hierarchy``, below it). Returns why not."""
        return self._v1(name, group_dir, "memory.pressure_level", pressure_arg(level, mode))

    def _v1(self, name: str, group_dir: str, target: str, arg: str) -> str | None:
        self.cancel(name)
        efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        try:
            tfd = os.open(os.path.join(group_dir, target), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError as exc:
            os.close(efd)
            return f"{group_dir}/{target}: {exc.strerror}"
        try:
            ctl = os.open(os.path.join(group_dir, "cgroup.event_control"), os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
            try:
                os.write(ctl, control_line(efd, tfd, arg).encode())
            finally:
                os.close(ctl)
        except OSError as exc:
            os.close(efd)
            os.close(tfd)
            code = errno.errorcode.get(exc.errno or 0, str(exc.errno))
            return f"{group_dir}/cgroup.event_control refused {target} {arg}: {exc.strerror} ({code})"

        def drain() -> None:
            with contextlib.suppress(BlockingIOError, OSError):
                os.eventfd_read(efd)

        self._watch(_Reg(name, [efd, tfd], drain))
        return None

    # cgroup v2 ---------------------------------------------------------------------------------

    def v2_events(self, name: str, group_dir: str) -> str | None:
        """Fire ``name`` when the group's ``memory.events`` changes (high, max, oom, oom_kill)."""
        self.cancel(name)
        path = os.path.join(group_dir, "memory.events")
        if not os.path.isfile(path):
            return f"{path}: no such file"
        ino = Inotify()
        try:
            ino.add(path, IN_MODIFY)
        except OSError as exc:
            ino.close()
            return str(exc)

        def drain() -> None:
            ino.read()

        self._watch(_Reg(name, [ino.fd], drain, ino))
        return None

    def v2_pressure(self, name: str, group_dir: str, stall_us: int = 100_000, window_us: int = 1_000_000) -> str | None:
        """Fire ``name`` when the group's tasks stall on memory for ``stall_us`` within
        ``window_us`` (a PSI trigger on ``memory.pressure``)."""
        self.cancel(name)
        trig, why = open_trigger(os.path.join(group_dir, "memory.pressure"), stall_us, window_us)
        if trig is None:
            return why
        trig.start(self.loop, lambda: self.on_fire(name))
        self._regs[name] = _Reg(name, [], lambda: None, trig)
        return None

    # common ------------------------------------------------------------------------------------

    def _watch(self, reg: _Reg) -> None:
        def ready() -> None:
            reg.drain()
            self.on_fire(reg.name)

        self.loop.add_reader(reg.fds[0], ready)
        self._regs[reg.name] = reg

    def cancel(self, name: str) -> None:
        reg = self._regs.pop(name, None)
        if reg is None:
            return
        if reg.fds:
            self.loop.remove_reader(reg.fds[0])
        if isinstance(reg.extra, Trigger):
            reg.extra.close()
        elif isinstance(reg.extra, Inotify):
            reg.extra.close()
            return  # its fd is the inotify's
        for fd in reg.fds:
            with contextlib.suppress(OSError):
                os.close(fd)

    def names(self) -> list[str]:
        return sorted(self._regs)

    def close(self) -> None:
        for name in list(self._regs):
            self.cancel(name)
