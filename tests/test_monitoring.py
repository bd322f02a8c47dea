"""The SLO kit: the generated rules, PrometheusRule and dashboard are current; promtool checks
the rules and runs their unit tests (fast burn, slow burn, healthy); every PromQL expression in
the dashboard goes through Prometheus's own parser; every metric they read is one the agent
exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from nriplugin.obs.metrics import HOOK_BUCKETS, Declared, LoopHistogram, Metrics
from nriplugin.obs.slo import SLO
from testkit.prometheus import promtool
from tools import monitoring, slo_rules
from tools.dashboard import exprs

ROOT = Path(__file__).resolve().parent.parent


def rule_exprs(groups: list[dict[str, Any]]) -> list[str]:
    return [r["expr"] for g in groups for r in g["rules"]]


def exported(registry: CollectorRegistry) -> set[str]:
    names = set()
    for fam in registry.collect():
        names.add(fam.name)
        names.update(s.name for s in fam.samples)
        if fam.type == "histogram":
            names.update(fam.name + suffix for suffix in ("_bucket", "_count", "_sum"))
        if fam.type == "counter":
            names.add(fam.name + "_total")
    return names


def test_generated_files_are_current(tmp_path: Path) -> None:
    assert monitoring.main(["--out", str(tmp_path)]) == 0
    for rel in (monitoring.RULES, monitoring.PROMETHEUS_RULE, monitoring.DASHBOARD):
        assert (tmp_path / rel).read_text() == (ROOT / rel).read_text(), f"{rel}: run python -m tools.monitoring"


def test_promtool_checks_the_rules_and_the_prometheusrule_matches() -> None:
    r = promtool("check", "rules", monitoring.RULES)
    assert r.returncode == 0 and "SUCCESS: 15 rules found" in r.stdout, r.stdout + r.stderr
    rules = yaml.safe_load((ROOT / monitoring.RULES).read_text())
    operator = yaml.safe_load((ROOT / monitoring.PROMETHEUS_RULE).read_text())
    assert operator["spec"]["groups"] == rules["groups"]


def test_promtool_unit_tests() -> None:
    """Fast burn (pages, stops once the short windows are clean), failed hooks counted as bad,
    slow burn (a ticket, no page), a healthy period (nothing) with the p50/p99 recordings, and
    the connection, conflict and eviction alerts."""
    r = promtool("test", "rules", "rules_test.yaml", cwd=ROOT / "monitoring")
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


def test_every_dashboard_expression_parses(tmp_path: Path) -> None:
    doc = json.loads((ROOT / monitoring.DASHBOARD).read_text())
    found = exprs(doc)
    assert len(found) >= 15
    # promtool parses each as a recording rule with Prometheus's own PromQL parser.
    rules = {
        "groups": [{"name": "dashboard", "rules": [{"record": f"dash:e{i}", "expr": e} for i, e in enumerate(found)]}]
    }
    f = tmp_path / "dashboard-exprs.yaml"
    f.write_text(yaml.safe_dump(rules))
    r = promtool("check", "rules", str(f))
    assert r.returncode == 0 and f"SUCCESS: {len(found)} rules found" in r.stdout, r.stdout + r.stderr
    # ...and the parser does refuse a broken one, so the check above means something.
    f.write_text(yaml.safe_dump({"groups": [{"name": "x", "rules": [{"record": "x:y", "expr": "rate(a[5m]"}]}]}))
    assert promtool("check", "rules", str(f)).returncode != 0


def test_dashboard_has_the_panels() -> None:
    doc = json.loads((ROOT / monitoring.DASHBOARD).read_text())
    panels = [p for p in doc["panels"] if p["type"] != "row"]
    titles = " | ".join(p["title"] for p in panels)
    for want in (
        "Hook latency p50 / p99",
        "within 2 ms",
        "Error budget left",
        "burn rate",
        "Failed hooks",
        "Runtime connection",
        "repaired",
        "conflicts",
        "Pressure scores",
        "BE CPU limit",
        "evictions",
    ):
        assert want.lower() in titles.lower(), want
    for p in panels:
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(set(refs)) == len(refs)
    latency = next(p for p in panels if p["title"].startswith("Hook latency"))
    assert [s["value"] for s in latency["fieldConfig"]["defaults"]["thresholds"]["steps"]] == [None, 0.002]


def test_every_metric_read_is_exported() -> None:
    """Rules and dashboard read only what the agent's Metrics defines."""
    rules = yaml.safe_load((ROOT / monitoring.RULES).read_text())
    doc = json.loads((ROOT / monitoring.DASHBOARD).read_text())
    used: set[str] = set()
    for e in rule_exprs(rules["groups"]) + exprs(doc):
        used.update(m for m in re.findall(r"(?<![:\w])(nriplugin_[a-z_]+)", e))
    have = exported(Metrics().registry)
    assert used - have == set()


