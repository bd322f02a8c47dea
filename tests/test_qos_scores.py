"""Pressure scores and levels: worked numbers, BE's own usage not suppressing BE, smoothing and
hysteresis."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from nriplugin.qos.levels import CPU_THRESHOLDS, MEMORY_THRESHOLDS, Assessor, Level, Thresholds
from nriplugin.qos.sample import ClassUsage, NodeSample
from nriplugin.qos.scores import (
    CpuInputs,
    CpuScore,
    MemoryInputs,
    cpu_inputs,
    cpu_pressure,
    memory_inputs,
    memory_pressure,
)
from nriplugin.qos.trends import Ewma, Trends, WindowSlope


def score(i: CpuInputs, count_be: bool = False) -> CpuScore:
    """The CPU score; ``count_be``: BE's usage, trend and load counted like everyone's (the
    same node with BE's usage not told apart)."""
    if count_be:
        i = replace(i, be_usage_cores=0.0, be_trend_pct_per_min=0.0, be_load=0.0)
    return cpu_pressure(i)


def trends_of(samples: list[NodeSample]) -> Trends:
    """The trends after one round per sample, as the manager keeps them."""
    tr = Trends()
    for s in samples:
        tr.add(s)
    return tr


def slope_per_min(points: list[tuple[float, float]]) -> float:
    """A 5-minute window's slope per minute after ``points``."""
    w = WindowSlope(300.0)
    for t, v in points:
        w.add(t, v)
    return w.per_minute()


GiB = 1 << 30

# Scenario 1 (8 CPUs, no BE named): 50 % busy, LS at 0.8 of its request, trend
# 0.5 %/min, load 4.0.
SCENARIO_1 = CpuInputs(
    ncpu=8,
    node_usage_cores=4.0,
    be_usage_cores=0.0,
    ls_usage_cores=3.2,
    ls_request_cores=4.0,
    trend_pct_per_min=0.5,
    load1=4.0,
)
# Scenario 2: 85 % busy, LS at 1.5x its request, trend 2 %/min, load 12.
SCENARIO_2 = CpuInputs(
    ncpu=8,
    node_usage_cores=6.8,
    be_usage_cores=0.0,
    ls_usage_cores=6.0,
    ls_request_cores=4.0,
    trend_pct_per_min=2.0,
    load1=12.0,
)


@pytest.mark.parametrize("count_be", [True, False])
def test_scenario_1_is_59_medium(count_be: bool) -> None:
    s = score(SCENARIO_1, count_be)
    assert s.terms == pytest.approx({"node": 20, "ls": 24, "trend": 10, "load": 5})
    assert s.total == pytest.approx(59) and CPU_THRESHOLDS.level(s.total) == Level.MEDIUM


@pytest.mark.parametrize("count_be", [True, False])
def test_scenario_2_follows_the_formula(count_be: bool) -> None:
    # The terms are 34 + 45 + 20 (trend 40, capped) + 15 = 114: the sum is capped at 100,
    # EMERGENCY.
    s = score(SCENARIO_2, count_be)
    assert s.terms == pytest.approx({"node": 34, "ls": 45, "trend": 20, "load": 15})
    assert s.total == 100 and CPU_THRESHOLDS.level(s.total) == Level.EMERGENCY


def test_be_soaking_up_idle_cpu_does_not_suppress_itself() -> None:
    """2 CPUs, an idle LS pod requesting 1 core, BE spinning two threads for the last minute
        (busy 0 % -> 100 %, load 2): counted like anyone's, BE's usage makes the score HIGH and
    would cut BE; left out, the score stays LOW."""
    samples = []
    for k in range(0, 301, 5):  # 5 minutes of history; BE starts at t=240
        be = 2.0 if k >= 240 else 0.0
        samples.append(
            NodeSample(
                t=float(k),
                interval=5.0,
                ncpu=2,
                cpu_busy_cores=be + 0.02,
                load1=2.0 * (1 - math.exp(-(k - 240) / 60)) if k >= 240 else 0.0,
                by_class={"LS": ClassUsage(1, 0.02, 1.0), "BE": ClassUsage(2, be, 0.0)},
            )
        )
    i = cpu_inputs(samples[-1], trends_of(samples))
    assert i.trend_pct_per_min > 5 and i.be_trend_pct_per_min == pytest.approx(i.trend_pct_per_min)
    counted, ours = score(i, count_be=True), cpu_pressure(i)
    assert CPU_THRESHOLDS.level(counted.total) >= Level.HIGH and counted.total > 60
    assert counted.node == 40 and counted.trend == 20 and counted.load > 6
    assert ours.total < 5 and CPU_THRESHOLDS.level(ours.total) == Level.LOW
    assert ours.node == pytest.approx(0.4) and ours.trend == pytest.approx(0, abs=1e-9) and ours.load < 1


def test_ls_using_its_request_still_raises_the_score_next_to_be() -> None:
    """The discount is BE's only: with LS spinning its one requested core (and its trend), the
    score is what it would be without BE."""
    with_be = CpuInputs(2, 2.0, 1.0, 1.0, 1.0, 25.0, 2.0, be_trend_pct_per_min=0.0)
    without_be = CpuInputs(2, 1.0, 0.0, 1.0, 1.0, 25.0, 1.0)
    assert cpu_pressure(with_be) == cpu_pressure(without_be)
    assert cpu_pressure(with_be).total == pytest.approx(20 + 30 + 20 + 5)


def test_load_discount_follows_load1_after_be_stops() -> None:
    """BE ran 2 cores for minutes and stopped 10 s ago: load1 still carries it (2·e^(-10/60));
    BE's load (its cores averaged like load1) discounts that, BE's instantaneous usage would not."""
    pts = [(float(t), 2.0) for t in range(0, 300, 5)] + [(300.0, 0.0), (305.0, 0.0), (310.0, 0.0)]
    avg = Ewma(60.0)
    for t, v in pts:
        avg.add(t, v)
    be_load = avg.value
    load1 = 2.0 * math.exp(-10 / 60)
    assert be_load == pytest.approx(load1, rel=0.1)
    lingering = CpuInputs(2, 0.02, 0.0, 0.02, 1.0, 0.0, load1, be_load=be_load)
    assert cpu_pressure(lingering).load < 1.0
    assert cpu_pressure(replace(lingering, be_load=None)).load > 8.0


def test_guards() -> None:
    assert cpu_pressure(CpuInputs(0, 1.0, 0.0, 1.0, 0.0, 0.0, 3.0)).total == 0  # no CPUs, no request
    assert cpu_pressure(CpuInputs(4, 1.0, 3.0, 1.0, 0.0, -5.0, 0.0)).total == 0  # BE > busy: floor 0
    nan = cpu_pressure(CpuInputs(4, math.nan, 0.0, math.inf, 1.0, math.nan, 2.0))
    assert nan.total == pytest.approx(5.0)
    assert memory_pressure(MemoryInputs(0, 0, 0.0, 0, 0, 0, 0)).total == 0
    only_direct = memory_pressure(MemoryInputs(16 * GiB, 16 * GiB, 0.0, 10, 0, 0, 0))
    assert only_direct.reclaim == 20  # direct reclaim, kswapd idle: the term saturates
    assert memory_pressure(MemoryInputs(16 * GiB, 16 * GiB, -3.0, 0, 0, 0, 0)).growth == 0


def test_memory_pressure_terms() -> None:
    s = memory_pressure(MemoryInputs(100 * GiB, 20 * GiB, 2.0, 5, 10, 10 * GiB, 5 * GiB))
    assert s.terms == pytest.approx({"used": 28, "growth": 2.5, "reclaim": 1.0, "swap": 10})
    assert s.total == pytest.approx(41.5) and MEMORY_THRESHOLDS.level(s.total) == Level.LOW
    worst = memory_pressure(MemoryInputs(100 * GiB, 0, 50.0, 100, 1, GiB, 0))
    assert worst.total == 100 and MEMORY_THRESHOLDS.level(worst.total) == Level.EMERGENCY


def test_trends_skip_the_first_rounds_cpu_and_take_held_ls_rss() -> None:
    """The first round has no CPU rate (interval 0, zeros): a steady 1.5 cores afterwards is
    no trend. An LS pod arriving with 4 GiB is not LS memory growing: the collector's held
    figure, not the raw sum, is the memory trend's input."""

    def at(t: float, interval: float, rss: int, held: float) -> NodeSample:
        return NodeSample(
            t,
            interval,
            2,
            1.5 if interval else 0.0,
            0.0,
            mem_total=100 * GiB,
            by_class={"LS": ClassUsage(1, 1.5 if interval else 0.0, 1.0, rss_bytes=rss)},
            ls_rss_held=held,
        )

    samples = [at(0.0, 0.0, GiB, GiB)] + [at(float(t), 1.0, (5 if t > 5 else 1) * GiB, GiB) for t in range(1, 11)]
    tr = trends_of(samples)
    assert tr.node_cores.per_minute() == 0.0 and len(tr.node_cores) == 10
    assert memory_inputs(samples[-1], tr).ls_rss_growth_pct_per_min == 0.0
    raw = trends_of([replace(x, ls_rss_held=None) for x in samples])  # what the raw sum would say
    assert memory_inputs(samples[-1], raw).ls_rss_growth_pct_per_min > 10


def test_memory_inputs_growth_is_in_percent_of_memtotal() -> None:
    def at(t: float, rss: int) -> NodeSample:
        return NodeSample(t, 1.0, 4, 0.0, 0.0, mem_total=100 * GiB, by_class={"LS": ClassUsage(rss_bytes=rss)})

    hist = [at(float(t), t * GiB // 60) for t in range(0, 120, 10)]  # 1 GiB per minute
    i = memory_inputs(at(120.0, 2 * GiB), trends_of([*hist, at(120.0, 2 * GiB)]))
    assert i.ls_rss_growth_pct_per_min == pytest.approx(1.0)


def test_slope() -> None:
    assert slope_per_min([]) == 0 and slope_per_min([(1.0, 5.0)]) == 0
    assert slope_per_min([(1.0, 5.0), (1.0, 9.0)]) == 0  # no spread in time
    assert slope_per_min([(0.0, 0.0), (30.0, 1.0), (60.0, 2.0)]) == pytest.approx(2.0)
    old_then_flat = [(0.0, 100.0)] + [(float(t), 10.0) for t in range(301, 600, 10)]
    assert slope_per_min(old_then_flat) == 0  # the point older than 5 minutes is left out


def _batch_slope(points: list[tuple[float, float]], window: float) -> float:
    """The textbook least squares over the window, recomputed from scratch."""
    t_end = points[-1][0]
    pts = [(t, v) for t, v in points if t >= t_end - window]
    n = len(pts)
    mt = sum(t for t, _ in pts) / n
    mv = sum(v for _, v in pts) / n
    sxx = sum((t - mt) ** 2 for t, _ in pts)
    return 60.0 * sum((t - mt) * (v - mv) for t, v in pts) / sxx if n > 1 and sxx > 0 else 0.0


@given(
    steps=st.lists(st.tuples(st.floats(0.2, 30.0), st.floats(0.0, 64.0)), min_size=1, max_size=400),
    start=st.floats(0.0, 1e7),
)
def test_the_running_slope_equals_a_recomputation(steps: list[tuple[float, float]], start: float) -> None:
    """Kept incrementally over hours (re-based as it goes), the slope is the one a full
    recomputation over the window gives, at every step."""
    w = WindowSlope(60.0)
    t, pts = start, []
    for dt, v in steps:
        t += dt
        pts.append((t, v))
        w.add(t, v)
        assert w.per_minute() == pytest.approx(_batch_slope(pts, 60.0), rel=1e-6, abs=1e-6)


def test_hysteresis_holds_a_level_around_a_boundary() -> None:
    for fall_time in (0.0, 5.0):  # hysteresis alone, and with smoothing
        a = Assessor(CPU_THRESHOLDS, hysteresis=5, fall_time=fall_time)
        levels = [a.update(t * 0.1, 61 if t % 2 == 0 else 59).level for t in range(200)]
        assert set(levels) == {Level.HIGH}
        b = Assessor(CPU_THRESHOLDS, hysteresis=5, fall_time=fall_time)
        out = [b.update(t * 0.1, 59 if t % 2 == 0 else 61) for t in range(200)]
        assert sum(o.changed for o in out[1:]) == 1 and out[-1].level == Level.HIGH  # up once, never back


def test_a_real_jump_reaches_its_level_on_the_first_update() -> None:
    a = Assessor(CPU_THRESHOLDS)
    assert a.update(0.0, 30).level == Level.LOW
    r = a.update(0.1, 80)
    assert (r.level, r.score, r.changed) == (Level.CRITICAL, 80, True)


def test_smoothing_falls_slowly_and_leaves_a_level_past_the_margin() -> None:
    a = Assessor(CPU_THRESHOLDS, hysteresis=5, fall_time=5.0)
    a.update(0.0, 80)
    r = a.update(0.2, 10)
    assert r.score == pytest.approx(10 + 70 * math.exp(-0.2 / 5)) and r.level == Level.CRITICAL
    r = a.update(1.0, 10)  # 67.3: below CRITICAL's 75 by more than the margin
    assert r.score == pytest.approx(10 + 70 * math.exp(-1 / 5)) and r.level == Level.HIGH
    ts = [a.update(float(t), 10) for t in range(2, 30)]
    assert all(x.score >= y.score for x, y in itertools.pairwise(ts))  # falls, never jumps down
    low = next(x for x in ts if x.level == Level.LOW)
    assert low.score < 40 - 5 and 3 < low.t < 10  # back to LOW within seconds, past the margin
    assert a.update(29.0, 10).score == pytest.approx(a.score)  # a repeated or earlier t decays nothing
    s = a.score
    assert a.update(20.0, 5).score == pytest.approx(s)


def test_level_boundaries_and_configuration() -> None:
    th = Thresholds(40, 60, 75, 90)
    assert [th.level(x) for x in (0, 39.9, 40, 59.9, 60, 75, 89.9, 90, 100)] == [0, 0, 1, 1, 2, 3, 3, 4, 4]
    with pytest.raises(ValueError, match="increase"):
        Thresholds(40, 40, 75, 90)
    a = Assessor(MEMORY_THRESHOLDS)
    assert a.update(0.0, 75).level == Level.HIGH
    a.configure(CPU_THRESHOLDS, 5, 5)  # a policy reload keeps the state
    assert a.score == 75 and a.update(0.0, 75).level == Level.CRITICAL


finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)
cores = st.floats(min_value=0, max_value=512, allow_nan=False)
cpu_in = st.builds(
    CpuInputs,
    ncpu=st.integers(min_value=0, max_value=512),
    node_usage_cores=cores,
    be_usage_cores=cores,
    ls_usage_cores=cores,
    ls_request_cores=cores,
    trend_pct_per_min=finite,
    load1=cores,
    be_trend_pct_per_min=finite,
    be_load=st.none() | cores,
)


@given(cpu_in, st.booleans())
def test_cpu_score_within_bounds(i: CpuInputs, count_be: bool) -> None:
    s = score(i, count_be)
    assert 0 <= s.total <= 100 and all(t >= 0 for t in s.terms.values())


@given(cpu_in, st.booleans(), st.sampled_from(["node_usage_cores", "ls_usage_cores", "trend_pct_per_min", "load1"]))
def test_cpu_score_rises_with_demand(i: CpuInputs, count_be: bool, field: str) -> None:
    more = replace(i, **{field: getattr(i, field) + 1.0})
    assert score(more, count_be).total >= score(i, count_be).total - 1e-9


@given(cpu_in, st.sampled_from(["be_usage_cores", "ls_request_cores", "be_trend_pct_per_min"]))
def test_cpu_score_does_not_rise_with_be_or_requests(i: CpuInputs, field: str) -> None:
    assume(field != "ls_request_cores" or i.ls_request_cores > 0)  # no request: the LS term is 0
    more = replace(i, **{field: getattr(i, field) + 1.0})
    assert cpu_pressure(more).total <= cpu_pressure(i).total + 1e-9


mem_in = st.builds(
    MemoryInputs,
    mem_total=st.integers(0, 1 << 42),
    mem_available=st.integers(0, 1 << 42),
    ls_rss_growth_pct_per_min=finite,
    pgscan_direct=st.integers(0, 1 << 40),
    pgscan_kswapd=st.integers(0, 1 << 40),
    swap_total=st.integers(0, 1 << 40),
    swap_free=st.integers(0, 1 << 40),
)


@given(mem_in)
def test_memory_score_within_bounds(i: MemoryInputs) -> None:
    s = memory_pressure(i)
    assert 0 <= s.total <= 100 and all(t >= 0 for t in s.terms.values())


@given(mem_in, st.sampled_from(["ls_rss_growth_pct_per_min", "pgscan_direct"]))
def test_memory_score_rises_with_growth_and_direct_reclaim(i: MemoryInputs, field: str) -> None:
    more = replace(i, **{field: getattr(i, field) + 1})
    assert memory_pressure(more).total >= memory_pressure(i).total - 1e-9


@given(mem_in)
def test_memory_score_falls_with_available_memory(i: MemoryInputs) -> None:
    more = replace(i, mem_available=i.mem_available + (1 << 20))
    assert memory_pressure(more).total <= memory_pressure(i).total + 1e-9


@given(st.lists(st.floats(min_value=-1e3, max_value=1e3, allow_nan=False), min_size=0, max_size=30), st.floats(0, 100))
def test_assessor_stays_in_bounds_and_only_rises_at_once(raws: list[float], start: float) -> None:
    a = Assessor(CPU_THRESHOLDS)
    prev = a.update(0.0, start)
    for k, r in enumerate(raws, 1):
        cur = a.update(float(k), r)
        assert 0 <= cur.score <= 100
        clipped = min(100.0, max(0.0, r))
        assert cur.score >= clipped - 1e-9  # never below the raw score: a rise is taken at once
        assert cur.level >= CPU_THRESHOLDS.level(cur.score)  # never below the plain level
        assert cur.score <= max(prev.score, clipped) + 1e-9
        prev = cur
