"""Every Prometheus metric of the agent, defined in one place.

``StubMetrics`` is the stub's observer: the stub calls it on the hook path, so each call is
a single histogram/counter update on pre-resolved label children.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from typing import Any, Generic, TypeVar, overload

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

# From 50 µs, finely up to 1 ms (a hook's p50 and p99 fall there: the histogram's quantiles
# are compared with the runtime's own in bench/hook_latency.py). 2 ms is the
# default SLO's threshold (slo.py): a bound there makes "answered within 2 ms" a count, not
# an interpolation; the SLO rules need their threshold to be a bound (tools/monitoring.py).
HOOK_BUCKETS = (
    50e-6,
    100e-6,
    150e-6,
    200e-6,
    250e-6,
    300e-6,
    400e-6,
    500e-6,
    750e-6,
    1e-3,
    2e-3,
    2.5e-3,
    5e-3,
    10e-3,
    25e-3,
    50e-3,
    100e-3,
    250e-3,
    500e-3,
    1.0,
    2.0,
)
# standby: another agent holds this runtime (see agent/lock.py); this one waits to take over.
STATES = ("disconnected", "connecting", "registered", "standby")
GAP_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class _LoopChild:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # per bucket, not cumulative; the last is +Inf's
        self.sum = 0.0

    def observe(self, amount: float) -> None:
        self.counts[bisect_left(self.bounds, amount)] += 1  # the first bound >= amount: le
        self.sum += amount


class LoopHistogram:
    """A labelled histogram for the hook path, exported exactly as prometheus_client's
    (``_bucket``, ``_count``, ``_sum``; no ``_created``) but observed with a bisect and two
    additions: prometheus_client's takes a lock and walks its buckets, several times the cost
    (each hook observes once). Lock-free, so observed from one thread
    only: the event loop's, where every hook is answered. A scrape from the metrics server's
    thread copies the counts; it may see an observation's count without its sum, never
    buckets out of step with the count."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: tuple[str, ...] = (),
        registry: CollectorRegistry | None = None,
        buckets: tuple[float, ...] = (),
    ) -> None:
        bounds = tuple(sorted(float(b) for b in buckets if b != float("inf")))
        if not bounds:
            raise ValueError(f"{name}: a histogram needs at least one finite bucket bound")
        self.name, self.documentation, self.labelnames, self.bounds = name, documentation, labelnames, bounds
        self._les = [*map(floatToGoString, bounds), "+Inf"]
        self._children: dict[tuple[str, ...], _LoopChild] = {}
        if registry is not None:
            registry.register(self)

    def labels(self, *values: str) -> _LoopChild:
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {values}")
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = _LoopChild(self.bounds)
        return child

    def describe(self) -> Iterator[Metric]:
        yield HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in list(self._children.items()):
            counts, total = list(child.counts), child.sum  # one copy: buckets and count agree
            cumulative, seen = [], 0
            for le, n in zip(self._les, counts, strict=True):
                seen += n
                cumulative.append((le, float(seen)))
            family.add_metric(list(values), cumulative, total)
        yield family


M = TypeVar("M", Counter, Gauge, Histogram, LoopHistogram)


class Declared(Generic[M]):
    """One metric as data: its kind, exported name, help text, label names and (a histogram's)
    buckets. Declared in :class:`Metrics`'s body, the table of every metric; each ``Metrics``
    builds its own into its registry as the attribute of the same name (so a test's registry
    never shares a series with another's)."""

    def __init__(
        self, kind: type[M], name: str, help: str, labels: tuple[str, ...] = (), buckets: tuple[float, ...] = ()
    ) -> None:
        self.kind: type[M] = kind
        self.name = name
        self.help = help
        self.labels = labels
        self.buckets = buckets
        self.attr = ""

    def __set_name__(self, owner: type, attr: str) -> None:
        self.attr = attr

    @overload
    def __get__(self, obj: None, owner: type) -> Declared[M]: ...
    @overload
    def __get__(self, obj: object, owner: type) -> M: ...
    def __get__(self, obj: object | None, owner: type) -> Declared[M] | M:
        # A built metric is in the instance's dict and shadows this (a non-data descriptor), so
        # reading one costs what a plain attribute does; only the class's reading gets here.
        if obj is None:
            return self
        raise AttributeError(self.attr)

    def build(self, registry: CollectorRegistry) -> M:
        extra: dict[str, Any] = {"buckets": self.buckets} if self.buckets else {}
        return self.kind(self.name, self.help, self.labels, registry=registry, **extra)


