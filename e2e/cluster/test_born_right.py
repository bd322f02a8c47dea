"""Pods scheduled by the real scheduler and started by the real kubelet on the kind worker, the
agent installed by its chart: an LS Deployment and a BE Job with Koordinator's labels and batch
resources get the policy's values (read from the node's cgroup tree), BE runs SCHED_IDLE, LS is
left as the kubelet asked, and the values were in the hook's answer at creation (the agent's
metrics: hooks answered, nothing repaired later). Then the node's NodeSLO, through the real API
server, moves the node's values."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client

from testkit.kind import Cluster, Node, metric_sum, until

IMAGE = "docker.io/library/nriplugin:0.1.0"  # the agent's image, in every node: python3 and coreutils
LS = {"koordinator.sh/qosClass": "LS"}
BE = {"koordinator.sh/qosClass": "BE"}
BATCH_REQ = {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "256Mi"}
BATCH_LIM = {"kubernetes.io/batch-cpu": "1k", "kubernetes.io/batch-memory": "512Mi"}
SPEC_ANNOTATION = "node.koordinator.sh/extended-resource-spec"  # what Koordinator's webhook writes
MiB = 1 << 20
NODESLO = ("slo.koordinator.sh", "v1alpha1", "nodeslos")
WATCHED = ("nriplugin_hook_failures_total", "nriplugin_repaired_total", "nriplugin_drift_total")


@dataclass
class Workload:
    node: Node
    ls_pod: Any
    be_pod: Any
    ls_cgroup: dict[str, Any]
    be_cgroup: dict[str, Any]
    bare_id: str  # a BE Job's container without the webhook's annotation
    before: dict[str, float]  # the agent's metrics before the pods
    after: dict[str, float]  # ... once both run


def ls_deployment(ns: str) -> client.V1Deployment:
    labels = {"app": "web", **LS}
    ctr = client.V1Container(
        name="web",
        image=IMAGE,
        image_pull_policy="Never",
        command=["python3", "-m", "http.server", "8080"],
        resources=client.V1ResourceRequirements(
            requests={"cpu": "100m", "memory": "64Mi"}, limits={"cpu": "500m", "memory": "128Mi"}
        ),
        readiness_probe=client.V1Probe(
            http_get=client.V1HTTPGetAction(path="/", port=8080), period_seconds=1, failure_threshold=30
        ),
    )
    return client.V1Deployment(
        metadata=client.V1ObjectMeta(name="web", namespace=ns),
        spec=client.V1DeploymentSpec(
            replicas=1,
            selector=client.V1LabelSelector(match_labels={"app": "web"}),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(containers=[ctr], termination_grace_period_seconds=1),
            ),
        ),
    )


def be_job(ns: str, name: str = "batch", command: list[str] | None = None, webhook: bool = True) -> client.V1Job:
    """``webhook``: with the annotation Koordinator's webhook would add (none runs here)."""
    annotation = json.dumps({"containers": {"main": {"requests": BATCH_REQ, "limits": BATCH_LIM}}})
    ctr = client.V1Container(
        name="main",
        image=IMAGE,
        image_pull_policy="Never",
        command=command or ["sleep", "3600"],
        resources=client.V1ResourceRequirements(requests=BATCH_REQ, limits=BATCH_LIM),
    )
    return client.V1Job(
        metadata=client.V1ObjectMeta(name=name, namespace=ns),
        spec=client.V1JobSpec(
            backoff_limit=0,
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(
                    labels={"app": name, **BE}, annotations={SPEC_ANNOTATION: annotation} if webhook else {}
                ),
                spec=client.V1PodSpec(containers=[ctr], restart_policy="Never", termination_grace_period_seconds=1),
            ),
        ),
    )


def advertise_batch(kc: Cluster, node: str) -> None:
    """The node's batch resources, as Koordinator's slo-controller would advertise them."""
    amounts = {"kubernetes.io/batch-cpu": "4000", "kubernetes.io/batch-memory": "8Gi"}
    kc.core.patch_node_status(node, {"status": {"capacity": amounts, "allocatable": amounts}})
    until(
        lambda: "kubernetes.io/batch-cpu" in (kc.core.read_node(node).status.allocatable or {}),
        30,
        f"{node} does not show kubernetes.io/batch-cpu as allocatable",
    )


