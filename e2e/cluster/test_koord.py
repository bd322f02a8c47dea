"""Koordinator's control plane beside the agent: koord-manager v1.8.0 (built by kind/build.sh from
the Go module proxy, kind/koord/) with Koordinator's CRDs (kind/crds/) and a
``slo-controller-config``, installed by this module's fixture and removed at its end (the other
cluster tests write NodeSLOs and batch resources of their own, which koord-manager would
overwrite). Then, through the real API server, scheduler and kubelet:

- the agent's NodeMetric report becomes ``kubernetes.io/batch-cpu`` / ``batch-memory`` on the
  worker, equal to Koordinator's formula applied to what the agent reported, and a change of
  ``reclaimThresholdPercent`` in the ConfigMap moves them;
- a BE pod asking for batch resources is scheduled onto them and born with their values;
- a ConfigMap edit reaches the worker's cgroups (ConfigMap → NodeSLO → agent) within seconds;
- the agent gone longer than ``degradeTimeMinutes``: koord-manager takes the batch resources
  away; the agent back: they return.
"""

from __future__ import annotations

import calendar
import json
import math
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from functools import partial
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.utils import parse_quantity as _parse_quantity

from testkit.kind import AGENT_LABEL, AGENT_NS, ROOT, Cluster, Node, metric_sum, until

from .test_born_right import IMAGE, NODESLO, SPEC_ANNOTATION, WATCHED

KOORD = ROOT / "kind" / "koord"
CRDS = ROOT / "kind" / "crds"
NS = "koordinator-system"
CONFIGMAP = "slo-controller-config"
NODEMETRIC = ("slo.koordinator.sh", "v1alpha1", "nodemetrics")
BATCH_CPU, BATCH_MEMORY = "kubernetes.io/batch-cpu", "kubernetes.io/batch-memory"
COLOCATION_LABEL = "nriplugin.io/colocation"  # the agent's DaemonSet selects it
MiB = 1 << 20
# The BE pod's batch resources (smaller than the node's, which depend on the machine's load)
BE_REQ = {BATCH_CPU: "250", BATCH_MEMORY: "128Mi"}
BE_LIM = {BATCH_CPU: "500", BATCH_MEMORY: "256Mi"}
LOW_PRIORITY = {"koord-batch", "koord-free"}  # what the batch formula does not count as used
PRIORITY_CLASSES = {"koord-prod", "koord-mid", "koord-batch", "koord-free"}
PRIORITY_RANGES = [(9000, 9999, "koord-prod"), (7000, 7999, "koord-mid"), (5000, 5999, "koord-batch")]
PRIORITY_RANGES.append((3000, 3999, "koord-free"))


@dataclass
class Koord:
    """koord-manager running, its ConfigMap as applied, the worker."""

    kc: Cluster
    worker: str
    data: dict[str, dict[str, Any]]  # the ConfigMap's data, each key's JSON parsed
    edits: list[str] = field(default_factory=list)

    def colocation(self) -> dict[str, Any]:
        return self.data["colocation-config"]

    def edit(self, key: str, **values: Any) -> None:
        """Sets ``values`` in the ConfigMap's ``key`` (each a JSON object; a nested dict replaces)."""
        self.data[key].update(values)
        self.apply()
        self.edits.append(f"{key}: {values}")

    def edit_be_memory_qos(self, low_limit_percent: int) -> None:
        qos = {"beClass": {"memoryQOS": {"enable": True, "lowLimitPercent": low_limit_percent}}}
        self.data["resource-qos-config"]["clusterStrategy"] = qos
        self.apply()

    def apply(self) -> None:
        body = {"data": {k: json.dumps(v, indent=2) for k, v in self.data.items()}}
        self.kc.core.patch_namespaced_config_map(CONFIGMAP, NS, body)

    def batch(self) -> tuple[int, int] | None:
        """The worker's batch-cpu (milli-cores) and batch-memory (bytes), None while absent."""
        alloc = self.kc.core.read_node(self.worker).status.allocatable or {}
        if BATCH_CPU not in alloc or BATCH_MEMORY not in alloc:
            return None
        return int(parse_quantity(alloc[BATCH_CPU])), int(parse_quantity(alloc[BATCH_MEMORY]))

    def nodemetric(self) -> dict[str, Any]:
        found: dict[str, Any] = self.kc.custom.get_cluster_custom_object(*NODEMETRIC, self.worker)
        return found


