"""Carrying out eviction plans: through a backend, at a bounded rate, logged and counted.

Backends (:class:`Backend`): in a cluster, the Kubernetes Eviction API (``nriplugin/cluster``,
which honours PodDisruptionBudgets: 429 means "not this pod now, take the next"); without one,
or when memory runs out within seconds (``EvictionPlan.urgent``), the runtime (:class:`RuntimeBackend`).

What containerd 1.7.24 honours, tried on the private containerd of ``testkit/containerd.py``: the
evictions of NRI's ``UpdateContainers`` are accepted and silently dropped (its NRI v0.6.1
adaptation passes only the updates on; the container keeps running, no error), so the runtime
backend goes through CRI: ``StopContainer`` with the grace period as its timeout (SIGTERM,
then SIGKILL) for every container of the pod at once, then ``StopPodSandbox``. Without an API
server that is all there is; in a cluster kubelet will restart what the runtime stopped, which
is why the Eviction API comes first there (koordinator#1757: koordlet kills through CRI only).

The evictor:
- takes a plan's ranked victims in order until what they free covers the release, skipping a
  pod the backend refuses (a PDB: retried after ``retry_after``) or that is already gone, and
  a pod that frees less than a meaningful share of the release (``EvictionPlan.meaningful``);
- when the backend fails (the runtime's CRI unreachable, the API server down), stops: the
  next pod would fail the same way, or be evicted in the place of the one that should go. It
  backs off (``BACKOFF_MIN`` doubling to ``BACKOFF_MAX``; a success resets it), during which
  no strategy plans an eviction, then tries the best victim again. Each failed attempt is one
  log line and one count (``nriplugin_qos_eviction_failures_total``), whatever the plan's size;
- never evicts the same pod twice within ``repeat_after`` (2 minutes), and never more than
  ``max_per_minute`` pods a minute over all strategies (one token bucket they share);
- keeps what each victim is expected to free as *pending* until it is gone, for the
  strategies to credit (:meth:`pending`), and reports what it really freed;
- in dry-run mode logs and counts what it would do and touches nothing;
- logs every eviction with its strategy, trigger, figures and victim, and counts it by
  strategy and reason (``nriplugin_qos_evictions_total``).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from nriplugin.obs.unobserved import Unobserved
from nriplugin.qos.eviction.victims import Candidate, EvictionPlan

log = logging.getLogger("nriplugin.qos.evict")

BACKOFF_MIN, BACKOFF_MAX = 1.0, 60.0  # seconds after a failed eviction: a round, doubling to a minute


class EvictionOutcome(enum.StrEnum):
    EVICTED = "evicted"
    BLOCKED = "blocked"  # a PodDisruptionBudget (429): take the next candidate, retry later
    GONE = "gone"  # the pod is not there any more
    ERROR = "error"


class Backend(Protocol):
    """An eviction backend: the Eviction API client (``nriplugin/cluster``) or the runtime.
    It answers an :class:`EvictionOutcome`, an enum with the same values, or an object whose
    ``result`` is one (the cluster client's, which also carries the HTTP status)."""

    async def evict(self, ns: str, name: str, uid: str, grace_seconds: int, reason: str, message: str, /) -> object: ...


def outcome(answer: object) -> EvictionOutcome:
    """A backend's answer as an :class:`EvictionOutcome` (anything unknown is an error)."""
    v = getattr(answer, "result", answer)
    try:
        return EvictionOutcome(str(getattr(v, "value", v)))
    except ValueError:
        return EvictionOutcome.ERROR


@dataclass(frozen=True, slots=True)
class Answer:
    """A backend's outcome with what went wrong (the evictor logs it, once)."""

    result: EvictionOutcome
    detail: str = ""


class Priorities(Protocol):
    """Pod priorities where the cluster knows them (``spec.priority``); None when it does not."""

    def priority(self, uid: str) -> int | None: ...


class EvictorObserver(Protocol):
    def evicted(self, strategy: str, reason: str, dry_run: bool) -> None: ...
    def eviction_failed(self, backend: str, outcome: str) -> None: ...


# the runtime ---------------------------------------------------------------------------------


class CRICaller(Protocol):
    async def call(self, name: str, request: Any, timeout: float | None = None) -> Any: ...


class RuntimeBackend:
    """Eviction through CRI (see the module's docstring for why not NRI)."""

    name = "runtime"

    def __init__(self, cri: CRICaller, timeout: float = 10.0) -> None:
        from nriplugin.cri import api_pb2 as cri_api

        self.api = cri_api
        self.cri = cri
        self.timeout = timeout

    async def evict(
        self, ns: str, name: str, uid: str, grace_seconds: int, reason: str, message: str
    ) -> EvictionOutcome | Answer:
        a = self.api
        try:
            pods = (await self.cri.call("ListPodSandbox", a.ListPodSandboxRequest(), timeout=self.timeout)).items
            ids = [
                p.id
                for p in pods
                if p.state == a.SANDBOX_READY
                # a pod without a uid (not kubelet's) is matched by namespace and name
                and (p.metadata.uid == uid if uid else (p.metadata.namespace, p.metadata.name) == (ns, name))
            ]
            if not ids:
                return EvictionOutcome.GONE
            for sandbox in ids:
                flt = a.ContainerFilter(pod_sandbox_id=sandbox)
                ctrs = (
                    await self.cri.call("ListContainers", a.ListContainersRequest(filter=flt), timeout=self.timeout)
                ).containers
                running = [c.id for c in ctrs if c.state in (a.CONTAINER_RUNNING, a.CONTAINER_CREATED)]
                wait = self.timeout + grace_seconds
                stops = [a.StopContainerRequest(container_id=c, timeout=grace_seconds) for c in running]
                await asyncio.gather(*(self.cri.call("StopContainer", r, wait) for r in stops))
                await self.cri.call("StopPodSandbox", a.StopPodSandboxRequest(pod_sandbox_id=sandbox), self.timeout)
        except Exception as exc:  # grpc errors, a closed channel: the evictor backs off
            return Answer(EvictionOutcome.ERROR, " ".join(str(exc).split())[:300] or type(exc).__name__)
        return EvictionOutcome.EVICTED


# the evictor ---------------------------------------------------------------------------------


@dataclass
class Pending:
    """A victim on its way out: what it was expected to free, until its memory is gone."""

    uid: str
    who: str
    strategy: str
    expected: float
    unit: str
    since: float
    group: str | None = None  # its pod cgroup, to measure what it really freed
    held: float = 0.0  # what it held when last measured


@dataclass
class Evictor:
    cluster: Backend | None = None
    runtime: Backend | None = None
    cluster_of: Callable[[], Backend | None] | None = None  # the cluster side, once (and while) it runs
    observer: Any = field(default_factory=Unobserved)
    dry_run: bool = False
    max_per_minute: int = 10
    grace_seconds: int = 5
    repeat_after: float = 120.0
    retry_after: float = 30.0
    pending_timeout: float = 60.0
    clock: Callable[[], float] = time.monotonic
    on_evicted: Callable[[EvictionPlan, Candidate], None] | None = None  # e.g. the strategy's cooldown
    _tokens: deque[float] = field(default_factory=deque)  # eviction times in the last minute
    _last: dict[str, float] = field(default_factory=dict)  # uid -> when it was evicted
    _blocked: dict[str, float] = field(default_factory=dict)  # uid -> when it may be tried again
    _busy: set[str] = field(default_factory=set)  # strategies with a plan under way
    failures: int = 0  # failed attempts in a row (the backend's); 0 after a success
    _retry_at: float = 0.0  # no eviction is planned before (backing off after a failure)
    _tasks: set[asyncio.Task[list[Candidate]]] = field(default_factory=set)
    pending: dict[str, Pending] = field(default_factory=dict)
    history: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=50))

    def busy(self, strategy: str) -> bool:
        """A plan of ``strategy`` under way, or backing off after a failed eviction."""
        return strategy in self._busy or self.backing_off()

    def backing_off(self) -> bool:
        return self.failures > 0 and self.clock() < self._retry_at

    def eligible(self, c: Candidate) -> bool:
        """Not evicted within ``repeat_after``, not refused within ``retry_after``, not pending."""
        now = self.clock()
        last = self._last.get(c.uid)
        if last is not None and now - last < self.repeat_after:
            return False
        until = self._blocked.get(c.uid)
        return (until is None or now >= until) and c.uid not in self.pending

    def submit(self, plan: EvictionPlan, groups: dict[str, str] | None = None) -> bool:
        """Start carrying out ``plan`` on the running loop; False when that strategy still has
        one under way (its pending releases are credited in the next decision instead)."""
        if plan.strategy in self._busy:
            return False
        self._busy.add(plan.strategy)
        task = asyncio.get_running_loop().create_task(self.execute(plan, groups or {}))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    async def execute(self, plan: EvictionPlan, groups: dict[str, str]) -> list[Candidate]:
        """Evict ``plan``'s victims in order until they cover its release; returns the evicted.
        A backend failure ends the plan (see the module's docstring)."""
        self._busy.add(plan.strategy)
        done: list[Candidate] = []
        try:
            freed = 0.0
            rel = plan.release
            for c in plan.victims:
                if freed >= rel.amount:
                    break
                if not self.eligible(c) or not plan.meaningful(c):
                    continue
                if not self._take_token():
                    log.warning(
                        "%s: eviction rate limit (%d a minute) reached; %s waits",
                        plan.strategy,
                        self.max_per_minute,
                        c.who,
                        extra={"strategy": plan.strategy, "victim": c.who},
                    )
                    break
                answer, backend = await self._evict(plan, c)
                result = outcome(answer)
                if result is EvictionOutcome.EVICTED:
                    freed += self._evicted(plan, c, groups, backend)
                    done.append(c)
                    continue
                self._untake_token()
                self.observer.eviction_failed(backend, result.value)
                if result is EvictionOutcome.ERROR:
                    self._failed(plan, c, backend, answer)
                    return done
                if result is EvictionOutcome.BLOCKED:
                    self._blocked[c.uid] = self.clock() + self.retry_after
                    log.info("%s: %s refused (disruption budget); trying the next", plan.strategy, c.who)
            if freed < rel.amount:
                log.warning(
                    "%s: freed %.2f of %.2f %s; no more candidates this round",
                    plan.strategy,
                    freed if plan.unit != "bytes" else freed / (1 << 20),
                    rel.amount if plan.unit != "bytes" else rel.amount / (1 << 20),
                    "MiB" if plan.unit == "bytes" else plan.unit,
                )
        finally:
            self._busy.discard(plan.strategy)
        return done

    def _evicted(self, plan: EvictionPlan, c: Candidate, groups: dict[str, str], backend: str) -> float:
        """Book an eviction; returns what it counts towards the release."""
        share = plan.share(c)
        now = self.clock()
        self._last[c.uid] = now
        self.failures = 0
        if not self.dry_run:
            held = float(c.freeable_bytes) if plan.unit == "bytes" else share
            self.pending[c.uid] = Pending(c.uid, c.who, plan.strategy, held, plan.unit, now, groups.get(c.uid), held)
        self.observer.evicted(plan.strategy, plan.release.trigger, self.dry_run)
        self.history.append(
            {"t": now, "strategy": plan.strategy, "trigger": plan.release.trigger, "victim": c.who, "via": backend}
        )
        if self.on_evicted is not None:
            self.on_evicted(plan, c)
        return share

    def _failed(self, plan: EvictionPlan, c: Candidate, backend: str, answer: object) -> None:
        """The backend failed: no other pod goes in ``c``'s place; back off, then retry."""
        self.failures += 1
        wait = min(BACKOFF_MAX, BACKOFF_MIN * 2 ** (self.failures - 1))
        self._retry_at = self.clock() + wait
        detail = getattr(answer, "detail", "") or str(answer)
        log.warning(
            "%s: evicting %s via %s failed (%s); nobody else is evicted in its place; trying again in %.0f s "
            "(failure %d in a row)",
            plan.strategy,
            c.who,
            backend,
            detail,
            wait,
            self.failures,
            extra={"strategy": plan.strategy, "victim": c.who, "via": backend, "failures": self.failures},
        )

    async def _evict(self, plan: EvictionPlan, c: Candidate) -> tuple[object, str]:
        rel = plan.release
        cluster = self.cluster_of() if self.cluster_of is not None else self.cluster
        urgent = plan.urgent or cluster is None
        backend, via = (self.runtime, "runtime") if urgent else (cluster, "cluster")
        if backend is None:  # no runtime backend: the cluster is all there is
            backend, via = cluster, "cluster"
        grace = 0 if plan.urgent else self.grace_seconds
        amount = plan.share(c)
        figure = f"{amount / (1 << 20):.0f} MiB" if plan.unit == "bytes" else f"{amount:.2f} {plan.unit}"
        message = f"{plan.strategy} ({rel.trigger}): {rel.why}; this pod frees about {figure}"
        extra = {
            "strategy": plan.strategy,
            "trigger": rel.trigger,
            "victim": c.who,
            "uid": c.uid,
            "via": via,
            "grace_seconds": grace,
            "dry_run": self.dry_run,
        }
        if self.dry_run:
            log.warning("dry run: would evict %s via %s: %s", c.who, via, message, extra=extra)
            return EvictionOutcome.EVICTED, via
        if backend is None:
            return Answer(EvictionOutcome.ERROR, "no eviction backend"), "none"
        log.warning("evicting %s via %s (grace %d s): %s", c.who, via, grace, message, extra=extra)
        try:
            return await backend.evict(c.namespace, c.name, c.uid, grace, rel.trigger, message), via
        except Exception as exc:  # a backend that raises has failed like one that says so
            return Answer(EvictionOutcome.ERROR, f"{type(exc).__name__}: {exc}"), via

    def _take_token(self) -> bool:
        now = self.clock()
        while self._tokens and now - self._tokens[0] >= 60.0:
            self._tokens.popleft()
        if len(self._tokens) >= self.max_per_minute:
            return False
        self._tokens.append(now)
        return True

    def _untake_token(self) -> None:
        if self._tokens:
            self._tokens.pop()

    # pending releases ------------------------------------------------------------------------

    def settle(self, charged: Callable[[Pending], float | None], unit: str = "bytes") -> float:
        """What victims on their way out still hold (``charged``: their current amount, None
        when gone); the gone are reported with what they really freed (what they held when
        last measured) and dropped. Returns the total of ``unit`` still pending, for the
        strategy to credit."""
        now = self.clock()
        total = 0.0
        for uid, p in list(self.pending.items()):
            held = charged(p)
            if held is None or held <= 0 or now - p.since > self.pending_timeout:
                del self.pending[uid]
                mib = p.unit == "bytes"
                log.info(
                    "%s: %s gone after %.1f s, freed about %s (expected %s)",
                    p.strategy,
                    p.who,
                    now - p.since,
                    f"{p.held / (1 << 20):.0f} MiB" if mib else f"{p.held:.2f} {p.unit}",
                    f"{p.expected / (1 << 20):.0f} MiB" if mib else f"{p.expected:.2f} {p.unit}",
                    extra={
                        "strategy": p.strategy,
                        "victim": p.who,
                        "seconds": round(now - p.since, 3),
                        "freed": round(p.held),
                    },
                )
                continue
            p.held = held
            if p.unit == unit:
                total += held
        for uid, until in list(self._blocked.items()):
            if now >= until:
                del self._blocked[uid]
        for uid, t in list(self._last.items()):
            if now - t >= self.repeat_after:
                del self._last[uid]
        return total

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await t
