"""Feature modules, the policy model and rule cache, and the plugin's hook outputs."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from nriplugin.features import PIPELINE, Context, FeatureFailed, Intent, desired_state, enabled
from nriplugin.features.registry import FeatureRegistry
from nriplugin.kernel.cgroup import Cgroups, Version
from nriplugin.kernel.probe import Capabilities, Resctrl, Topology
from nriplugin.node.assembly import Node
from nriplugin.node.hooks import QoSPlugin, to_resources
from nriplugin.nri import api_pb2 as api
from nriplugin.policy.cache import PolicyError, PolicyWatcher, RuleCache, parse
from nriplugin.policy.model import Features, Policy
from nriplugin.policy.qos import QoSClass
from nriplugin.policy.quantity import parse_quantity
from testkit.kernel_tree import v1_tree, v2_tree
from testkit.runtime_peer import make_container, make_pod

SPEC = "node.koordinator.sh/extended-resource-spec"
BATCH = json.dumps(
    {
        "containers": {
            "main": {
                "requests": {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "256Mi"},
                "limits": {"kubernetes.io/batch-cpu": "1k", "kubernetes.io/batch-memory": "512Mi"},
            }
        }
    }
)


def caps(**files: bool) -> Capabilities:
    base = {
        "cpu.shares": True,
        "cpu.cfs_quota_us": True,
        "cpu.cfs_burst_us": True,
        "cpu.idle": True,
        "cpu.bvt_warp_ns": False,
    }
    base.update(files)
    return Capabilities(Version.V1, ["cpu"], base, Resctrl(), True, False, Topology())


def ctx(
    qos: str,
    annotations: dict[str, str] | None = None,
    quota: int | None = None,
    policy: Policy | None = None,
    c: Capabilities | None = None,
    container: bool = True,
) -> Context:
    pod = make_pod(1, qos)
    pod.annotations.update(annotations or {})
    ctr = make_container(1, pod)
    if quota is not None:
        ctr.linux.resources.cpu.quota.value = quota
    return Context(pod, ctr if container else None, QoSClass(qos), policy or Policy(), c or caps())


def test_every_policy_switch_has_one_registered_feature_in_an_explicit_order() -> None:
    """The policy's ``features`` fields and the registered features are the same names; the
    order puts batch sizing before CPU QoS's floor and the burst after the quota."""
    assert sorted(f.name for f in PIPELINE) == sorted(Features.model_fields)
    names = [f.name for f in PIPELINE]
    assert names.index("batchResource") < names.index("cpuQOS") < names.index("cpuBurst")
    assert [f.order for f in PIPELINE] == sorted({f.order for f in PIPELINE})  # distinct, ascending
    off = Policy.model_validate({"features": {"cpuset": {"enable": False}, "blkio": {"failurePolicy": "fail-closed"}}})
    steps = {name: closed for name, _, closed in enabled(off)}
    assert "cpuset" not in steps and steps["blkio"] and not steps["cpuQOS"]
    assert [name for name, _, _ in enabled(Policy())] == names


def test_a_feature_registry_refuses_what_the_policy_does_not_name() -> None:
    def nothing(ctx: Context, intent: Intent) -> None:
        pass

    reg = FeatureRegistry(["a", "b"])
    with pytest.raises(TypeError, match="'c' is not a feature switch of the policy"):
        reg.feature("c", 1)(nothing)
    reg.feature("a", 10)(nothing)
    with pytest.raises(TypeError, match="'a' is registered twice"):
        reg.feature("a", 20)(nothing)
    with pytest.raises(TypeError, match="order 10 is a's already"):
        reg.feature("b", 10)(nothing)
    with pytest.raises(TypeError, match="no feature registered for the policy's switch\\(es\\): b"):
        reg.pipeline()
    reg.feature("b", 5)(nothing)
    assert [f.name for f in reg.pipeline()] == ["b", "a"]