def parse_quantity(q: str) -> Decimal:
    return Decimal(_parse_quantity(q))  # type: ignore[no-untyped-call]


def _load_config() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((KOORD / "slo-controller-config.yaml").read_text())
    return doc


def _koordinator_crds() -> list[Any]:
    """Koordinator's CRD files (kind/crds/; the operator's are not Koordinator's)."""
    return sorted(p for p in CRDS.glob("*.yaml") if not p.name.startswith("monitoring.coreos.com_"))


def _crd_name(path: Any) -> str:
    return str(yaml.safe_load(path.read_text())["metadata"]["name"])


def _kubectl(kc: Cluster, *args: str, timeout: float = 120) -> str:
    r = kc.kubectl(*args, timeout=timeout)
    assert r.returncode == 0, f"kubectl {' '.join(args)}: exit {r.returncode}: {r.stderr.strip()[-2000:]}"
    return str(r.stdout)


def _node_meta(kc: Cluster) -> dict[str, tuple[dict[str, str], dict[str, str]]]:
    return {
        n.metadata.name: (dict(n.metadata.annotations or {}), dict(n.metadata.labels or {}))
        for n in kc.core.list_node().items
    }


def _restore_nodes(kc: Cluster, before: dict[str, tuple[dict[str, str], dict[str, str]]]) -> None:
    """What koord-manager left on the nodes, taken away: its resources on the status, the
    annotations and labels it added or changed."""
    for node in kc.core.list_node().items:
        name = node.metadata.name
        ops = []
        for part in ("capacity", "allocatable"):
            for res in getattr(node.status, part) or {}:
                if res.startswith(("kubernetes.io/batch-", "kubernetes.io/mid-")):
                    ops.append({"op": "remove", "path": f"/status/{part}/{res.replace('/', '~1')}"})
        if ops:
            kc.core.patch_node_status(name, ops)
        annotations, labels = before.get(name, ({}, {}))
        meta: dict[str, dict[str, str | None]] = {"annotations": {}, "labels": {}}
        for key, value in (node.metadata.annotations or {}).items():
            if annotations.get(key) != value:
                meta["annotations"][key] = annotations.get(key)
        for key, value in (node.metadata.labels or {}).items():
            if labels.get(key) != value:
                meta["labels"][key] = labels.get(key)
        for key, value in labels.items():  # a label taken away (the agent's, by the degrade test)
            if (node.metadata.labels or {}).get(key) != value:
                meta["labels"][key] = value
        if meta["annotations"] or meta["labels"]:
            kc.core.patch_node(name, {"metadata": meta})


