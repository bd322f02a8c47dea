"""QoS decisions pinned at their worked examples and boundaries (docs/qos-manager.md): which side
of a threshold is inclusive, where floors and caps bite, what an empty or odd input gives. The
kept mutation score (tools/mutation.py) runs these against every mutant of nriplugin/qos."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import cast

import pytest

from nriplugin.policy.model import Policy
from nriplugin.qos.cpu_suppress import CPUSuppressStrategy
from nriplugin.qos.history import Counters
from nriplugin.qos.levels import CPU_THRESHOLDS, MEMORY_THRESHOLDS, Assessor, Level, Thresholds, thresholds_of
from nriplugin.qos.manager import _be_parent
from nriplugin.qos.node_resource import (
    FastWindow,
    NodeQOSResourceStrategy,
    Rate,
    SystemQOSResourceStrategy,
    capacity,
)
from nriplugin.qos.sample import ClassUsage, NodeSample
from nriplugin.qos.scores import CpuInputs, MemoryInputs, cpu_inputs, cpu_pressure, memory_inputs, memory_pressure
from nriplugin.qos.strategy import Capacity, FastUsage, Host, Round, Strategy
from nriplugin.qos.trends import Ewma, Trends, WindowSlope, ls_rss

# --- levels ---------------------------------------------------------------------------------


def test_thresholds_defaults_and_named_tables() -> None:
    assert Thresholds().boundaries == (40.0, 60.0, 75.0, 90.0)
    assert CPU_THRESHOLDS.boundaries == (40, 60, 75, 90)
    assert MEMORY_THRESHOLDS.boundaries == (50, 70, 80, 90)


@pytest.mark.parametrize(
    ("score", "level"),
    [
        (-1, Level.LOW),
        (0, Level.LOW),
        (39.999, Level.LOW),
        (40, Level.MEDIUM),  # a boundary belongs to the level above it
        (59.999, Level.MEDIUM),
        (60, Level.HIGH),
        (74.999, Level.HIGH),
        (75, Level.CRITICAL),
        (89.999, Level.CRITICAL),
        (90, Level.EMERGENCY),
        (100, Level.EMERGENCY),
    ],
)
def test_a_boundary_is_inclusive(score: float, level: Level) -> None:
    assert CPU_THRESHOLDS.level(score) is level


def test_thresholds_may_touch_0_and_100_but_must_increase() -> None:
    assert Thresholds(0, 1, 2, 100).boundaries == (0, 1, 2, 100)
    for bad in [(-0.1, 60, 75, 90), (40, 60, 75, 100.1), (40, 40, 75, 90), (40, 60, 59, 90), (40, 60, 75, 75)]:
        with pytest.raises(ValueError, match="must increase within 0-100"):
            Thresholds(*bad)


def test_assessor_defaults() -> None:
    a = Assessor()
    assert (a.thresholds, a.hysteresis, a.fall_time) == (CPU_THRESHOLDS, 5.0, 5.0)
    assert (a.score, a.level) == (0.0, Level.LOW)


def test_assessor_from_config_reads_every_field() -> None:
    cfg = SimpleNamespace(low=10, medium=20, high=30, critical=40, hysteresis=2.5, fallTime=7.0)
    a = Assessor.from_config(cfg)
    assert a.thresholds == Thresholds(10, 20, 30, 40) == thresholds_of(cfg)
    assert (a.hysteresis, a.fall_time) == (2.5, 7.0)


def test_configure_accepts_zero_refuses_negative_and_keeps_the_state() -> None:
    a = Assessor(fall_time=0)
    a.update(0, 65)
    a.configure(MEMORY_THRESHOLDS, 0, 0)
    assert (a.score, a.level, a.hysteresis, a.fall_time) == (65, Level.HIGH, 0, 0)
    assert a.thresholds == MEMORY_THRESHOLDS
    for h, f in [(-0.1, 5), (5, -0.1)]:
        with pytest.raises(ValueError, match="must be >= 0"):
            a.configure(CPU_THRESHOLDS, h, f)


def test_raw_scores_are_clamped_and_reported() -> None:
    a = Assessor()
    r = a.update(1.0, 150)
    assert (r.t, r.raw, r.score, r.level, r.changed) == (1.0, 100.0, 100.0, Level.EMERGENCY, True)
    a = Assessor(fall_time=0)
    r = a.update(2.0, -20)
    assert (r.raw, r.score, r.level, r.changed) == (0.0, 0.0, Level.LOW, False)


def test_the_fall_follows_the_documented_exponential() -> None:
    """score = raw + (previous - raw) * e^(-dt / fallTime)."""
    a = Assessor(fall_time=5.0)
    a.update(0.0, 80)
    r = a.update(5.0, 20)
    assert r.score == pytest.approx(20 + 60 * math.exp(-1))
    assert (r.level, r.changed) == (Level.MEDIUM, True)  # from CRITICAL: 42.07 + 5 is MEDIUM's
    r = a.update(15.0, 20)
    assert r.score == pytest.approx(20 + (20 + 60 * math.exp(-1) - 20) * math.exp(-2))


def test_equal_raw_is_taken_as_is_and_fall_time_zero_follows_at_once() -> None:
    a = Assessor(fall_time=5.0)
    a.update(0.0, 50)
    assert a.update(1.0, 50).score == 50
    b = Assessor(fall_time=0)
    b.update(0.0, 80)
    assert b.update(0.1, 10).score == 10


def test_an_earlier_time_decays_nothing_and_does_not_move_the_clock_back() -> None:
    a = Assessor(fall_time=5.0)
    a.update(0.0, 80)
    s1 = a.update(5.0, 0).score
    assert a.update(3.0, 0).score == pytest.approx(s1)  # earlier: no decay
    assert a.update(5.0, 0).score == pytest.approx(s1)  # the clock stayed at 5, not 3
    assert a.update(10.0, 0).score == pytest.approx(s1 * math.exp(-1))


def test_the_first_update_takes_the_raw_score_even_below_zero_state() -> None:
    a = Assessor(fall_time=5.0)
    assert a.update(100.0, 30).score == 30
    assert a.update(101.0, 10).score == pytest.approx(10 + 20 * math.exp(-0.2))


@pytest.mark.parametrize(
    ("low", "level"),
    [
        (56, Level.HIGH),
        (55, Level.HIGH),
        (54.99, Level.MEDIUM),
        (35.01, Level.MEDIUM),
        (35, Level.MEDIUM),
        (34.9, Level.LOW),
    ],
)
def test_a_level_is_left_only_more_than_the_hysteresis_below_its_boundary(low: float, level: Level) -> None:
    """HIGH starts at 60: at 55 (exactly 5 below) it holds, below 55 it falls to MEDIUM; from
    HIGH straight down to 35 the score is 5 below MEDIUM's 40 boundary, so MEDIUM holds."""
    a = Assessor(fall_time=0)
    assert a.update(0, 60).level is Level.HIGH
    r = a.update(1, low)
    assert r.level is level
    assert r.changed == (level is not Level.HIGH)


