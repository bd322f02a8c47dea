"""Batch pods born right without Koordinator's webhook (issue 55, item 3): the runtime carries no
extended resource, so the batch-cpu / batch-memory a pod's containers ask come from the API
server's pod spec (the cluster side's pod cache) when the webhook's annotation is absent; with
the annotation, the annotation wins. The hook's answer has them when the cache knew the pod;
a pod it learns of later has its values worked out again and applied."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nriplugin.cluster.pods import PodCache, PodInfo
from nriplugin.features import desired_state
from nriplugin.nri import api_pb2 as api
from testkit.hook_work import realistic_pod
from tests.test_create_shapes import plugin
from tests.test_features import BATCH, SPEC, ctx

ASKS = {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "256Mi"}
LIMITS = {"kubernetes.io/batch-cpu": "1k", "kubernetes.io/batch-memory": "512Mi"}


def pod_object(uid: str, containers: list[dict[str, Any]], name: str = "job") -> dict[str, Any]:
    return {"metadata": {"uid": uid, "namespace": "batch", "name": name}, "spec": {"containers": containers}}


def batch_container(name: str = "main", requests: dict[str, str] = ASKS, limits: dict[str, str] = LIMITS) -> Any:
    return {"name": name, "resources": {"requests": {"cpu": "1", **requests}, "limits": dict(limits)}}


class Specs:
    def __init__(self, by_uid: dict[str, str | None]) -> None:
        self.by_uid = by_uid

    def extended_resource_spec(self, uid: str) -> str | None:
        return self.by_uid.get(uid)


def test_the_spec_is_the_webhooks_annotation_text() -> None:
    info = PodInfo.from_object(pod_object("u1", [batch_container(), {"name": "sidecar", "resources": {}}]))
    assert info.extended_spec is not None
    assert json.loads(info.extended_spec) == {"containers": {"main": {"requests": ASKS, "limits": LIMITS}}}
    assert json.loads(info.extended_spec) == json.loads(BATCH)  # the tests' annotation, the same asks
    # equal asks, one text (their parse and answer shared); none asked, none; garbage, none
    again = PodInfo.from_object(pod_object("u2", [batch_container()], name="other"))
    assert again.extended_spec == info.extended_spec
    assert (
        PodInfo.from_object(pod_object("u3", [{"name": "main", "resources": {"requests": {"cpu": "1"}}}])).extended_spec
        is None
    )
    for spec in ({"containers": "x"}, {"containers": [5, {"resources": []}]}, {}):
        assert PodInfo.from_object({"metadata": {"uid": "u"}, "spec": spec}).extended_spec is None


def test_the_cache_tells_when_a_pods_batch_asks_are_known_or_change() -> None:
    cache = PodCache()
    told: list[str] = []
    cache.on_spec = told.append
    cache.replace([pod_object("u1", [batch_container()]), pod_object("u2", [{"name": "main"}], name="plain")])
    assert told == ["u1"] and cache.extended_resource_spec("u1") is not None
    assert cache.extended_resource_spec("u2") is None and cache.extended_resource_spec("nope") is None
    cache.event("MODIFIED", pod_object("u1", [batch_container()]))  # a status update: the same asks
    assert told == ["u1"]
    cache.event("MODIFIED", pod_object("u1", [batch_container(requests={"kubernetes.io/batch-cpu": "2k"})]))
    assert told == ["u1", "u1"]


def test_batch_values_from_the_spec_and_the_annotation_wins() -> None:
    c = ctx("BE")
    uid = c.pod.uid
    spec = json.dumps({"containers": {"main": {"requests": {"kubernetes.io/batch-cpu": "2k"}}}})
    out = desired_state(c._replace(specs=Specs({uid: spec}))).intent
    assert out.values["cpu.shares"] == 2048 and "the pod's spec (no webhook annotation)" in out.why["cpu.shares"]
    both = ctx("BE", {SPEC: BATCH})._replace(specs=Specs({uid: spec}))
    out = desired_state(both).intent
    assert out.values["cpu.shares"] == 512 and SPEC in out.why["cpu.shares"]  # the annotation's 500m
    assert desired_state(c).intent.values["cpu.shares"] == 2  # no annotation, no cluster side: BE's lowest
    ls = ctx("LS")._replace(specs=Specs({uid: spec}))
    assert desired_state(ls).intent.values.get("cpu.shares") != 2048  # only BE is sized from batch


def bare_be(i: int) -> tuple[api.PodSandbox, api.Container]:
    pod, c = realistic_pod(i, "BE")
    del pod.annotations[SPEC]  # no webhook
    return pod, c


def test_the_hooks_answer_carries_the_specs_batch_values(tmp_path: Path) -> None:
    p = plugin(tmp_path)
    pod, c = bare_be(1)
    before = p.create_container(pod, c)  # the cluster side not up yet: BE's lowest weight
    assert not isinstance(before, tuple) and before is not None and before.linux.resources.cpu.shares.value == 2
    cache = PodCache()
    p.desired.use_specs(cache)
    cache.replace([pod_object(pod.uid, [batch_container()])])
    pod2, c2 = bare_be(2)
    cache.event("ADDED", pod_object(pod2.uid, [batch_container()], name="job2"))
    adj = p.create_container(pod2, c2)
    assert not isinstance(adj, tuple) and adj is not None and adj.linux.resources.cpu.shares.value == 512
    assert adj.linux.resources.memory.limit.value == 512 << 20
    # a third pod of the same shape the cache has not seen: not the memo's answer
    pod3, c3 = bare_be(3)
    adj3 = p.create_container(pod3, c3)
    assert not isinstance(adj3, tuple) and adj3 is not None and adj3.linux.resources.cpu.shares.value == 2


def test_a_pod_the_cache_learns_of_late_is_worked_out_again(tmp_path: Path) -> None:
    p = plugin(tmp_path)
    cache = PodCache()
    p.desired.use_specs(cache)
    cache.on_spec = p.desired.spec_changed
    pod, c = bare_be(4)
    p.create_container(pod, c)
    p.start_container(pod, c)
    assert p.desired.intent(c.id).get("cpu.shares") == 2  # type: ignore[union-attr]
    changed: list[list[str]] = []
    p.desired.subscribe(changed.append)
    cache.event("ADDED", pod_object(pod.uid, [batch_container()]))
    assert changed and c.id in changed[-1]
    assert p.desired.intent(c.id).get("cpu.shares") == 512  # type: ignore[union-attr]


def test_the_agent_hands_the_pod_cache_to_the_desired_state(tmp_path: Path) -> None:
    """``Agent.use_pod_specs`` once the cluster side runs: pods listed before it are worked out
    again; those listed after, through the cache's ``on_spec``."""
    from nriplugin.agent.assembly import Agent

    p = plugin(tmp_path)
    early_pod, early = bare_be(5)
    late_pod, late = bare_be(6)
    for pod, c in ((early_pod, early), (late_pod, late)):
        p.create_container(pod, c)
        p.start_container(pod, c)
    cache = PodCache()
    cache.replace([pod_object(early_pod.uid, [batch_container()])])
    changed: list[str] = []
    p.desired.subscribe(changed.extend)
    Agent.use_pod_specs(p.desired, cache)
    assert early.id in changed and late.id not in changed
    cache.event("ADDED", pod_object(late_pod.uid, [batch_container()], name="late"))
    assert late.id in changed
    assert [p.desired.intent(c.id).get("cpu.shares") for c in (early, late)] == [512, 512]  # type: ignore[union-attr]
