"""The policy's qosManager section and its profiles: defaults, profiles under explicit fields,
validation messages, round trips, and CPUSuppress's worked examples."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from nriplugin.policy.cache import PolicyError, RuleCache, parse
from nriplugin.policy.document import from_document
from nriplugin.policy.model import PLUGINS, CPUPressure, NodeSLOError, Policy, QoSManagerPolicy, _cores, _seconds
from nriplugin.qos.levels import Assessor, Level, thresholds_of
from nriplugin.qos.manager import STRATEGIES

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "policy.yaml"


def runs(cfg: QoSManagerPolicy, plugin: str) -> bool:
    """Whether the manager runs the strategy registered as ``plugin`` under ``cfg``."""
    return next(s for s in STRATEGIES if s.name == plugin).runs(cfg)


def qm(text: str) -> QoSManagerPolicy:
    return parse(text, "p.yaml")[0].qosManager


def test_defaults_are_on_and_balanced() -> None:
    m = Policy().qosManager
    assert m.enable and m.profile == "balanced" and m.syncPeriod == 1.0
    c = m.cpuPressure
    assert (c.low, c.medium, c.high, c.critical, c.hysteresis, c.fallTime) == (40, 60, 75, 90, 5, 5)
    mp = m.memoryPressure
    assert (mp.low, mp.medium, mp.high, mp.critical) == (50, 70, 80, 90)
    s = m.cpuSuppress
    r = s.suppressRatio
    assert s.enabled and (r.low, r.medium, r.high, r.critical, r.emergency) == (1.0, 0.8, 0.5, 0.3, 0.1)
    assert (s.minCores, s.deadbandCores, s.raiseDelay, s.maxWritesPerMinute) == (0.1, 0.2, 2.0, 4)
    b = m.cpuBurst
    assert (b.enabled, b.burstRatio, b.partialBurstRatio, b.burstDuration, b.burstCooldown) == (True, 1.5, 1.3, 10, 30)
    assert (b.minNodeCPUIdle, b.fullBurstNodeCPUIdle) == (0.2, 0.3)
    assert (m.cpuEvict.enabled, m.cpuEvict.evictThreshold, m.cpuEvict.evictCooldown) == (True, 90, 60)
    me = m.memoryEvict
    assert (me.enabled, me.evictThreshold, me.memoryGrowthThreshold, me.oomScoreAdjust) == (True, 85, 5, 1000)
    assert m.plugins == list(PLUGINS) and all(runs(m, p) for p in PLUGINS)
    assert m.systemReserved.cpu == 0
    assert Policy().cpu_suppress_policy() == "cfsQuota"
    # The same policy however it is reached: no section, an empty one, a bare `qosManager:`.
    for text in ("", "qosManager: {}\n", "qosManager:\n", "qosManager: {profile: balanced}\n"):
        assert parse(text)[0] == Policy(), text
    assert RuleCache().current.digest == RuleCache(parse("qosManager: {profile: balanced}\n")[0]).current.digest


def test_profiles() -> None:
    lat = qm("qosManager: {profile: latency-first}\n")
    c, r = lat.cpuPressure, lat.cpuSuppress.suppressRatio
    assert (c.low, c.medium, c.high, c.critical) == (40, 50, 65, 80)
    assert (r.low, r.medium, r.high, r.critical, r.emergency) == (1.0, 0.7, 0.4, 0.2, 0.1)
    assert (lat.cpuBurst.enabled, lat.cpuBurst.burstRatio, lat.cpuBurst.minNodeCPUIdle) == (True, 2.0, 0.15)
    assert runs(lat, "CPUEvict") and lat.memoryPressure == Policy().qosManager.memoryPressure
    thr = qm("qosManager: {profile: throughput-first}\n")
    c, r = thr.cpuPressure, thr.cpuSuppress.suppressRatio
    assert (c.low, c.medium, c.high, c.critical) == (40, 70, 85, 95)
    assert (r.medium, r.high, r.critical) == (0.9, 0.7, 0.5)
    assert not thr.cpuEvict.enabled and not runs(thr, "CPUEvict") and runs(thr, "MemoryEvict")
    assert thr.cpuBurst == Policy().qosManager.cpuBurst
    assert qm("qosManager: {profile: balanced}\n") == QoSManagerPolicy() == Policy().qosManager


def test_explicit_fields_beat_the_profile() -> None:
    m = qm(
        "qosManager:\n  profile: throughput-first\n  cpuPressure: {high: 80}\n  cpuEvict: {enabled: true}\n"
        "  cpuSuppress: {suppressRatio: {critical: 0.4}}\n"
    )
    c, r = m.cpuPressure, m.cpuSuppress.suppressRatio
    assert (c.medium, c.high, c.critical) == (70, 80, 95)  # the rest of the profile still applies
    assert (r.medium, r.high, r.critical) == (0.9, 0.7, 0.4) and m.cpuEvict.enabled
    # The same from Python: a nested model contributes only the fields set on it.
    m = QoSManagerPolicy(profile="latency-first", cpuPressure=CPUPressure(critical=85))
    assert (m.cpuPressure.medium, m.cpuPressure.high, m.cpuPressure.critical) == (50, 65, 85)
    assert m.cpuSuppress.suppressRatio.medium == 0.7
    # Explicit values survive a change of profile on reload; profile values do not.
    m2 = qm("qosManager:\n  profile: latency-first\n  cpuPressure: {high: 70}\n")
    assert (m2.cpuPressure.medium, m2.cpuPressure.high, m2.cpuPressure.critical) == (50, 70, 80)


def test_durations_cores_and_plugins() -> None:
    m = qm(
        "qosManager:\n  syncPeriod: 500ms\n  cpuEvict: {evictCooldown: 1m30s}\n  cpuBurst: {burstDuration: 2.5}\n"
        "  cpuSuppress: {minCores: 250m, deadbandCores: '0.5'}\n  systemReserved: {cpu: 1.5}\n"
    )
    assert (m.syncPeriod, m.cpuEvict.evictCooldown, m.cpuBurst.burstDuration) == (0.5, 90, 2.5)
    assert (m.cpuSuppress.minCores, m.cpuSuppress.deadbandCores, m.systemReserved.cpu) == (0.25, 0.5, 1.5)
    assert qm("qosManager: {syncPeriod: 100ms}\n").syncPeriod == pytest.approx(0.1)
    assert qm("qosManager: {cpuEvict: {evictCooldown: 2h}}\n").cpuEvict.evictCooldown == 7200
    # Listed order is ignored: the plugins run in the one order.
    m = qm("qosManager: {plugins: [MemoryEvict, CPUSuppress, CPUBurst]}\n")
    assert m.plugins == ["CPUBurst", "CPUSuppress", "MemoryEvict"]
    assert runs(m, "CPUBurst") and not runs(m, "CPUEvict") and not runs(m, "NodeQOSResource")
    off = qm("qosManager: {enable: false}\n")
    assert not any(runs(off, p) for p in PLUGINS)
    assert not runs(qm("qosManager: {cpuSuppress: {enabled: false}}\n"), "CPUSuppress")
    # A burst ratio set alone is not an error about the partial ratio's default.
    b = qm("qosManager: {cpuBurst: {burstRatio: 1.2, minNodeCPUIdle: 0.4}}\n").cpuBurst
    assert (b.partialBurstRatio, b.fullBurstNodeCPUIdle) == (1.2, 0.4)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "qosManager: {cpuPressure: {medium: 30}}",
            "qosManager.cpuPressure: Value error, thresholds must increase: low (40) < medium (30) < high (75)",
        ),
        ("qosManager: {memoryPressure: {critical: 101}}", "qosManager.memoryPressure.critical: Input should be less"),
        ("qosManager: {memoryPressure: {high: 95}}", "medium (70) < high (95) < critical (90)"),
        (
            "qosManager: {cpuSuppress: {suppressRatio: {medium: 0}}}",
            "qosManager.cpuSuppress.suppressRatio.medium: Input should be greater than 0 (got 0)",
        ),
        (
            "qosManager: {cpuSuppress: {suppressRatio: {emergency: 1.5}}}",
            "qosManager.cpuSuppress.suppressRatio.emergency: Input should be less than or equal to 1 (got 1.5)",
        ),
        ("qosManager: {cpuSuppress: {suppressRatio: {high: 0.9}}}", "medium (0.8) >= high (0.9)"),
        ("qosManager: {cpuSuppress: {minCores: 0}}", "qosManager.cpuSuppress.minCores: Input should be greater than 0"),
        ("qosManager: {cpuSuppress: {policy: quota}}", "qosManager.cpuSuppress.policy"),
        ("qosManager: {plugins: [CPUSuppress, CPUThrottle]}", "qosManager.plugins.1: Input should be"),
        ("qosManager: {plugins: [CPUSuppress, CPUThrottle]}", '(got "CPUThrottle")'),
        ("qosManager: {plugins: [CPUBurst, CPUBurst]}", "qosManager.plugins: Value error, listed more than once"),
        ("qosManager: {syncPeriod: 5x}", "qosManager.syncPeriod: Value error, not a duration: '5x'"),
        ("qosManager: {syncPeriod: '5'}", "qosManager.syncPeriod: Value error, not a duration: '5'"),
        ("qosManager: {syncPeriod: '-1s'}", "not a duration: '-1s'"),
        ("qosManager: {syncPeriod: 90s}", 'syncPeriod: Input should be less than or equal to 60 (got "90s")'),
        ("qosManager: {syncPeriod: 10ms}", "qosManager.syncPeriod: Input should be greater than or equal to 0.1"),
        ("qosManager: {syncPeriod: true}", "qosManager.syncPeriod: Value error, expected seconds"),
        ("qosManager: {profile: fast}", "qosManager.profile: Input should be 'latency-first', 'throughput-first'"),
        ("qosManager: {cpuBurst: {burstRatio: 0.5}}", "qosManager.cpuBurst.burstRatio: Input should be greater"),
        (
            "qosManager: {cpuBurst: {burstRatio: 1.2, partialBurstRatio: 1.4}}",
            "partialBurstRatio (1.4) exceeds burstRatio (1.2)",
        ),
        ("qosManager: {cpuBurst: {minNodeCPUIdle: 1.5}}", "qosManager.cpuBurst.minNodeCPUIdle"),
        ("qosManager: {memoryEvict: {oomScoreAdjust: 1001}}", "qosManager.memoryEvict.oomScoreAdjust"),
        ("qosManager: {syncPerod: 1s}", "qosManager.syncPerod: Extra inputs are not permitted"),
        ("qosManager: {systemReserved: {cpu: 2 cores}}", "qosManager.systemReserved.cpu: Value error, not a CPU"),
        ("qosManager: [a]", "qosManager: Input should be a valid dictionary"),
    ],
)
def test_bad_values_are_refused_by_name(text: str, message: str) -> None:
    with pytest.raises(PolicyError, match=re.escape(message)):
        parse(text + "\n", "p.yaml")


def test_round_trip_through_yaml_and_the_rule_cache(tmp_path: Path) -> None:
    p, _ = parse("qosManager:\n  profile: latency-first\n  cpuPressure: {high: 70}\n  syncPeriod: 250ms\n")
    dumped = yaml.safe_dump(p.model_dump())
    again, _ = parse(dumped)
    assert again == p and Policy.model_validate(p.model_dump()) == p
    cache = RuleCache()
    f = tmp_path / "policy.yaml"
    f.write_text("qosManager:\n  profile: latency-first\n  cpuPressure: {high: 70}\n  syncPeriod: 250ms\n")
    v = cache.load_file(f)
    assert v.version == 2 and cache.policy.qosManager == p.qosManager
    f.write_text(dumped)  # the same policy, spelled out: the same version
    assert cache.load_file(f).version == 2
    f.write_text("qosManager: {cpuSuppress: {suppressRatio: {medium: 2}}}\n")
    with pytest.raises(PolicyError, match=r"qosManager\.cpuSuppress\.suppressRatio\.medium"):
        cache.load_file(f)
    assert cache.current.version == 2 and cache.policy.qosManager.profile == "latency-first"
    f.write_text("qosManager: {enable: false}\n")  # switched off on reload
    assert cache.load_file(f).version == 3 and not runs(cache.policy.qosManager, "CPUSuppress")


def test_nodeslo_suppress_policy_is_the_fallback() -> None:
    slo = (
        "apiVersion: slo.koordinator.sh/v1alpha1\nkind: NodeSLO\nspec:\n  resourceUsedThresholdWithBE:\n"
        "    enable: true\n    cpuSuppressThresholdPercent: 60\n    cpuSuppressPolicy: cpuset\n"
    )
    p, _ = parse(slo)
    assert p.cpu_suppress_policy() == "cpuset" and p.resourceUsedThresholdWithBE.cpuSuppressThresholdPercent == 60
    assert p.qosManager == Policy().qosManager
    p, _ = parse(slo + "  qosManager: {cpuSuppress: {policy: cfsQuota}}\n")
    assert p.cpu_suppress_policy() == "cfsQuota"


def test_cpusuppress_examples_from_the_default_policy() -> None:
    """available = total - LS request - system reserved, times the level's ratio."""
    m = Policy().qosManager
    th = thresholds_of(m.cpuPressure)

    def be_limit(total: float, ls_request: float, reserved: float, score: float) -> float:
        return (total - ls_request - reserved) * m.cpuSuppress.suppressRatio.of(th.level(score))

    assert be_limit(16, 6, 1, 50) == pytest.approx(7.2)  # MEDIUM
    assert be_limit(16, 6, 1, 80) == pytest.approx(2.7)  # CRITICAL
    # The 32-core production timeline: 08:00 LOW, 10:00 MEDIUM, 11:00 CRITICAL, 12:00 MEDIUM.
    timeline = [be_limit(32, 16, 2, s) for s in (25, 55, 78, 48)]
    assert timeline == pytest.approx([14, 11.2, 4.2, 11.2])
    assert [th.level(s) for s in (25, 55, 78, 48)] == [Level.LOW, Level.MEDIUM, Level.CRITICAL, Level.MEDIUM]
    assert m.cpuSuppress.suppressRatio.of(Level.EMERGENCY) == 0.1


