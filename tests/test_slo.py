"""``nriplugin slo`` against a real prometheus_client registry (the agent's own Metrics) served
on a port, and its arithmetic against Prometheus's histogram_quantile rules."""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import start_http_server

from nriplugin.obs.metrics import HOOK_BUCKETS, Metrics, StubMetrics
from nriplugin.obs.slo import SLO, analyse, fetch, quantile, share_within

ROOT = Path(__file__).resolve().parent.parent


def test_quantile_follows_prometheus() -> None:
    b = [(0.1, 0.0), (0.2, 10.0), (0.4, 30.0), (math.inf, 40.0)]
    assert quantile(0.5, b) == pytest.approx(0.3)  # rank 20: half way through (0.2, 0.4]
    assert quantile(0.125, b) == pytest.approx(0.15)  # rank 5 in (0.1, 0.2]
    assert quantile(0.9, b) == 0.4  # rank 36 falls in +Inf: the highest finite bound
    assert quantile(0.01, [(0.1, 4.0), (math.inf, 4.0)]) == pytest.approx(0.001)  # first bucket from 0
    assert quantile(0.5, [(0.1, 0.0), (math.inf, 0.0)]) is None
    assert share_within(0.2, b) == (10.0, True)
    assert share_within(0.3, b)[0] == pytest.approx(20.0)  # interpolated in (0.2, 0.4]
    assert share_within(0.3, b)[1] is False
    assert share_within(9.0, b) == (30.0, False)  # past the last bound: only what is known good


def test_slo_validates() -> None:
    assert SLO().describe() == (
        "99.9 % of create_container hooks answered within 2 ms over 30 days (error budget 0.1 %)"
    )
    for bad in ({"objective": 1.0}, {"objective": 0.0}, {"threshold_seconds": 0.0}, {"window_days": 0}):
        with pytest.raises(ValueError):
            SLO(**bad)


@pytest.fixture
def agent_metrics() -> Iterator[tuple[int, Metrics]]:
    """The agent's metrics, with a known spread of CreateContainer answers, on a real port."""
    m = Metrics()
    obs = StubMetrics(m)
    for seconds, n in ((0.0003, 980), (0.0015, 15), (0.003, 5)):
        for _ in range(n):
            obs.hook_done("create_container", seconds)
    for _ in range(2):
        obs.hook_failed("create_container", "error", False)  # fail-open: answered empty, bad
    obs.hook_failed("create_container", "over_budget", False)  # already in the histogram
    for _ in range(10):
        obs.hook_done("run_pod_sandbox", 0.00008)
    server, thread = start_http_server(0, "127.0.0.1", registry=m.registry)
    try:
        yield server.server_port, m
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_analyse_live_metrics(agent_metrics: tuple[int, Metrics]) -> None:
    port, _ = agent_metrics
    text = fetch(f"http://127.0.0.1:{port}/metrics")
    create, sandbox = analyse(text, SLO())
    assert create.event == "create_container" and sandbox.event == "run_pod_sandbox"
    assert (create.answered, create.failed, create.total) == (1000, 2, 1002)
    assert create.exact and create.good == 995  # 2 ms is a bucket bound
    assert create.p50 == pytest.approx(0.00025 + 0.00005 * 500 / 980)  # rank 500 of 1000 in (250, 300] µs
    assert create.p99 == pytest.approx(0.001 + 0.001 * 10 / 15)  # rank 990: 10 into (1, 2] ms's 15
    assert create.within == pytest.approx(995 / 1002)
    assert create.budget_used(SLO()) == pytest.approx(7 / (1002 * 0.001))
    assert sandbox.within == 1.0 and sandbox.budget_used(SLO()) == 0.0
    assert sandbox.p99 == pytest.approx(0.00005 + 0.00005 * (9.9 - 0) / 10)
    # The default SLO's threshold is a bucket bound, so its share is a count.
    assert SLO().threshold_seconds in HOOK_BUCKETS


def slo_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nriplugin", "slo", *args], capture_output=True, text=True, cwd=ROOT, timeout=30
    )


def test_cli_prints_each_event(agent_metrics: tuple[int, Metrics]) -> None:
    port, _ = agent_metrics
    r = slo_cli("--agent", f"127.0.0.1:{port}")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == ("SLO: 99.9 % of create_container hooks answered within 2 ms over 30 days (error budget 0.1 %)")
    row = next(ln.split() for ln in lines if ln.startswith("create_container *"))
    # event * hooks failed p50 ms p99 ms within % budget %
    assert row[2:] == ["1000", "2", "0.276", "ms", "1.67", "ms", "99.301", "%", "699", "%"]
    assert next(ln for ln in lines if ln.startswith("run_pod_sandbox")).split()[-2:] == ["0", "%"]
    assert "~" not in r.stdout


def test_cli_threshold_between_bounds_and_url(agent_metrics: tuple[int, Metrics]) -> None:
    port, _ = agent_metrics
    r = slo_cli("--agent", f"http://127.0.0.1:{port}/metrics", "--threshold-ms", "1.5", "--objective", "99")
    assert r.returncode == 0, r.stderr
    row = next(ln.split() for ln in r.stdout.splitlines() if ln.startswith("create_container *"))
    assert row[-4:] == [f"~{100 * 987.5 / 1002:.3f}", "%", f"{100 * 14.5 / 10.02:.0f}", "%"]
    assert "not a bucket bound" in r.stdout


def test_cli_errors_are_one_line() -> None:
    from testkit.plugin import free_port

    r = slo_cli("--agent", f"127.0.0.1:{free_port()}")
    assert r.returncode == 2 and r.stdout.count("\n") == 1 and "Connection refused" in r.stdout
    r = slo_cli("--objective", "100")
    assert r.returncode == 2 and "objective 100 %: must be above 0 and below 100 %" in r.stderr
    assert "Traceback" not in r.stderr
