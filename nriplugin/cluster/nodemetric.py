"""Koordinator's ``NodeMetric`` (``slo.koordinator.sh/v1alpha1``, cluster-scoped, named after the
node) on the wire, without I/O: what its spec's ``metricCollectPolicy`` asks, and the status
this node reports, built from the usage the QoS manager's rounds measured
(``qos/usage.py``). The loop that sends it is ``reporter.py``.

koord-manager creates the object and writes its spec; the node agent (koordlet, or this one)
writes only its status, as koordlet v1.8.0 does: ``updateTime``; ``nodeMetric`` with the
node's and the system's usage averaged over ``aggregateDurationSeconds`` and, per duration of
``nodeAggregatePolicy``, their average and p50/p90/p95/p99 (left empty while the window is
cold); each pod's average usage with its namespace, name, Koordinator priority class and QoS
class. A status always carries ``nodeMetric`` with both usages: koord-manager v1.8.0 panics
on a status that has ``updateTime`` and no ``nodeMetric``. Quantities and durations are
written as Go writes them (``1500m``, ``2Gi``, ``5m0s``), so a reader sees what koordlet
would have sent. The field-by-field comparison is docs/nodemetric.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

GROUP, VERSION, PLURAL, KIND = "slo.koordinator.sh", "v1alpha1", "nodemetrics", "NodeMetric"

# koordlet v1.8.0's defaults and floors (statesinformer/impl/states_nodemetric.go): the spec's
# values below a floor are raised to it, as koordlet does.
DEFAULT_REPORT_SECONDS = 60
MIN_REPORT_SECONDS = 30
DEFAULT_AGGREGATE_SECONDS = 300
MIN_AGGREGATE_SECONDS = 60
DEFAULT_DURATIONS = (300.0, 600.0, 1800.0)
MEMORY_POLICY = "usageWithoutPageCache"  # the one measured (MemTotal - MemAvailable; pods without page cache)
AGGREGATIONS = ("avg", "p50", "p90", "p95", "p99")

# Koordinator's priority classes (apis/extension/priority.go): by the pod's label, else by
# spec.priority's range, else by its QoS class.
PRIORITY_LABEL = "koordinator.sh/priority-class"
PRIORITY_CLASSES = ("koord-prod", "koord-mid", "koord-batch", "koord-free")
PRIORITY_RANGES = (
    ("koord-prod", 9000, 9999),
    ("koord-mid", 7000, 7999),
    ("koord-batch", 5000, 5999),
    ("koord-free", 3000, 3999),
)
QOS_PRIORITY = {
    "SYSTEM": "koord-prod",
    "LSE": "koord-prod",
    "LSR": "koord-prod",
    "LS": "koord-prod",
    "BE": "koord-batch",
}


# What the report reads of the measured usage (qos/usage.py's UsageWindows has this shape).


class UsageLike(Protocol):
    @property
    def cpu_cores(self) -> float: ...
    @property
    def memory_bytes(self) -> float: ...


class SpreadLike(Protocol):
    @property
    def avg(self) -> UsageLike: ...
    @property
    def by_percentile(self) -> Mapping[str, UsageLike]: ...


class PodLike(Protocol):
    @property
    def uid(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def labels(self) -> Mapping[str, str]: ...
    @property
    def qos(self) -> str: ...
    @property
    def usage(self) -> UsageLike: ...


class Measured(Protocol):
    """The usage kept over time, as the report asks for it (times on its own clock)."""

    def keep(self, horizon: float, pod_seconds: float) -> None: ...
    def average(self, now: float, seconds: float) -> tuple[UsageLike, UsageLike] | None: ...
    def spread(self, now: float, seconds: float) -> tuple[SpreadLike, SpreadLike] | None: ...
    def pods(self, now: float) -> Sequence[PodLike]: ...


# ``spec.metricCollectPolicy`` -----------------------------------------------------------------


@dataclass(frozen=True)
class CollectPolicy:
    """What the NodeMetric's spec asks, with koordlet's defaults and floors applied."""

    report_seconds: float = DEFAULT_REPORT_SECONDS
    aggregate_seconds: float = DEFAULT_AGGREGATE_SECONDS
    durations: tuple[float, ...] = DEFAULT_DURATIONS  # nodeAggregatePolicy.durations, in seconds

    @property
    def horizon(self) -> float:
        """How far back the node's usage is needed."""
        return max((self.aggregate_seconds, *self.durations))


