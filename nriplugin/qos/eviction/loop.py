"""Eviction in the QoS manager: the facts CPUEvict and MemoryEvict decide on, when they decide,
and handing their plans to the evictor.

- CPUEvict decides once per manager round (:meth:`Eviction.cpu_round`), after CPUSuppress,
  from the round's sample, level, capacity and BE limit.
- MemoryEvict decides on every memory event the kernel sends for the pods root(s) — usage
  crossing one of a ladder of thresholds (50, 60, the trigger, 80, 90, 95 % of the node's
  memory), reclaim at ``critical`` pressure; ``memory.events`` and PSI on v2 — coalesced to at
  most one check per ``MIN_GAP``, and once per round as a safety net. A check reads only the
  pods root(s); the BE pods' groups are read when MemoryEvict acts. Each pod's growth (leaks)
  is kept from the collector's rounds that read every container's memory
  (:meth:`Eviction.observe_pods`), so the trend costs no reads of its own.

Candidates come from the node model (pods and their QoS class), the round's per-container CPU,
and priorities from the cluster (``Priorities``) or the ``koordinator.sh/priority`` label.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from nriplugin.kernel.cgroup import Cgroups
from nriplugin.kernel.memory_events import MemoryEvents
from nriplugin.kernel.stats import Stats, WorkingSet
from nriplugin.node.model import NodeModel
from nriplugin.policy.cache import RuleCache
from nriplugin.policy.model import Policy, QoSManagerPolicy
from nriplugin.policy.qos import QoSClass
from nriplugin.qos.collect import ContainerUsage, batch_cpu_request
from nriplugin.qos.eviction.cpu import CpuConfig, CpuEvictDecider, CpuFacts
from nriplugin.qos.eviction.evictor import Evictor, Pending, Priorities
from nriplugin.qos.eviction.memory import MemoryConfig, MemoryEvictDecider, MemoryFacts
from nriplugin.qos.eviction.victims import Candidate, EvictionPlan, label_priority
from nriplugin.qos.sample import LS_CLASSES
from nriplugin.qos.strategy import Host, Round, Strategy, register

log = logging.getLogger("nriplugin.qos.evict")

MIN_GAP = 0.05  # seconds between memory checks driven by events (pressure fires in storms)
LADDER = (50.0, 60.0, 80.0, 90.0, 95.0)  # percent of node memory, besides the trigger
POD_GROWTH_WINDOW = 60.0  # seconds over which a pod's growth is measured
POD_GROWTH_MIN_SPAN = 4.0  # seconds of readings (two halves) before a pod's growth counts


class ClassLookup(Protocol):
    def qos_of(self, key: str) -> QoSClass | None: ...


class ClusterPod(Protocol):
    @property
    def priority(self) -> int | None: ...
    @property
    def koord_priority(self) -> int | None: ...


class ClusterPodLookup(Protocol):
    def by_uid(self, uid: str) -> ClusterPod | None: ...


class ClusterPriorities:
    """Priorities from the cluster's pod cache (``nriplugin/cluster``) while it runs: the pod's
    ``spec.priority``, else its ``koordinator.sh/priority`` label as the API server has it."""

    def __init__(self, pods_of: Callable[[], ClusterPodLookup | None]) -> None:
        self.pods_of = pods_of

    def priority(self, uid: str) -> int | None:
        pods = self.pods_of()
        info = None if pods is None else pods.by_uid(uid)
        if info is None:
            return None
        return info.priority if info.priority is not None else info.koord_priority


class Eviction:
    def __init__(
        self,
        model: NodeModel,
        desired: ClassLookup,
        cgroups: Cgroups,
        stats: Stats,
        rules: RuleCache,
        evictor: Evictor,
        pods_roots: Iterable[str],
        *,
        priorities: Priorities | None = None,
        usage: Callable[[], Mapping[str, ContainerUsage]] | None = None,
        meminfo_total: Callable[[], int] | None = None,
        force_dry_run: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.force_dry_run = force_dry_run
        self.model = model
        self.desired = desired
        self.cgroups = cgroups
        self.stats = stats
        self.rules = rules
        self.evictor = evictor
        self.roots = [r.strip("/") for r in pods_roots]
        self.priorities = priorities
        self.usage = usage or (lambda: {})
        self.meminfo_total = meminfo_total or self._meminfo_total
        self.clock = clock
        self.cpu = CpuEvictDecider()
        self.memory = MemoryEvictDecider()
        self.memory_score = 0.0
        self._critical = False
        self._events: MemoryEvents | None = None
        self._armed: dict[str, tuple[int, ...]] = {}  # root -> thresholds armed (bytes)
        self._scheduled: asyncio.Handle | None = None
        self._last_check = -1.0
        self._pod_mem: dict[str, deque[tuple[float, int]]] = {}  # pod id -> (t, anon bytes)
        self.last_facts: MemoryFacts | None = None
        self.wakeups: deque[tuple[float, str]] = deque(maxlen=100)  # (t, what fired), for the bench
        self.plans: deque[tuple[float, EvictionPlan]] = deque(maxlen=20)
        self._pod_groups: dict[str, str] = {}
        evictor.on_evicted = self._on_evicted

    # start and stop ----------------------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._events = MemoryEvents(loop, self._fired)
        self._arm()

    def stop(self) -> None:
        if self._scheduled is not None:
            self._scheduled.cancel()
            self._scheduled = None
        if self._events is not None:
            self._events.close()
            self._events = None
        self._armed.clear()

    def _arm(self) -> None:
        """(Re-)arm the kernel's notifications for each pods root at the current capacity."""
        ev = self._events
        if ev is None:
            return
        cfg = self._memory_config()
        total = self.meminfo_total()
        for root in self.roots:
            try:
                d = self.cgroups.group_path(root, "memory")
            except OSError:
                continue
            ws = self.stats.working_set(root)
            if ws is None:
                continue
            cap = min(total, ws.limit) if ws.limit and total else (ws.limit or total)
            if cap <= 0:
                continue
            marks = tuple(sorted({int(cap * p / 100) for p in (*LADDER, cfg.threshold_percent)}))
            if self._armed.get(root) == marks:
                continue
            problems = ev.watch_group(root, d, self.cgroups.hierarchy, marks)
            self._armed[root] = marks
            if problems:
                log.info("memory events on %s: %s; the 1 s rounds check it too", root, "; ".join(problems))
            else:
                log.info(
                    "memory events armed on %s: usage at %s MiB, critical pressure",
                    root,
                    ", ".join(str(b >> 20) for b in marks),
                )

    def _fired(self, what: str) -> None:
        self.wakeups.append((self.clock(), what))
        if what.endswith(":pressure"):
            self._critical = True
        if self._scheduled is not None:
            return
        loop = asyncio.get_running_loop()
        delay = max(0.0, self._last_check + MIN_GAP - self.clock())
        self._scheduled = loop.call_later(delay, self._event_check)

    def _event_check(self) -> None:
        self._scheduled = None
        try:
            self.memory_check()
        except Exception:  # an event must never break the loop
            log.exception("memory check failed")

    # the rounds ---------------------------------------------------------------------------------

    def cpu_round(self, r: Round) -> None:
        """CPUEvict's turn in a round, after CPUSuppress: evict if suppressing BE is not enough."""
        facts = cpu_facts(r)
        if facts is None:
            return
        self._configure_evictor()
        self.cpu.cfg = self._cpu_config()
        if not self.evictor.busy("CPUEvict"):
            plan = self.cpu.decide(
                facts, lambda: [c for c in self.candidates(memory=False) if self.evictor.eligible(c)]
            )
            if plan is not None:
                self._submit(plan)

    def memory_round(self, r: Round) -> None:
        """MemoryEvict's turn in a round: the pods' growth from the collector's reading, the
        kernel's notifications re-armed (the capacity or the threshold may have moved), and a
        check, the safety net under the events."""
        self.memory_score = r.memory_score
        self._configure_evictor()
        if r.sample.memory_read:
            self.observe_pods(r.t)
        self._arm()
        self.memory_check()

    def memory_check(self) -> MemoryFacts | None:
        """Measure the pods' memory now and evict if MemoryEvict says so."""
        self._last_check = now = self.clock()
        if not MemoryEvictStrategy.runs(self.rules.policy.qosManager):
            return None  # between rounds too: a policy that turned it off evicts nothing
        self._configure_evictor()
        total = self.meminfo_total()
        used, limits = 0, []
        for root in self.roots:
            ws = self.stats.working_set(root)
            if ws is not None:
                used += ws.working_set
                limits.append(ws.limit)
        if not limits:
            return None  # no pods root here: nothing that eviction could relieve is measured
        known = [x for x in limits if x is not None]
        cap = min(total, sum(known)) if known and len(known) == len(limits) and total else (total or sum(known))
        growth = self.memory.observe(now, used)
        pending = self._settle()
        self.memory.cfg = self._memory_config()
        facts = MemoryFacts(now, cap, used, growth, self.memory_score, self._critical, int(pending))
        self._critical = False
        self.last_facts = facts
        if self.evictor.busy("MemoryEvict"):
            return facts
        # The BE pods' own memory files are read only when MemoryEvict acts; their growth
        # comes from the collector's readings (observe_pods).
        read: list[Candidate] | None = None

        def cands() -> list[Candidate]:
            nonlocal read
            if read is None:
                read = self.candidates(memory=True)
            return [c for c in read if self.evictor.eligible(c)]

        plan = self.memory.decide(facts, cands)
        if plan is not None:
            log.info("MemoryEvict: %s", plan.release.why, extra={"trigger": plan.release.trigger})
            self._submit(plan)
        return facts

    def _submit(self, plan: EvictionPlan) -> None:
        self.plans.append((self.clock(), plan))
        groups = {c.uid: g for c in plan.victims if (g := self._pod_groups.get(c.uid)) is not None}
        self.evictor.submit(plan, groups)

    def _on_evicted(self, plan: EvictionPlan, c: Candidate) -> None:
        if plan.strategy == "CPUEvict":
            self.cpu.evicted(self.clock())

    def _settle(self) -> float:
        """Bytes still held by memory victims on their way out (gone ones are reported). A
        CPU victim's share is not measured per pod: while its group is there it keeps the
        share it was evicted for, which is what its leaving is reported to free."""

        def held(p: Pending) -> float | None:
            if p.group is None:
                return None
            ws = self.stats.working_set(p.group)
            if ws is None:
                return None
            return float(ws.anon) if p.unit == "bytes" else p.held

        return self.evictor.settle(held, "bytes")

    # candidates ---------------------------------------------------------------------------------

    def candidates(self, memory: bool) -> list[Candidate]:
        """Every BE pod of the node model, as eviction sees it (only BE: see victims.py)."""
        cpu_by_pod: dict[str, float] = {}
        for u in self.usage().values():
            cpu_by_pod[u.pod_id] = cpu_by_pod.get(u.pod_id, 0.0) + u.cpu_cores
        requests: dict[str, float] = {}  # pod id -> its containers' CPU requests (cores)
        for _, c in self.model.containers():
            if c.container is not None:
                req = batch_cpu_request(c.pod, c.container)  # a batch-sized pod asked kubelet for none
                if req is None:
                    shares = c.container.linux.resources.cpu.shares.value
                    req = shares / 1024 if shares > 2 else 0.0
                requests[c.pod.id] = requests.get(c.pod.id, 0.0) + req
        out: list[Candidate] = []
        groups: dict[str, str] = {}
        for key in self.model:
            r = self.model.get(key)
            if r is None or r.container is not None or self.desired.qos_of(key) is not QoSClass.BE:
                continue
            pod = r.pod
            uid = pod.uid or pod.id
            if r.group is not None:
                groups[uid] = r.group
            anon, growth = 0, 0.0
            if memory and r.group is not None:
                ws: WorkingSet | None = self.stats.working_set(r.group)
                if ws is not None:
                    anon = ws.anon
                    growth = self._pod_growth(pod.id)
            prio = self.priorities.priority(uid) if self.priorities is not None else None
            if prio is None:
                prio = label_priority(dict(pod.labels))
            out.append(
                Candidate(
                    uid=uid,
                    namespace=pod.namespace,
                    name=pod.name,
                    qos=QoSClass.BE,
                    priority=prio or 0,
                    cpu_cores=cpu_by_pod.get(pod.id, 0.0),
                    cpu_request_cores=requests.get(pod.id, 0.0),
                    freeable_bytes=anon,
                    growth_bytes_per_min=growth,
                    started=r.since,
                    sandbox_id=pod.id,
                )
            )
        self._pod_groups = groups
        return out

    def observe_pods(self, t: float) -> None:
        """One point of each BE pod's anonymous memory (its containers' RSS) from the
        collector's round that read every container's memory: the leak trend costs no reads
        of its own. A pod with no running container left drops its points."""
        rss: dict[str, int] = {}
        for u in self.usage().values():
            if u.qos is QoSClass.BE:
                rss[u.pod_id] = rss.get(u.pod_id, 0) + u.rss_bytes
        for pod_id in [p for p in self._pod_mem if p not in rss]:
            del self._pod_mem[pod_id]
        for pod_id, anon in rss.items():
            pts = self._pod_mem.setdefault(pod_id, deque())
            if not pts or t > pts[-1][0]:
                pts.append((t, anon))
            while len(pts) > 3 and t - pts[0][0] > POD_GROWTH_WINDOW:
                pts.popleft()

    def _pod_growth(self, pod_id: str) -> float:
        """A pod's sustained anonymous-memory growth in bytes per minute: the smaller of the
        rates over the two halves of the last minute's points, once they span
        ``POD_GROWTH_MIN_SPAN`` seconds; a pod filling its memory as it starts is not a leak."""
        pts = self._pod_mem.get(pod_id)
        if pts is None or len(pts) < 3 or pts[-1][0] - pts[0][0] < POD_GROWTH_MIN_SPAN:
            return 0.0
        (t0, u0), (t2, u2) = pts[0], pts[-1]
        t1, u1 = min(pts, key=lambda p: abs(p[0] - (t0 + t2) / 2))
        if not t0 < t1 < t2:
            return 0.0
        return max(0.0, min((u1 - u0) / (t1 - t0), (u2 - u1) / (t2 - t1))) * 60.0

    # policy -------------------------------------------------------------------------------------

    def _configure_evictor(self) -> None:
        """The policy's eviction settings, every time (a reload applies at once)."""
        e, ev = self.rules.policy.qosManager.eviction, self.evictor
        ev.dry_run = self.force_dry_run or e.dryRun
        ev.max_per_minute, ev.grace_seconds = e.maxPerMinute, e.gracePeriodSeconds
        ev.repeat_after, ev.retry_after = e.repeatAfter, e.retryAfter

    def _cpu_config(self) -> CpuConfig:
        p = self.rules.policy
        ce, u = p.qosManager.cpuEvict, p.resourceUsedThresholdWithBE
        return CpuConfig(
            threshold=ce.evictThreshold,
            cooldown=ce.evictCooldown,
            sustain=ce.sustain,
            stall_threshold=ce.stallThreshold,
            throttle_threshold=ce.throttleThreshold,
            release_factor=ce.releaseFactor,
            satisfaction_lower=u.cpuEvictBESatisfactionLowerPercent,
            satisfaction_upper=u.cpuEvictBESatisfactionUpperPercent,
            be_usage_threshold=float(u.cpuEvictBEUsageThresholdPercent or 90),
            window=float(u.cpuEvictTimeWindowSeconds or 60),
        )

    def _memory_config(self) -> MemoryConfig:
        p = self.rules.policy
        me, u = p.qosManager.memoryEvict, p.resourceUsedThresholdWithBE
        return MemoryConfig(
            threshold_percent=float(u.memoryEvictThresholdPercent),
            lower_percent=None if u.memoryEvictLowerPercent is None else float(u.memoryEvictLowerPercent),
            score_threshold=me.evictThreshold,
            horizon=me.oomHorizon,
            urgent=me.urgentSeconds,
            release_factor=me.releaseFactor,
            leak_bytes_per_min=me.memoryGrowthThreshold * 1024 * 1024,
        )

    def _meminfo_total(self) -> int:
        m = self.stats.meminfo()
        return m.total if m else 0


