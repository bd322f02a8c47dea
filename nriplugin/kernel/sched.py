"""A task's scheduling policy (``sched_setscheduler``): BE's tasks run ``SCHED_IDLE``.

SCHED_IDLE per task rather than ``cpu.idle`` on BE's group: the kubelet owns the weight of its
QoS-level and pod groups, and the kernel refuses every weight written to a group with
``cpu.idle`` 1 (the kubelet then cannot update or even start). A task's policy is nobody
else's file. Against LS the two give the same: an LS wakeup preempts a SCHED_IDLE task at
once, and a CPU running only SCHED_IDLE tasks counts as idle when LS's task is placed.

The policy is a thread's; a thread or process created by one inherits it, so a container's
init process given it before it execs passes it to everything the workload forks. A task that
exits meanwhile is skipped, and so is one that is not in the container's group (``/proc/<tid>/
cgroup``): a pid reused since it was listed, or one from another pid namespace, is never
touched. ``policy_of`` / ``set_policy`` / ``groups_of`` are injectable for tests.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

IDLE = os.SCHED_IDLE

PolicyOf = Callable[[int], int]  # tid -> policy; raises OSError
SetPolicy = Callable[[int, int], None]  # (tid, policy); raises OSError
GroupsOf = Callable[[int], str]  # tid -> the text of /proc/<tid>/cgroup; raises OSError


def _set(tid: int, policy: int) -> None:
    os.sched_setscheduler(tid, policy, os.sched_param(0))


def _groups_of(tid: int) -> str:
    with open(f"/proc/{tid}/cgroup", encoding="ascii", errors="replace") as f:
        return f.read()


def member(text: str, leaf: str) -> bool:
    """Whether ``/proc/<tid>/cgroup`` text places the task in a group whose last component is
    ``leaf`` (a container's own directory: its id, or its systemd scope). The last component
    alone, so a cgroup namespace's relative paths match too."""
    if not leaf:
        return False
    for line in text.splitlines():
        path = line.rpartition(":")[2].rstrip("/")
        if path.rpartition("/")[2] == leaf:
            return True
    return False


@dataclass
class SchedPass:
    """What one pass over a container's tasks did."""

    already: int = 0  # tasks that had the policy (the runtime gave it, or an earlier pass)
    set: int = 0  # tasks the agent gave it now
    gone: int = 0  # tasks that exited meanwhile
    foreign: int = 0  # tasks not in the group (skipped)
    error: OSError | None = None  # the first refusal other than a task gone (EPERM, ...)


class Scheduler:
    def __init__(
        self,
        policy_of: PolicyOf = os.sched_getscheduler,
        set_policy: SetPolicy = _set,
        groups_of: GroupsOf = _groups_of,
    ) -> None:
        self.policy_of = policy_of
        self.set_policy = set_policy
        self.groups_of = groups_of

    def ensure(self, tids: Iterable[int], group: str, policy: int = IDLE) -> SchedPass:
        """Give every task in ``tids`` that is in cgroup ``group`` ``policy`` where it does not
        have it yet."""
        out = SchedPass()
        leaf = group.rstrip("/").rpartition("/")[2]
        for tid in tids:
            try:
                if not member(self.groups_of(tid), leaf):
                    out.foreign += 1
                    continue
                if self.policy_of(tid) == policy:
                    out.already += 1
                    continue
                self.set_policy(tid, policy)
                out.set += 1
            except (ProcessLookupError, FileNotFoundError):
                out.gone += 1
            except OSError as exc:
                if exc.errno == errno.ESRCH:
                    out.gone += 1
                elif out.error is None:
                    out.error = exc
        return out
