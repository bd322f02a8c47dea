"""The network lab for network QoS, on the private containerd 1.7 with Debian's bridge CNI.

Pods with their own network namespaces on a test-only 198.18.0.x subnet reach each other and a
remote host behind an emulated node uplink (``testkit.netlab``: 100 Mbit/s, deep FIFO). The uplink
carries its configured rate both ways, and a bulk flow from one pod builds a standing queue that
raises another pod's ping latency to the remote: the "without rules" baseline network QoS has
to fix. Teardown leaves no bridge, veth, namespace, IPAM or CNI cache state, and ip_forward as
it was.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit import containerd as harness
from testkit import netlab, subnets

LS = {"koordinator.sh/qosClass": "LS"}
BE = {"koordinator.sh/qosClass": "BE"}
RATE = 100.0


def links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines()}


def bridge_ports(bridge: str) -> set[str]:
    out = subprocess.run(
        ["ip", "-o", "link", "show", "master", bridge], capture_output=True, text=True, check=True
    ).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines()}


def netns_names() -> set[str]:
    return set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set()


def new_runtime(pkg_root: Path) -> harness.Containerd:
    rt = harness.Containerd(pkg_root, Path(tempfile.mkdtemp(prefix="nriplugin-e2e-")), cni=True)
    try:
        rt.start()
        rt.import_images()
    except BaseException:
        rt.teardown()
        raise
    return rt


@pytest.fixture(scope="module")
def lab(pkg_root: Path) -> Iterator[tuple[harness.Containerd, netlab.Uplink, harness.Pod, harness.Pod]]:
    """One CNI runtime, an LS and a BE pod with their own netns, and the uplink (shared: the
    runtime's start is the slow part)."""
    rt = new_runtime(pkg_root)
    try:
        with netlab.Uplink(rate_mbit=RATE) as up:
            ls = rt.run_pod("web", "Burstable", LS, host_network=False)
            be = rt.run_pod("batch", "BestEffort", BE, host_network=False)
            for p in (ls, be):
                rt.create_container(p, "main")
            yield rt, up, ls, be
    finally:
        rt.teardown()


def test_pods_have_their_own_addresses_and_reach_each_other_and_the_remote(
    lab: tuple[harness.Containerd, netlab.Uplink, harness.Pod, harness.Pod],
) -> None:
    rt, up, ls, be = lab
    assert rt.subnet is not None and rt.subnet.subnet_of(subnets.PODS)
    assert ls.ip and be.ip and ls.ip != be.ip
    assert {ipaddress.IPv4Address(ls.ip), ipaddress.IPv4Address(be.ip)} <= set(rt.subnet.hosts())
    assert ls.netns and be.netns and ls.netns != be.netns
    host = os.stat("/proc/self/ns/net").st_ino
    assert host not in {os.stat(ls.netns).st_ino, os.stat(be.netns).st_ino}
    # each pod has one host-side veth on the runtime's bridge
    assert len(bridge_ports(rt.net_name)) == 2
    assert netlab.ping(ls.netns, be.ip, count=3).received == 3
    assert netlab.ping(be.netns, up.remote_addr, count=3).received == 3


@pytest.mark.parametrize("reverse", [False, True], ids=["upload", "download"])
def test_the_uplink_carries_its_configured_rate(
    lab: tuple[harness.Containerd, netlab.Uplink, harness.Pod, harness.Pod], reverse: bool
) -> None:
    _, up, ls, _ = lab
    # The shaper caps every transfer. Goodput under the rate is TCP/IP headers (about 4 % of
    # what the token bucket counts) plus CPU noise on a shared 2-core machine: TCP's first
    # second (its ramp up) is left out, and the best of up to three transfers carries at least
    # 90 %; none may carry more than the rate.
    runs: list[netlab.Throughput] = []
    while len(runs) < 3 and not any(r.mbit >= RATE * 0.9 for r in runs):
        runs.append(netlab.iperf(up, ls.netns or "", seconds=4, reverse=reverse, omit=1))
    assert all(r.mbit <= RATE * 1.02 for r in runs), runs
    assert max(r.mbit for r in runs) >= RATE * 0.9, runs


@pytest.mark.parametrize("reverse", [False, True], ids=["upload", "download"])
def test_a_bulk_flow_raises_another_pods_latency_without_rules(
    lab: tuple[harness.Containerd, netlab.Uplink, harness.Pod, harness.Pod], reverse: bool
) -> None:
    _, up, ls, be = lab
    idle = netlab.ping(ls.netns or "", up.remote_addr, count=40)
    with netlab.bulk(up, be.netns or "", reverse=reverse):
        loaded = netlab.ping(ls.netns or "", up.remote_addr, count=40)
    assert loaded.received >= 36, loaded
    # a standing queue in the uplink's FIFO (up to 200 ms deep) in front of the LS pings
    assert loaded.p50_ms >= max(3 * idle.p50_ms, 10.0), (idle, loaded)


def test_teardown_leaves_nothing(pkg_root: Path) -> None:
    forward = Path("/proc/sys/net/ipv4/ip_forward").read_text()
    rt = new_runtime(pkg_root)
    up = netlab.Uplink()
    try:
        up.up()
        pod = rt.run_pod("web", host_network=False)
        assert netlab.ping(pod.netns or "", up.remote_addr, count=2).received == 2
        veths = bridge_ports(rt.net_name)
        assert len(veths) == 1
        assert Path("/proc/sys/net/ipv4/ip_forward").read_text().strip() == "1"
        ipam = rt.base / "cni" / "ipam"
        assert any(ipam.rglob("198.18.0.*"))
        made = {rt.net_name, up.router, *veths}
    finally:
        up.down()
        rt.teardown()
    assert not made & links()
    assert not {up.router, up.remote} & netns_names()
    assert pod.netns and not os.path.exists(pod.netns)
    assert not rt.base.exists()  # the IPAM state lived there
    assert not list(harness.CNI_CACHE.glob(f"{rt.net_name}-*"))
    assert not (subnets.STATE / f"{rt.net_name}.claim").exists()
    if not subnets.held():  # no other lab on this machine still needs forwarding
        assert Path("/proc/sys/net/ipv4/ip_forward").read_text() == forward


def test_claims_are_disjoint_and_a_dead_owners_claim_is_dropped() -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    names = [f"nrq{os.getpid()}t{i}" for i in range(3)]
    try:
        a = subnets.claim(names[0], subnets.UPLINKS, 29)
        b = subnets.claim(names[1], subnets.UPLINKS, 29)
        assert a.subnet_of(subnets.UPLINKS) and b.subnet_of(subnets.UPLINKS) and not a.overlaps(b)
        with pytest.raises(ValueError, match="already held"):
            subnets.claim(names[0], subnets.UPLINKS, 29)
        # a claim left by a process that died is not kept
        stale = subnets.STATE / f"{names[2]}.claim"
        stale.write_text(json.dumps({"pid": dead.pid, "net": str(a)}))
        subnets.release(names[0])
        c = subnets.claim(names[0], subnets.UPLINKS, 29)
        assert c == a and not stale.exists()
    finally:
        for n in names:
            subnets.release(n)
