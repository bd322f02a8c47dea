"""A rolling update of the agent's DaemonSet (a new image tag) while a Job churns 100 BE pods
and an LS Deployment serves: no pod fails to start, no hook fails, every BE container seen
running has the policy's values, and the handover gap is what the new agent measured."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from typing import Any

from kubernetes import client

from testkit.kind import AGENT_LABEL, AGENT_NS, Cluster, metric_sum, until

from .test_born_right import BE, IMAGE, ls_deployment

PODS = 100
BATCH = json.dumps({"containers": {"main": {"requests": {"kubernetes.io/batch-cpu": "500"}}}})  # shares 512


def churn_job(ns: str) -> client.V1Job:
    ctr = client.V1Container(name="main", image=IMAGE, image_pull_policy="Never", command=["sleep", "2"])
    return client.V1Job(
        metadata=client.V1ObjectMeta(name="churn", namespace=ns),
        spec=client.V1JobSpec(
            completions=PODS,
            parallelism=8,
            backoff_limit=0,
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(
                    labels={"app": "churn", **BE}, annotations={"node.koordinator.sh/extended-resource-spec": BATCH}
                ),
                spec=client.V1PodSpec(containers=[ctr], restart_policy="Never", termination_grace_period_seconds=1),
            ),
        ),
    )


def test_a_rolling_update_under_churn_starts_every_pod_right(kind_cluster: Cluster, namespace: str) -> None:
    kc, ns = kind_cluster, namespace
    worker = kc.worker()
    node = kc.node(worker)
    old = kc.agent_pod(worker)
    old_failures = metric_sum(kc.metrics(worker), "nriplugin_hook_failures_total")
    kc.apps.create_namespaced_deployment(ns, ls_deployment(ns))
    kc.wait_pods(ns, "app=web", 1)
    # The new tag: the same image under another name in the worker's containerd.
    node.exec("ctr", "-n", "k8s.io", "images", "tag", "--force", IMAGE, IMAGE.replace(":0.1.0", ":0.1.0-rollout"))

    checked: dict[str, str] = {}  # container id -> cpu.shares seen while it ran
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            for pod in kc.core.list_namespaced_pod(ns, label_selector="app=churn").items:
                for cid in kc.container_ids(pod).values():
                    if cid in checked:
                        continue
                    with contextlib.suppress(OSError):  # already gone
                        checked[cid] = node.read(node.container_cgroup(cid), "cpu.shares")
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        kc.batch.create_namespaced_job(ns, churn_job(ns))

        def under_way() -> bool:
            st = kc.batch.read_namespaced_job("churn", ns).status
            assert not st.failed, f"{st.failed} churned pod(s) failed:\n{kc.why_failed(ns, 'app=churn')}"
            return bool((st.succeeded or 0) >= 20)

        until(under_way, 120, "churn under way")
        image = IMAGE.replace(":0.1.0", ":0.1.0-rollout")
        patch: Any = {"spec": {"template": {"spec": {"containers": [{"name": "nriplugin", "image": image}]}}}}
        t0 = time.monotonic()
        kc.apps.patch_namespaced_daemon_set("nriplugin", AGENT_NS, patch)

        def rolled() -> bool:
            ds = kc.apps.read_namespaced_daemon_set("nriplugin", AGENT_NS)
            pods = kc.core.list_namespaced_pod(AGENT_NS, label_selector=AGENT_LABEL).items
            return bool(
                ds.status.updated_number_scheduled == ds.status.number_ready == 1
                and ds.status.observed_generation == ds.metadata.generation
                and [p.metadata.name for p in pods] != [old.metadata.name]
                and len(pods) == 1
            )

        until(rolled, 120, "the DaemonSet did not roll")
        took = time.monotonic() - t0

        def finished() -> bool:
            st = kc.batch.read_namespaced_job("churn", ns).status
            return bool(st.failed or (st.succeeded or 0) >= PODS)  # a failure ends the Job (backoffLimit 0)

        until(finished, 300, "the churn Job did not finish", 1.0)
    finally:
        stop.set()
        sampler.join(10)
    job = kc.batch.read_namespaced_job("churn", ns)
    assert (job.status.succeeded, job.status.failed or 0) == (PODS, 0), kc.why_failed(ns, "app=churn")
    new = kc.metrics(worker)
    assert metric_sum(new, "nriplugin_hook_failures_total") == 0 and old_failures == 0
    wrong = {cid[:12]: v for cid, v in checked.items() if v != "512"}
    assert len(checked) >= PODS // 4 and not wrong, f"{len(checked)} seen, not born right: {wrong}"
    gaps = metric_sum(new, "nriplugin_agent_gap_seconds_sum"), metric_sum(new, "nriplugin_agent_gap_seconds_count")
    web = kc.core.list_namespaced_pod(ns, label_selector="app=web").items
    assert all(s.restart_count == 0 for p in web for s in p.status.container_statuses)
    print(
        f"\nrolled in {took:.1f} s; {job.status.succeeded} pods churned, 0 failed; {len(checked)} BE containers "
        f"read while running, all cpu.shares 512; handover gap {gaps[0] * 1000:.1f} ms over {gaps[1]:.0f} handover(s); "
        f"the new agent lifted BE's quota for births {metric_sum(new, 'nriplugin_qos_be_birth_lifts_total'):g} times"
    )