@pytest.fixture(scope="module")
def koord(kind_cluster: Cluster) -> Iterator[Koord]:
    kc = kind_cluster
    worker = kc.worker()
    nodes_before = _node_meta(kc)
    crds: Any = client.ApiextensionsV1Api(kc.api).list_custom_resource_definition()
    served = {c.metadata.name for c in crds.items}
    nodeslos_before = {o["metadata"]["name"] for o in kc.custom.list_cluster_custom_object(*NODESLO)["items"]}
    created: list[str] = []
    try:
        for path in _koordinator_crds():
            name = _crd_name(path)
            if name in served:
                continue  # the chart's NodeSLO CRD: the agent's, left as it is
            created.append(name)
            _kubectl(kc, "apply", "--server-side", "-f", str(path))
        if created:
            _kubectl(kc, "wait", "--for=condition=Established", "--timeout=60s", *[f"crd/{n}" for n in created])
        _kubectl(kc, "apply", "-f", str(KOORD / "koord-manager.yaml"), "-f", str(KOORD / "slo-controller-config.yaml"))
        _kubectl(kc, "-n", NS, "rollout", "status", "deployment/koord-manager", "--timeout=120s")
        data = {k: json.loads(v) for k, v in _load_config()["data"].items()}
        k = Koord(kc, worker, data)
        until(lambda: k.nodemetric(), 60, f"koord-manager created no NodeMetric {worker}", 0.5)
        until(lambda: kc.custom.get_cluster_custom_object(*NODESLO, worker), 60, f"no NodeSLO {worker}", 0.5)
        yield k
    finally:
        # What koord-manager said of the reports: a panic (v1.8.0 recovers one on a status with
        # no nodeMetric, and never sets the batch resources) or an error naming the NodeMetric.
        errors: list[str] = []
        try:
            log = kc.kubectl("-n", NS, "logs", "deployment/koord-manager", timeout=60).stdout
            errors = [line for line in log.splitlines() if line.startswith("E") or "panic" in line.lower()]
            print(f"koord-manager's log: {len(log.splitlines())} lines, {len(errors)} errors")
            for line in errors[:20]:
                print(f"  {line[:300]}")
        except subprocess.TimeoutExpired as exc:
            print(f"koord-manager's log not read: {exc}")
        # koord-manager first (nothing writes after it), then what it made, then Koordinator's CRDs
        kc.kubectl("delete", "--ignore-not-found", "--wait", "-f", str(KOORD / "koord-manager.yaml"), timeout=180)
        for o in kc.custom.list_cluster_custom_object(*NODESLO)["items"]:
            if o["metadata"]["name"] not in nodeslos_before:
                kc.custom.delete_cluster_custom_object(*NODESLO, o["metadata"]["name"])
        if created:
            kc.kubectl("delete", "--ignore-not-found", "--wait", "--timeout=120s", *[f"crd/{n}" for n in created])
        _restore_nodes(kc, nodes_before)
        until(lambda: kc.agent_ready(worker), 180, f"the agent Ready again on {worker}", 1.0)
        # nothing left behind: the namespace, Koordinator's CRDs the test added, the NodeSLOs
        # koord-manager made, anything on the nodes
        until(lambda: NS not in [n.metadata.name for n in kc.core.list_namespace().items], 120, f"{NS} deleted", 1.0)
        crds = client.ApiextensionsV1Api(kc.api).list_custom_resource_definition()
        left = {c.metadata.name for c in crds.items}
        assert left == served, f"CRDs left: {sorted(left - served)}"
        nodeslos = {o["metadata"]["name"] for o in kc.custom.list_cluster_custom_object(*NODESLO)["items"]}
        assert nodeslos == nodeslos_before, f"NodeSLOs left: {sorted(nodeslos - nodeslos_before)}"
        assert _node_meta(kc) == nodes_before, "the nodes' annotations or labels differ from before"
        for node in kc.core.list_node().items:
            extra = [r for r in node.status.allocatable or {} if r.startswith("kubernetes.io/")]
            assert not extra, f"{node.metadata.name} still has {extra}"
        print(f"koord-manager, its CRDs ({len(created)}), NodeSLOs and node resources removed: nothing left")
        assert not [line for line in errors if _about_the_report(line)], errors


def _about_the_report(line: str) -> bool:
    """Whether a koord-manager log line is an error about the NodeMetric (our report) or a panic.

    Not one: its NodeMetric controller creating an object its informer has not seen yet
    (nodemetric_controller.go reads from the cache, creates on a miss, and requeues on
    AlreadyExists), a race of its own that the next reconcile settles.
    """
    low = line.lower()
    if "panic" in low:
        return True
    return "nodemetric" in low and "already exists" not in low


