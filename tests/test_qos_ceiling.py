"""BE's group quota and its children on the real cgroup v1 tree: cgroup v1 refuses a parent's CFS
quota below a child's and a child's above its parent's. Every change of BE's limit, both ways,
and a restart under a cut, must go through without the kernel refusing a write the agent meant
(``Invalid argument``): the one writer orders a batch (children first when lowering, parents
first when raising), and the ceiling in force is never above what BE's group holds."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from nriplugin.kernel.cgroup import Cgroups
from nriplugin.node.assembly import Node
from nriplugin.node.hooks import QoSPlugin
from nriplugin.nri import api_pb2 as api
from nriplugin.pacing.turns import Pacer
from nriplugin.policy.qos import QoSClass
from nriplugin.qos.cpu_suppress import SUPPRESS, be_groups
from nriplugin.reconciler import Reconciler
from testkit.runtime_peer import make_container, make_pod
from tests.test_reconciler import BATCH, ROOT, occupied, until

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not (ROOT / "cpu" / "cpu.shares").exists(), reason="needs root + cgroup v1"
)
CPU = ROOT / "cpu"


@pytest.fixture
def be_group() -> Iterator[str]:
    """kubelet's besteffort group under a pods root of our own, with a process in it."""
    rel = f"nriplugin-ceiling-{os.getpid()}/kubepods/besteffort"
    with occupied(rel):
        yield rel


def quota(group: str) -> str:
    return (CPU / group / "cpu.cfs_quota_us").read_text().strip()


def batch_pod(n: int, be_group: str) -> tuple[api.PodSandbox, api.Container, str]:
    """A BE pod with a 1-core batch limit and one container; its container's cgroup."""
    pod = make_pod(n, "BE", parent=f"/{be_group}/pod{n}")
    pod.annotations["node.koordinator.sh/extended-resource-spec"] = BATCH
    ctr = make_container(n, pod)
    return pod, ctr, ctr.linux.cgroups_path.lstrip("/")


def remove_up_to(rel: str, top: str) -> None:
    for c in ("cpu", "memory"):
        d = ROOT / c / rel
        while d != ROOT / c / top:
            if d.exists():
                d.rmdir()
            d = d.parent


def refused(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "rejected" in r.getMessage() or "Invalid" in r.getMessage()]


def test_be_groups_follow_either_driver() -> None:
    assert be_groups(["/top/kubepods", "kubepods.slice"]) == [
        "top/kubepods/besteffort",
        "kubepods.slice/kubepods-besteffort.slice",
    ]


def test_lowering_and_raising_be_in_one_batch_is_never_refused(be_group: str, caplog: pytest.LogCaptureFixture) -> None:
    """The suppressor's calls in either order within one callback (overlay first, the kernel's
    wrong order for a cut): the batch lowers the container, then the pod, then the group, and
    raises them the other way round. No write is refused, nothing waits out a backoff."""
    pod, ctr, rel = batch_pod(11, be_group)
    for c in ("cpu", "memory"):
        (ROOT / c / rel).mkdir(parents=True)
    caplog.set_level(logging.INFO)

    async def main() -> None:
        node = Node.create(cgroups=Cgroups(ROOT))
        plugin = QoSPlugin(node)
        r = Reconciler(
            node.desired, node.writer, node.model, resync_period=3600, pacer=Pacer(asyncio.get_running_loop())
        )
        r.start(asyncio.get_running_loop())
        try:
            plugin.run_pod_sandbox(pod)
            node.model.container_started(pod, ctr)
            group = r.own_group(be_group)
            await until(lambda: quota(rel) == "100000" and quota(f"{be_group}/pod11") == "100000")
            for cores in (0.3, 0.8, 0.1, 1.5):
                node.desired.bound(QoSClass.BE, be_group)
                node.desired.set_overlay(group, SUPPRESS, {"cpu.cfs_quota_us": int(cores * 100000)}, "test")
                node.desired.set_ceiling(QoSClass.BE, cores, SUPPRESS, "test")
                want = str(int(min(cores, 1.0) * 100000))
                await until(lambda w=want: quota(rel) == w and quota(f"{be_group}/pod11") == w)
                assert quota(be_group) == str(int(cores * 100000))
            assert r.rejections == 0
            assert not [f for f in r.files.values() if f.refused]
        finally:
            r.stop()

    try:
        asyncio.run(main())
    finally:
        remove_up_to(rel, be_group)
    assert refused(caplog) == []


def test_a_restarted_agent_caps_new_be_containers_at_the_cut_it_finds(
    be_group: str, caplog: pytest.LogCaptureFixture
) -> None:
    """BE's group holds 0.1 cores (a previous agent's cut). A new agent learns it before its
    first hook: a BE pod with a 1-core batch limit is answered without a quota at creation
    and gets 10000 at start, its pod group too, with nothing refused. When the QoS manager
    then raises BE to 0.8 cores, the group rises first and the children follow."""
    (CPU / be_group / "cpu.cfs_quota_us").write_text("10000")
    pod, ctr, rel = batch_pod(12, be_group)
    caplog.set_level(logging.INFO)

    async def main() -> None:
        node = Node.create(cgroups=Cgroups(ROOT))
        held = node.desired.learn_held(QoSClass.BE, be_groups([str(Path(be_group).parent)]))
        assert held == {be_group: pytest.approx(0.1)}
        plugin = QoSPlugin(node)
        r = Reconciler(
            node.desired, node.writer, node.model, resync_period=3600, pacer=Pacer(asyncio.get_running_loop())
        )
        r.start(asyncio.get_running_loop())
        try:
            for c in ("cpu", "memory"):  # runc makes the pod's group, then RunPodSandbox
                (ROOT / c / rel).parent.mkdir(parents=True)
            plugin.run_pod_sandbox(pod)
            assert quota(f"{be_group}/pod12") == "10000"
            adj = plugin.create_container(pod, ctr)
            assert adj is not None and not isinstance(adj, tuple)
            assert not adj.linux.resources.cpu.HasField("quota")  # not above what the group holds
            for c in ("cpu", "memory"):
                (ROOT / c / rel).mkdir()
            plugin.start_container(pod, ctr)
            assert quota(rel) == "10000"
            # the manager's first decision: 0.8 cores, higher than the group holds
            group = r.own_group(be_group)
            node.desired.set_ceiling(QoSClass.BE, 0.8, SUPPRESS, "test")
            node.desired.bound(QoSClass.BE, be_group)
            node.desired.set_overlay(group, SUPPRESS, {"cpu.cfs_quota_us": 80000}, "test")
            late = make_container(13, pod)
            intent = node.desired.intent_before_known(pod, late)
            assert intent is not None and intent.get("cpu.cfs_quota_us") == 10000  # until the group holds more
            await until(lambda: quota(rel) == "80000" and quota(f"{be_group}/pod12") == "80000")
            assert quota(be_group) == "80000" and r.rejections == 0
        finally:
            r.stop()

    try:
        asyncio.run(main())
    finally:
        remove_up_to(rel, be_group)
        (CPU / be_group / "cpu.cfs_quota_us").write_text("-1")
    assert refused(caplog) == []