def test_assessor_from_the_policy_follows_the_profile() -> None:
    a = Assessor.from_config(qm("qosManager: {profile: latency-first}\n").cpuPressure)
    assert a.update(0.0, 66).level == Level.CRITICAL  # latency-first: HIGH is 50-65
    b = Assessor.from_config(Policy().qosManager.cpuPressure)
    assert b.update(0.0, 66).level == Level.HIGH and b.fall_time == 5 and b.hysteresis == 5  # 60-75


def test_example_policy_loads_and_does_not_pin_the_profile() -> None:
    text = EXAMPLE.read_text()
    p, notes = parse(text, str(EXAMPLE))
    assert not notes and p.qosManager == Policy().qosManager and p.cpu_suppress_policy() == "cfsQuota"
    # Switching the example's profile moves the profile's fields: it leaves them to the profile.
    lat, _ = parse(text.replace("profile: balanced", "profile: latency-first"))
    assert lat.qosManager == qm("qosManager: {profile: latency-first}\n")


# the model's own helpers, against the references they follow ----------------------------------


def test_a_partial_policy_keeps_every_default_it_does_not_mention() -> None:
    """Deep merge: naming beClass.memoryQOS must not reset beClass.cpuQOS to CPUQOS()."""
    p, notes = from_document({"resourceQOSStrategy": {"beClass": {"memoryQOS": {"enable": True}}}})
    be = p.resourceQOSStrategy.beClass
    assert be.memoryQOS.enable and (be.cpuQOS.groupIdentity, be.cpuQOS.schedIdle) == (-1, 1) and notes == []
    assert p.resourceQOSStrategy.lsClass.cpuQOS.groupIdentity == 2
    slo = {"kind": "NodeSLO", "spec": {"resourceQOSStrategy": {"lsClass": {"cpuQOS": {"enable": False}}}}}
    p, _ = from_document(slo)
    assert not p.resourceQOSStrategy.lsClass.cpuQOS.enable and p.resourceQOSStrategy.beClass.cpuQOS.schedIdle == 1
    with pytest.raises(ValidationError):
        from_document({"features": 5})  # a scalar over a section: refused, not merged


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([1], "a policy must be a mapping, got list"),
        ("x", "a policy must be a mapping, got str"),
    ],
)
def test_documents_that_are_not_mappings(doc: object, message: str) -> None:
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        from_document(doc)


