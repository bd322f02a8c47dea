"""What a NodeSLO has that nriplugin does not use, kept while it is in force (issue 55, item 2):
the rule cache holds each source's notes; the agent shows the unused fields as
``nriplugin_policy_unused_field{field}`` (doctor reads them); ``explain`` with a NodeSLO as the
policy names them; the NodeSLO source hands them over and a deleted NodeSLO takes them away."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nriplugin.agent.assembly import Agent
from nriplugin.cluster.nodeslo import NodeSLOSource
from nriplugin.obs.metrics import Metrics
from nriplugin.policy.cache import PolicyError, RuleCache
from nriplugin.policy.model import Policy
from nriplugin.policy.nodeslo import API_VERSION, UNUSED_FIELDS, unused_fields

NODE = "node-1"
# cpuSuppressThresholdPercent is used; the page cache limit and cgroupRoot are not (docs/slo.md)
SPEC = {
    "resourceUsedThresholdWithBE": {"cpuSuppressThresholdPercent": 55},
    "resourceQOSStrategy": {
        "lsClass": {"memoryQOS": {"pageCacheEnable": True}},
        "cgroupRoot": {"memoryQOS": {"enable": True}},
    },
}


def nodeslo(spec: dict[str, object], rv: str = "1") -> dict[str, object]:
    meta = {"name": NODE, "resourceVersion": rv}
    return {"apiVersion": API_VERSION, "kind": "NodeSLO", "metadata": meta, "spec": spec}


def test_the_unused_fields_are_read_back_from_the_notes() -> None:
    notes = [f"NodeSLO x (resourceVersion 3): {UNUSED_FIELDS}: spec.a.b, spec.c", "NodeSLO x: other: y"]
    assert unused_fields(notes) == ["spec.a.b", "spec.c"]
    assert unused_fields([]) == []


def test_the_rule_cache_keeps_each_sources_notes_while_it_is_in_force() -> None:
    rules = RuleCache()
    told: list[tuple[str, ...]] = []
    rules.subscribe_notes(told.append)
    rules.set(Policy(), "file.yaml", ["base note"])
    rules.set_layer(lambda p: p, "NodeSLO n", ["layer note"])
    assert rules.notes == ("file.yaml: base note", "NodeSLO n: layer note")
    rules.set_layer(lambda p: p, "NodeSLO n", ["layer note"])  # the same: nobody told again
    assert len(told) == 2

    def bad(p: Policy) -> Policy:
        raise PolicyError("does not fit")

    with pytest.raises(PolicyError):
        rules.set_layer(bad, "NodeSLO m", ["other"])
    assert rules.notes == ("file.yaml: base note", "NodeSLO n: layer note")  # refused: notes stay
    rules.set_layer(None)
    assert list(rules.notes) == ["file.yaml: base note"]
    assert told[-1] == ("file.yaml: base note",)


def test_the_nodeslo_source_hands_its_notes_over_and_takes_them_away() -> None:
    rules = RuleCache()
    source = NodeSLOSource(rules, NODE)
    source.apply(nodeslo(SPEC))
    fields = unused_fields(rules.notes)
    assert any("pageCacheEnable" in f for f in fields) and any("cgroupRoot" in f for f in fields)
    assert not any("cpuSuppressThresholdPercent" in f for f in fields)
    source.apply(nodeslo({"resourceUsedThresholdWithBE": {"cpuSuppressThresholdPercent": 45}}, rv="2"))
    assert unused_fields(rules.notes) == []
    source.apply(nodeslo(SPEC, rv="3"))
    source.absent()
    assert rules.notes == ()


def test_the_agent_shows_the_unused_fields_as_a_metric() -> None:
    rules, metrics = RuleCache(), Metrics()
    Agent.follow_unused(metrics, rules)
    source = NodeSLOSource(rules, NODE)
    source.apply(nodeslo(SPEC))
    shown = {
        s.labels["field"]
        for fam in metrics.registry.collect()
        if fam.name == "nriplugin_policy_unused_field"
        for s in fam.samples
        if s.value == 1
    }
    assert shown == set(unused_fields(rules.notes)) and shown
    source.absent()
    gone = [s for fam in metrics.registry.collect() if fam.name == "nriplugin_policy_unused_field" for s in fam.samples]
    assert gone == []


def test_explain_names_what_a_nodeslo_policy_does_not_use(tmp_path: Path) -> None:
    desc = tmp_path / "pod.yaml"
    desc.write_text("pod:\n  labels: {koordinator.sh/qosClass: BE}\ncontainers:\n  - name: main\n")
    policy = tmp_path / "nodeslo.yaml"
    policy.write_text(json.dumps(nodeslo(SPEC)))
    r = subprocess.run(
        [sys.executable, "-m", "nriplugin", "explain", str(desc), "--policy", str(policy), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    notes = json.loads(r.stdout)["policyNotes"]
    assert any("pageCacheEnable" in f for f in unused_fields(notes)), notes
    assert all(n.startswith(str(policy)) for n in notes)


def test_koord_managers_zero_total_bandwidth_is_not_set_and_not_noted() -> None:
    """koord-manager's default NodeSLO writes ``totalNetworkBandwidth: "0"``, Koordinator's "not
    set" (koordlet then reads the NIC's speed): neither a note on every Koordinator cluster nor a
    node of zero bandwidth."""
    rules = RuleCache()
    source = NodeSLOSource(rules, NODE)
    for rv, zero in enumerate(("0", 0, "0M")):
        source.apply(nodeslo({"systemStrategy": {"totalNetworkBandwidth": zero}}, rv=str(rv)))
        assert rules.notes == () and rules.policy.systemStrategy.total_bits() is None
    source.apply(nodeslo({"systemStrategy": {"totalNetworkBandwidth": "100M"}}, rv="9"))
    assert rules.policy.systemStrategy.total_bits() == 100_000_000
