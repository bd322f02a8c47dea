"""Events the agent leaves on API objects, so ``kubectl get events`` and ``kubectl describe``
show what it did to them or refused of them, not only its own log.

One recorder per agent: posting never blocks the caller (a task per Event, awaited by
``drain`` at shutdown), and a repeat of the same reason on the same object within
AGGREGATE_SECONDS patches the first Event's count instead of adding one, as client-go's
recorder does. A post that fails is a log line, never an error for the caller.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import aiohttp
from kubernetes_asyncio.client import ApiClient, CoreV1Api, CoreV1Event, V1EventSource, V1ObjectMeta, V1ObjectReference
from kubernetes_asyncio.client.exceptions import ApiException

log = logging.getLogger("nriplugin.cluster")
COMPONENT = "nriplugin"
REQUEST_TIMEOUT = 5.0
AGGREGATE_SECONDS = 600.0  # a repeated event within this is one Event with a count (as client-go does)
CLUSTER_SCOPED_NAMESPACE = "default"  # where Events about cluster-scoped objects go (kubectl looks there)


@dataclass(frozen=True)
class Involved:
    """The object an Event is about. ``namespace`` is empty for a cluster-scoped object."""

    api_version: str
    kind: str
    name: str
    uid: str
    namespace: str = ""

    @property
    def event_namespace(self) -> str:
        return self.namespace or CLUSTER_SCOPED_NAMESPACE

    def ref(self) -> V1ObjectReference:
        return V1ObjectReference(
            api_version=self.api_version, kind=self.kind, name=self.name, namespace=self.namespace or None, uid=self.uid
        )


class EventRecorder:
    """Posts Events as the agent on ``node``."""

    def __init__(self, api: ApiClient, node: str) -> None:
        self.core = CoreV1Api(api)
        self.node = node
        self._recent: dict[tuple[str, str], tuple[str, int, float]] = {}  # (uid, reason) -> (event, count, first)
        self._posting: set[asyncio.Task[None]] = set()

    def emit(self, about: Involved, reason: str, message: str, type_: str = "Warning") -> None:
        """Post in the background (the caller may be a sync handler on the event loop)."""
        task = asyncio.get_running_loop().create_task(self.post(about, reason, message, type_))
        self._posting.add(task)
        task.add_done_callback(self._posting.discard)

    async def drain(self) -> None:
        """Wait for the Events still being posted."""
        if self._posting:
            await asyncio.gather(*self._posting, return_exceptions=True)

    async def post(self, about: Involved, reason: str, message: str, type_: str = "Warning") -> None:
        now = time.time()
        stamp = datetime.fromtimestamp(now, UTC)
        ns = about.event_namespace
        self._recent = {k: v for k, v in self._recent.items() if now - v[2] < AGGREGATE_SECONDS}
        key = (about.uid or f"{about.kind}/{about.namespace}/{about.name}", reason)
        try:
            if key in self._recent:
                name, count, first = self._recent[key]
                patch = {"count": count + 1, "lastTimestamp": stamp.strftime("%Y-%m-%dT%H:%M:%SZ"), "message": message}
                try:
                    await self.core.patch_namespaced_event(name, ns, patch, _request_timeout=REQUEST_TIMEOUT)
                    self._recent[key] = (name, count + 1, first)
                    return
                except ApiException as exc:
                    if exc.status != 404:
                        raise
            name = f"{about.name}.{secrets.token_hex(8)}"
            event = CoreV1Event(
                metadata=V1ObjectMeta(name=name, namespace=ns),
                involved_object=about.ref(),
                reason=reason,
                message=message[:1024],
                type=type_,
                count=1,
                first_timestamp=stamp,
                last_timestamp=stamp,
                source=V1EventSource(component=COMPONENT, host=self.node),
                reporting_component=COMPONENT,
                reporting_instance=f"{COMPONENT}-{self.node}",
            )
            await self.core.create_namespaced_event(ns, event, _request_timeout=REQUEST_TIMEOUT)
            self._recent[key] = (name, 1, now)
        except (ApiException, aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.warning("event %s on %s %s not posted: %s", reason, about.kind, about.name, getattr(exc, "status", exc))
