"""Runs INSIDE the VM (e2e/vm/test_vm.py starts it there): the product end to end on a real
cgroup v2 kernel: the private containerd of the e2e tests (testkit/containerd.py, cgroupfs
driver) with runc and NRI, nriplugin as its own process (`nriplugin run`), pods through CRI in
kubelet's layout, on the line NRIPLUGIN_RUNTIME names (the lane runs this module on 2.4 and on
2.1). Birth values land in the v2 files; where the lines differ each does what its NRI carries
(the version learnt at Configure, BE's ``oom_score_adj``, a pod-level resize told or not);
drift on a container's ``cpu.max`` is repaired; a coreSched policy reloaded at run time
puts BE in SCHED_IDLE, and the idle group's refused weight is neither repaired nor an error;
on the same agent, the cpuset pools on the guest's two CPUs, LSR memory protection, BE's
``io.weight``/``io.max`` on a loop device, and ``nriplugin doctor``. A second agent: MemoryEvict
under a memory-limited pods root, and the handover to a standby agent."""

from __future__ import annotations

import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from e2e.vm.guest.v2_kernel import ROOT
from nriplugin.agent.lock import lock_path, read_holder
from nriplugin.features import blkio
from nriplugin.kernel.cgroup import WEIGHT_MAPPINGS
from nriplugin.kernel.cpulist import parse_cpulist
from testkit import containerd as harness
from testkit.cri import msg
from testkit.plugin import PluginProcess, runtime_args, until
from testkit.workloads import GROW, running

if os.environ.get("NRIPLUGIN_IN_VM") != "1":  # never collected on the host (not test_*.py)
    pytest.skip("runs inside the VM only (e2e/vm/test_vm.py)", allow_module_level=True)
BE = {"koordinator.sh/qosClass": "BE"}
LS = {"koordinator.sh/qosClass": "LS"}
BATCH = (
    '{"containers":{"main":{"requests":{"kubernetes.io/batch-cpu":"500","kubernetes.io/batch-memory":"256Mi"},'
    '"limits":{"kubernetes.io/batch-cpu":"1k","kubernetes.io/batch-memory":"512Mi"}}}}'
)
POLICY = (  # the QoS manager off: under TCG the guest is busy, and BE's cut is v2_qos.py's subject
    "qosManager: {enable: false}\n"
    "cpuBurstStrategy: {policy: cpuBurstOnly}\n"
    "resourceQOSStrategy: {beClass: {memoryQOS: {enable: true, minLimitPercent: 25, lowLimitPercent: 50,"
    " throttlingPercent: 80}}}\n"
)


@pytest.fixture(scope="module")
def runtime() -> Iterator[harness.Containerd]:
    rt = harness.Containerd(harness.install(), Path(tempfile.mkdtemp(prefix="nriplugin-vm-e2e-")))
    try:
        t0 = time.monotonic()
        rt.start(timeout=120)
        rt.import_images()
        print(f"containerd ready with images in {time.monotonic() - t0:.1f} s")
        yield rt
    finally:
        rt.teardown()
        for d in sorted((ROOT / rt.cgroup_root).glob("**/"), key=lambda p: -len(p.parts)):
            d.rmdir()  # teardown's cgroup cleanup walks v1 hierarchies; on v2 the tree is here


def group(rt: harness.Containerd, pod: harness.Pod, cid: str = "") -> Path:
    parent: str = pod.config.linux.cgroup_parent
    return ROOT / parent.lstrip("/") / cid


def read(d: Path, name: str) -> str:
    return (d / name).read_text().strip()


