"""This node's pods as the API server knows them (``fieldSelector=spec.nodeName=NODE``): the
facts the runtime does not carry — pod priority (``spec.priority``), Koordinator's
``koordinator.sh/priority`` label, names, labels, which eviction ranks by, and the batch
resources the containers ask (``kubernetes.io/batch-cpu``, ``batch-memory``), which BE's
containers are sized from when Koordinator's webhook did not annotate the pod — in a small
cache queried by pod uid or by namespace and name."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from nriplugin.cluster.client import ApiClient
from nriplugin.cluster.listwatch import ListWatch, WatchedResource

log = logging.getLogger("nriplugin.cluster")
RESOURCE = WatchedResource("Pod", "pods", "", "v1", missing="is the configured server a Kubernetes API server?")
KOORD_PRIORITY = "koordinator.sh/priority"
BATCH = ("kubernetes.io/batch-cpu", "kubernetes.io/batch-memory")
_INT = re.compile(r"-?\d{1,10}")
_INT32 = 1 << 31


@dataclass(frozen=True)
class PodInfo:
    uid: str
    namespace: str
    name: str
    priority: int | None  # spec.priority (from the PriorityClass), None if unset
    koord_priority: int | None  # the koordinator.sh/priority label, None if absent or malformed
    labels: Mapping[str, str] = field(default_factory=dict)
    created: str = ""  # metadata.creationTimestamp (RFC 3339; sorts by time)
    terminating: bool = False  # deletionTimestamp set: already on its way out
    # The batch resources its containers ask, as the text of Koordinator's extended-resource-spec
    # annotation (None: none asked), for features/batch.py
    extended_spec: str | None = None

    @classmethod
    def from_object(cls, obj: dict[str, Any]) -> PodInfo:
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
        prio = spec.get("priority")
        return cls(
            uid=str(meta.get("uid", "")),
            namespace=str(meta.get("namespace", "")),
            name=str(meta.get("name", "")),
            priority=prio if isinstance(prio, int) and not isinstance(prio, bool) else None,
            koord_priority=_label_int(labels.get(KOORD_PRIORITY)),
            labels=labels,
            created=str(meta.get("creationTimestamp") or ""),
            terminating=bool(meta.get("deletionTimestamp")),
            extended_spec=_extended_spec(spec),
        )


def _extended_spec(spec: dict[str, Any]) -> str | None:
    """``{"containers": {NAME: {"requests": {...}, "limits": {...}}}}`` with the batch resources
    of each container that asks any, as Koordinator's webhook writes it; one text for equal
    asks (sorted keys), so pods of one workload share its parse and their answer."""
    out: dict[str, dict[str, dict[str, str]]] = {}
    containers = spec.get("containers")
    for c in containers if isinstance(containers, list) else []:
        if not isinstance(c, dict):
            continue
        res = _dict(c.get("resources"))
        entry = {}
        for part in ("requests", "limits"):
            section = _dict(res.get(part))
            found = {k: str(section[k]) for k in BATCH if k in section}
            if found:
                entry[part] = found
        if entry:
            out[str(c.get("name", ""))] = entry
    return json.dumps({"containers": out}, sort_keys=True, separators=(",", ":")) if out else None


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _label_int(text: str | None) -> int | None:
    """An int32 label value; anything else (labels are untrusted) counts as absent."""
    if text is None or not _INT.fullmatch(text):
        return None
    value = int(text)
    return value if -_INT32 <= value < _INT32 else None


class PodLookup(Protocol):
    """What the eviction ranking asks of the cluster's view of the node's pods."""

    def by_uid(self, uid: str) -> PodInfo | None: ...

    def by_name(self, namespace: str, name: str) -> PodInfo | None: ...


class PodCache:
    """The node's pods by uid and by namespace/name (the ListWatch handler). ``on_spec(uid)``:
    a pod's batch resources are known or changed (the desired state works its values out again)."""

    def __init__(self) -> None:
        self._by_uid: dict[str, PodInfo] = {}
        self._by_name: dict[tuple[str, str], str] = {}
        self.on_spec: Callable[[str], None] | None = None

    def extended_resource_spec(self, uid: str) -> str | None:
        """``intent.core.PodSpecs``: O(1), asked on the hook path."""
        pod = self._by_uid.get(uid)
        return None if pod is None else pod.extended_spec

    def __len__(self) -> int:
        return len(self._by_uid)

    def by_uid(self, uid: str) -> PodInfo | None:
        return self._by_uid.get(uid)

    def by_name(self, namespace: str, name: str) -> PodInfo | None:
        uid = self._by_name.get((namespace, name))
        return self._by_uid.get(uid) if uid is not None else None

    def pods(self) -> list[PodInfo]:
        return list(self._by_uid.values())

    def replace(self, items: list[dict[str, Any]]) -> None:
        self._by_uid.clear()
        self._by_name.clear()
        for obj in items:
            self._put(PodInfo.from_object(obj))

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        pod = PodInfo.from_object(obj)
        if kind == "DELETED":
            self._by_uid.pop(pod.uid, None)
            if self._by_name.get((pod.namespace, pod.name)) == pod.uid:
                del self._by_name[(pod.namespace, pod.name)]
        else:
            self._put(pod)

    def _put(self, pod: PodInfo) -> None:
        if not pod.uid:
            return
        old = self._by_name.get((pod.namespace, pod.name))
        if old is not None and old != pod.uid:
            self._by_uid.pop(old, None)  # the name now belongs to a new pod
        before = self._by_uid.get(pod.uid)
        self._by_uid[pod.uid] = pod
        self._by_name[(pod.namespace, pod.name)] = pod.uid
        was = None if before is None else before.extended_spec
        if pod.extended_spec != was and self.on_spec is not None:
            self.on_spec(pod.uid)


def watcher(api: ApiClient, node: str, **kw: Any) -> tuple[ListWatch, PodCache]:
    cache = PodCache()
    watch = ListWatch(f"pods on {node}", api, cache, resource=RESOURCE, field_selector=f"spec.nodeName={node}", **kw)
    return watch, cache