def test_a_level_is_entered_at_its_boundary() -> None:
    a = Assessor(fall_time=0)
    assert a.update(0, 39.99).level is Level.LOW
    r = a.update(1, 40)
    assert (r.level, r.changed) == (Level.MEDIUM, True)


def test_a_wide_hysteresis_never_lifts_the_level() -> None:
    a = Assessor(hysteresis=30, fall_time=0)
    assert a.update(0, 45).level is Level.MEDIUM
    r = a.update(1, 39)  # 39 + 30 = 69 is HIGH's score, but the level stays MEDIUM
    assert (r.level, r.changed) == (Level.MEDIUM, False)
    r = a.update(2, 9)
    assert (r.level, r.changed) == (Level.LOW, True)


def test_zero_hysteresis_leaves_at_the_boundary() -> None:
    a = Assessor(hysteresis=0, fall_time=0)
    a.update(0, 60)
    assert a.update(1, 59.99).level is Level.MEDIUM


# --- history --------------------------------------------------------------------------------


def test_counters_deltas_and_their_refusals() -> None:
    c = Counters()
    assert len(c) == 0 and "a" not in c
    assert c.advance("a", 1.0, (10, 5)) is None  # first reading
    assert "a" in c and len(c) == 1
    assert c.advance("a", 3.0, (16, 5)) == (2.0, (6, 0))  # 0 increase is a delta
    assert c.advance("a", 3.0, (20, 5)) is None  # same time
    assert c.advance("a", 2.0, (30, 5)) is None  # earlier
    assert c.advance("a", 4.0, (29, 6)) is None  # went backwards: the new base
    assert c.advance("a", 5.0, (30, 6)) == (1.0, (1, 0))
    assert c.advance("a", 6.0, (31,)) is None  # another shape
    assert c.advance("a", 7.0, (33,)) == (1.0, (2,))
    assert c.advance("e", 0.0, ()) is None
    assert c.advance("e", 1.5, ()) == (1.5, ())  # no counters: a delta of nothing


def test_counters_retain_forgets_the_others() -> None:
    c = Counters()
    for k in "abc":
        c.advance(k, 0.0, (1,))
    assert c.retain({"b"}) == 2
    assert len(c) == 1 and "b" in c and "a" not in c
    assert c.retain({"b"}) == 0


# --- sample ---------------------------------------------------------------------------------


def test_usage_of_a_class_not_seen_is_empty() -> None:
    s = NodeSample(t=0, interval=1, ncpu=2, cpu_busy_cores=0, load1=0, by_class={"BE": ClassUsage(containers=3)})
    assert s.usage("BE").containers == 3
    assert s.usage("LS") == ClassUsage()


# --- scores ---------------------------------------------------------------------------------


def cpu(**kw: float) -> CpuInputs:
    base: dict[str, float] = dict(
        ncpu=8,
        node_usage_cores=0.0,
        be_usage_cores=0.0,
        ls_usage_cores=0.0,
        ls_request_cores=0.0,
        trend_pct_per_min=0.0,
        load1=0.0,
    )
    base.update(kw)
    return CpuInputs(**base)  # type: ignore[arg-type]