def test_a_nodeslo_spec_that_is_not_a_mapping_is_refused_by_its_crd() -> None:
    with pytest.raises(NodeSLOError, match=re.escape("spec: [1] is not of type 'object'")):
        from_document({"kind": "NodeSLO", "spec": [1]})


@pytest.mark.parametrize(
    ("plugin", "section"),
    [
        ("CPUBurst", "cpuBurst"),
        ("CPUSuppress", "cpuSuppress"),
        ("CPUEvict", "cpuEvict"),
        ("MemoryEvict", "memoryEvict"),
    ],
)
def test_a_plugin_runs_only_with_its_section_enabled(plugin: str, section: str) -> None:
    assert runs(QoSManagerPolicy(), plugin)
    assert not runs(QoSManagerPolicy.model_validate({section: {"enabled": False}}), plugin)
    assert not runs(QoSManagerPolicy.model_validate({"enable": False}), plugin)
    assert runs(QoSManagerPolicy.model_validate({section: {"enabled": False}}), "NodeQOSResource")


def test_suppress_ratio_by_level_is_clamped() -> None:
    r = Policy().qosManager.cpuSuppress.suppressRatio
    assert [r.of(level) for level in range(-2, 7)] == [1.0, 1.0, 1.0, 0.8, 0.5, 0.3, 0.1, 0.1, 0.1]


