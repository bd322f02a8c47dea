"""The main job's QoS act: its pure helpers (metrics parsing, the timeline table, the reading,
the timeline plot's data and layout)."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt

from e2e.demo import (
    Point,
    came_back,
    parse_metrics,
    quota_cores,
    reading,
    settled,
    timeline_figure,
    timeline_series,
    timeline_table,
)

METRICS = """\
# HELP nriplugin_qos_cpu_pressure_score CPU pressure score (0-100).
# TYPE nriplugin_qos_cpu_pressure_score gauge
nriplugin_qos_cpu_pressure_score 57.25
nriplugin_qos_memory_pressure_score 3.0
nriplugin_qos_pressure_level{level="LOW",resource="cpu"} 0.0
nriplugin_qos_pressure_level{level="MEDIUM",resource="cpu"} 1.0
nriplugin_qos_pressure_level{level="LOW",resource="memory"} 1.0
nriplugin_qos_be_cpu_limit_cores 0.3
"""


def test_parse_metrics_takes_the_cpu_score_and_level() -> None:
    assert parse_metrics(METRICS) == (57.25, "MEDIUM")
    assert parse_metrics("") == (None, "?")


def test_quota_cores(tmp_path: Path) -> None:
    (tmp_path / "cpu.cfs_period_us").write_text("100000\n")
    (tmp_path / "cpu.cfs_quota_us").write_text("30000\n")
    assert quota_cores(tmp_path) == 0.3
    (tmp_path / "cpu.cfs_quota_us").write_text("-1\n")
    assert quota_cores(tmp_path) is None
    assert quota_cores(tmp_path / "missing") is None


def test_settled_needs_the_idle_cpu_for_a_while() -> None:
    assert not settled([], 5.0)
    assert not settled([(0.0, 0.1)], 5.0)  # the floor: BE does not have the idle CPU
    assert not settled([(0.0, 0.1), (4.5, 1.0)], 5.0)  # just given
    assert settled([(0.0, 0.1), (3.0, 1.0)], 5.0)
    assert settled([(0.0, 0.1), (3.0, None)], 5.0)  # no quota: BE's idle group below quotaFrom
    assert not settled([(0.0, 0.1), (4.5, None)], 5.0)


def timeline() -> tuple[list[Point], list[tuple[float, float | None]]]:
    """LS busy from 3.0 to 9.0 s; BE cut 100 ms after the spike, back 2.2 s after LS goes idle."""
    points, be, ls = [], 0.0, 0.0
    for k in range(76):
        t = k * 0.2
        lim = 1.0 if t < 3.1 or t >= 11.2 else 0.3
        busy = 3.0 <= t < 9.0
        level = "HIGH" if 4 <= t < 10 else "LOW"
        points.append(Point(t, 60.0 if busy else 20.0, level, lim, be, ls, be + ls + 0.25 * t))  # other: 0.25
        be += 0.2 * lim
        ls += 0.2 if busy else 0.0
    return points, [(0.0, 1.0), (3.1, 0.3), (11.2, 1.0)]


def test_reading_is_computed_from_the_data() -> None:
    points, changes = timeline()
    text = reading(points, changes, 3.0, 9.0)
    assert "BE limited to 1.00 cores, using 1.00; the rest of the node (not BE, not LS) used 0.25" in text
    assert "LS spike at t=3.0 s: BE cut from 1.00 to 0.30 cores within 100 ms" in text
    assert "while the CPU level was still LOW" in text
    assert "LS idle at t=9.0 s: BE back to 1.00 cores at t=11.2 s (2.2 s later)" in text
    assert "levels LOW -> HIGH -> LOW" in text


def test_reading_says_when_nothing_moved() -> None:
    points, _ = timeline()
    text = reading(points, [(0.0, 0.1)], 3.0, 9.0)
    assert "BE's limit did not move (0.10 cores)" in text
    assert "BE still at 0.10 cores at t=15.0 s, with the CPU level at LOW and the rest of the node using 0.25" in text


def test_reading_says_when_be_had_no_quota_throughout() -> None:
    """The default where BE's group runs SCHED_IDLE: no quota below HIGH, LS takes its core."""
    points, _ = timeline()
    text = reading(points, [(0.0, None)], 3.0, 9.0)
    assert "LS idle until t=3.0 s: BE without a quota, using 1.00" in text
    assert "BE's limit did not move (no quota); while LS was busy it used 1.00 cores and BE" in text
    assert "LS idle at t=9.0 s: BE, still without a quota, used" in text and "raiseDelay" not in text


