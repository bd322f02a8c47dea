"""A policy from a parsed document: ours (merged over the embedded default) or Koordinator's
NodeSLO object (judged by its CRD, ``nodeslo.py``)."""

from __future__ import annotations

from typing import Any

from nriplugin.policy.model import Policy
from nriplugin.policy.profiles import overlay


def from_document(doc: Any) -> tuple[Policy, list[str]]:
    """A Policy from a parsed YAML/JSON document (our format, or a NodeSLO object, which
    ``nodeslo.py`` judges by Koordinator's CRD).

    Returns the policy and notes about what was not used. Raises pydantic.ValidationError,
    or nodeslo.NodeSLOError for a NodeSLO its CRD rejects.
    """
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise TypeError(f"a policy must be a mapping, got {type(doc).__name__}")
    if doc.get("kind") == "NodeSLO":
        from nriplugin.policy.nodeslo import from_nodeslo  # jsonschema: only for a NodeSLO

        return from_nodeslo(doc)
    # A partial document keeps every default it does not mention (mappings merge, lists and
    # scalars replace). qosManager is left out of the defaults merged under it: its profile
    # must see which fields the document itself sets (the model fills in the rest).
    base = Policy().model_dump(exclude={"qosManager"})
    return Policy.model_validate(overlay(base, doc)), []
