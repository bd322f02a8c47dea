"""The agent beside a kubelet, on the private containerd: pods laid out by the test kubelet
(testkit/kubelet.py: pod groups with kubelet's pod-level quota, the QoS-class groups' weights
rewritten on every pod change and periodically, every write recorded) and the agent with its
embedded default policy.

On a real node (kubelet, cgroupfs driver, cgroup v1) the default policy's ``cpu.idle`` 1 on
``kubepods/besteffort`` made the kernel refuse every weight kubelet wrote there: each QoS update
failed, and a restarted kubelet exited. After SIGTERM the agent left the idle flag, the idle
weight and its last quota on the group. Here an LS pod spinning far above its request drives the
CPU level up until the manager cuts BE's group, and the test asserts what kubelet needs: every
write it made to the QoS-class groups was taken, the agent stopped leaves the groups as kubelet
left them, and a kubelet restart (which updates them at start) succeeds.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from testkit.containerd import Containerd
from testkit.kubelet import (
    QOS_GROUPS,
    Kubelet,
    KubeletExited,
    Resources,
    Write,
    milli_cpu_to_shares,
    pod_group,
    weight_file,
    weight_value,
)
from testkit.plugin import PluginProcess, terminate, until
from testkit.workloads import BE, LS

SPIN = ["/bin/sh", "-c", "yes >/dev/null"]
MiB = 1 << 20
BE_GROUP, BURSTABLE_GROUP, NODE_GROUP = QOS_GROUPS["BestEffort"], QOS_GROUPS["Burstable"], QOS_GROUPS["Guaranteed"]
REWRITES = 3  # kubelet rounds that must land on the QoS-class groups while BE is cut


def bandwidth(kl: Kubelet, group: str) -> str:
    """A group's CFS bandwidth as the kernel shows it: v1's quota, v2's ``cpu.max``."""
    d = kl.group_path(group)
    return (d / ("cpu.cfs_quota_us" if kl.version == 1 else "cpu.max")).read_text().strip()


def unlimited(kl: Kubelet, text: str) -> bool:
    return text == "-1" if kl.version == 1 else text.split()[0] == "max"


def limit_cores(kl: Kubelet, group: str) -> float:
    """The group's CFS bandwidth in cores (inf: none)."""
    text = bandwidth(kl, group)
    if unlimited(kl, text):
        return float("inf")
    if kl.version == 1:
        return int(text) / int((kl.group_path(group) / "cpu.cfs_period_us").read_text())
    quota, period = text.split()
    return int(quota) / int(period)


def cut(kl: Kubelet) -> bool:
    """BE's group limited below the CPUs the LS spinner leaves: a cut, not a usage ceiling."""
    return limit_cores(kl, BE_GROUP) < (os.cpu_count() or 1) - 1


def summary(writes: list[Write]) -> str:
    """Refused writes, alike ones counted once: "N x <write>", by their causes."""
    seen: dict[tuple[str, str, str, str], list[str]] = {}
    for w in writes:
        seen.setdefault((w.group, w.file, w.value, w.error), []).append(w.cause)
    lines = []
    for (group, file, value, error), causes in seen.items():
        lines.append(f"  {len(causes)} x {group}/{file} <- {value} ({', '.join(sorted(set(causes)))}): {error}")
    return "\n".join(lines)


def read(d: Path, name: str) -> str | None:
    try:
        return (d / name).read_text().strip()
    except FileNotFoundError:
        return None


def memory_limit(kl: Kubelet, group: str) -> int | None:
    """A group's memory limit (None: none)."""
    text = (kl.group_path(group, "memory") / ("memory.limit_in_bytes" if kl.version == 1 else "memory.max")).read_text()
    return None if text.strip() == "max" or int(text) >= 1 << 62 else int(text)


