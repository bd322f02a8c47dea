"""Core scheduling cookies (prctl PR_SCHED_CORE, Linux >= 5.14 with CONFIG_SCHED_CORE): tasks
may share a physical core's SMT siblings only with tasks holding the same cookie, so a BE task
never runs next to an LS task on one core.

Cookies cannot be named, only created or copied, so a group is represented by a live member
(its "leader"): the first task of a group gets a new cookie (CREATE on its thread group);
later tasks get a copy (SHARE_FROM the leader into a short-lived helper thread, then SHARE_TO
the new task's thread group; the helper's own cookie goes away with it, so the agent itself
never carries one). A leader that exited is replaced by the next member.

``prctl`` is injectable: a kernel may lack core scheduling (EINVAL), and tests drive the
logic with a model of the kernel's semantics.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable, Iterable
from typing import Any

PR_SCHED_CORE = 62
GET, CREATE, SHARE_TO, SHARE_FROM = 0, 1, 2, 3
PIDTYPE_PID, PIDTYPE_TGID = 0, 1

Prctl = Callable[[int, int, int, int, Any], int]  # raises OSError(errno)


def libc_prctl() -> Prctl:
    libc = ctypes.CDLL(None, use_errno=True)
    fn = libc.prctl
    fn.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_void_p]
    fn.restype = ctypes.c_int

    def prctl(option: int, cmd: int, pid: int, pidtype: int, arg5: Any) -> int:
        rc = int(fn(option, cmd, pid, pidtype, arg5))
        if rc < 0:
            e = ctypes.get_errno()
            raise OSError(e, f"prctl(PR_SCHED_CORE, {cmd}, {pid}): {os.strerror(e)}")
        return rc

    return prctl


class CoreSched:
    def __init__(self, prctl: Prctl | None = None) -> None:
        self.prctl = prctl or libc_prctl()
        self.leaders: dict[str, int] = {}  # group -> a pid holding the group's cookie
        self._lock = threading.Lock()

    def cookie(self, pid: int) -> int:
        out = ctypes.c_ulong(0)
        self.prctl(PR_SCHED_CORE, GET, pid, PIDTYPE_PID, ctypes.pointer(out))
        return int(out.value)

    def assign(self, group: str, pids: Iterable[int]) -> int:
        """Give every process in ``pids`` (whole thread groups) the cookie of ``group``;
        returns how many were given it. Processes that exited meanwhile are skipped; other
        errors (EINVAL: no core scheduling, EPERM) raise OSError."""
        done = 0
        with self._lock:
            for pid in pids:
                if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
                    raise ValueError(f"invalid pid {pid!r}")
                try:
                    self._assign_one(group, pid)
                    done += 1
                except ProcessLookupError:
                    continue
        return done

    def _assign_one(self, group: str, pid: int) -> None:
        leader = self.leaders.get(group)
        if leader is not None and leader != pid:
            try:
                if self.cookie(leader) != 0:
                    self._copy(leader, pid)
                    return
            except ProcessLookupError:
                pass  # the leader exited: this task starts the group's cookie afresh
        self.prctl(PR_SCHED_CORE, CREATE, pid, PIDTYPE_TGID, 0)
        self.leaders[group] = pid

    def _copy(self, source: int, target: int) -> None:
        """SHARE_FROM into a helper thread, then SHARE_TO the target's thread group."""
        failure: list[BaseException] = []

        def helper() -> None:
            try:
                self.prctl(PR_SCHED_CORE, SHARE_FROM, source, PIDTYPE_PID, 0)
                self.prctl(PR_SCHED_CORE, SHARE_TO, target, PIDTYPE_TGID, 0)
            except BaseException as exc:  # re-raised in the caller's thread
                failure.append(exc)

        t = threading.Thread(target=helper, name="coresched-share")
        t.start()
        t.join()
        if failure:
            raise failure[0]

    def forget(self, pids: Iterable[int]) -> None:
        """Pids that exited: groups they led get a new leader on their next member."""
        gone = set(pids)
        with self._lock:
            self.leaders = {g: p for g, p in self.leaders.items() if p not in gone}
