"""Netlink sockets in another network namespace without forking.

pyroute2 0.9's ``IPRoute(netns=...)`` forks a child to open its socket there. A netlink
socket belongs to the namespace it was created in, and ``setns(CLONE_NEWNET)`` moves only the
calling thread, so the thread that talks tc (never the event loop's) steps into the
namespace, opens the socket, and steps back: about 3 ms, no process.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterator
from typing import Any

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


class NetnsError(OSError):
    """The namespace cannot be entered (gone, or not a network namespace)."""


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise NetnsError(err, os.strerror(err))


@contextlib.contextmanager
def entered(path: str | None) -> Iterator[None]:
    """This thread in the namespace at ``path`` (None: stay) for the block. If stepping back
    fails the thread is unusable: that is raised as a RuntimeError, never ignored."""
    if path is None:
        yield
        return
    try:
        target = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise NetnsError(exc.errno or 0, f"{path}: {exc.strerror}") from exc
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        _setns(target)
        try:
            yield
        finally:
            try:
                _setns(home)
            except NetnsError as exc:  # pragma: no cover - the kernel lets a thread return home
                raise RuntimeError(f"cannot return to this thread's network namespace: {exc}") from exc
    finally:
        os.close(target)
        os.close(home)


def iproute(path: str | None = None) -> Any:
    """A pyroute2 IPRoute talking to the namespace at ``path`` (None: this thread's). Call it
    from a worker thread: IPRoute runs its own event loop."""
    from pyroute2 import IPRoute

    with entered(path):
        return IPRoute()


def link_names(path: str | None = None) -> set[str]:
    """The interfaces of the namespace at ``path`` (None: this thread's), from its
    ``/proc/net/dev``: no netlink socket, for a cheap look before deciding to open one."""
    with entered(path), open("/proc/thread-self/net/dev") as f:
        return {line.split(":", 1)[0].strip() for line in f if ":" in line}
