"""Runs INSIDE the VM (e2e/vm/test_vm.py starts it there): the product end to end on a real
cgroup v2 kernel: the private containerd of the e2e tests (testkit/containerd.py, cgroupfs
driver) with runc and NRI, nriplugin as its own process (`nriplugin run`), pods through CRI in
kubelet's layout. Birth values land in the v2 files; a coreSched policy reloaded at run time
puts BE in SCHED_IDLE, and the idle group's refused weight is neither repaired nor an error."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.vm.guest.v2_kernel import ROOT
from nriplugin.kernel.cgroup import WEIGHT_MAPPINGS
from testkit import containerd as harness
from testkit.plugin import PluginProcess, runtime_args

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
        _scenario(runtime, plugin, policy)
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


def _scenario(runtime: harness.Containerd, plugin: PluginProcess, policy: Path) -> None:
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
    assert "rejected" not in logs and "UpdateContainers" not in logs and "could not update" not in logs, logs[-3000:]
