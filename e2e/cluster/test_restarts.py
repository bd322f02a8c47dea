"""Restarts on the worker: containerd restarted, the kubelet restarted, the agent's pod deleted.
After each the pods' values are the policy's again (a BE pod sized from its batch resources, an
LS pod as the kubelet asked), a new BE pod is born right, and the agent and the kubelet do not
fight over a file (the agent's conflict counter stays 0; its repairs are counted).

Run with BE unquoted (the QoS manager calm); test_under_the_cut.py restarts the kubelet with BE
cut. The kind node sees the machine's /proc: other work on the machine can make the QoS manager
cut BE meanwhile, and then systemd's resets of BE's slice (docs/reconciler.md#fights) may count
as conflicts on its quota; only those are left out, and only when BE was cut."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from kubernetes import client

from testkit.kind import AGENT_NS, Cluster, metric_sum, until

from .test_born_right import BE, IMAGE, ls_deployment

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

    conflicts = quota_conflicts = cuts = 0.0

    def cut_count(m: dict[str, float]) -> float:  # BE's limit changed at a level where it has a quota
        levels = ("HIGH", "CRITICAL", "EMERGENCY")
        return sum(metric_sum(m, "nriplugin_qos_cpu_suppress_total", level=lv) for lv in levels)

    cuts_before = cut_count(kc.metrics(worker))
    repairs: dict[str, float] = {}
    fights: list[str] = []  # the agents' log lines on them (the path)

    def tally(m: dict[str, float]) -> None:
        log = kc.core.read_namespaced_pod_log(kc.agent_pod(worker).metadata.name, AGENT_NS)
        fights.extend(line for line in log.splitlines() if "keeps reverting" in line)
        nonlocal conflicts, quota_conflicts, cuts
        conflicts += metric_sum(m, "nriplugin_conflicts_total")
        quota_conflicts += metric_sum(m, "nriplugin_conflicts_total", resource="cpu.cfs_quota_us")
        cuts += cut_count(m)
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
    cut = cuts > cuts_before
    print(
        f"\n{[(w, round(t, 1)) for w, t in steps]}; repairs {repairs}; conflicts {conflicts} "
        f"({quota_conflicts:g} on quotas); BE {'cut meanwhile' if cut else 'never cut'}"
    )
    assert conflicts - (quota_conflicts if cut else 0) == 0, "\n".join(fights)
    m: Any = kc.metrics(worker)
    assert metric_sum(m, "nriplugin_hook_failures_total") == 0
