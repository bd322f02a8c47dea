"""This node's NodeSLO (``slo.koordinator.sh/v1alpha1``, cluster-scoped, named after the node),
watched into the rule cache as a layer over the policy file (or the embedded default).

Each version is judged as a NodeSLO policy file is (``policy/nodeslo.py``: Koordinator's CRD
decides what is refused; what nriplugin does not implement is named once as not used); a
refused one is counted and logged with the field named, and the policy in force stays. What the
API server accepted and the agent refuses, whole or a value of it, also gets a Warning Event on
the NodeSLO (in the default namespace, as for any cluster-scoped object): whoever edited it sees
why with ``kubectl get events``, not only in the agent's log. Fields nriplugin does not
implement are only logged: koord-manager writes them on every node.
Deleting the NodeSLO removes the layer: the file's policy (or the default) applies again.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from pydantic import ValidationError

from nriplugin.cluster.client import ApiClient
from nriplugin.cluster.events import EventRecorder, Involved
from nriplugin.cluster.listwatch import ListWatch, WatchedResource
from nriplugin.policy.cache import PolicyError, RuleCache, describe
from nriplugin.policy.model import Policy
from nriplugin.policy.nodeslo import API_VERSION, NodeSLOError, check, overlay, values_left_out

log = logging.getLogger("nriplugin.cluster")
GROUP, VERSION = API_VERSION.split("/")
PLURAL = "nodeslos"
REJECTED = "NodeSLORejected"  # Events' reasons: the whole object refused,
LEFT_OUT = "NodeSLOValueNotUsed"  # or values of it left out
RESOURCE = WatchedResource("NodeSLO", PLURAL, GROUP, VERSION, missing="is Koordinator's NodeSLO CRD installed?")


class NodeSLOSource:
    """Feeds the rule cache from the node's NodeSLO (the ListWatch handler)."""

    def __init__(self, rules: RuleCache, node: str, events: EventRecorder | None = None) -> None:
        self.rules = rules
        self.node = node
        self.events = events
        self.applied: str | None = None  # resourceVersion of the NodeSLO in force, if any
        self._noted: set[str] = set()  # notes already logged (each is said once)

    def replace(self, items: list[dict[str, Any]]) -> None:
        mine = [o for o in items if (o.get("metadata") or {}).get("name") == self.node]
        if mine:
            self.apply(mine[0])
        else:
            self.absent()

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        if (obj.get("metadata") or {}).get("name") != self.node:
            return
        if kind == "DELETED":
            self.absent()
        else:
            self.apply(obj)

    def apply(self, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        rv = str(meta.get("resourceVersion", ""))
        if rv and rv == self.applied:
            return  # a re-list brought the same version
        source = f"NodeSLO {self.node} (resourceVersion {rv})"
        try:
            check(obj)
            spec = obj.get("spec") or {}
            _, notes = overlay(self.rules.base, spec)
            self.rules.set_layer(functools.partial(_layer, spec), source, notes)
        except NodeSLOError as exc:
            self._reject(obj, source, str(exc))
            return
        except ValidationError as exc:
            self._reject(obj, source, describe(exc))
            return
        except PolicyError as exc:
            self._reject(obj, source, str(exc))
            return
        self.applied = rv
        for note in notes:
            if note not in self._noted:
                self._noted.add(note)
                log.warning("%s: %s", source, note)
        left_out = values_left_out(notes)
        if left_out:
            self._warn(obj, LEFT_OUT, f"on node {self.node}: {'; '.join(left_out)}; the values underneath stay")

    def _reject(self, obj: dict[str, Any], source: str, why: str) -> None:
        self.rules.reject(source, why)
        kept = self.rules.current
        stays = f"policy version {kept.version} ({kept.source}) stays"
        self._warn(obj, REJECTED, f"not applied on node {self.node}: {why}; {stays}")

    def _warn(self, obj: dict[str, Any], reason: str, message: str) -> None:
        if self.events is not None:
            uid = str((obj.get("metadata") or {}).get("uid", ""))
            self.events.emit(Involved(API_VERSION, "NodeSLO", self.node, uid), reason, message)

    def absent(self) -> None:
        if self.applied is not None:
            log.info("NodeSLO %s is gone; the policy underneath applies again", self.node)
        self.applied = None
        self.rules.set_layer(None)


def _layer(spec: dict[str, Any], base: Policy) -> Policy:
    return overlay(base, spec)[0]


def watcher(
    api: ApiClient, rules: RuleCache, node: str, events: EventRecorder | None = None, **kw: Any
) -> tuple[ListWatch, NodeSLOSource]:
    """The list-watch of this node's NodeSLO (by name, so other nodes' never come)."""
    source = NodeSLOSource(rules, node, events)
    watch = ListWatch(f"NodeSLO {node}", api, source, resource=RESOURCE, field_selector=f"metadata.name={node}", **kw)
    return watch, source
