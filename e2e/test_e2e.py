"""End to end on a real containerd with NRI (the line NRIPLUGIN_RUNTIME picks), driven through
CRI like kubelet."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest

from nriplugin.cli.main import install
from nriplugin.kernel.cpulist import parse_cpulist
from nriplugin.node.hooks import QoSPlugin
from nriplugin.nri import api_pb2 as api
from nriplugin.nri.stub import HookPolicy, Plugin, Stub, StubOptions, UnsafeOnRuntime
from testkit.containerd import Containerd, Runtime, read_cgroup
from testkit.cri import msg
from testkit.plugin import PluginProcess, alive, children, free_port, runtime_args, scrape, until

BE = {"koordinator.sh/qosClass": "BE"}
LS = {"koordinator.sh/qosClass": "LS"}


def shares(rt: Containerd, pod: Any, cid: str) -> int:
    return int(read_cgroup(rt.container_cgroup(pod, cid), "cpu.shares"))


def test_be_adjusted_ls_left_as_requested(runtime: Containerd, plugin_factory: Callable[..., PluginProcess]) -> None:
    plugin_factory(runtime)
    be = runtime.run_pod("be", "BestEffort", BE)
    be_c = runtime.create_container(be, "main", cpu_shares=1024)
    ls = runtime.run_pod("ls", "Burstable", LS)
    ls_c = runtime.create_container(ls, "main", cpu_shares=512, cpu_quota=50000)
    plain_be = runtime.run_pod("k8s-besteffort", "BestEffort")  # no label: Kubernetes QoS decides
    plain_c = runtime.create_container(plain_be, "main", cpu_shares=1024)
    assert shares(runtime, be, be_c) == 2
    assert shares(runtime, ls, ls_c) == 512
    assert read_cgroup(runtime.container_cgroup(ls, ls_c), "cpu.cfs_quota_us") == "50000"
    assert shares(runtime, plain_be, plain_c) == 2


def test_preregistered_plugin_started_by_containerd(runtime_factory: Callable[..., Containerd]) -> None:
    rt = runtime_factory(start=False)
    port = free_port()
    install(str(rt.plugin_dir), "nriplugin", "05", ["--metrics-address", f"127.0.0.1:{port}"])
    rt.start()
    rt.import_images()
    assert rt.proc is not None
    plugins = children(rt.proc.pid)
    assert plugins, "containerd did not start the pre-registered plugin"
    try:
        pod = rt.run_pod("be", "BestEffort", BE)
        cid = rt.create_container(pod, "main", cpu_shares=1024)
        assert shares(rt, pod, cid) == 2
        rt.remove_all_pods()
        rt.stop()  # the runtime goes away: the plugin, its child, must exit by itself
        deadline = time.monotonic() + 10
        while any(alive(p) for p in plugins) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(alive(p) for p in plugins)
    finally:
        for p in plugins:
            if alive(p):
                os.kill(p, signal.SIGKILL)


def test_plugin_reconnects_after_containerd_restart(
    runtime: Containerd, plugin_factory: Callable[..., PluginProcess]
) -> None:
    plugin = plugin_factory(runtime)
    pod = runtime.run_pod("before", "BestEffort", BE)
    before = runtime.create_container(pod, "main", cpu_shares=1024)
    runtime.stop()
    time.sleep(0.3)
    assert plugin.get("/readyz")[0] == 503
    # Runtime down: the reconciler keeps working on its own.
    cpu = runtime.container_cgroup(pod, before)
    (cpu / "cpu.shares").write_text("1024")
    deadline = time.monotonic() + 5
    while read_cgroup(cpu, "cpu.shares") != "2":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    runtime.start()
    plugin.wait_ready(registrations=2)
    assert shares(runtime, pod, before) == 2  # still running, untouched by the restart
    pod2 = runtime.run_pod("after", "BestEffort", BE)
    after = runtime.create_container(pod2, "main", cpu_shares=1024)
    assert shares(runtime, pod2, after) == 2


def test_synchronize_200_existing_pods(runtime: Containerd, plugin_factory: Callable[..., PluginProcess]) -> None:
    """200 pods before the plugin connects: Synchronize (a message far over 4 KiB) succeeds
    within the runtime's deadline and its updates reach the running BE containers."""

    def make(i: int) -> tuple[Any, str, bool]:
        qos = BE if i % 2 == 0 else LS
        pod = runtime.run_pod(f"pre-{i}", "BestEffort" if i % 2 == 0 else "Burstable", qos)
        return pod, runtime.create_container(pod, "main", cpu_shares=1024), i % 2 == 0

    with ThreadPoolExecutor(8) as ex:
        made = list(ex.map(make, range(200)))
    plugin = plugin_factory(runtime)
    assert plugin.metric('nriplugin_synchronize_objects{kind="pods"}') == 200
    assert plugin.metric("nriplugin_synchronize_duration_seconds_sum") < 2.0
    deadline = time.monotonic() + 10  # the model takes them in right after the answer
    while "synchronized 200 pods, 200 containers, 100 updates " not in plugin.logs():
        assert time.monotonic() < deadline, plugin.logs()[-2000:]
        time.sleep(0.05)
    # The runtime applies the pushed updates (one runc update each).
    want = [2 if is_be else 1024 for _, _, is_be in made]
    deadline = time.monotonic() + 60
    while (got := [shares(runtime, pod, cid) for pod, cid, _ in made]) != want and time.monotonic() < deadline:
        time.sleep(0.2)
    assert got == want


