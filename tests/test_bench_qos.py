"""bench/qos.py's policy: the bench measures how fast BE's quota reacts, so its agent must put a
quota on BE at every CPU level (the default puts none below HIGH, and the run then fails after
its start-up, waiting for a quota that never comes)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from bench import qos
from nriplugin.policy.cache import parse
from nriplugin.policy.model import Policy


def test_the_bench_s_policy_puts_a_quota_on_be_at_every_level() -> None:
    policy, _ = parse(qos.QUOTA_POLICY, "bench.qos")
    assert policy.qosManager.cpuSuppress.quotaFrom == "LOW"
    assert Policy().qosManager.cpuSuppress.quotaFrom == "HIGH"  # else the bench needs no policy


def test_the_spinner_check_fails_once_it_is_dead_or_out_of_its_groups(tmp_path: Path) -> None:
    # a signal to a dead, unreaped child succeeds: without the check a spike would continue a
    # zombie and measure an LS load that never ran
    group = tmp_path / "ls"  # stands in for a cgroup directory: its cgroup.procs is a plain file
    group.mkdir()
    spinner = qos.Spinner([group])
    try:
        spinner.check()
        assert spinner.cpu_seconds() >= 0
        (group / "cgroup.procs").write_text("1\n")  # moved elsewhere
        with pytest.raises(RuntimeError, match="no longer in"):
            spinner.check()
        os.kill(spinner.proc.pid, signal.SIGKILL)
        spinner._wait_state("Z")  # dead, not yet reaped
        spinner.go()  # no error: the reason for the check
        with pytest.raises(RuntimeError, match=r"exited: -9 \(killed by SIGKILL\)"):
            spinner.check()
    finally:
        spinner.kill()


def test_a_spinner_that_cannot_join_its_groups_is_not_left_behind(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        qos.Spinner([tmp_path / "gone"])
    # its child was killed and reaped: no stopped `sh` or `yes` of ours is left
    mine = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _parent(p) == os.getpid()]
    assert mine == []


def _parent(proc: Path) -> int | None:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None