def test_batch_sizes_be_containers_and_pods() -> None:
    out = desired_state(ctx("BE", {SPEC: BATCH}))
    v = out.intent.values
    assert v["cpu.shares"] == 512 and v["cpu.cfs_quota_us"] == 100000 and v["cpu.cfs_period_us"] == 100000
    assert v["memory.limit_in_bytes"] == 512 << 20 and "cpu.idle" not in v
    assert "batch-cpu request 500m" in out.intent.why["cpu.shares"]
    two = json.dumps(
        {
            "containers": {
                "a": {"requests": {"kubernetes.io/batch-cpu": "250"}, "limits": {"kubernetes.io/batch-cpu": "500"}},
                "b": {"requests": {"kubernetes.io/batch-cpu": "750"}},
            }
        }
    )
    pod = desired_state(ctx("BE", {SPEC: two}, container=False)).intent.values
    assert pod["cpu.shares"] == 1024 and "cpu.cfs_quota_us" not in pod  # b has no limit: no pod quota
    assert desired_state(ctx("LS", {SPEC: BATCH})).intent.values.get("cpu.shares") is None


@pytest.mark.parametrize(
    "bad",
    [
        "{not json",
        '"a string"',
        '{"containers": []}',
        '{"containers": {"main": 5}}',
        '{"containers": {"main": {"requests": {"kubernetes.io/batch-cpu": "-5"}}}}',
        '{"containers": {"main": {"requests": {"kubernetes.io/batch-cpu": "1e300"}}}}',
        '{"containers": {"main": {"requests": {"kubernetes.io/batch-cpu": "0.5"}}}}',
        '{"containers": {"main": {"limits": {"kubernetes.io/batch-memory": "12XB"}}}}',
        '{"containers": {"main": {"limits": {"kubernetes.io/batch-memory": true}}}}',
        '{"containers": {"main": {"limits": {"kubernetes.io/batch-memory": ["1"]}}}}',
        "x" * 20000,
        "[" * 10000,  # deeper than Python's recursion limit
    ],
)
def test_hostile_batch_annotation_fails_open_or_closed(bad: str) -> None:
    out = desired_state(ctx("BE", {SPEC: bad}))
    assert [f for f, _ in out.failed] == ["batchResource"]
    assert out.intent.values["cpu.shares"] == 2  # CPU QoS still applies; batch values are not guessed
    closed = Policy.model_validate({"features": {"batchResource": {"failurePolicy": "fail-closed"}}})
    with pytest.raises(FeatureFailed, match="batchResource"):
        desired_state(ctx("BE", {SPEC: bad}, policy=closed))


def test_quantities() -> None:
    assert parse_quantity("1k") == 1000 and parse_quantity("512Mi") == 512 << 20 and parse_quantity("2e3") == 2000
    assert parse_quantity("1.5Gi") == 3 << 29 and parse_quantity(500) == 500
    for bad in ("", "1kk", "Mi", "1 k", "0x10", True, None, 1.5, "1" * 70):
        with pytest.raises(ValueError):
            parse_quantity(bad)


def test_cpu_identity_by_kernel_capability() -> None:
    assert desired_state(ctx("BE", c=caps(**{"cpu.bvt_warp_ns": True}))).intent.values["cpu.bvt_warp_ns"] == -1
    ls = desired_state(ctx("LS", c=caps(**{"cpu.bvt_warp_ns": True}))).intent.values
    assert ls == {"cpu.bvt_warp_ns": 2}
    assert desired_state(ctx("BE")).intent.values == {"cpu.shares": 2}  # no bvt here, no silent idle
    core = Policy.model_validate({"resourceQOSStrategy": {"policies": {"cpuPolicy": "coreSched"}}})
    assert desired_state(ctx("BE", policy=core)).intent.values == {"cpu.shares": 2, "cpu.idle": 1}
    assert desired_state(ctx("BE", policy=core, c=caps(**{"cpu.idle": False}))).intent.values == {"cpu.shares": 2}
    off = Policy.model_validate({"resourceQOSStrategy": {"beClass": {"cpuQOS": {"enable": False}}}})
    assert desired_state(ctx("BE", policy=off)).intent.values == {}
    assert (
        desired_state(
            ctx("LS", policy=Policy.model_validate({"features": {"cpuQOS": {"enable": False}}}))
        ).intent.values
        == {}
    )


