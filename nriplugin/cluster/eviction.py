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
import logging
from dataclasses import dataclass
from typing import Any, Protocol

from nriplugin.cluster.client import UNANSWERED, ApiClient, ApiError, path_of
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
        self.api = api
        self.events = events
        self.dry_run = dry_run

    async def evict(
        self, pod_ns: str, pod_name: str, pod_uid: str, grace_seconds: int, reason: str, message: str
    ) -> ApiEvictionOutcome:
        path = path_of("api", "v1", "namespaces", pod_ns, "pods", pod_name, "eviction")
        params = {"dryRun": "All"} if self.dry_run else None
        try:
            await self.api.call(
                "POST",
                path,
                params=params,
                body=eviction(pod_ns, pod_name, pod_uid, grace_seconds),
                timeout=REQUEST_TIMEOUT,
            )
            out = ApiEvictionOutcome(
                ApiEvictionResult.EVICTED, 201, "dry run: would be evicted" if self.dry_run else ""
            )
        except ApiError as exc:
            out = _outcome(exc)
        except UNANSWERED as exc:
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


def eviction(pod_ns: str, pod_name: str, pod_uid: str, grace_seconds: int) -> dict[str, Any]:
    """The ``policy/v1`` Eviction of a pod."""
    return {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": pod_name, "namespace": pod_ns},
        # The uid precondition: a new pod that took the name is not evicted in its place.
        "deleteOptions": {"gracePeriodSeconds": max(0, int(grace_seconds)), "preconditions": {"uid": pod_uid}},
    }


def _outcome(exc: ApiError) -> ApiEvictionOutcome:
    detail = _message(exc)
    if exc.status == 429:
        if "DisruptionBudget" in exc.body or "disruption budget" in detail:
            return ApiEvictionOutcome(ApiEvictionResult.BLOCKED, 429, detail)
        return ApiEvictionOutcome(ApiEvictionResult.BLOCKED, 429, f"throttled by the API server: {detail}")
    if exc.status in (404, 409):  # 409: the uid precondition failed, the name is another pod's now
        return ApiEvictionOutcome(ApiEvictionResult.GONE, exc.status, detail)
    return ApiEvictionOutcome(ApiEvictionResult.ERROR, exc.status, detail)


def _message(exc: ApiError) -> str:
    """The Status message, with the budget's own words when the API server gives them."""
    if not exc.is_status:
        return exc.phrase
    causes = [c.message for c in exc.causes]
    return "; ".join(filter(None, [exc.message or exc.phrase, *causes]))
