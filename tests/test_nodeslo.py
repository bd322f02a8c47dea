"""NodeSLO compatibility, tried as a new user would: a NodeSLO using any field of Koordinator's
current CRD is accepted (what nriplugin does not implement is named as not used), only what
the CRD itself rejects is refused, and the plugin's own format stays strict."""

from __future__ import annotations

import hashlib
import random
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from nriplugin.policy.cache import PolicyError, RuleCache, parse
from nriplugin.policy.model import Policy
from nriplugin.policy.nodeslo import API_VERSION, NodeSLOError, crd_schema, from_nodeslo, own_sections

CRD_DIR = Path(__file__).resolve().parent.parent / "nriplugin" / "policy" / "crd"
QUANTITIES = ("100M", "1Gi", "10", "0.5", "250m", "1e3")
WORDS = ("none", "auto", "cpuset", "cfsQuota", "device", "volumegroup", "podvolume", "tc", "coreSched", "x")

# The fields of Koordinator's CRD that issue 11 names as not implemented (26 in all).
ISSUE_26 = (
    "networkQOS",
    "policies.netQOSPolicy",
    "resourceQOSStrategy.cgroupRoot",
    *(
        f"memoryQOS.{f}"
        for f in ("pageCacheEnable", "pageCacheLimitPercent", "pageCacheLimitSize", "pageCacheReclaimSync")
    ),
    *(
        f"ioCfg.{f}"
        for f in (
            "readLatency",
            "writeLatency",
            "readLatencyPercent",
            "writeLatencyPercent",
            "enableUserModel",
            "modelReadBPS",
            "modelWriteBPS",
            "modelReadSeqIOPS",
            "modelWriteSeqIOPS",
            "modelReadRandIOPS",
            "modelWriteRandIOPS",
        )
    ),
    *(
        f"resourceUsedThresholdWithBE.{f}"
        for f in (
            "cpuEvictThresholdPercent",
            "cpuEvictLowerPercent",
            "evictEnabledPriorityThreshold",
            "allocatableEvictPriorityThreshold",
            "cpuAllocatableEvictLowerPercent",
            "cpuAllocatableEvictThresholdPercent",
            "memoryAllocatableEvictLowerPercent",
            "memoryAllocatableEvictThresholdPercent",
        )
    ),
)


def generate(schema: dict[str, Any], rng: random.Random) -> Any:
    """A value the schema accepts, with every property present (schema-driven, so a field the
    CRD gains is covered without touching this test)."""
    if "anyOf" in schema:  # x-kubernetes-int-or-string
        rest = {k: v for k, v in schema.items() if k != "anyOf"}  # e.g. a pattern beside it
        return generate({**rest, **rng.choice(schema["anyOf"])}, rng)
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        if "properties" in schema:
            return {k: generate(v, rng) for k, v in schema["properties"].items()}
        if isinstance(schema.get("additionalProperties"), dict):
            return {f"key{i}": generate(schema["additionalProperties"], rng) for i in range(2)}
        return {"anything": {"nested": [1, "two"]}}  # free-form (preserve-unknown-fields)
    if kind == "array":
        return [generate(schema["items"], rng) for _ in range(2)]
    if kind == "integer":
        bits = 31 if schema.get("format") == "int32" else 40
        lo = schema.get("minimum", rng.choice((-(1 << bits), -1000, -1)))
        hi = schema.get("maximum", rng.choice((1 << bits, 100000, 100)))
        return rng.randint(lo, max(lo, hi))
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "string":
        if "pattern" in schema:
            fits = [q for q in QUANTITIES if re.fullmatch(schema["pattern"], q)]
            assert fits, f"teach the generator a string for pattern {schema['pattern']}"
            return rng.choice(fits)
        return rng.choice((*WORDS, f"w{rng.randint(0, 999)}"))
    raise AssertionError(f"teach the generator the schema {schema}")


def leaves(schema: dict[str, Any], path: str = "") -> list[str]:
    """Every field of the schema, as dotted paths (list items as ``[]``)."""
    if "properties" in schema:
        return [leaf for k, v in schema["properties"].items() for leaf in leaves(v, f"{path}.{k}" if path else k)]
    if schema.get("type") == "array":
        return leaves(schema["items"], f"{path}[]")
    return [path]


