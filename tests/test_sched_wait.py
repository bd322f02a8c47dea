"""bench/sched_wait.py: its readings of the kernel's counters and its summary, and its cgroups
leave nothing behind."""

from __future__ import annotations

import os
import subprocess

import pytest

from bench import sched_wait
from bench.sched_wait import involuntary, run_delay_ns, summarize, window


def test_the_run_queue_wait_is_schedstat_s_second_field() -> None:
    assert run_delay_ns("123456 789 10\n") == 789
    with pytest.raises(ValueError, match="not a schedstat line"):
        run_delay_ns("123 456")


def test_involuntary_switches_come_from_their_own_line() -> None:
    status = "Name:\tx\nvoluntary_ctxt_switches:\t40\nnonvoluntary_ctxt_switches:\t7\n"
    assert involuntary(status) == 7
    with pytest.raises(ValueError, match="nonvoluntary"):
        involuntary("Name:\tx\n")


def test_a_window_counts_latency_from_the_due_time_and_the_wait_per_request() -> None:
    # due, sent, done (ns from the start), ok: the second request was sent late
    out = "start 1\n0 0 2000000 1\n1000000 3000000 5000000 1\n2000000 2000000 3000000 0\n"
    w = window(out, wait_ns=900_000, switches=5)
    assert w["requests"] == 3 and w["errors"] == 1
    assert w["p50_ms"] == 2.0 and w["p99_ms"] == 4.0  # 2, 4 (due 1 ms, done 5 ms), 1
    assert w["wait_us_per_request"] == 300.0
    with pytest.raises(ValueError, match="no request"):
        window("start 1\n", 0, 0)


def test_the_summary_takes_medians_and_the_ratio_pair_by_pair() -> None:
    def m(p99: float, wait: float) -> dict[str, float]:
        return {"p50_ms": 1.0, "p99_ms": p99, "p999_ms": 2 * p99, "wait_us_per_request": wait}

    pairs = [
        {"none": m(4.0, 600), "group": m(5.0, 800), "task": m(5.0, 800)},
        {"none": m(8.0, 700), "group": m(8.0, 700), "task": m(16.0, 700)},  # a noisy window raises both
        {"none": m(4.0, 650), "group": m(6.0, 900), "task": m(3.0, 900)},
    ]
    s = summarize(pairs)
    assert s["modes"] == ["none", "group", "task"]
    assert s["none"]["p99_ms"] == 4.0 and s["group"]["p99_ms"] == 6.0 and s["task"]["p99_ms"] == 5.0
    assert s["ratio"]["group"]["p99_ms"] == 1.25  # median of 1.25, 1.0, 1.5: not 6.0 / 4.0
    assert s["ratio"]["group"]["wait_us_per_request"] == pytest.approx(800 / 600)
    assert s["ratio"]["task"]["p99_ms"] == 1.25  # 1.25, 2.0, 0.75
    assert s["task_vs_group"]["p99_ms"] == 1.0  # 1.0, 2.0, 0.5
    assert s["pairs"] == 3
    assert "task_vs_group" not in summarize([{"none": m(4.0, 1), "group": m(5.0, 1)}])


def test_the_groups_hold_a_process_and_are_gone_after_it() -> None:
    groups = sched_wait.Groups()
    root = groups.root
    p = groups.start("be", ["sleep", "30"])
    q = groups.start("be_task", ["sleep", "30"], idle=True)
    try:
        assert p.pid in groups.tasks("be") and q.pid in groups.tasks("be_task")
        assert (root / "be" / "cpu.idle").read_text().strip() == "1"
        assert (root / "be_task" / "cpu.idle").read_text().strip() == "0"
        assert (root / "be_task" / "cpu.shares").read_text().strip() == "2"
        assert os.sched_getscheduler(q.pid) == os.SCHED_IDLE and os.sched_getscheduler(p.pid) == os.SCHED_OTHER
        wait, _ = groups.counters("be")
        assert wait >= 0
    finally:
        sched_wait.stop(p)
        sched_wait.stop(q)
        groups.close()
    assert not root.exists()
    assert p.returncode is not None and subprocess.run(["kill", "-0", str(p.pid)], capture_output=True).returncode != 0