def _inprocess(rt: Containerd, plugin: Plugin, body: Callable[[Stub], Any], **opts: Any) -> Any:
    async def main() -> Any:
        stub = Stub(plugin, StubOptions(socket_path=rt.nri_socket, idx="20", **opts))
        task = asyncio.ensure_future(stub.run())
        try:
            await asyncio.wait_for(stub.ready.wait(), 20)
            return await body(stub)
        finally:
            stub.stop()
            await asyncio.wait_for(task, 10)

    return asyncio.run(main())


def test_pushed_update_changes_a_running_container(runtime: Containerd, runtime_line: Runtime) -> None:
    """A plugin's UpdateContainers reaches the running container where the runtime takes it
    safely (containerd 2.4); on 1.7 and 2.1, whose NRI can deadlock on it, the stub refuses it
    and the container keeps its values."""
    pod = runtime.run_pod("ls", "Burstable", LS)
    cid = runtime.create_container(pod, "main", cpu_shares=1024)

    cg = runtime.container_cgroup(pod, cid)
    before: dict[str, str] = {}

    async def push(stub: Stub) -> list[api.ContainerUpdate] | Exception:
        before.update({f: read_cgroup(cg, f) for f in ("cpu.shares", "cpu.cfs_quota_us")})
        u = api.ContainerUpdate(container_id=cid)
        u.linux.resources.cpu.shares.value = 77
        u.linux.resources.cpu.quota.value = 30000
        u.linux.resources.cpu.period.value = 100000
        try:
            return await stub.update_containers([u])
        except UnsafeOnRuntime as exc:
            return exc

    result = _inprocess(runtime, QoSPlugin(), push)
    after = {f: read_cgroup(cg, f) for f in ("cpu.shares", "cpu.cfs_quota_us")}
    if runtime_line.safe_plugin_updates:
        assert result == []
        assert after == {"cpu.shares": "77", "cpu.cfs_quota_us": "30000"}
    else:
        assert isinstance(result, UnsafeOnRuntime) and "containerd#13733" in str(result)
        assert after == before and after["cpu.shares"] != "77"


class SlowPlugin(Plugin):
    async def create_container(self, pod: api.PodSandbox, container: api.Container) -> api.ContainerAdjustment:
        await asyncio.sleep(1.5)
        adj = api.ContainerAdjustment()
        adj.linux.resources.cpu.shares.value = 2
        return adj


