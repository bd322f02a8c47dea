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
from typing import Any

from nriplugin.cluster.client import MERGE_PATCH, UNANSWERED, ApiClient, ApiError, path_of

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

    def ref(self) -> dict[str, str]:
        """The ``involvedObject`` (an ObjectReference; no namespace for a cluster-scoped object)."""
        out = {"apiVersion": self.api_version, "kind": self.kind, "name": self.name}
        if self.namespace:
            out["namespace"] = self.namespace
        if self.uid:
            out["uid"] = self.uid
        return out


def event_object(
    about: Involved, name: str, reason: str, message: str, type_: str, node: str, stamp: datetime
) -> dict[str, Any]:
    """A core/v1 Event, as client-go's recorder makes one."""
    when = timestamp(stamp)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": about.event_namespace},
        "involvedObject": about.ref(),
        "reason": reason,
        "message": message[:1024],
        "type": type_,
        "count": 1,
        "firstTimestamp": when,
        "lastTimestamp": when,
        "source": {"component": COMPONENT, "host": node},
        "reportingComponent": COMPONENT,
        "reportingInstance": f"{COMPONENT}-{node}",
    }


def timestamp(when: datetime) -> str:
    """RFC 3339 in seconds, UTC, as the API's Time fields are."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class EventRecorder:
    """Posts Events as the agent on ``node``."""

    def __init__(self, api: ApiClient, node: str) -> None:
        self.api = api
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
                patch = {"count": count + 1, "lastTimestamp": timestamp(stamp), "message": message[:1024]}
                try:
                    path = path_of("api", "v1", "namespaces", ns, "events", name)
                    await self.api.call("PATCH", path, body=patch, content_type=MERGE_PATCH, timeout=REQUEST_TIMEOUT)
                    self._recent[key] = (name, count + 1, first)
                    return
                except ApiError as exc:
                    if exc.status != 404:
                        raise
            name = f"{about.name}.{secrets.token_hex(8)}"
            event = event_object(about, name, reason, message, type_, self.node, stamp)
            path = path_of("api", "v1", "namespaces", ns, "events")
            await self.api.call("POST", path, body=event, timeout=REQUEST_TIMEOUT)
            self._recent[key] = (name, 1, now)
        except ApiError as exc:
            log.warning("event %s on %s %s not posted: %s", reason, about.kind, about.name, exc)
        except UNANSWERED as exc:
            log.warning("event %s on %s %s not posted: %s: %s", reason, about.kind, about.name, type(exc).__name__, exc)
