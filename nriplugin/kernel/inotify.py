"""A minimal inotify binding: one instance, many watches, non-blocking fd for the event loop.

(watchdog gives every watched directory its own thread and inotify instance; a node with a
thousand containers would exhaust fs.inotify.max_user_instances, 128 by default.)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct
from pathlib import Path
from typing import Any

IN_MODIFY = 0x00000002
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_IGNORED = 0x00008000
IN_Q_OVERFLOW = 0x00004000
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_libc.inotify_init1.argtypes = [ctypes.c_int]
_libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
_libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]


class Inotify:
    def __init__(self) -> None:
        fd = _libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            e = ctypes.get_errno()
            raise OSError(e, f"inotify_init1: {os.strerror(e)}")
        self.fd = fd
        self.paths: dict[int, str] = {}  # wd -> directory

    def add(self, path: str, mask: int = IN_MODIFY) -> int:
        wd = _libc.inotify_add_watch(self.fd, os.fsencode(path), mask)
        if wd < 0:
            e = ctypes.get_errno()
            raise OSError(e, f"inotify_add_watch {path}: {os.strerror(e)}")
        self.paths[wd] = path
        return int(wd)

    def remove(self, wd: int) -> None:
        if self.paths.pop(wd, None) is not None:
            _libc.inotify_rm_watch(self.fd, wd)  # EINVAL if the kernel dropped it already: fine

    def read(self) -> list[tuple[str, str, int]]:
        """Pending events as (directory, file name, mask); [] when none. A directory whose
        watch the kernel dropped (it was removed) comes once with IN_IGNORED."""
        try:
            data = os.read(self.fd, 65536)
        except BlockingIOError:
            return []
        out = []
        pos = 0
        while pos + _EVENT.size <= len(data):
            wd, mask, _cookie, n = _EVENT.unpack_from(data, pos)
            name = data[pos + _EVENT.size : pos + _EVENT.size + n].split(b"\0", 1)[0].decode(errors="replace")
            pos += _EVENT.size + n
            d = self.paths.get(wd)
            if mask & IN_IGNORED:
                gone = self.paths.pop(wd, None)  # the directory is gone (cgroup removed)
                if gone is not None:
                    out.append((gone, "", mask))
                continue
            if d is not None or mask & IN_Q_OVERFLOW:
                out.append((d or "", name, mask))
        return out

    def close(self) -> None:
        os.close(self.fd)
        self.paths.clear()


def _held(pid_dir: Path) -> tuple[int, int]:
    """(inotify instances, watches) a process holds: ``fdinfo`` lists one ``inotify wd:`` line
    per watch of each inotify fd. Fds that close meanwhile are skipped."""
    instances = watches = 0
    for fd in (pid_dir / "fd").iterdir():
        try:
            if os.readlink(fd) != "anon_inode:inotify":
                continue
            text = (pid_dir / "fdinfo" / fd.name).read_text()
        except OSError:
            continue
        instances += 1
        watches += text.count("inotify wd:")
    return instances, watches


def usage(proc: Path = Path("/proc"), uid: int | None = None, top: int = 3) -> dict[str, Any]:
    """inotify headroom for ``uid`` (default: ours): watches and instances in use, counted from
    every process's inotify fds, against ``fs.inotify.max_user_watches`` /
    ``max_user_instances``, which are per user; and the processes holding the most watches. The
    reconciler holds one watch per managed cgroup directory and hierarchy, so a node with
    thousands of containers needs the headroom."""
    uid = os.geteuid() if uid is None else uid
    watches = instances = 0
    holders: list[tuple[int, int, str]] = []  # (watches, pid, comm)
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            if d.stat().st_uid != uid:
                continue
            n, mine = _held(d)
        except OSError:  # gone, or not ours to look at
            continue
        instances += n
        if mine:
            watches += mine
            try:
                comm = (d / "comm").read_text().strip()
            except OSError:
                comm = "?"
            holders.append((mine, int(d.name), comm))
    holders.sort(reverse=True)
    limits = {}
    for name in ("max_user_watches", "max_user_instances"):
        try:
            limits[name] = int((proc / "sys" / "fs" / "inotify" / name).read_text())
        except (OSError, ValueError):
            limits[name] = 0
    return {
        "watches": watches,
        "maxUserWatches": limits["max_user_watches"],
        "watchHeadroom": limits["max_user_watches"] - watches,
        "instances": instances,
        "maxUserInstances": limits["max_user_instances"],
        "topHolders": [{"pid": pid, "comm": comm, "watches": n} for n, pid, comm in holders[:top]],
    }


def watches_of(pid: int, proc: Path = Path("/proc")) -> int:
    """Watches held by one process (all its inotify instances)."""
    return _held(proc / str(pid))[1]
