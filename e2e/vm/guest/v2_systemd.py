"""Runs INSIDE the VM (e2e/vm/test_vm.py starts it there, in a guest booted with systemd as
PID 1): the systemd cgroup driver on the real v2 kernel. containerd with ``SystemdCgroup =
true`` and runc's systemd driver, pods with kubelet's slice names as their CRI cgroup parent:
systemd makes ``kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid_>.slice/
cri-containerd-<id>.scope`` (burstable likewise). The agent finds the containers there from
the runtime's ``slice:prefix:name`` paths, writes their birth values, repairs drift, and the
QoS manager cuts BE at ``kubepods-besteffort.slice`` when LS spins; systemd re-applying its
units' settings (a daemon-reload, new pods in the slice) does not undo the cut for long."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.vm.guest.v2_containerd import BATCH, BE, LS, first_pid, read, settle
from e2e.vm.guest.v2_kernel import ROOT
from nriplugin.kernel.cgroup import WEIGHT_MAPPINGS
from testkit import containerd as harness
from testkit.plugin import PluginProcess, runtime_args, until

if os.environ.get("NRIPLUGIN_IN_VM") != "1":  # never collected on the host (not test_*.py)
    pytest.skip("runs inside the VM only (e2e/vm/test_vm.py)", allow_module_level=True)
PODS = ROOT / "kubepods.slice"
BE_SLICE = PODS / "kubepods-besteffort.slice"
POLICY = (  # the CPU suppression alone among the QoS strategies, on its level-based budget
    # (total - LS requests) x ratio: the TCG guest's own CPU use would otherwise decide it
    "cpuBurstStrategy: {policy: cpuBurstOnly}\n"
    "resourceUsedThresholdWithBE: {enable: false}\n"
    "qosManager: {cpuEvict: {enabled: false}, memoryEvict: {enabled: false}, cpuBurst: {enabled: false},"
    " cpuSuppress: {quotaFrom: LOW}}\n"  # a quota at every level: BE's cut is this test's subject
)
SPIN = ["sh", "-c", "while :; do :; done & while :; do :; done"]  # both CPUs


def systemctl(*args: str) -> str:
    r = subprocess.run(["systemctl", *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"systemctl {' '.join(args)}: {r.stderr}"
    return r.stdout


@pytest.fixture(scope="module")
def runtime() -> Iterator[harness.Containerd]:
    comm = Path("/proc/1/comm").read_text().strip()
    assert comm == "systemd", f"PID 1 is {comm!r}: the VM lane boots this guest with systemd (vm.Guest(systemd=True))"
    rt = harness.Containerd(harness.install(), Path(tempfile.mkdtemp(prefix="nriplugin-vm-sd-")), systemd=True)
    try:
        rt.start(timeout=120)
        rt.import_images()
        yield rt
    finally:
        rt.teardown()
        subprocess.run(["systemctl", "stop", "kubepods.slice"], check=False, timeout=120)
        for d in sorted((ROOT / rt.cgroup_root).glob("**/"), key=lambda p: -len(p.parts)):
            d.rmdir()


def scope(pod: harness.Pod, cid: str) -> Path:
    """Where systemd puts a container: kubelet's layout, spelled out (not computed by the agent)."""
    parent: str = pod.config.linux.cgroup_parent
    words = parent.removesuffix(".slice").split("-")
    slices = ["-".join(words[: i + 1]) + ".slice" for i in range(len(words))]
    return ROOT.joinpath(*slices, f"cri-containerd-{cid}.scope")


def quota(d: Path) -> float:
    q, period = read(d, "cpu.max").split()
    return float("inf") if q == "max" else int(q) / int(period)


def be_quota() -> float:
    return quota(BE_SLICE)