class Metrics:
    """The agent's metrics, in the order they are exported. Names, help texts, labels and buckets
    are what the monitoring rules and the dashboard read (``monitoring/``, tools/monitoring.py):
    change one there too."""

    hook_latency = Declared(
        LoopHistogram,
        "nriplugin_hook_duration_seconds",
        "Plugin-side handling time of NRI requests, by event.",
        ("event",),
        HOOK_BUCKETS,
    )
    hook_failures = Declared(
        Counter,
        "nriplugin_hook_failures_total",
        "Hooks that failed (error, timeout, over_budget), by event and failure policy.",
        ("event", "reason", "policy"),
    )
    connection_state = Declared(
        Gauge, "nriplugin_connection_state", "1 for the current state of the runtime connection.", ("state",)
    )
    registrations = Declared(Counter, "nriplugin_registrations_total", "Successful registrations with the runtime.")
    sync_duration = Declared(
        Histogram,
        "nriplugin_synchronize_duration_seconds",
        "Time to handle Synchronize.",
        buckets=(1e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1.0, 2.0),
    )
    refused_messages = Declared(
        Counter,
        "nriplugin_nri_refused_messages_total",
        "Messages from the runtime over the receive bound (run --max-message-mib), refused unread; "
        "the agent then serves without NRI hooks for a while (reconciler only).",
    )
    sync_objects = Declared(
        Gauge, "nriplugin_synchronize_objects", "Pods and containers in the last Synchronize.", ("kind",)
    )
    invalid_input = Declared(
        Counter, "nriplugin_invalid_input_total", "Pod labels/annotations rejected as invalid, by reason.", ("reason",)
    )
    reconcile_passes = Declared(Counter, "nriplugin_reconcile_passes_total", "Full reconciler passes.")
    reconcile_pass = Declared(
        Histogram,
        "nriplugin_reconcile_pass_seconds",
        "Wall time of a full reconciler pass.",
        buckets=(1e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1.0, 5.0),
    )
    reconcile_pass_cpu = Declared(
        Counter, "nriplugin_reconcile_pass_cpu_seconds_total", "CPU time spent in full passes."
    )
    reconcile_entries = Declared(Gauge, "nriplugin_reconcile_entries", "Cgroups the reconciler keeps.")
    drift = Declared(Counter, "nriplugin_drift_total", "Files found off their desired value.", ("resource",))
    repaired = Declared(Counter, "nriplugin_repaired_total", "Files written back.", ("resource",))
    repair_latency = Declared(
        Histogram,
        "nriplugin_repair_latency_seconds",
        "Change noticed -> written back.",
        buckets=(100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 1.0),
    )
    net_shaped = Declared(
        Gauge, "nriplugin_net_shaped_pods", "Pods whose network is shaped, and why others are not.", ("state",)
    )
    net_class_bytes = Declared(
        Gauge,
        "nriplugin_net_class_bytes",
        "Bytes sent by a network QoS class (pod direction).",
        ("direction", "level"),
    )
    write_errors = Declared(Counter, "nriplugin_write_errors_total", "Rejected writes, by errno.", ("errno",))
    conflicts = Declared(Counter, "nriplugin_conflicts_total", "Files another writer keeps reverting.", ("resource",))
    policy_version = Declared(Gauge, "nriplugin_policy_version", "Version of the policy in force.")
    policy_unused = Declared(
        Gauge,
        "nriplugin_policy_unused_field",
        "1 for each field of the NodeSLO (or policy file) in force that nriplugin does not implement.",
        ("field",),
    )
    inventory = Declared(
        Counter,
        "nriplugin_inventory_passes_total",
        "CRI inventories taken, by outcome (ok, unavailable).",
        ("outcome",),
    )
    inventory_changes = Declared(
        Counter,
        "nriplugin_inventory_containers_total",
        "Containers adopted from CRI (unknown to NRI) or forgotten (gone from the runtime).",
        ("change",),
    )
    agent_gap = Declared(
        Histogram,
        "nriplugin_agent_gap_seconds",
        "Time the runtime had no agent answering its hooks before this one took over, by cause "
        "(handover: the previous agent stopped cleanly; crash: it died).",
        ("cause",),
        GAP_BUCKETS,
    )
    # The QoS manager's: pressure scores and levels, BE's CPU suppression, LS bursts, evictions,
    # and how long its rounds take.
    qos_cpu_score = Declared(Gauge, "nriplugin_qos_cpu_pressure_score", "CPU pressure score (0-100).")
    qos_memory_score = Declared(Gauge, "nriplugin_qos_memory_pressure_score", "Memory pressure score (0-100).")
    qos_level = Declared(
        Gauge, "nriplugin_qos_pressure_level", "1 for the current level, by resource.", ("resource", "level")
    )
    qos_suppress = Declared(
        Counter, "nriplugin_qos_cpu_suppress_total", "Changes of BE's CPU limit, by pressure level.", ("level",)
    )
    qos_burst = Declared(
        Counter, "nriplugin_qos_cpu_burst_total", "LS bursts granted (started) and ended.", ("change",)
    )
    qos_be_limit = Declared(Gauge, "nriplugin_qos_be_cpu_limit_cores", "BE's CPU limit in cores (+Inf: no quota).")
    qos_birth_lifts = Declared(
        Counter, "nriplugin_qos_be_birth_lifts_total", "Times BE's quota was lifted while BE containers were born."
    )
    qos_birth_lift_seconds = Declared(
        Counter, "nriplugin_qos_be_birth_lift_seconds_total", "Seconds BE's quota was lifted for births, in all."
    )
    qos_evictions = Declared(
        Counter,
        "nriplugin_qos_evictions_total",
        "Pods evicted (or, dry_run=true, that would have been), by strategy and trigger.",
        ("strategy", "reason", "dry_run"),
    )
    qos_eviction_failures = Declared(
        Counter,
        "nriplugin_qos_eviction_failures_total",
        "Evictions not done, by backend and outcome (blocked by a disruption budget, gone, error).",
        ("backend", "outcome"),
    )
    qos_decision = Declared(
        Histogram,
        "nriplugin_qos_decision_latency_milliseconds",
        "One QoS round: collect, assess, decide, apply.",
        buckets=(0.5, 1, 2, 5, 10, 25, 50, 100, 250, 1000),
    )
    qos_collect = Declared(
        Histogram,
        "nriplugin_qos_collect_milliseconds",
        "Collection time of one QoS round.",
        buckets=(0.25, 0.5, 1, 2, 5, 10, 25, 50, 100),
    )

    # The NodeMetric report (cluster/reporter.py): reports taken, refused by reason, and the last
    # one's size.
    nodemetric_reports = Declared(
        Counter, "nriplugin_nodemetric_reports_total", "NodeMetric status reports the API server took."
    )
    nodemetric_failures = Declared(
        Counter,
        "nriplugin_nodemetric_report_failures_total",
        "NodeMetric status reports not taken, by reason (invalid, forbidden, missing, unavailable, failed).",
        ("reason",),
    )
    nodemetric_last = Declared(
        Gauge,
        "nriplugin_nodemetric_last_report_timestamp_seconds",
        "When the API server last took a NodeMetric report (Unix time; koord-manager degrades the "
        "node's batch resources when it is older than degradeTimeMinutes).",
    )
    nodemetric_pods = Declared(Gauge, "nriplugin_nodemetric_report_pods", "Pods in the last NodeMetric report taken.")
    nodemetric_bytes = Declared(
        Gauge, "nriplugin_nodemetric_report_bytes", "Size of the last NodeMetric report taken (its JSON)."
    )

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        for attr, declared in vars(Metrics).items():
            if isinstance(declared, Declared):
                setattr(self, attr, declared.build(self.registry))
        for s in STATES:
            self.connection_state.labels(s).set(1 if s == "disconnected" else 0)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class StubMetrics:
    """Implements the stub's Observer protocol on :class:`Metrics`."""

    def __init__(self, m: Metrics) -> None:
        self.m = m
        self._latency: dict[str, _LoopChild] = {}

    def expect(self, events: list[str]) -> None:
        """Makes each event's latency series exist at 0 before its first hook: a series born
        with its first observation loses that hook to rate(), and its buckets would start
        unlike each other (the SLO's recording rules read them over windows)."""
        for event in events:
            if event not in self._latency:
                self._latency[event] = self.m.hook_latency.labels(event)

    def hook_done(self, event: str, seconds: float) -> None:
        child = self._latency.get(event)
        if child is None:
            child = self._latency[event] = self.m.hook_latency.labels(event)
        child.observe(seconds)

    def hook_failed(self, event: str, reason: str, fail_closed: bool) -> None:
        self.m.hook_failures.labels(event, reason, "fail-closed" if fail_closed else "fail-open").inc()

    def connection_state(self, state: str) -> None:
        for s in STATES:
            self.m.connection_state.labels(s).set(1 if s == state else 0)
        if state == "registered":
            self.m.registrations.inc()

    def synchronized(self, seconds: float, pods: int, containers: int) -> None:
        self.m.sync_duration.observe(seconds)
        self.m.sync_objects.labels("pods").set(pods)
        self.m.sync_objects.labels("containers").set(containers)

    def message_refused(self, length: int, limit: int) -> None:
        self.m.refused_messages.inc()


