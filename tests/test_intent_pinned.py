"""The desired state's vocabulary, pinned at its edges: an annotation's size bound and the
errors that name the key, what the runtime was asked for, a copy that keeps every field, task
groups joined, and the burst held under the quota only when it is above it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

import pytest

from nriplugin.intent.core import (
    BURST,
    MAX_ANNOTATION,
    QUOTA,
    Context,
    Intent,
    InvalidInput,
    Setting,
    annotation_json,
    cap_burst,
    requested,
)
from nriplugin.kernel.probe import Capabilities
from nriplugin.nri import api_pb2 as api
from nriplugin.policy.model import Policy
from nriplugin.policy.qos import QoSClass


def _invalid(key: str, raw: str) -> InvalidInput:
    with pytest.raises(InvalidInput) as info:
        annotation_json(key, raw)
    return info.value


def test_an_annotation_of_exactly_the_bound_is_read_one_byte_more_is_refused_naming_the_key() -> None:
    at_bound = '"' + "x" * (MAX_ANNOTATION - 2) + '"'
    assert annotation_json("k", at_bound) == "x" * (MAX_ANNOTATION - 2)
    err = _invalid("my/key", at_bound + " ")
    assert (err.key, err.why) == ("my/key", f"longer than {MAX_ANNOTATION} bytes")
    assert str(err) == f"my/key: longer than {MAX_ANNOTATION} bytes"


def test_bad_json_and_json_nested_too_deeply_are_refused_naming_the_key() -> None:
    err = _invalid("my/key", "{not json")
    assert err.key == "my/key" and err.why.startswith("not valid JSON (") and err.why.endswith(")")
    deep = _invalid("deep/key", "[" * 10_000)  # within the size bound
    assert (deep.key, deep.why) == ("deep/key", "JSON nested too deeply")


def _ctx(pod: api.PodSandbox, files: dict[str, bool]) -> Context:
    caps = cast(Capabilities, SimpleNamespace(files=files))
    return Context(pod, None, QoSClass.LS, Policy(), caps)


def test_a_context_reads_a_pods_annotation_as_json_and_asks_the_kernels_files() -> None:
    pod = api.PodSandbox(id="p", annotations={"a/json": '{"n": 1}', "a/bad": "{"})
    ctx = _ctx(pod, {"cpu.shares": True, "cpu.idle": False})
    assert ctx.annotation_json("a/json") == {"n": 1}
    assert ctx.annotation_json("a/absent") is None
    with pytest.raises(InvalidInput) as info:
        ctx.annotation_json("a/bad")
    assert info.value.key == "a/bad"
    assert ctx.has("cpu.shares") is True
    assert ctx.has("cpu.idle") is False
    assert ctx.has("memory.high") is False  # not probed: not there


def test_what_the_runtime_was_asked_for_is_each_field_set_and_only_that() -> None:
    c = api.Container(id="c")
    assert requested(None, QUOTA) is None
    assert requested(c, QUOTA) is None  # no linux part at all
    c.linux.resources.cpu.shares.value = 512
    for resource in ("cpu.cfs_quota_us", "cpu.cfs_period_us", "memory.limit_in_bytes"):
        assert requested(c, resource) is None, resource  # another field set, not this one
    assert requested(c, "cpu.shares") == 512
    c.linux.resources.cpu.quota.value = 50_000
    c.linux.resources.cpu.period.value = 100_000
    c.linux.resources.memory.limit.value = 1 << 30
    assert requested(c, QUOTA) == 50_000
    assert requested(c, "cpu.cfs_period_us") == 100_000
    assert requested(c, "memory.limit_in_bytes") == 1 << 30
    assert requested(c, "cpu.idle") is None  # a resource the runtime is not asked for


def test_a_copy_keeps_every_field_and_owns_its_files() -> None:
    i = Intent(owner="cpuQoS")
    i.set("cpu.shares", 2, "BE")
    i.join("resctrl", "BE", "class")
    i.join("coresched", "g1", "group")
    i.rdt_class = "BE"
    c = i.copy()
    assert c == i
    assert (c.resctrl_group, c.core_sched_group, c.rdt_class, c.owner) == (
        i.resctrl_group,
        i.core_sched_group,
        "BE",
        "cpuQoS",
    )
    c.set("cpu.shares", 9, "changed")
    assert i.get("cpu.shares") == 2


def test_joining_a_task_group_names_the_kind_the_owner_and_refuses_an_unknown_kind() -> None:
    i = Intent(owner="resctrl")
    i.join("resctrl", "LSR", "why")
    assert i.resctrl_group == Setting("resctrl.group", "LSR", "why", owner="resctrl")
    i.owner = "coreSched"
    i.join("coresched", "g", "why2")
    assert i.core_sched_group == Setting("coresched.group", "g", "why2", owner="coreSched")
    with pytest.raises(ValueError, match="unknown task group kind 'other'"):
        i.join("other", "g", "w")


def _files(quota: int | str | None, burst: int | str | None) -> dict[tuple[str, str], Setting]:
    files = {}
    if quota is not None:
        files[(QUOTA, "")] = Setting(QUOTA, quota, "q")
    if burst is not None:
        files[(BURST, "")] = Setting(BURST, burst, "b")
    return files


def test_the_burst_is_capped_only_above_a_finite_quota_of_integers() -> None:
    above = _files(50_000, 80_000)
    cap_burst(above)
    assert above[(BURST, "")] == Setting(BURST, 50_000, "b; capped at the quota 50000 us")
    equal = _files(50_000, 50_000)
    cap_burst(equal)
    assert equal[(BURST, "")] == Setting(BURST, 50_000, "b")  # not above: untouched, its why too
    unlimited = _files(-1, 80_000)
    cap_burst(unlimited)
    assert unlimited[(BURST, "")].value == 80_000
    for quota, burst in ((50_000, "80000"), ("50000", 80_000), (None, 80_000), (50_000, None)):
        files = _files(quota, burst)
        cap_burst(files)
        assert files == _files(quota, burst), (quota, burst)
