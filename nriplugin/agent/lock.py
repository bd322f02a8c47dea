"""One agent per runtime: an exclusive ``flock`` on a file next to the runtime's NRI socket.

Every way the agent starts (the pre-registered launcher, the DaemonSet's image, a copy run by
hand) knows the socket, and the DaemonSet mounts the socket's directory from the host, so
they all lock the same inode. The kernel drops the lock when its holder dies, however it
dies, so there is no stale lock to clean up. The lock is keyed by the runtime, not by plugin
name: two copies under different names would fight over the same CPU shares just the same.

The file also says who holds it (one JSON line: pid, host, start time, how it was started),
for the waiting agent's message, ``/readyz`` and ``doctor``; and, once the holder hands over
cleanly, when it stopped answering hooks, so the next holder can measure the gap.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import socket
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path


def lock_path(nri_socket: str) -> Path:
    """``/var/run/nri/nri.sock`` -> ``/var/run/nri/nri.sock.nriplugin.lock``."""
    p = Path(nri_socket)
    return p.with_name(p.name + ".nriplugin.lock")


@dataclass(frozen=True)
class Holder:
    """Who holds (or last held) the runtime; written by the holder, read by everyone else."""

    pid: int
    host: str
    pidns: str
    started: float  # wall clock (time.time())
    mode: str  # "socket", "pre-registered", "supervised restart"
    socket: str
    released: float | None = None  # wall clock when it stopped answering hooks (clean exit)

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started))
        return f"pid {self.pid} on {self.host}, {self.mode}, started {when}"

    @classmethod
    def me(cls, mode: str, nri_socket: str) -> Holder:
        try:
            pidns = os.readlink("/proc/self/ns/pid")
        except OSError:
            pidns = ""
        return cls(os.getpid(), socket.gethostname(), pidns, time.time(), mode, nri_socket)


def read_holder(path: Path) -> Holder | None:
    """The identity in the lock file (None if absent or unreadable: never an error)."""
    try:
        with open(path, "rb") as f:
            line = f.read(4096).split(b"\n", 1)[0]
        return Holder(**json.loads(line))
    except (OSError, ValueError, TypeError):
        return None


class AgentLock:
    """The runtime's lock. ``try_acquire`` never blocks; ``wait`` blocks in a daemon thread
    (a blocking ``flock`` wakes the moment the holder exits, with no polling, and a daemon
    thread never holds up the process's exit the way the default executor would)."""

    def __init__(self, nri_socket: str, path: Path | None = None) -> None:
        self.socket = nri_socket
        self.path = path or lock_path(nri_socket)
        self.fd: int | None = None
        self.held = False

    def open(self) -> None:
        """Create/open the file; OSError says why it cannot be (checked before registering)."""
        if self.fd is None:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)

    def try_acquire(self) -> bool:
        self.open()
        assert self.fd is not None
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        self.held = True
        return True

    async def wait(self) -> None:
        """Return once this process holds the lock."""
        self.open()
        fd = self.fd
        assert fd is not None
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def block() -> None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError as exc:
                loop.call_soon_threadsafe(_settle, done, exc)
                return
            loop.call_soon_threadsafe(_settle, done, None)

        threading.Thread(target=block, name="nriplugin-lock", daemon=True).start()
        await done
        self.held = True

    def holder(self) -> Holder | None:
        return read_holder(self.path)

    def announce(self, me: Holder) -> None:
        """Write our identity (one line; written then truncated, so a reader sees a whole line)."""
        self._write(me)

    def release(self, me: Holder, stopped_serving: float | None = None) -> None:
        """Say when we stopped answering hooks, then let go (the next holder measures the gap)."""
        if self.fd is None:
            return
        if self.held:
            self._write(Holder(**{**asdict(me), "released": stopped_serving or time.time()}))
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            self.held = False
        os.close(self.fd)
        self.fd = None

    def close(self) -> None:
        """Let go without a record (start-up failed: this agent never served)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
            self.held = False

    def _write(self, h: Holder) -> None:
        assert self.fd is not None
        data = json.dumps(asdict(h)).encode() + b"\n"
        os.pwrite(self.fd, data, 0)
        os.ftruncate(self.fd, len(data))


def _settle(fut: asyncio.Future[None], exc: BaseException | None) -> None:
    if fut.done():
        return
    if exc is None:
        fut.set_result(None)
    else:
        fut.set_exception(exc)
