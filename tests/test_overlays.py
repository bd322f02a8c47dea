"""Overlays over the desired state, and the one writer's ordering rules, on trees laid out like
the kernel's (cgroup v2 here; the real v1 tree is in test_reconciler.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from nriplugin.intent.core import Setting, cap_burst
from nriplugin.kernel.cgroup import Cgroups
from nriplugin.node.assembly import Node
from nriplugin.node.overlays import Overlays, group_key
from nriplugin.pacing.turns import Pacer
from nriplugin.reconciler import Reconciler
from testkit.kernel_tree import v2_tree
from testkit.runtime_peer import make_container, make_pod
from tests.test_features import caps


def test_overlays_refuse_what_they_cannot_apply() -> None:
    o = Overlays()
    with pytest.raises(ValueError, match=r"unknown resource 'cpu\.nonsense'"):
        o.set("k", "qos:x", {"cpu.nonsense": 1}, "r")
    with pytest.raises(ValueError, match=r"cpu\.cfs_quota_us=5 is outside"):
        o.set("k", "qos:x", {"cpu.cfs_quota_us": 5}, "r")
    with pytest.raises(ValueError, match="an owner"):
        o.set("k", "", {"cpu.shares": 2}, "r")
    assert o.targets() == []  # nothing half-set
    assert o.set("k", "qos:x", {"cpu.shares": 2}, "r") and not o.set("k", "qos:x", {"cpu.shares": 2}, "r")
    assert o.targets("qos:x") == ["k"] and o.targets("qos:y") == []
    assert o.withdraw("k", "qos:x") and not o.withdraw("k", "qos:x") and o.targets() == []


def test_burst_is_capped_at_an_overlaid_quota() -> None:
    files = {
        ("cpu.cfs_quota_us", ""): Setting("cpu.cfs_quota_us", 30000, "suppressed", owner="qos:cpuSuppress"),
        ("cpu.cfs_burst_us", ""): Setting("cpu.cfs_burst_us", 100000, "100% of quota"),
    }
    cap_burst(files)
    assert files[("cpu.cfs_burst_us", "")].value == 30000 and "capped" in files[("cpu.cfs_burst_us", "")].why
    files[("cpu.cfs_quota_us", "")] = Setting("cpu.cfs_quota_us", -1, "unlimited")
    files[("cpu.cfs_burst_us", "")] = Setting("cpu.cfs_burst_us", 100000, "x")
    cap_burst(files)
    assert files[("cpu.cfs_burst_us", "")].value == 100000  # no limit: nothing to cap at


def test_overlay_in_the_hook_answer_and_on_a_v2_qos_group(tmp_path: Path) -> None:
    """cgroup v2 (a tree laid out like the kernel's): an overlay on a container rides in the
    CreateContainer adjustment's unified map; an overlay on the BE parent is written to its
    cpu.max and repaired; withdrawing it restores what was there."""
    from nriplugin.node.hooks import QoSPlugin

    be_parent = "kubepods.slice/kubepods-besteffort.slice"
    root = v2_tree(tmp_path, [be_parent])
    (root / be_parent / "cpu.max").write_text("max 100000\n")
    c = caps()
    node = Node.create(cgroups=Cgroups(root), caps=c)
    plugin = QoSPlugin(node)

    async def main() -> None:
        r = Reconciler(
            node.desired,
            node.writer,
            node.model,
            watch=False,
            resync_period=3600,
            pacer=Pacer(asyncio.get_running_loop()),
        )
        r.start(asyncio.get_running_loop())
        try:
            pod = make_pod(1, "LS")
            ctr = make_container(1, pod)
            ctr.linux.resources.cpu.quota.value = 100000
            node.desired.set_overlay(ctr.id, "qos:cpuBurst", {"cpu.cfs_quota_us": 150000}, "node idle: burst 1.5x")
            adj = plugin.create_container(pod, ctr)
            assert adj is not None and not isinstance(adj, tuple)
            assert adj.linux.resources.cpu.quota.value == 150000  # the overlay, in the answer
            assert adj.linux.resources.unified["cpu.max.burst"] == "100000"  # the feature's burst, below it
            key = r.own_group(be_parent)
            assert key == group_key(be_parent)
            node.desired.set_overlay(key, "qos:cpuSuppress", {"cpu.cfs_quota_us": 200000}, "BE limit 2 CPU")
            await asyncio.sleep(0.01)
            assert (root / be_parent / "cpu.max").read_text() == "200000 100000"
            (root / be_parent / "cpu.max").write_text("max 100000")  # someone lifts it
            assert r.full_pass() == 1
            assert (root / be_parent / "cpu.max").read_text() == "200000 100000"
            node.desired.withdraw_overlay(key, "qos:cpuSuppress")
            await asyncio.sleep(0.01)
            assert (root / be_parent / "cpu.max").read_text() == "max 100000"  # as before the overlay
        finally:
            r.stop()

    asyncio.run(main())
