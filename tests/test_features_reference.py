"""Feature formulas against independent references, in table tests.

Sources:
- Koordinator ``pkg/koordlet/runtimehooks/hooks/batchresource/batch_resource.go``: BE shares =
  batch-cpu request (milli) * 1024 / 1000, at least 2; quota = batch-cpu limit * 100000 / 1000,
  -1 (none) when the limit is 0 or absent, at least 1000; memory = batch-memory limit; a pod's
  request is the sum of its containers', its limit the sum only when every container has one.
  Kubelet's ``MilliCPUToShares`` (pkg/kubelet/cm/helpers_linux.go) also caps shares at 262144.
- Koordinator ``pkg/koordlet/qosmanager/plugins/cpuburst`` calcStaticCPUBurstVal: burst = limit
  (cores) * cpuBurstPercent / 100 * 100000 µs, for policies cpuBurstOnly and auto; capped here at
  the quota, since mainline kernels refuse a burst above it (EINVAL from tg_set_cfs_bandwidth).
- Kubernetes KEP-2570 (memory QoS) and Koordinator's memory QoS: memory.min/low = request x
  percent, memory.high = request + factor x (limit - request), page aligned (rounded down).
- Kubernetes ``resource.Quantity``: decimal (n u m k M G T P E) and binary (Ki .. Ei) suffixes,
  decimal exponents.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal
from pathlib import Path

import pytest

from nriplugin.features import Intent, batch, blkio, cpu_burst, cpu_qos, desired_state, resctrl
from nriplugin.kernel.probe import Capabilities
from nriplugin.kernel.probe import resctrl as resctrl_probe
from nriplugin.kernel.resctrl import ResctrlFS
from nriplugin.policy.model import Policy
from nriplugin.policy.quantity import parse_quantity
from testkit.kernel_tree import resctrl_tree
from tests.test_features import caps, ctx

SPEC = batch.ANNOTATION
CPU, MEM = batch.BATCH_CPU, batch.BATCH_MEMORY


@pytest.fixture(autouse=True)
def _fresh_parse_cache() -> None:
    """The annotation parser caches by text: start each test without another test's results
    (and, under mutation testing, without results of the unmutated code)."""
    batch._parse.cache_clear()


def spec(**containers: tuple[dict[str, str], dict[str, str]]) -> dict[str, str]:
    return {SPEC: json.dumps({"containers": {n: {"requests": r, "limits": lim} for n, (r, lim) in containers.items()}})}


def koord_shares(milli: int) -> int:
    return min(max(milli * 1024 // 1000, 2), 262144)


def koord_quota(milli: int) -> int:
    q = milli * 100000 // 1000
    return -1 if q <= 0 else max(q, 1000)


# batch resources -------------------------------------------------------------------------------

# (batch-cpu request m, batch-cpu limit m, batch-memory limit) -> cpu.shares, cpu.cfs_quota_us, memory
CONTAINER = [
    ("500", "1000", "512Mi", 512, 100000, 512 << 20),
    ("0", "0", "0", 2, None, None),
    ("1", "1", "4Ki", 2, 1000, 4096),
    ("2", "9", "4095", 2, 1000, None),  # below a page: no memory limit
    ("3", "10", "4096", 3, 1000, 4096),
    ("1000", "11", "1Gi", 1024, 1100, 1 << 30),
    ("1001", "1001", "1G", 1025, 100100, 10**9),
    ("256000", "64k", "1Ti", 262144, 6400000, 1 << 40),
    ("256001", "100", "1", 262144, 10000, None),
    ("300k", "2", "8Ki", 262144, 1000, 8192),
]


@pytest.mark.parametrize(("req", "lim", "mem", "shares", "quota", "memory"), CONTAINER)
def test_batch_container_values_are_koordinators(
    req: str, lim: str, mem: str, shares: int, quota: int | None, memory: int | None
) -> None:
    q = int(parse_quantity(req)), int(parse_quantity(lim))
    assert koord_shares(q[0]) == shares and koord_quota(q[1]) == (quota or -1)
    v = desired_state(ctx("BE", spec(main=({CPU: req}, {CPU: lim, MEM: mem})))).intent.values
    assert v["cpu.shares"] == shares
    assert v.get("cpu.cfs_quota_us") == quota
    assert v.get("cpu.cfs_period_us") == (100000 if quota else None)
    assert v.get("memory.limit_in_bytes") == memory


def test_batch_container_without_limits_or_requests() -> None:
    v = desired_state(ctx("BE", spec(main=({MEM: "1Gi"}, {})))).intent.values
    assert v == {"cpu.shares": 2}  # CPU QoS's BE floor, nothing from batch
    v = desired_state(ctx("BE", spec(main=({}, {CPU: "2000"})))).intent.values
    assert v == {"cpu.shares": 2, "cpu.cfs_quota_us": 200000, "cpu.cfs_period_us": 100000}
    v = desired_state(ctx("BE", spec(other=({CPU: "2000"}, {CPU: "2000"})))).intent.values
    assert v == {"cpu.shares": 2}  # another container's entry is not this one's


def test_batch_why_names_the_source() -> None:
    why = desired_state(ctx("BE", spec(main=({CPU: "500"}, {CPU: "1000", MEM: "1Gi"})))).intent.why
    assert why == {
        "cpu.shares": f"batch-cpu request 500m -> 512 shares ({SPEC} of container main)",
        "cpu.cfs_quota_us": "batch-cpu limit 1000m -> 100000 us per 100000 us",
        "cpu.cfs_period_us": "batch quota period",
        "memory.limit_in_bytes": f"batch-memory limit ({SPEC} of container main)",
    }
    pod = desired_state(ctx("BE", spec(main=({CPU: "500"}, {})), container=False)).intent.why
    assert pod["cpu.shares"] == f"batch-cpu request 500m -> 512 shares ({SPEC}, summed over the pod's containers)"


POD = [
    # containers' (requests, limits) -> the pod's shares, quota, memory
    (
        {"a": ({CPU: "250", MEM: "1Gi"}, {CPU: "500", MEM: "2Gi"}), "b": ({CPU: "750"}, {CPU: "1500", MEM: "1Gi"})},
        1024,
        200000,
        3 << 30,
    ),
    ({"a": ({CPU: "250"}, {CPU: "500"}), "b": ({CPU: "750"}, {})}, 1024, None, None),  # b unlimited
    ({"a": ({CPU: "250"}, {CPU: "500"}), "b": ({CPU: "750"}, {CPU: "0"})}, 1024, None, None),  # limit 0: unlimited
    ({"a": ({}, {CPU: "500", MEM: "4Ki"}), "b": ({CPU: "1"}, {CPU: "500", MEM: "4Ki"})}, 2, 100000, 8192),
    ({"a": ({}, {MEM: "1Mi"}), "b": ({}, {MEM: "0"})}, None, None, None),
    ({"a": ({CPU: "0"}, {}), "b": ({CPU: "0"}, {})}, 2, None, None),
    ({"a": ({}, {CPU: "1", MEM: "1"}), "b": ({}, {CPU: "1", MEM: "4Ki"})}, None, 1000, 4097),  # the least limits
]


@pytest.mark.parametrize(("containers", "shares", "quota", "memory"), POD)
def test_batch_pod_sums_are_koordinators(
    containers: dict[str, tuple[dict[str, str], dict[str, str]]],
    shares: int | None,
    quota: int | None,
    memory: int | None,
) -> None:
    c = ctx("BE", spec(**containers), container=False)
    v = desired_state(c).intent.values
    assert v.get("cpu.shares", 2) == (shares or 2)
    assert v.get("cpu.cfs_quota_us") == quota
    assert v.get("memory.limit_in_bytes") == memory
    found = batch.pod_batch(c)
    assert found is not None
    req, _lim = found
    assert (CPU in req) == (shares is not None)


def test_batch_applies_to_be_only_and_needs_the_annotation() -> None:
    s = spec(main=({CPU: "500"}, {CPU: "1000"}))
    for qos in ("LS", "LSR", "LSE", "SYSTEM"):
        assert "cpu.cfs_quota_us" not in desired_state(ctx(qos, s)).intent.values
    assert batch.pod_batch(ctx("BE", {SPEC: '{"containers": {}}'}, container=False)) is None
    assert batch.pod_batch(ctx("BE", container=False)) is None
    assert batch.container_batch(ctx("BE"), "main") is None
    assert desired_state(ctx("BE", {SPEC: '{"containers": {}}'}, container=False)).intent.values == {"cpu.shares": 2}


def test_batch_limits_out_of_range_are_refused() -> None:
    cases = {
        f'{{"containers": {{"main": {{"requests": {{"{CPU}": "1073741825"}}}}}}}}': "out of range",
        f'{{"containers": {{"main": {{"limits": {{"{MEM}": "{2**62 + 1}"}}}}}}}}': "out of range",
        '{"containers": {"main": {"requests": 5}}}': "containers.main.requests is not an object",
        '{"containers": {"main": {"limits": []}}}': "",  # empty: no limits
    }
    for raw, why in cases.items():
        out = desired_state(ctx("BE", {SPEC: raw}))
        if why:
            assert out.failed and out.failed[0][1].startswith(f"{SPEC}: ") and why in out.failed[0][1], raw
        else:
            assert not out.failed
    ok = f'{{"containers": {{"main": {{"requests": {{"{CPU}": "1073741824"}}, "limits": {{"{MEM}": "{2**62}"}}}}}}}}'
    assert desired_state(ctx("BE", {SPEC: ok})).intent.values["memory.limit_in_bytes"] == 2**62


# CPU burst -------------------------------------------------------------------------------------


def koord_burst(quota: int, percent: int) -> int:
    """Koordinator's static burst for a limit of quota/100000 cores, capped at the quota."""
    return min(quota * percent // 100, quota)


@pytest.mark.parametrize(
    ("quota", "percent", "burst"),
    [
        (50000, 1000, 50000),  # Koordinator's default percent: capped at the quota
        (50000, 100, 50000),
        (50000, 99, 49500),
        (50000, 50, 25000),
        (50000, 1, 500),
        (33333, 33, 10999),  # rounded down
        (1000, 10000, 1000),
        (1, 1, 0),
    ],
)
def test_cpu_burst_is_koordinators_capped_at_the_quota(quota: int, percent: int, burst: int) -> None:
    assert koord_burst(quota, percent) == burst
    over = {"koordinator.sh/cpuBurst": json.dumps({"cpuBurstPercent": percent})}
    out = desired_state(ctx("LS", over, quota=quota)).intent
    assert out.values["cpu.cfs_burst_us"] == burst
    assert out.why["cpu.cfs_burst_us"] == f"{percent}% of quota {quota} us, capped at the quota"


@pytest.mark.parametrize(
    ("policy", "burst"), [("cpuBurstOnly", True), ("auto", True), ("cfsQuotaBurstOnly", False), ("none", False)]
)
def test_cpu_burst_policies(policy: str, burst: bool) -> None:
    node = Policy.model_validate({"cpuBurstStrategy": {"policy": policy, "cpuBurstPercent": 50}})
    assert ("cpu.cfs_burst_us" in desired_state(ctx("LS", quota=40000, policy=node)).intent.values) is burst
    over = {"koordinator.sh/cpuBurst": json.dumps({"policy": policy})}
    got = desired_state(ctx("LS", over, quota=40000)).intent.values.get("cpu.cfs_burst_us")
    assert got == (40000 if burst else None)


@pytest.mark.parametrize(
    ("qos", "burst"), [("LSE", True), ("LSR", True), ("LS", True), ("BE", False), ("SYSTEM", False)]
)
def test_cpu_burst_classes(qos: str, burst: bool) -> None:
    c = ctx(qos, quota=40000)
    intent = Intent()
    cpu_burst.desired(c, intent)
    assert intent.values == ({"cpu.cfs_burst_us": 40000} if burst else {})


def test_cpu_burst_follows_the_intents_quota_before_the_runtimes() -> None:
    intent = Intent()
    intent.set("cpu.cfs_quota_us", 20000, "set by an earlier feature")
    cpu_burst.desired(ctx("LS", quota=80000), intent)
    assert intent.get("cpu.cfs_burst_us") == 20000
    for quota in (-1, 0):
        none = Intent()
        cpu_burst.desired(ctx("LS", quota=quota), none)
        assert none.values == {}
    pod = Intent()
    cpu_burst.desired(ctx("LS", quota=40000, container=False), pod)
    assert pod.values == {}


@pytest.mark.parametrize(
    ("override", "ok"),
    [
        ('{"cpuBurstPercent": 1}', True),
        ('{"cpuBurstPercent": 10000}', True),
        ('{"cpuBurstPercent": 10001}', False),
        ('{"cpuBurstPercent": 0}', False),
        ('{"cpuBurstPercent": true}', False),
        ('{"cpuBurstPercent": 1.5}', False),
        ('{"policy": "auto"}', True),
        ('{"policy": "bogus"}', False),
        ("{}", True),
        ('"auto"', False),
    ],
)
def test_cpu_burst_annotation_is_validated(override: str, ok: bool) -> None:
    out = desired_state(ctx("LS", {cpu_burst.ANNOTATION: override}, quota=40000))
    assert (out.failed == []) is ok
    if not ok:
        assert out.failed[0][0] == "cpuBurst" and out.failed[0][1].startswith(cpu_burst.ANNOTATION)


# CPU QoS ---------------------------------------------------------------------------------------

CORE = {"resourceQOSStrategy": {"policies": {"cpuPolicy": "coreSched"}}}


@pytest.mark.parametrize(
    ("qos", "policy", "bvt", "want"),
    [
        ("BE", {}, True, {"cpu.shares": 2, "cpu.bvt_warp_ns": -1}),
        ("LS", {}, True, {"cpu.bvt_warp_ns": 2}),
        ("LSR", {}, True, {"cpu.bvt_warp_ns": 2}),
        ("LSE", {}, True, {"cpu.bvt_warp_ns": 2}),
        ("SYSTEM", {}, True, {}),
        ("BE", {}, False, {"cpu.shares": 2}),
        ("BE", {"beMinCPUShares": 64}, False, {"cpu.shares": 64}),
        ("BE", CORE, True, {"cpu.shares": 2, "cpu.idle": 1}),
        ("LS", CORE, True, {}),
        ("LS", {"resourceQOSStrategy": {"lsClass": {"cpuQOS": {"groupIdentity": None}}}}, True, {}),
        (
            "LS",
            {"resourceQOSStrategy": {"lsClass": {"cpuQOS": {"schedIdle": 1}}, **CORE["resourceQOSStrategy"]}},
            True,
            {"cpu.idle": 1},
        ),
    ],
)
def test_cpu_qos_by_class_and_policy(qos: str, policy: dict[str, object], bvt: bool, want: dict[str, int]) -> None:
    c = ctx(qos, policy=Policy.model_validate(policy), c=caps(**{"cpu.bvt_warp_ns": bvt}))
    intent = Intent()
    cpu_qos.desired(c, intent)
    assert intent.values == want


def test_cpu_qos_keeps_batch_shares_and_says_why() -> None:
    intent = Intent()
    intent.set("cpu.shares", 512, "batch")
    cpu_qos.desired(ctx("BE"), intent)
    assert intent.values == {"cpu.shares": 512}
    fresh = Intent()
    cpu_qos.desired(ctx("BE", policy=Policy.model_validate(CORE), c=caps(**{"cpu.bvt_warp_ns": True})), fresh)
    assert fresh.why == {
        "cpu.shares": "BE: lowest CPU weight (beMinCPUShares=2)",
        "cpu.idle": "BE schedIdle=1 (coreSched policy)",
    }
    gi = Intent()
    cpu_qos.desired(ctx("LS", c=caps(**{"cpu.bvt_warp_ns": True})), gi)
    assert gi.why == {"cpu.bvt_warp_ns": "group identity of LS"}


# memory QoS ------------------------------------------------------------------------------------

PAGE = 4096
V2 = caps(**{"memory.min": True, "memory.low": True, "memory.high": True, "memory.oom.group": True})


def kep2570_high(request: int, limit: int, percent: int) -> int:
    return (request + (limit - request) * percent // 100) // PAGE * PAGE


@pytest.mark.parametrize(
    ("req", "limit", "pct", "low", "high"),
    [
        (256 << 20, 512 << 20, 50, 128 << 20, 384 << 20),
        (256 << 20, 512 << 20, 80, (256 << 20) * 80 // 100 // PAGE * PAGE, kep2570_high(256 << 20, 512 << 20, 80)),
        (100000, 300000, 33, 32768, 163840),  # page aligned, rounded down
        (1 << 30, 1 << 30, 100, 1 << 30, None),  # no room above the request: no memory.high
        (4096, 4096 * 3, 1, 0, 4096),
        (1, 4097, 80, 0, None),  # under a page: no memory.high of 0 (it would throttle everything)
    ],
)
def test_memory_qos_formulas(req: int, limit: int, pct: int, low: int, high: int | None) -> None:
    request = req
    assert kep2570_high(request, limit, pct) == (high if high else kep2570_high(request, limit, pct))
    pol = Policy.model_validate(
        {
            "resourceQOSStrategy": {
                "beClass": {
                    "memoryQOS": {
                        "enable": True,
                        "minLimitPercent": pct,
                        "lowLimitPercent": pct,
                        "throttlingPercent": pct,
                        "oomKillGroup": 1,
                    }
                }
            }
        }
    )
    v = desired_state(ctx("BE", spec(main=({MEM: str(request)}, {MEM: str(limit)})), policy=pol, c=V2)).intent
    assert v.get("memory.min") == low and v.get("memory.low") == low
    assert v.get("memory.high") == high
    assert v.get("memory.oom.group") == 1
    src = f"of request {request} (batch-memory)"
    assert v.why["memory.min"] == f"{pct}% {src}" and v.why["memory.low"] == f"{pct}% {src}"
    if high is not None:
        assert v.why["memory.high"] == f"request + {pct}% of (limit - request)"


def test_memory_qos_request_sources() -> None:
    on = {"enable": True, "minLimitPercent": 100, "lowLimitPercent": 50}
    pol = Policy.model_validate({"resourceQOSStrategy": {"lsrClass": {"memoryQOS": on}, "lsClass": {"memoryQOS": on}}})
    for qos in ("LSR", "LSE"):
        c = ctx(qos, policy=pol, c=V2)
        assert c.container is not None
        c.container.linux.resources.memory.limit.value = 1 << 30
        v = desired_state(c).intent
        assert v.get("memory.min") == 1 << 30 and v.get("memory.low") == 1 << 29
        assert v.why["memory.min"] == "100% of request 1073741824 (Guaranteed: request = limit)"
    ls = ctx("LS", policy=pol, c=V2)
    assert ls.container is not None
    ls.container.linux.resources.memory.limit.value = 1 << 30
    assert desired_state(ls).intent.get("memory.min") is None  # a Burstable request is not known
    assert desired_state(ctx("LSR", policy=pol, c=V2)).intent.get("memory.min") is None  # no limit given
    assert desired_state(ctx("LSR", policy=pol, c=V2, container=False)).intent.values == {}
    # BE without batch-memory request: nothing; the request may not be 0 either
    be_on = Policy.model_validate({"resourceQOSStrategy": {"beClass": {"memoryQOS": on}}})
    assert desired_state(ctx("BE", spec(main=({}, {MEM: "1Gi"})), policy=be_on, c=V2)).intent.get("memory.low") is None
    assert desired_state(ctx("BE", spec(main=({MEM: "0"}, {})), policy=be_on, c=V2)).intent.get("memory.low") is None


def test_memory_qos_by_kernel_files() -> None:
    on = {"enable": True, "minLimitPercent": 100, "lowLimitPercent": 50, "throttlingPercent": 50, "oomKillGroup": 0}
    pol = Policy.model_validate({"resourceQOSStrategy": {"beClass": {"memoryQOS": on}}})
    s = spec(main=({MEM: "1Gi"}, {MEM: "2Gi"}))
    v1 = desired_state(ctx("BE", s, policy=pol, c=caps(**{"memory.soft_limit_in_bytes": True}))).intent
    assert {k: v for k, v in v1.values.items() if k.startswith("memory.")} == {
        "memory.limit_in_bytes": 2 << 30,
        "memory.soft_limit_in_bytes": 1 << 29,
    }
    assert v1.why["memory.soft_limit_in_bytes"].endswith("; v1 soft limit in place of memory.low")
    none = desired_state(ctx("BE", s, policy=pol)).intent.values
    assert not any(k.startswith("memory.") and k != "memory.limit_in_bytes" for k in none)
    v2 = desired_state(ctx("BE", s, policy=pol, c=V2)).intent.values
    assert v2["memory.oom.group"] == 0 and v2["memory.high"] == 3 << 29 and "memory.soft_limit_in_bytes" not in v2


# block I/O -------------------------------------------------------------------------------------


def test_blkio_weights_and_throttles(monkeypatch: pytest.MonkeyPatch) -> None:
    """The device is resolved from /dev (a machine may have no block device): resolved here to
    a fixed MAJOR:MINOR so the formulas are checked everywhere."""
    monkeypatch.setattr(blkio, "resolve_device", lambda name: {"/dev/vda": "253:0", "/dev/sdb": "8:16"}.get(name))
    blocks = [
        {"name": "vg0", "type": "volumegroup", "ioCfg": {"readBPS": 9}},  # skipped, not the end
        {"name": "/dev/none", "ioCfg": {"readBPS": 7}},  # not resolved: skipped, not the end
        {
            "name": "/dev/vda",
            "ioCfg": {"readBPS": 1048576, "writeBPS": 2, "readIOPS": 3, "writeIOPS": 4, "ioWeightPercent": 1},
        },
        {"name": "/dev/sdb", "ioCfg": {"readBPS": 0, "ioWeightPercent": 100}},
    ]
    pol = Policy.model_validate({"resourceQOSStrategy": {"beClass": {"blkioQOS": {"enable": True, "blocks": blocks}}}})
    c = caps(**{"blkio.weight": True})
    c.controllers = ["blkio", "cpu"]
    intent = Intent()
    blkio.desired(ctx("BE", policy=pol, c=c), intent)
    assert {(s.resource, s.device): s.value for s in intent.settings()} == {
        ("blkio.throttle.read_bps_device", "253:0"): 1048576,
        ("blkio.throttle.write_bps_device", "253:0"): 2,
        ("blkio.throttle.read_iops_device", "253:0"): 3,
        ("blkio.throttle.write_iops_device", "253:0"): 4,
        ("blkio.weight", ""): 1000,  # ioWeightPercent x 10, the last block's
    }
    assert intent.files[("blkio.throttle.read_bps_device", "253:0")].why == "BE: readBPS on /dev/vda (253:0)"
    assert intent.files[("blkio.weight", "")].why == "BE: ioWeightPercent 100"
    one = Policy.model_validate(
        {"resourceQOSStrategy": {"beClass": {"blkioQOS": {"enable": True, "blocks": blocks[:3]}}}}
    )
    first = Intent()
    blkio.desired(ctx("BE", policy=one, c=c), first)
    assert first.get("blkio.weight") == 10
    for off in (ctx("LS", policy=pol, c=c), ctx("BE", policy=pol, c=c, container=False), ctx("BE", policy=pol)):
        nothing = Intent()
        blkio.desired(off, nothing)
        assert nothing.values == {} and nothing.settings() == []
    noweight = Intent()
    blkio.desired(ctx("BE", policy=one, c=_blkio_caps(weight=False)), noweight)
    assert noweight.get("blkio.weight") is None and noweight.get("blkio.throttle.read_bps_device", "253:0") == 1048576


def _blkio_caps(weight: bool) -> Capabilities:
    c = caps(**{"blkio.weight": weight})
    c.controllers = ["blkio"]
    return c


def test_resolve_device_only_takes_block_devices_under_dev(tmp_path: Path) -> None:
    blkio.resolve_device.cache_clear()
    (tmp_path / "null").symlink_to("/dev/null")  # under /dev, but a character device
    (tmp_path / "passwd").symlink_to("/etc/passwd")
    for name in (str(tmp_path / "null"), str(tmp_path / "passwd"), "/dev/null", "/dev/nonexistent", "/etc/passwd"):
        assert blkio.resolve_device(name) is None
    for dev in sorted(Path("/sys/class/block").glob("*")):
        node = Path("/dev") / dev.name
        if node.exists() and (dev / "dev").exists():
            assert blkio.resolve_device(str(node)) == (dev / "dev").read_text().strip()
            link = tmp_path / "link"
            link.symlink_to(node)
            assert blkio.resolve_device(str(link)) == (dev / "dev").read_text().strip()
            return
    pytest.skip("no block device node on this machine: resolution of a real one not checked")


# resctrl ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("qos", "group"), [("LSE", "koordlet-LSR"), ("LSR", "koordlet-LSR"), ("LS", "koordlet-LS"), ("BE", "koordlet-BE")]
)
def test_resctrl_groups_are_koordinators(qos: str, group: str) -> None:
    assert resctrl.group_name(qos) == group
    pol = {
        "resourceQOSStrategy": {
            k: {"resctrlQOS": {"enable": True, "catRangeEndPercent": 30, "mbaPercent": 60}}
            for k in ("lsrClass", "lsClass", "beClass")
        }
    }
    c = caps()
    c.resctrl.mounted = True
    intent = Intent()
    resctrl.desired(ctx(qos, policy=Policy.model_validate(pol), c=c), intent)
    assert intent.resctrl_group is not None and intent.resctrl_group.value == group
    assert intent.resctrl_group.why == "L3 ways 0-30%, memory bandwidth 60%" and intent.rdt_class is None
    rdt = Intent()
    resctrl.desired(ctx(qos, policy=Policy.model_validate({**pol, "resctrlRuntimeClasses": True}), c=c), rdt)
    assert rdt.rdt_class == group
    for off in (
        ctx(qos, policy=Policy.model_validate(pol)),
        ctx(qos, policy=Policy.model_validate(pol), c=c, container=False),
        ctx(qos, c=c),
    ):
        nothing = Intent()
        resctrl.desired(off, nothing)
        assert nothing.resctrl_group is None and nothing.rdt_class is None


# quantities ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1", 1),
        ("500m", Decimal("0.5")),
        ("1n", Decimal("1e-9")),
        ("1u", Decimal("1e-6")),
        ("1k", 1000),
        ("1M", 10**6),
        ("1G", 10**9),
        ("1T", 10**12),
        ("1P", 10**15),
        ("1E", 10**18),
        ("1Ki", 1024),
        ("1Mi", 1 << 20),
        ("1Gi", 1 << 30),
        ("1Ti", 1 << 40),
        ("1Pi", 1 << 50),
        ("1Ei", 1 << 60),
        ("1.5Gi", 3 << 29),
        ("2e3", 2000),
        ("2E3", 2000),
        ("1e-3", Decimal("0.001")),
        ("+5", 5),
        ("-5", -5),
        (".5", Decimal("0.5")),
        ("5.", 5),
        (" 7 ", 7),
        (12, 12),
    ],
)
def test_quantities_as_kubernetes_reads_them(text: str | int, value: Decimal | int) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("bad", ["", "1kk", "Mi", "1 k", "0x10", "1e1000", "1ki", "1.2.3", "e3", "1K"])
def test_quantities_kubernetes_refuses(bad: str) -> None:
    with pytest.raises(ValueError, match=f"^not a quantity: {re.escape(repr(bad))}$"):
        parse_quantity(bad)


