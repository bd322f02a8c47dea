"""BE's group quota and its children on the private containerd and this machine's real cgroup v1
tree, where the kernel refuses a child's CFS quota above its parent's and a parent's below a
child's. A policy makes BE's limit follow one thing only, the LS request (the node's own noise
plays no part): an LS pod asking for both cores cuts BE to its 0.1-core floor, its removal gives
BE one core. BE pods carry a 1-core batch-cpu limit, so their pod and container groups have
quotas of their own under BE's group.

- Cut and raised, over and over: the agent never meets ``Invalid argument`` (the one writer
  orders its writes, and first lowers a pod group under BE's that it does not hold) and every
  group converges.
- Under the cut, the agent SIGKILLed and restarted while BE pods are created: each starts (the
  new agent learns the cut before its first answer) and converges.
- BE containers created while BE has its core and started only after a cut (one created before
  the agent, one through it) start and converge: no BE quota waits in a spec for runc.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from testkit.containerd import CGROUP_FS, Containerd, Pod
from testkit.cri import msg
from testkit.plugin import PluginProcess, until
from testkit.workloads import BE, LS, running

BATCH = (
    '{"containers":{"main":{"requests":{"kubernetes.io/batch-cpu":"500"},"limits":{"kubernetes.io/batch-cpu":"1k"}}}}'
)
# BE's limit from the LS request alone: a quota and one ratio at every level, the request reserved at every
# level (not what a calm LS uses), no usage budget; raises after half a second, so a test sees a
# few cuts and raises.
POLICY = """\
resourceUsedThresholdWithBE:
  enable: false
qosManager:
  cpuSuppress:
    reserveLSRequestFrom: LOW
    quotaFrom: LOW
    raiseDelay: 0.5
    maxWritesPerMinute: 60
    suppressRatio: {low: 0.5, medium: 0.5, high: 0.5, critical: 0.5, emergency: 0.5}
"""
FLOOR, RAISED = "10000", "100000"


def quota(path: Path) -> str:
    return (path / "cpu.cfs_quota_us").read_text().strip()


def be_group(rt: Containerd) -> Path:
    return CGROUP_FS / "cpu" / rt.cgroup_root / "kubepods" / "besteffort"


def be_pod(rt: Containerd, name: str, start: bool = True) -> tuple[Pod, str]:
    pod = rt.run_pod(name, "BestEffort", BE, {"node.koordinator.sh/extended-resource-spec": BATCH})
    return pod, rt.create_container(pod, "main", start=start)


def ls_pod(rt: Containerd, name: str) -> Pod:
    """An LS pod asking for both cores: BE's budget is its floor."""
    pod = rt.run_pod(name, "Burstable", LS)
    rt.create_container(pod, "main", cpu_shares=2048)
    return pod


def converged(rt: Containerd, pods: list[tuple[Pod, str]], want: str) -> Callable[[], bool]:
    """BE's group and every BE pod's and container's quota at ``want``."""

    def check() -> bool:
        groups = [be_group(rt)]
        for pod, cid in pods:
            groups += [CGROUP_FS / "cpu" / pod.config.linux.cgroup_parent.lstrip("/"), rt.container_cgroup(pod, cid)]
        return all(quota(g) == want for g in groups)

    return check


def refused(plugin: PluginProcess) -> list[str]:
    return [ln for ln in plugin.logs().splitlines() if "Invalid argument" in ln]