def collect_policy(
    spec: Mapping[str, Any] | None, min_report: float = MIN_REPORT_SECONDS
) -> tuple[CollectPolicy, list[str]]:
    """The policy a NodeMetric's spec asks for, and notes on what was not taken as written.

    Each field absent (or null) keeps koordlet's default; a present ``durations`` list replaces
    the default one, an empty list asking for no aggregated usage (koordlet merges the spec
    over its defaults the same way)."""
    notes: list[str] = []
    where = "spec.metricCollectPolicy"
    cp = (spec or {}).get("metricCollectPolicy") or {}
    if not isinstance(cp, Mapping):
        return CollectPolicy(), [f"spec.metricCollectPolicy is not an object ({type(cp).__name__}): defaults used"]

    def seconds(key: str, default: float, floor: float) -> float:
        raw = cp.get(key)
        if raw is None:
            return default
        if not isinstance(raw, int) or isinstance(raw, bool):
            notes.append(f"spec.metricCollectPolicy.{key}: {raw!r} is not an integer; {default:g} s used")
            return default
        if raw < floor:
            notes.append(f"spec.metricCollectPolicy.{key}: {raw} is below koordlet's floor; {floor:g} s used")
            return floor
        return float(raw)

    report = seconds("reportIntervalSeconds", DEFAULT_REPORT_SECONDS, min_report)
    aggregate = seconds("aggregateDurationSeconds", DEFAULT_AGGREGATE_SECONDS, MIN_AGGREGATE_SECONDS)
    durations: tuple[float, ...] = DEFAULT_DURATIONS
    agg = cp.get("nodeAggregatePolicy")
    if isinstance(agg, Mapping) and agg.get("durations") is not None:
        parsed = []
        for raw in agg.get("durations") or []:
            d = parse_duration(raw) if isinstance(raw, str) else None
            if d is None or d <= 0:
                notes.append(f"{where}.nodeAggregatePolicy.durations: {raw!r} left out (not a duration)")
            elif d not in parsed:
                parsed.append(d)
        durations = tuple(parsed)
    memory = cp.get("nodeMemoryCollectPolicy")
    if memory not in (None, MEMORY_POLICY, "usageWithHotPageCache"):
        # koordlet reports usageWithHotPageCache as usageWithoutPageCache unless its cold-page
        # collection runs; usageWithPageCache is its TODO and ours.
        notes.append(f"{where}.nodeMemoryCollectPolicy: {memory!r} not measured; {MEMORY_POLICY} reported")
    return CollectPolicy(report, aggregate, durations), notes


_DURATION = re.compile(r"([0-9]*(?:\.[0-9]*)?)(ns|us|µs|μs|ms|s|m|h)")
_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float | None:
    """Seconds in a Go duration (``metav1.Duration``: ``5m0s``, ``1h30m``, ``90s``, ``0``); None
    when it is not one."""
    s = text.strip()
    sign = -1.0 if s.startswith("-") else 1.0
    s = s.lstrip("+-")
    if s == "0":
        return 0.0
    if not s:
        return None
    total, pos = 0.0, 0
    while pos < len(s):
        m = _DURATION.match(s, pos)
        if m is None or m.group(1) in ("", "."):
            return None
        total += float(m.group(1)) * _UNIT[m.group(2)]
        pos = m.end()
    return sign * total


def format_duration(seconds: float) -> str:
    """A duration as Go's ``time.Duration.String`` writes it (``5m0s``, ``1h0m0s``, ``1.5s``)."""
    ns = round(seconds * 1e9)
    if ns == 0:
        return "0s"
    sign, ns = ("-", -ns) if ns < 0 else ("", ns)
    if ns < 1_000_000_000:
        for unit, size in (("ms", 1_000_000), ("µs", 1_000), ("ns", 1)):
            if ns >= size:
                return sign + _decimal(ns, size) + unit
    h, rest = divmod(ns, 3_600_000_000_000)
    m, rest = divmod(rest, 60_000_000_000)
    out = f"{h}h" if h else ""
    if h or m:
        out += f"{m}m"
    return sign + out + _decimal(rest, 1_000_000_000) + "s"


