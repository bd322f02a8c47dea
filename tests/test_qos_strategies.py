"""The CPU strategies against worked examples (suppression, burst, the two together), and the
limiter that keeps a stationary load from moving BE's limit."""

from __future__ import annotations

import pytest

from nriplugin.qos.cpu_burst import Burster, burst_ratio, wants_burst
from nriplugin.qos.cpu_suppress import Limiter, be_target, quota_us
from nriplugin.qos.strategy import Capacity


def cap(total: float, ls_request: float, reserved: float, non_be: float = 0.0) -> Capacity:
    return Capacity(total, reserved, ls_request, ls_usage=0.0, be_usage=0.0, non_be_usage=non_be)


def test_cpu_suppress_examples() -> None:
    # 16 cores, LS request 6, system 1: 9 for BE; score 50 (MEDIUM, 0.8) and 80 (CRITICAL, 0.3)
    assert be_target(cap(16, 6, 1), 0.8, "MEDIUM").cores == pytest.approx(7.2)
    assert be_target(cap(16, 6, 1), 0.3, "CRITICAL").cores == pytest.approx(2.7)
    # the 32-core production timeline: 8 LS pods x 2 CPU, system 2 -> 14, then 11.2, 4.2, 11.2
    timeline = [
        be_target(cap(32, 16, 2), r, lvl).cores
        for r, lvl in ((1.0, "LOW"), (0.8, "MEDIUM"), (0.3, "CRITICAL"), (0.8, "MEDIUM"))
    ]
    assert timeline == pytest.approx([14, 11.2, 4.2, 11.2])


def test_coordination_example() -> None:
    """LS first, BE within what is left: 16 CPU, system 1, LS limit 4 bursts to 5; BE gets
    (15 - 4 - 1) x 0.8 = 8; the sum (5 + 8 = 13) stays within the 15 schedulable CPUs."""
    c = cap(16, 4, 1)
    be = be_target(c, 0.8, "MEDIUM", burst_granted=1.0).cores
    assert be == pytest.approx(8.0)
    assert 4 + 1 + be <= c.schedulable


def test_usage_budget_reacts_to_what_ls_uses() -> None:
    """Koordinator's threshold budget: on 2 cores at 65 %, an idle LS leaves BE 1.3 cores (more
    than the level's request-based bound, so that one decides); a busy LS (one core) cuts BE to
    0.3 at once, whatever the level."""
    idle = be_target(cap(2, 1, 0, non_be=0.0), 1.0, "LOW", usage_threshold_percent=65)
    assert idle.cores == pytest.approx(1.0) and "x 1" in idle.why
    busy = be_target(cap(2, 1, 0, non_be=1.0), 1.0, "LOW", usage_threshold_percent=65)
    assert busy.cores == pytest.approx(0.3) and "65%" in busy.why
    starved = be_target(cap(2, 1, 0, non_be=2.0), 0.1, "EMERGENCY", usage_threshold_percent=65, floor=0.1)
    assert starved.cores == pytest.approx(0.1) and "floor" in starved.why
    assert quota_us(0.3) == 30000 and quota_us(0.0) == 1000


def test_limiter_tightens_at_once_relaxes_after_a_hold_and_ignores_noise() -> None:
    lim = Limiter(deadband=0.1, relax_hold=3.0, max_relax_per_minute=2)
    assert lim.step(0.0, 1.0) == 1.0  # the first limit is written
    assert lim.step(0.1, 1.05) is None and lim.step(0.2, 0.95) is None  # noise within the deadband
    assert lim.step(0.3, 0.3) == 0.3  # LS spike: at once
    assert lim.step(0.4, 1.0) is None and lim.step(2.0, 1.0) is None  # looser: held back
    assert lim.step(3.5, 1.0) == 1.0  # after the hold
    # a noisy stationary load over ten minutes: no write at all
    writes = lim.writes
    for i in range(6000):
        assert lim.step(10.0 + i * 0.1, 1.0 + (0.08 if i % 2 else -0.08)) is None
    assert lim.writes == writes
    # rate limit on relaxations: flapping LS (down at once, up after the hold) writes up at most twice a minute
    lim2 = Limiter(deadband=0.1, relax_hold=0.5, max_relax_per_minute=2)
    ups = 0
    lim2.step(0.0, 1.0)
    for k in range(60):
        t = k * 1.0
        lim2.step(t, 0.2)
        if lim2.step(t + 0.6, 1.0) is not None:
            ups += 1
    assert ups <= 2


