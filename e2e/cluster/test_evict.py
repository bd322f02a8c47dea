"""MemoryEvict through the real Eviction API: the node's NodeSLO puts the memory threshold just
above what the worker's pods use; a BE pod a PodDisruptionBudget protects and a BE memory hog
take it over. The agent tries the largest first — the protected one — and the API server's 429
spares it (the agent does not kill it through CRI instead); the hog is evicted, with an Event
`kubectl get events` shows; the kernel OOM-kills nothing."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from kubernetes import client

from testkit.kind import PODS_ROOT, Cluster, metric_sum, until

from .test_born_right import BE, IMAGE, NODESLO

MiB = 1 << 20


def hog(ns: str, name: str, mib: int, labels: dict[str, str]) -> client.V1Pod:
    """A BE pod holding ``mib`` MiB of touched anonymous memory."""
    code = f"import time; b = bytearray({mib} << 20); b[::4096] = b'1' * len(b[::4096]); time.sleep(3600)"
    ctr = client.V1Container(name="main", image=IMAGE, image_pull_policy="Never", command=["python3", "-c", code])
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, namespace=ns, labels={**BE, **labels}),
        spec=client.V1PodSpec(containers=[ctr], restart_policy="Never", termination_grace_period_seconds=1),
    )


def oom_kills() -> int:
    for line in Path("/proc/vmstat").read_text().splitlines():
        if line.startswith("oom_kill "):
            return int(line.split()[1])
    return 0


def test_memory_evict_honours_a_pdb_and_evicts_the_other_be_pod(kind_cluster: Cluster, namespace: str) -> None:
    kc, ns = kind_cluster, namespace
    worker = kc.worker()
    node = kc.node(worker)
    mem = node.roots["memory"] / PODS_ROOT
    total = int(Path("/proc/meminfo").read_text().split()[1]) * 1024
    capacity = min(total, int((mem / "memory.limit_in_bytes").read_text()))

    def working_set() -> int:
        stat = dict(line.split() for line in (mem / "memory.stat").read_text().splitlines())
        return int((mem / "memory.usage_in_bytes").read_text()) - int(stat["total_inactive_file"])

    kc.policy.create_namespaced_pod_disruption_budget(
        ns,
        client.V1PodDisruptionBudget(
            metadata=client.V1ObjectMeta(name="guarded"),
            spec=client.V1PodDisruptionBudgetSpec(
                min_available=1, selector=client.V1LabelSelector(match_labels={"app": "guarded"})
            ),
        ),
    )
    kc.core.create_namespaced_pod(ns, hog(ns, "guarded", 800, {"app": "guarded"}))
    kc.wait_pods(ns, "app=guarded", 1)
    until(lambda: kc.policy.read_namespaced_pod_disruption_budget("guarded", ns).status.current_healthy == 1, 30, "PDB")
    time.sleep(2)  # the 800 MiB touched
    # The threshold: above today's use by 400 MiB (the hog's 600 MiB crosses it).
    percent = math.ceil((working_set() + 400 * MiB) * 100 / capacity)
    before = kc.metrics(worker)
    ooms = oom_kills()
    spec = {"resourceUsedThresholdWithBE": {"enable": True, "memoryEvictThresholdPercent": percent}}
    slo: dict[str, Any] = {"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeSLO", "metadata": {"name": worker}}
    kc.custom.create_cluster_custom_object(*NODESLO, {**slo, "spec": spec})
    try:
        time.sleep(3)  # nothing to evict yet: below the threshold
        assert metric_sum(kc.metrics(worker), "nriplugin_qos_evictions_total") == metric_sum(
            before, "nriplugin_qos_evictions_total"
        )
        kc.core.create_namespaced_pod(ns, hog(ns, "hog", 600, {"app": "hog"}))

        def hog_gone() -> bool:
            try:
                pod: Any = kc.core.read_namespaced_pod("hog", ns)
            except client.ApiException as exc:
                return bool(exc.status == 404)
            return pod.metadata.deletion_timestamp is not None

        until(hog_gone, 60, "the hog was not evicted within 60 s of crossing the threshold", 0.5)
        guarded = kc.core.read_namespaced_pod("guarded", ns)
        assert guarded.status.phase == "Running" and guarded.metadata.deletion_timestamp is None
        assert all(s.restart_count == 0 for s in guarded.status.container_statuses)  # not killed through CRI
        events = until(lambda: kc.events(ns, "hog"), 10, "no Event on the evicted pod")
        assert any("MemoryEvict" in (e.reason or "") + (e.message or "") for e in events), [e.reason for e in events]
        shown = kc.kubectl("get", "events", "-n", ns, "--field-selector", "involvedObject.name=hog")
        assert shown.returncode == 0 and "hog" in shown.stdout, shown.stderr
        blocked = kc.events(ns, "guarded")
        assert "EvictionBlocked" in [e.reason for e in blocked]  # the 429, said on the protected pod
        print(f"\nthreshold {percent} % of {capacity / MiB:.0f} MiB; guarded's events: {[e.reason for e in blocked]}")
        print(f"hog's events: {[(e.reason, e.message) for e in events]}")
        assert oom_kills() == ooms, "the kernel OOM-killed something"
    finally:
        kc.custom.delete_cluster_custom_object(*NODESLO, worker)
