"""The NodeMetric reporter: this node's ``NodeMetric`` watched for its spec (the interval and
windows koord-manager asks for), and its status patched at that interval with what the QoS
manager's rounds measured (``nodemetric.py`` builds it; ``qos/usage.py`` keeps the usage).

koord-manager creates each node's NodeMetric; until this node's exists there is nothing to
report to, which is said once, and the first report goes as soon as it appears (and something
was measured), the next ones every ``reportIntervalSeconds``. A report the API server refuses
(422 invalid, 403 RBAC, the object gone, the server away) is a warning naming the cause and its
fix, said once per cause and then now and then while it lasts, and a count by reason; the next
report goes at the next interval, never sooner: a refusal is not retried in a storm.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Protocol

import aiohttp

from nriplugin.cluster.client import JSON_PATCH, ApiClient, ApiError, BadAnswer, path_of
from nriplugin.cluster.listwatch import ListWatch, WatchedResource
from nriplugin.cluster.nodemetric import (
    GROUP,
    KIND,
    MIN_REPORT_SECONDS,
    PLURAL,
    VERSION,
    CollectPolicy,
    Measured,
    PodLike,
    collect_policy,
    format_duration,
    patch,
    status,
)
from nriplugin.cluster.pods import PodLookup

log = logging.getLogger("nriplugin.cluster")
RESOURCE = WatchedResource(
    KIND,
    PLURAL,
    GROUP,
    VERSION,
    missing="is Koordinator's NodeMetric CRD installed (koord-manager installs it and creates each node's NodeMetric)?",
)
REQUEST_TIMEOUT = 10.0
NOTHING_YET = 1.0  # seconds between looks while nothing was measured over the window yet
REMIND = 600.0  # seconds between reminders of a refusal that lasts

# Why a report was not taken, by the API server's answer (the metric's ``reason`` label).
INVALID, FORBIDDEN, MISSING, UNAVAILABLE, FAILED = "invalid", "forbidden", "missing", "unavailable", "failed"


class ReportObserver(Protocol):
    def reported(self, pods: int, size: int, seconds: float) -> None:
        """A report taken: its pods, its size in bytes, the request's time."""

    def report_failed(self, reason: str) -> None:
        """A report not taken (INVALID, FORBIDDEN, MISSING, UNAVAILABLE, FAILED)."""


class NodeMetricSpec:
    """Whether this node's NodeMetric exists, and what its spec asks (the ListWatch handler)."""

    def __init__(self, node: str, min_report: float = MIN_REPORT_SECONDS) -> None:
        self.node = node
        self.min_report = min_report
        self.present = False
        self.policy = CollectPolicy()
        self.changed = asyncio.Event()  # set on every change of presence or policy
        self._absent_said = False
        self._noted: set[str] = set()

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
        policy, notes = collect_policy(obj.get("spec"), self.min_report)
        for note in notes:
            if note not in self._noted:
                self._noted.add(note)
                log.warning("NodeMetric %s: %s", self.node, note)
        if self.present and policy == self.policy:
            return
        was = self.present
        self.present, self.policy = True, policy
        self._absent_said = False
        log.info(
            "NodeMetric %s %s: reporting every %s, usage averaged over %s, aggregated over %s",
            self.node,
            "found" if not was else "changed",
            format_duration(policy.report_seconds),
            format_duration(policy.aggregate_seconds),
            ", ".join(format_duration(d) for d in policy.durations) or "no window",
            extra={"node": self.node, "report_seconds": policy.report_seconds},
        )
        self.changed.set()

    def absent(self) -> None:
        if not self._absent_said:
            self._absent_said = True
            log.warning(
                "NodeMetric %s does not exist%s: koord-manager creates one for each node; "
                "the report starts when it does",
                self.node,
                " any more" if self.present else " (yet)",
                extra={"node": self.node},
            )
        if self.present:
            self.present = False
            self.changed.set()


