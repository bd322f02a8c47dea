"""The NodeMetric report without I/O: the usage kept over time (qos/usage.py) from the QoS
manager's rounds, and the status built from it (cluster/nodemetric.py) — checked against
Koordinator v1.8.0's vendored CRD, koordlet's percentile rule and its spec defaults."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft4Validator

from nriplugin.cluster.nodemetric import (
    CollectPolicy,
    PodLike,
    collect_policy,
    cpu_quantity,
    format_duration,
    memory_quantity,
    parse_duration,
    patch,
    priority_class,
    status,
)
from nriplugin.nri import api_pb2 as api
from nriplugin.policy.model import Policy
from nriplugin.policy.qos import QoSClass
from nriplugin.qos.collect import ContainerUsage
from nriplugin.qos.sample import ClassUsage, NodeSample
from nriplugin.qos.usage import MAX_POINTS, POD_BUCKETS, UsageWindows, percentile
from testkit.runtime_peer import make_container, make_pod
from tests.kube_standin import NODEMETRIC_CRD, nodemetric_schema
from tests.test_qos_manager import node_with_pods

GIB = 1 << 30
WALL = datetime(2026, 12, 6, 1, 2, 3, 456000, tzinfo=UTC)
CRD_SHA256 = "b5a28d5da60563c1034c58fb79cd1b8f323050a21b400168fa62dd1c3703fe46"  # v1.8.0's file


def closed(node: Any) -> Any:
    """The schema with every field it does not name refused (strict field validation)."""
    if isinstance(node, list):
        return [closed(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: closed(v) for k, v in node.items()}
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


@functools.cache
def strict() -> Draft4Validator:
    return Draft4Validator(closed(nodemetric_schema()))


def valid_status(report: dict[str, Any]) -> None:
    """``report`` is a NodeMetric status the CRD takes, with no field it does not know."""
    obj = {"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeMetric", "metadata": {}, "status": report}
    errors = [f"{'.'.join(map(str, e.path))}: {e.message}" for e in strict().iter_errors(obj)]
    assert errors == []


def node_sample(t: float, cpu: float, used: int, by_class: Mapping[str, ClassUsage] | None = None) -> NodeSample:
    return NodeSample(
        t=t,
        interval=1.0,
        ncpu=8,
        cpu_busy_cores=cpu,
        load1=0.0,
        mem_total=16 * GIB,
        mem_available=16 * GIB - used,
        by_class=dict(by_class or {}),
    )


def sandbox(i: int, qos: str = "LS", **labels: str) -> api.PodSandbox:
    pod = make_pod(i, qos)
    pod.labels.update(labels)
    return pod


def usage(pod: api.PodSandbox, cpu: float, mem: int, qos: QoSClass = QoSClass.LS) -> ContainerUsage:
    return ContainerUsage(qos, pod.id, cpu, mem, mem)


def test_the_vendored_nodemetric_crd_is_koordinators_v1_8_0() -> None:
    import hashlib

    assert hashlib.sha256(NODEMETRIC_CRD.read_bytes()).hexdigest() == CRD_SHA256
    doc = yaml.safe_load(NODEMETRIC_CRD.read_text())
    assert doc["spec"]["names"]["kind"] == "NodeMetric" and doc["spec"]["scope"] == "Cluster"
    (version,) = doc["spec"]["versions"]
    assert version["subresources"] == {"status": {}}  # the agent writes the status subresource only
    assert (NODEMETRIC_CRD.parent / "LICENSE.koordinator").is_file()
    assert "slo.koordinator.sh_nodemetrics.yaml" in (NODEMETRIC_CRD.parent / "VERSION").read_text()


def test_percentiles_are_koordlets() -> None:
    """koordlet's metric cache: sort, take the floor(n·p)-th (1-based), at least the first."""
    assert percentile([float(v) for v in range(1, 101)], 900) == 90.0
    assert percentile([float(v) for v in range(1, 101)], 990) == 99.0
    assert percentile([3.0, 1.0, 2.0], 500) == 1.0  # floor(1.5) = 1: the smallest
    assert percentile([5.0, 1.0, 4.0, 2.0, 3.0, 7.0, 6.0], 900) == 6.0  # floor(6.3) = 6th of 7
    assert percentile([2.0], 990) == 2.0