def test_cpu_burst() -> None:
    assert desired_state(ctx("LS", quota=50000)).intent.values["cpu.cfs_burst_us"] == 50000  # 1000% capped
    half = {"koordinator.sh/cpuBurst": '{"cpuBurstPercent": 50}'}
    assert desired_state(ctx("LS", half, quota=50000)).intent.values["cpu.cfs_burst_us"] == 25000
    assert (
        "cpu.cfs_burst_us"
        not in desired_state(ctx("LS", {"koordinator.sh/cpuBurst": '{"policy": "none"}'}, quota=50000)).intent.values
    )
    assert "cpu.cfs_burst_us" not in desired_state(ctx("LS")).intent.values  # no quota, nothing to bank
    assert "cpu.cfs_burst_us" not in desired_state(ctx("BE", {SPEC: BATCH})).intent.values
    assert (
        "cpu.cfs_burst_us"
        not in desired_state(ctx("LS", quota=50000, c=caps(**{"cpu.cfs_burst_us": False}))).intent.values
    )
    for bad in ('{"cpuBurstPercent": 0}', '{"cpuBurstPercent": "10"}', '{"policy": "yes"}', "[]", "{"):
        out = desired_state(ctx("LS", {"koordinator.sh/cpuBurst": bad}, quota=50000))
        assert [f for f, _ in out.failed] == ["cpuBurst"] and "cpu.cfs_burst_us" not in out.intent.values


def test_v2_adjustment_carries_file_values_in_unified(tmp_path: Path) -> None:
    out = desired_state(ctx("BE", {SPEC: BATCH}))
    res = api.LinuxResources()
    to_resources(out.intent, Cgroups(v2_tree(tmp_path, ["kubepods"])), res)
    assert res.cpu.shares.value == 512 and dict(res.unified) == {}
    core = Policy.model_validate({"resourceQOSStrategy": {"policies": {"cpuPolicy": "coreSched"}}})
    out = desired_state(ctx("BE", {SPEC: BATCH}, policy=core))
    res = api.LinuxResources()
    to_resources(out.intent, Cgroups(v2_tree(tmp_path, ["kubepods"])), res)
    assert dict(res.unified) == {"cpu.idle": "1"}
    res1 = api.LinuxResources()
    to_resources(out.intent, Cgroups(v1_tree(tmp_path / "v1")), res1)
    assert dict(res1.unified) == {}


def test_policy_merge_nodeslo_and_errors() -> None:
    p, notes = parse("resourceQOSStrategy:\n  lsrClass:\n    cpuQOS:\n      enable: false\n")
    assert not p.resourceQOSStrategy.lsrClass.cpuQOS.enable
    assert p.resourceQOSStrategy.beClass.cpuQOS.groupIdentity == -1  # defaults kept (deep merge)
    slo = (
        "apiVersion: slo.koordinator.sh/v1alpha1\nkind: NodeSLO\nspec:\n  cpuBurstStrategy:\n"
        "    policy: none\n  systemStrategy:\n    minFreeKbytesFactor: 100\n"
    )
    p, notes = parse(slo)
    assert p.cpuBurstStrategy.policy == "none" and notes and "systemStrategy" in notes[0]
    for text, where in (
        ("cpuBurstStrategy:\n  cpuBurstPercent: 0\n", "cpuBurstStrategy.cpuBurstPercent"),
        (
            "resourceQOSStrategy:\n  beClass:\n    resctrlQOS:\n      catRangeStartPercent: 90\n"
            "      catRangeEndPercent: 10\n",
            "catRangeStartPercent (90)",
        ),
        ("features:\n  cpuQOS:\n    failurePolicy: maybe\n", "features.cpuQOS.failurePolicy"),
        ("cpuBurstStrategy: {polcy: auto}\n", "cpuBurstStrategy.polcy"),
        ("- a list\n", "must be a mapping"),
        ("a: [\n", "not valid YAML"),
    ):
        with pytest.raises(PolicyError, match=where.replace("(", r"\(").replace(")", r"\)")):
            parse(text, "p.yaml")


