"""What newer runtimes carry besides BE's birth attributes, each on its runtime's path and on
today's where the runtime's NRI does not carry it (decided once at Configure):

- the policy's per-class pids limit: ``LinuxResources.pids`` at CreateContainer on NRI v0.8+;
  on an older runtime cgroup v2's ``unified`` map, or (cgroup v1) the agent's write at
  StartContainer; the default policy asks for none;
- UpdatePodSandbox (NRI v0.10+): a pod-level in-place resize moves the pod's resources in the
  model and PostUpdatePodSandbox re-converges the pod group over the kubelet's writes; no pod
  burst is ever set (the kernel would refuse the kubelet's lowering of the pod quota below it).

Over the real protocol (the in-process runtime peer) where the runtime's answer matters; the
real node model, desired state and reconciler on kernel-like trees."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import ValidationError

from nriplugin.cli.explain import describe_runtime
from nriplugin.kernel.cgroup import Cgroups
from nriplugin.node.assembly import Node
from nriplugin.node.hooks import QoSPlugin, runtime_paths
from nriplugin.nri import api_pb2 as api
from nriplugin.nri.runtime import RuntimeCaps
from nriplugin.policy.cache import RuleCache
from nriplugin.policy.model import Policy
from nriplugin.reconciler.reconciler import Reconciler
from testkit.kernel_tree import v1_tree, v2_tree
from testkit.runtime_peer import PluginSession, make_container, make_pod, over_the_wire
from tests.test_features import BATCH, SPEC, caps

PIDS = Policy.model_validate({"containerPidsLimit": {"beClass": 512, "lsClass": 4096}})


def plugin(root: Path, policy: Policy | None = None) -> QoSPlugin:
    return QoSPlugin(Node.create(RuleCache(policy or Policy()), caps=caps(**{"pids.max": True}), cgroups=Cgroups(root)))


def births(tmp: Path, root: Path, nri: str, runtime: tuple[str, str], policy: Policy) -> list[api.ContainerAdjustment]:
    """The adjustments a BE and an LS container get from a runtime of NRI ``nri``."""
    pods = [make_pod(1, "BE"), make_pod(2, "LS")]

    async def body(s: PluginSession) -> list[api.ContainerAdjustment]:
        return [(await s.create_container(pod, make_container(i + 1, pod))).adjust for i, pod in enumerate(pods)]

    return asyncio.run(asyncio.wait_for(over_the_wire(tmp, plugin(root, policy), nri, runtime, body), 30))


def test_pids_limit_goes_through_nri_where_it_carries_it(tmp_path: Path) -> None:
    be, ls = births(tmp_path, v1_tree(tmp_path / "cg"), "v0.8.0", ("containerd", "v2.1.9"), PIDS)
    assert be.linux.resources.pids.limit == 512 and ls.linux.resources.pids.limit == 4096
    assert be.linux.resources.cpu.shares.value == 2  # with today's values


def test_the_default_policy_asks_for_no_pids_limit(tmp_path: Path) -> None:
    for adj in births(tmp_path, v1_tree(tmp_path / "cg"), "v0.12.5", ("containerd", "v2.4.2"), Policy()):
        assert not adj.linux.resources.HasField("pids")
        assert "pids.max" not in adj.linux.resources.unified


def test_v2_pids_limit_goes_in_unified_on_nri_v0_6(tmp_path: Path) -> None:
    be, ls = births(tmp_path, v2_tree(tmp_path / "cg", ["kubepods"]), "v0.6.1", ("containerd", "v1.7.24"), PIDS)
    assert not be.linux.resources.HasField("pids")  # v0.6 has no such field: never asked of it
    assert be.linux.resources.unified["pids.max"] == "512" and ls.linux.resources.unified["pids.max"] == "4096"


def test_v1_pids_limit_is_written_at_start_on_nri_v0_6(tmp_path: Path) -> None:
    """cgroup v1 on a runtime without the field: the agent writes the file when the task
    exists and has not run yet; the reconciler keeps it."""
    pod = make_pod(1, "BE")
    ctr = make_container(1, pod)
    group = ctr.linux.cgroups_path.lstrip("/")
    root = v1_tree(tmp_path / "cg", [pod.linux.cgroup_parent.lstrip("/"), group])
    p = plugin(root, PIDS)
    p.runtime_caps(RuntimeCaps(runtime="containerd", runtime_version="v1.7.24"))
    adj = p.create_container(pod, ctr)
    assert isinstance(adj, api.ContainerAdjustment) and not adj.linux.resources.HasField("pids")
    assert (root / "pids" / group / "pids.max").read_text().strip() == "max"
    p.start_container(pod, ctr)
    assert (root / "pids" / group / "pids.max").read_text().strip() == "512"
    # on a runtime that carries it, StartContainer leaves the file to the runtime
    (root / "pids" / group / "pids.max").write_text("max\n")
    p.runtime_caps(RuntimeCaps(nri=(0, 8, 0), source="inferred"))
    p.start_container(make_pod(1, "BE"), make_container(1, make_pod(1, "BE")))
    assert (root / "pids" / group / "pids.max").read_text().strip() == "max"


def test_pids_limit_policy_is_validated() -> None:
    with pytest.raises(ValidationError, match=r"containerPidsLimit\.beClass"):
        Policy.model_validate({"containerPidsLimit": {"beClass": 0}})
    with pytest.raises(ValidationError, match=r"containerPidsLimit\.systemClass"):
        Policy.model_validate({"containerPidsLimit": {"systemClass": 10}})  # never touched: no such field
    assert Policy().containerPidsLimit.of("LSE") is None and PIDS.containerPidsLimit.of("BE") == 512


def test_doctor_and_explain_say_which_path_is_in_force() -> None:
    new = describe_runtime(PIDS, "v0.12.5")["paths"]
    old = describe_runtime(PIDS, "v0.6.1")["paths"]
    assert new["pids limit"].startswith("in force through NRI (LinuxResources.pids")
    assert "written by the agent at StartContainer" in old["pids limit"]
    # neither knows whether the runtime sends UpdatePodSandbox: only the running agent learns it
    assert new["pod-level resize"].startswith("subscribed (UpdatePodSandbox, runtime NRI v0.12.5), followed once")
    assert "reconciler repairs the pod's files" in new["pod-level resize"]
    assert old["pod-level resize"].startswith("not told")
    assert new["updates outside hooks"].startswith("pushed with UpdateContainers")
    assert (
        old["updates outside hooks"].startswith("in Synchronize's answer")
        and "containerd#13733" in old["updates outside hooks"]
    )
    assert describe_runtime(Policy(), "v0.12.5")["paths"]["pids limit"].startswith("off")


# UpdatePodSandbox ------------------------------------------------------------------------------


def ls_pod(quota: int) -> api.PodSandbox:
    pod = make_pod(3, "LS")
    pod.linux.pod_resources.cpu.quota.value = quota
    pod.linux.pod_resources.cpu.period.value = 100000
    return pod


def test_a_pod_level_resize_moves_the_model_and_the_pod_group_is_reconverged(tmp_path: Path) -> None:
    """An LS pod with a 2-core quota gets no pod-level burst (the kubelet lowers the pod
    group's quota itself on a resize, and the kernel refuses a quota below the burst); resized
    in place to 1 core over UpdatePodSandbox, the model holds the new resources. A BE pod's
    batch shares on its group, overwritten by the kubelet during its resize, are written back
    after PostUpdatePodSandbox."""
    ls = ls_pod(200000)
    be = make_pod(4, "BE")
    be.annotations[SPEC] = BATCH
    groups = [ls.linux.cgroup_parent.lstrip("/"), be.linux.cgroup_parent.lstrip("/")]
    root = v1_tree(tmp_path / "cg", groups)
    p = plugin(root)
    rec = Reconciler(p.desired, p.writer, p.model, resync_period=3600, watch=False)
    shares = root / "cpu" / groups[1] / "cpu.shares"

    async def body(s: PluginSession) -> None:
        rec.start(asyncio.get_running_loop())
        try:
            assert s.subscribed(api.UPDATE_POD_SANDBOX) and s.subscribed(api.POST_UPDATE_POD_SANDBOX)
            await s.notify(api.RUN_POD_SANDBOX, ls)
            await s.notify(api.RUN_POD_SANDBOX, be)
            await until(lambda: shares.read_text().strip() == "512")
            resized = api.LinuxResources()
            resized.cpu.quota.value, resized.cpu.period.value = 100000, 100000
            assert p.pod_updates_since is None
            await s.update_pod_sandbox(ls, resized)  # the pod in the request: still the old resources
            assert p.pod_updates_since is not None  # learnt on the dedicated RPC too
            got = p.model.pod(ls.id)
            assert got is not None and got.linux.pod_resources.cpu.quota.value == 100000
            intent = p.desired.intent(f"pod:{ls.id}")
            assert intent is None or intent.get("cpu.cfs_burst_us") is None
            assert (root / "cpu" / groups[0] / "cpu.cfs_burst_us").read_text().strip() == "0"
            shares.write_text("2\n")  # the kubelet's write of a BestEffort pod group during its resize
            await s.update_pod_sandbox(be, api.LinuxResources())
            await s.notify(api.POST_UPDATE_POD_SANDBOX, be)
            await until(lambda: shares.read_text().strip() == "512")
        finally:
            rec.stop()

    asyncio.run(asyncio.wait_for(over_the_wire(tmp_path, p, "v0.12.5", ("containerd", "v2.4.2"), body), 30))


def test_pod_resize_is_claimed_followed_only_once_the_runtime_sent_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """containerd 2.2.10 vendors an NRI that knows UpdatePodSandbox (v0.11, inferred) but may
    answer the kubelet's CRI UpdatePodSandboxResources UNIMPLEMENTED, and then never sends the
    event: the version earns a subscription, not the claim. Pod and container events leave it
    "subscribed"; the first UpdatePodSandbox (StateChange on v0.11) turns it "followed", logged
    once; a new connection learns it again."""
    pod = ls_pod(200000)
    ctr = make_container(5, pod)
    p = plugin(v1_tree(tmp_path / "cg", [pod.linux.cgroup_parent.lstrip("/"), ctr.linux.cgroups_path.lstrip("/")]))

    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.getMessage().startswith("pod-level resize: ")]

    def claim() -> str:
        return runtime_paths(Policy(), p.runtime, None, pod_updates_since=p.pod_updates_since)["pod-level resize"]

    async def body(s: PluginSession) -> None:
        assert s.subscribed(api.UPDATE_POD_SANDBOX)
        assert said() == [f"pod-level resize: {claim()}"]  # at registration
        assert claim().startswith("subscribed (UpdatePodSandbox, runtime NRI v0.11.0), followed once")
        await s.notify(api.RUN_POD_SANDBOX, pod)
        await s.create_container(pod, ctr)
        await s.notify(api.START_CONTAINER, pod, ctr)
        await s.update_container(pod, ctr, ctr.linux.resources)
        assert p.pod_updates_since is None and claim().startswith("subscribed")
        await s.state_change(api.UPDATE_POD_SANDBOX, pod)
        assert p.pod_updates_since is not None
        first = p.pod_updates_since
        assert claim().startswith("followed (UpdatePodSandbox seen since ")
        assert claim().endswith(", runtime NRI v0.11.0): the pod's values are recomputed and applied")
        await s.state_change(api.UPDATE_POD_SANDBOX, pod)
        assert p.pod_updates_since == first
        assert said()[1:] == [f"pod-level resize: {claim()}"]  # the transition, once

    with caplog.at_level(logging.INFO, logger="nriplugin.node.hooks"):
        asyncio.run(asyncio.wait_for(over_the_wire(tmp_path, p, "v0.11.0", ("containerd", "v2.2.10"), body), 30))
    assert [r.levelno for r in caplog.records if r.getMessage().startswith("pod-level resize: followed")] == [
        logging.INFO
    ]
    p.runtime_caps(RuntimeCaps(nri=(0, 12, 5), source="runtime"))  # reconnected: perhaps another runtime
    assert p.pod_updates_since is None and claim().startswith("subscribed (UpdatePodSandbox, runtime NRI v0.12.5)")


def test_a_runtime_before_nri_v0_10_sends_no_pod_update(tmp_path: Path) -> None:
    async def body(s: PluginSession) -> tuple[bool, bool]:
        return s.subscribed(api.UPDATE_POD_SANDBOX), s.subscribed(api.POST_UPDATE_POD_SANDBOX)

    p = plugin(v1_tree(tmp_path / "cg"))
    got = asyncio.run(asyncio.wait_for(over_the_wire(tmp_path, p, "v0.8.0", ("containerd", "v2.1.9"), body), 30))
    assert got == (False, False)


def test_update_pod_sandbox_without_resources_keeps_what_the_model_has(tmp_path: Path) -> None:
    """StateChange carries no resources and a runtime may fill none in the pod: nothing is
    forgotten (the pod keeps its quota)."""
    pod = ls_pod(200000)
    p = plugin(v1_tree(tmp_path / "cg", [pod.linux.cgroup_parent.lstrip("/")]))
    p.run_pod_sandbox(pod)
    bare = make_pod(3, "LS")
    p.update_pod_sandbox(bare, api.LinuxResources())
    got = p.model.pod(pod.id)
    assert got is not None and got.linux.pod_resources.cpu.quota.value == 200000


async def until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.01)