# --- Koordinator's batch formula, as koord-manager v1.8.0 computes it ---------------------------
# pkg/slo-controller/noderesource/plugins/batchresource/plugin.go (calculateOnNode) and
# plugins/util/util.go (CalculateBatchResourceByPolicy, "usage" policy for CPU and memory):
#   batch = capacity - safetyMargin - max(systemUsage, nodeReserved) - HPUsed, at least 0
#   safetyMargin = int(capacity x (100 - reclaimThresholdPercent) / 100)   (milli-cores; bytes)
#   nodeReserved = max(capacity - allocatable, 0) (no reservation annotation here)
#   HPUsed = the sum over the node's Running and Pending pods not of priority batch or free: their
#            reported podUsage, else their request (an LSE pod: its CPU request, its memory use)
#            + the usage of reported pods not in the pod list, unless reported batch or free


def _cpu_mem(resources: dict[str, Any] | None) -> tuple[Decimal, Decimal]:
    r = resources or {}
    return Decimal(parse_quantity(r.get("cpu", "0"))), Decimal(parse_quantity(r.get("memory", "0")))


def _milli(q: Decimal) -> int:  # Quantity.MilliValue(): rounded up
    return math.ceil(q * 1000)


def _qos(pod: Any) -> str:
    q = (pod.metadata.labels or {}).get("koordinator.sh/qosClass")
    if q is not None:
        return q if q in {"LSE", "LSR", "LS", "BE", "SYSTEM"} else "NONE"
    return {"Guaranteed": "LSR", "Burstable": "LS", "BestEffort": "BE"}.get(pod.status.qos_class or "", "NONE")


def _priority(pod: Any) -> str:
    labels = pod.metadata.labels or {}
    raw = ""
    if "koordinator.sh/priority-class" in labels:  # a name it does not know: none, then by QoS
        raw = (
            labels["koordinator.sh/priority-class"]
            if labels["koordinator.sh/priority-class"] in PRIORITY_CLASSES
            else ""
        )
    elif pod.spec.priority is not None:
        raw = next((name for lo, hi, name in PRIORITY_RANGES if lo <= pod.spec.priority <= hi), "")
    if raw:
        return raw
    return {"SYSTEM": "koord-prod", "LSE": "koord-prod", "LSR": "koord-prod", "LS": "koord-prod"}.get(
        _qos(pod), "koord-batch" if _qos(pod) == "BE" else ""
    )


def _request(pod: Any) -> tuple[Decimal, Decimal]:
    """The pod's CPU and memory request (Kubernetes' PodRequests: containers' sum, at least each
    init container's, plus the overhead)."""
    cpu, mem = Decimal(0), Decimal(0)
    for c in pod.spec.containers:
        rc, rm = _cpu_mem((c.resources.requests if c.resources else None) or {})
        cpu, mem = cpu + rc, mem + rm
    for c in pod.spec.init_containers or []:
        rc, rm = _cpu_mem((c.resources.requests if c.resources else None) or {})
        cpu, mem = max(cpu, rc), max(mem, rm)
    oc, om = _cpu_mem(pod.spec.overhead or {})
    return cpu + oc, mem + om


@dataclass
class Formula:
    cpu: int  # milli-cores
    memory: int  # bytes
    terms: str