def test_worked_example_a_is_59() -> None:
    s = cpu_pressure(cpu(node_usage_cores=4, ls_usage_cores=3.2, ls_request_cores=4, trend_pct_per_min=0.5, load1=4))
    assert (s.node, s.ls, s.trend, s.load) == pytest.approx((20, 24, 10, 5))
    assert s.total == pytest.approx(59)


def test_worked_example_b_is_capped_at_100() -> None:
    s = cpu_pressure(cpu(node_usage_cores=6.8, ls_usage_cores=6, ls_request_cores=4, trend_pct_per_min=2, load1=12))
    assert (s.node, s.ls, s.trend, s.load) == pytest.approx((34, 45, 20, 15))
    assert s.total == 100


def test_cpu_terms_cap_each() -> None:
    s = cpu_pressure(cpu(node_usage_cores=12, ls_usage_cores=9, ls_request_cores=3, trend_pct_per_min=5, load1=40))
    assert (s.node, s.ls, s.trend, s.load, s.total) == (40.0, 60.0, 20.0, 20.0, 100.0)
    s = cpu_pressure(cpu(ls_usage_cores=6, ls_request_cores=3, trend_pct_per_min=1, load1=16))
    assert (s.ls, s.trend, s.load) == (60.0, 20.0, 20.0)  # exactly at each cap


def test_cpu_terms_just_below_their_caps_are_linear() -> None:
    s = cpu_pressure(
        cpu(node_usage_cores=7.6, ls_usage_cores=5.7, ls_request_cores=3, trend_pct_per_min=0.9, load1=15.2)
    )
    assert (s.node, s.ls, s.trend, s.load) == pytest.approx((38, 57, 18, 19))
    assert s.total == pytest.approx(100)
    s = cpu_pressure(cpu(node_usage_cores=1, ls_usage_cores=1, ls_request_cores=2, trend_pct_per_min=0.1, load1=2))
    assert (s.node, s.ls, s.trend, s.load) == pytest.approx((5, 15, 2, 2.5))
    assert s.total == pytest.approx(24.5)


def test_cpu_guards_no_cpus_no_request_and_non_finite() -> None:
    for n in (0, -2):
        s = cpu_pressure(cpu(ncpu=n, node_usage_cores=3, load1=3, ls_usage_cores=1, ls_request_cores=1))
        assert (s.node, s.load, s.ls) == (0.0, 0.0, 30.0)
    for req in (0.0, -1.0, math.nan):
        assert cpu_pressure(cpu(ls_usage_cores=2, ls_request_cores=req)).ls == 0.0
    s = cpu_pressure(
        cpu(
            node_usage_cores=math.nan,
            ls_usage_cores=math.inf,
            ls_request_cores=1,
            trend_pct_per_min=math.nan,
            load1=math.nan,
        )
    )
    assert (s.node, s.ls, s.trend, s.load, s.total) == (0.0, 0.0, 0.0, 0.0, 0.0)
    s = cpu_pressure(cpu(node_usage_cores=-4, ls_usage_cores=-1, ls_request_cores=1, trend_pct_per_min=-3, load1=-8))
    assert (s.node, s.ls, s.trend, s.load, s.total) == (0.0, 0.0, 0.0, 0.0, 0.0)


def test_be_is_left_out_of_node_trend_and_load() -> None:
    s = cpu_pressure(
        cpu(node_usage_cores=6, be_usage_cores=2, trend_pct_per_min=1.5, be_trend_pct_per_min=1.0, load1=6)
    )
    # node (6-2)/8 = 50 % -> 20; trend 1.5-1 = 0.5 -> 10; load (6-2)/8 -> 5 (BE load = BE cores)
    assert (s.node, s.trend, s.load) == pytest.approx((20, 10, 5))
    s = cpu_pressure(cpu(node_usage_cores=6, be_usage_cores=2, load1=6, be_load=1.0))
    assert s.load == pytest.approx(6.25)  # be_load, not BE's cores, is taken out of load1
    s = cpu_pressure(cpu(node_usage_cores=1, be_usage_cores=2, load1=1, be_load=3.0))
    assert (s.node, s.load) == (0.0, 0.0)  # never below 0
    s = cpu_pressure(cpu(node_usage_cores=4, be_usage_cores=-2, load1=4, be_load=-1.0))
    assert (s.node, s.load) == pytest.approx((20, 5))  # a negative BE figure takes nothing off
    s = cpu_pressure(
        cpu(node_usage_cores=4, be_usage_cores=math.nan, load1=4, be_load=math.nan, be_trend_pct_per_min=math.nan)
    )
    assert (s.node, s.load) == pytest.approx((20, 5))
    assert cpu_pressure(cpu(be_trend_pct_per_min=-0.5)).trend == pytest.approx(10)  # BE falling: non-BE rising


def test_cpu_score_terms_are_named() -> None:
    s = cpu_pressure(cpu(node_usage_cores=4))
    assert s.terms == {"node": 20.0, "ls": 0.0, "trend": 0.0, "load": 0.0}