def every_field_nodeslo(seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    schema = crd_schema()
    doc = generate(schema, rng)
    doc.update(apiVersion=API_VERSION, kind="NodeSLO", metadata={"name": "node-1", "resourceVersion": "7"})
    jsonschema.Draft4Validator(schema).validate(doc)  # the generator's own check, by the plain CRD
    return dict(doc)


def not_used(notes: list[str]) -> list[str]:
    head = "NodeSLO fields not used by nriplugin: "
    listed = [n for n in notes if n.startswith(head)]
    assert len(listed) == 1, notes  # named once, in one note
    return listed[0][len(head) :].split(", ")


def used_by_model(path: str) -> bool:
    """Whether the policy model has the field at ``path`` (classes share one shape)."""
    from nriplugin.policy.nodeslo import _submodel

    model: Any = Policy
    for part in path.replace("[]", "").split("."):
        if model is None or part not in model.model_fields:
            return False
        model = _submodel(model.model_fields[part].annotation)
    return True


def test_the_crd_is_the_recorded_upstream_version() -> None:
    readme = (CRD_DIR / "README.md").read_text()
    digest = hashlib.sha256((CRD_DIR / "slo.koordinator.sh_nodeslos.yaml").read_bytes()).hexdigest()
    assert f"{digest}  slo.koordinator.sh_nodeslos.yaml" in readme, "the vendored CRD differs from the recorded version"
    assert "Apache License" in (CRD_DIR / "LICENSE").read_text() and "Apache-2.0" in readme
    crd = yaml.safe_load((CRD_DIR / "slo.koordinator.sh_nodeslos.yaml").read_text())
    assert crd["spec"]["names"]["kind"] == "NodeSLO" and crd["spec"]["scope"] == "Cluster"


@pytest.mark.parametrize("seed", range(6))
def test_a_nodeslo_with_every_field_of_the_crd_is_accepted(seed: int) -> None:
    doc = every_field_nodeslo(seed)
    spec_fields = leaves(crd_schema()["properties"]["spec"])
    assert len(spec_fields) > 200  # every field is in the document (the generator fills them all)
    policy, notes = parse(yaml.safe_dump(doc), "nodeslo.yaml")  # accepted: no PolicyError
    unused = not_used(notes)
    # Every field of the CRD is either used (the model has it) or named as not used.
    for field in spec_fields:
        named = any(re.match(re.escape(u.removeprefix("spec.")) + r"($|\.|\[)", field) for u in unused)
        assert used_by_model(field) != named, field
    # The 26 fields the issue lists are named (unless the model has since learnt one).
    for name in ISSUE_26:
        hits = [u for u in unused if u == f"spec.{name}" or u.endswith(f".{name}")]
        assert hits or any(
            used_by_model(p + name) for p in ("resourceQOSStrategy.lsClass.", "resourceQOSStrategy.", "")
        ), name
    # What is used takes effect where nriplugin can use the value.
    spec = doc["spec"]
    th = spec["resourceUsedThresholdWithBE"]
    assert policy.resourceUsedThresholdWithBE.cpuSuppressThresholdPercent == th["cpuSuppressThresholdPercent"]
    assert policy.resourceUsedThresholdWithBE.memoryEvictThresholdPercent == th["memoryEvictThresholdPercent"]
    assert (
        policy.resourceQOSStrategy.lsClass.cpuQOS.enable == spec["resourceQOSStrategy"]["lsClass"]["cpuQOS"]["enable"]
    )
    wmark = spec["resourceQOSStrategy"]["beClass"]["memoryQOS"]["wmarkRatio"]
    assert policy.resourceQOSStrategy.beClass.memoryQOS.wmarkRatio == wmark


def test_a_value_the_crd_allows_but_nriplugin_cannot_use_is_noted_and_the_base_stays() -> None:
    base = Policy.model_validate({"cpuBurstStrategy": {"cpuBurstPercent": 500}})
    doc = {
        "apiVersion": API_VERSION,
        "kind": "NodeSLO",
        "spec": {
            "cpuBurstStrategy": {"cpuBurstPercent": 0, "cfsQuotaBurstPercent": 200},
            "resourceQOSStrategy": {"beClass": {"cpuQOS": {"groupIdentity": 7}}},
        },
    }
    policy, notes = from_nodeslo(doc, base)
    assert policy.cpuBurstStrategy.cpuBurstPercent == 500 and policy.cpuBurstStrategy.cfsQuotaBurstPercent == 200
    assert policy.resourceQOSStrategy.beClass.cpuQOS.groupIdentity == -1  # the default
    text = "\n".join(notes)
    assert "spec.cpuBurstStrategy.cpuBurstPercent" in text and "(got 0); not used" in text
    assert "spec.resourceQOSStrategy.beClass.cpuQOS.groupIdentity" in text


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"cpuBurstStrategy": {"cpuBurstPercent": 20000}}, "spec.cpuBurstStrategy.cpuBurstPercent: 20000 is greater"),
        ({"resourceQOSStrategy": {"lsClass": {"memoryQOS": {"wmarkMinAdj": -30}}}}, "memoryQOS.wmarkMinAdj"),
        ({"resourceQOSStrategy": {"beClass": {"memoryQOS": {"pageCacheLimitPercent": 101}}}}, "pageCacheLimitPercent"),
        ({"resourceQOSStrategy": {"beClass": {"cpuQOS": {"groupIdentity": "high"}}}}, "cpuQOS.groupIdentity: 'high'"),
        (
            {"resourceQOSStrategy": {"beClass": {"cpuQOS": {"enabel": True}}}},
            "spec.resourceQOSStrategy.beClass.cpuQOS.enabel",
        ),
        ({"resourceUsedThresholdWithBE": {"evictEnabledPriorityThreshold": 1 << 31}}, "int32 range"),
        ({"systemStrategy": {"totalNetworkBandwidth": "lots"}}, "spec.systemStrategy.totalNetworkBandwidth"),
        (
            {"resourceQOSStrategy": {"lsClass": {"networkQOS": {"egressLimit": [1]}}}},
            "networkQOS.egressLimit: expected",
        ),
        (
            {"resourceQOSStrategy": {"lsClass": {"blkioQOS": {"blocks": [{"ioCfg": {"modelReadBPS": 0}}]}}}},
            "blkioQOS.blocks[0].ioCfg.modelReadBPS",
        ),
        ([], "spec: [] is not of type 'object'"),
    ],
)
def test_what_the_crd_rejects_is_refused_with_the_field_named(spec: Any, field: str, tmp_path: Path) -> None:
    good = tmp_path / "nodeslo.yaml"
    good.write_text(yaml.safe_dump({"kind": "NodeSLO", "spec": {"cpuBurstStrategy": {"cpuBurstPercent": 400}}}))
    cache = RuleCache()
    cache.load_file(good)
    good.write_text(yaml.safe_dump({"apiVersion": API_VERSION, "kind": "NodeSLO", "spec": spec}))
    with pytest.raises(PolicyError, match=re.escape(field)):
        cache.load_file(good)
    assert cache.rejected == 1 and cache.policy.cpuBurstStrategy.cpuBurstPercent == 400  # last good kept


def test_another_api_version_is_refused() -> None:
    with pytest.raises(NodeSLOError, match="apiVersion"):
        from_nodeslo({"apiVersion": "slo.koordinator.sh/v1beta9", "kind": "NodeSLO", "spec": {}})


def test_the_plugins_own_format_stays_strict() -> None:
    """A NodeSLO field nriplugin does not implement is an error in nriplugin's own format,
    and so is a typo in the plugin's own sections inside a NodeSLO file."""
    with pytest.raises(PolicyError, match=r"resourceQOSStrategy\.lsClass\.memoryQOS\.pageCacheEnable"):
        parse("resourceQOSStrategy:\n  lsClass:\n    memoryQOS: {pageCacheEnable: true}\n")
    with pytest.raises(PolicyError, match=r"qosManager\.cpuSupress"):
        parse("kind: NodeSLO\nspec:\n  qosManager: {cpuSupress: {enabled: false}}\n")
    assert own_sections() == {
        "features",
        "beMinCPUShares",
        "resctrlRuntimeClasses",
        "qosManager",
        "beProcess",
        "containerPidsLimit",
    }
