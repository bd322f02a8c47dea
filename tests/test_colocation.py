"""The pure parts of bench/colocation.py: latency from the open-loop schedule, nearest-rank
percentiles, node CPU utilization from /proc/stat readings, the workers' counters, and the
configurations' policies (the agent accepts each)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import colocation
from bench.colocation import (
    Request,
    counter_rate,
    cpu_jiffies,
    cpu_util,
    in_window,
    latencies_ms,
    missed_by,
    parse_load,
    percentile,
    pooled,
    steady,
    summarize,
    targets,
    windows,
    write_section,
)
from nriplugin.policy.cache import parse
from nriplugin.policy.model import Policy


def test_latency_counts_from_the_scheduled_send_not_the_actual_one() -> None:
    # the second request was due at 10 ms but the generator only sent it at 40 ms: its
    # latency includes the 30 ms it waited (what a closed-loop client would hide)
    out = (
        "start 1700000000000000000\n0 100000 2100000 1\n10000000 40000000 42000000 1\n20000000 20000000 5020000000 0\n"
    )
    start, reqs = parse_load(out)
    assert start == 1_700_000_000_000_000_000
    assert reqs[1] == Request(due=0.01, sent=0.04, done=0.042, ok=True)
    assert latencies_ms(reqs) == pytest.approx([2.1, 32.0, 5000.0])
    assert [r.ok for r in reqs] == [True, True, False]


def test_window_is_chosen_by_due_time() -> None:
    reqs = [Request(due=t, sent=t, done=t + 9.0, ok=True) for t in (0.5, 1.0, 1.5, 2.0)]
    # a request due inside the window counts even if it was answered long after it
    assert [r.due for r in in_window(reqs, 1.0, 2.0)] == [1.0, 1.5]


def test_parse_load_refuses_output_without_start() -> None:
    with pytest.raises(ValueError, match="start"):
        parse_load("0 1 2 1\n")


def test_percentile_nearest_rank() -> None:
    v = [float(x) for x in range(1, 1001)]  # 1..1000, shuffled order must not matter
    v.reverse()
    assert percentile(v, 0.5) == 500.0
    assert percentile(v, 0.99) == 990.0
    assert percentile(v, 0.999) == 999.0  # 0.999 * 1000 is 999.0000000000001 in floats
    assert percentile(v, 1.0) == 1000.0
    assert percentile([7.0], 0.999) == 7.0
    assert percentile([], 0.5) is None
    # with fewer than 1000 samples p99.9 is the largest one, not an interpolation
    assert percentile([1.0, 2.0, 3.0, 100.0], 0.999) == 100.0
    assert percentile([1.0, 2.0, 3.0, 100.0], 0.5) == 2.0


STAT0 = "cpu  100 10 50 800 40 5 5 20 7 0\ncpu0 50 5 25 400 20 2 3 10 3 0\nintr 1\n"
STAT1 = "cpu  250 10 100 900 40 15 5 120 9 0\ncpu0 1 1 1 1 1 1 1 1 1 0\nintr 2\n"


def test_cpu_jiffies_from_the_all_cpu_line() -> None:
    # busy: user+nice+system+irq+softirq (guest is inside user); available adds idle, iowait; not steal
    assert cpu_jiffies(STAT0) == (170, 1010)


def test_cpu_util_between_readings() -> None:
    # busy 170 -> 380 (+210), available 1010 -> 1320 (+310); the 100 jiffies of steal do not count
    assert cpu_util(STAT0, STAT1) == pytest.approx(210 / 310)
    with pytest.raises(ValueError):
        cpu_util(STAT1, STAT0)


def test_counter_rate() -> None:
    assert counter_rate((1000, 2_000_000_000), (4000, 3_500_000_000)) == pytest.approx(2000.0)
    assert counter_rate((3213, 5), (3213, 5)) == 0.0  # never written again: the worker stopped
    with pytest.raises(ValueError):
        counter_rate((1, 5), (2, 5))
    with pytest.raises(ValueError):
        counter_rate((9, 5), (2, 6))


def window(lat: list[float], cpu: float, mem: float, lag: float | None = 0.1) -> dict[str, object]:
    return {
        "rate_rps": 100,
        "lat_ms": lat,
        "requests": len(lat),
        "errors": 0,
        "node_cpu_util": 0.5,
        "be_ops_s": {"cpu": cpu, "mem": mem},
        "ls_cores": 0.3,
        "be_cores": 1.0,
        "be_limit_cores": None,
        "send_lag_p99_ms": lag,
        "evictions": 0.0,
        "be_running": 2,
    }


def test_pooled_percentiles_over_all_rounds_and_be_share_of_reference() -> None:
    m = window
    p = pooled([m([1.0] * 99, 100.0, 50.0), m([1.0] * 98 + [50.0, 60.0], 300.0, 150.0)], {"cpu": 400.0, "mem": 100.0})
    assert p["requests"] == 199
    assert p["ls_p50_ms"] == 1.0
    assert p["ls_p99_ms"] == 50.0  # rank ceil(0.99 * 199) = 198 of 199
    assert p["ls_p99_ms_by_round"] == [1.0, 50.0]
    # cpu: 200 of 400, mem: 100 of 100 -> (0.5 + 1.0) / 2
    assert p["be_throughput"] == pytest.approx(0.75)
    assert p["be_limit_cores"] is None
    assert (p["windows"], p["stalled"], p["stalled_kept"]) == (2, 0, False)


def test_a_window_whose_generator_sent_late_is_left_out_and_counted() -> None:
    calm, late = window([1.0] * 100, 100.0, 50.0, lag=1.2), window([90.0] * 100, 10.0, 5.0, lag=3.01)
    at_limit = window([2.0] * 100, 100.0, 50.0, lag=3.0)
    assert steady([calm, late, at_limit], 3.0) == [calm, at_limit]  # the limit itself is steady
    assert steady([calm, late], 0.0) == [calm, late]  # 0: every window
    assert steady([late, late], 3.0) == [late, late]  # none steady: all kept
    p = pooled([calm, late], {"cpu": 100.0, "mem": 50.0}, 3.0)
    assert p["ls_p99_ms"] == 1.0 and p["requests"] == 100
    assert p["be_throughput"] == pytest.approx(1.0)  # the stalled window's BE does not count either
    assert p["ls_p99_ms_by_round"] == [1.0, 90.0]  # every window still shown
    assert p["send_lag_p99_ms_by_round"] == [1.2, 3.01]
    assert (p["windows"], p["stalled"], p["stalled_kept"]) == (2, 1, False)
    assert windows(p) == "1 of 2"
    q = pooled([late, late], {}, 3.0)
    assert (q["ls_p99_ms"], q["stalled"], q["stalled_kept"]) == (90.0, 2, True)
    assert windows(q) == "2 (2 stalled)"
    assert windows(pooled([calm], {}, 3.0)) == "1"


def test_a_window_without_a_send_lag_is_steady() -> None:
    """BE's reference runs without load: no generator, nothing to stall."""
    ref = window([], 100.0, 50.0, lag=None)
    assert steady([ref], 3.0) == [ref]