def test_the_systemd_drivers_slices_birth_repair_and_be_cut(runtime: harness.Containerd, tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    plugin = PluginProcess(runtime.nri_socket, *runtime_args(runtime), "--policy", str(policy))
    try:
        plugin.wait_ready(timeout=300)
        be = runtime.run_pod("batch", "BestEffort", BE, {"node.koordinator.sh/extended-resource-spec": BATCH})
        d = scope(be, runtime.create_container(be, "main", cpu_shares=2))
        ls = runtime.run_pod("web", "Burstable", LS)
        ld = scope(ls, runtime.create_container(ls, "main", cpu_shares=512, cpu_quota=40000))
        assert d.parent.parent == BE_SLICE and ld.parent.parent == PODS / "kubepods-burstable.slice"
        assert first_pid(d) and first_pid(ld)  # the containers' processes are in those scopes
        for c in (d, ld):  # systemd's own units for them
            assert systemctl("show", "-p", "ControlGroup", "--value", c.name).strip() == f"/{c.relative_to(ROOT)}"
        weights = {str(to(512)) for to, _ in WEIGHT_MAPPINGS.values()}
        settle(
            {
                (d, "cpu.weight"): weights,
                (d, "memory.max"): {str(512 << 20)},
                (d.parent, "cpu.weight"): weights,  # the pod's slice
                (ld, "cpu.max"): {"40000 100000"},
                (ld, "cpu.max.burst"): {"40000"},
            }
        )
        assert quota(d) <= 1, read(d, "cpu.max")  # its batch-cpu limit, or BE's lower ceiling
        before = plugin.metric_sum("nriplugin_repaired_total")
        (d / "cpu.max").write_text("max 100000")  # the agent's value: repaired
        (ld / "cpu.max.burst").write_text("0")  # the agent's (cpuBurstOnly): repaired
        took = until(
            lambda: quota(d) <= 1 and read(ld, "cpu.max.burst") == "40000",
            30,
            lambda: f"BE cpu.max {read(d, 'cpu.max')!r}, LS cpu.max.burst {read(ld, 'cpu.max.burst')!r}",
        )
        until(lambda: plugin.metric_sum("nriplugin_repaired_total") > before, 10, "the repairs were not counted")
        print(f"systemd layout: {d.relative_to(ROOT)}; drift on two scopes' files repaired in {took:.2f} s")
        _be_cut(runtime, plugin)
        logs = plugin.logs()
        assert "rejected" not in logs and "could not update" not in logs, logs[-3000:]
    finally:
        print(plugin.logs()[-3000:])
        plugin.stop()


def _be_cut(runtime: harness.Containerd, plugin: PluginProcess) -> None:
    """The QoS manager writes BE's limit at ``kubepods-besteffort.slice``; systemd re-applying
    its units (a daemon-reload, a new pod slice under it) does not lift it for long; an LS pod
    asking for 1.5 of the 2 CPUs that spins on both cuts BE to its floor (0.1 CPU)."""

    def in_place() -> bool:
        return abs(be_quota() - plugin.metric("nriplugin_qos_be_cpu_limit_cores")) < 0.011

    def state() -> str:
        decided = plugin.metric("nriplugin_qos_be_cpu_limit_cores")
        return f"BE slice cpu.max {read(BE_SLICE, 'cpu.max')!r}, decided {decided} cores"

    until(lambda: be_quota() < 2 and in_place(), 60, state)
    quiet = be_quota()
    systemctl("daemon-reload")
    other = runtime.run_pod("more", "BestEffort", BE)  # systemd realizes the BE slice again
    runtime.create_container(other, "main", cpu_shares=2)
    seen = {read(BE_SLICE, "cpu.max")}
    t0 = time.monotonic()
    while time.monotonic() - t0 < 3:
        seen.add(read(BE_SLICE, "cpu.max"))
        time.sleep(0.02)
    until(lambda: be_quota() < 2 and in_place(), 30, state)
    print(f"BE slice limit {quiet:.2f} CPUs; after a daemon-reload and a new BE pod it read {sorted(seen)}")
    big = runtime.run_pod("db", "Burstable", LS)
    runtime.create_container(big, "spin", cpu_shares=1536, command=SPIN)  # spins until teardown
    took = until(lambda: read(BE_SLICE, "cpu.max") == "10000 100000", 60, state)
    print(f"BE slice cut from {quiet:.2f} to 0.10 CPUs {took:.1f} s after an LS pod of 1.5 CPUs began to spin")
