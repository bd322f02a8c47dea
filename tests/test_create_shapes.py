"""CreateContainer answers containers of one shape from one computation (``node/hooks.py``,
``DesiredState.birth_key``): the shape is the class, the pod annotations and labels the
features declare, the container's name and resources, and the stamps of the node's state.

These tests hold the two things that make it safe: no feature reads a pod annotation or
label it did not declare, and an answer from the shape is the answer the container would get
computed on its own, before and after the node's state moves."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nriplugin.features import PIPELINE, POD_ANNOTATIONS, POD_LABELS, Context, desired_state
from nriplugin.features.batch import ANNOTATION as BATCH
from nriplugin.features.core_sched import GROUP_LABEL
from nriplugin.features.cpu_burst import ANNOTATION as BURST
from nriplugin.features.cpuset import RESOURCE_STATUS
from nriplugin.intent.cpus import CPUAllocator
from nriplugin.kernel.cgroup import Cgroups, Version
from nriplugin.kernel.probe import Capabilities, Resctrl, Topology
from nriplugin.node.assembly import Node
from nriplugin.node.hooks import QoSPlugin, _is_be
from nriplugin.nri import api_pb2 as api
from nriplugin.pacing.traffic import HookTraffic
from nriplugin.pacing.turns import Pacer
from nriplugin.policy.cache import RuleCache
from nriplugin.policy.model import Policy
from nriplugin.policy.qos import QOS_LABEL, QoSClass
from testkit.hook_work import realistic_pod
from testkit.kernel_tree import v1_tree, v2_tree

EVERY_FILE = {
    "cpu.shares": True,
    "cpu.cfs_quota_us": True,
    "cpu.cfs_burst_us": True,
    "cpu.idle": True,
    "cpu.bvt_warp_ns": True,
    "cpuset.cpus": True,
    "memory.limit_in_bytes": True,
}
# Every feature on, with the values that make each one read its inputs (coreSched reads the
# group label, batch and memory QoS the batch annotation, burst its own).
POLICY = {
    "resourceQOSStrategy": {"policies": {"cpuPolicy": "coreSched"}},
    "features": {"cpuBurst": {"enable": True}},
}


def caps(version: Version = Version.V1) -> Capabilities:
    return Capabilities(version, ["cpu", "cpuset", "memory"], dict(EVERY_FILE), Resctrl(), True, False, Topology())


class RecordingMap:
    """A pod's annotations or labels that note which keys were read."""

    def __init__(self, real: Any, kind: str, reads: set[tuple[str, str]]) -> None:
        self.real, self.kind, self.reads = real, kind, reads

    def get(self, key: str, default: Any = None) -> Any:
        self.reads.add((self.kind, key))
        return self.real.get(key, default)

    def __getitem__(self, key: str) -> Any:
        self.reads.add((self.kind, key))
        return self.real[key]

    def __contains__(self, key: object) -> bool:
        self.reads.add((self.kind, str(key)))
        return key in self.real

    def __iter__(self) -> Iterator[str]:
        self.reads.add((self.kind, "*"))  # a walk over every key: nothing declared covers it
        return iter(self.real)

    def items(self) -> Any:
        self.reads.add((self.kind, "*"))
        return self.real.items()


class RecordingPod:
    def __init__(self, real: api.PodSandbox, reads: set[tuple[str, str]]) -> None:
        self._real = real
        self.annotations = RecordingMap(real.annotations, "annotation", reads)
        self.labels = RecordingMap(real.labels, "label", reads)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def pod_of(qos: str, i: int = 1) -> tuple[api.PodSandbox, api.Container]:
    pod, ctr = realistic_pod(100 + i, qos)
    pod.annotations[BURST] = json.dumps({"policy": "auto"})
    pod.annotations[RESOURCE_STATUS] = json.dumps({"cpuset": "1"})
    pod.labels[GROUP_LABEL] = "group-a"
    return pod, ctr


