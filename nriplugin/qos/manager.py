"""The QoS manager's loop (seed 004 §7.3): collect -> assess -> decide -> apply, as overlays.

Every decision is an overlay on the desired state with its owner (``qos:cpuSuppress``,
``qos:cpuBurst``) and reason: the one writer applies it, the reconciler keeps it against
other writers, ``explain`` and the hooks see it. Turning the manager off (policy) withdraws
its overlays, so BE gets its CPU back; stopping the agent leaves them in place (a restart must
not unthrottle BE).

Timing: a full round every ``syncPeriod`` (1 s), and a fast path every 50 ms between rounds
that reads only node CPU and BE's own usage (a few files) and tightens BE's limit at once
when what LS and the system use jumps: this kernel refuses PSI triggers, so the fast path is
what keeps the reaction to an LS spike near 100 ms (koordlet: 1-2 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from nriplugin.intent.core import requested
from nriplugin.kernel.psi_trigger import PressureWatch, Trigger, open_trigger
from nriplugin.node.desired import DesiredState
from nriplugin.node.model import POD_PREFIX, NodeModel
from nriplugin.node.turns import Turn
from nriplugin.policy.cache import RuleCache
from nriplugin.policy.qos import QoSClass
from nriplugin.qos import scores
from nriplugin.qos.collect import ContainerUsage
from nriplugin.qos.cpu_burst import Burster, Change, burst_ratio, wants_burst
from nriplugin.qos.cpu_suppress import PERIOD_US, Limiter, Target, be_target, cpuset_size, quota_us
from nriplugin.qos.levels import Assessor, Level, thresholds_of
from nriplugin.qos.node_resource import LS_CLASSES, Capacity, capacity
from nriplugin.qos.sample import FastSample, NodeSample
from nriplugin.qos.trends import Trends

HISTORY = 300.0  # seconds of samples kept for the trends (the seed's 5 minutes)

log = logging.getLogger("nriplugin.qos")

SUPPRESS = "qos:cpuSuppress"
BURST = "qos:cpuBurst"
FAST_PERIOD = 0.05  # seconds between fast samples (two /proc reads and BE's counter: ~30 µs)
FAST_JUMP = 0.15  # cores: a change in non-BE usage that calls for a decision now


class Collector(Protocol):
    @property
    def by_container(self) -> Mapping[str, ContainerUsage]: ...
    def sample(self, be_groups: Sequence[str] = ()) -> NodeSample: ...
    async def sample_async(self, be_groups: Sequence[str] = ()) -> NodeSample: ...
    def fast(self) -> FastSample: ...
    def group_cpu_seconds(self, group: str) -> float | None: ...
    def pressure_path(self, group: str) -> str | None: ...


class EvictionHook(Protocol):
    """CPUEvict and MemoryEvict (``qos/eviction.py``): after CPUSuppress in every round, and
    on the kernel's memory events between rounds."""

    def start(self, loop: asyncio.AbstractEventLoop) -> None: ...
    def stop(self) -> None: ...
    def after_round(
        self,
        sample: NodeSample,
        cap: Capacity,
        level: int,
        cpu_score: float,
        memory_score: float,
        be_limit: float | None,
        be_target: float,
    ) -> None: ...


class Owner(Protocol):
    """Where QoS-level groups are owned (the reconciler)."""

    def own_group(self, path: str) -> str: ...


class Observer(Protocol):
    def round_done(self, seconds: float, collect_seconds: float) -> None: ...
    def scores(self, cpu: float, cpu_level: str, memory: float, memory_level: str) -> None: ...
    def be_limit(self, cores: float) -> None: ...
    def suppressed(self, reason: str) -> None: ...
    def burst(self, granted: bool) -> None: ...


class _Quiet:
    def round_done(self, seconds: float, collect_seconds: float) -> None:
        pass

    def scores(self, cpu: float, cpu_level: str, memory: float, memory_level: str) -> None:
        pass

    def be_limit(self, cores: float) -> None:
        pass

    def suppressed(self, reason: str) -> None:
        pass

    def burst(self, granted: bool) -> None:
        pass


