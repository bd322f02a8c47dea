"""Evicting a pod through the Kubernetes Eviction API (``policy/v1``), so PodDisruptionBudgets
are honoured and the pod's controller replaces it (koordlet kills through CRI by default,
koordinator#1757: budgets ignored, kubelet restarts the container). Each eviction, and each
eviction a budget blocked, leaves an Event on the pod.

The node-side evictor calls ``ApiEvictions.evict`` and acts on the ApiEvictionOutcome: EVICTED — the pod is
terminating (credit its release); BLOCKED — a PodDisruptionBudget (or the API server's
throttling) said not now: try the next candidate, retry this one later; GONE — the pod (that
uid) no longer exists; ERROR — anything else (the API server away: fall back as the caller
decides).
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import aiohttp
from kubernetes_asyncio.client import (
    ApiClient,
    CoreV1Api,
    CoreV1Event,
    V1DeleteOptions,
    V1EventSource,
    V1Eviction,
    V1ObjectMeta,
    V1ObjectReference,
    V1Preconditions,
)
from kubernetes_asyncio.client.exceptions import ApiException

log = logging.getLogger("nriplugin.cluster")
COMPONENT = "nriplugin"
REQUEST_TIMEOUT = 5.0
AGGREGATE_SECONDS = 600.0  # a repeated event within this is one Event with a count (as client-go does)


class ApiEvictionResult(enum.Enum):
    EVICTED = "evicted"
    BLOCKED = "blocked"
    GONE = "gone"
    ERROR = "error"


@dataclass(frozen=True)
class ApiEvictionOutcome:
    result: ApiEvictionResult
    status: int  # the HTTP status (0: no answer)
    detail: str  # the API server's message, e.g. which budget blocked it

    def __str__(self) -> str:
        return f"{self.result.value} ({self.status}{': ' + self.detail if self.detail else ''})"


class ApiEvictions(Protocol):
    """What the node-side evictor calls. ``reason`` is the strategy and trigger (e.g.
    ``MemoryEvict``), ``message`` the figures; both go into the pod's Event."""

    async def evict(
        self, pod_ns: str, pod_name: str, pod_uid: str, grace_seconds: int, reason: str, message: str
    ) -> ApiEvictionOutcome: ...


class ApiEvictor:
    """Evictions through the API server. ``dry_run``: the API server checks everything (the
    pod, its budgets) and evicts nothing (``dryRun=All``); no Event is posted."""

    def __init__(self, api: ApiClient, node: str, dry_run: bool = False) -> None:
        self.core = CoreV1Api(api)
        self.node = node
        self.dry_run = dry_run
        self._recent: dict[tuple[str, str], tuple[str, int, float]] = {}  # (pod uid, reason) -> (event, count, first)
        self._posting: set[asyncio.Task[None]] = set()

    async def evict(
        self, pod_ns: str, pod_name: str, pod_uid: str, grace_seconds: int, reason: str, message: str
    ) -> ApiEvictionOutcome:
        body = V1Eviction(
            api_version="policy/v1",
            kind="Eviction",
            metadata=V1ObjectMeta(name=pod_name, namespace=pod_ns),
            # The uid precondition: a new pod that took the name is not evicted in its place.
            delete_options=V1DeleteOptions(
                grace_period_seconds=max(0, int(grace_seconds)), preconditions=V1Preconditions(uid=pod_uid)
            ),
        )
        kw: dict[str, Any] = {"dry_run": "All"} if self.dry_run else {}
        try:
            await self.core.create_namespaced_pod_eviction(
                pod_name, pod_ns, body, _request_timeout=REQUEST_TIMEOUT, **kw
            )
            out = ApiEvictionOutcome(
                ApiEvictionResult.EVICTED, 201, "dry run: would be evicted" if self.dry_run else ""
            )
        except ApiException as exc:
            out = _outcome(exc)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            out = ApiEvictionOutcome(ApiEvictionResult.ERROR, 0, f"{type(exc).__name__}: {exc}")
        log.info(
            "eviction of %s/%s (%s): %s",
            pod_ns,
            pod_name,
            reason,
            out,
            extra={"pod": f"{pod_ns}/{pod_name}", "uid": pod_uid, "strategy": reason, "result": out.result.value},
        )
        if not self.dry_run:
            event = {
                ApiEvictionResult.EVICTED: ("Evicted", f"evicted by nriplugin ({reason}): {message}"),
                ApiEvictionResult.BLOCKED: (
                    "EvictionBlocked",
                    f"eviction by nriplugin ({reason}) blocked: {out.detail}; {message}",
                ),
                ApiEvictionResult.ERROR: (
                    "EvictionFailed",
                    f"eviction by nriplugin ({reason}) failed: {out.detail}; {message}",
                ),
            }.get(out.result)
            if event is not None and not (
                out.result is ApiEvictionResult.BLOCKED and out.detail.startswith("throttled")
            ):
                task = asyncio.get_running_loop().create_task(self._post(pod_ns, pod_name, pod_uid, *event))
                self._posting.add(task)
                task.add_done_callback(self._posting.discard)
        return out

    async def drain(self) -> None:
        """Wait for the Events still being posted."""
        if self._posting:
            await asyncio.gather(*self._posting, return_exceptions=True)

    async def _post(self, ns: str, pod: str, uid: str, reason: str, message: str) -> None:
        """An Event on the pod; a repeat within AGGREGATE_SECONDS raises the first one's count."""
        now = time.time()
        stamp = datetime.fromtimestamp(now, UTC)
        self._recent = {k: v for k, v in self._recent.items() if now - v[2] < AGGREGATE_SECONDS}
        key = (uid, reason)
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
            name = f"{pod}.{secrets.token_hex(8)}"
            event = CoreV1Event(
                metadata=V1ObjectMeta(name=name, namespace=ns),
                involved_object=V1ObjectReference(api_version="v1", kind="Pod", name=pod, namespace=ns, uid=uid),
                reason=reason,
                message=message[:1024],
                type="Warning",
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
            log.warning("event %s on pod %s/%s not posted: %s", reason, ns, pod, getattr(exc, "status", exc))


def _outcome(exc: ApiException) -> ApiEvictionOutcome:
    detail = _message(exc)
    if exc.status == 429:
        if "DisruptionBudget" in str(exc.body or "") or "disruption budget" in detail:
            return ApiEvictionOutcome(ApiEvictionResult.BLOCKED, 429, detail)
        return ApiEvictionOutcome(ApiEvictionResult.BLOCKED, 429, f"throttled by the API server: {detail}")
    if exc.status in (404, 409):  # 409: the uid precondition failed, the name is another pod's now
        return ApiEvictionOutcome(ApiEvictionResult.GONE, exc.status, detail)
    return ApiEvictionOutcome(ApiEvictionResult.ERROR, int(exc.status or 0), detail)


def _message(exc: ApiException) -> str:
    """The Status message, with the budget's own words when the API server gives them."""
    try:
        body = json.loads(exc.body) if exc.body else {}
    except (ValueError, TypeError):
        body = {}
    if not isinstance(body, dict):
        return str(exc.reason)
    causes = [c.get("message", "") for c in (body.get("details") or {}).get("causes") or [] if isinstance(c, dict)]
    return "; ".join(filter(None, [str(body.get("message") or exc.reason), *causes]))
