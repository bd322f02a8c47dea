"""A real Prometheus (Debian's, scripts/prometheus.sh) scraping nriplugin on the private
containerd while pods are created: the SLO kit's rules load and evaluate without error, the
recorded p50/p99 are the agent's real ones, and every dashboard expression runs."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from nriplugin.obs.slo import HISTOGRAM, SLO, quantile
from testkit.containerd import Containerd
from testkit.plugin import ROOT, PluginProcess, free_port, terminate, until
from testkit.prometheus import bin_dir
from tools import monitoring, slo_rules
from tools.dashboard import exprs

BE = {"koordinator.sh/qosClass": "BE"}
EVENT = "create_container"
INTERVAL = 1  # seconds: scrape and rule evaluation


class Prometheus:
    """One Prometheus process with its own config and data folder; stopped by PID, its folder
    removed."""

    def __init__(self, target: str) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="nriplugin-prometheus-"))
        self.port = free_port()
        config = {
            "global": {"scrape_interval": f"{INTERVAL}s", "evaluation_interval": f"{INTERVAL}s"},
            "rule_files": [str(ROOT / monitoring.RULES)],
            "scrape_configs": [{"job_name": "nriplugin", "static_configs": [{"targets": [target]}]}],
        }
        (self.dir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = (self.dir / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [
                str(bin_dir() / "prometheus"),
                f"--config.file={self.dir / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def get(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.loads(r.read())

    def query(self, expr: str) -> list[dict[str, Any]]:
        doc = self.get("/api/v1/query", query=expr)
        assert doc["status"] == "success", doc
        result: list[dict[str, Any]] = doc["data"]["result"]
        return result

    def value(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.logs()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"prometheus not ready: {self.logs()}")

    def logs(self) -> str:
        return (self.dir / "prometheus.log").read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        terminate(self.proc)
        self.log.close()
        shutil.rmtree(self.dir)


@pytest.fixture
def prometheus_factory() -> Iterator[Callable[[str], Prometheus]]:
    made: list[Prometheus] = []

    def make(target: str) -> Prometheus:
        p = Prometheus(target)
        made.append(p)
        p.wait_ready()
        return p

    yield make
    for p in made:
        p.stop()
        assert p.proc.returncode is not None and not p.dir.exists()


def buckets(text: str, event: str) -> dict[float, float]:
    for fam in text_string_to_metric_families(text):
        if fam.name == HISTOGRAM:
            return {
                float(s.labels["le"]): s.value
                for s in fam.samples
                if s.name == HISTOGRAM + "_bucket" and s.labels["event"] == event
            }
    return {}


def test_prometheus_records_the_agents_p99(
    runtime: Containerd,
    plugin_factory: Callable[..., PluginProcess],
    prometheus_factory: Callable[[str], Prometheus],
) -> None:
    agent = plugin_factory(runtime)
    prom = prometheus_factory(f"127.0.0.1:{agent.port}")
    until(lambda: prom.value('up{job="nriplugin"}') == 1.0, 20, "the first scrape")

    # The agent's latency series exist at 0 from its start (StubMetrics.expect), so every
    # bucket series starts alike and rate() counts every hook: the recording rules give the
    # quantiles of exactly the hooks answered.
    count = f'{HISTOGRAM}_count{{event="{EVENT}"}}'
    until(lambda: prom.value(count) == 0.0, 20, "the create_container series at 0")
    for i in range(8):  # 24 create_container answers
        pod = runtime.run_pod(f"slo-{i}", "BestEffort", BE)
        for name in ("a", "b", "c"):
            runtime.create_container(pod, name, cpu_shares=1024, start=False)
    after = buckets(agent.get("/metrics")[1], EVENT)
    assert after[math.inf] == 24
    until(lambda: prom.value(count) == 24.0, 20, "the last hooks in Prometheus")
    time.sleep(3 * INTERVAL)  # a rule evaluation after the last scrape

    counts = sorted(after.items())
    for q in (0.5, 0.99):
        want = quantile(q, counts)
        got = prom.value(f'event:{HISTOGRAM}:p{int(q * 100)}_rate5m{{event="{EVENT}"}}')
        assert got is not None and want is not None
        assert got == pytest.approx(want, rel=1e-6), (q, got, want, counts)
    # The SLO's error ratio: slow or failed answers over all, from the same counts.
    bad = 1 - after[slo_rules.bound(SLO())] / 24
    ratio = prom.value("nriplugin:slo_errors:ratio_rate5m")
    assert ratio is not None and ratio == pytest.approx(bad, abs=1e-9)

    # Every rule loaded and evaluates without error.
    groups = prom.get("/api/v1/rules")["data"]["groups"]
    rules = yaml.safe_load((ROOT / monitoring.RULES).read_text())["groups"]
    assert sorted(g["name"] for g in groups) == sorted(g["name"] for g in rules)
    for g in groups:
        for r in g["rules"]:
            assert r["health"] == "ok" and not r.get("lastError"), r
    assert not prom.query('ALERTS{alertname="NriPluginRuntimeConnectionLost"}')

    # Every dashboard expression runs on the real data.
    for e in exprs(json.loads((ROOT / monitoring.DASHBOARD).read_text())):
        prom.query(e)

    # `nriplugin slo` reads the same agent: its p99 (since the agent started) from the counts.
    r = subprocess.run(
        [sys.executable, "-m", "nriplugin", "slo", "--agent", f"127.0.0.1:{agent.port}"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=30,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    row = next(ln.split() for ln in r.stdout.splitlines() if ln.startswith(f"{EVENT} *"))
    total = quantile(0.99, counts)
    assert row[2] == "24" and total is not None and float(row[6]) == pytest.approx(total * 1e3, rel=0.01)