def test_rule_cache_versions_and_keeps_last_good(tmp_path: Path) -> None:
    cache = RuleCache()
    seen: list[int] = []
    cache.subscribe(lambda v: seen.append(v.version))
    f = tmp_path / "policy.yaml"
    f.write_text("beMinCPUShares: 4\n")
    assert cache.load_file(f).version == 2 and cache.policy.beMinCPUShares == 4
    f.write_text("beMinCPUShares: 1\n")
    with pytest.raises(PolicyError, match="beMinCPUShares"):
        cache.load_file(f)
    assert cache.current.version == 2 and cache.policy.beMinCPUShares == 4 and cache.rejected == 1
    f.write_text("beMinCPUShares: 4\n")
    assert cache.load_file(f).version == 2  # same content, same version
    assert seen == [2]


def test_hot_reload(tmp_path: Path) -> None:
    async def main() -> None:
        f = tmp_path / "policy.yaml"
        f.write_text("beMinCPUShares: 3\n")
        cache = RuleCache()
        cache.load_file(f)
        w = PolicyWatcher(f, cache, asyncio.get_running_loop(), debounce=0.05)
        w.start()
        try:
            tmp = tmp_path / "policy.yaml.new"  # as editors and ConfigMaps do: write, then rename
            tmp.write_text("beMinCPUShares: 8\n")
            tmp.replace(f)
            for _ in range(100):
                await asyncio.sleep(0.05)
                if cache.policy.beMinCPUShares == 8:
                    break
            assert cache.policy.beMinCPUShares == 8 and cache.current.version == 3
            f.write_text("beMinCPUShares: nope\n")
            await asyncio.sleep(0.5)
            assert cache.policy.beMinCPUShares == 8 and cache.rejected == 1
        finally:
            w.stop()

    asyncio.run(main())


def test_v2_the_runtimes_weight_mapping_is_learned_at_start_and_followed(tmp_path: Path) -> None:
    """runc 1.3.2 maps cpu.shares to cpu.weight differently (1024 -> 100, was 39): the first
    StartContainer shows which mapping the runtime used, and the agent's own writes (a pod's
    group, repairs) follow it, so siblings stay comparable."""
    ls = make_pod(1, "LS")
    ctr = make_container(1, ls)
    ctr.linux.resources.cpu.shares.value = 1024
    groups = [ls.linux.cgroup_parent.lstrip("/"), ctr.linux.cgroups_path.lstrip("/")]
    root = v2_tree(tmp_path, groups)
    cg = Cgroups(root)
    p = QoSPlugin(Node.create(RuleCache(), caps=caps(), cgroups=cg))
    p.create_container(ls, ctr)
    (root / groups[1] / "cpu.weight").write_text("100\n")  # what runc 1.3.2 wrote for 1024
    p.start_container(ls, ctr)
    assert cg.weight_learned and cg.weight_mapping == "log"
    assert cg.encode("cpu.shares", 2048) == "174"  # (linear: 79)


def test_v1_a_be_containers_quota_is_written_at_start_not_at_birth(tmp_path: Path) -> None:
    """BE's group can be cut at any moment between the answer that would put a BE quota in the
    spec and runc writing it (as long as a created container waits to start), and cgroup v1
    refuses a child's quota above its parent's (runc fails the container): on v1 the quota
    never travels in the spec, suppressed or not; the writer writes it at StartContainer,
    capped as the group is then."""
    be = make_pod(1, "BE")
    be.annotations[SPEC] = BATCH  # batch-cpu limit 1k milli-cores -> quota 100000
    ctr, ctr2 = make_container(1, be), make_container(2, be)
    groups = [c.linux.cgroups_path.lstrip("/") for c in (ctr, ctr2)]
    root = v1_tree(tmp_path, [be.linux.cgroup_parent.lstrip("/"), *groups])
    p = QoSPlugin(Node.create(RuleCache(), caps=caps(), cgroups=Cgroups(root)))
    for c in (ctr, ctr2):
        adj = p.create_container(be, c)
        assert isinstance(adj, api.ContainerAdjustment) and adj.linux.resources.cpu.shares.value == 512
        assert not adj.linux.resources.cpu.HasField("quota")
    p.start_container(be, ctr)
    assert (root / "cpu" / groups[0] / "cpu.cfs_quota_us").read_text() == "100000"  # not suppressed
    p.desired.set_ceiling(QoSClass.BE, 0.3, "cpu-suppress", "test")  # cut before runc writes
    p.start_container(be, ctr2)
    assert (root / "cpu" / groups[1] / "cpu.cfs_quota_us").read_text() == "30000"  # the cap now