@pytest.fixture(scope="module")
def workload(kind_cluster: Cluster) -> Iterator[Workload]:
    kc = kind_cluster
    ns = "born-right"
    worker = kc.worker()
    node = kc.node(worker)
    advertise_batch(kc, worker)
    kc.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    try:
        kc.wait_be_unquoted(worker)
        before = kc.metrics(worker)
        kc.apps.create_namespaced_deployment(ns, ls_deployment(ns))
        kc.batch.create_namespaced_job(ns, be_job(ns))
        kc.batch.create_namespaced_job(ns, be_job(ns, "bare", webhook=False))
        (ls_pod,) = kc.wait_pods(ns, "app=web", 1)
        (be_pod,) = kc.wait_pods(ns, "app=batch", 1)
        (bare,) = kc.wait_pods(ns, "app=bare", 1)
        assert ls_pod.spec.node_name == be_pod.spec.node_name == worker  # the scheduler put them there
        time.sleep(2)  # the reconciler's look at them after StartContainer, a kubelet sync
        after = kc.metrics(worker)
        ls_id = kc.container_ids(ls_pod)["web"]
        be_id = kc.container_ids(be_pod)["main"]
        cg = {c: node.container_cgroup(ls_id, c) for c in ("cpu", "memory")}
        bg = {c: node.container_cgroup(be_id, c) for c in ("cpu", "memory")}
        yield Workload(node, ls_pod, be_pod, cg, bg, kc.container_ids(bare)["main"], before, after)
    finally:
        kc.core.delete_namespace(ns, grace_period_seconds=0)
        until(lambda: ns not in [n.metadata.name for n in kc.core.list_namespace().items], 120, f"{ns} deleted")


def test_be_is_born_with_the_policys_values_and_ls_as_the_kubelet_asked(workload: Workload) -> None:
    w = workload
    assert w.ls_pod.status.qos_class == "Burstable" and w.be_pod.status.qos_class == "BestEffort"
    # BE, sized from its batch resources (the extended-resource-spec annotation)
    assert w.node.read(w.be_cgroup["cpu"], "cpu.shares") == "512"  # 500 milli-cores
    assert w.node.read(w.be_cgroup["cpu"], "cpu.cfs_quota_us") == "100000"  # 1k milli-cores
    assert w.node.read(w.be_cgroup["memory"], "memory.limit_in_bytes") == str(512 * MiB)
    # LS: as the kubelet asked (100m request, 500m limit), not touched
    assert w.node.read(w.ls_cgroup["cpu"], "cpu.shares") == "102"
    assert w.node.read(w.ls_cgroup["cpu"], "cpu.cfs_quota_us") == "50000"
    assert w.node.read(w.ls_cgroup["memory"], "memory.limit_in_bytes") == str(128 * MiB)


def test_a_batch_pod_without_the_webhooks_annotation_is_born_with_its_batch_values(workload: Workload) -> None:
    """Issue 55, item 3: the agent takes the batch asks from the pod's spec (the API server's),
    and they are in the CreateContainer answer: the container's OCI spec, as the runtime made it
    from the answer, has them (koordlet's hook leaves the kubelet's shares 2 there)."""
    w = workload
    info = json.loads(w.node.exec("crictl", "inspect", w.bare_id))
    cpu = info["info"]["runtimeSpec"]["linux"]["resources"]["cpu"]
    memory = info["info"]["runtimeSpec"]["linux"]["resources"]["memory"]
    assert (cpu["shares"], memory["limit"]) == (512, 512 * MiB), info["info"]["runtimeSpec"]["linux"]["resources"]
    cgroup = {c: w.node.container_cgroup(w.bare_id, c) for c in ("cpu", "memory")}
    assert w.node.read(cgroup["cpu"], "cpu.shares") == "512"
    assert w.node.read(cgroup["cpu"], "cpu.cfs_quota_us") == "100000"
    assert w.node.read(cgroup["memory"], "memory.limit_in_bytes") == str(512 * MiB)


def test_be_runs_sched_idle_and_ls_does_not(workload: Workload) -> None:
    w = workload
    be = w.node.pids(w.be_cgroup["cpu"])
    ls = w.node.pids(w.ls_cgroup["cpu"])
    assert be and ls
    assert {os.sched_getscheduler(p) for p in be} == {os.SCHED_IDLE}
    assert {os.sched_getscheduler(p) for p in ls} == {os.SCHED_OTHER}


