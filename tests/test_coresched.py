"""Core scheduling cookies. This kernel has no core scheduling (prctl EINVAL), so the cookie
logic runs against a model of the kernel's PR_SCHED_CORE semantics; the real prctl is checked
to report "unsupported" here, and the feature to stay off where the probe says so."""

from __future__ import annotations

import errno
import itertools
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from nriplugin.features import core_sched, desired_state
from nriplugin.kernel import coresched
from nriplugin.kernel.cgroup import Cgroups
from nriplugin.kernel.coresched import CoreSched
from nriplugin.kernel.probe import core_sched_supported
from nriplugin.node.assembly import Node
from nriplugin.node.hooks import QoSPlugin
from nriplugin.nri import api_pb2 as api
from nriplugin.policy.cache import RuleCache
from nriplugin.policy.model import Policy
from testkit.kernel_tree import v1_tree
from testkit.runtime_peer import make_container, make_pod
from tests.test_features import caps, ctx

CORE = Policy.model_validate({"resourceQOSStrategy": {"policies": {"cpuPolicy": "coreSched"}}})


class Kernel:
    """PR_SCHED_CORE as the kernel implements it: a cookie per task; CREATE gives a thread
    group (or one task) a new cookie; SHARE_FROM copies a task's cookie to the caller;
    SHARE_TO copies the caller's cookie to a task or thread group; GET reads one; ESRCH for
    tasks that do not exist."""

    def __init__(self, processes: dict[int, list[int]]) -> None:
        self.processes = processes  # tgid -> tids
        self.cookies: dict[int, int] = {}
        self._next = itertools.count(0x1000, 0x40)
        self.calls: list[tuple[int, int]] = []

    def tasks(self, pid: int, pidtype: int) -> list[int]:
        for tgid, tids in self.processes.items():
            if pid == tgid and pidtype == coresched.PIDTYPE_TGID:
                return tids
            if pid in tids and pidtype == coresched.PIDTYPE_PID:
                return [pid]
        raise ProcessLookupError(errno.ESRCH, "no such process")

    def __call__(self, option: int, cmd: int, pid: int, pidtype: int, arg5: Any) -> int:
        assert option == coresched.PR_SCHED_CORE
        self.calls.append((cmd, pid))
        me = threading.get_native_id()
        if cmd == coresched.GET:
            (tid,) = self.tasks(pid, coresched.PIDTYPE_PID) if pid else [me]
            arg5.contents.value = self.cookies.get(tid, 0)
        elif cmd == coresched.CREATE:
            cookie = next(self._next)
            for tid in self.tasks(pid, pidtype):
                self.cookies[tid] = cookie
        elif cmd == coresched.SHARE_FROM:
            if pidtype != coresched.PIDTYPE_PID:
                raise OSError(errno.EINVAL, "SHARE_FROM takes one task")
            (tid,) = self.tasks(pid, pidtype)
            self.cookies[me] = self.cookies.get(tid, 0)
        elif cmd == coresched.SHARE_TO:
            for tid in self.tasks(pid, pidtype):
                self.cookies[tid] = self.cookies.get(me, 0)
        else:
            raise OSError(errno.EINVAL, "bad command")
        return 0


def test_groups_share_cookies_and_nothing_else_does() -> None:
    k = Kernel({100: [100, 101], 200: [200], 300: [300, 301, 302], 400: [400]})
    cs = CoreSched(k)
    assert cs.assign("class:BE", [100]) == 1
    assert cs.assign("class:BE", [300]) == 1  # copied from the group's leader
    assert cs.assign("pod:ls-1", [200]) == 1
    assert cs.assign("pod:ls-2", [400]) == 1
    c = k.cookies
    assert c[100] == c[101] == c[300] == c[301] == c[302] != 0  # whole thread groups
    assert len({c[100], c[200], c[400]}) == 3  # BE, and each LS pod, apart
    assert c.get(threading.get_native_id(), 0) == 0  # the agent itself never holds a cookie
    assert cs.cookie(301) == c[100]


