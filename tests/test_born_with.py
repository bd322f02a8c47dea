"""What BE containers are born with through the runtime's NRI (SCHED_IDLE, IO priority idle,
oom_score_adj): asked of a runtime whose NRI carries it, never of one that does not; LS never;
each turned off by the policy. Through the in-process runtime peer, over the real protocol."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pydantic import ValidationError

from nriplugin.cli.explain import describe_runtime
from nriplugin.features import born_with
from nriplugin.kernel.cgroup import Cgroups
from nriplugin.node.assembly import Node
from nriplugin.node.hooks import QoSPlugin
from nriplugin.nri import api_pb2 as api
from nriplugin.nri.runtime import RuntimeCaps
from nriplugin.policy.cache import RuleCache
from nriplugin.policy.model import Policy
from testkit.kernel_tree import v1_tree
from testkit.runtime_peer import PluginSession, make_container, make_pod, over_the_wire
from tests.test_features import caps


async def adjustments(
    tmp: Path, nri: str, policy: Policy | None = None, runtime: tuple[str, str] = ("runtime-peer", "v0.0.1")
) -> tuple[api.ContainerAdjustment, api.ContainerAdjustment]:
    """The adjustments a runtime of NRI ``nri`` (saying ``runtime`` in Configure) receives for
    a new BE and a new LS container."""
    root = v1_tree(tmp / "cg", [], {"cpu": {}})
    plugin = QoSPlugin(Node.create(RuleCache(policy or Policy()), caps=caps(), cgroups=Cgroups(root)))

    async def body(s: PluginSession) -> tuple[api.ContainerAdjustment, api.ContainerAdjustment]:
        be, ls = make_pod(1, "BE"), make_pod(2, "LS")
        be_adj = (await s.create_container(be, make_container(1, be))).adjust
        ls_adj = (await s.create_container(ls, make_container(2, ls))).adjust
        return be_adj, ls_adj

    got: tuple[api.ContainerAdjustment, api.ContainerAdjustment] = await over_the_wire(tmp, plugin, nri, runtime, body)
    return got


def run(
    tmp: Path, nri: str, policy: Policy | None = None, runtime: tuple[str, str] = ("runtime-peer", "v0.0.1")
) -> tuple[api.ContainerAdjustment, api.ContainerAdjustment]:
    return asyncio.run(asyncio.wait_for(adjustments(tmp, nri, policy, runtime), 30))


def test_be_is_born_idle_on_nri_v0_12(tmp_path: Path) -> None:
    be, ls = run(tmp_path, "v0.12.5")
    assert be.linux.scheduler.policy == api.SCHED_IDLE
    assert getattr(be.linux.io_priority, "class") == api.IOPRIO_CLASS_IDLE
    assert be.linux.HasField("oom_score_adj") and be.linux.oom_score_adj.value == 1000
    assert be.linux.resources.cpu.shares.value == 2  # today's values go with them
    for field in ("scheduler", "io_priority", "oom_score_adj"):
        assert not ls.linux.HasField(field), field  # LS untouched


def test_nothing_is_asked_of_nri_v0_6(tmp_path: Path) -> None:
    be, ls = run(tmp_path, "v0.6.1", runtime=("containerd", "v1.7.24"))
    for adj in (be, ls):
        for field in ("scheduler", "io_priority", "oom_score_adj"):
            assert not adj.linux.HasField(field), field
    assert be.linux.resources.cpu.shares.value == 2  # today's path


def test_nri_v0_10_gets_what_it_carries(tmp_path: Path) -> None:
    """containerd 2.2.0 does not say its NRI (v0.12 runtimes do): inferred from its version."""
    be, _ = run(tmp_path, "v0.10.0", runtime=("containerd", "v2.2.0"))
    assert not be.linux.HasField("scheduler")  # v0.11
    assert getattr(be.linux.io_priority, "class") == api.IOPRIO_CLASS_IDLE
    assert be.linux.oom_score_adj.value == 1000


def test_each_is_turned_off_by_the_policy(tmp_path: Path) -> None:
    policy = Policy.model_validate({"beProcess": {"schedIdle": False, "oomScoreAdj": 900}})
    be, _ = run(tmp_path, "v0.12.5", policy)
    assert not be.linux.HasField("scheduler")
    assert getattr(be.linux.io_priority, "class") == api.IOPRIO_CLASS_IDLE
    assert be.linux.oom_score_adj.value == 900
    off = Policy.model_validate({"beProcess": {"schedIdle": False, "ioPriorityIdle": False, "oomScoreAdj": None}})
    be, _ = run(tmp_path / "off", "v0.12.5", off)
    for field in ("scheduler", "io_priority", "oom_score_adj"):
        assert not be.linux.HasField(field), field


def test_policy_rejects_a_shielding_oom_score_adj() -> None:
    with pytest.raises(ValidationError, match="oomScoreAdj"):
        Policy.model_validate({"beProcess": {"oomScoreAdj": -500}})


def test_what_is_in_force_is_said() -> None:
    old = born_with.plan(Policy(), RuntimeCaps())
    assert old.lines()["SCHED_IDLE for BE"] == (
        "not available (runtime NRI v0.6.1 < v0.11); set by the agent at StartContainer"
    )
    new = born_with.plan(Policy(), RuntimeCaps(runtime="containerd", nri=(0, 12, 5), source="runtime"))
    assert new.lines()["IO priority idle for BE"].startswith("in force (NRI IO priority, runtime NRI v0.12.5")
    off = born_with.plan(Policy.model_validate({"beProcess": {"oomScoreAdj": None}}), RuntimeCaps(nri=(0, 12, 0)))
    assert off.lines()["oom_score_adj for BE"] == "off (policy beProcess.oomScoreAdj)"
    doc = describe_runtime(Policy(), "v0.11.0")
    assert doc["nri"].startswith("NRI v0.11.0")
    assert doc["bornWith"]["SCHED_IDLE for BE"].startswith("in force")
    assert describe_runtime(Policy(), None)["bornWith"]["SCHED_IDLE for BE"].startswith("not available")


def test_the_plan_is_made_once_per_policy_and_runtime() -> None:
    """The hook merges one template: the plan is not rebuilt per container (the hook must not
    grow with anything), only when the policy or the runtime changes."""
    policy, runtime = Policy(), RuntimeCaps(nri=(0, 12, 5), source="runtime")
    plans = born_with.BirthPlans()
    first = plans(policy, runtime)
    assert plans(policy, runtime) is first
    assert plans(Policy(), runtime) is not first
    assert born_with.BirthPlans()(policy, runtime) is not first  # each keeper its own