@dataclass(frozen=True, slots=True)
class Decision:
    """One thing the manager did, for the operator's view (``nriplugin top``) and the log."""

    t: float
    owner: str
    target: str
    value: str
    why: str


@dataclass
class _Rate:
    """A counter's rate over the window since its previous reading."""

    t: float | None = None
    value: float = 0.0

    def update(self, t: float, value: float | None) -> float | None:
        if value is None:
            self.t = None
            return None
        prev_t, prev = self.t, self.value
        self.t, self.value = t, value
        if prev_t is None or t <= prev_t:
            return None
        return max(0.0, (value - prev) / (t - prev_t))


def _be_parent(group: str) -> str | None:
    """A BE pod's QoS-level group (kubelet's besteffort group, either driver): its parent
    directory. A BE pod elsewhere (in a group shared with LS) is not suppressed through it."""
    parent, _, _ = group.rpartition("/")
    name = parent.rpartition("/")[2]
    return parent if name == "besteffort" or name.endswith("-besteffort.slice") else None


class PodGroups:
    """What a round needs of the pods — the QoS-level groups holding BE pods, and the LS pods'
    ``cpu.pressure`` files (cgroup v2: their PSI triggers) — kept as pods come and go: a round
    looks only at the pods that came since the last one, never at the whole node. On the hook
    path a new pod is only noted."""

    def __init__(
        self, model: NodeModel, desired: DesiredState, pressure_path: Callable[[str], str | None] = lambda g: None
    ) -> None:
        self.model = model
        self.desired = desired
        self.pressure_path = pressure_path
        self._dirty: set[str] = {k for k in model if k.startswith(POD_PREFIX)}
        self._be: dict[str, str] = {}  # BE pod key -> its QoS-level group
        self._ls: dict[str, str] = {}  # LS pod key -> its cpu.pressure
        self._moved = True
        model.subscribe(self)

    def added(self, key: str) -> None:
        if key.startswith(POD_PREFIX):
            self._dirty.add(key)

    def removed(self, key: str) -> None:
        if key.startswith(POD_PREFIX):
            self._dirty.discard(key)
            gone = self._be.pop(key, None) is not None
            self._moved = self._ls.pop(key, None) is not None or gone or self._moved

    def started(self, key: str, existing: bool) -> None:
        pass

    def changed(self, key: str) -> None:
        pass

    def resynced(self) -> None:
        pass

    def refresh(self) -> bool:
        """Take in the pods that came, in one go; returns whether anything changed since
        last asked."""
        for _ in self.refresh_steps():
            pass
        return self.moved()

    async def refresh_async(self) -> bool:
        """:meth:`refresh`, giving the event loop back between turns."""
        for _ in self.refresh_steps():
            await asyncio.sleep(0)
        return self.moved()

    def refresh_steps(self) -> Iterator[None]:
        turn = Turn()
        while self._dirty:
            key = self._dirty.pop()
            r = self.model.get(key)
            if r is not None and r.group is not None:
                qos = self.desired.qos_of(key)
                if qos is QoSClass.BE:
                    parent = _be_parent(r.group)
                    if parent is not None:
                        self._be[key] = parent
                        self._moved = True
                elif qos is not None and qos.value in LS_CLASSES:
                    path = self.pressure_path(r.group)
                    if path is not None:
                        self._ls[key] = path
                        self._moved = True
            if self._dirty and turn.over():
                yield
                turn.restart()

    def moved(self) -> bool:
        moved, self._moved = self._moved, False
        return moved

    def be(self) -> list[str]:
        return sorted(set(self._be.values()))

    def ls(self) -> set[str]:
        """The LS pods' ``cpu.pressure`` files."""
        return set(self._ls.values())


