"""Restarts on the worker: containerd restarted, the kubelet restarted, the agent's pod deleted.
After each the pods' values are the policy's again (a BE pod sized from its batch resources, an
LS pod as the kubelet asked), a new BE pod is born right, and the agent and the kubelet do not
fight over a file (the agent's conflict counter stays 0; its repairs are counted).

The first test runs with BE unquoted (the QoS manager calm); the second cuts BE (an LS pod
spinning, a 5 % usage budget) and restarts the kubelet and churns pods under the cut: the
kubelet's systemd driver has systemd write BE's slice again on each pod admission and cleanup
(its quota back to none), and the agent puts the cut back each time without calling it a fight."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from kubernetes import client

from testkit.kind import AGENT_NS, Cluster, metric_sum, until

from .test_born_right import BE, IMAGE, LS, NODESLO, ls_deployment

BATCH = json.dumps({"containers": {"main": {"requests": {"kubernetes.io/batch-cpu": "500"}}}})  # shares 512


def be_pod(ns: str, name: str) -> client.V1Pod:
    ctr = client.V1Container(name="main", image=IMAGE, image_pull_policy="Never", command=["sleep", "3600"])
    return client.V1Pod(
        metadata=client.V1ObjectMeta(
            name=name,
            namespace=ns,
            labels={"app": name, **BE},
            annotations={"node.koordinator.sh/extended-resource-spec": BATCH},
        ),
        spec=client.V1PodSpec(containers=[ctr], restart_policy="Never", termination_grace_period_seconds=1),
    )


def test_restarts_converge_and_nobody_fights(kind_cluster: Cluster, namespace: str) -> None:
    kc, ns = kind_cluster, namespace
    worker = kc.worker()
    node = kc.node(worker)
    kc.apps.create_namespaced_deployment(ns, ls_deployment(ns))
    kc.core.create_namespaced_pod(ns, be_pod(ns, "be0"))
    (ls,) = kc.wait_pods(ns, "app=web", 1)
    (be,) = kc.wait_pods(ns, "app=be0", 1)
    ls_cpu = node.container_cgroup(kc.container_ids(ls)["web"])
    be_cpu = node.container_cgroup(kc.container_ids(be)["main"])
    kc.wait_be_unquoted(worker)

    def right() -> bool:
        return node.read(be_cpu, "cpu.shares") == "512" and node.read(ls_cpu, "cpu.shares") == "102"

    conflicts = 0.0
    repairs: dict[str, float] = {}

    def tally(m: dict[str, float]) -> None:
        nonlocal conflicts
        conflicts += metric_sum(m, "nriplugin_conflicts_total")
        for key, value in m.items():
            if key.startswith("nriplugin_repaired_total"):
                repairs[key] = repairs.get(key, 0) + value

    def new_agent(gone: str) -> bool:
        return kc.agent_ready(worker) and kc.agent_pod(worker).metadata.name != gone

    actions: list[tuple[str, Callable[[], object]]] = [
        ("containerd restarted", lambda: node.exec("systemctl", "restart", "containerd")),
        ("kubelet restarted", lambda: node.exec("systemctl", "restart", "kubelet")),
        ("agent pod deleted", lambda: kc.core.delete_namespaced_pod(kc.agent_pod(worker).metadata.name, AGENT_NS)),
    ]
    steps: list[tuple[str, float]] = []
    for i, (what, act) in enumerate(actions, start=1):
        old_agent = kc.agent_pod(worker)
        if what == "agent pod deleted":
            tally(kc.metrics(worker))  # this agent's counters end with it
        t0 = time.monotonic()
        act()
        until(lambda: kc.agent_ready(worker) and right(), 60, f"values after: {what}", 0.5)
        until(
            lambda: all(c.type != "Ready" or c.status == "True" for c in kc.core.read_node(worker).status.conditions),
            60,
            f"{worker} Ready after: {what}",
        )
        if what == "agent pod deleted":
            until(partial(new_agent, old_agent.metadata.name), 60, "a new agent pod")
        name = f"be{i}"
        kc.core.create_namespaced_pod(ns, be_pod(ns, name))
        (pod,) = kc.wait_pods(ns, f"app={name}", 1)
        cgroup = node.container_cgroup(kc.container_ids(pod)["main"])
        assert node.read(cgroup, "cpu.shares") == "512", f"a BE pod after {what}"
        steps.append((what, time.monotonic() - t0))
    time.sleep(3)  # a kubelet sync or two after its restart
    assert right()
    tally(kc.metrics(worker))
    print(f"\n{[(w, round(t, 1)) for w, t in steps]}; repairs {repairs}; conflicts {conflicts}")
    assert conflicts == 0
    m: Any = kc.metrics(worker)
    assert metric_sum(m, "nriplugin_hook_failures_total") == 0


def test_the_kubelet_restarted_and_pods_churning_while_be_is_cut(kind_cluster: Cluster, namespace: str) -> None:
    """Issue 52 under the real kubelet's systemd driver: with BE's CPU cut (an LS pod spinning
    a core puts the node at HIGH, where BE gets a quota; a NodeSLO's usage budget of 5 % puts
    it at the floor), the kubelet restarted and BE pods created and deleted.
    systemd writes every attribute of a unit again each time the kubelet sets the QoS slices'
    properties (at its start, on every pod admission and cleanup): BE's quota goes back to
    none, and the agent puts it back. The kubelet starts and every one of its QoS updates
    succeeds; the agent repairs each reset at once and never calls it a fight; the cut holds
    at the end.

    A BE pod may fail to start here, and only this way: runc's systemd driver freezes a new
    container's cgroup around setting its properties and fails the start when the tasks do not
    freeze within its retries (runc#3803, #3804); on a busy node a BestEffort group (shares 2,
    and here cut) may not get the CPU to freeze in time. Counted and printed; docs/deploy.md says so."""
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
        frozen: list[str] = []  # pods runc could not start: their cgroup would not freeze (below)

        def settled(name: str) -> bool:
            samples.append(quota())
            pod = kc.core.read_namespaced_pod(name, ns)
            for st in pod.status.container_statuses or []:
                if st.state.running is not None:
                    return True
                done = st.state.terminated or st.state.waiting
                if done is not None and done.reason in ("StartError", "RunContainerError"):
                    assert "unable to freeze" in (done.message or ""), f"{name} did not start: {done.message}"
                    frozen.append(name)
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
    print(
        f"\nkubelet Ready {restarted:.1f} s after its restart; BE quota repairs {repairs:g}, conflicts "
        f"{delta('nriplugin_conflicts_total'):g}; BE's group read unquoted in {unquoted} of {len(samples)} samples; "
        f"{len(frozen)} of {len(names)} BE pods not started by runc (cgroup would not freeze): {frozen}"
    )
    assert not failed, failed[:5]
    assert restarts == "0", f"the kubelet restarted {restarts} times by itself"
    assert delta("nriplugin_conflicts_total") == 0
    assert all(q > 0 for q in held), f"BE's cut did not hold after the churn: {held}"
    assert delta("nriplugin_hook_failures_total") == 0