def test_quantity_errors_name_the_problem() -> None:
    for bad, name in ((True, "bool"), (None, "NoneType"), (1.5, "float"), ([1], "list")):
        with pytest.raises(ValueError, match=f"^expected a quantity string, got {name}$"):
            parse_quantity(bad)
    assert parse_quantity("1" * 64) > 10**63  # 64 characters are taken
    with pytest.raises(ValueError, match=r"^quantity too long$"):
        parse_quantity("1" * 65)
    with pytest.raises(ValueError, match=r"^not a quantity: '1111111111111111111111111111111111111111'$"):
        parse_quantity("1" * 50 + "x")


def test_resctrl_join_moves_only_tasks_not_there(tmp_path: Path) -> None:
    """Several threads: the group's task list is read once and only the missing ones written.
    One thread (a new container's first task, never in the group yet) is written at once."""
    root = resctrl_tree(tmp_path)
    (root / "schemata").write_text("L3:0=7ff\nMB:0=100\n")
    fs = ResctrlFS(root, resctrl_probe(root))
    pol = Policy.model_validate({"resourceQOSStrategy": {"beClass": {"resctrlQOS": {"enable": True}}}})
    tasks = root / "koordlet-BE" / "tasks"
    tasks.parent.mkdir()  # as the kernel makes it on mkdir: an empty task list
    tasks.write_text("")
    cfg = pol.class_qos("BE").resctrlQOS
    schemata = fs.schemata(cfg.catRangeStartPercent, cfg.catRangeEndPercent, cfg.mbaPercent)
    fs.join("koordlet-BE", schemata, [10])
    assert (root / "koordlet-BE" / "schemata").read_text() == "L3:0=7ff\nMB:0=100\n"
    assert tasks.read_text() == "10\n"
    fs.join("koordlet-BE", schemata, [10, 11])
    assert tasks.read_text() == "10\n11\n"
    fs.join("koordlet-BE", schemata, [10, 11, 12])
    assert tasks.read_text() == "10\n11\n12\n"
    fs.join("koordlet-BE", schemata, [12])  # one thread: written without reading the list
    assert tasks.read_text() == "10\n11\n12\n12\n"