@pytest.mark.parametrize(
    ("value", "cores"), [("500m", 0.5), ("1.5", 1.5), ("2", 2.0), (" 250m ", 0.25), (3, 3), (0.5, 0.5)]
)
def test_cores_as_kubernetes_cpu_quantities(value: object, cores: float) -> None:
    assert _cores(value) == cores


def test_cores_and_durations_name_what_is_wrong() -> None:
    with pytest.raises(ValueError, match=r"^expected cores, e\.g\. 0\.5 or 500m$"):
        _cores(True)
    long = "x" * 50
    with pytest.raises(ValueError, match=f"^not a CPU quantity: {re.escape(repr(long[:40]))} "):
        _cores(long)
    with pytest.raises(ValueError, match=f"^not a duration: {re.escape(repr(long[:40]))} "):
        _seconds(long)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1m30s", 90.0),
        ("500ms", 0.5),
        ("1.5h", 5400.0),
        ("2us", 2e-6),
        ("2µs", 2e-6),
        ("3ns", 3e-9),
        (".5s", 0.5),
        (7, 7),
    ],
)
def test_durations_as_go_parses_them(text: object, seconds: float) -> None:
    """Go's time.ParseDuration units (ns, us/µs, ms, s, m, h), concatenated."""
    assert _seconds(text) == pytest.approx(seconds)
