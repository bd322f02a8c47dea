"""The scheduler's tick (kernel/tick.py): found on the coarse clock, and the fast samples timed
just past it and measured between ticks."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from nriplugin.kernel.cgroup import Cgroups
from nriplugin.kernel.tick import AFTER_NS, BRACKET_NS, COARSE, WATCH_TICKS, Tick
from nriplugin.qos.collect import Collector
from testkit.kernel_tree import proc_tree, v1_counters, v1_tree
from tests.test_qos_manager import BE_GROUP, node_with_pods

MS = 1_000_000


class Clocks:
    """A monotonic clock that moves ``step`` ns a read, and a coarse clock that moves at the
    ticks of ``period`` from ``phase`` (or never)."""

    def __init__(self, start: int, step: int, period: int, phase: int | None) -> None:
        self.t, self.step, self.period, self.phase = start, step, period, phase

    def clock(self) -> int:
        self.t += self.step
        return self.t

    def coarse(self) -> int:
        self.t += self.step
        if self.phase is None:
            return 0
        return self.t - (self.t - self.phase) % self.period


def test_the_probe_finds_the_tick_where_the_coarse_clock_moves() -> None:
    c = Clocks(start=1000 * MS + 300_000, step=1_000, period=4 * MS, phase=1_300_000)
    tick = Tick.probe(c.clock, c.coarse, resolution=0.004)
    assert tick is not None and tick.period_ns == 4 * MS
    assert 1_300_000 <= tick.phase_ns <= 1_302_000  # the read after the move, a step or two late


def test_a_move_seen_late_is_passed_over_for_the_next() -> None:
    """The watcher preempted for 0.7 ms just before the first move sees it 0.7 ms late: that
    is no tick's instant. The next move, seen in time, is."""
    c = Clocks(start=1000 * MS + 300_000, step=1_000, period=4 * MS, phase=1_300_000)
    coarse, stalled = c.coarse, [False]

    def preempted() -> int:
        if not stalled[0] and c.t >= 1001 * MS + 299_000:
            c.t += 700_000
            stalled[0] = True
        return coarse()

    tick = Tick.probe(c.clock, preempted, resolution=0.004)
    assert tick is not None and 1_300_000 <= tick.phase_ns <= 1_300_000 + BRACKET_NS
    assert stalled[0] and c.t > 1005 * MS  # the move at 1001.3 ms was seen late; the one at 1005.3 in time


@pytest.mark.parametrize("resolution", [1e-9, 0.05])
def test_a_resolution_no_tick_has_finds_none(resolution: float) -> None:
    c = Clocks(start=0, step=1_000, period=4 * MS, phase=0)
    assert Tick.probe(c.clock, c.coarse, resolution=resolution) is None


def test_a_coarse_clock_that_never_moves_is_watched_for_a_few_ticks_then_given_up() -> None:
    c = Clocks(start=0, step=10_000, period=4 * MS, phase=None)
    assert Tick.probe(c.clock, c.coarse, resolution=0.004) is None
    assert WATCH_TICKS * 4 * MS <= c.t <= WATCH_TICKS * 4 * MS + 40_000  # and no longer


def test_last_is_the_tick_at_or_before() -> None:
    tick = Tick(4 * MS, 1 * MS)
    assert tick.last(1.005) == pytest.approx(1.005)
    assert tick.last(1.0089) == pytest.approx(1.005)
    assert tick.last(1.009) == pytest.approx(1.009)


def test_the_next_sample_falls_just_past_the_last_tick_within_its_wait() -> None:
    tick = Tick(4 * MS, 0)
    since = 100.0  # a sample's tick
    now = 100.0008  # read 0.8 ms past it, decided: sleep
    wait = tick.wake(now, since, 0.03)
    assert now + wait == pytest.approx(100.028 + AFTER_NS / 1e9)  # the 7th tick, not the 8th
    assert tick.wake(now, since, 0.02) == pytest.approx(0.02 - 0.0008 + AFTER_NS / 1e9)