def test_v1_a_created_be_container_synchronized_gets_no_quota_in_its_spec(tmp_path: Path) -> None:
    """The same for an update pushed after Synchronize to a container created, not started:
    it goes to the spec, so it carries BE's shares but not its quota; a running one gets both."""
    be = make_pod(1, "BE")
    be.annotations[SPEC] = BATCH
    waiting, running = make_container(1, be), make_container(2, be)
    waiting.state = api.CONTAINER_CREATED
    running.state = api.CONTAINER_RUNNING
    root = v1_tree(tmp_path, [be.linux.cgroup_parent.lstrip("/"), running.linux.cgroups_path.lstrip("/")])
    p = QoSPlugin(Node.create(RuleCache(), caps=caps(), cgroups=Cgroups(root)))
    updates = {u.container_id: u.linux.resources.cpu for u in p.synchronize([be], [waiting, running])}
    assert updates[waiting.id].shares.value == 512 and not updates[waiting.id].HasField("quota")
    assert updates[running.id].shares.value == 512 and updates[running.id].quota.value == 100000


def test_plugin_writes_what_nri_cannot_carry(tmp_path: Path) -> None:
    """cgroup v1: cpu.idle for BE at StartContainer and on the pod at RunPodSandbox; burst for LS."""
    be = make_pod(1, "BE")
    be.annotations[SPEC] = BATCH
    ctr = make_container(1, be)
    ls = make_pod(2, "LS")
    lsc = make_container(2, ls)
    lsc.linux.resources.cpu.quota.value = 40000
    groups = [
        be.linux.cgroup_parent.lstrip("/"),
        ctr.linux.cgroups_path.lstrip("/"),
        lsc.linux.cgroups_path.lstrip("/"),
    ]
    root = v1_tree(tmp_path, groups)
    cg = Cgroups(root)
    invalid: list[str] = []
    core = Policy.model_validate({"resourceQOSStrategy": {"policies": {"cpuPolicy": "coreSched"}}})
    p = QoSPlugin(Node.create(RuleCache(core), caps=caps(), cgroups=cg, on_invalid=invalid.append))
    adj = p.create_container(be, ctr)
    assert isinstance(adj, api.ContainerAdjustment) and adj.linux.resources.cpu.shares.value == 512
    p.start_container(be, ctr)
    assert (root / "cpu" / groups[1] / "cpu.idle").read_text() == "1"
    p.run_pod_sandbox(be)
    assert (root / "cpu" / groups[0] / "cpu.idle").read_text() == "1"
    assert (root / "cpu" / groups[0] / "cpu.shares").read_text() == "512"
    (root / "cpu" / groups[2] / "cpu.cfs_quota_us").write_text("40000")
    p.start_container(ls, lsc)
    assert (root / "cpu" / groups[2] / "cpu.cfs_burst_us").read_text() == "40000"
    # Hostile cgroup path from the runtime: refused, nothing written anywhere.
    evil = make_container(3, be)
    evil.linux.cgroups_path = "/kubepods/../../../etc"
    before = sorted(tmp_path.rglob("*"))
    p.create_container(be, evil)
    p.start_container(be, evil)
    rec = p.model.get(evil.id)
    assert rec is not None and rec.group is None  # known, but its cgroup is never touched
    assert sorted(tmp_path.rglob("*")) == before
    assert invalid == []
    t0 = time.perf_counter()
    for _ in range(200):
        p.create_container(be, ctr)
    assert time.perf_counter() - t0 < 5  # sanity only; speed is measured in bench/