class QoSManager:
    def __init__(
        self,
        model: NodeModel,
        desired: DesiredState,
        owner: Owner,
        collector: Collector,
        rules: RuleCache,
        observer: Observer | None = None,
        psi_path: str | None = "/proc/pressure/cpu",
        eviction: EvictionHook | None = None,
    ) -> None:
        self.model = model
        self.eviction = eviction
        self.desired = desired
        self.owner = owner
        self.collector = collector
        self.rules = rules
        self.observer: Observer = observer or _Quiet()
        self.limiter = Limiter()
        self.burster = Burster()
        self.decisions: deque[Decision] = deque(maxlen=50)
        self.last: NodeSample | None = None
        self.trends = Trends(HISTORY)  # the scores' 5-minute trends, kept incrementally
        cfg = rules.policy.qosManager
        self.cpu = Assessor.from_config(cfg.cpuPressure)
        self.memory = Assessor.from_config(cfg.memoryPressure)
        self.level = Level.LOW
        self.ratio = 1.0
        self._groups: list[str] = []  # the QoS-level groups holding BE pods
        self.pods = PodGroups(model, desired, collector.pressure_path)
        self._be_round, self._be_fast = _Rate(), _Rate()  # BE's usage over each path's own window
        self._non_be = 0.0  # non-BE usage at the last decision
        self._task: asyncio.Task[None] | None = None
        self.psi_path = psi_path
        self._trigger: Trigger | None = None
        self.ls_pressure: PressureWatch | None = None  # the LS pods' cpu.pressure (cgroup v2)
        self._ls_refused_said = False
        self._wake = asyncio.Event()
        self._applied: set[str] = set()  # QoS-level groups with our suppression overlay
        self._burst_extra = 0.0  # cores granted to LS bursts (BE's share is cut by as much)
        self._mode: str | None = None  # the suppression policy in force (cfsQuota, cpuset)
        self._cpuset_n: int | None = None  # CPUs BE's containers are on (cpuset policy)

    # the loop ---------------------------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.psi_path:
            self._trigger, why = open_trigger(self.psi_path)
            if self._trigger is not None:
                self._trigger.start(loop, self._wake.set)
                log.info("PSI trigger armed on %s: a CPU stall wakes a round at once", self.psi_path)
            else:
                log.info("no PSI trigger (%s); the %.0f ms fast path carries the reaction", why, FAST_PERIOD * 1e3)
        self.ls_pressure = PressureWatch()
        self.ls_pressure.start(loop, self._wake.set)
        if self.eviction is not None:
            self.eviction.start(loop)
        self._task = loop.create_task(self.run())

    def stop(self) -> None:
        """Stop deciding; overlays stay (a restarted agent takes over from them)."""
        if self._task is not None:
            self._task.cancel()
        if self._trigger is not None:
            self._trigger.close()
            self._trigger = None
        if self.ls_pressure is not None:
            self.ls_pressure.close()
            self.ls_pressure = None
        if self.eviction is not None:
            self.eviction.stop()

    async def run(self) -> None:
        next_round = 0.0
        while True:
            try:
                now = time.monotonic()
                if now >= next_round or self._wake.is_set():
                    self._wake.clear()
                    await self.round_async()
                    next_round = now + self._sync_period()
                else:
                    self.fast_round()
            except asyncio.CancelledError:
                raise
            except Exception:  # a round must never end the loop
                log.exception("QoS round failed; trying again next round")
            if self._trigger is None and not (self.ls_pressure and self.ls_pressure.fds):
                await asyncio.sleep(FAST_PERIOD)  # nothing else can wake us: the cheap wait
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), FAST_PERIOD)

    def _sync_period(self) -> float:
        return float(self.rules.policy.qosManager.syncPeriod)

    # rounds -----------------------------------------------------------------------------------

    def round(self) -> None:
        """One full round, in one go (tests, tools)."""
        if self._enabled():
            self._pods_moved(self.pods.refresh())
            self._decide(self.collector.sample(self._groups))

    async def round_async(self) -> None:
        """One full round; the pods' news and the collection give the event loop back
        between turns (the agent's loop: hooks are not held up by a large node's round)."""
        if self._enabled():
            self._pods_moved(await self.pods.refresh_async())
            self._decide(await self.collector.sample_async(self._groups))

    def _enabled(self) -> bool:
        """False when the manager is off (its overlays withdrawn)."""
        if not self.rules.policy.qosManager.enable:
            self.withdraw_all("the QoS manager is disabled")
            return False
        return True

    def _pods_moved(self, moved: bool) -> None:
        if moved:
            self._groups = self.pods.be()
            self.watch_ls_pressure()

    def _decide(self, sample: NodeSample) -> None:
        """Assess and act on a round's sample. Its latency is the collection's own time plus
        this (not the waits between collection chunks)."""
        t0 = time.perf_counter()
        cfg = self.rules.policy.qosManager
        self.assess(sample)
        cap = capacity(sample, cfg.systemReserved.cpu)
        be = self._be_round.update(sample.t, sample.be_cpu_seconds)
        if be is not None:  # BE's group counter (read by the collector): pods just started count too
            cap = replace(cap, be_usage=be, non_be_usage=max(0.0, sample.cpu_busy_cores - be))
        # LS first (§7.6): bursts are granted, then BE is limited within what is left.
        if cfg.runs("CPUBurst"):
            self._burst_extra = self.burst(sample.t, cap)
        else:
            self._burst_extra = self.end_bursts(sample.t, "CPUBurst is off")
        if cfg.runs("CPUSuppress"):
            # Until BE's group has been read twice, what is not BE is not known: the usage
            # budget waits for it rather than taking BE's own CPU for LS's.
            self.apply_be(sample.t, self.be_target(cap, usage_known=be is not None))
        elif self._applied or self._cpuset_n is not None:
            self.withdraw_all("CPUSuppress is off")
        if self.eviction is not None:  # eviction only when suppression is not enough (§7.6)
            target = self.be_target(cap).cores
            self.eviction.after_round(
                sample, cap, self.level, self.cpu.score, self.memory.score, self.limiter.current, target
            )
        self._non_be = cap.non_be_usage
        self.observer.round_done(time.perf_counter() - t0 + sample.collect_seconds, sample.collect_seconds)

    def fast_round(self) -> None:
        """Between rounds: node CPU and BE's usage only; decide now if non-BE usage jumped."""
        cfg = self.rules.policy.qosManager
        if not cfg.enable or not self._groups or self.last is None:
            return
        fast = self.collector.fast()
        be = self._be_fast.update(fast.t, self._be_seconds())
        if be is None:
            return
        non_be = max(0.0, fast.cpu_busy_cores - be)
        if abs(non_be - self._non_be) < FAST_JUMP:
            return
        base = capacity(self.last, cfg.systemReserved.cpu)
        cap = replace(base, be_usage=be, non_be_usage=non_be)
        if cfg.runs("CPUSuppress"):
            self.apply_be(fast.t, self.be_target(cap), tighten_only=True)
        self._non_be = non_be

    def watch_ls_pressure(self) -> None:
        """On cgroup v2, a CPU stall of an LS pod (its ``cpu.pressure`` trigger) wakes a round
        at once: the kernel tells us LS is waiting before usage shows it."""
        watch = self.ls_pressure
        if watch is None:
            return
        watch.follow(self.pods.ls())
        if watch.refused and not self._ls_refused_said:
            path, why = next(iter(watch.refused.items()))
            log.info("no PSI trigger on LS groups (%s: %s); the fast path carries the reaction", path, why)
            self._ls_refused_said = True

    def _be_seconds(self) -> float | None:
        if not self._groups:
            return None
        total = 0.0
        for g in self._groups:
            v = self.collector.group_cpu_seconds(g)
            if v is None:
                return None
            total += v
        return total

    # assessment and strategies ----------------------------------------------------------------

    def assess(self, sample: NodeSample) -> None:
        """The pressure scores (scores.py) over the last five minutes, smoothed into levels."""
        self.trends.add(sample)
        cfg = self.rules.policy.qosManager
        for assessor, pc in ((self.cpu, cfg.cpuPressure), (self.memory, cfg.memoryPressure)):
            assessor.configure(thresholds_of(pc), pc.hysteresis, pc.fallTime)  # a reload applies at once
        cpu = self.cpu.update(sample.t, scores.cpu_pressure(scores.cpu_inputs(sample, self.trends)).total)
        mem = self.memory.update(sample.t, scores.memory_pressure(scores.memory_inputs(sample, self.trends)).total)
        self.last = sample
        self.level = cpu.level
        self.ratio = cfg.cpuSuppress.suppressRatio.of(cpu.level)
        self.observer.scores(cpu.score, cpu.level.name, mem.score, mem.level.name)

    def be_target(self, cap: Capacity, usage_known: bool = True) -> Target:
        p = self.rules.policy
        s, usage = p.qosManager.cpuSuppress, p.resourceUsedThresholdWithBE
        return be_target(
            cap,
            self.ratio,
            self.level.name,
            usage_threshold_percent=usage.cpuSuppressThresholdPercent if usage.enable and usage_known else 0.0,
            burst_granted=self._burst_extra,
            floor=s.minCores,
        )

    def burst(self, now: float, cap: Capacity) -> float:
        """CPUBurst: LS containers at their limit get ``limit x ratio`` while the node (BE
        left out: it yields) is idle enough and the extra fits; returns the extra cores granted."""
        b = self.rules.policy.qosManager.cpuBurst
        self.burster.duration, self.burster.cooldown = b.burstDuration, b.burstCooldown
        idle = max(0.0, 1.0 - cap.non_be_usage / cap.total) if cap.total else 0.0
        ratio = burst_ratio(idle, b.burstRatio, b.partialBurstRatio, b.minNodeCPUIdle, b.fullBurstNodeCPUIdle)
        usage = self.collector.by_container
        bursting = self.burster.bursting()
        extra = 0.0
        for k, r in bursting.items():
            lim = usage[k].limit_cores if k in usage else None
            extra += (lim or 0.0) * (r - 1)
        headroom = cap.schedulable - cap.non_be_usage - extra
        live: set[str] = set()
        for key, u in usage.items():
            if u.qos.value not in LS_CLASSES or not u.limit_cores:
                continue
            live.add(key)
            r = ratio
            if key not in bursting and u.limit_cores * (ratio - 1) > headroom:
                r = 1.0  # the extra would not fit: the sum never exceeds the node
            change = self.burster.step(now, key, wants_burst(u.throttled_ratio, u.cpu_cores, u.limit_cores), r)
            if change is None:
                continue
            self._apply_burst(now, key, change)
            delta = (
                u.limit_cores * (change.ratio - 1)
                if change.ratio > 1
                else -u.limit_cores * (bursting.get(key, 1.0) - 1)
            )
            extra += delta
            headroom -= delta
        self.burster.forget(live)
        return max(0.0, extra)

    def end_bursts(self, now: float, why: str) -> float:
        for key in self.burster.bursting():
            self.desired.withdraw_overlay(key, BURST)
            self.decisions.append(Decision(now, BURST, key[:12], "x1", why))
        self.burster.forget(set())
        return 0.0

    def _apply_burst(self, now: float, key: str, change: Change) -> None:
        r = self.model.get(key)
        if r is None or r.container is None:
            return
        quota = requested(r.container, "cpu.cfs_quota_us")
        if change.ratio > 1 and quota:
            period = requested(r.container, "cpu.cfs_period_us") or PERIOD_US
            values: dict[str, int | str] = {"cpu.cfs_quota_us": int(quota * change.ratio), "cpu.cfs_period_us": period}
            self.desired.set_overlay(key, BURST, values, change.why)
        else:
            self.desired.withdraw_overlay(key, BURST)
        self.observer.burst(change.ratio > 1)
        who = f"{r.pod.namespace}/{r.pod.name}/{r.container.name}"
        self.decisions.append(Decision(now, BURST, who, f"x{change.ratio:g}", change.why))
        log.info("%s: CPU burst x%g: %s", who, change.ratio, change.why, extra={"ratio": change.ratio})

    def apply_be(self, now: float, target: Target, tighten_only: bool = False) -> None:
        s = self.rules.policy.qosManager.cpuSuppress
        if not self._groups:
            return
        mode = self.rules.policy.cpu_suppress_policy()
        if mode != self._mode:
            self._switch(mode)
        lim = self.limiter
        lim.deadband, lim.relax_hold, lim.max_relax_per_minute = s.deadbandCores, s.raiseDelay, s.maxWritesPerMinute
        before = lim.current
        new = lim.step(now, target.cores, tighten_only)
        if new is None:
            return
        if mode == "cpuset":
            written = self._apply_cpuset(new, before, target.why)
        else:
            self._apply_quota(new, before, target.why)
            written = f"{new:.2f} cores"
        if written is None:
            return
        self.observer.be_limit(new if mode == "cfsQuota" else float(cpuset_size(new)))
        self.observer.suppressed(self.level.name)
        self.decisions.append(Decision(now, SUPPRESS, ",".join(self._groups), written, target.why))
        log.info(
            "BE limited to %s: %s",
            written,
            target.why,
            extra={"be_limit_cores": round(new, 3), "level": self.level.name, "policy": mode},
        )

    def _apply_quota(self, new: float, before: float | None, why: str) -> None:
        """cfsQuota: BE's QoS-level group gets the quota (and the lowest weight)."""
        values: dict[str, int | str] = {
            "cpu.cfs_quota_us": quota_us(new),
            "cpu.cfs_period_us": PERIOD_US,
            # the lowest weight, as kubelet gives its besteffort group: within its quota BE
            # still yields to LS on every CPU
            "cpu.shares": self.rules.policy.beMinCPUShares,
        }
        # cgroup v1 refuses a child's quota above its parent's: BE's pods and containers get
        # the limit as a ceiling (new ones at birth too) - lowered before the group when it
        # falls, after it when it rises (the reconciler also retries a batch's refusals).
        lowering = before is None or new < before
        if lowering:
            self.desired.set_ceiling(QoSClass.BE, new, SUPPRESS, f"BE's group is limited to {new:.2f} cores")
        for group in self._groups:
            key = self.owner.own_group(group)
            self.desired.set_overlay(key, SUPPRESS, values, why)
            self._applied.add(key)
        if not lowering:
            self.desired.set_ceiling(QoSClass.BE, new, SUPPRESS, f"BE's group is limited to {new:.2f} cores")

    def _apply_cpuset(self, new: float, before: float | None, why: str) -> str | None:
        """cpuset: BE's containers on whole CPUs of the share pool (SMT siblings together),
        as many as the limit rounded up (at least one). Only a change in the count is written,
        so the integer steps are a deadband of their own (koordlet rewrites it every tick,
        koordinator#1103)."""
        n = cpuset_size(new)
        if before is not None and self._cpuset_n == n:
            return None
        self._cpuset_n = n
        self.desired.set_cpuset_limit(QoSClass.BE, n, SUPPRESS, f"{why}; BE on {n} CPU(s) of the share pool")
        return f"{n} CPU(s)"

    def _switch(self, mode: str) -> None:
        """The suppression policy changed: lift what the other one set, start afresh."""
        if mode != "cpuset":
            self._lift_cpuset(f"the suppression policy is now {mode}")
        if mode != "cfsQuota" and self._applied:
            for key in sorted(self._applied):
                self.desired.withdraw_overlay(key, SUPPRESS)
            self.desired.withdraw_ceiling(QoSClass.BE)
            self._applied.clear()
        self.limiter.reset()
        self._mode = mode

    def _lift_cpuset(self, why: str) -> None:
        if self._cpuset_n is not None:
            self.desired.set_cpuset_limit(QoSClass.BE, None, SUPPRESS, f"{why}: BE on the whole share pool again")
            self._cpuset_n = None

    def withdraw_all(self, why: str) -> None:
        if not self._applied and not self.burster.bursting() and self._cpuset_n is None:
            return
        for key in sorted(self._applied):  # the group first: its children rise after it
            self.desired.withdraw_overlay(key, SUPPRESS)
        self.desired.withdraw_ceiling(QoSClass.BE)
        self._applied.clear()
        self._lift_cpuset(why)
        self._mode = None
        self._burst_extra = self.end_bursts(time.monotonic(), why)
        self.limiter.reset()
        self.decisions.append(Decision(time.monotonic(), SUPPRESS, "all", "withdrawn", why))
        log.info("QoS overlays withdrawn: %s", why)