def test_be_cut_and_raised_over_and_over_is_never_refused(
    runtime: Containerd, plugin_factory: Callable[..., PluginProcess], tmp_path: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    plugin = plugin_factory(runtime, "--policy", str(policy))
    pods = [be_pod(runtime, f"batch-{i}") for i in range(3)]
    until(converged(runtime, pods, RAISED), 15, "BE not limited to one core with no LS request")
    # A pod's group the agent never heard of (left behind), with the 1-core quota of its kind:
    # the first cut lowers it before BE's own group, and no cut is refused for it.
    stray = be_group(runtime) / "pod-left-behind"
    stray.mkdir()
    try:
        (stray / "cpu.cfs_quota_us").write_text(RAISED)
        for i in range(3):
            ls = ls_pod(runtime, f"web-{i}")
            took = until(converged(runtime, pods, FLOOR), 10, f"cut {i}: BE's groups not at the floor")
            print(f"cut {i} converged in {took:.2f} s")
            assert quota(stray) == FLOOR
            runtime.remove_pod(ls)
            took = until(converged(runtime, pods, RAISED), 15, f"raise {i}: BE's groups not at one core")
            print(f"raise {i} converged in {took:.2f} s")
    finally:
        stray.rmdir()
    assert all(running(runtime, cid) for _, cid in pods)
    assert plugin.metric_sum("nriplugin_qos_cpu_suppress_total") >= 6
    assert refused(plugin) == []
    assert "besteffort/pod-left-behind's cpu.cfs_quota_us from 100000 to 10000 first" in plugin.logs()


def test_be_pods_created_while_the_agent_restarts_under_the_cut_start(
    runtime: Containerd, plugin_factory: Callable[..., PluginProcess], tmp_path: Path
) -> None:
    """BE cut to its floor; the agent SIGKILLed and a new one started while BE pods with a
    1-core batch limit are created, before, during and after its registration: every pod
    starts, and each converges under the cut (its pod and container groups at the floor)."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    first = plugin_factory(runtime, "--policy", str(policy))
    ls_pod(runtime, "web")
    pods = [be_pod(runtime, "batch-0")]
    until(converged(runtime, pods, FLOOR), 15, "BE not cut to its floor")
    for restart in range(2):
        made: list[tuple[Pod, str]] = []
        errors: list[str] = []
        first.proc.kill()
        first.proc.wait()
        maker = threading.Thread(target=create_be_pods, args=(runtime, f"batch-{restart}", 12, made, errors))
        maker.start()
        time.sleep(0.3)
        first = plugin_factory(runtime, "--policy", str(policy), wait=False)
        first.wait_ready()
        maker.join()
        assert errors == [], errors
        assert all(running(runtime, cid) for _, cid in made)
        pods += made
        until(converged(runtime, pods, FLOOR), 15, f"restart {restart}: BE pods not converged under the cut")
        assert refused(first) == []
        assert "holds 0.10 cores" in first.logs()  # learned before its first answer


def test_be_containers_created_before_a_cut_and_started_after_it_start(
    runtime: Containerd, plugin_factory: Callable[..., PluginProcess], tmp_path: Path
) -> None:
    """A created container waits for its start as long as its client likes, and cgroup v1
    refuses runc's write of a quota above BE's group's. Two BE containers with a 1-core batch
    limit are created while BE has its core: one before the agent runs (its values come in
    the update pushed after Synchronize), one through the agent's CreateContainer. An LS pod
    then cuts BE to its floor, and only then are they started: both start (the agent wrote
    their quotas at StartContainer, under the cut) and converge, and nothing is refused."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    early = be_pod(runtime, "batch-early", start=False)
    plugin = plugin_factory(runtime, "--policy", str(policy))
    late = be_pod(runtime, "batch-late", start=False)
    until(lambda: quota(be_group(runtime)) == RAISED, 15, "BE not limited to one core with no LS request")
    ls_pod(runtime, "web")
    until(lambda: quota(be_group(runtime)) == FLOOR, 10, "BE not cut to its floor")
    assert runtime.cri is not None
    for _, cid in (early, late):
        runtime.cri.call("StartContainer", msg("StartContainerRequest", container_id=cid))
    assert all(running(runtime, cid) for _, cid in (early, late))
    until(converged(runtime, [early, late], FLOOR), 15, "the late-started BE containers not converged under the cut")
    assert refused(plugin) == []


def create_be_pods(rt: Containerd, prefix: str, n: int, made: list[tuple[Pod, str]], errors: list[str]) -> None:
    """``n`` BE pods, one every 0.25 s; a pod that fails to start is what kubelet would see."""
    for i in range(n):
        try:
            made.append(be_pod(rt, f"{prefix}-{i}"))
        except Exception as exc:
            errors.append(f"{prefix}-{i}: {exc}")
        time.sleep(0.25)
