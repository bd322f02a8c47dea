"""The hook-latency bench's statistics: the SLO histogram against the runtime's own timings
(the share answered within a bound, counted exactly on both sides), and the CRI comparison's
intervals (whole rounds resampled: calls of one round are not independent), and the hook
ratios' intervals and verdicts (rounds resampled in pairs); and the scale table's errors, named."""

from __future__ import annotations

import random
import statistics

import pytest

from bench.containerd_latency import diff_ci
from bench.hook_latency import TARGETS, WITHIN, ratio_ci, verdict, within
from nriplugin.obs.metrics import HOOK_BUCKETS


def cumulative(observations_s: list[float]) -> list[tuple[float, float]]:
    """Cumulative buckets (upper bound, count) as the agent exports them, +Inf last."""
    bounds = [*HOOK_BUCKETS, float("inf")]
    return [(le, float(sum(1 for x in observations_s if x <= le))) for le in bounds]


def test_every_bound_compared_is_a_bucket_bound_so_the_histogram_count_is_exact() -> None:
    assert set(WITHIN) <= set(HOOK_BUCKETS)


def test_shares_within_each_bound_count_the_calls_of_both_sides_between_the_two_scrapes() -> None:
    warmup = [0.003, 0.003]  # observed before the first scrape: not the timed calls
    timed_s = [100e-6, 240e-6, 260e-6, 450e-6, 900e-6, 1.5e-3, 3e-3, 4e-3]
    before = cumulative(warmup)
    after = cumulative(warmup + timed_s)
    runtime_us = [x * 1e6 + 30 for x in timed_s]  # the runtime's own side adds 30 us to each
    shares = within(before, after, runtime_us)
    assert list(shares) == ["250", "500", "1000", "2000"]
    assert shares["250"] == [pytest.approx(100 * 1 / 8), pytest.approx(100 * 2 / 8)]  # 260 us: 290 at the runtime
    assert shares["500"] == [pytest.approx(100 * 4 / 8), pytest.approx(100 * 4 / 8)]
    assert shares["1000"] == [pytest.approx(100 * 5 / 8), pytest.approx(100 * 5 / 8)]
    assert shares["2000"] == [pytest.approx(100 * 6 / 8), pytest.approx(100 * 6 / 8)]


def test_a_bound_the_histogram_does_not_have_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import bench.hook_latency as hl

    monkeypatch.setattr(hl, "WITHIN", (333e-6,))
    with pytest.raises(ValueError, match="333 us is not a bound"):
        hl.within(cumulative([]), cumulative([1e-4]), [100.0])


def rounds_of(levels: list[float], per_round: int, spread: float = 0.0) -> list[float]:
    """Calls round after round: each round at its own level, its calls spread around it."""
    return [level + spread * ((i % 7) - 3) / 3 for level in levels for i in range(per_round)]


def test_the_interval_resamples_rounds_so_a_difference_one_round_made_is_not_called_signal() -> None:
    none = rounds_of([10.0] * 6, 50, spread=1.0)
    plugin = rounds_of([10.0] * 5 + [14.0], 50, spread=1.0)  # one slow round: the machine, not the plugin
    lo, hi = diff_ci(plugin, none, 0.9, per_round=50)
    assert lo <= 0.0 < hi  # could be nothing
    # what resampling single calls would say of the same data: a confident 4 ms
    rng = random.Random(1)
    q = sorted(
        sorted(rng.choices(plugin, k=300))[int(299 * 0.9)] - sorted(rng.choices(none, k=300))[int(299 * 0.9)]
        for _ in range(500)
    )
    assert q[12] > 2.0


def test_a_shift_in_every_round_is_found_and_measured() -> None:
    none = rounds_of([10.0, 12.0, 9.0, 11.0, 10.5], 40, spread=1.0)
    plugin = [x + 1.5 for x in none]
    lo, hi = diff_ci(plugin, none, 0.5, per_round=40)
    assert lo == pytest.approx(1.5) and hi == pytest.approx(1.5)  # rounds paired: the shift alone


def test_partial_or_unequal_rounds_are_refused() -> None:
    with pytest.raises(ValueError, match="whole rounds of 40"):
        diff_ci([1.0] * 60, [1.0] * 60, 0.5, per_round=40)
    with pytest.raises(ValueError, match="two or more"):
        diff_ci([1.0] * 40, [1.0] * 40, 0.5, per_round=40)
    with pytest.raises(ValueError):
        diff_ci([1.0] * 80, [1.0] * 120, 0.5, per_round=40)


def test_a_ratio_paired_by_round_sees_through_background_that_moves_both_sides() -> None:
    small = [150.0, 210.0, 170.0, 260.0, 190.0, 230.0]  # the machine's background, round by round
    large = [x * 1.04 for x in small]
    lo, hi = ratio_ci(large, small)
    assert lo == pytest.approx(1.04) and hi == pytest.approx(1.04)
    # unpaired, the same figures would leave anything from ~0.8 to ~1.3 possible
    rng = random.Random(1)
    q = sorted(
        statistics.median(rng.choices(large, k=6)) / statistics.median(rng.choices(small, k=6)) for _ in range(500)
    )
    assert q[12] < 0.9 and q[-13] > 1.2


def test_slow_rounds_on_one_side_widen_the_ratio_interval_and_the_verdict_says_so() -> None:
    small = [200.0] * 6
    large = [204.0, 400.0, 204.0, 204.0, 400.0, 204.0]  # two rounds the machine was busy
    lo, hi = ratio_ci(large, small)
    assert lo == pytest.approx(1.02) and hi > 1.4  # the median of rounds says 1.02; it could be far more
    v = {"p50_us": 1.02, "p50_us_ci": [lo, hi], "p99_us": 1.0, "p99_us_ci": [0.95, 1.05]}
    assert verdict(v, TARGETS["large / small"]) == "p50 ≤ 1.1: at the median, not across the interval; p99 ≤ 1.1: held"
    missed = verdict({"p50_us": 0.93, "p99_us": 0.7}, TARGETS["nriplugin / Go"])
    assert missed == "p50 ≤ 0.9: missed (0.930); p99 ≤ 0.8: held"
    assert verdict(v, None) == "-"


def test_ratio_rounds_must_pair() -> None:
    with pytest.raises(ValueError, match="two or more paired rounds"):
        ratio_ci([1.0, 2.0, 3.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="two or more paired rounds"):
        ratio_ci([1.0], [1.0])


def test_the_scale_table_names_the_hook_failures_it_counts() -> None:
    from bench.scale import errors_cell, failures_by

    scraped = {
        'nriplugin_hook_failures_total{event="synchronize",reason="over_budget",policy="fail-open"}': 1.0,
        'nriplugin_hook_failures_total{event="create_container",reason="error",policy="fail-open"}': 0.0,
        'nriplugin_hook_failures_total{event="create_container",reason="error",policy="fail-closed"}': 2.0,
        "nriplugin_hooks_total": 7.0,
    }
    by = failures_by(scraped)
    assert by == {"synchronize over_budget": 1.0, "create_container error": 2.0}
    assert errors_cell({"errors": 1, "hook_failures": 3.0, "hook_failures_by": by}) == (
        "4 (create_container error: 2, synchronize over_budget: 1)"
    )
    assert errors_cell({"errors": 0, "hook_failures": 0.0, "hook_failures_by": {}}) == "0"