def test_a_sample_whose_tick_is_gone_is_taken_past_the_next() -> None:
    tick = Tick(4 * MS, 0)
    now = 100.0301  # a round held the loop past the tick the sample was due at
    assert now + tick.wake(now, 100.0, 0.03) == pytest.approx(100.032 + AFTER_NS / 1e9)


def collector(tmp_path: Path, clock: Callable[[], float], tick: Tick | None) -> Collector:
    """The real collector on a v1 tree holding BE's group at 2 s of CPU, and a /proc."""
    node, _, _, _, _ = node_with_pods(tmp_path / "node")
    root = v1_tree(tmp_path / "tree", [BE_GROUP])
    v1_counters(root, BE_GROUP, usage_ns=2_000_000_000)
    return Collector(node.model, node.desired, Cgroups(root), proc_tree(tmp_path / "proc"), clock=clock, tick=tick)


def test_a_fast_sample_is_timed_at_the_tick_before_its_reads(tmp_path: Path) -> None:
    now = [10.0013]
    col = collector(tmp_path, lambda: now[0], Tick(4 * MS, 0))
    first = col.fast()
    assert first.t == pytest.approx(10.0) and first.interval == 0.0
    assert col.wake(0.03) == pytest.approx(10.028 + AFTER_NS / 1e9 - 10.0013)
    now[0] = 10.0282
    f = col.fast()
    assert f.t == pytest.approx(10.028) and f.interval == pytest.approx(0.028)


def test_a_tick_inside_the_reads_reads_them_again_once(tmp_path: Path) -> None:
    """The reads straddled a tick (the /proc files current to one, the groups' counters to
    the next, perhaps): all of them again, past it."""
    times = iter([10.0039, 10.0041, 10.0042, 10.0043])  # read, a tick passes; read again, none
    reads: list[float] = []

    def clock() -> float:
        reads.append(next(times))
        return reads[-1]

    col = collector(tmp_path, clock, Tick(4 * MS, 0))
    f = col.fast(([BE_GROUP], []))
    assert reads == [10.0039, 10.0041, 10.0042, 10.0043]
    assert f.t == pytest.approx(10.004) and f.seconds == (2.0, None)


def test_without_a_tick_a_sample_is_timed_when_read_and_waits_are_as_asked(tmp_path: Path) -> None:
    col = collector(tmp_path, lambda: 10.0013, None)
    f = col.fast(([BE_GROUP],))
    assert f.t == 10.0013 and f.seconds == (2.0,) and col.wake(0.03) == 0.03


# the real kernel -------------------------------------------------------------------------------


def test_on_this_kernel_the_tick_found_predicts_where_the_coarse_clock_moves() -> None:
    """Ten moves seen in time (within BRACKET_NS of the read before, as the probe takes
    them): none before a predicted tick by more than the probe's and this watch's latenesses
    together (2 x BRACKET_NS), and most within 0.2 ms after it (the coarse clock moves in the
    tick's handler, which now and then runs late)."""
    tick = Tick.probe()
    assert tick is not None and tick.period_ns == round(time.clock_getres(COARSE) * 1e9)
    seen: list[int] = []
    for _ in range(1000):
        start = time.clock_gettime_ns(COARSE)
        before = time.monotonic_ns()
        while (moved := time.clock_gettime_ns(COARSE)) == start:
            before = time.monotonic_ns()
        t = time.monotonic_ns()
        if moved != start and t - before <= BRACKET_NS:
            seen.append(t - round(tick.last(t / 1e9) * 1e9))  # from the tick predicted last
        if len(seen) == 10:
            break
    assert len(seen) == 10
    early = [s for s in seen if s >= tick.period_ns // 2]
    assert all(s > tick.period_ns - 2 * BRACKET_NS for s in early), seen
    assert sum(s < 200_000 for s in seen) + len(early) >= 7, seen