class NodeMetricReporter:
    """This node's NodeMetric status, from ``measured``, at the interval its spec asks for.
    ``pods``: the node's pods as the API server has them (for each pod's ``spec.priority``)."""

    def __init__(
        self,
        api: ApiClient,
        node: str,
        measured: Measured,
        pods: PodLookup,
        *,
        observer: ReportObserver | None = None,
        min_report: float = MIN_REPORT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
        **kw: Any,
    ) -> None:
        self.node = node
        self.measured = measured
        self.pods = pods
        self.observer = observer
        self.clock = clock
        self.wall = wall
        self.spec = NodeMetricSpec(node, min_report)
        self.watch = ListWatch(
            f"NodeMetric {node}", api, self.spec, resource=RESOURCE, field_selector=f"metadata.name={node}", **kw
        )
        self.api = api
        self.status_path = path_of("apis", GROUP, VERSION, PLURAL, node, "status")
        self.reports = 0  # reports taken
        self.failures = 0  # consecutive reports not taken
        self.last: float | None = None  # when the last report was sent (taken or not), on ``clock``
        self._said: tuple[str, int] | None = None  # the refusal last warned about
        self._said_at = 0.0
        self._waiting_since: float | None = None  # since when nothing was measured (None: something was)
        self._waiting_said = False

    async def run(self) -> None:
        """Report while the object exists: as soon as something was measured, then at the
        interval; a change of the spec applies at once (the next report is due at the last
        one plus the new interval). Nothing ends the loop but its cancellation."""
        while True:
            try:
                await self._step()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug: said, and tried again an interval later
                log.exception("NodeMetric %s: report failed; the next at the next interval", self.node)
                self.last = self.clock()
                await asyncio.sleep(self.spec.policy.report_seconds)

    async def _step(self) -> None:
        """Wait for what comes next (the object, the interval, a measurement) or report."""
        policy = self.spec.policy
        self.measured.keep(policy.horizon, policy.aggregate_seconds)
        if not self.spec.present:
            await self._changed(None)
            return
        now = self.clock()
        if self.last is not None and now < self.last + policy.report_seconds:
            await self._changed(self.last + policy.report_seconds - now)
            return
        report = status(self.measured, policy, now, self.wall(), self._priority)
        if report is None:
            self._nothing_yet(now, policy)
            await self._changed(NOTHING_YET)
            return
        self._waiting_since = None
        self.last = now
        await self.send(report)

    def _nothing_yet(self, now: float, policy: CollectPolicy) -> None:
        """Nothing measured over the window: said once when it lasts longer than an interval
        (the QoS manager's rounds feed the report)."""
        if self._waiting_since is None:
            self._waiting_since = now
        elif not self._waiting_said and now - self._waiting_since > policy.report_seconds:
            self._waiting_said = True
            log.warning(
                "NodeMetric %s: nothing measured for %s (the QoS manager's rounds feed the report); no report yet",
                self.node,
                format_duration(now - self._waiting_since),
            )

    async def _changed(self, timeout: float | None) -> None:
        """Until the spec changes, or ``timeout`` seconds."""
        self.spec.changed.clear()
        # asyncio.timeout, not wait_for: 3.11's wait_for can lose a cancellation that comes
        # as its timeout fires (the loop then outlives its cancel).
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self.spec.changed.wait()

    def _priority(self, pod: PodLike) -> int | None:
        info = self.pods.by_uid(pod.uid) or self.pods.by_name(pod.namespace, pod.name)
        return None if info is None else info.priority

    async def send(self, report: dict[str, Any]) -> bool:
        """One report, as the whole status; whether the API server took it."""
        pods = len(report.get("podsMetric") or ())
        t0 = time.perf_counter()
        try:
            await self.api.call(
                "PATCH", self.status_path, body=patch(report), content_type=JSON_PATCH, timeout=REQUEST_TIMEOUT
            )
        except ApiError as exc:
            self._failed(*_judge(exc, self.node))
            return False
        except (aiohttp.ClientError, TimeoutError, OSError, BadAnswer) as exc:
            self._failed(UNAVAILABLE, 0, f"the API server is unreachable ({type(exc).__name__}: {exc})")
            return False
        seconds = time.perf_counter() - t0
        size = len(json.dumps(report, separators=(",", ":")))
        if self.observer is not None:
            self.observer.reported(pods, size, seconds)
        if self.failures:
            log.info("NodeMetric %s: reported again, after %d refused", self.node, self.failures)
        elif not self.reports:
            log.info(
                "NodeMetric %s: first report (%d pods, %d bytes)", self.node, pods, size, extra={"node": self.node}
            )
        self.reports += 1
        self.failures = 0
        self._said = None
        log.debug("NodeMetric %s: reported %d pods, %d bytes in %.1f ms", self.node, pods, size, seconds * 1e3)
        return True

    def _failed(self, reason: str, code: int, text: str) -> None:
        self.failures += 1
        if self.observer is not None:
            self.observer.report_failed(reason)
        now = time.monotonic()
        extra = {"node": self.node, "reason": reason, "status": code, "failures": self.failures}
        interval = format_duration(self.spec.policy.report_seconds)
        if self._said != (reason, code):
            self._said, self._said_at = (reason, code), now
            log.warning("NodeMetric %s: report not taken: %s; the next in %s", self.node, text, interval, extra=extra)
        elif now - self._said_at >= REMIND:
            self._said_at = now
            log.warning(
                "NodeMetric %s: still not taken after %d reports: %s", self.node, self.failures, text, extra=extra
            )
        else:
            log.debug("NodeMetric %s: report not taken: %s", self.node, text, extra=extra)


def _judge(exc: ApiError, node: str) -> tuple[str, int, str]:
    """(reason, status, what to log) for an error answer, said so that the fix is plain."""
    code = exc.status
    reason, message = _status(exc)
    said = f"{code} {reason}".strip() + (f": {message}" if message else "")
    target = f"{PLURAL}.{GROUP}/status"
    if code in (400, 422):
        return INVALID, code, f"the API server refused it as invalid ({said})"
    if code in (401, 403):
        return (
            FORBIDDEN,
            code,
            (
                f"RBAC does not allow patch {target} ({said}): grant patch on {PLURAL}/status to this agent's "
                "service account (kind/rbac.yaml)"
            ),
        )
    if code == 404:
        return MISSING, code, f"NodeMetric {node} is gone ({said}); waiting for koord-manager to create it again"
    if code == 429 or code >= 500:
        return UNAVAILABLE, code, f"the API server is unavailable ({said})"
    return FAILED, code, f"the API server refused it ({said})"


def _status(exc: ApiError) -> tuple[str, str]:
    """The answer's reason and message as its Status says them (the HTTP reason phrase and no
    message when the body is not a Status)."""
    if not exc.is_status:
        return exc.phrase, ""
    causes = [f"{c.field}: {c.message}".strip(": ") for c in exc.causes]
    message = "; ".join(filter(None, [exc.message, *causes]))[:500]
    return exc.reason, message