def test_a_group_whose_leader_exited_starts_afresh_and_exited_tasks_are_skipped() -> None:
    k = Kernel({100: [100], 200: [200], 300: [300]})
    cs = CoreSched(k)
    cs.assign("class:BE", [100])
    first = k.cookies[100]
    del k.processes[100]  # the leader exited
    assert cs.assign("class:BE", [200, 999]) == 1  # 999 is gone: skipped, not an error
    assert k.cookies[200] not in (0, first) and cs.leaders["class:BE"] == 200
    cs.assign("class:BE", [300])
    assert k.cookies[300] == k.cookies[200]
    cs.forget([200])
    assert "class:BE" not in cs.leaders
    with pytest.raises(ValueError, match="invalid pid"):
        cs.assign("class:BE", [0])


@pytest.mark.skipif(core_sched_supported(), reason="this kernel has core scheduling")
def test_this_kernel_reports_core_scheduling_unsupported() -> None:
    with pytest.raises(OSError) as info:
        CoreSched().assign("class:BE", [threading.get_native_id()])
    assert info.value.errno in (errno.EINVAL, errno.ENOSYS)


def test_groups_by_class_pod_and_label() -> None:
    have = replace(caps(), core_sched=True)
    be = desired_state(ctx("BE", policy=CORE, c=have)).intent
    assert be.core_sched_group is not None and be.core_sched_group.value == "class:BE" and be.get("cpu.idle") == 1
    ls = desired_state(ctx("LS", policy=CORE, c=have)).intent.core_sched_group
    assert ls is not None and str(ls.value).startswith("pod:") and "own cookie" in ls.why
    # off when the kernel lacks it, under groupIdentity, and for pod-level intents
    assert desired_state(ctx("BE", policy=CORE)).intent.core_sched_group is None
    assert desired_state(ctx("BE", c=have)).intent.core_sched_group is None
    assert desired_state(ctx("BE", policy=CORE, c=have, container=False)).intent.core_sched_group is None


@pytest.mark.parametrize("bad", ["", "../x", "a b", "x" * 64, "-lead"])
def test_a_hostile_group_label_is_rejected(bad: str) -> None:
    c = ctx("LS", policy=CORE, c=replace(caps(), core_sched=True))
    c.pod.labels[core_sched.GROUP_LABEL] = bad
    out = desired_state(c)
    assert [f for f, _ in out.failed] == ["cpuQOS"] and out.intent.core_sched_group is None


def test_hooks_give_tasks_their_groups_cookie(tmp_path: Path) -> None:
    """At StartContainer the init process gets the cookie (its children inherit it); a
    container that already ran (Synchronize, CRI inventory) gets it for every process."""
    k = Kernel({500: [500, 501], 600: [600], 700: [700], 701: [701, 702]})
    rules = RuleCache()
    rules.set(CORE, "test")
    invalid: list[str] = []
    node = Node.create(
        rules,
        caps=replace(caps(), core_sched=True),
        cgroups=Cgroups(v1_tree(tmp_path)),
        coresched=CoreSched(k),
        on_invalid=invalid.append,
    )
    plugin = QoSPlugin(node)
    for i, pid in ((1, 500), (2, 600)):
        pod = make_pod(i, "BE")
        c = make_container(i, pod)
        c.pid = pid
        plugin.start_container(pod, c)
    assert k.cookies[500] == k.cookies[501] == k.cookies[600] != 0
    gone = make_container(3, make_pod(3, "LS"))
    gone.pid = 999  # exited before we got to it: skipped quietly
    plugin.start_container(make_pod(3, "LS"), gone)
    assert invalid == []
    # Already running with two processes (Synchronize): both get the LS pod's own cookie.
    ls = make_pod(4, "LS")
    running = make_container(4, ls)
    running.state = api.CONTAINER_RUNNING
    group = running.linux.cgroups_path.lstrip("/")
    v1_tree(tmp_path, [group])
    (tmp_path / "cpu" / group / "cgroup.procs").write_text("700\n701\n")
    plugin.synchronize([ls], [running])
    assert k.cookies[700] == k.cookies[701] == k.cookies[702] not in (0, k.cookies[500])
    # A kernel that refuses (EPERM): reported, not raised into the hook.
    node.writer.coresched = CoreSched(lambda *a: (_ for _ in ()).throw(PermissionError(errno.EPERM, "denied")))
    be = make_pod(5, "BE")
    c = make_container(5, be)
    c.pid = 500
    plugin.start_container(be, c)
    assert invalid == ["core_sched"]