def formula(node: Any, nodemetric: dict[str, Any], pods: list[Any], colocation: dict[str, Any]) -> Formula:
    status = nodemetric["status"]
    reported = {(p["namespace"], p["name"]): p for p in status.get("podsMetric") or []}
    dangling = dict(reported)
    hp_cpu, hp_mem = Decimal(0), Decimal(0)
    for pod in pods:
        if pod.status.phase not in ("Running", "Pending"):
            continue
        key = (pod.metadata.namespace, pod.metadata.name)
        metric = reported.get(key)
        dangling.pop(key, None)
        if _priority(pod) in LOW_PRIORITY:
            continue
        req_cpu, req_mem = _request(pod)
        if metric is None:
            hp_cpu, hp_mem = hp_cpu + req_cpu, hp_mem + req_mem
            continue
        use_cpu, use_mem = _cpu_mem(metric["podUsage"].get("resources"))
        hp_cpu += req_cpu if _qos(pod) == "LSE" else use_cpu
        hp_mem += use_mem
    for metric in dangling.values():
        if metric.get("priority") not in LOW_PRIORITY:
            use_cpu, use_mem = _cpu_mem(metric["podUsage"].get("resources"))
            hp_cpu, hp_mem = hp_cpu + use_cpu, hp_mem + use_mem
    assert "node.koordinator.sh/reservation" not in (node.metadata.annotations or {})
    cap_cpu, cap_mem = _cpu_mem(node.status.capacity)
    alloc_cpu, alloc_mem = _cpu_mem(node.status.allocatable)
    sys_cpu, sys_mem = _cpu_mem(status["nodeMetric"]["systemUsage"].get("resources"))
    sys_cpu, sys_mem = max(sys_cpu, cap_cpu - alloc_cpu, Decimal(0)), max(sys_mem, cap_mem - alloc_mem, Decimal(0))
    margin_cpu = int(_milli(cap_cpu) * ((100 - colocation["cpuReclaimThresholdPercent"]) / 100.0)) / Decimal(1000)
    margin_mem = Decimal(int(math.ceil(cap_mem) * ((100 - colocation["memoryReclaimThresholdPercent"]) / 100.0)))
    cpu = max(cap_cpu - margin_cpu - sys_cpu - hp_cpu, Decimal(0))
    mem = max(cap_mem - margin_mem - sys_mem - hp_mem, Decimal(0))
    terms = (
        f"cpu {_milli(cap_cpu)}m - {_milli(margin_cpu)}m - max(system, reserved) {_milli(sys_cpu)}m"
        f" - HP {_milli(hp_cpu)}m; memory {cap_mem / MiB:.0f}Mi - {margin_mem / MiB:.1f}Mi"
        f" - {sys_mem / MiB:.1f}Mi - HP {hp_mem / MiB:.1f}Mi"
    )
    return Formula(_milli(cpu), math.ceil(mem), terms)


def settled(k: Koord, timeout: float = 100) -> tuple[tuple[int, int] | None, Formula, str]:
    """After the agent's next report and koord-manager's answer to it: the node's batch values,
    the formula's from that same report (the NodeMetric unchanged around the node's reading), and
    the report's time."""
    deadline = time.monotonic() + timeout
    last = k.nodemetric()["status"].get("updateTime")
    while time.monotonic() < deadline:
        before = k.nodemetric()
        stamp = before["status"].get("updateTime")
        if stamp == last:
            time.sleep(0.5)
            continue
        time.sleep(3)  # koord-manager's reconcile of the report
        node = k.kc.core.read_node(k.worker)
        pods = k.kc.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={k.worker}").items
        after = k.nodemetric()
        if after["status"].get("updateTime") != stamp:
            last = after["status"].get("updateTime")
            continue  # another report came meanwhile: the next one
        alloc = node.status.allocatable or {}
        values = None
        if BATCH_CPU in alloc and BATCH_MEMORY in alloc:
            values = (int(parse_quantity(alloc[BATCH_CPU])), int(parse_quantity(alloc[BATCH_MEMORY])))
        return values, formula(node, after, pods, k.colocation()), str(stamp)
    raise AssertionError(f"no NodeMetric report from the agent on {k.worker} within {timeout:g} s")


def _show(what: str, values: tuple[int, int] | None, f: Formula, stamp: str) -> None:
    node = f"batch-cpu {values[0]} batch-memory {values[1]} ({values[1] / MiB:.1f}Mi)" if values else "no batch"
    print(
        f"{what}: report of {stamp}: node {node}; formula batch-cpu {f.cpu} batch-memory {f.memory}"
        f" ({f.memory / MiB:.1f}Mi) = {f.terms}"
    )