def test_the_values_were_in_the_hooks_answer(workload: Workload) -> None:
    """The agent answered CreateContainer for both (no failure, no timeout) and repaired nothing
    afterwards: the values were there from the start, not written back later."""
    b, a = workload.before, workload.after
    created = metric_sum(a, "nriplugin_hook_duration_seconds_count", event="create_container") - metric_sum(
        b, "nriplugin_hook_duration_seconds_count", event="create_container"
    )
    assert created >= 2
    moved = {k: (b.get(k, 0.0), v) for k, v in a.items() if k.startswith(WATCHED) and v != b.get(k, 0.0)}
    assert not moved, f"failures, drift or repairs (before, after): {moved}"


def test_a_nodeslo_edit_moves_the_nodes_values_and_an_invalid_one_is_refused(
    kind_cluster: Cluster, workload: Workload
) -> None:
    """Koordinator's NodeSLO (the v1.8.0 CRD the chart installs) for the worker: BE's memory
    protection follows each edit within 2 s; an object the CRD refuses never reaches the agent
    (the API server answers 422 naming the field) and the policy in force stays; a value the CRD
    accepts but the agent cannot use is left out, with a Warning Event saying why."""
    kc, w = kind_cluster, workload
    worker = w.node.name

    def soft() -> int:
        return int(w.node.read(w.be_cgroup["memory"], "memory.soft_limit_in_bytes"))

    def nodeslo(percent: int) -> dict[str, Any]:
        spec = {"resourceQOSStrategy": {"beClass": {"memoryQOS": {"enable": True, "lowLimitPercent": percent}}}}
        return {
            "apiVersion": "slo.koordinator.sh/v1alpha1",
            "kind": "NodeSLO",
            "metadata": {"name": worker},
            "spec": spec,
        }

    assert soft() > 1 << 40  # no protection without it
    took = []
    try:
        t0 = time.monotonic()
        kc.custom.create_cluster_custom_object(*NODESLO, nodeslo(50))
        until(
            lambda: soft() == 128 * MiB, 2.0, "BE's soft limit is not 50 % of batch-memory 2 s after the NodeSLO", 0.02
        )
        took.append(time.monotonic() - t0)
        t0 = time.monotonic()
        kc.custom.patch_cluster_custom_object(*NODESLO, worker, nodeslo(25))
        until(lambda: soft() == 64 * MiB, 2.0, "BE's soft limit did not follow the edit within 2 s", 0.02)
        took.append(time.monotonic() - t0)
        version = kc.metrics(worker)["nriplugin_policy_version"]
        bad = nodeslo(25)
        bad["spec"]["cpuBurstStrategy"] = {"cpuBurstPercent": 20000}  # the CRD's maximum is 10000
        with pytest.raises(client.ApiException) as refused:
            kc.custom.patch_cluster_custom_object(*NODESLO, worker, bad)
        assert refused.value.status == 422 and "cpuBurstPercent" in str(refused.value.body)
        time.sleep(1)
        assert kc.metrics(worker)["nriplugin_policy_version"] == version
        assert soft() == 64 * MiB
        # A value the CRD accepts and the agent cannot use (a CAT range that ends before it
        # starts): left out, the policy in force stays, and a Warning Event on the NodeSLO says why.
        bad = nodeslo(25)
        bad["spec"]["resourceQOSStrategy"]["beClass"]["resctrlQOS"] = {
            "catRangeStartPercent": 80,
            "catRangeEndPercent": 20,
        }
        uid = kc.custom.patch_cluster_custom_object(*NODESLO, worker, bad)["metadata"]["uid"]

        def warned() -> list[client.CoreV1Event]:
            return [
                e
                for e in kc.core.list_namespaced_event("default").items
                if e.involved_object.kind == "NodeSLO" and e.involved_object.uid == uid
            ]

        until(lambda: bool(warned()), 5.0, "no Event on a NodeSLO the agent refused", 0.1)
        (event,) = warned()
        assert event.type == "Warning" and event.reason == "NodeSLOValueNotUsed", event
        assert "catRangeStartPercent (80) must be below catRangeEndPercent (20)" in (event.message or "")
        assert event.source is not None and (event.source.component, event.source.host) == ("nriplugin", worker)
        assert kc.metrics(worker)["nriplugin_policy_version"] == version
        assert soft() == 64 * MiB
        print(f"the agent's Event: {event.reason}: {event.message}")
    finally:
        try:
            kc.custom.delete_cluster_custom_object(*NODESLO, worker)
        except client.ApiException as exc:
            if exc.status != 404:
                raise
    print(f"NodeSLO create / edit in force on the node after {[round(t * 1000) for t in took]} ms")
