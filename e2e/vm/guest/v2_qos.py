"""Runs INSIDE the VM (e2e/vm/test_vm.py starts it there): the QoS manager with the embedded
default policy, but a quota at every level (``quotaFrom: LOW``: the default gives BE's idle
group none below HIGH, and how fast the quota is cut is this test's subject), on a real cgroup
v2 tree and real spinning processes. BE's QoS-level group starts with ``cpu.idle`` 1, as an
agent before this one left it; the agent gives it back, and the kubelet's weight write to the
group is taken again. BE spins on every CPU;
when LS starts spinning BE's limit is cut, once with the PSI triggers armed (the node's
``/proc/pressure/cpu`` and each LS pod's ``cpu.pressure``: the kernel wakes a round) and once
with the 50 ms fast path alone. Times under TCG are evidence of behaviour, not benchmarks: the
figures are printed, and only a generous bound is asserted."""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import time
from pathlib import Path

import pytest

from e2e.vm.guest.v2_kernel import ROOT, groups
from nriplugin.kernel.cgroup import Cgroups
from nriplugin.node.assembly import Node
from nriplugin.policy.cache import RuleCache
from nriplugin.policy.model import Policy
from nriplugin.qos.collect import Collector
from nriplugin.qos.manager import QoSManager
from nriplugin.reconciler import Reconciler
from testkit.runtime_peer import make_container, make_pod

if os.environ.get("NRIPLUGIN_IN_VM") != "1":  # never collected on the host (not test_*.py)
    pytest.skip("runs inside the VM only (e2e/vm/test_vm.py)", allow_module_level=True)
NCPU = os.cpu_count() or 1


def spin(group: Path, n: int) -> list[subprocess.Popen[bytes]]:
    """``n`` busy loops in ``group`` (each moves itself in before it spins)."""
    return [subprocess.Popen(["sh", "-c", f"echo $$ > {group}/cgroup.procs && while :; do :; done"]) for _ in range(n)]


def be_quota(be_group: Path) -> float:
    q, period = (be_group / "cpu.max").read_text().split()
    return float("inf") if q == "max" else int(q) / int(period)


def reaction(trigger: bool) -> tuple[float, float, float, list[str]]:
    """(seconds from LS's spike to BE's cut, BE's limit before, after, the armed triggers)."""
    with groups("kubepods/besteffort/pod1/c", "kubepods/burstable/pod2/c") as top:
        be = make_pod(1, "BE", parent=f"/{top.name}/kubepods/besteffort/pod1")
        ls = make_pod(2, "LS", parent=f"/{top.name}/kubepods/burstable/pod2")
        ctrs = [make_container(1, be), make_container(2, ls, shares=1024)]
        for c, pod in zip(ctrs, (be, ls), strict=True):
            c.linux.cgroups_path = f"{pod.linux.cgroup_parent}/c"
        (top / "kubepods/besteffort/cpu.idle").write_text("1")  # what an older agent left
        rules = RuleCache(Policy.model_validate({"qosManager": {"cpuSuppress": {"quotaFrom": "LOW"}}}))
        node = Node.create(rules, cgroups=Cgroups(ROOT))
        rec = Reconciler(node.desired, node.writer, node.model, resync_period=3600)
        for pod, c in ((be, ctrs[0]), (ls, ctrs[1])):
            node.model.container_started(pod, c)
        col = Collector(node.model, node.desired, Cgroups(ROOT))
        mgr = QoSManager(node.model, node.desired, rec, col, rules, psi_path="/proc/pressure/cpu" if trigger else None)
        if not trigger:
            mgr.watch_ls_pressure = lambda: None  # type: ignore[method-assign]  # the fast path alone
        procs = spin(top / "kubepods/besteffort/pod1/c", NCPU)
        try:
            return asyncio.run(_measure(mgr, rec, top))
        finally:
            for p in procs:
                p.kill()
                p.wait()
            col.close()


async def _measure(mgr: QoSManager, rec: Reconciler, top: Path) -> tuple[float, float, float, list[str]]:
    loop = asyncio.get_running_loop()
    rec.start(loop)
    mgr.start(loop)
    be_group = top / "kubepods/besteffort"
    ls_procs: list[subprocess.Popen[bytes]] = []
    try:
        t0 = time.monotonic()
        await asyncio.sleep(5.0)  # a few rounds: BE gets the idle node
        while (before := be_quota(be_group)) < 0.5:
            assert time.monotonic() - t0 < 90, f"BE never got the idle node: {before:.2f} cores; {_last(mgr)}"
            await asyncio.sleep(0.5)
        # the kubelet's group is its own again: cpu.idle 0 (given back), and its weight write
        # (the kubelet's besteffort weight, 1) is taken, while BE is limited
        assert (be_group / "cpu.idle").read_text().strip() == "0"
        (be_group / "cpu.weight").write_text("1")
        assert (be_group / "cpu.weight").read_text().strip() == "1"
        assert (top / "kubepods/burstable/cpu.idle").read_text().strip() == "0"
        armed = sorted(
            [*([mgr.psi_path or ""] if mgr._trigger else []), *(mgr.ls_pressure.fds if mgr.ls_pressure else [])]
        )
        t0 = time.monotonic()
        ls_procs = spin(top / "kubepods/burstable/pod2/c", NCPU)
        while be_quota(be_group) > before * 0.5:
            assert time.monotonic() - t0 < 30, f"BE not cut within 30 s from {before:.2f} cores; {_last(mgr)}"
            await asyncio.sleep(0.005)
        return time.monotonic() - t0, before, be_quota(be_group), armed
    finally:
        for p in ls_procs:
            p.kill()
            p.wait()
        mgr.stop()
        rec.stop()


def _last(mgr: QoSManager) -> str:
    return "the manager's last decisions: " + "; ".join(str(d) for d in list(mgr.decisions)[-5:])


def test_be_is_cut_when_ls_spins_with_psi_triggers_and_with_the_fast_path_alone() -> None:
    """Three runs of each, alternating (the guest's noise hits both alike); medians compared."""
    took: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(3):
        for trigger in (True, False):
            t, before, after, armed = reaction(trigger)
            assert bool(armed) == trigger, f"PSI triggers armed: {armed}"
            assert after < before
            took[trigger].append(t)
            how = f"PSI triggers {armed}" if trigger else "fast path alone"
            print(f"{how}: BE cut {before:.2f} -> {after:.2f} cores in {t:.2f} s")
    psi, fast = statistics.median(took[True]), statistics.median(took[False])
    print(f"median reaction: PSI triggers {psi:.2f} s, fast path alone {fast:.2f} s, ratio {psi / fast:.2f}")