def _equal(values: tuple[int, int] | None, f: Formula) -> bool:
    return values is not None and abs(values[0] - f.cpu) <= 1 and abs(values[1] - f.memory) <= 1


def matched(k: Koord, what: str, reports: int = 3) -> tuple[int, int]:
    """The node's batch values once they equal the formula on the report they came from (within
    a milli-core and a byte), over at most ``reports`` reports: koord-manager reads the node's
    pods when the report arrives, the test a few seconds later, and a pod that came or went in
    between (the tests before this one clean up) makes that one report's comparison moot. Every
    comparison is printed."""
    seen = []
    for _ in range(reports):
        values, f, stamp = settled(k)
        _show(what, values, f, stamp)
        seen.append((values, f.cpu, f.memory, f.terms))
        if values is not None and _equal(values, f):
            return values
    raise AssertionError(f"the node's batch resources never equal the formula: {seen}")


def test_the_agents_report_becomes_the_nodes_batch_resources_by_koordinators_formula(koord: Koord) -> None:
    """The agent reports the worker's NodeMetric; koord-manager sets batch-cpu and batch-memory
    on its allocatable, equal to the formula applied to that report; a lower
    reclaimThresholdPercent in the ConfigMap lowers them by what the formula says."""
    k = koord
    until(k.batch, 120, f"koord-manager set no batch resources on {k.worker}", 1.0)
    c = dict(k.colocation())  # as applied (k.edit changes k.colocation() in place)
    cpu_before, mem_before = matched(
        k, f"reclaim {c['cpuReclaimThresholdPercent']} % CPU, {c['memoryReclaimThresholdPercent']} % memory"
    )
    assert cpu_before > 0 and mem_before > 0, "the formula leaves nothing to batch"
    try:
        k.edit("colocation-config", cpuReclaimThresholdPercent=70, memoryReclaimThresholdPercent=45)
        cpu, mem = matched(k, "reclaim 70 % CPU, 45 % memory")
        assert cpu < cpu_before and mem < mem_before, f"moved from {(cpu_before, mem_before)} to {(cpu, mem)}"
    finally:
        k.edit(
            "colocation-config",
            cpuReclaimThresholdPercent=c["cpuReclaimThresholdPercent"],
            memoryReclaimThresholdPercent=c["memoryReclaimThresholdPercent"],
        )


@dataclass
class BEPod:
    pod: Any
    node: Node
    cgroup: dict[str, Any]
    before: dict[str, float]
    after: dict[str, float]


def wait_be_unsqueezed(kc: Cluster, node: str, calm_for: float = 5.0, timeout: float = 180.0) -> None:
    """Until the QoS manager has left BE the whole node for ``calm_for`` seconds. Koordinator's
    NodeSLO asks for the cpuset suppress policy (koord-manager's default
    ``resourceUsedThresholdWithBE.cpuSuppressPolicy``), under which BE's limit is a number of
    CPUs, never none (Cluster.wait_be_unquoted waits for none: the cfsQuota policy's)."""
    cpus = float(parse_quantity(kc.core.read_node(node).status.capacity["cpu"]))
    deadline = time.monotonic() + timeout
    since: float | None = None
    last = None
    while time.monotonic() < deadline:
        last = kc.metrics(node).get("nriplugin_qos_be_cpu_limit_cores")
        if last is not None and last >= cpus:
            since = since or time.monotonic()
            if time.monotonic() - since >= calm_for:
                return
        else:
            since = None
        time.sleep(0.5)
    raise AssertionError(f"BE still held below {cpus:g} CPUs on {node} after {timeout:g} s (limit {last})")


