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

import enum
import json
import logging
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
from kubernetes_asyncio.client import (
    ApiClient,
    CoreV1Api,
    V1DeleteOptions,
    V1Eviction,
    V1ObjectMeta,
    V1Preconditions,
)
from kubernetes_asyncio.client.exceptions import ApiException

from nriplugin.cluster.events import REQUEST_TIMEOUT, EventRecorder, Involved

log = logging.getLogger("nriplugin.cluster")


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

    def __init__(self, api: ApiClient, events: EventRecorder, dry_run: bool = False) -> None:
        self.core = CoreV1Api(api)
        self.events = events
        self.dry_run = dry_run

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
                self.events.emit(Involved("v1", "Pod", pod_name, pod_uid, pod_ns), *event)
        return out


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
