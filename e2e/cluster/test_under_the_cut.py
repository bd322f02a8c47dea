"""The kubelet restarted and BE pods churned while BE's CPU is cut, on the worker (the kubelet's
systemd driver). Last in the cluster lane: it leaves the node after a saturated spell with BE
cut, which the tests before it must not start from."""

from __future__ import annotations

import time
from functools import partial

from kubernetes import client

from testkit.kind import Cluster, metric_sum, until

from .test_born_right import IMAGE, LS, NODESLO
from .test_restarts import be_pod


def test_the_kubelet_restarted_and_pods_churning_while_be_is_cut(kind_cluster: Cluster, namespace: str) -> None:
    """Issue 52 under the real kubelet's systemd driver: with BE's CPU cut (an LS pod spinning
    a core puts the node at HIGH, where BE gets a quota; a NodeSLO's usage budget of 5 % puts
    it at the floor), the kubelet restarted and BE pods created and deleted. systemd writes
    every attribute of a unit again each time the kubelet sets the QoS slices' properties (at
    its start, on every pod admission and cleanup): BE's quota goes back to none, and the agent
    puts it back. The kubelet starts and every one of its QoS updates succeeds, and the cut is
    back at the end. Churn resets the slice faster than the reconciler's fight rule allows (3
    repairs in 10 s): it may back off and leave BE unquoted for seconds (conflicts printed;
    docs/deploy.md).

    Every BE pod starts: runc's systemd driver freezes a new container's cgroup around setting
    its properties and fails the start when the tasks do not freeze within its retries
    (runc#3803, #3804), which a group out of quota cannot; while a BE container is born BE's
    quota is lifted (node/births.py), counted in ``nriplugin_qos_be_birth_lifts_total``."""
    kc, ns = kind_cluster, namespace
    worker = kc.worker()
    node = kc.node(worker)
    kc.core.create_namespaced_pod(ns, be_pod(ns, "be0"))
    (be,) = kc.wait_pods(ns, "app=be0", 1)
    be_slice = node.container_cgroup(kc.container_ids(be)["main"]).parent.parent
    assert be_slice.name.endswith("-besteffort.slice"), be_slice

    def quota() -> int:
        return int(node.read(be_slice, "cpu.cfs_quota_us"))

    spec = {"resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressThresholdPercent": 5}}
    body = {"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeSLO", "metadata": {"name": worker}, "spec": spec}
    kc.custom.create_cluster_custom_object(*NODESLO, body)
    spin = client.V1Container(
        name="spin",
        image=IMAGE,
        image_pull_policy="Never",
        command=["python3", "-c", "while True: pass"],
        resources=client.V1ResourceRequirements(requests={"cpu": "500m"}),
    )
    ls = client.V1Pod(
        metadata=client.V1ObjectMeta(name="ls-spin", namespace=ns, labels={"app": "ls-spin", **LS}),
        spec=client.V1PodSpec(
            containers=[spin], node_selector={"kubernetes.io/hostname": worker}, termination_grace_period_seconds=0
        ),
    )
    kc.core.create_namespaced_pod(ns, ls)
    try:
        until(lambda: quota() > 0, 30, "BE's group cut under a 5 % usage budget", 0.2)
        before = kc.metrics(worker)
        since = int(time.time())
        samples: list[int] = []
        t0 = time.monotonic()
        node.exec("systemctl", "restart", "kubelet")

        def ready() -> bool:
            samples.append(quota())
            return all(c.type != "Ready" or c.status == "True" for c in kc.core.read_node(worker).status.conditions)

        until(ready, 90, f"{worker} Ready after the kubelet's restart", 0.05)
        restarted = time.monotonic() - t0
        names = [f"churn{i}" for i in range(6)]
        for name in names:  # each admission and each cleanup: the kubelet updates the QoS slices
            kc.core.create_namespaced_pod(ns, be_pod(ns, name))
        frozen: list[str] = []  # pods runc could not start: their cgroup would not freeze

        def settled(name: str) -> bool:
            samples.append(quota())
            pod = kc.core.read_namespaced_pod(name, ns)
            for st in pod.status.container_statuses or []:
                if st.state.running is not None:
                    return True
                done = st.state.terminated or st.state.waiting
                if done is not None and done.reason in ("StartError", "RunContainerError"):
                    frozen.append(f"{name}: {done.message}")
                    return True
            return False

        for name in names:
            until(partial(settled, name), 120, f"{name} started", 0.2)
        for name in names:
            kc.core.delete_namespaced_pod(name, ns, grace_period_seconds=0)

        def gone() -> bool:
            samples.append(quota())
            return not kc.core.list_namespaced_pod(ns, label_selector=f"app in ({','.join(names)})").items

        until(gone, 90, "the churned pods gone", 0.05)
        until(lambda: quota() > 0, 60, "BE's cut back after the churn", 0.1)  # a fight's backoff may hold it
        held = []
        for _ in range(20):
            time.sleep(0.1)
            held.append(quota())
        after = kc.metrics(worker)
    finally:
        kc.custom.delete_cluster_custom_object(*NODESLO, worker)
        kc.core.delete_namespaced_pod("ls-spin", ns, grace_period_seconds=0)
        kc.wait_be_unquoted(worker)  # the tests after this one read birth values: BE calm again
    journal = node.exec("journalctl", "-u", "kubelet", "--since", f"@{since}", "--no-pager", "-o", "cat", timeout=60)
    failed = [
        line
        for line in journal.splitlines()
        if "Failed to update QoS cgroup" in line or "Failed to start ContainerManager" in line
    ]
    restarts = node.exec("systemctl", "show", "kubelet", "-p", "NRestarts", "--value").strip()

    def delta(name: str, **labels: str) -> float:
        return metric_sum(after, name, **labels) - metric_sum(before, name, **labels)

    repairs = delta("nriplugin_repaired_total", resource="cpu.cfs_quota_us")
    unquoted = sum(1 for q in samples if q < 0)
    lifts = delta("nriplugin_qos_be_birth_lifts_total")
    print(
        f"\nkubelet Ready {restarted:.1f} s after its restart; BE quota repairs {repairs:g}, conflicts "
        f"{delta('nriplugin_conflicts_total'):g}; BE's group read unquoted in {unquoted} of {len(samples)} samples; "
        f"quota lifted for births {lifts:g} times, {delta('nriplugin_qos_be_birth_lift_seconds_total'):.2f} s in all"
    )
    assert not frozen, f"BE pods born under the cut did not start: {frozen}"
    assert lifts >= 1, "no BE birth lifted the cut"
    assert not failed, failed[:5]
    assert restarts == "0", f"the kubelet restarted {restarts} times by itself"
    assert all(q > 0 for q in held), f"BE's cut did not hold after the churn: {held}"
    assert delta("nriplugin_hook_failures_total") == 0