@pytest.fixture(scope="module")
def be_pod(koord: Koord) -> Iterator[BEPod]:
    """A BE pod asking for batch resources (with the annotation Koordinator's webhook would add),
    scheduled by the scheduler (no nodeName, no selector: the batch resources decide), its
    cgroup read right after its start."""
    k, kc = koord, koord.kc
    ns = "koord-be"
    until(lambda: (k.batch() or (0, 0))[0] >= 500, 120, f"{k.worker}: batch-cpu >= 500 for the BE pod", 1.0)
    node = kc.node(k.worker)
    kc.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    try:
        wait_be_unsqueezed(kc, k.worker)
        before = kc.metrics(k.worker)
        annotation = json.dumps({"containers": {"main": {"requests": BE_REQ, "limits": BE_LIM}}})
        ctr = client.V1Container(
            name="main",
            image=IMAGE,
            image_pull_policy="Never",
            command=["sleep", "3600"],
            resources=client.V1ResourceRequirements(requests=BE_REQ, limits=BE_LIM),
        )
        pod = client.V1Pod(
            metadata=client.V1ObjectMeta(
                name="batch",
                namespace=ns,
                labels={
                    "app": "batch",
                    "koordinator.sh/qosClass": "BE",
                    "koordinator.sh/priority-class": "koord-batch",
                },
                annotations={SPEC_ANNOTATION: annotation},
            ),
            spec=client.V1PodSpec(containers=[ctr], restart_policy="Never", termination_grace_period_seconds=1),
        )
        kc.core.create_namespaced_pod(ns, pod)
        (running,) = kc.wait_pods(ns, "app=batch", 1)
        cid = kc.container_ids(running)["main"]
        cgroup = {c: node.container_cgroup(cid, c) for c in ("cpu", "memory")}
        values = {
            "cpu.shares": node.read(cgroup["cpu"], "cpu.shares"),
            "cpu.cfs_quota_us": node.read(cgroup["cpu"], "cpu.cfs_quota_us"),
            "memory.limit_in_bytes": node.read(cgroup["memory"], "memory.limit_in_bytes"),
        }
        print(f"BE pod {ns}/batch on {running.spec.node_name}, its cgroup at start: {values}")
        time.sleep(2)  # the reconciler's look after StartContainer: it must find nothing to repair
        after = kc.metrics(k.worker)
        yield BEPod(running, node, cgroup, before, after)
    finally:
        kc.core.delete_namespace(ns, grace_period_seconds=0)
        until(lambda: ns not in [n.metadata.name for n in kc.core.list_namespace().items], 120, f"{ns} deleted")


def test_a_be_pod_is_scheduled_onto_batch_resources_and_born_with_their_values(koord: Koord, be_pod: BEPod) -> None:
    w = be_pod
    assert w.pod.spec.node_name == koord.worker, "the scheduler put the BE pod elsewhere"
    assert w.pod.status.qos_class == "BestEffort"
    assert w.node.read(w.cgroup["cpu"], "cpu.shares") == "256"  # 250 milli-cores of batch-cpu
    assert w.node.read(w.cgroup["cpu"], "cpu.cfs_quota_us") == "50000"  # a 500 milli-core limit
    assert w.node.read(w.cgroup["memory"], "memory.limit_in_bytes") == str(256 * MiB)
    created = metric_sum(w.after, "nriplugin_hook_duration_seconds_count", event="create_container") - metric_sum(
        w.before, "nriplugin_hook_duration_seconds_count", event="create_container"
    )
    assert created >= 1
    moved = {key: (w.before.get(key, 0.0), v) for key, v in w.after.items() if key.startswith(WATCHED)}
    moved = {key: bv for key, bv in moved.items() if bv[0] != bv[1]}
    assert not moved, f"failures, drift or repairs (before, after): {moved}: the values were not in the hook's answer"