def test_burst_ratio_by_idle_share() -> None:
    assert burst_ratio(0.5) == 1.5 and burst_ratio(0.31) == 1.5
    assert burst_ratio(0.25) == pytest.approx(1.3) and burst_ratio(0.2) == pytest.approx(1.3)
    assert burst_ratio(0.19) == 1.0
    assert burst_ratio(0.5, full=2.0, min_idle=0.15) == 2.0  # latency-first profile
    assert burst_ratio(0.16, full=2.0, min_idle=0.15) == 1.3
    assert wants_burst(0.5, 1.0, 2.0) and wants_burst(0.0, 1.9, 2.0) and not wants_burst(0.0, 1.0, 2.0)
    assert not wants_burst(1.0, 2.0, 0.0)  # no limit: nothing to burst past


def test_burst_lasts_at_most_its_duration_then_cools_down() -> None:
    b = Burster(duration=10.0, cooldown=30.0)
    g = b.step(0.0, "c1", wants=True, ratio=1.5)
    assert g is not None and g.ratio == 1.5 and b.bursting() == {"c1": 1.5}
    assert b.step(5.0, "c1", wants=True, ratio=1.5) is None  # still bursting
    end = b.step(10.0, "c1", wants=True, ratio=1.5)
    assert end is not None and end.ratio == 1.0 and "duration" in end.why
    assert b.step(20.0, "c1", wants=True, ratio=1.5) is None  # cooling down
    again = b.step(40.0, "c1", wants=True, ratio=1.5)
    assert again is not None and again.ratio == 1.5
    off = b.step(41.0, "c1", wants=True, ratio=1.0)  # the node got busy: withdrawn
    assert off is not None and off.ratio == 1.0
    assert b.step(42.0, "c2", wants=True, ratio=1.0) is None  # no idle CPU: no burst
    b.forget({"c2"})
    assert "c1" not in b._states


def test_a_raise_goes_only_as_high_as_every_sample_of_its_hold_allowed() -> None:
    lim = Limiter(deadband=0.1, relax_hold=2.0, max_relax_per_minute=1)
    lim.step(0.0, 1.0)
    assert lim.step(1.0, 0.3) == 0.3  # a spike: cut
    assert lim.step(1.5, 0.8) is None  # held
    assert lim.step(2.0, 0.31, tighten_only=True) is None  # a 50 ms sample at LS's peak...
    assert lim.step(3.6, 0.8) is None  # ...so the hold starts again instead of raising
    assert lim.step(5.7, 0.8) == 0.8  # a clean hold: up (a reversal, one of one a minute)
    assert lim.step(6.0, 1.0) is None
    assert lim.step(8.1, 1.0) == 1.0  # further up on the way back: not a reversal, not limited
    assert lim.step(9.0, 0.3) == 0.3  # another spike
    assert lim.step(12.0, 1.0) is None and lim.step(20.0, 1.0) is None  # a second reversal: held
    assert lim.step(66.0, 1.0) == 1.0  # a minute after the first


def test_a_noisy_load_seen_by_the_fast_path_holds_be_where_its_peaks_put_it() -> None:
    """LS busy and idle in 100-300 ms chunks: fast samples see the peaks, full rounds the
    average. Over ten minutes: one cut, no raise, no flapping."""
    import random

    rnd = random.Random(1)
    lim = Limiter(deadband=0.2, relax_hold=2.0, max_relax_per_minute=2)
    lim.step(0.0, 1.0)
    t, busy, writes = 0.0, False, []
    while t < 600:
        t += 0.05
        if rnd.random() < 0.25:
            busy = not busy
        fast = 0.3 if busy else 1.3  # 2 x 65 % minus LS at a full core, or idle
        if (w := lim.step(t, fast, tighten_only=True)) is not None:
            writes.append(w)
        if abs(t - round(t)) < 1e-6 and (w := lim.step(t, 0.8)) is not None:  # a round: LS at half a core
            writes.append(w)
    assert writes == [0.3]


def test_a_raise_after_a_cut_waits_longer_the_more_the_load_flaps() -> None:
    """LS load every half minute: BE back after 2 s, then 4 s (one reversal in the last
    minute); a load flapping every 5 s waits 2, 4, 8, 16 s... and writes ever less."""
    lim = Limiter(deadband=0.1, relax_hold=2.0, max_relax_per_minute=4)

    def give_back(start: float) -> float:
        t = start
        while lim.step(t, 1.0) is None:
            t += 0.5
        return t - start

    lim.step(0.0, 1.0)
    lim.step(1.0, 0.3)
    assert give_back(2.0) == 2.0
    lim.step(31.0, 0.3)
    assert give_back(32.0) == 4.0
    lim.step(70.0, 0.3)  # the first reversal is over a minute old by the end of this hold
    assert give_back(71.0) == 4.0
    flappy = Limiter(deadband=0.1, relax_hold=2.0, max_relax_per_minute=4)
    flappy.step(0.0, 1.0)
    t, holds = 0.0, []
    for _ in range(4):
        t += 1.0
        flappy.step(t, 0.3)
        start = t
        while flappy.step(t, 1.0) is None:
            t += 0.5
        holds.append(t - start)
    assert holds == [2.0, 4.0, 8.0, 16.0]