def test_memory_qos_formulas_where_the_kernel_has_them() -> None:
    on = Policy.model_validate(
        {
            "resourceQOSStrategy": {
                "lsrClass": {"memoryQOS": {"enable": True, "minLimitPercent": 100, "oomKillGroup": 1}},
                "beClass": {"memoryQOS": {"enable": True, "lowLimitPercent": 50, "throttlingPercent": 50}},
            }
        }
    )
    v2 = caps(**{"memory.min": True, "memory.low": True, "memory.high": True, "memory.oom.group": True})
    lsr = ctx("LSR", policy=on, c=v2)
    assert lsr.container is not None
    lsr.container.linux.resources.memory.limit.value = 1 << 30
    vals = desired_state(lsr).intent.values
    assert vals["memory.min"] == 1 << 30 and vals["memory.oom.group"] == 1
    be = desired_state(ctx("BE", {SPEC: BATCH}, policy=on, c=v2)).intent.values
    assert be["memory.low"] == 128 << 20  # 50% of the 256Mi batch request
    assert be["memory.high"] == (256 << 20) + (256 << 20) // 2  # request + 50% of (512Mi - 256Mi)
    assert "memory.min" not in desired_state(ctx("LS", policy=on, c=v2)).intent.values  # request unknown
    v1 = desired_state(ctx("BE", {SPEC: BATCH}, policy=on)).intent.values  # mainline v1: no such files
    assert not {"memory.low", "memory.high", "memory.min"} & set(v1)
    # ... but a soft limit, which carries memory.low's value (reclaimed after groups above theirs)
    soft = desired_state(ctx("BE", {SPEC: BATCH}, policy=on, c=caps(**{"memory.soft_limit_in_bytes": True})))
    assert soft.intent.values["memory.soft_limit_in_bytes"] == 128 << 20
    assert "memory.low" in soft.intent.why["memory.soft_limit_in_bytes"]


def test_a_resize_that_lowers_the_quota_lowers_the_burst_before_the_runtime_writes_it(tmp_path: Path) -> None:
    """The kernel refuses a quota below its group's burst and NRI does not carry the burst:
    when UpdateContainer lowers an LS container's quota, the hook writes the burst worked out
    from the new quota before it answers (under the old quota, which admits it); a raised
    burst is not written there (the old quota would refuse it) but follows the raise."""
    ls = make_pod(2, "LS")
    ctr = make_container(2, ls)
    ctr.linux.resources.cpu.quota.value = 200000
    ctr.linux.resources.cpu.period.value = 100000
    group = ctr.linux.cgroups_path.lstrip("/")
    root = v1_tree(tmp_path, [ls.linux.cgroup_parent.lstrip("/"), group])
    p = QoSPlugin(Node.create(RuleCache(), caps=caps(), cgroups=Cgroups(root)))
    p.create_container(ls, ctr)
    p.start_container(ls, ctr)
    burst = root / "cpu" / group / "cpu.cfs_burst_us"
    assert burst.read_text().strip() == "200000"
    lower = api.LinuxResources()
    lower.cpu.quota.value, lower.cpu.period.value = 50000, 100000
    p.update_container(ls, ctr, lower)
    assert burst.read_text().strip() == "50000"  # before the answer: the runtime's write of 50000 is admitted
    ctr.linux.resources.CopyFrom(lower)
    higher = api.LinuxResources()
    higher.cpu.quota.value, higher.cpu.period.value = 400000, 100000
    p.update_container(ls, ctr, higher)
    assert burst.read_text().strip() == "50000"  # 400000 would be refused under the quota of 50000
    assert p.desired.intent(ctr.id).get("cpu.cfs_burst_us") == 400000  # type: ignore[union-attr]