LONG = "p" * 50


@pytest.mark.parametrize(
    ("override", "why"),
    [
        ('"auto"', "expected a JSON object"),
        ("[1]", "expected a JSON object"),
        ('{"policy": "bogus"}', "policy 'bogus' is not one of none, cpuBurstOnly, cfsQuotaBurstOnly, auto"),
        (f'{{"policy": "{LONG}"}}', f"policy {LONG[:40]!r} is not one of none, cpuBurstOnly, cfsQuotaBurstOnly, auto"),
        ('{"cpuBurstPercent": 0}', "cpuBurstPercent '0' is not an integer in [1, 10000]"),
        ('{"cpuBurstPercent": true}', "cpuBurstPercent 'True' is not an integer in [1, 10000]"),
        (f'{{"cpuBurstPercent": "{LONG}"}}', f"cpuBurstPercent {LONG[:40]!r} is not an integer in [1, 10000]"),
    ],
)
def test_cpu_burst_annotation_errors_say_what_is_wrong(override: str, why: str) -> None:
    out = desired_state(ctx("LS", {cpu_burst.ANNOTATION: override}, quota=40000))
    assert out.failed == [("cpuBurst", f"{cpu_burst.ANNOTATION}: {why}")]


def test_memory_qos_values_are_integers_and_edges() -> None:
    """A float would be written as "4096.0", which the kernel refuses: every value is an int."""
    on = {"enable": True, "minLimitPercent": 33, "lowLimitPercent": 33, "throttlingPercent": 33, "oomKillGroup": 1}
    pol = Policy.model_validate({"resourceQOSStrategy": {"beClass": {"memoryQOS": on}, "lsrClass": {"memoryQOS": on}}})
    v = desired_state(ctx("BE", spec(main=({MEM: "3Gi"}, {MEM: "7Gi"})), policy=pol, c=V2)).intent
    mem = {s.resource: s.value for s in v.settings() if s.resource.startswith("memory.")}
    assert all(type(x) is int for x in mem.values()), mem
    assert v.why["memory.oom.group"] == "oomKillGroup"
    # a request of one byte still counts (values round down to 0), a limit of one byte too
    one = desired_state(ctx("BE", spec(main=({MEM: "1"}, {MEM: "8Ki"})), policy=pol, c=V2)).intent
    assert one.get("memory.min") == 0 and one.get("memory.low") == 0
    lsr = ctx("LSR", policy=pol, c=V2)
    assert lsr.container is not None
    lsr.container.linux.resources.memory.limit.value = 1
    assert desired_state(lsr).intent.get("memory.min") == 0