def mem(**kw: float) -> MemoryInputs:
    base: dict[str, float] = dict(
        mem_total=1000,
        mem_available=1000,
        ls_rss_growth_pct_per_min=0.0,
        pgscan_direct=0,
        pgscan_kswapd=0,
        swap_total=0,
        swap_free=0,
    )
    base.update(kw)
    return MemoryInputs(**base)  # type: ignore[arg-type]


def test_memory_terms_follow_the_formula() -> None:
    s = memory_pressure(
        mem(
            mem_available=300,
            ls_rss_growth_pct_per_min=4,
            pgscan_direct=5,
            pgscan_kswapd=10,
            swap_total=100,
            swap_free=40,
        )
    )
    assert (s.used, s.growth, s.reclaim, s.swap) == pytest.approx((24.5, 5.0, 1.0, 12.0))
    assert s.total == pytest.approx(42.5)
    assert s.terms == {"used": s.used, "growth": s.growth, "reclaim": s.reclaim, "swap": s.swap}


def test_memory_terms_cap_and_floor() -> None:
    s = memory_pressure(
        mem(
            mem_available=0, ls_rss_growth_pct_per_min=20, pgscan_direct=10, pgscan_kswapd=1, swap_total=10, swap_free=0
        )
    )
    assert (s.used, s.growth, s.reclaim, s.swap, s.total) == pytest.approx((35, 25, 20, 20, 100))
    s = memory_pressure(
        mem(
            mem_available=0,
            ls_rss_growth_pct_per_min=30,
            pgscan_direct=50,
            pgscan_kswapd=1,
            swap_total=10,
            swap_free=-5,
        )
    )
    assert (s.growth, s.reclaim, s.swap, s.total) == pytest.approx((25, 20, 20, 100))
    s = memory_pressure(mem(mem_available=2000, ls_rss_growth_pct_per_min=-3, swap_total=10, swap_free=20))
    assert (s.used, s.growth, s.swap, s.total) == (0.0, 0.0, 0.0, 0.0)
    s = memory_pressure(mem(ls_rss_growth_pct_per_min=19, pgscan_direct=9, pgscan_kswapd=1))
    assert (s.growth, s.reclaim) == pytest.approx((23.75, 18))


def test_memory_guards() -> None:
    s = memory_pressure(mem(mem_total=0, mem_available=0, ls_rss_growth_pct_per_min=math.nan))
    assert (s.used, s.growth, s.reclaim, s.swap, s.total) == (0.0, 0.0, 0.0, 0.0, 0.0)
    assert memory_pressure(mem(pgscan_direct=1)).reclaim == 20  # direct reclaim, kswapd idle: saturated
    assert memory_pressure(mem(pgscan_direct=-5, pgscan_kswapd=-1)).reclaim == 0
    assert memory_pressure(mem(pgscan_direct=-5, pgscan_kswapd=10)).reclaim == 0
    assert memory_pressure(mem(pgscan_direct=0, pgscan_kswapd=10)).reclaim == 0


def sample(t: float, interval: float = 1.0, **kw: object) -> NodeSample:
    base: dict[str, object] = dict(ncpu=4, cpu_busy_cores=0.0, load1=0.0)
    base.update(kw)
    return NodeSample(t=t, interval=interval, **base)  # type: ignore[arg-type]


def classes(be: float = 0.0, rss: int = 0) -> dict[str, ClassUsage]:
    return {
        "LSE": ClassUsage(cpu_cores=0.5, cpu_request_cores=1.0, rss_bytes=rss),
        "LSR": ClassUsage(cpu_cores=0.25, cpu_request_cores=0.5, rss_bytes=2 * rss),
        "LS": ClassUsage(cpu_cores=0.125, cpu_request_cores=0.25, rss_bytes=4 * rss),
        "BE": ClassUsage(cpu_cores=be, cpu_request_cores=9.0, rss_bytes=1000 * rss),
        "system": ClassUsage(cpu_cores=3.0, cpu_request_cores=3.0, rss_bytes=1000 * rss),
    }


def test_cpu_inputs_from_a_sample_and_its_trends() -> None:
    tr = Trends()
    tr.add(sample(0.0, cpu_busy_cores=1.0, by_class=classes(be=0.5)))
    s = sample(60.0, cpu_busy_cores=2.0, load1=3.5, by_class=classes(be=1.5))
    tr.add(s)
    i = cpu_inputs(s, tr)
    assert (i.ncpu, i.node_usage_cores, i.be_usage_cores, i.load1) == (4, 2.0, 1.5, 3.5)
    assert (i.ls_usage_cores, i.ls_request_cores) == (0.875, 1.75)  # LSE + LSR + LS, not BE nor others
    assert i.trend_pct_per_min == pytest.approx(25.0)  # 1 core per minute on 4 CPUs
    assert i.be_trend_pct_per_min == pytest.approx(25.0)
    assert i.be_load == pytest.approx(tr.be_load.value)
    assert i.be_load == pytest.approx(1.5 + (0.5 - 1.5) * math.exp(-1))