def test_reading_tells_the_settling() -> None:
    points, changes = timeline()
    text = reading(points, [(0.0, 0.1), (1.4, 1.0), *changes[1:]], 3.0, 9.0)
    assert "BE's limit went from 0.10 to 1.00 cores at t=1.4 s" in text


def test_timeline_table_has_a_row_about_every_second_and_at_each_phase_change() -> None:
    points, _ = timeline()
    rows = timeline_table(points, 3.0, 9.0).splitlines()
    assert rows[0].split()[:2] == ["t", "(s)"]
    assert 14 <= len(rows) - 1 <= 20
    phases = [r.split()[1] + (" " + r.split()[2] if r.split()[1] == "LS" else "") for r in rows[1:]]
    assert phases[0] == "settle" and "LS busy" in phases and phases[-1] == "LS idle"
    busy = [r for r in rows[1:] if " LS busy " in r]
    assert busy[-1].split()[-4:] == ["0.30", "0.30", "1.00", "0.25"]  # BE limit, BE, LS, the rest


def test_came_back_waits_for_a_raise_after_ls_goes_idle() -> None:
    changes: list[tuple[float, float | None]] = [(0.0, 1.0), (3.1, 0.3)]
    assert not came_back(changes, 9.0, 12.0)
    assert not came_back([*changes, (11.2, 1.0)], 9.0, 12.0)  # just raised
    assert came_back([*changes, (11.2, 1.0)], 9.0, 12.8)
    assert not came_back([*changes, (11.2, 0.2)], 9.0, 13.0)  # a cut is not a way back
    unlimited: list[tuple[float, float | None]] = [(0.0, None)]  # no quota (BE's idle group below quotaFrom)
    assert not came_back(unlimited, 9.0, 10.0) and came_back(unlimited, 9.0, 10.5)


def unlimited_timeline() -> list[Point]:
    """BE without a quota until the spike is answered (t=3.1 s) and again from t=11.2 s."""
    points, _ = timeline()
    return [
        Point(p.t, p.score, p.level, None if p.be_limit == 1.0 else p.be_limit, p.be_cpu, p.ls_cpu, p.node_cpu)
        for p in points
    ]


def test_timeline_series_draws_no_limit_in_a_band_of_its_own() -> None:
    """Where BE has no quota the limit's line does not vanish: it runs in the "no limit" band,
    above every CPU and below the plot's top, and joins the numbered limit at each change."""
    points = unlimited_timeline()
    s = timeline_series(points, ncpu=2)
    assert len(s.t) == len(s.be) == len(s.limit) == len(s.no_limit) == len(s.limit_path) == len(points) - 1
    assert 2 < s.no_limit_y < s.top
    assert max(s.be + s.ls + s.other) < s.no_limit_y  # the band holds no data line
    for p, lim, none, path in zip(points[1:], s.limit, s.no_limit, s.limit_path, strict=True):
        if p.be_limit is None:
            assert math.isnan(lim) and none == s.no_limit_y and path == s.no_limit_y
        else:
            assert math.isnan(none) and lim == p.be_limit == path
    assert not any(math.isnan(v) for v in s.limit_path)  # one line through both styles
    unlimited = [t for t, v in zip(s.t, s.no_limit, strict=True) if not math.isnan(v)]
    assert unlimited[0] == 0.2 and round(min(t for t in unlimited if t > 3), 6) == 11.2  # before the cut; back
    assert [round(v, 2) for v in s.ls[15:45]] == [1.0] * 30  # LS busy, in cores


def test_timeline_figure_keeps_the_legend_clear_of_the_data_and_labels_no_limit() -> None:
    fig = timeline_figure(unlimited_timeline(), 3.0, 9.0, ncpu=2)
    try:
        fig.canvas.draw()
        ax, score = fig.axes
        legend = ax.get_legend()
        renderer = fig.canvas.get_renderer()
        box = legend.get_window_extent(renderer)
        for a in (ax, score):  # right of both plots, not on them
            assert box.x0 > a.get_window_extent(renderer).x1
        assert box.x1 <= fig.bbox.x1  # and inside the picture
        labels = [t.get_text() for t in legend.get_texts()]
        assert "BE limit (besteffort cfs_quota)" in labels and "BE: no limit (no quota)" in labels
        dashed = next(line for line in ax.get_lines() if line.get_label() == "BE: no limit (no quota)")
        assert dashed.get_linestyle() == "--"
        s = timeline_series(unlimited_timeline(), ncpu=2)
        assert [t.get_text() for t in ax.get_yticklabels()][-1] == "no limit"
        assert ax.get_yticks()[-1] == s.no_limit_y and ax.get_ylim() == (0, s.top)
    finally:
        plt.close(fig)
