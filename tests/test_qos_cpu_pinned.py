"""CPUSuppress and CPUBurst pinned at the documented examples and at every boundary: the
deadband and hold (inclusive or not), the reversal back-off and its cap, the floor, the idle
thresholds, the burst's duration and cooldown."""

from __future__ import annotations

import pytest

from nriplugin.kernel.cgroup import CFS_PERIOD_US, MIN_QUOTA_US
from nriplugin.qos.cpu_burst import Burster, burst_ratio, wants_burst
from nriplugin.qos.cpu_suppress import Limiter, be_target, cpuset_size, quota_us
from nriplugin.qos.strategy import Capacity


def cap(total: float, ls_request: float, reserved: float, non_be: float = 0.0) -> Capacity:
    return Capacity(total, reserved, ls_request, ls_usage=0.0, be_usage=0.0, non_be_usage=non_be)


# --- be_target ------------------------------------------------------------------------------


def test_the_documented_example_and_its_reason() -> None:
    """16 cores, LS requesting 6, 1 reserved: (16 - 6 - 1) x 0.8 = 7.2 at MEDIUM, x 0.3 = 2.7."""
    t = be_target(cap(16, 6, 1), 0.8, "MEDIUM")
    assert t.cores == pytest.approx(7.2)
    assert t.why == "MEDIUM: (16 total - 6.00 LS request - 1 reserved) x 0.8"
    assert be_target(cap(16, 6, 1), 0.3, "CRITICAL").cores == pytest.approx(2.7)


def test_bursts_come_out_of_bes_share() -> None:
    t = be_target(cap(16, 6, 1), 0.5, "HIGH", burst_granted=2.0)
    assert t.cores == pytest.approx(3.5)
    assert t.why == "HIGH: (16 total - 6.00 LS request - 1 reserved - 2.00 LS burst) x 0.5"
    t = be_target(cap(4, 2, 0), 1.0, "LOW", burst_granted=3.0)  # more burst than BE's share: 0
    assert t.cores == 0.0


def test_the_usage_budget_wins_only_when_tighter() -> None:
    t = be_target(cap(16, 6, 1, non_be=4.0), 0.8, "MEDIUM", usage_threshold_percent=65)
    assert t.cores == pytest.approx(6.4)  # 16 x 0.65 - 4 = 6.4 < 7.2
    assert t.why == "16 x 65% - 4.00 used by LS and the system (the level's bound, 7.20, is looser)"
    t = be_target(cap(10, 2, 0, non_be=4.0), 0.5, "HIGH", usage_threshold_percent=80)
    assert t.cores == 4.0  # both bounds at 4: the level's, and its reason, stand
    assert t.why.startswith("HIGH: ")
    t = be_target(cap(16, 6, 1, non_be=15.0), 0.8, "MEDIUM", usage_threshold_percent=0)
    assert t.cores == pytest.approx(7.2)  # threshold 0: no usage budget


def test_the_floor_is_taken_only_below_it() -> None:
    t = be_target(cap(2, 1, 0, non_be=2.0), 0.1, "EMERGENCY", usage_threshold_percent=65, floor=0.1)
    assert t.cores == 0.1
    assert t.why.endswith("; floor 0.1 (BE is never starved to zero)")
    t = be_target(cap(2, 1, 0), 0.1, "EMERGENCY", floor=0.1)  # exactly at the floor
    assert t.cores == pytest.approx(0.1)
    assert "floor" not in t.why
    t = be_target(cap(2, 1, 0), 0.5, "HIGH")  # no floor: 0 is the default
    assert t.cores == 0.5


def test_quota_and_cpuset_size() -> None:
    assert (CFS_PERIOD_US, MIN_QUOTA_US) == (100_000, 1_000)
    assert quota_us(1.5) == 150_000
    assert quota_us(0.01) == 1000 and quota_us(0.0101) == 1010
    assert quota_us(0.005) == 1000 and quota_us(-1) == 1000
    assert [cpuset_size(c) for c in (0.0, 0.3, 1.0, 1.0 + 1e-12, 1.01, 2.5, 3.0)] == [1, 1, 1, 1, 2, 3, 3]


# --- Limiter --------------------------------------------------------------------------------


def test_limiter_defaults_are_the_policys() -> None:
    lim = Limiter()
    assert (lim.deadband, lim.relax_hold, lim.max_relax_per_minute, lim.current, lim.writes) == (0.2, 2.0, 4, None, 0)


def test_the_deadband_is_exclusive_both_ways() -> None:
    lim = Limiter(deadband=0.25, relax_hold=1.0)
    assert lim.step(0.0, 2.0) == 2.0
    assert lim.step(1.0, 1.75) is None  # exactly the deadband below: not a cut
    assert lim.step(2.0, 2.25) is None  # exactly the deadband above: no hold begins
    assert lim.step(3.5, 2.25) is None
    assert lim.step(4.0, 1.74) == 1.74
    assert (lim.current, lim.writes) == (1.74, 2)