def test_summarize_leaves_stalled_windows_out_at_every_level_and_says_where() -> None:
    raw = {
        "alone": [
            [window([1.0] * 100, 0, 0), window([50.0] * 100, 0, 0, lag=9.0)],
            [window([2.0] * 100, 0, 0), window([3.0] * 100, 0, 0)],
        ],
        "be-alone": [[window([], 200.0, 100.0, lag=None)]],
    }
    s = summarize(raw, 3.0)
    assert s["stall_lag_ms"] == 3.0
    assert s["configs"]["alone"]["ls_p99_ms"] == 1.0
    assert s["configs"]["alone"]["knee"]["ls_p99_ms"] == 3.0
    assert s["configs"]["alone"]["knee"]["stalled"] == 0
    assert summarize(raw, 0.0)["configs"]["alone"]["ls_p99_ms"] == 50.0


@pytest.mark.parametrize("cfg", [c for c in colocation.CONFIGS if c.policy], ids=lambda c: c.name)
def test_every_configuration_s_policy_is_one_the_agent_accepts(cfg: colocation.Config) -> None:
    """A policy the agent refuses would fail a 30-minute run at its configuration's turn."""
    policy, _ = parse(cfg.policy, cfg.name)
    assert policy != Policy(), f"{cfg.name}: the policy changes nothing"


def test_the_no_quota_configurations_keep_every_cpu_level_out_of_reach() -> None:
    policy, _ = parse(colocation.NO_QUOTA)
    p = policy.qosManager.cpuPressure
    assert (p.low, p.medium, p.high, p.critical) == (97, 98, 99, 100)
    assert policy.qosManager.cpuSuppress.quotaFrom == "HIGH"  # no quota below 99 points


def test_a_miss_too_small_to_show_still_reads_as_a_miss() -> None:
    assert missed_by(0.3) == "missed by 0.30x"
    assert missed_by(0.004) == "missed by less than 0.01x"


def test_a_saved_run_without_its_command_commit_or_date_says_so(tmp_path: Path) -> None:
    """``--from-json`` of a run saved before they were kept: never today's date or HEAD's commit."""
    raw = {n: [[window([1.0] * 100, 0, 0)]] for n in ("alone", "no-agent", "agent")}
    raw["be-alone"] = [[window([], 200.0, 100.0, lag=None)]]
    s = summarize(raw)
    s.update(cpus=2, work_us=1000, cost_ms=3.0, rounds=1, warmup=10.0, seconds=60.0)
    out = tmp_path / "BENCHMARKS.md"
    write_section(out, s, None)
    text = out.read_text()
    assert "Command: `.venv/bin/python -m bench.colocation (command not recorded)` (2 CPUs, date not recorded)" in text
    assert "commit `not recorded`;" in text
    s.update(command="python -m bench.colocation --seconds 60", commit="abc1234", date="2026-12-03")
    write_section(out, s, None)
    assert (
        "`.venv/bin/python -m bench.colocation --seconds 60` (2 CPUs, 2026-12-03), commit `abc1234`;" in out.read_text()
    )


def test_a_subset_without_the_agent_or_no_agent_has_no_targets_to_judge() -> None:
    """`--configs alone,idle-noquota --write` must write its table, not fail at the end of the run."""
    raw = {"alone": [[window([1.0] * 100, 0, 0)], [window([2.0] * 100, 0, 0)]]}
    raw["agent"] = raw["alone"]
    assert targets(summarize({"alone": raw["alone"]})["configs"]) == ""
    assert targets(summarize(raw)["configs"]) == ""  # no no-agent either
    raw["no-agent"] = raw["alone"]
    judged = targets(summarize(raw)["configs"]).splitlines()
    assert [ln.split(" (")[0] for ln in judged] == ["- moderate load", "- knee load"]