def test_birth_values_policy_reload_and_idle_be_on_v2(runtime: harness.Containerd, tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    print("groups under the root at the agent's start:", sorted(p.name for p in ROOT.iterdir() if p.is_dir()))
    plugin = PluginProcess(runtime.nri_socket, *runtime_args(runtime), "--policy", str(policy))
    try:
        t0 = time.monotonic()
        plugin.wait_ready(timeout=300)
        print(f"nriplugin ready in {time.monotonic() - t0:.1f} s")
        sharers = _scenario(runtime, plugin, policy)
        _pools_protection_and_io(runtime, plugin, policy, sharers)
        _doctor(runtime, plugin)
    finally:
        print(plugin.logs()[-3000:])
        plugin.stop()


def settle(want: dict[tuple[Path, str], set[str]], timeout: float = 20.0) -> None:
    """Every file reads one of its wanted values within ``timeout`` (those the writer sets
    after StartContainer land a moment after CRI returns); else fail with what each reads."""
    deadline = time.monotonic() + timeout
    while True:
        have = {k: read(*k) for k in want}
        if all(have[k] in v for k, v in want.items()):
            return
        if time.monotonic() > deadline:
            wrong = {
                f"{d.name[:12]}/{f}": (have[(d, f)], sorted(v)) for (d, f), v in want.items() if have[(d, f)] not in v
            }
            raise AssertionError(f"(read, wanted): {wrong}")
        time.sleep(0.1)


def _scenario(runtime: harness.Containerd, plugin: PluginProcess, policy: Path) -> list[Path]:
    """Birth values, reloads, idle BE; the groups of the running BE and LS containers."""
    be = runtime.run_pod("batch", "BestEffort", BE, {"node.koordinator.sh/extended-resource-spec": BATCH})
    be_c = runtime.create_container(be, "main", cpu_shares=2)
    d = group(runtime, be, be_c)
    weights = {str(to(512)) for to, _ in WEIGHT_MAPPINGS.values()}  # batch-cpu 500m -> 512 shares
    settle(
        {
            (d, "cpu.weight"): weights,  # by the runtime's own mapping
            (d, "cpu.max"): {"100000 100000"},
            (d, "memory.max"): {str(512 << 20)},
            (d, "memory.min"): {str(64 << 20)},  # 25 % of batch-memory 256Mi
            (d, "memory.low"): {str(128 << 20)},  # 50 %
            (d, "memory.high"): {str(((256 << 20) + (256 << 20) * 8 // 10) // 4096 * 4096)},  # req + 80 % of the rest
            (group(runtime, be), "cpu.weight"): weights,  # the pod's group, at RunPodSandbox
        }
    )
    ls = runtime.run_pod("web", "Burstable", LS)
    ls_c = runtime.create_container(ls, "main", cpu_shares=512, cpu_quota=40000)
    ld = group(runtime, ls, ls_c)
    settle({(ld, "cpu.max"): {"40000 100000"}, (ld, "cpu.max.burst"): {"40000"}})  # cpuBurstOnly: burst = quota
    time.sleep(1.0)  # the reconciler's first look at the new containers, after StartContainer
    assert plugin.metric_sum("nriplugin_repaired_total") == 0, plugin.logs()[-3000:]  # born right
    assert read(d, "cpu.idle") == "0"
    _the_lines_nri(runtime, plugin, (be, be_c), (ls, ls_c))
    _drift_repaired(plugin, d)
    policy.write_text("qosManager: {enable: false}\nresourceQOSStrategy: {policies: {cpuPolicy: coreSched}}\n")
    deadline = time.monotonic() + 60
    while plugin.metric("nriplugin_policy_version") < 2:
        assert time.monotonic() < deadline, "the policy reload was not seen"
        time.sleep(0.1)
    idle = runtime.run_pod("idle", "BestEffort", BE)
    idle_c = runtime.create_container(idle, "main", cpu_shares=2)
    ic = group(runtime, idle, idle_c)
    assert read(ic, "cpu.idle") == "1"
    assert read(ic.parent, "cpu.idle") == "1"
    assert read(ic, "cpu.weight") == "0"  # an idle group's: the kernel refuses any other
    deadline = time.monotonic() + 30  # the running BE container is moved to SCHED_IDLE too
    while read(d, "cpu.idle") != "1":
        assert time.monotonic() < deadline, "the running BE container did not become idle"
        time.sleep(0.1)
    before = plugin.metric_sum("nriplugin_repaired_total")
    time.sleep(3.0)
    assert plugin.metric_sum("nriplugin_repaired_total") == before, "repairs loop on an idle group"
    assert "rejected" not in plugin.logs(), plugin.logs()[-3000:]
    policy.write_text(  # another reload while BE is idle: its memory protection still follows
        "qosManager: {enable: false}\nresourceQOSStrategy: {policies: {cpuPolicy: coreSched},"
        " beClass: {memoryQOS: {enable: true, lowLimitPercent: 60}}}\n"
    )
    settle({(d, "memory.low"): {str((256 << 20) * 60 // 100 // 4096 * 4096)}}, timeout=60)
    logs = plugin.logs()
    assert "rejected" not in logs and "UpdateContainers of" not in logs and "could not update" not in logs, logs[-3000:]
    return [d, ld]


# What each line's NRI carries (docs/nri-versions.md): the version and how the agent learns it,
# SCHED_IDLE (v0.11) and IO priority (v0.10) for BE, oom_score_adj (v0.8), pod-level resize (v0.10).
LINES = {
    "2.1": ("v0.8", "inferred from its version", False, False, True, False),
    "2.4": ("v0.12", "as it says", True, True, True, True),
}


def _the_lines_nri(
    runtime: harness.Containerd, plugin: PluginProcess, be: tuple[harness.Pod, str], ls: tuple[harness.Pod, str]
) -> None:
    """Where the lines differ, each does what its NRI carries: the version the agent learns at
    Configure and the paths it says are in force; BE's ``oom_score_adj`` (v0.8: both lines) on
    the container's process; a pod-level resize told to the agent on 2.2+ only."""
    line = runtime.runtime.line
    assert line in LINES, f"containerd {runtime.runtime.version}: no expectation for this line (add it to LINES)"
    nri, how, sched, io, oom, pod_update = LINES[line]
    logs = plugin.logs()
    assert re.search(
        rf"configured by containerd v?{re.escape(runtime.runtime.version)}\S*: NRI {nri}\.\d+ \({how}\)", logs
    ), logs[-3000:]
    for name, carried in (
        ("SCHED_IDLE for BE", sched),
        ("IO priority idle for BE", io),
        ("oom_score_adj 1000 for BE", oom),
    ):
        said = re.search(rf"{name}: (in force|not available)", logs)
        assert said and said[1] == ("in force" if carried else "not available"), f"{name}: {said}"
    resize = f"subscribed (UpdatePodSandbox, runtime NRI {nri}" if pod_update else f"not told (runtime NRI {nri}"
    assert f"pod-level resize: {resize}" in logs, logs[-3000:]
    assert "pod-level resize: followed" not in logs, logs[-3000:]  # claimed only once one came
    be_adj, ls_adj = (int(Path(f"/proc/{first_pid(group(runtime, *p))}/oom_score_adj").read_text()) for p in (be, ls))
    assert be_adj == (1000 if oom else ls_adj) and ls_adj != 1000, (be_adj, ls_adj)
    res = msg("LinuxContainerResources", cpu_shares=512, cpu_quota=50000, cpu_period=100000)
    assert runtime.cri is not None
    try:
        runtime.cri.call(
            "UpdatePodSandboxResources", msg("UpdatePodSandboxResourcesRequest", pod_sandbox_id=ls[0].id, resources=res)
        )
    except grpc.RpcError as exc:
        assert not pod_update and exc.code() == grpc.StatusCode.UNIMPLEMENTED, exc
    count = 'nriplugin_hook_duration_seconds_count{event="%s"}'
    if pod_update:
        until(lambda: plugin.metric(count % "post_update_pod_sandbox") >= 1, 30, "PostUpdatePodSandbox not seen")
        assert "pod-level resize: followed (UpdatePodSandbox seen since" in plugin.logs(), plugin.logs()[-3000:]
    else:
        time.sleep(1.0)
        assert plugin.metric(count % "update_pod_sandbox") == 0
    print(f"containerd {runtime.runtime.version}: NRI {nri} ({how}); BE oom_score_adj {be_adj}, LS {ls_adj}")


def first_pid(d: Path) -> int:
    until(lambda: read(d, "cgroup.procs").split(), 10, f"no process in {d}")
    return int(read(d, "cgroup.procs").split()[0])


def _drift_repaired(plugin: PluginProcess, d: Path) -> None:
    """Drift on a real v2 file the agent owns (a batch container's ``cpu.max``, from its
    batch-cpu limit), as another writer would leave it: the reconciler (woken by inotify on the
    v2 file) writes the container's value back, and counts it."""
    before = plugin.metric_sum("nriplugin_repaired_total")
    want = read(d, "cpu.max")
    (d / "cpu.max").write_text("max 100000")
    took = until(lambda: read(d, "cpu.max") == want, 30, lambda: f"cpu.max drifted to {read(d, 'cpu.max')!r}")
    until(lambda: plugin.metric_sum("nriplugin_repaired_total") > before, 10, "the repair was not counted")
    print(f"cpu.max drift ('max 100000') repaired to {want!r} in {took:.2f} s")


def cpus(d: Path) -> set[int]:
    """The CPUs a group runs on: on v2 ``cpuset.cpus`` is empty until someone sets it."""
    return set(parse_cpulist(read(d, "cpuset.cpus.effective")))


def _pools_protection_and_io(
    runtime: harness.Containerd, plugin: PluginProcess, policy: Path, sharers: list[Path]
) -> None:
    """On the same agent, a policy with LSR memory protection and BE block I/O rules: an LSR pod
    is pinned to one of the guest's two CPUs and the running sharers move off it; a second LSR
    pod finds no whole core free (one always stays in the share pool): the shortfall is counted
    and it runs in the share pool. A BE pod gets the weight and the throttle on a loop device."""
    dev = blkio.resolve_device("/dev/loop0")
    policy.write_text(
        "qosManager: {enable: false}\n"
        "resourceQOSStrategy:\n"
        "  lsrClass: {memoryQOS: {enable: true, minLimitPercent: 50, lowLimitPercent: 80, throttlingPercent: 90}}\n"
        "  beClass: {blkioQOS: {enable: true, blocks: [{name: /dev/loop0, type: device,"
        " ioCfg: {ioWeightPercent: 20, readBPS: 1048576}}]}}\n"
    )
    until(lambda: plugin.metric("nriplugin_policy_version") >= 4, 60, "the fourth policy was not seen")
    online = set(parse_cpulist(Path("/sys/devices/system/cpu/online").read_text()))
    assert len(online) == 2, f"the guest has CPUs {online}; the pool figures below are for two"
    assert all(cpus(d) == online for d in sharers), "sharers start on every CPU"
    lsr = runtime.run_pod("db", "Guaranteed", {"koordinator.sh/qosClass": "LSR"})
    lsr_c = runtime.create_container(lsr, "main", cpu_shares=1024, cpu_quota=100000, memory=256 << 20)
    pd = group(runtime, lsr, lsr_c)
    pinned = cpus(pd)
    assert len(pinned) == 1, f"LSR pinned to {pinned}"
    until(
        lambda: all(cpus(d) == online - pinned for d in sharers),
        20,
        lambda: f"sharers: {[cpus(d) for d in sharers]}",
    )
    settle(
        {
            (pd, "memory.max"): {str(256 << 20)},
            (pd, "memory.min"): {str(128 << 20)},  # 50 % of the request (Guaranteed: = the limit)
            (pd, "memory.low"): {str((256 << 20) * 80 // 100 // 4096 * 4096)},
            (pd, "memory.high"): {"max"},  # limit = request: nothing between them to throttle in
        }
    )
    second = runtime.run_pod("db2", "Guaranteed", {"koordinator.sh/qosClass": "LSR"})
    second_c = runtime.create_container(second, "main", cpu_shares=1024, cpu_quota=100000)
    assert cpus(group(runtime, second, second_c)) == online - pinned  # the share pool, not the pinned CPU
    assert plugin.metric('nriplugin_invalid_input_total{reason="cpuset_capacity"}') == 1
    assert "runs in the share pool" in plugin.logs()
    disk = runtime.run_pod("disk", "BestEffort", BE)
    dd = group(runtime, disk, runtime.create_container(disk, "main", cpu_shares=2))
    print(f"/dev/loop0: {dev}; BE io.weight {read(dd, 'io.weight')!r}, io.max {read(dd, 'io.max')!r}")
    assert dev is not None, "no /dev/loop0 in the guest (testkit/vm/build-kit.sh loads loop)"
    assert read(dd, "io.weight") == "default 2000"  # ioWeightPercent 20: blkio.weight 200, io.weight x10
    assert read(dd, "io.max") == f"{dev} rbps=1048576 wbps=max riops=max wiops=max"
    logs = plugin.logs()
    assert "rejected" not in logs and "could not update" not in logs, logs[-3000:]


def _doctor(runtime: harness.Containerd, plugin: PluginProcess) -> None:
    """``nriplugin doctor`` against the running agent: the node as the kernel shows it."""
    argv = [sys.executable, "-m", "nriplugin", "doctor", "--socket", runtime.nri_socket, "--format", "json"]
    r = subprocess.run(
        [*argv, "--agent", f"127.0.0.1:{plugin.port}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    print("doctor:", json.dumps({k: doc[k] for k in ("kernel", "cgroup", "cpu", "psi", "agent")}, default=str)[:3000])
    assert doc["kernel"] == platform.release()
    cg = doc["cgroup"]
    assert cg["version"] == 2 and cg["root"] == str(ROOT)
    assert {"cpu", "cpuset", "memory", "io", "pids"} <= set(cg["controllers"])
    assert all(cg["files"][f] for f in ("cpu.cfs_burst_us", "cpu.idle", "memory.min", "memory.high", "blkio.weight"))
    assert doc["psi"] is True and doc["cpu"]["online"] == "0-1"
    assert doc["nri"]["present"] and doc["nri"]["lock"]["held"]
    assert doc["nri"]["lock"]["holder"]["pid"] == plugin.proc.pid
    assert all(doc["features"][f]["works_here"] for f in ("cpuBurst", "memoryQOS", "cpuset", "blkio.weight"))
    agent = doc["agent"]
    assert agent["reachable"] and agent["connection"] == "registered", agent
    assert agent["policyVersion"] >= 4 and agent["reconcilerPasses"] >= 1, agent  # entries: as of the last pass


EVICT_POLICY = (  # MemoryEvict alone: the CPU strategies would act on the busy TCG guest too
    "qosManager: {cpuSuppress: {enabled: false}, cpuEvict: {enabled: false}, cpuBurst: {enabled: false}}\n"
)


def limit_pods_root(rt: harness.Containerd, limit: int) -> Path:
    """kubelet's node-allocatable cgroup on v2: ``memory.max`` on the pods root, before any pod."""
    top = ROOT / rt.cgroup_root
    root = top / "kubepods"
    root.mkdir(parents=True, exist_ok=True)
    for d in (ROOT / p for p in reversed(root.relative_to(ROOT).parents) if str(p) != "."):
        (d / "cgroup.subtree_control").write_text("+cpu +cpuset +memory +io +pids")
    (root / "memory.max").write_text(str(limit))
    return root


def memory_events(root: Path) -> dict[str, int]:
    return {k: int(v) for k, v in (ln.split() for ln in read(root, "memory.events").splitlines())}


def test_a_growing_be_pod_is_evicted_before_the_pods_root_runs_out_on_v2(
    runtime: harness.Containerd, tmp_path: Path
) -> None:
    """e2e/test_evict.py's scene on the real v2 kernel, with a 512 MiB pods root (the guest has
    2 GiB): the agent sees the use through ``memory.current``/``memory.stat`` and wakes on
    ``memory.events``; it stops the growing BE pod through CRI before the kernel throttles at
    the limit or OOM-kills anything there, while an LS pod and a quiet BE pod keep running."""
    runtime.remove_all_pods()
    root = limit_pods_root(runtime, 512 << 20)
    policy = tmp_path / "policy.yaml"
    policy.write_text(EVICT_POLICY)
    plugin = PluginProcess(runtime.nri_socket, *runtime_args(runtime), "--policy", str(policy))
    second: PluginProcess | None = None
    try:
        plugin.wait_ready(timeout=300)
        second = PluginProcess(runtime.nri_socket, *runtime_args(runtime), "--policy", str(policy))  # starts meanwhile
        _evict(runtime, plugin, root)
        _handover(runtime, plugin, second)
    finally:
        print(plugin.logs()[-3000:])
        plugin.stop()
        if second is not None:
            print(second.logs()[-2000:])
            second.stop()


def _handover(runtime: harness.Containerd, first: PluginProcess, second: PluginProcess) -> None:
    """One agent per runtime: the second agent, started during the eviction, stands by while
    the first holds the runtime, and takes over when the first is stopped (SIGTERM)."""
    until(lambda: second.metric('nriplugin_connection_state{state="standby"}') == 1, 300, second.logs)
    assert second.metric("nriplugin_registrations_total") == 0
    holder = read_holder(lock_path(runtime.nri_socket))
    assert holder is not None and holder.pid == first.proc.pid, holder
    first.proc.send_signal(signal.SIGTERM)
    assert first.proc.wait(60) == 0
    second.wait_ready(timeout=120)
    pod = runtime.run_pod("after", "BestEffort", BE, {"node.koordinator.sh/extended-resource-spec": BATCH})
    c = group(runtime, pod, runtime.create_container(pod, "main", cpu_shares=2))
    weights = {str(to(512)) for to, _ in WEIGHT_MAPPINGS.values()}
    settle({(c, "cpu.weight"): weights, (c, "cpu.max"): {"100000 100000"}})  # born by the new holder
    holder = read_holder(lock_path(runtime.nri_socket))
    assert holder is not None and holder.pid == second.proc.pid, holder


def _evict(runtime: harness.Containerd, plugin: PluginProcess, root: Path) -> None:
    ls = runtime.run_pod("web", "Burstable", LS)
    ls_c = runtime.create_container(ls, "main", cpu_shares=512)
    quiet = runtime.run_pod("quiet", "BestEffort", BE)
    quiet_c = runtime.create_container(quiet, "main")
    grower = runtime.run_pod("leaky", "BestEffort", BE)
    grower_c = runtime.create_container(grower, "main", command=GROW)
    peak = 0

    def gone() -> bool:
        nonlocal peak
        peak = max(peak, int(read(root, "memory.current")))
        return not running(runtime, grower_c)

    took = until(
        gone, 240, lambda: f"the growing pod was not evicted (use {int(read(root, 'memory.current')) >> 20} MiB)"
    )
    events = memory_events(root)
    print(f"evicted after {took:.1f} s; the pods root peaked at {peak >> 20} MiB of 512; memory.events {events}")
    assert events["oom_kill"] == 0 and events["oom"] == 0
    assert events["max"] == 0  # never even at the limit
    assert peak < 0.9 * (512 << 20)
    time.sleep(2)  # nothing else follows
    assert running(runtime, ls_c) and running(runtime, quiet_c)
    counted = 'nriplugin_qos_evictions_total{{dry_run="false",reason="{}",strategy="MemoryEvict"}}'

    def done() -> float:
        return sum(plugin.metric(counted.format(r)) for r in ("threshold", "oom_risk", "pressure"))

    until(lambda: done() >= 1, 60, "the eviction was not counted")  # once the victim is gone (grace 5 s)
    assert done() == 1
    assert plugin.metric_sum("nriplugin_qos_evictions_total") == 1
    assert "MemoryEvict" in plugin.logs() and "leaky" in plugin.logs()