class ReconcilerMetrics:
    """Implements the reconciler's Observer on :class:`Metrics`."""

    def __init__(self, m: Metrics) -> None:
        self.m = m

    def drift(self, resource: str) -> None:
        self.m.drift.labels(resource).inc()

    def repaired(self, resource: str, seconds: float) -> None:
        self.m.repaired.labels(resource).inc()
        self.m.repair_latency.observe(seconds)

    def write_error(self, errno: int) -> None:
        self.m.write_errors.labels(str(errno)).inc()

    def conflict(self, resource: str, path: str) -> None:
        self.m.conflicts.labels(resource).inc()

    def pass_done(self, seconds: float, cpu_seconds: float, entries: int) -> None:
        self.m.reconcile_passes.inc()
        self.m.reconcile_pass.observe(seconds)
        self.m.reconcile_pass_cpu.inc(cpu_seconds)
        self.m.reconcile_entries.set(entries)


class NetMetrics:
    """Follows the network reconciler's rounds on :class:`Metrics`."""

    LEVELS = {0x10: "L0", 0x11: "L1", 0x12: "L2"}

    def __init__(self, m: Metrics) -> None:
        self.m = m

    def round(self, status: Any) -> None:
        self.m.net_shaped.labels("shaped").set(len(status.shaped))
        self.m.net_shaped.labels("host_network").set(len(status.host_network))
        self.m.net_shaped.labels("other_shaper").set(len(status.foreign))
        snap = status.snapshot
        for (direction, minor), n in snap.bytes.items() if snap is not None else ():
            level = self.LEVELS.get(minor)
            if level is not None:
                self.m.net_class_bytes.labels(direction, level).set(n)


