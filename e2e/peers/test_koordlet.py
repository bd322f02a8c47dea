"""koordlet v1.8.0 on a host-process node (testkit/hostnode.py, testkit/koordlet.py): it
registers with the node's containerd over NRI, reports the node's NodeMetric through the API
server, and runs BE CPU suppression on the kubelet's BE group, which is what the benchmarks
that measure it beside nriplugin rely on."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit import hostnode, koordlet
from testkit.hostnode import HostNode, until

CGROUP_FS = Path("/sys/fs/cgroup")
# BECPUSuppress with the cfsQuota policy: the BE group's quota, unlimited as the kubelet
# leaves it, becomes koordlet's figure (the cpuset policy may keep every CPU on a quiet node).
SUPPRESS = {"enable": True, "cpuSuppressThresholdPercent": 65, "cpuSuppressPolicy": "cfsQuota"}


@pytest.fixture
def node() -> Iterator[HostNode]:
    if os.geteuid() != 0:
        pytest.fail("the koordlet lane needs root (containerd, kubelet, cgroups)")
    if missing := hostnode.missing_binaries():
        pytest.fail(f"not built: {', '.join(map(str, missing))} (bash kind/build.sh tools)")
    n = HostNode(nodeslo_spec={"resourceUsedThresholdWithBE": SUPPRESS})
    root = ""
    try:
        n.start()
        root = n.cgroup_root
        yield n
    finally:
        n.stop()
    # what it left: nothing
    assert not n.base.exists(), f"{n.base} left"
    assert root, "the node never came up"
    assert not [h for h in CGROUP_FS.iterdir() if (h / root).exists()], f"cgroup {root} left"
    assert not [p for p in hostnode.KUBELET_FIXED if p in n._made and p.exists()], "the kubelet's fixed paths left"


def test_koordlet_registers_reports_and_suppresses_be(node: HostNode) -> None:
    binary = koordlet.build()
    be = node.create_pods([node.pod_manifest("be-0", {"koordinator.sh/qosClass": "BE"})])
    node.wait_running(be, 120)
    quota = CGROUP_FS / "cpu" / node.pods_root / "besteffort" / "cpu.cfs_quota_us"
    assert quota.read_text().strip() == "-1", "the kubelet leaves BE's group unlimited"
    k = koordlet.Koordlet(binary, node)
    k.start()
    try:
        took = k.wait_registered(90)
        print(f"koordlet registered with NRI {took:.1f} s after its start")

        def reported() -> bool:
            status = node.nodemetric().get("status", {})
            pods = {(p["name"], p.get("qos")) for p in status.get("podsMetric", [])}
            return bool(status.get("updateTime")) and ("be-0", "BE") in pods

        until(reported, 90, "koordlet's NodeMetric report with the BE pod in it", 1.0)
        cut = until(lambda: int(quota.read_text()) > 0 and int(quota.read_text()), 60, "koordlet's BE quota", 0.5)
        period = int((quota.parent / "cpu.cfs_period_us").read_text())
        cpus = os.cpu_count() or 1
        assert cut <= cpus * period, f"BE quota {cut} above the node's {cpus} CPUs"
        assert k.proc is not None and k.proc.poll() is None, f"koordlet died:\n{k.tail()}"
    finally:
        pid = k.proc.pid if k.proc is not None else None
        k.stop()
    assert pid is not None and not Path(f"/proc/{pid}").exists(), "koordlet still runs"