def _decimal(value: int, unit: int) -> str:
    whole, frac = divmod(value, unit)
    if not frac:
        return str(whole)
    digits = len(str(unit)) - 1
    return f"{whole}.{frac:0{digits}d}".rstrip("0")


# quantities, priorities --------------------------------------------------------------------


def cpu_quantity(cores: float) -> str:
    """CPU as koordlet writes it: whole millicores (truncated), ``1500m`` or ``2``."""
    milli = int(max(0.0, cores) * 1000)
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def memory_quantity(size: float) -> str:
    """Bytes as Kubernetes writes a binary quantity: the largest binary suffix that is exact
    (``512Mi``), else plain bytes."""
    n = int(max(0.0, size))
    for suffix, power in (("Ei", 60), ("Pi", 50), ("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)):
        if n and n % (1 << power) == 0:
            return f"{n >> power}{suffix}"
    return str(n)


def priority_class(labels: Mapping[str, str], priority: int | None, qos: str) -> str:
    """Koordinator's priority class of a pod (``GetPodPriorityClassWithDefault``): its
    ``koordinator.sh/priority-class`` label when that names one, else its ``spec.priority``'s
    range, else its QoS class's default ("" when none applies)."""
    label = labels.get(PRIORITY_LABEL)
    if label is not None:
        if label in PRIORITY_CLASSES:
            return label
    elif priority is not None:
        for name, low, high in PRIORITY_RANGES:
            if low <= priority <= high:
                return name
    return QOS_PRIORITY.get(qos, "")


# the status ---------------------------------------------------------------------------------


def resources(u: UsageLike) -> dict[str, Any]:
    """A ``ResourceMap``: ``{"resources": {"cpu": ..., "memory": ...}}``."""
    return {"resources": {"cpu": cpu_quantity(u.cpu_cores), "memory": memory_quantity(u.memory_bytes)}}


def aggregated(duration: float, spread: SpreadLike | None) -> dict[str, Any]:
    """One ``AggregatedUsage``: average and percentiles over ``duration``; each left empty
    while the window is cold, as koordlet leaves them."""
    usage: dict[str, Any] = {}
    for name in AGGREGATIONS:
        if spread is None:
            usage[name] = {}
        else:
            usage[name] = resources(spread.avg if name == "avg" else spread.by_percentile[name])
    return {"usage": usage, "duration": format_duration(duration)}


def update_time(when: datetime) -> str:
    """``metav1.Time`` as it is marshalled: RFC 3339 in UTC, whole seconds."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


PriorityOf = Callable[[PodLike], int | None]


def status(
    measured: Measured, policy: CollectPolicy, now: float, wall: datetime, priority_of: PriorityOf
) -> dict[str, Any] | None:
    """The status to report at ``now`` (the measurements' clock; ``wall`` for updateTime), or
    None while nothing was measured over the aggregation window (no report: an empty
    ``nodeMetric`` would read as an idle node). ``priority_of``: a pod's ``spec.priority`` as
    the API server has it (None: not known)."""
    avg = measured.average(now, policy.aggregate_seconds)
    if avg is None:
        return None
    node, system = avg
    metric: dict[str, Any] = {"nodeUsage": resources(node)}
    spreads = [(d, measured.spread(now, d)) for d in policy.durations]
    if spreads:
        metric["aggregatedNodeUsages"] = [aggregated(d, None if s is None else s[0]) for d, s in spreads]
    metric["systemUsage"] = resources(system)
    if spreads:
        metric["aggregatedSystemUsages"] = [aggregated(d, None if s is None else s[1]) for d, s in spreads]
    out: dict[str, Any] = {"updateTime": update_time(wall), "nodeMetric": metric}
    pods = sorted(measured.pods(now), key=lambda p: (p.namespace, p.name))
    if pods:
        out["podsMetric"] = [
            {
                "name": p.name,
                "namespace": p.namespace,
                "podUsage": resources(p.usage),
                "priority": priority_class(p.labels, priority_of(p), p.qos),
                "qos": p.qos,
            }
            for p in pods
        ]
    return out


def patch(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The JSON patch (RFC 6902) that makes ``report`` the whole status, whatever was there (a
    field another writer left is not merged into ours) and without a resourceVersion to race."""
    return [{"op": "add", "path": "/status", "value": report}]