@pytest.mark.parametrize("fail_closed", [False, True])
def test_hook_over_budget(runtime: Containerd, fail_closed: bool) -> None:
    pod = runtime.run_pod("be", "BestEffort", BE)

    async def create(stub: Stub) -> str | Exception:
        try:
            return await asyncio.to_thread(runtime.create_container, pod, "main", 1024)
        except grpc.RpcError as exc:
            return exc

    policy = HookPolicy(budget=0.2, fail_closed=fail_closed)
    result = _inprocess(runtime, SlowPlugin(), create, policies={"create_container": policy})
    if fail_closed:
        assert isinstance(result, grpc.RpcError) and "create_container timeout" in str(result.details())
    else:
        assert isinstance(result, str)
        assert shares(runtime, pod, result) == 1024  # started as requested, no adjustment


BATCH = (
    '{"containers":{"main":{"requests":{"kubernetes.io/batch-cpu":"500","kubernetes.io/batch-memory":"256Mi"},'
    '"limits":{"kubernetes.io/batch-cpu":"1k","kubernetes.io/batch-memory":"512Mi"}}}}'
)


def test_features_land_in_the_real_cgroups(
    runtime: Containerd, plugin_factory: Callable[..., PluginProcess], tmp_path: Path
) -> None:
    """BE sized from batch resources (NRI adjustment), its memory protection (v1 soft limit)
    and LS burst (written after creation on cgroup v1), present right after CRI returns; then
    a hot-reloaded coreSched policy puts the next BE pod and its container in SCHED_IDLE."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "cpuBurstStrategy: {policy: cpuBurstOnly}\n"
        "resourceQOSStrategy: {beClass: {memoryQOS: {enable: true, lowLimitPercent: 50}}}\n"
    )
    plugin = plugin_factory(runtime, "--policy", str(policy))
    be = runtime.run_pod("batch", "BestEffort", BE, {"node.koordinator.sh/extended-resource-spec": BATCH})
    be_c = runtime.create_container(be, "main", cpu_shares=2)
    cpu = runtime.container_cgroup(be, be_c)
    assert read_cgroup(cpu, "cpu.shares") == "512"
    assert read_cgroup(cpu, "cpu.cfs_quota_us") == "100000"
    mem = runtime.container_cgroup(be, be_c, "memory")
    assert read_cgroup(mem, "memory.limit_in_bytes") == str(512 << 20)
    assert read_cgroup(mem, "memory.soft_limit_in_bytes") == str(128 << 20)  # 50 % of batch-memory 256Mi
    assert read_cgroup(cpu.parent, "cpu.shares") == "512"  # the pod's cgroup, at RunPodSandbox
    ls = runtime.run_pod("web", "Burstable", LS)
    ls_c = runtime.create_container(ls, "main", cpu_shares=512, cpu_quota=40000)
    lcpu = runtime.container_cgroup(ls, ls_c)
    assert read_cgroup(lcpu, "cpu.shares") == "512"
    if (lcpu / "cpu.cfs_burst_us").exists():
        assert read_cgroup(lcpu, "cpu.cfs_burst_us") == "40000"
    # A hostile annotation: the batch feature is skipped (fail-open), BE still gets its floor.
    bad = runtime.run_pod("bad", "BestEffort", BE, {"node.koordinator.sh/extended-resource-spec": '{"containers":5}'})
    bad_c = runtime.create_container(bad, "main", cpu_shares=1024)
    assert read_cgroup(runtime.container_cgroup(bad, bad_c), "cpu.shares") == "2"
    assert plugin.metric('nriplugin_invalid_input_total{reason="batchResource"}') >= 1
    time.sleep(0.3)  # the reconciler's first look at the new containers, after StartContainer
    assert plugin.metric_sum("nriplugin_repaired_total") == 0  # born right: nothing to repair
    if not (cpu / "cpu.idle").exists():
        return
    assert read_cgroup(cpu, "cpu.idle") == "0"
    policy.write_text("resourceQOSStrategy: {policies: {cpuPolicy: coreSched}}\n")
    deadline = time.monotonic() + 10
    while plugin.metric("nriplugin_policy_version") < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert plugin.metric("nriplugin_policy_version") == 2
    idle = runtime.run_pod("idle", "BestEffort", BE)
    idle_c = runtime.create_container(idle, "main", cpu_shares=2)
    icpu = runtime.container_cgroup(idle, idle_c)
    # v1: NRI cannot carry cpu.idle; the agent writes it right after StartContainer's answer
    until(lambda: read_cgroup(icpu, "cpu.idle") == "1", 3, "the BE container's cpu.idle is not 1", step=0.02)
    assert read_cgroup(icpu.parent, "cpu.idle") == "1"


def test_lsr_gets_exclusive_cores_and_sharers_follow(
    runtime: Containerd, plugin_factory: Callable[..., PluginProcess]
) -> None:
    """On this node's real topology: an LSR container is pinned to whole cores, a running LS
    container is moved off them in the same CreateContainer answer, and gets them back when the
    LSR container goes (pushed with UpdateContainers from outside the handler where the runtime
    takes that safely, 2.4; written by the reconciler on 1.7 and 2.1: containerd#13733)."""
    online = parse_cpulist(Path("/sys/devices/system/cpu/online").read_text())
    if len(online) < 2:
        pytest.skip("needs at least two CPUs")
    plugin_factory(runtime)
    ls = runtime.run_pod("web", "Burstable", LS)
    ls_c = runtime.create_container(ls, "main", cpu_shares=512)
    ls_set = runtime.container_cgroup(ls, ls_c, "cpuset")
    assert parse_cpulist(read_cgroup(ls_set, "cpuset.cpus")) == online
    lsr = runtime.run_pod("db", "Guaranteed", {"koordinator.sh/qosClass": "LSR"})
    lsr_c = runtime.create_container(lsr, "main", cpu_shares=1024, cpu_quota=100000)
    pinned = set(parse_cpulist(read_cgroup(runtime.container_cgroup(lsr, lsr_c, "cpuset"), "cpuset.cpus")))
    assert pinned and pinned < set(online)
    deadline = time.monotonic() + 10
    while set(parse_cpulist(read_cgroup(ls_set, "cpuset.cpus"))) != set(online) - pinned:
        assert time.monotonic() < deadline, read_cgroup(ls_set, "cpuset.cpus")
        time.sleep(0.05)
    assert runtime.cri is not None
    runtime.cri.call("StopContainer", msg("StopContainerRequest", container_id=lsr_c, timeout=0))
    runtime.cri.call("RemoveContainer", msg("RemoveContainerRequest", container_id=lsr_c))
    deadline = time.monotonic() + 10
    while parse_cpulist(read_cgroup(ls_set, "cpuset.cpus")) != online:
        assert time.monotonic() < deadline, read_cgroup(ls_set, "cpuset.cpus")
        time.sleep(0.05)


def test_reconciler_repairs_drift_and_converges_after_plugin_restart(
    runtime: Containerd, plugin_factory: Callable[..., PluginProcess]
) -> None:
    """Kill the plugin, create containers without it, start it again: every container
    converges (Synchronize updates + the reconciler). Then an external write is repaired."""
    first = plugin_factory(runtime)
    first.stop()
    be = runtime.run_pod("batch", "BestEffort", BE, {"node.koordinator.sh/extended-resource-spec": BATCH})
    be_c = runtime.create_container(be, "main", cpu_shares=2)
    ls = runtime.run_pod("web", "Burstable", LS)
    ls_c = runtime.create_container(ls, "main", cpu_shares=512, cpu_quota=40000)
    cpu, lcpu = runtime.container_cgroup(be, be_c), runtime.container_cgroup(ls, ls_c)
    assert read_cgroup(cpu, "cpu.shares") == "2"  # born without the plugin
    plugin = plugin_factory(runtime)
    want = {(cpu, "cpu.shares"): "512", (cpu, "cpu.cfs_quota_us"): "100000", (cpu.parent, "cpu.shares"): "512"}
    if (lcpu / "cpu.cfs_burst_us").exists():
        want[(lcpu, "cpu.cfs_burst_us")] = "40000"
    deadline = time.monotonic() + 10
    while any(read_cgroup(d, f) != v for (d, f), v in want.items()):
        assert time.monotonic() < deadline, {f"{d.name}/{f}": read_cgroup(d, f) for (d, f) in want}
        time.sleep(0.05)
    (cpu / "cpu.shares").write_text("1024")  # someone else rewrites a managed file
    deadline = time.monotonic() + 5
    while read_cgroup(cpu, "cpu.shares") != "512":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert plugin.metric('nriplugin_repaired_total{resource="cpu.shares"}') >= 1
    assert plugin.metric("nriplugin_repair_latency_seconds_count") >= 1


def test_preregistered_plugin_converges_from_the_runtime_alone(
    runtime_factory: Callable[..., Containerd], runtime_line: Runtime, tmp_path: Path
) -> None:
    """What existed before a pre-registered plugin (containers born without it, values changed
    while it was down) converges, after containerd restarts and after it is SIGKILLed. On
    containerd 1.7 (NRI v0.6) the plugin gets no Synchronize: CRI's inventory alone adopts
    them. On 2.x (NRI >= v0.7) it gets a Synchronize, so the inventory adopts nothing. (The
    QoS manager is off: containerd's and the agent's own start-up use well over a core of
    this 2-core node, and BE would rightly be cut below the batch limit this test looks for,
    and held there; e2e/test_be_limits.py covers the cut.)"""
    rt = runtime_factory(start=False)
    rt.start()
    rt.import_images()
    # Born without any plugin.
    spec = json.loads(BATCH)
    spec["containers"]["later"] = spec["containers"]["main"]
    be = rt.run_pod("batch", "BestEffort", BE, {"node.koordinator.sh/extended-resource-spec": json.dumps(spec)})
    be_c = rt.create_container(be, "main", cpu_shares=2)
    ls = rt.run_pod("web", "Burstable", LS)
    ls_c = rt.create_container(ls, "main", cpu_shares=512, cpu_quota=40000)
    waiting = rt.create_container(be, "later", cpu_shares=2, start=False)  # CREATED: no cgroup yet
    cpu, lcpu = rt.container_cgroup(be, be_c), rt.container_cgroup(ls, ls_c)
    assert read_cgroup(cpu, "cpu.shares") == "2"
    port = free_port()
    policy = tmp_path / "policy.yaml"
    policy.write_text("qosManager: {enable: false}\n")
    args = ["--metrics-address", f"127.0.0.1:{port}", *runtime_args(rt), "--resync-seconds", "3600"]
    install(str(rt.plugin_dir), "nriplugin", "05", [*args, "--policy", str(policy)])
    rt.stop()
    rt.start()  # containerd starts the plugin (a Synchronize follows on 2.x only)
    # the pod's own cgroup gets the sum of both containers' batch requests (2 x 500m)
    want = {(cpu, "cpu.shares"): "512", (cpu, "cpu.cfs_quota_us"): "100000", (cpu.parent, "cpu.shares"): "1024"}
    if (lcpu / "cpu.cfs_burst_us").exists():
        want[(lcpu, "cpu.cfs_burst_us")] = "40000"
    _converge(want)
    assert rt.cri is not None
    rt.cri.call("StartContainer", msg("StartContainerRequest", container_id=waiting))
    later = rt.container_cgroup(be, waiting)
    _converge({(later, "cpu.shares"): "512", (later, "cpu.cfs_quota_us"): "100000"})
    syncs = scrape(port, "nriplugin_synchronize_duration_seconds_count")
    adopted = scrape(port, 'nriplugin_inventory_containers_total{change="adopted"}')
    if runtime_line.syncs_preregistered:
        assert (syncs, adopted) == (1, 0)
        assert scrape(port, 'nriplugin_synchronize_objects{kind="containers"}') == 3
    else:
        assert (syncs, adopted) == (0, 3)
    # containerd crashes (its plugin goes with it); someone changes a value meanwhile.
    assert rt.proc is not None
    plugins = children(rt.proc.pid)
    rt.stop(kill=True)
    deadline = time.monotonic() + 10
    while any(alive(p) for p in plugins):
        assert time.monotonic() < deadline, "the plugin outlived its runtime"
        time.sleep(0.05)
    (cpu / "cpu.shares").write_text("1024")
    (cpu / "cpu.cfs_quota_us").write_text("-1")
    rt.start()
    _converge(want)
    # And the restarted plugin still handles new containers through its hooks.
    fresh = rt.create_container(ls, "sidecar", cpu_shares=256)
    assert shares(rt, ls, fresh) == 256


def _converge(want: dict[tuple[Path, str], str], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while any(read_cgroup(d, f) != v for (d, f), v in want.items()):
        assert time.monotonic() < deadline, {f"{d.name[:12]}/{f}": read_cgroup(d, f) for (d, f) in want}
        time.sleep(0.05)


def test_without_nri_new_containers_converge_from_cri_and_the_cgroup_tree(
    runtime_factory: Callable[..., Containerd], plugin_factory: Callable[..., PluginProcess], tmp_path: Path
) -> None:
    """containerd with NRI off: no hooks at all. A new pod/container cgroup under the pod root
    makes the agent ask CRI what it is; once the runtime shows it running it converges, in
    well under a second rather than at the next 60 s pass. The same for a container
    recreated with a new id; the old one is forgotten. (The QoS manager is off: on a busy
    machine it would rightly cap BE's quota below the batch limit this test looks for.)"""
    rt = runtime_factory(nri=False)
    policy = tmp_path / "policy.yaml"
    policy.write_text("qosManager: {enable: false}\n")
    plugin = plugin_factory(rt, "--resync-seconds", "3600", "--policy", str(policy), wait=False)
    deadline = time.monotonic() + 20
    while plugin.metric('nriplugin_inventory_passes_total{outcome="ok"}') < 1:
        assert time.monotonic() < deadline, plugin.logs()[-2000:]
        time.sleep(0.05)
    assert plugin.get("/readyz")[0] == 503  # never registered: there is no NRI
    be = rt.run_pod("batch", "BestEffort", BE, {"node.koordinator.sh/extended-resource-spec": BATCH})
    t0 = time.monotonic()
    be_c = rt.create_container(be, "main", cpu_shares=2)
    cpu = rt.container_cgroup(be, be_c)
    _converge({(cpu, "cpu.shares"): "512", (cpu, "cpu.cfs_quota_us"): "100000"}, timeout=10)
    print(f"converged {time.monotonic() - t0:.2f} s after CreateContainer, without NRI")
    assert plugin.metric('nriplugin_inventory_containers_total{change="adopted"}') == 1
    # Recreated with a new id (kubelet restarting it), nobody telling us: the new one
    # converges, the old one is forgotten.
    assert rt.cri is not None
    rt.cri.call("StopContainer", msg("StopContainerRequest", container_id=be_c, timeout=0))
    rt.cri.call("RemoveContainer", msg("RemoveContainerRequest", container_id=be_c))
    again = rt.create_container(be, "main", cpu_shares=2)
    cpu = rt.container_cgroup(be, again)
    _converge({(cpu, "cpu.shares"): "512", (cpu, "cpu.cfs_quota_us"): "100000"}, timeout=10)
    assert plugin.metric('nriplugin_inventory_containers_total{change="adopted"}') == 2
    deadline = time.monotonic() + 10
    while plugin.metric('nriplugin_inventory_containers_total{change="forgotten"}') < 1:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_lsr_pods_that_cannot_be_pinned_never_overlap_an_exclusive_core(
    runtime: Containerd, plugin_factory: Callable[..., PluginProcess]
) -> None:
    """Three LSR pods of one CPU each on this node: as many as fit are pinned (one core stays
    in the share pool), the rest run in the share pool, never on a pinned core; the shortfall
    is counted as such, not as a pod's bad annotation."""
    online = set(parse_cpulist(Path("/sys/devices/system/cpu/online").read_text()))
    if len(online) < 2:
        pytest.skip("needs at least two CPUs")
    plugin = plugin_factory(runtime)
    got = []
    for i in range(3):
        pod = runtime.run_pod(f"db{i}", "Guaranteed", {"koordinator.sh/qosClass": "LSR"})
        cid = runtime.create_container(pod, "main", cpu_shares=1024, cpu_quota=100000)
        got.append(set(parse_cpulist(read_cgroup(runtime.container_cgroup(pod, cid, "cpuset"), "cpuset.cpus"))))
    short = int(plugin.metric('nriplugin_invalid_input_total{reason="cpuset_capacity"}'))
    if len(online) == 2:
        assert short == 2  # one core pinned, one stays in the share pool
    pinned, shared = got[: 3 - short], got[3 - short :]
    taken = set().union(*pinned)
    assert pinned and sum(len(g) for g in pinned) == len(taken)  # no core pinned twice
    assert all(g == online - taken for g in shared)  # the share pool, not the runtime's all-CPU default
    assert plugin.metric('nriplugin_invalid_input_total{reason="cpuset"}') == 0


def test_an_in_place_resize_moves_derived_values(
    runtime: Containerd, plugin_factory: Callable[..., PluginProcess]
) -> None:
    """CRI UpdateContainerResources doubles an LS container's quota: the burst derived from it
    follows, and a repair afterwards uses the new value, not the old one. Halved again, the
    resize goes through: the kernel refuses a quota below the group's burst, so the agent
    lowers the burst before the runtime writes the new quota."""
    plugin_factory(runtime)
    pod = runtime.run_pod("web", "Burstable", LS)
    cid = runtime.create_container(pod, "main", cpu_shares=512, cpu_quota=100000)
    cpu = runtime.container_cgroup(pod, cid)
    deadline = time.monotonic() + 5
    while read_cgroup(cpu, "cpu.cfs_burst_us") != "100000":
        assert time.monotonic() < deadline, read_cgroup(cpu, "cpu.cfs_burst_us")
        time.sleep(0.02)
    assert runtime.cri is not None
    res = msg("LinuxContainerResources", cpu_shares=512, cpu_quota=200000, cpu_period=100000)
    runtime.cri.call("UpdateContainerResources", msg("UpdateContainerResourcesRequest", container_id=cid, linux=res))
    assert read_cgroup(cpu, "cpu.cfs_quota_us") == "200000"
    deadline = time.monotonic() + 5
    while read_cgroup(cpu, "cpu.cfs_burst_us") != "200000":
        assert time.monotonic() < deadline, read_cgroup(cpu, "cpu.cfs_burst_us")
        time.sleep(0.02)
    (cpu / "cpu.cfs_burst_us").write_text("0")  # someone else's write: repaired to the new value
    deadline = time.monotonic() + 5
    while read_cgroup(cpu, "cpu.cfs_burst_us") != "200000":
        assert time.monotonic() < deadline, read_cgroup(cpu, "cpu.cfs_burst_us")
        time.sleep(0.02)
    res = msg("LinuxContainerResources", cpu_shares=512, cpu_quota=50000, cpu_period=100000)
    runtime.cri.call("UpdateContainerResources", msg("UpdateContainerResourcesRequest", container_id=cid, linux=res))
    assert (read_cgroup(cpu, "cpu.cfs_quota_us"), read_cgroup(cpu, "cpu.cfs_burst_us")) == ("50000", "50000")