def test_the_hold_is_inclusive_and_a_first_raise_after_the_first_write_is_no_reversal() -> None:
    lim = Limiter(deadband=0.1, relax_hold=3.0, max_relax_per_minute=1)
    lim.step(0.0, 1.0)  # the first write is not a cut
    assert lim.step(10.0, 2.0) is None
    assert lim.step(12.99, 2.0) is None
    assert lim.step(13.0, 2.0) == 2.0  # exactly relax_hold later
    assert lim.hold(True) == 3.0  # no reversal recorded
    lim.step(14.0, 1.0)  # a cut
    assert lim.step(20.0, 2.0) is None
    assert lim.step(23.0, 2.0) == 2.0  # the first reversal of the minute waits relax_hold
    assert lim.hold(True) == 6.0 and lim.hold(False) == 3.0


def test_reversals_double_the_hold_are_capped_per_minute_and_expire_after_60_s() -> None:
    lim = Limiter(deadband=0.1, relax_hold=3.0, max_relax_per_minute=2)
    lim.step(0.0, 2.0)
    assert lim.step(2.0, 1.0) == 1.0  # cut
    assert lim.step(10.0, 3.0) is None  # reversal, hold 3
    assert lim.step(13.0, 2.5) == 2.5  # the lowest target of the hold
    assert lim.step(14.0, 3.0) is None  # not a reversal: plain hold
    assert lim.step(16.99, 3.0) is None
    assert lim.step(17.0, 3.0) == 3.0
    assert lim.step(18.0, 1.0) == 1.0  # cut
    assert lim.step(20.0, 2.0) is None
    assert lim.step(25.99, 2.0) is None  # hold 3 x 2 for the second reversal
    assert lim.step(26.0, 2.0) == 2.0
    assert lim.step(27.0, 1.0) == 1.0  # cut
    assert lim.step(30.0, 2.0) is None
    assert lim.step(41.99, 2.0) is None  # hold 3 x 4
    assert lim.step(42.0, 2.0) is None  # held long enough, but two reversals this minute
    assert lim.step(72.99, 2.0) is None  # the one at 13 is 59.99 s old
    assert lim.step(73.0, 2.0) == 2.0  # 60 s old: forgotten, one reversal left in the minute
    assert lim.writes == 8


def test_the_reversal_hold_is_capped_at_a_minute() -> None:
    lim = Limiter(deadband=0.1, relax_hold=40.0, max_relax_per_minute=5)
    assert lim.hold(True) == 40.0
    lim._relaxed.append(0.0)
    assert lim.hold(True) == 60.0
    assert lim.hold(False) == 40.0


def test_a_hold_whose_lowest_target_is_within_the_deadband_starts_again() -> None:
    lim = Limiter(deadband=0.1, relax_hold=3.0)
    lim.step(0.0, 1.0)
    assert lim.step(1.0, 2.0) is None  # hold begins
    assert lim.step(2.0, 1.05, tighten_only=True) is None  # the fast path saw 1.05: counts
    assert lim.step(4.0, 2.0) is None  # up to 1.05 is within the deadband: the hold starts over at 4
    assert lim.step(6.99, 2.0) is None
    assert lim.step(7.0, 2.0) == 2.0


def test_the_fast_path_cuts_but_never_raises_and_a_return_ends_the_hold() -> None:
    lim = Limiter(deadband=0.1, relax_hold=3.0)
    lim.step(0.0, 1.0)
    assert lim.step(1.0, 5.0, tighten_only=True) is None
    assert lim.step(4.5, 5.0, tighten_only=True) is None  # no hold was begun by the fast path
    assert lim.step(5.0, 5.0) is None  # the hold begins now
    assert lim.step(6.0, 1.0) is None  # back within the deadband: the hold ends
    assert lim.step(7.0, 5.0) is None
    assert lim.step(9.99, 5.0) is None
    assert lim.step(10.0, 5.0) == 5.0
    assert lim.step(11.0, 0.5, tighten_only=True) == 0.5


def test_a_cut_clears_a_hold_and_reset_starts_from_nothing() -> None:
    lim = Limiter(deadband=0.1, relax_hold=3.0)
    lim.step(0.0, 1.0)
    lim.step(1.0, 2.0)  # hold begins
    assert lim.step(2.0, 0.5) == 0.5  # cut: the hold is gone
    assert lim.step(3.9, 2.0) is None  # a new hold begins at 3.9, not at 1
    assert lim.step(6.89, 2.0) is None
    assert lim.step(6.9, 2.0) == 2.0
    lim.reset()
    assert lim.current is None
    assert lim.step(7.0, 3.0) == 3.0  # written at once, as a first limit
    assert lim.step(8.0, 4.0) is None  # and the next raise is no reversal: hold 3
    assert lim.step(11.0, 4.0) == 4.0