def test_cpu_inputs_with_no_cpus_take_one() -> None:
    tr = Trends()
    tr.add(sample(0.0, ncpu=0, cpu_busy_cores=0.0))
    s = sample(60.0, ncpu=0, cpu_busy_cores=0.5)
    tr.add(s)
    assert cpu_inputs(s, tr).trend_pct_per_min == pytest.approx(50.0)
    assert cpu_inputs(s, tr).ncpu == 0


def test_memory_inputs_from_a_sample_and_its_trends() -> None:
    tr = Trends()
    tr.add(sample(0.0, mem_total=10_000, by_class=classes(rss=100)))
    s = sample(
        60.0,
        mem_total=10_000,
        mem_available=4000,
        pgscan_direct=7,
        pgscan_kswapd=9,
        swap_total=50,
        swap_free=20,
        by_class=classes(rss=200),
    )
    tr.add(s)
    i = memory_inputs(s, tr)
    assert (i.mem_total, i.mem_available, i.pgscan_direct, i.pgscan_kswapd, i.swap_total, i.swap_free) == (
        10_000,
        4000,
        7,
        9,
        50,
        20,
    )
    assert i.ls_rss_growth_pct_per_min == pytest.approx(7.0)  # 700 bytes a minute of 10000
    s0 = sample(60.0, mem_total=0)
    assert memory_inputs(s0, tr).ls_rss_growth_pct_per_min == 0.0


# --- trends ---------------------------------------------------------------------------------


def test_slope_per_minute_and_its_guards() -> None:
    w = WindowSlope(300.0)
    assert w.per_minute() == 0.0 and len(w) == 0
    w.add(0.0, 5.0)
    assert w.per_minute() == 0.0 and len(w) == 1
    w.add(30.0, 20.0)
    assert w.per_minute() == pytest.approx(30.0)
    assert len(w) == 2
    e = WindowSlope()
    assert e.window == 300.0
    e.add(10.0, 1.0)
    e.add(10.0, 9.0)
    assert e.per_minute() == 0.0  # no spread in time


def test_slope_leaves_non_finite_values_out() -> None:
    w = WindowSlope(300.0)
    w.add(0.0, 0.0)
    w.add(10.0, math.nan)
    w.add(20.0, math.inf)
    w.add(60.0, 60.0)
    assert len(w) == 2
    assert w.per_minute() == pytest.approx(60.0)


def test_a_non_finite_value_still_expires_old_points() -> None:
    w = WindowSlope(100.0)
    w.add(0.0, 0.0)
    w.add(50.0, 5.0)
    w.add(160.0, math.nan)  # the window now ends at 60: both points are out
    assert len(w) == 0 and w.per_minute() == 0.0


def test_a_point_exactly_window_old_stays() -> None:
    w = WindowSlope(100.0)
    w.add(0.0, 0.0)
    w.add(100.0, 100.0)
    assert len(w) == 2
    assert w.per_minute() == pytest.approx(60.0)
    w.add(100.5, 100.5)
    assert len(w) == 2  # the point at 0 is now 100.5 old
    assert w.per_minute() == pytest.approx(60.0)


def test_expiring_every_point_resets_the_sums() -> None:
    w = WindowSlope(10.0)
    w.add(0.0, 1000.0)
    w.add(5.0, -1000.0)
    w.add(100.0, 3.0)  # both old points out; the sums start over
    w.add(101.0, 4.0)
    assert len(w) == 2
    assert w.per_minute() == pytest.approx(60.0)


def test_the_sums_are_rebased_on_a_long_run() -> None:
    """Past 4 windows from the origin the sums are recomputed about the oldest point kept:
    the slope stays what a recomputation gives."""
    w = WindowSlope(10.0)
    for k in range(200):
        w.add(float(k), 2.0 * k + (k % 3))
    pts = [(float(k), 2.0 * k + (k % 3)) for k in range(189, 200)]
    assert len(w) == len(pts)
    n = len(pts)
    mt = sum(t for t, _ in pts) / n
    mv = sum(v for _, v in pts) / n
    expect = 60 * sum((t - mt) * (v - mv) for t, v in pts) / sum((t - mt) ** 2 for t, _ in pts)
    assert w.per_minute() == pytest.approx(expect, rel=1e-9)


def test_rebase_exactly_at_four_windows() -> None:
    w = WindowSlope(10.0)
    w.add(0.0, 0.0)
    w.add(40.0, 40.0)  # 4 windows after the origin: no rebase, the point at 0 expires
    w.add(41.0, 41.0)
    assert len(w) == 2
    assert w.per_minute() == pytest.approx(60.0)


def test_ewma_follows_the_load_average() -> None:
    e = Ewma()
    assert (e.value, e.time_constant) == (0.0, 60.0)
    e.add(0.0, 2.0)
    assert e.value == 2.0  # the first point is the average
    e.add(60.0, 0.0)
    assert e.value == pytest.approx(2 * math.exp(-1))
    v = e.value
    e.add(30.0, 5.0)  # earlier: dt 0, the old average is kept whole
    assert e.value == pytest.approx(v)
    e.add(90.0, 1.0)  # 60 s after the clock's 30
    assert e.value == pytest.approx(v * math.exp(-1) + 1 - math.exp(-1))
    z = Ewma(0.0)
    z.add(0.0, 3.0)
    z.add(1.0, 7.0)
    assert z.value == 7.0