def test_a_configmap_edit_reaches_the_nodes_cgroups_through_koordinators_nodeslo(koord: Koord, be_pod: BEPod) -> None:
    """slo-controller-config's resource-qos-config → koord-manager's NodeSLO → the agent → BE's
    memory protection (memory.soft_limit_in_bytes: lowLimitPercent of its batch-memory request)."""
    k, w = koord, be_pod

    def soft() -> int:
        return int(w.node.read(w.cgroup["memory"], "memory.soft_limit_in_bytes"))

    def is_soft(want: int) -> bool:
        return soft() == want

    until(lambda: soft() == 64 * MiB, 10, "BE's soft limit is not 50 % of its 128Mi (the ConfigMap as applied)", 0.1)
    took = []
    try:
        for percent in (25, 75):
            t0 = time.monotonic()
            k.edit_be_memory_qos(percent)
            want = 128 * MiB * percent // 100
            until(
                partial(is_soft, want),
                10,
                f"BE's soft limit not {percent} % 10 s after the ConfigMap edit",
                0.02,
            )
            took.append(time.monotonic() - t0)
            nodeslo = k.kc.custom.get_cluster_custom_object(*NODESLO, k.worker)
            assert nodeslo["spec"]["resourceQOSStrategy"]["beClass"]["memoryQOS"]["lowLimitPercent"] == percent
    finally:
        k.edit_be_memory_qos(50)
    print(f"ConfigMap edit to the worker's cgroup (lowLimitPercent 25, 75): {[f'{t:.2f} s' for t in took]}")


def test_the_agent_gone_longer_than_the_degrade_time_takes_the_batch_resources_away(koord: Koord) -> None:
    """degradeTimeMinutes 1 in the ConfigMap; the agent taken off the worker (its node label
    removed: the DaemonSet deletes the pod): koord-manager removes batch-cpu and batch-memory
    once the last report is older than a minute; the label back: the agent reports again and
    they return."""
    k, kc = koord, koord.kc
    until(k.batch, 60, "batch resources on the worker", 1.0)
    k.edit("colocation-config", degradeTimeMinutes=1)
    label_removed = False
    try:
        kc.core.patch_node(k.worker, {"metadata": {"labels": {COLOCATION_LABEL: None}}})
        label_removed = True
        t_stop = time.time()

        def agent_gone() -> bool:
            pods = kc.core.list_namespaced_pod(
                AGENT_NS, label_selector=AGENT_LABEL, field_selector=f"spec.nodeName={k.worker}"
            ).items
            return not pods

        until(agent_gone, 60, f"the agent's pod still on {k.worker}", 0.5)
        last = k.nodemetric()["status"]["updateTime"]
        last_t = calendar.timegm(time.strptime(last, "%Y-%m-%dT%H:%M:%SZ"))
        until(lambda: k.batch() is None, 60 + 30 + 60, "koord-manager left the batch resources", 1.0)
        t_gone = time.time()
        assert t_gone - last_t >= 59, f"batch resources removed {t_gone - last_t:.0f} s after the last report"
        print(
            f"agent stopped {t_stop - last_t:.0f} s after its last report ({last}); batch resources removed"
            f" {t_gone - last_t:.0f} s after it ({t_gone - t_stop:.0f} s after the stop; degradeTimeMinutes 1,"
            " koord-manager's resync 30 s)"
        )
        kc.core.patch_node(k.worker, {"metadata": {"labels": {COLOCATION_LABEL: "true"}}})
        label_removed = False
        t_back = time.time()
        until(lambda: kc.agent_ready(k.worker), 120, f"the agent Ready again on {k.worker}", 0.5)
        t_ready = time.time()
        until(k.batch, 120, "batch resources back once the agent reports again", 0.5)
        t_restored = time.time()
        print(
            f"agent back: Ready {t_ready - t_back:.0f} s after its label, batch resources back"
            f" {t_restored - t_back:.0f} s after it: {k.batch()}"
        )
    finally:
        if label_removed:
            kc.core.patch_node(k.worker, {"metadata": {"labels": {COLOCATION_LABEL: "true"}}})
        k.edit("colocation-config", degradeTimeMinutes=15)
    until(lambda: kc.agent_ready(k.worker), 120, f"the agent Ready again on {k.worker}", 0.5)
