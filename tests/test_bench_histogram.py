"""The hook-latency bench's comparison of the SLO histogram with the runtime's own timings:
the share answered within a bound must be counted exactly on both sides."""

from __future__ import annotations

import pytest

from bench.hook_latency import WITHIN, within
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