def test_trends_skip_cpu_of_the_first_round_and_take_held_rss() -> None:
    tr = Trends(window=100.0)
    assert tr.node_cores.window == tr.be_cores.window == tr.rss.window == 100.0
    assert tr.be_load.time_constant == 60.0
    tr.add(sample(0.0, interval=0.0, cpu_busy_cores=3.0, by_class=classes(be=1.0, rss=10)))
    assert (len(tr.node_cores), len(tr.be_cores), len(tr.rss)) == (0, 0, 1)
    assert tr.be_load.value == 0.0
    tr.add(sample(1.0, cpu_busy_cores=3.0, by_class=classes(be=1.0, rss=10), ls_rss_held=500.0))
    assert (len(tr.node_cores), len(tr.be_cores), len(tr.rss)) == (1, 1, 2)
    assert tr.be_load.value == 1.0
    assert tr.rss.per_minute() == pytest.approx(60 * (500 - 70))
    assert ls_rss(sample(0.0, by_class=classes(rss=10))) == 70


# --- node_resource, strategy ----------------------------------------------------------------


def test_capacity_of_a_sample() -> None:
    s = sample(5.0, cpu_busy_cores=3.0, by_class=classes(be=1.25))
    c = capacity(s)
    assert c == Capacity(
        total=4.0, system_reserved=0.0, ls_request=1.75, ls_usage=0.875, be_usage=1.25, non_be_usage=1.75
    )
    assert isinstance(c.total, float) and c.be_measured
    assert capacity(sample(5.0, cpu_busy_cores=1.0, by_class=classes(be=1.5))).non_be_usage == 0.0


def test_capacity_shares_are_never_negative() -> None:
    c = Capacity(total=4, system_reserved=1, ls_request=2, ls_usage=0, be_usage=0, non_be_usage=0)
    assert (c.schedulable, c.for_be()) == (3, 1)
    assert c.for_be(0.5) == 2.5  # a reserve below the request
    c = Capacity(total=4, system_reserved=5, ls_request=2, ls_usage=0, be_usage=0, non_be_usage=0)
    assert (c.schedulable, c.for_be(), c.for_be(0.0)) == (0.0, 0.0, 0.0)


def test_rate_of_a_counter() -> None:
    r = Rate()
    assert (r.t, r.value) == (None, 0.0)
    assert r.update(1.0, 10.0) is None  # first reading
    assert r.update(3.0, 14.0) == 2.0
    assert r.update(3.0, 20.0) is None  # no time passed
    assert r.update(2.0, 22.0) is None  # earlier
    assert r.update(4.0, 21.0) == 0.0  # went backwards: 0, not negative
    assert r.update(5.0, None) is None  # unread: the next reading starts again
    assert r.t is None
    assert r.update(6.0, 30.0) is None
    assert r.update(6.5, 31.0) == 2.0


def test_the_fast_window_averages_tick_noise_and_shows_a_step_at_once() -> None:
    w = FastWindow(0.15)
    assert w.add(0.0, 0.0, 0.0, 10.0) is None  # one reading: no window yet
    t, be, seen = 0.0, 10.0, []
    for i in range(20):  # 50 ms samples of a steady 1.2 cores read as 0.8 and 1.6 by turns
        t, be = t + 0.05, be + 0.025  # BE: 0.5 core
        got = w.add(t, 0.05, 0.8 if i % 2 else 1.6, be)
        assert got is not None and got.held == got.non_be  # without the pods' counter: one window
        seen.append((got.non_be + got.be, got.be))
    busy, be_cores = seen[-1]
    assert abs(busy - 1.2) <= 0.14 and be_cores == pytest.approx(0.5)  # one sample alone: 0.8 or 1.6
    assert all(abs(b - 1.2) <= 0.14 for b, _ in seen[3:])  # from a full window on, never a lone peak
    t, be = t + 0.05, be + 0.025
    busy = rate(w.add(t, 0.05, 2.0, be), 0.5)  # LS jumps by 0.8 core: a third shows at once
    assert 1.4 <= busy <= 1.6
    for _ in range(3):
        t, be = t + 0.05, be + 0.025
        busy = rate(w.add(t, 0.05, 2.0, be), 0.5)
    assert busy == pytest.approx(2.0)  # the whole window after the step
    assert w.add(t + 0.05, 0.05, 2.0, None) is None  # BE unread: start again
    assert w.add(t + 0.1, 0.05, 2.0, be) is None
    back = w.add(t + 0.15, 0.05, 1.0, be - 1)
    assert back is not None and back.non_be == pytest.approx(1.0) and back.be == 0.0  # a counter going back: no usage


def rate(got: FastUsage | None, be: float = 0.0) -> float:
    """The node's busy cores a window gave (BE at ``be``)."""
    assert got is not None and got.be == pytest.approx(be)
    return got.non_be + got.be


