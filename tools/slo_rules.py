"""The SLO's Prometheus rules (recording and alerts) and the pieces the dashboard shares with
them (metric names, burn-rate windows and factors), written from :class:`nriplugin.obs.slo.SLO`."""

from __future__ import annotations

import math
from typing import Any

import yaml
from prometheus_client.utils import floatToGoString

from nriplugin.obs.metrics import HOOK_BUCKETS
from nriplugin.obs.slo import SLO

NAMESPACE = "nriplugin-system"

HIST = "nriplugin_hook_duration_seconds"
FAILURES = "nriplugin_hook_failures_total"
# Evictions by CPUEvict and MemoryEvict (labels strategy, reason, dry_run; dry runs count too).
EVICTIONS = "nriplugin_qos_evictions_total"
ERRORS = "nriplugin:slo_errors:ratio_rate{w}"
# (long window, short window, share of the budget spent in the long window, severity)
BURNS = (
    ("1h", "5m", 0.02, "page"),
    ("6h", "30m", 0.05, "page"),
    ("1d", "2h", 0.10, "ticket"),
    ("3d", "6h", 0.10, "ticket"),
)
HOURS = {"5m": 5 / 60, "30m": 0.5, "1h": 1, "2h": 2, "6h": 6, "1d": 24, "3d": 72}


def num(x: float) -> str:
    return f"{x:.6g}"


def burn_factor(slo: SLO, long: str, share: float) -> float:
    return share * slo.window_days * 24 / HOURS[long]


def bound(slo: SLO) -> float:
    """The bucket bound the SLO's threshold names (a clear error if it names none)."""
    for b in HOOK_BUCKETS:
        if math.isclose(b, slo.threshold_seconds, rel_tol=1e-9):
            return b
    bounds = ", ".join(f"{b * 1e3:g}" for b in HOOK_BUCKETS)
    raise ValueError(f"threshold {slo.threshold_seconds * 1e3:g} ms is not a bucket bound; pick one of {bounds} ms")


def sli_errors(slo: SLO, w: str) -> str:
    """Bad answers / all answers over ``w``: bad are the ones over the threshold and the hooks
    that failed (error, timeout: not in the histogram)."""
    le = floatToGoString(bound(slo))  # type: ignore[no-untyped-call]  # as the client writes the le label
    sel = f'event="{slo.event}"'
    return (
        f'1 - sum(rate({HIST}_bucket{{{sel},le="{le}"}}[{w}]))\n'
        f"  / (\n"
        f"    sum(rate({HIST}_count{{{sel}}}[{w}]))\n"
        f'    + (sum(rate({FAILURES}{{{sel},reason=~"error|timeout"}}[{w}])) or vector(0))\n'
        f"  )\n"
    )


