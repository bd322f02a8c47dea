"""Koordinator's ``NodeSLO`` as a policy source, judged by Koordinator's own CRD.

A NodeSLO is first validated against the vendored CRD's openAPIV3Schema
(``crd/slo.koordinator.sh_nodeslos.yaml``): what the CRD rejects is refused whole, with the
field named, and the last good policy stays. What the CRD accepts is used where nriplugin
implements it; every field nriplugin does not implement (``networkQOS``, the ``cgroupRoot``
class, the page-cache and blkio model fields, the allocatable eviction, ...) is named once
as not used, never a reason to refuse the rest. The set of used fields is derived from the
policy model, so a field the model learns is used from then on without a list to update.

A value the CRD allows but nriplugin cannot use (``cpuBurstPercent: 0``, a
``groupIdentity`` outside -1..2, an unknown ``cpuBurstStrategy.policy``) is noted and left
out: the value underneath (the policy file's, or the default) stays. Fields that are in
neither the CRD nor the plugin's own format are refused, as an API server with strict field
validation (kubectl's default) refuses them; the plugin's own sections (``qosManager``,
``features``, ...) may ride in a NodeSLO file's spec and are validated strictly.
"""

from __future__ import annotations

import copy
import functools
import json
import types
import typing
from collections.abc import Iterable
from importlib import resources
from typing import Any

import yaml
from jsonschema import Draft4Validator, FormatChecker
from jsonschema.exceptions import ValidationError as SchemaError
from pydantic import BaseModel, ValidationError

from nriplugin.policy.model import NodeSLOError as NodeSLOError
from nriplugin.policy.model import Policy, explicit_fields
from nriplugin.policy.profiles import overlay as deep_merge

API_VERSION = "slo.koordinator.sh/v1alpha1"
CRD_FILE = "slo.koordinator.sh_nodeslos.yaml"
_INT_RANGE = {"int32": 1 << 31, "int64": 1 << 63}
UNUSED_FIELDS = "NodeSLO fields not used by nriplugin"  # the note naming what is not implemented


def unused_fields(notes: Iterable[str]) -> list[str]:
    """The fields ``overlay``'s note names as not implemented (``spec.x.y``), from notes as the
    rule cache keeps them (each led by its source) or as ``overlay`` gives them."""
    out: list[str] = []
    for note in notes:
        _, found, fields = note.partition(UNUSED_FIELDS + ": ")
        if found:
            out.extend(f for f in fields.split(", ") if f)
    return out


def values_left_out(notes: list[str]) -> list[str]:
    """Of ``overlay``'s notes, those on a value given and left out (a value the CRD allows but
    nriplugin cannot use), not the one naming fields nriplugin does not implement."""
    return [n for n in notes if not n.startswith(UNUSED_FIELDS)]


@functools.cache
def crd_schema() -> dict[str, Any]:
    """The vendored CRD's openAPIV3Schema for v1alpha1 (read once)."""
    text = resources.files(__package__).joinpath("crd", CRD_FILE).read_text()
    crd = yaml.safe_load(text)
    for version in crd["spec"]["versions"]:
        if version["name"] == API_VERSION.rsplit("/", 1)[1]:
            return dict(version["schema"]["openAPIV3Schema"])
    raise LookupError(f"{CRD_FILE} has no {API_VERSION}")


def own_sections() -> frozenset[str]:
    """The plugin's own top-level sections, which the CRD does not have."""
    return frozenset(Policy.model_fields) - frozenset(crd_schema()["properties"]["spec"]["properties"])