@pytest.mark.parametrize("qos", ["BE", "LS", "LSR"])
def test_every_pod_annotation_and_label_a_feature_reads_is_declared(qos: str) -> None:
    reads: set[tuple[str, str]] = set()
    pod, ctr = pod_of(qos)
    ctx = Context(
        RecordingPod(pod, reads),  # type: ignore[arg-type]
        ctr,
        QoSClass(qos),
        Policy.model_validate(POLICY),
        caps(),
        CPUAllocator(Topology()),
    )
    desired_state(ctx)
    declared = {("annotation", a) for a in POD_ANNOTATIONS} | {("label", x) for x in POD_LABELS}
    assert reads, "the features read nothing of the pod: is the recording pod used?"
    assert reads <= declared, f"read but not declared by any feature: {sorted(reads - declared)}"


def test_the_declarations_name_what_the_features_read() -> None:
    assert {BATCH, BURST, RESOURCE_STATUS} <= set(POD_ANNOTATIONS)
    assert {QOS_LABEL, GROUP_LABEL} <= set(POD_LABELS)
    by = {f.name: f for f in PIPELINE}
    assert by["memoryQOS"].annotations == (BATCH,)  # it reads batch-memory itself


def plugin(tmp_path: Path, v2: bool = False, pacer: Pacer | None = None) -> QoSPlugin:
    groups = ["kubepods", "kubepods/besteffort", "kubepods/burstable"]
    root = (v2_tree if v2 else v1_tree)(tmp_path / "cg", groups)
    version = Version.V2 if v2 else Version.V1
    node = Node.create(RuleCache(Policy.model_validate(POLICY)), caps=caps(version), cgroups=Cgroups(root))
    return QoSPlugin(node, pacer=pacer)


class Waiting(HookTraffic):
    """Hook traffic with a request waiting on a trunk while ``waits[0]``."""

    def __init__(self, waits: list[bool]) -> None:
        super().__init__()
        self.waits = waits

    def waiting(self) -> bool:
        return self.waits[0]


def computed(p: QoSPlugin, pod: api.PodSandbox, ctr: api.Container) -> bytes:
    """The answer worked out for this container alone (no shape shared)."""
    intent = p.desired.intent_before_known(pod, ctr)
    adj = p._adjustment(intent, pod, _is_be(pod))
    return b"" if adj is None else adj.SerializeToString(deterministic=True)


def answered(p: QoSPlugin, pod: api.PodSandbox, ctr: api.Container) -> bytes:
    out = p.create_container(pod, ctr)
    assert not isinstance(out, tuple)
    return b"" if out is None else out.SerializeToString(deterministic=True)


def test_pods_of_one_workload_share_one_answer_equal_to_their_own(tmp_path: Path) -> None:
    p = plugin(tmp_path)
    for i in range(40):
        qos = ("BE", "LS")[i % 2]
        pod, ctr = realistic_pod(1000 + i, qos)  # names, uids, app labels differ
        if i % 4 == 3:
            ctr.linux.resources.memory.limit.value = (256 + i) << 20  # a shape of its own
        assert answered(p, pod, ctr) == computed(p, pod, ctr), f"pod {i} ({qos})"
    assert len(p._answers) == 2 + 10  # BE, LS, and the ten LS pods with their own memory limit


def test_a_class_ceiling_and_a_policy_make_new_answers(tmp_path: Path) -> None:
    """On cgroup v2, where BE's quota travels in the answer (on v1 it is written at start)."""
    p = plugin(tmp_path, v2=True)
    be = [realistic_pod(2000 + i, "BE") for i in range(4)]
    first = answered(p, *be[0])
    assert first == computed(p, *be[1])
    p.desired.set_ceiling(QoSClass.BE, 0.25, "cpuSuppress", "LS needs the CPU")
    capped = answered(p, *be[1])
    assert capped != first and capped == computed(p, *be[1]), "a BE container born after the cut keeps BE's old quota"
    assert api.ContainerAdjustment.FromString(capped).linux.resources.cpu.quota.value == 25000
    key = p.desired.birth_key(*be[2])
    p.desired.rules.set(Policy.model_validate({**POLICY, "features": {"cpuBurst": {"enable": False}}}), "test")
    assert p.desired.birth_key(*be[2]) != key
    assert answered(p, *be[2]) == computed(p, *be[2])
    p.desired.withdraw_ceiling(QoSClass.BE)
    assert answered(p, *be[3]) == computed(p, *be[3]) != capped


