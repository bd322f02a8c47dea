"""This node's pods as the API server knows them (``fieldSelector=spec.nodeName=NODE``): the
facts the runtime does not carry and eviction ranks by — pod priority (``spec.priority``),
Koordinator's ``koordinator.sh/priority`` label, names, labels — in a small cache the
eviction ranking queries by pod uid or by namespace and name."""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from kubernetes_asyncio.client import ApiClient, CoreV1Api

from nriplugin.cluster.listwatch import ListWatch, WatchedResource

log = logging.getLogger("nriplugin.cluster")
RESOURCE = WatchedResource("Pod", "pods", "", "v1", missing="is the configured server a Kubernetes API server?")
KOORD_PRIORITY = "koordinator.sh/priority"
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
        )


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
    """The node's pods by uid and by namespace/name (the ListWatch handler)."""

    def __init__(self) -> None:
        self._by_uid: dict[str, PodInfo] = {}
        self._by_name: dict[tuple[str, str], str] = {}

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
        self._by_uid[pod.uid] = pod
        self._by_name[(pod.namespace, pod.name)] = pod.uid


def watcher(api: ApiClient, node: str, **kw: Any) -> tuple[ListWatch, PodCache]:
    cache = PodCache()
    call = functools.partial(CoreV1Api(api).list_pod_for_all_namespaces, field_selector=f"spec.nodeName={node}")
    return ListWatch(f"pods on {node}", call, cache, resource=RESOURCE, **kw), cache