def test_reset_forgets_the_reversals() -> None:
    lim = Limiter(deadband=0.1, relax_hold=1.0)
    lim.step(0.0, 2.0)
    lim.step(1.0, 1.0)
    lim.step(2.0, 2.0)
    assert lim.step(3.0, 2.0) == 2.0
    assert lim.hold(True) == 2.0
    lim.reset()
    assert lim.hold(True) == 1.0


# --- CPUBurst -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("idle", "ratio"),
    [(0.0, 1.0), (0.1999, 1.0), (0.2, 1.3), (0.3, 1.3), (0.3001, 1.5), (1.0, 1.5)],
)
def test_burst_ratio_thresholds(idle: float, ratio: float) -> None:
    """Above fullBurstNodeCPUIdle (exclusive) the full ratio; from minNodeCPUIdle (inclusive)
    the partial one."""
    assert burst_ratio(idle) == ratio


def test_burst_ratio_takes_its_settings() -> None:
    assert burst_ratio(0.45, full=2.0, partial=1.2, min_idle=0.1, full_idle=0.4) == 2.0
    assert burst_ratio(0.4, full=2.0, partial=1.2, min_idle=0.1, full_idle=0.4) == 1.2
    assert burst_ratio(0.1, full=2.0, partial=1.2, min_idle=0.1, full_idle=0.4) == 1.2
    assert burst_ratio(0.09, full=2.0, partial=1.2, min_idle=0.1, full_idle=0.4) == 1.0


def test_wants_burst_at_its_limit() -> None:
    assert wants_burst(0.0, 0.9, 1.0)  # 90 % of the limit: inclusive
    assert not wants_burst(0.0, 0.8999, 1.0)
    assert not wants_burst(0.1, 0.0, 1.0)  # a tenth of the periods: exclusive
    assert wants_burst(0.1001, 0.0, 1.0)
    assert not wants_burst(0.5, 5.0, 0.0)  # no limit: nothing to exceed
    assert not wants_burst(0.5, 5.0, -1.0)


def test_burster_defaults() -> None:
    b = Burster()
    assert (b.duration, b.cooldown, b.grants, b.bursting()) == (10.0, 30.0, 0, {})


def test_a_burst_lasts_exactly_its_duration_then_cools_down() -> None:
    b = Burster(duration=10.0, cooldown=30.0)
    c = b.step(0.0, "k", True, 1.5)
    assert c is not None and (c.key, c.ratio) == ("k", 1.5)
    assert c.why == "at its limit with the node idle: quota x1.5 for at most 10 s"
    assert b.grants == 1 and b.bursting() == {"k": 1.5}
    assert b.step(9.99, "k", True, 1.5) is None
    c = b.step(10.0, "k", True, 1.5)
    assert c is not None and c.ratio == 1.0
    assert c.why == "burst over (at most the burst duration); cooldown 30 s"
    assert b.bursting() == {}
    assert b.step(39.99, "k", True, 1.5) is None  # cooling down
    c = b.step(40.0, "k", True, 1.3)  # the cooldown's end is inclusive
    assert c is not None and c.ratio == 1.3 and b.grants == 2


def test_a_burst_ends_early_when_not_needed_or_the_idle_cpu_is_gone() -> None:
    b = Burster(duration=10.0, cooldown=5.0)
    b.step(0.0, "a", True, 1.5)
    c = b.step(1.0, "a", False, 1.5)
    assert c is not None and c.why == "burst over (no longer needed or idle gone); cooldown 5 s"
    b.step(0.0, "b", True, 1.5)
    c = b.step(2.0, "b", True, 1.0)
    assert c is not None and c.ratio == 1.0
    assert b.step(6.99, "b", True, 1.5) is None
    assert b.step(7.0, "b", True, 1.5) is not None


def test_no_burst_without_need_or_ratio() -> None:
    b = Burster()
    assert b.step(0.0, "k", False, 1.5) is None
    assert b.step(0.0, "k", True, 1.0) is None
    assert b.grants == 0
    assert b.step(0.0, "k", True, 1.01) is not None


def test_burster_forgets_containers_gone() -> None:
    b = Burster(cooldown=100.0)
    b.step(0.0, "a", True, 1.5)
    b.step(0.0, "b", True, 1.5)
    b.step(1.0, "b", False, 1.5)  # b cooling down until 101
    b.forget({"a"})
    assert b.bursting() == {"a": 1.5}
    assert b.step(2.0, "b", True, 1.5) is not None  # b forgotten: no cooldown left