def test_the_fast_window_spans_at_least_its_span_from_the_newest_point_that_allows_it() -> None:
    w = FastWindow(0.5)  # quarter-second samples (exact in binary): the window's edges to the bit
    for t, busy in ((0.0, 0.0), (0.25, 1.0), (0.5, 1.0), (0.75, 3.0)):
        w.add(t, 0.25, busy, 0.0)
    # at 1.0 the point at 0.5 is exactly a span old: the window opens there (the two samples of
    # 3 cores), not at 0.25 (which would take in the sample of 1 core)
    assert rate(w.add(1.0, 0.25, 3.0, 0.0)) == pytest.approx(3.0)
    coarse = FastWindow(0.15)  # samples further apart than the span: the last interval alone
    for t, busy in ((0.0, 0.0), (0.2, 1.0)):
        coarse.add(t, 0.2, busy, 0.0)
    assert rate(coarse.add(0.4, 0.2, 2.0, 0.0)) == pytest.approx(2.0)
    last = FastWindow(0.0)  # no span: the last interval alone
    last.add(0.0, 0.0, 0.0, 0.0)
    last.add(0.1, 0.1, 1.0, 0.0)
    assert rate(last.add(0.2, 0.1, 2.0, 0.0)) == pytest.approx(2.0)


def test_the_fast_window_takes_no_rate_from_a_clock_standing_still_or_going_back() -> None:
    w = FastWindow(0.15)
    assert w.add(1.0, 0.0, 0.0, 5.0) is None
    assert w.add(1.0, 0.05, 1.0, 5.1) is None  # no time passed: no rate (not a division by 0)
    assert w.add(0.5, 0.05, 1.0, 5.2) is None  # earlier than the window's start: no rate


def round_of(s: NodeSample, policy: Policy | None = None, fast: FastUsage | None = None) -> Round:
    return Round(t=s.t, sample=s, level=Level.LOW, cpu_score=0, memory_score=0, policy=policy or Policy(), fast=fast)


def test_node_qos_resource_measures_be_from_its_groups_counter() -> None:
    node = NodeQOSResourceStrategy(cast("Host", None))
    r = round_of(sample(1.0, cpu_busy_cores=3.0, by_class=classes(be=1.0), be_cpu_seconds=10.0))
    node.decide(r)
    assert r.capacity is not None and not r.capacity.be_measured
    assert (r.capacity.be_usage, r.capacity.non_be_usage) == (1.0, 2.0)  # the containers' sum meanwhile
    r = round_of(sample(3.0, cpu_busy_cores=3.0, by_class=classes(be=1.0), be_cpu_seconds=13.0))
    node.decide(r)
    assert r.capacity is not None and r.capacity.be_measured
    assert (r.capacity.be_usage, r.capacity.non_be_usage) == (1.5, 1.5)
    r = round_of(sample(4.0, cpu_busy_cores=1.0, by_class=classes(be=1.0), be_cpu_seconds=16.0))
    node.decide(r)
    assert r.capacity is not None and (r.capacity.be_usage, r.capacity.non_be_usage) == (3.0, 0.0)
    assert node.off(5.0, "off") is False
    r = round_of(sample(6.0, cpu_busy_cores=3.0, by_class=classes(be=1.0), be_cpu_seconds=20.0))
    node.decide(r)  # after off: the rate starts again
    assert r.capacity is not None and not r.capacity.be_measured


def test_node_qos_resource_between_rounds_takes_the_fast_figures() -> None:
    node = NodeQOSResourceStrategy(cast("Host", None))
    r = round_of(sample(1.0, cpu_busy_cores=3.0, by_class=classes(be=1.0)))
    node.between_rounds(r)
    assert r.capacity is None  # no fast figures: nothing to say
    r = round_of(sample(1.0, cpu_busy_cores=3.0, by_class=classes(be=1.0)), fast=FastUsage(be=0.25, non_be=2.5))
    node.between_rounds(r)
    assert r.capacity is not None
    assert (r.capacity.be_usage, r.capacity.non_be_usage, r.capacity.ls_request) == (0.25, 2.5, 1.75)


@pytest.mark.parametrize(("reserved", "held"), [(0.0, 0.0), (0.5, 0.5), (4.0, 4.0), (6.0, 4.0)])
def test_system_reserved_is_held_back_up_to_the_node(reserved: float, held: float) -> None:
    sysres = SystemQOSResourceStrategy(cast("Host", None))
    p = Policy.model_validate({"qosManager": {"systemReserved": {"cpu": reserved}}})
    r = round_of(sample(1.0, cpu_busy_cores=1.0), p)
    sysres.decide(r)
    assert r.capacity is None  # nothing to hold back from
    r.capacity = capacity(r.sample)
    sysres.between_rounds(r)
    assert r.capacity.system_reserved == held