def test_memory_qos_batch_request_with_the_runtimes_limit() -> None:
    """BE: the request from batch-memory; the limit from batch-memory, else the runtime's."""
    on = {"enable": True, "throttlingPercent": 50}
    pol = Policy.model_validate({"resourceQOSStrategy": {"beClass": {"memoryQOS": on}, "lsClass": {"memoryQOS": on}}})
    c = ctx("BE", spec(main=({MEM: "1Gi"}, {})), policy=pol, c=V2)
    assert c.container is not None
    c.container.linux.resources.memory.limit.value = 3 << 30
    assert desired_state(c).intent.get("memory.high") == 2 << 30
    # batch-memory is BE's: an LS container's batch annotation is not its request
    ls = ctx("LS", spec(main=({MEM: "1Gi"}, {MEM: "3Gi"})), policy=pol, c=V2)
    assert desired_state(ls).intent.get("memory.high") is None


N70 = "n" * 70
BAD_BATCH = [
    ("[]", 'expected {"containers": {NAME: {...}}}'),
    ('{"containers": [1]}', 'expected {"containers": {NAME: {...}}}'),
    (json.dumps({"containers": {N70: 5}}), f"containers.{N70[:64]} is not an object"),
    (json.dumps({"containers": {"m": {"limits": [1]}}}), "containers.m.limits is not an object"),
    (json.dumps({"containers": {N70: {"limits": [1]}}}), f"containers.{N70[:64]}.limits is not an object"),
    (
        json.dumps({"containers": {N70: {"limits": {MEM: "-1"}}}}),
        f"containers.{N70[:64]}.limits.{MEM}='-1' out of range",
    ),
    (json.dumps({"containers": {"m": {"requests": "x"}}}), "containers.m.requests is not an object"),
    (
        json.dumps({"containers": {N70: {"requests": {CPU: "1x"}}}}),
        f"containers.{N70[:64]}.requests.{CPU}: not a quantity: '1x'",
    ),
    (json.dumps({"containers": {"m": {"limits": {MEM: "-1"}}}}), f"containers.m.limits.{MEM}='-1' out of range"),
    (json.dumps({"containers": {"m": {"limits": {CPU: "0.5"}}}}), f"containers.m.limits.{CPU}='0.5' out of range"),
    (
        json.dumps({"containers": {"m": {"limits": {CPU: "1" * 50}}}}),
        f"containers.m.limits.{CPU}='{'1' * 39} out of range",  # the value's repr, cut at 40
    ),
    (
        json.dumps({"containers": {"m": {"limits": {CPU: 2**30 + 1}}}}),
        f"containers.m.limits.{CPU}={2**30 + 1} out of range",
    ),
]


@pytest.mark.parametrize(("raw", "why"), BAD_BATCH)
def test_batch_annotation_errors_say_what_is_wrong(raw: str, why: str) -> None:
    assert desired_state(ctx("BE", {SPEC: raw})).failed == [("batchResource", f"{SPEC}: {why}")]


def test_batch_annotation_edges() -> None:
    ok = {"containers": {"m": {"requests": {CPU: 1073741824, MEM: 2**62}, "limits": None}}}
    assert batch.container_batch(ctx("BE", {SPEC: json.dumps(ok)}), "m") == ({CPU: 1073741824, MEM: 2**62}, {})
    assert batch.container_batch(ctx("BE", {SPEC: '{"other": 1}'}), "m") is None  # no containers: none for m
    many: dict[str, dict[str, object]] = {"containers": {f"{i}": {} for i in range(300)}}  # under 16 KiB
    c = ctx("BE", {SPEC: json.dumps(many)})
    assert batch.container_batch(c, "255") == ({}, {})
    assert batch.container_batch(c, "256") is None  # at most 256 containers are read
    assert batch.container_batch(ctx("BE", {SPEC: json.dumps({"containers": {"7": {}}})}), "7") == ({}, {})