def test_pods_are_laid_out_as_kubelet_lays_them_out(runtime: Containerd, kubelet: Kubelet) -> None:
    """The harness itself, no agent: pod groups made before the sandbox with kubelet's
    pod-level values (a quota and a memory limit only when every container has one), runc
    puts the sandbox and the containers into them, the containers get kubelet's own values,
    burstable's weight follows the pods that come and go, and the pod's group goes with it."""
    web = runtime.run_pod(
        "web",
        containers={
            "app": Resources(cpu_request=500, cpu_limit=1000, memory_limit=64 * MiB),
            "side": Resources(cpu_request=250, cpu_limit=500, memory_limit=32 * MiB),
        },
    )
    api = runtime.run_pod("api", containers={"app": Resources(cpu_request=1000, cpu_limit=2000), "side": Resources()})
    cids = {(pod.uid, name): runtime.create_container(pod, name) for pod in (web, api) for name in ("app", "side")}
    weight = weight_file(kubelet.version)
    web_group, api_group = pod_group("Burstable", web.uid), pod_group("Burstable", api.uid)
    assert read(kubelet.group_path(web_group), weight) == weight_value(768, kubelet.version)
    assert limit_cores(kubelet, web_group) == 1.5
    assert memory_limit(kubelet, web_group) == 96 * MiB
    assert read(kubelet.group_path(api_group), weight) == weight_value(1024, kubelet.version)
    assert limit_cores(kubelet, api_group) == float("inf")  # "side" has no CPU limit
    assert memory_limit(kubelet, api_group) is None
    app = f"{web_group}/{cids[(web.uid, 'app')]}"  # runc's container group inside kubelet's
    assert read(kubelet.group_path(app), weight) == weight_value(512, kubelet.version)
    assert limit_cores(kubelet, app) == 1.0
    assert memory_limit(kubelet, app) == 64 * MiB
    burstable = kubelet.group_path(BURSTABLE_GROUP)
    assert read(burstable, weight) == weight_value(milli_cpu_to_shares(750 + 1000), kubelet.version)
    runtime.remove_pod(web)
    assert not kubelet.group_path(web_group).exists()
    assert read(burstable, weight) == weight_value(1024, kubelet.version)
    assert kubelet.refused() == []


def test_kubelets_qos_writes_are_taken_while_be_is_cut_and_the_agent_stopped_leaves_kubelets_values(
    runtime: Containerd, kubelet: Kubelet, plugin_factory: Callable[..., PluginProcess]
) -> None:
    """A BE pod and a Burstable LS pod (250m requested, 2 cores limit, spinning one core) laid
    out by the kubelet; the default policy cuts BE's group. Then, every problem collected so
    that one run names them all: (a) no kubelet write refused since the agent started (the
    QoS-class groups' rewrites, several rounds of them under the cut, and the pod groups); (b)
    after SIGTERM each QoS-class group holds kubelet's weight, no bandwidth limit and
    ``cpu.idle`` 0; (c) a kubelet restart's updates are taken."""
    plugin = plugin_factory(runtime)
    since = time.monotonic()
    be = runtime.run_pod("batch", labels=BE, containers={"main": Resources()})
    runtime.create_container(be, "main")
    ls = runtime.run_pod("web", labels=LS, containers={"main": Resources(cpu_request=250, cpu_limit=2000)})
    runtime.create_container(ls, "main", command=SPIN)
    assert bandwidth(kubelet, pod_group("Burstable", ls.uid)) in ("200000", "200000 100000")  # pod-level quota

    took = until(
        lambda: cut(kubelet),
        30,
        lambda: f"BE's group never cut (bandwidth {bandwidth(kubelet, BE_GROUP)}); agent log:\n{plugin.logs()[-3000:]}",
        step=0.1,
    )
    cut_at = time.monotonic()
    print(f"BE's group cut to {bandwidth(kubelet, BE_GROUP)} {took:.1f} s after the pods")

    def rounds_under_cut() -> int:
        return len([w for w in kubelet.writes(BE_GROUP, since=cut_at) if w.cause == "periodic"])

    until(lambda: rounds_under_cut() >= REWRITES, REWRITES * 2 + 5, "the kubelet did not rewrite BE's group")
    assert cut(kubelet), f"BE's cut lifted while the LS pod still spins ({bandwidth(kubelet, BE_GROUP)})"
    assert plugin.metric_sum("nriplugin_qos_cpu_suppress_total") >= 1

    problems: list[str] = []
    if refused := kubelet.refused(since=since):
        problems.append("(a) kubelet writes refused since the agent started:\n" + summary(refused))

    terminate(plugin.proc)  # SIGTERM, as the DaemonSet's pod is stopped
    print(f"agent exited {plugin.proc.returncode} after SIGTERM")
    weight = weight_file(kubelet.version)
    for group in (NODE_GROUP, BURSTABLE_GROUP, BE_GROUP):
        d = kubelet.group_path(group)
        have, limit, idle = read(d, weight), bandwidth(kubelet, group), read(d, "cpu.idle")
        want = kubelet.last_value(group, weight)
        wrong = []
        if want is not None and have != want:
            wrong.append(f"{weight} {have} (kubelet wrote {want})")
        if not unlimited(kubelet, limit):
            wrong.append(f"bandwidth {limit}")
        if idle not in (None, "0"):
            wrong.append(f"cpu.idle {idle}")
        if wrong:
            problems.append(f"(b) after the agent's SIGTERM {group} has " + ", ".join(wrong))

    restarted = time.monotonic()
    try:
        kubelet.restart()
    except KubeletExited as exc:
        problems.append(f"(c) kubelet restart: exited: {exc}")
    else:
        if refused := kubelet.refused(since=restarted):
            problems.append("(c) kubelet restart: writes refused:\n" + summary(refused))
    assert not problems, "\n".join(problems)