def rule_groups(slo: SLO) -> list[dict[str, Any]]:
    bound(slo)
    labels = {"event": slo.event, "slo": "hook-latency"}
    latency = [
        {
            "record": f"event:{HIST}:p{int(q * 100)}_rate5m",
            "expr": f"histogram_quantile({q}, sum by (event, le) (rate({HIST}_bucket[5m])))\n",
        }
        for q in (0.5, 0.99)
    ]
    windows = sorted({w for long, short, _, _ in BURNS for w in (long, short)}, key=HOURS.__getitem__)
    ratios = [{"record": ERRORS.format(w=w), "expr": sli_errors(slo, w), "labels": labels} for w in windows]
    budget = slo.budget
    alerts: list[dict[str, Any]] = []
    for severity, name, speed in (("page", "Fast", "fast"), ("ticket", "Slow", "slow")):
        terms = []
        for long, short, share, sev in BURNS:
            if sev != severity:
                continue
            limit = num(burn_factor(slo, long, share) * budget)
            terms.append(f"(\n  {ERRORS.format(w=long)} > {limit}\n  and\n  {ERRORS.format(w=short)} > {limit}\n)")
        alerts.append(
            {
                "alert": f"NriPluginHookLatencyBudget{name}Burn",
                "expr": "\nor\n".join(terms) + "\n",
                "labels": {"severity": severity, **labels},
                "annotations": {
                    "summary": f"{slo.event} hooks are burning the latency error budget {speed}",
                    "description": (
                        f"SLO: {slo.describe()}. {{{{ $value | humanizePercentage }}}} of {slo.event} hooks "
                        "were slow or failed over the alert's long window. `nriplugin slo` on a node shows "
                        "the hooks' p50/p99 per event; the dashboard shows which nodes."
                    ),
                },
            }
        )
    agent = [
        {
            "alert": "NriPluginFailOpenHooks",
            "expr": (
                f'sum by (instance, event, reason) (increase({FAILURES}{{policy="fail-open",'
                'reason=~"error|timeout"}[10m])) > 0\n'
            ),
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "hooks failed open on {{ $labels.instance }}",
                "description": (
                    "{{ $value | humanize }} {{ $labels.event }} hooks ended in {{ $labels.reason }} in 10 minutes: "
                    "those containers started without their settings, and the reconciler is repairing them. "
                    "The agent's log says why."
                ),
            },
        },
        {
            "alert": "NriPluginRuntimeConnectionLost",
            "expr": 'max by (instance) (nriplugin_connection_state{state=~"disconnected|connecting"}) == 1\n',
            "for": "1m",
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": "nriplugin on {{ $labels.instance }} has no connection to the runtime",
                "description": (
                    "No NRI connection for a minute: new containers start without the agent's settings "
                    "(the reconciler still repairs running ones). Is containerd up, with NRI enabled?"
                ),
            },
        },
        {
            "alert": "NriPluginReconcilerConflicts",
            "expr": "sum by (instance, resource) (increase(nriplugin_conflicts_total[15m])) > 0\n",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "another writer keeps reverting {{ $labels.resource }} on {{ $labels.instance }}",
                "description": (
                    "The reconciler found files rewritten again after every repair and backs off. "
                    "The agent's log names the file; find the other writer (kubelet, another agent)."
                ),
            },
        },
        {
            "alert": "NriPluginEvictionBurst",
            "expr": f'sum by (instance) (increase({EVICTIONS}{{dry_run="false"}}[10m])) > 3\n',
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "{{ $value | humanize }} BE pods evicted on {{ $labels.instance }} in 10 minutes",
                "description": (
                    "Suppression was not enough to protect LS pods. Check the node's pressure and BE limit "
                    "on the dashboard, and whether the eviction thresholds are too low."
                ),
            },
        },
    ]
    # The burn alerts share the ratios' group: a group's rules are evaluated in order, while
    # groups run concurrently, so an alert in another group could read ratios one round old.
    return [
        {"name": "nriplugin-hook-latency", "rules": latency},
        {"name": "nriplugin-slo", "rules": ratios + alerts},
        {"name": "nriplugin-agent-alerts", "rules": agent},
    ]


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True  # the same labels in several rules: written out each time, not as &anchors


def _str(dumper: yaml.SafeDumper, s: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None)


_Dumper.add_representer(str, _str)


def dump(doc: Any, header: str) -> str:
    return header + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=1000)


def header(slo: SLO) -> str:
    return (
        "# Generated by `python -m tools.monitoring` from nriplugin/obs/slo.py: do not edit by hand.\n"
        f"# SLO: {slo.describe()}.\n"
    )


def rules_file(slo: SLO) -> str:
    return dump({"groups": rule_groups(slo)}, header(slo))


def prometheus_rule(slo: SLO) -> str:
    doc = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "nriplugin",
            "namespace": NAMESPACE,
            "labels": {"app.kubernetes.io/name": "nriplugin"},
        },
        "spec": {"groups": rule_groups(slo)},
    }
    return dump(doc, header(slo))