def test_a_container_with_an_overlay_of_its_own_is_worked_out_alone(tmp_path: Path) -> None:
    p = plugin(tmp_path)
    pod, ctr = realistic_pod(4000, "LS")
    p.desired.overlays.set(ctr.id, "test", {"cpu.shares": 77}, "an overlay set before birth")
    assert p.desired.birth_key(pod, ctr) is None


def test_a_create_leaves_the_containers_queued_before_it_to_the_take_in_after_its_answer(tmp_path: Path) -> None:
    """The loop runs a request it found before the take-in queued by the previous answer: the
    request must not do that take-in in its own answer (the runtime would wait for it)."""
    (pod1, c1), (pod2, c2) = realistic_pod(3001, "BE"), realistic_pod(3002, "LS")

    async def burst() -> tuple[list[bool], QoSPlugin]:
        p = plugin(tmp_path, pacer=Pacer(asyncio.get_running_loop()))
        p.create_container(pod1, c1)  # queues its take-in right after this callback
        p.create_container(pod2, c2)  # a request run before that take-in
        seen = [c1.id in p.model, c2.id in p.model]
        await asyncio.sleep(0)  # the queued take-in
        return [*seen, c1.id in p.model, c2.id in p.model], p

    seen, p = asyncio.run(burst())
    assert seen == [False, False, True, True]
    keys = [k for k, _ in p.model.containers()]
    assert keys.index(c1.id) < keys.index(c2.id), "taken in out of order"


def test_the_take_in_gives_the_loop_to_a_waiting_request_after_each_container(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A burst's take-in runs in turns that end as soon as a hook request waits on the trunk:
    the request waits for one container's take-in, not the burst's; the rest follow in order."""
    import nriplugin.pacing.turns as loop_turns

    burst = [realistic_pod(3100 + i, "BE" if i % 2 else "LS") for i in range(4)]
    monkeypatch.setattr(loop_turns, "LOOK", 0.0)
    waiting = [True]

    async def main() -> tuple[list[int], QoSPlugin]:
        p = plugin(tmp_path, pacer=Pacer(asyncio.get_running_loop(), Waiting(waiting)))
        for pod, ctr in burst:
            p.create_container(pod, ctr)
        taken = []
        for _ in range(3):
            await asyncio.sleep(0)  # the take-in's turn, and the request that waits
            await asyncio.sleep(0)
            taken.append(sum(c.id in p.model for _, c in burst))
        waiting[0] = False  # nobody waits: the rest in one turn
        await asyncio.sleep(0)
        taken.append(sum(c.id in p.model for _, c in burst))
        return taken, p

    taken, p = asyncio.run(main())
    assert taken == [1, 2, 3, 4]
    keys = [k for k, _ in p.model.containers()]
    assert keys == [c.id for _, c in burst], "taken in out of order"


def test_a_take_in_with_nobody_waiting_takes_the_burst_in_one_turn(tmp_path: Path) -> None:
    burst = [realistic_pod(3200 + i, "BE") for i in range(4)]

    async def main() -> int:
        p = plugin(tmp_path, pacer=Pacer(asyncio.get_running_loop(), HookTraffic()))
        for pod, ctr in burst:
            p.create_container(pod, ctr)
        assert not any(c.id in p.model for _, c in burst)  # after the answers
        await asyncio.sleep(0)
        return sum(c.id in p.model for _, c in burst)

    assert asyncio.run(main()) == 4