def cpu_seconds(kl: Kubelet, group: str) -> float:
    """CPU time the group's tasks used so far (v1 ``cpuacct.usage``, v2 ``cpu.stat``)."""
    if kl.version == 1:  # cpuacct may be a hierarchy of its own, apart from cpu
        return int((kl.group_path(group, "cpuacct") / "cpuacct.usage").read_text()) / 1e9
    d = kl.group_path(group)
    stat = dict(line.split() for line in (d / "cpu.stat").read_text().splitlines())
    return int(stat["usage_usec"]) / 1e6


def test_a_burst_under_the_kubelets_pod_quota_runs_the_pod_above_its_limit_and_is_counted_as_the_kernel_took_it(
    runtime: Containerd, kubelet: Kubelet, plugin_factory: Callable[..., PluginProcess]
) -> None:
    """An LS pod limited to half a core (the kubelet gives its group that quota, as it gives the
    container) spinning two threads on an otherwise idle node: the default policy's CPUBurst
    raises the pod's quota and the container's (x1.5), the pod really runs above its limit
    for the burst (usage measured on its group), the granted count agrees with what the kernel
    holds, and when the burst is over both quotas are the kubelet's again; no kubelet write is
    refused meanwhile."""
    plugin = plugin_factory(runtime)
    since = time.monotonic()
    ls = runtime.run_pod("web", labels=LS, containers={"main": Resources(cpu_request=500, cpu_limit=500)})
    cid = runtime.create_container(ls, "main", command=["/bin/sh", "-c", "yes >/dev/null & yes >/dev/null"])
    pod, ctr = pod_group("Burstable", ls.uid), f"{pod_group('Burstable', ls.uid)}/{cid}"
    assert limit_cores(kubelet, pod) == limit_cores(kubelet, ctr) == 0.5

    until(
        lambda: limit_cores(kubelet, ctr) > 0.5,
        30,
        lambda: f"no burst (container at {limit_cores(kubelet, ctr)} cores); agent log:\n{plugin.logs()[-3000:]}",
        step=0.05,
    )
    assert limit_cores(kubelet, pod) == limit_cores(kubelet, ctr) == 0.75  # the pod raised with it
    t0, u0 = time.monotonic(), cpu_seconds(kubelet, pod)
    time.sleep(3.0)
    used = (cpu_seconds(kubelet, pod) - u0) / (time.monotonic() - t0)
    bursting = limit_cores(kubelet, ctr) > 0.5
    print(f"the pod used {used:.2f} cores in the burst (limit 0.5, burst 0.75)")
    assert bursting and used > 0.6, f"the pod used {used:.2f} cores during its burst"
    until(lambda: plugin.metric('nriplugin_qos_cpu_burst_total{change="granted"}') >= 1, 5, "no burst counted")

    until(lambda: limit_cores(kubelet, ctr) == 0.5, 20, "the burst did not end")
    until(lambda: limit_cores(kubelet, pod) == 0.5, 5, "the pod's quota is not the kubelet's again")
    granted = plugin.metric('nriplugin_qos_cpu_burst_total{change="granted"}')
    ended = plugin.metric('nriplugin_qos_cpu_burst_total{change="ended"}')
    assert granted >= 1 and granted - ended in (0, 1), f"granted {granted}, ended {ended}"
    assert "CPU burst not in force" not in plugin.logs()
    assert kubelet.refused(since=since) == [], summary(kubelet.refused(since=since))
