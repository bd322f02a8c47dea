"""BE's SCHED_IDLE per task (kernel/sched.py, the writer's part): only the container's own tasks
are touched, a task that already has it is left alone, one gone meanwhile is skipped, and a
refusal is reported once per pass; on the real kernel a process in a BE container's group
gets it when the container is seen running."""

from __future__ import annotations

import errno
import os
import subprocess

import pytest

from nriplugin.intent.core import Intent, Setting
from nriplugin.kernel.sched import IDLE, Scheduler, member

CID = "a" * 64
V1 = f"12:cpu,cpuacct:/kubepods/besteffort/pod1/{CID}\n11:memory:/kubepods/besteffort/pod1/{CID}\n"


def test_member_matches_the_containers_own_directory_only() -> None:
    assert member(V1, CID)
    assert member(f"0::/../../kubepods/besteffort/pod1/{CID}\n", CID)  # a cgroup namespace's view
    assert not member(V1, "pod1") and not member(V1, "")
    assert not member(f"0::/kubepods/besteffort/pod1/{CID}x\n", CID)


def fake(policies: dict[int, int], groups: dict[int, str], refuse: dict[int, int] | None = None) -> Scheduler:
    def policy_of(tid: int) -> int:
        if tid not in policies:
            raise ProcessLookupError(errno.ESRCH, "gone")
        return policies[tid]

    def set_policy(tid: int, policy: int) -> None:
        if refuse and tid in refuse:
            raise OSError(refuse[tid], os.strerror(refuse[tid]))
        policies[tid] = policy

    def groups_of(tid: int) -> str:
        if tid not in groups:
            raise FileNotFoundError(tid)
        return groups[tid]

    return Scheduler(policy_of, set_policy, groups_of)


def test_ensure_gives_the_policy_to_the_groups_tasks_only() -> None:
    policies = {1: os.SCHED_OTHER, 2: IDLE, 3: os.SCHED_OTHER}
    groups = {1: V1, 2: V1, 3: "0::/system.slice/other\n"}
    out = fake(policies, groups).ensure([1, 2, 3, 4], f"/kubepods/besteffort/pod1/{CID}")
    assert (out.set, out.already, out.foreign, out.gone, out.error) == (1, 1, 1, 1, None)
    assert policies == {1: IDLE, 2: IDLE, 3: os.SCHED_OTHER}


def test_ensure_reports_the_first_refusal_and_goes_on() -> None:
    policies = {1: os.SCHED_OTHER, 2: os.SCHED_OTHER}
    out = fake(policies, {1: V1, 2: V1}, refuse={1: errno.EPERM}).ensure([1, 2], CID)
    assert out.set == 1 and out.error is not None and out.error.errno == errno.EPERM
    assert policies[2] == IDLE


def test_the_writer_gives_sched_idle_where_the_intent_asks_and_counts_it() -> None:
    from pathlib import Path

    from nriplugin.kernel.cgroup import Cgroups, Version
    from nriplugin.node.writer import Writer
    from nriplugin.policy.model import Policy

    policies = {7: os.SCHED_OTHER}
    invalid: list[str] = []
    w = Writer(
        Cgroups(Path("/nonexistent"), version=Version.V1),
        Policy,
        on_invalid=invalid.append,
        scheduler=fake(policies, {7: V1}),
    )
    w.join(Intent(), f"kubepods/besteffort/pod1/{CID}", 7, "ns/pod/c")  # not asked: untouched
    assert policies[7] == os.SCHED_OTHER and w.sched_given == 0
    asked = Intent(sched_policy=Setting("sched.group", "idle", "BE"))
    w.join(asked, f"kubepods/besteffort/pod1/{CID}", 7, "ns/pod/c")
    assert policies[7] == IDLE and w.sched_given == 1 and invalid == []
    w.scheduler = fake({8: os.SCHED_OTHER}, {8: V1}, refuse={8: errno.EPERM})
    w.join(asked, f"kubepods/besteffort/pod1/{CID}", 8, "ns/pod/c")
    assert invalid == ["sched_policy"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
def test_the_real_kernel_a_process_outside_the_group_is_never_touched() -> None:
    proc = subprocess.Popen(["sleep", "30"])
    try:
        out = Scheduler().ensure([proc.pid], CID)
        assert out.foreign == 1 and os.sched_getscheduler(proc.pid) == os.SCHED_OTHER
    finally:
        proc.kill()
        proc.wait()