def cpu_facts(r: Round) -> CpuFacts | None:
    """CPUEvict's inputs from a round (None without the node's capacity). LS stall: the most
    any LS class's containers had a task waiting for a CPU, their own wait: ``cpu.pressure``
    on cgroup v2, their tasks' run-queue delay on v1 (``kernel.stats.RunDelay``). Only when
    no LS container's wait could be read: the node's PSI ``some`` share, an upper bound that
    counts BE's waits too — a BE group throttled at the quota the agent gave it reads as
    "some" pressure the whole time it is throttled (97 % from 0.05 cores of throttled
    spinners on an idle node) — which the shortage estimate tempers with LS's real usage. BE
    counts as suppressed once its limit is within the deadband of what this level allows."""
    cap, sample = r.capacity, r.sample
    if cap is None:
        return None
    stalls = [s for q in LS_CLASSES if (s := sample.usage(q).stall_ratio) is not None]
    stall = max(stalls, default=0.0)
    if not stalls and sample.interval > 0:  # no LS container's own wait was read
        stall = min(1.0, sample.psi_cpu.some_delta_us / (sample.interval * 1e6))
    throttled = max((sample.usage(q).throttled_ratio for q in LS_CLASSES), default=0.0)
    deadband = r.config.cpuSuppress.deadbandCores
    return CpuFacts(
        t=sample.t,
        level=r.level,
        score=r.cpu_score,
        suppressed=r.be_limit is not None and r.be_target is not None and r.be_limit <= r.be_target + deadband,
        total=cap.total,
        system_reserved=cap.system_reserved,
        ls_usage=cap.ls_usage,
        be_usage=cap.be_usage,
        other_usage=max(0.0, cap.non_be_usage - cap.ls_usage),
        ls_stall=stall,
        ls_throttled=throttled,
        be_request=sample.usage("BE").cpu_request_cores,
        be_limit=r.be_limit,
        be_idle=r.be_idle,
    )


