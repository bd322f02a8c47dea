"""Writes the SLO kit from one definition (``nriplugin.obs.slo.SLO``):

- ``monitoring/rules.yaml``: the Prometheus rule file (recording rules for p50/p99 by event and
  the SLO's error ratios, multi-window multi-burn-rate alerts, and the agent's other alerts),
  what ``promtool check rules`` / ``promtool test rules`` and a plain Prometheus load;
- ``charts/nriplugin/files/prometheusrule.yaml``: the same groups as a PrometheusRule for the Prometheus operator
  (the chart's template includes it; kind/prometheusrule.yaml is rendered from the chart);
- ``monitoring/dashboard.json``: the Grafana dashboard, built with grafana-foundation-sdk.

Usage: python -m tools.monitoring [--event E] [--threshold-ms 2] [--objective 99.9]
       [--window-days 30] [--out DIR]        (default: this checkout)

The burn-rate alerts are the SRE workbook's (chapter "Alerting on SLOs"): page when 2 % of the
window's budget goes in an hour or 5 % in six hours, ticket for 10 % in a day or in three
days; each long window is paired with a short one (1/12 of it) so an alert stops soon after
the burn does. Factors follow the window (14.4 / 6 / 3 / 1 for 30 days). The threshold must be
one of the histogram's bucket bounds (``nriplugin.obs.metrics.HOOK_BUCKETS``): "answered within
2 ms" is then a bucket count, not an estimate.

tests/test_monitoring.py regenerates the defaults and fails if the committed files differ.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from nriplugin.obs.slo import SLO
from tools.dashboard import build
from tools.slo_rules import prometheus_rule, rules_file

ROOT = Path(__file__).resolve().parent.parent
RULES = "monitoring/rules.yaml"
PROMETHEUS_RULE = "charts/nriplugin/files/prometheusrule.yaml"
DASHBOARD = "monitoring/dashboard.json"


def dashboard_json(slo: SLO) -> str:
    return json.dumps(build(slo), indent=2, sort_keys=True) + "\n"


def outputs(slo: SLO) -> dict[str, str]:
    return {RULES: rules_file(slo), PROMETHEUS_RULE: prometheus_rule(slo), DASHBOARD: dashboard_json(slo)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.monitoring", description=__doc__.split("\n\n")[0])
    d = SLO()
    p.add_argument("--event", default=d.event)
    p.add_argument("--threshold-ms", type=float, default=d.threshold_seconds * 1e3)
    p.add_argument("--objective", type=float, default=d.objective * 100, help="percent")
    p.add_argument("--window-days", type=int, default=d.window_days)
    p.add_argument("--out", type=Path, default=ROOT)
    ns = p.parse_args(argv)
    try:
        slo = SLO(ns.event, ns.threshold_ms / 1e3, ns.objective / 100, ns.window_days)
        files = outputs(slo)
    except ValueError as exc:
        print(f"tools.monitoring: {exc}", file=sys.stderr)
        return 2
    for rel, text in files.items():
        target = ns.out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