def _closed(node: Any) -> Any:
    """The schema with unknown fields refused (an API server's strict field validation) where
    the CRD does not keep them (``x-kubernetes-preserve-unknown-fields``, maps)."""
    if isinstance(node, list):
        return [_closed(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _closed(v) for k, v in node.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


_formats = FormatChecker(formats=())


def _int_format(bits: str) -> typing.Callable[[object], bool]:
    limit = _INT_RANGE[bits]
    return lambda v: not isinstance(v, int) or isinstance(v, bool) or -limit <= v < limit


for _name in _INT_RANGE:
    _formats.checks(_name)(_int_format(_name))


@functools.cache
def _validator() -> Draft4Validator:
    # OpenAPI v3.0 schemas are JSON Schema draft 4 plus Kubernetes' x- extensions (which a
    # validator passes over); int32/int64 are checked as the API server checks them.
    schema = _closed(crd_schema())
    spec = schema["properties"]["spec"]
    spec["properties"].update({name: {} for name in own_sections()})  # the model checks them
    return Draft4Validator(schema, format_checker=_formats)


def _where(path: typing.Iterable[Any]) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


def _message(err: SchemaError) -> list[str]:
    where = _where(err.absolute_path)
    if err.validator == "additionalProperties" and isinstance(err.instance, dict):
        schema = err.schema if isinstance(err.schema, dict) else {}
        known = set(schema.get("properties", {}))
        return [
            f"{_where([*err.absolute_path, k])}: not a field of NodeSLO ({API_VERSION})"
            for k in err.instance
            if k not in known
        ]
    if err.validator == "anyOf":
        branches = err.validator_value if isinstance(err.validator_value, list) else []
        kinds = " or ".join(str(b.get("type")) for b in branches)
        return [f"{where}: expected {kinds} (got {json.dumps(err.instance, default=str)[:80]})"]
    if err.validator == "pattern":
        return [f"{where}: {json.dumps(err.instance)[:80]} does not match the CRD's pattern {err.validator_value}"]
    if err.validator == "format":
        return [f"{where}: {err.instance} is out of the {err.validator_value} range"]
    return [f"{where}: {err.message}"]


def check(doc: dict[str, Any]) -> None:
    """Raise NodeSLOError naming every field the CRD's schema rejects."""
    api = doc.get("apiVersion")
    problems: list[str] = []
    if api is not None and api != API_VERSION:
        problems.append(f"apiVersion: {api!r} is not {API_VERSION} (the version the vendored CRD serves)")
    for err in sorted(_validator().iter_errors(doc), key=lambda e: [str(p) for p in e.absolute_path]):
        problems.extend(_message(err))
    if problems:
        raise NodeSLOError("NodeSLO rejected by its CRD: " + "; ".join(problems))


def _submodel(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds (through Annotated, Optional and list), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _submodel(typing.get_args(annotation)[0])
    if origin in (list, typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = _submodel(arg)
            if found is not None:
                return found
    return None


def split(value: Any, model: type[BaseModel], path: str, unused: list[str]) -> Any:
    """``value`` with only the fields ``model`` has; the others' paths go to ``unused``."""
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    for key, sub in value.items():
        field = model.model_fields.get(key)
        where = f"{path}.{key}" if path else key
        if field is None:
            if where not in unused:
                unused.append(where)
            continue
        inner = _submodel(field.annotation)
        if inner is None:
            out[key] = sub
        elif isinstance(sub, list):
            out[key] = [split(item, inner, f"{where}[]", unused) for item in sub]
        else:
            out[key] = split(sub, inner, where, unused)
    return out


def _pop(doc: Any, loc: tuple[Any, ...]) -> tuple[tuple[Any, ...], Any] | None:
    """Remove the deepest part of ``loc`` that ``doc`` has; returns its path and value."""
    node, depth = doc, 0
    for part in loc:
        in_dict = isinstance(node, dict) and isinstance(part, str) and part in node
        if not in_dict and not (isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)):
            break
        node, depth = node[part], depth + 1
    if depth == 0:
        return None
    parent = doc
    for part in loc[: depth - 1]:
        parent = parent[part]
    return loc[:depth], parent.pop(loc[depth - 1])


def _base_document(base: Policy) -> dict[str, Any]:
    # The whole base, except that qosManager keeps only what was set, so its profile still
    # decides the fields nobody set (as document.from_document does).
    doc = base.model_dump(exclude={"qosManager"})
    doc["qosManager"] = explicit_fields(base.qosManager)
    return doc


def overlay(base: Policy, spec: dict[str, Any]) -> tuple[Policy, list[str]]:
    """``spec`` (a NodeSLO spec the CRD accepted) over ``base``: the fields nriplugin uses,
    minus values it cannot use. Raises pydantic.ValidationError only for the plugin's own
    sections, which are as strict as a policy file."""
    unused: list[str] = []
    own = own_sections()
    spec = copy.deepcopy(spec)  # values are dropped from it below
    used = split({k: v for k, v in spec.items() if k not in own}, Policy, "", unused)
    used.update({k: v for k, v in spec.items() if k in own})  # strict, as in a policy file
    notes = [f"{UNUSED_FIELDS}: {', '.join('spec.' + u for u in unused)}"] if unused else []
    base_doc = _base_document(base)
    while True:
        try:
            return Policy.model_validate(deep_merge(base_doc, used)), notes
        except ValidationError as exc:
            errors = exc.errors()
            if any(not e["loc"] or e["loc"][0] in own for e in errors):
                raise
            # Deepest and later list items first, so a removal does not shift another's index.
            locs = sorted(
                {tuple(e["loc"]) for e in errors}, key=lambda loc: [(isinstance(p, str), p) for p in loc], reverse=True
            )
            dropped = 0
            for loc, err in ((loc, next(e for e in errors if tuple(e["loc"]) == loc)) for loc in locs):
                popped = _pop(used, loc)
                if popped is None:
                    continue
                dropped += 1
                path, _value = popped
                value = err.get("input")
                shown = "{...}" if isinstance(value, dict) else json.dumps(value, default=str)[:80]
                what = "" if path == loc else f"spec.{_where(path)} "
                notes.append(f"NodeSLO spec.{_where(loc)}: {err['msg']} (got {shown}); {what}not used")
            if not dropped:
                raise


def from_nodeslo(doc: dict[str, Any], base: Policy | None = None) -> tuple[Policy, list[str]]:
    """A Policy from a NodeSLO object over ``base`` (default: the embedded policy), and the
    notes on what was not used. Raises NodeSLOError for what the CRD rejects."""
    check(doc)
    spec = doc.get("spec") or {}
    return overlay(base if base is not None else Policy(), spec)