@register
class CPUEvictStrategy(Strategy):
    """Evicts BE pods when limiting BE does not relieve LS (``eviction/cpu.py``)."""

    name = "CPUEvict"
    needs_capacity = True

    def __init__(self, host: Host) -> None:
        self.host = host

    @classmethod
    def configured(cls, cfg: QoSManagerPolicy) -> bool:
        return cfg.cpuEvict.enabled

    @classmethod
    def reads_ls_waits(cls, policy: Policy) -> bool:
        """LS's stall is one of its triggers, except while BE's tasks run SCHED_IDLE: then it
        evicts on no stall (``eviction/cpu.py``)."""
        return cls.runs(policy.qosManager) and not policy.beProcess.schedIdle

    def decide(self, r: Round) -> None:
        if self.host.eviction is not None:
            self.host.eviction.cpu_round(r)


@register
class MemoryEvictStrategy(Strategy):
    """Evicts BE pods before the pods' memory runs out (``eviction/memory.py``); between rounds
    the kernel's memory events wake it (:meth:`Eviction.memory_check`)."""

    name = "MemoryEvict"

    def __init__(self, host: Host) -> None:
        self.host = host

    @classmethod
    def configured(cls, cfg: QoSManagerPolicy) -> bool:
        return cfg.memoryEvict.enabled

    def decide(self, r: Round) -> None:
        if self.host.eviction is not None:
            self.host.eviction.memory_round(r)
