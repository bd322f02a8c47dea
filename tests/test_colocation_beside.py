"""The pure parts of bench/colocation_beside.py: cpuset lists, the paired koordlet / nriplugin
ratio over rounds, and the summary table's rows replaced in place."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.colocation_beside import ANCHOR, ROW, cpus_of, paired_ratio, replace_rows


def test_cpus_of_counts_ranges_and_singles() -> None:
    assert cpus_of("0-1\n") == 2
    assert cpus_of("0,2-3") == 3
    assert cpus_of("") == 0


def window(lat: list[float], util: float, ops: float) -> dict[str, Any]:
    return {
        "rate_rps": 100.0,
        "lat_ms": lat,
        "requests": len(lat),
        "errors": 0,
        "send_lag_p99_ms": 0.5,
        "node_cpu_util": util,
        "host_cpu_util": util,
        "be_ops_s": {"cpu": ops},
        "ls_cores": 0.5,
        "be_cores": 1.0,
        "be_limit_cores": None,
        "evictions": 0.0,
        "be_running": 1,
        "be_cpu_idle": "-",
    }


def test_the_ratio_is_koordlet_over_nriplugin_on_the_pooled_figure_with_an_interval_over_rounds() -> None:
    ours = [window([1.0] * 99 + [10.0], 0.8, 50.0) for _ in range(4)]
    theirs = [window([1.0] * 99 + [20.0], 0.6, 25.0) for _ in range(4)]
    raw = {
        "nriplugin": [ours],
        "koordlet-quota": [theirs],
        "be-alone": [[window([], 1.0, 100.0)]],
    }
    assert paired_ratio(raw, "nriplugin", "koordlet-quota", 0, "ls_p999_ms", 3.0) == (2.0, 2.0, 2.0)
    x, lo, hi = paired_ratio(raw, "nriplugin", "koordlet-quota", 0, "be_throughput", 3.0)
    assert (x, lo, hi) == pytest.approx((0.5, 0.5, 0.5))
    # rounds that differ give an interval around the ratio
    theirs[0]["node_cpu_util"] = 0.9
    x, lo, hi = paired_ratio(raw, "nriplugin", "koordlet-quota", 0, "node_cpu_util", 3.0)
    assert lo < x < hi


def test_summary_rows_replace_the_placeholder_then_the_last_run_s_rows(tmp_path: Path) -> None:
    p = tmp_path / "B.md"
    head = "| row | benchmark | nriplugin | koordlet | koordlet / nriplugin | commit |\n|---|---|---|---|---|---|\n"
    p.write_text(
        head + f"{ROW} | `bench/colocation.py` | not yet measured | | | |\n| next | `x` | 1 | 2 | 2x | `c` |\n"
    )
    rows = [
        f"| [LS p50, moderate load (1/s)](#{ANCHOR}) | `bench/x` | 1 | 2 | 2x | `a` |",
        "| LS p99 | same | 1 | 2 | 2x | `a` |",
    ]
    replace_rows(p, rows)
    assert p.read_text() == head + "\n".join(rows) + "\n| next | `x` | 1 | 2 | 2x | `c` |\n"
    again = [rows[0].replace("`a`", "`b`")]
    replace_rows(p, again)
    assert p.read_text() == head + again[0] + "\n| next | `x` | 1 | 2 | 2x | `c` |\n"