class InventoryMetrics:
    """Implements the CRI inventory's observer on :class:`Metrics`."""

    def __init__(self, m: Metrics) -> None:
        self.m = m

    def inventory_done(self, ok: bool, adopted: int, forgotten: int) -> None:
        self.m.inventory.labels("ok" if ok else "unavailable").inc()
        if adopted:
            self.m.inventory_changes.labels("adopted").inc(adopted)
        if forgotten:
            self.m.inventory_changes.labels("forgotten").inc(forgotten)


LEVELS = ("LOW", "MEDIUM", "HIGH", "CRITICAL", "EMERGENCY")


class QoSMetrics:
    """Implements the QoS manager's Observer on :class:`Metrics`."""

    def __init__(self, m: Metrics) -> None:
        self.m = m

    def round_done(self, seconds: float, collect_seconds: float) -> None:
        self.m.qos_decision.observe(seconds * 1e3)
        self.m.qos_collect.observe(collect_seconds * 1e3)

    def scores(self, cpu: float, cpu_level: str, memory: float, memory_level: str) -> None:
        self.m.qos_cpu_score.set(cpu)
        self.m.qos_memory_score.set(memory)
        for resource, level in (("cpu", cpu_level), ("memory", memory_level)):
            for name in LEVELS:
                self.m.qos_level.labels(resource, name).set(1 if name == level else 0)

    def be_limit(self, cores: float) -> None:
        self.m.qos_be_limit.set(cores)

    def suppressed(self, reason: str) -> None:
        self.m.qos_suppress.labels(reason).inc()

    def burst(self, granted: bool) -> None:
        self.m.qos_burst.labels("granted" if granted else "ended").inc()

    def birth_lift(self, seconds: float | None) -> None:
        if seconds is None:
            self.m.qos_birth_lifts.inc()
        else:
            self.m.qos_birth_lift_seconds.inc(seconds)


class EvictionMetrics:
    """Implements the evictor's Observer on :class:`Metrics`."""

    def __init__(self, m: Metrics) -> None:
        self.m = m

    def evicted(self, strategy: str, reason: str, dry_run: bool) -> None:
        self.m.qos_evictions.labels(strategy, reason, "true" if dry_run else "false").inc()

    def eviction_failed(self, backend: str, outcome: str) -> None:
        self.m.qos_eviction_failures.labels(backend, outcome).inc()


class NodeMetricMetrics:
    """Implements the NodeMetric reporter's Observer on :class:`Metrics`."""

    def __init__(self, m: Metrics) -> None:
        self.m = m

    def reported(self, pods: int, size: int, seconds: float) -> None:
        self.m.nodemetric_reports.inc()
        self.m.nodemetric_last.set_to_current_time()
        self.m.nodemetric_pods.set(pods)
        self.m.nodemetric_bytes.set(size)

    def report_failed(self, reason: str) -> None:
        self.m.nodemetric_failures.labels(reason).inc()
