"""The pure parts of bench/colocation.py: latency from the open-loop schedule, nearest-rank
percentiles, node CPU utilization from /proc/stat readings, the workers' counters, and the
configurations' policies (the agent accepts each)."""

from __future__ import annotations

import pytest

from bench import colocation
from bench.colocation import (
    Request,
    counter_rate,
    cpu_jiffies,
    cpu_util,
    in_window,
    latencies_ms,
    parse_load,
    percentile,
    pooled,
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


def test_pooled_percentiles_over_all_rounds_and_be_share_of_reference() -> None:
    def m(lat: list[float], cpu: float, mem: float) -> dict[str, object]:
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
            "send_lag_p99_ms": 0.1,
            "evictions": 0.0,
            "be_running": 2,
        }

    p = pooled([m([1.0] * 99, 100.0, 50.0), m([1.0] * 98 + [50.0, 60.0], 300.0, 150.0)], {"cpu": 400.0, "mem": 100.0})
    assert p["requests"] == 199
    assert p["ls_p50_ms"] == 1.0
    assert p["ls_p99_ms"] == 50.0  # rank ceil(0.99 * 199) = 198 of 199
    assert p["ls_p99_ms_by_round"] == [1.0, 50.0]
    # cpu: 200 of 400, mem: 100 of 100 -> (0.5 + 1.0) / 2
    assert p["be_throughput"] == pytest.approx(0.75)
    assert p["be_limit_cores"] is None


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