def test_a_known_series_gives_its_average_percentiles_and_system_usage() -> None:
    """100 rounds of 1 s: node CPU 1..100 cores, memory (i GiB); pods use a tenth of each;
    the system is the node less its pods' classes. Windows longer than twice the samples' span
    are cold."""
    w = UsageWindows()
    w.keep(1800, 60)
    for i in range(1, 101):
        pods = {"LS": ClassUsage(cpu_cores=i * 0.1, memory_bytes=i * GIB // 10)}
        w.add(node_sample(float(i), float(i), i * GIB, pods), {}, lambda _: None)
    avg = w.average(100.0, 300)
    assert avg is not None
    node, system = avg
    assert node.cpu_cores == pytest.approx(50.5) and node.memory_bytes == pytest.approx(50.5 * GIB)
    assert system.cpu_cores == pytest.approx(50.5 * 0.9)
    assert system.memory_bytes == pytest.approx(50.5 * 0.9 * GIB, 1e-6)
    last = w.average(100.0, 10)  # t = 90..100: 11 samples
    assert last is not None and last[0].cpu_cores == pytest.approx(95.0)
    spread = w.spread(100.0, 100)
    assert spread is not None
    n, s = spread
    assert n.avg.cpu_cores == pytest.approx(50.5)
    assert {k: u.cpu_cores for k, u in n.by_percentile.items()} == {"p50": 50, "p90": 90, "p95": 95, "p99": 99}
    assert n.by_percentile["p90"].memory_bytes == 90 * GIB
    assert s.by_percentile["p90"].cpu_cores == pytest.approx(81.0)
    assert w.spread(100.0, 300) is None  # 99 s of samples in a 300 s window: cold
    assert w.spread(100.0, 198) is not None  # 99 s is half of it: not cold


def test_the_first_round_and_an_unasked_series_are_not_measurements() -> None:
    w = UsageWindows()
    w.add(node_sample(1.0, 2.0, GIB), {}, lambda _: None)
    assert w.points == 0  # nobody asked for a window yet
    w.keep(300, 60)
    w.add(NodeSample(t=2.0, interval=0.0, ncpu=8, cpu_busy_cores=0.0, load1=0.0), {}, lambda _: None)
    assert w.points == 0 and w.average(2.0, 300) is None


def test_each_pod_is_averaged_over_its_window_and_leaves_with_the_node_model() -> None:
    a, b = sandbox(1, "LS"), sandbox(2, "BE")
    known = {a.id: a, b.id: b}
    w = UsageWindows()
    w.keep(600, 100)  # pods' buckets of 10 s
    for t in range(0, 300):
        containers = {
            "a1": usage(a, 1.0 if t < 150 else 3.0, 100 << 20),
            "a2": usage(a, 0.5, 50 << 20),
            "b1": usage(b, 0.25, 10 << 20, QoSClass.BE),
        }
        w.add(node_sample(float(t), 4.0, GIB), containers, known.get)
    pods = {p.name: p for p in w.pods(299.0)}
    assert set(pods) == {"pod-1", "pod-2"} and len(w) == 2
    # the last 100 s and at most one bucket more: all at 3 + 0.5 cores
    assert pods["pod-1"].usage.cpu_cores == pytest.approx(3.5)
    assert pods["pod-1"].usage.memory_bytes == 150 << 20
    assert (pods["pod-1"].namespace, pods["pod-1"].uid, pods["pod-1"].qos) == ("default", a.uid, "LS")
    assert pods["pod-2"].usage.cpu_cores == pytest.approx(0.25) and pods["pod-2"].qos == "BE"
    # pod-2 is gone from the node model: it leaves with its last container
    del known[b.id]
    w.add(node_sample(300.0, 4.0, GIB), {"a1": usage(a, 3.0, 100 << 20)}, known.get)
    assert [p.name for p in w.pods(300.0)] == ["pod-1"] and len(w) == 1
    # a pod whose containers are not running this round (known to the model) stays
    w.add(node_sample(301.0, 4.0, GIB), {}, known.get)
    assert len(w) == 1
    # nothing in the window: not reported
    assert w.pods(301.0 + 2 * 100 + 20) == []


def test_memory_is_bounded_whatever_the_uptime_and_pods_cost_a_fixed_amount() -> None:
    w = UsageWindows(max_points=100)
    w.keep(200, 50)
    pods = [sandbox(i) for i in range(20)]
    known = {p.id: p for p in pods}
    for t in range(5000):
        w.add(node_sample(float(t), 1.0, GIB), {p.id: usage(p, 0.1, 1 << 20) for p in pods}, known.get)
    assert w.points <= 101  # thinned to one point per horizon / max_points
    assert len(w) == 20
    assert all(len(p.buckets) == 4 * (POD_BUCKETS + 1) for p in w._pods.values())
    assert MAX_POINTS >= 1800  # the default 30-minute window at one round a second is not thinned


def test_the_collect_policy_is_koordlets_merge_of_the_spec_over_its_defaults() -> None:
    assert collect_policy(None) == (CollectPolicy(60, 300, (300.0, 600.0, 1800.0)), [])
    spec = {
        "metricCollectPolicy": {
            "aggregateDurationSeconds": 120,
            "reportIntervalSeconds": 40,
            "nodeAggregatePolicy": {"durations": ["5m0s", "1h30m", "90s", "bogus", "5m"]},
            "nodeMemoryCollectPolicy": "usageWithoutPageCache",
        }
    }
    policy, notes = collect_policy(spec)
    assert policy == CollectPolicy(40, 120, (300.0, 5400.0, 90.0))
    assert policy.horizon == 5400.0
    assert notes == ["spec.metricCollectPolicy.nodeAggregatePolicy.durations: 'bogus' left out (not a duration)"]
    # koordlet's floors: 30 s between reports, 60 s of aggregation; the probe's ConfigMap asked for 20 s
    asked = {"metricCollectPolicy": {"reportIntervalSeconds": 20, "aggregateDurationSeconds": 10}}
    policy, notes = collect_policy(asked)
    assert (policy.report_seconds, policy.aggregate_seconds) == (30, 60) and len(notes) == 2
    assert collect_policy({"metricCollectPolicy": {"reportIntervalSeconds": 2}}, min_report=1)[0].report_seconds == 2
    # an empty list asks for no aggregated usage; an object without durations keeps the default
    assert collect_policy({"metricCollectPolicy": {"nodeAggregatePolicy": {"durations": []}}})[0].durations == ()
    assert collect_policy({"metricCollectPolicy": {"nodeAggregatePolicy": {}}})[0].durations == (300, 600, 1800)
    _, notes = collect_policy({"metricCollectPolicy": {"nodeMemoryCollectPolicy": "usageWithPageCache"}})
    assert notes and "usageWithoutPageCache reported" in notes[0]


def test_durations_and_quantities_are_written_as_go_writes_them() -> None:
    for text, seconds, back in [
        ("5m0s", 300, "5m0s"),
        ("5m", 300, "5m0s"),
        ("1h30m", 5400, "1h30m0s"),
        ("90s", 90, "1m30s"),
        ("1.5s", 1.5, "1.5s"),
        ("500ms", 0.5, "500ms"),
        ("0", 0, "0s"),
        ("24h", 86400, "24h0m0s"),
    ]:
        assert parse_duration(text) == pytest.approx(seconds) and format_duration(seconds) == back
    assert parse_duration("5x") is None and parse_duration("") is None and parse_duration("m") is None
    assert [cpu_quantity(c) for c in (1.1465, 2.0, 0.0, 0.0009, -1.0)] == ["1146m", "2", "0", "0", "0"]
    assert [memory_quantity(m) for m in (GIB, 512 << 20, 1536, 1537.9, 0)] == ["1Gi", "512Mi", "1536", "1537", "0"]


def test_the_priority_class_is_koordinators() -> None:
    label = "koordinator.sh/priority-class"
    assert priority_class({label: "koord-batch"}, 9500, "LS") == "koord-batch"  # the label first
    assert priority_class({label: "gold"}, 9500, "LS") == "koord-prod"  # a bad label: the QoS default, not spec
    assert priority_class({}, 9500, "BE") == "koord-prod"  # spec.priority's range
    assert priority_class({}, 7000, "LS") == "koord-mid" and priority_class({}, 3999, "LS") == "koord-free"
    assert priority_class({}, 0, "BE") == "koord-batch"  # no range: by QoS
    assert priority_class({}, None, "LSR") == "koord-prod" and priority_class({}, None, "other") == ""


def measured(pods: int = 2, seconds: int = 400, mixed: bool = True) -> UsageWindows:
    """``pods`` pods of 0.5 cores and 256 MiB each (every other one BE when ``mixed``), on a
    node using 3 cores and 8 GiB of which LS's class 1 core and 1 GiB."""
    w = UsageWindows()
    w.keep(1800, 300)
    classes = [QoSClass.BE if mixed and i % 2 else QoSClass.LS for i in range(pods)]
    sandboxes = [sandbox(i, q.value) for i, q in enumerate(classes)]
    known = {p.id: p for p in sandboxes}
    for t in range(seconds):
        containers = {p.id: usage(p, 0.5, 256 << 20, q) for p, q in zip(sandboxes, classes, strict=True)}
        ls = {"LS": ClassUsage(cpu_cores=1.0, memory_bytes=GIB)}
        w.add(node_sample(float(t), 3.0, 8 * GIB, ls), containers, known.get)
    return w


def no_priority(pod: PodLike) -> int | None:
    return None


def test_the_status_has_what_koord_manager_reads_and_the_crd_takes() -> None:
    report = status(measured(), CollectPolicy(), 399.0, WALL, no_priority)
    assert report is not None
    valid_status(report)
    assert report["updateTime"] == "2026-12-06T01:02:03Z"
    metric = report["nodeMetric"]
    assert metric["nodeUsage"] == {"resources": {"cpu": "3", "memory": "8Gi"}}
    assert metric["systemUsage"] == {"resources": {"cpu": "2", "memory": "7Gi"}}
    assert [a["duration"] for a in metric["aggregatedNodeUsages"]] == ["5m0s", "10m0s", "30m0s"]
    five, ten, thirty = metric["aggregatedNodeUsages"]
    assert five["usage"]["p95"] == {"resources": {"cpu": "3", "memory": "8Gi"}}
    assert set(five["usage"]) == {"avg", "p50", "p90", "p95", "p99"}
    assert ten["usage"]["avg"] == {"resources": {"cpu": "3", "memory": "8Gi"}}  # 399 s of 600: enough
    assert thirty["usage"] == {k: {} for k in ("avg", "p50", "p90", "p95", "p99")}  # of 1800: cold, as koordlet
    assert metric["aggregatedSystemUsages"][0]["usage"]["avg"] == {"resources": {"cpu": "2", "memory": "7Gi"}}
    assert report["podsMetric"] == [
        {
            "name": "pod-0",
            "namespace": "default",
            "podUsage": {"resources": {"cpu": "500m", "memory": "256Mi"}},
            "priority": "koord-prod",
            "qos": "LS",
        },
        {
            "name": "pod-1",
            "namespace": "default",
            "podUsage": {"resources": {"cpu": "500m", "memory": "256Mi"}},
            "priority": "koord-batch",
            "qos": "BE",
        },
    ]
    # what koord-manager's batch plugin reads, and nothing it would panic on
    assert {"updateTime", "nodeMetric"} <= set(report) and "systemUsage" in report["nodeMetric"]
    assert patch(report) == [{"op": "add", "path": "/status", "value": report}]


def test_no_report_before_a_measurement_and_never_without_node_metric() -> None:
    w = UsageWindows()
    w.keep(1800, 300)
    assert status(w, CollectPolicy(), 10.0, WALL, no_priority) is None
    w.add(node_sample(11.0, 1.0, GIB), {}, lambda _: None)
    report = status(w, CollectPolicy(), 12.0, WALL, no_priority)
    assert report is not None and set(report) == {"updateTime", "nodeMetric"}  # no pods: no podsMetric, as koordlet
    assert set(report["nodeMetric"]) >= {"nodeUsage", "systemUsage"}
    valid_status(report)
    assert status(w, CollectPolicy(), 12.0 + 301, WALL, no_priority) is None  # older than the window: none
    none = status(w, CollectPolicy(durations=()), 12.0, WALL, no_priority)
    assert none is not None and "aggregatedNodeUsages" not in none["nodeMetric"]


def test_the_reports_size_grows_with_its_pods_alone() -> None:
    """Same-sized pods: each adds the same bytes; nothing else depends on their number."""
    sizes = {}
    for n in (1, 2, 10, 100):
        report = status(measured(pods=n, seconds=60, mixed=False), CollectPolicy(), 59.0, WALL, no_priority)
        assert report is not None
        for p in report["podsMetric"]:  # names of one length, so every entry is one size
            p["name"] = f"pod-{int(p['name'][4:]):04d}"
        sizes[n] = len(json.dumps(report, separators=(",", ":")))
    per_pod = sizes[2] - sizes[1]
    assert sizes[10] == sizes[1] + 9 * per_pod and sizes[100] == sizes[1] + 99 * per_pod
    assert per_pod < 200


def test_the_qos_managers_rounds_feed_the_usage_even_with_the_manager_off(tmp_path: Path) -> None:
    node, rec, _, script, quota = node_with_pods(tmp_path)
    from nriplugin.qos.manager import QoSManager

    windows = UsageWindows()
    windows.keep(1800, 300)
    mgr = QoSManager(node.model, node.desired, rec, script, node.rules, usage=windows)
    be, ls = make_pod(1, "BE"), make_pod(2, "LS")
    script.by_container = {
        make_container(1, be).id: ContainerUsage(QoSClass.BE, be.id, 2.0, 100 << 20, 100 << 20),
        make_container(2, ls).id: ContainerUsage(QoSClass.LS, ls.id, 0.5, 200 << 20, 200 << 20),
    }
    mgr.round()
    assert windows.rounds == 1 and quota.read_text() == "100000"
    node.rules.set(Policy.model_validate({"qosManager": {"enable": False}}), "test")
    script.advance(1.0)
    mgr.round()
    assert quota.read_text() == "-1"  # off: nothing decided, the overlays withdrawn
    assert windows.rounds == 2  # and still measured
    pods = {p.name: p.usage.cpu_cores for p in windows.pods(script.t)}
    assert pods == {"pod-1": 2.0, "pod-2": 0.5}
    avg = windows.average(script.t, 300)
    assert avg is not None and avg[0].cpu_cores == 2.0 and avg[1].cpu_cores == 0.0  # 2 cores busy, all pods'