def test_a_strategy_runs_when_the_manager_its_name_and_its_section_are_on() -> None:
    on = Policy().qosManager
    assert NodeQOSResourceStrategy.runs(on) and CPUSuppressStrategy.runs(on)
    assert not NodeQOSResourceStrategy.runs(on.model_copy(update={"enable": False}))
    assert not NodeQOSResourceStrategy.runs(on.model_copy(update={"plugins": ["CPUSuppress"]}))
    off = on.model_copy(update={"cpuSuppress": on.cpuSuppress.model_copy(update={"enabled": False})})
    assert not CPUSuppressStrategy.runs(off) and NodeQOSResourceStrategy.runs(off)
    assert NodeQOSResourceStrategy.configured(off)
    assert not NodeQOSResourceStrategy.needs_capacity and CPUSuppressStrategy.needs_capacity


def test_a_strategys_defaults() -> None:
    class Plain(Strategy):
        name = "MemoryEvict"

        def __init__(self, host: Host) -> None:
            pass

    p = Policy()
    s = Plain(cast("Host", None))  # type: ignore[abstract]
    r = round_of(sample(0.0), p)
    assert r.config is p.qosManager
    assert Plain.configured(p.qosManager) is True and Plain.runs(p.qosManager)
    s.decide(r)
    s.between_rounds(r)
    assert r.capacity is None and r.be_limit is None and r.burst_extra == 0.0
    assert s.off(0.0, "why") is False
    assert not Plain.needs_capacity


@pytest.mark.parametrize(
    ("group", "parent"),
    [
        ("kubepods/besteffort/pod1", "kubepods/besteffort"),
        (
            "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice",
            "kubepods.slice/kubepods-besteffort.slice",
        ),
        ("besteffort/pod1", "besteffort"),
        ("kubepods/burstable/pod2", None),
        ("kubepods/pod3", None),
        ("kubepods/notbesteffort/pod4", None),
        ("kubepods.slice/kubepods-besteffort.slicex/pod5", None),
        ("pod6", None),
    ],
)
def test_the_be_group_is_kubelets_besteffort_parent(group: str, parent: str | None) -> None:
    assert _be_parent(group) == parent


def test_one_cpu_one_byte_one_swap_byte_are_not_guarded_away() -> None:
    """The guards are for 0 (and below) only."""
    s = cpu_pressure(cpu(ncpu=1, node_usage_cores=0.5, load1=0.5))
    assert (s.node, s.load) == pytest.approx((20, 5))
    m = memory_pressure(mem(mem_total=1, mem_available=0, swap_total=1, swap_free=0))
    assert (m.used, m.swap) == pytest.approx((35, 20))
    tr = Trends()
    tr.add(sample(0.0, mem_total=1, by_class=classes(rss=0)))
    tr.add(sample(60.0, mem_total=1, by_class=classes(rss=1)))
    assert memory_inputs(sample(60.0, mem_total=1), tr).ls_rss_growth_pct_per_min == pytest.approx(700.0)


def test_used_memory_is_clamped_to_100_percent() -> None:
    assert memory_pressure(mem(mem_total=100, mem_available=-100)).used == pytest.approx(35)


def test_an_ewma_with_a_time_constant_under_a_second() -> None:
    e = Ewma(0.5)
    e.add(0.0, 2.0)
    e.add(0.5, 0.0)
    assert e.value == pytest.approx(2 * math.exp(-1))


def test_after_every_point_expired_the_next_ones_start_from_zero_sums() -> None:
    w = WindowSlope(100.0)
    w.add(0.0, 50.0)
    w.add(160.0, math.nan)  # the one point expires: nothing is kept
    assert len(w) == 0
    w.add(200.0, 1.0)
    w.add(260.0, 61.0)
    assert w.per_minute() == pytest.approx(60.0)


def test_times_equal_up_to_rounding_have_no_slope() -> None:
    """Two points 0.1 ms apart, 1500 s from the sums' origin: their spread is below the
    rounding of the sums (1e-9 of them), so no slope rather than noise."""
    w = WindowSlope(1000.0)
    w.add(0.0, 0.0)
    w.add(1500.0, 5.0)  # the first expires; the origin stays at 0
    w.add(1500.0001, 7.0)
    assert len(w) == 2
    assert w.per_minute() == 0.0


def test_a_small_spread_near_the_origin_still_has_a_slope() -> None:
    """Below one second of sums the bar is 1e-9 itself: 50 µs apart is a slope."""
    w = WindowSlope(1000.0)
    w.add(0.0, 0.0)
    w.add(5e-5, 5e-5)
    assert w.per_minute() == pytest.approx(60.0, rel=1e-3)


def test_the_registry_names_every_missing_plugin() -> None:
    from nriplugin.qos.strategy import StrategyRegistry

    with pytest.raises(TypeError, match=r"no strategy registered for the policy's plugin\(s\): A, B, C$"):
        StrategyRegistry(["A", "B", "C"]).strategies()


def test_a_spread_exactly_at_the_rounding_bar_has_no_slope() -> None:
    """The bar is inclusive: 4.47e-5 s apart gives a spread of exactly 1e-9."""
    w = WindowSlope(1000.0)
    w.add(0.0, 0.0)
    w.add(4.4721359549995795e-05, 1.0)
    assert w.per_minute() == 0.0