def test_metrics_are_built_from_their_table() -> None:
    """Each declaration in Metrics' body is exported, in order, with its help text, and is the
    attribute of its name, built anew for each Metrics."""
    table = {attr: d for attr, d in vars(Metrics).items() if isinstance(d, Declared)}
    m, other = Metrics(), Metrics()
    families = list(m.registry.collect())
    assert [(f.name, f.documentation) for f in families] == [
        (d.name.removesuffix("_total") if d.kind is Counter else d.name, d.help) for d in table.values()
    ]
    for attr, d in table.items():
        assert isinstance(getattr(m, attr), d.kind) and getattr(m, attr) is not getattr(other, attr)
        assert Metrics.__dict__[attr] is d


def test_custom_slo_and_bad_threshold(tmp_path: Path) -> None:
    assert (
        monitoring.main(["--out", str(tmp_path), "--threshold-ms", "5", "--objective", "99", "--window-days", "28"])
        == 0
    )
    text = (tmp_path / monitoring.RULES).read_text()
    assert 'le="0.005"' in text and "> 0.134400" not in text
    assert f"nriplugin:slo_errors:ratio_rate1h > {14.4 * 28 / 30 * 0.01:.6g}" in text  # 2 % of 28 days' budget in 1 h
    assert promtool("check", "rules", str(tmp_path / monitoring.RULES)).returncode == 0
    with pytest.raises(ValueError, match=r"1\.5 ms is not a bucket bound; pick one of .* 2, 2\.5"):
        slo_rules.rule_groups(SLO(threshold_seconds=0.0015))
    assert monitoring.main(["--out", str(tmp_path), "--threshold-ms", "1.5"]) == 2


def test_loop_histogram_exports_what_prometheus_client_does() -> None:
    """The hook path's histogram is written by hand for speed: for the same observations its
    exposition is prometheus_client's Histogram's, line for line (bar ``_created``), values on
    a bound counted within it, values past the last in +Inf alone."""
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    fast = LoopHistogram("h_seconds", "help.", ("event",), ours, HOOK_BUCKETS)
    slow = Histogram("h_seconds", "help.", ("event",), registry=theirs, buckets=HOOK_BUCKETS)
    observed = [0.0, 50e-6, 50.1e-6, 1e-3, 0.0013, 2.0, 2.5, 7.0, *(i * 37e-6 for i in range(2, 200))]
    for event, values in (("create_container", observed), ("run_pod_sandbox", observed[::3]), ("idle", [])):
        f, s = fast.labels(event), slow.labels(event)
        for v in values:
            f.observe(v)
            s.observe(v)

    def text(r: CollectorRegistry) -> list[str]:
        return [line for line in generate_latest(r).decode().splitlines() if "_created" not in line]

    assert text(ours) == text(theirs)
    assert 'h_seconds_bucket{event="create_container",le="5e-05"} 2.0' in text(ours)  # 0 and 50 µs
    assert 'h_seconds_count{event="idle"} 0.0' in text(ours)
    with pytest.raises(ValueError, match="expected labels"):
        fast.labels("a", "b")
    with pytest.raises(ValueError, match="finite bucket"):
        LoopHistogram("empty", "help.", buckets=(float("inf"),))
