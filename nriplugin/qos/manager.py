"""The QoS manager's loop: collect -> assess -> decide -> apply, as overlays.

Deciding is the strategies' (``strategy.py``): each round the manager hands a :class:`Round` to
every registered strategy the policy runs, in the one order (NodeQOSResource ->
SystemQOSResource -> CPUBurst -> CPUSuppress -> CPUEvict -> MemoryEvict), and tells each one
the policy turned off to withdraw its overlays. A strategy that sizes CPU cannot run without
the node's capacity: with NodeQOSResource off, those stand down too (said once in the log).

Every decision is an overlay on the desired state with its owner (``qos:cpuSuppress``,
``qos:cpuBurst``) and reason: the one writer applies it, the reconciler keeps it against
other writers, ``explain`` and the hooks see it. Turning the manager off (policy) withdraws
its overlays, so BE gets its CPU back; so does stopping the agent (:meth:`QoSManager.give_back`):
the groups BE's quota sits on are the kubelet's, and a kubelet restarted after the agent must
find them as it set them. BE's tasks keep SCHED_IDLE meanwhile, so LS keeps its priority until
the next agent's first round.

Timing: a full round every ``syncPeriod`` (1 s), and a fast path every 30 ms between rounds
(250 ms while BE runs next to nothing; and after each round) that reads only node CPU, BE's
own usage and the pods root's (a few files) and, when what LS and the system use jumps, runs
the strategies' ``between_rounds`` at once (CPUSuppress tightens BE's limit). What the pods
use is read from their root's own counter over the last interval
(``node_resource.FastWindow``), so a short interval is not tick noise; a rise is followed
with sooner samples, each measuring it from the sample that first showed it (an interval all
inside it) and what LS's pods waited for a CPU since, and deciding. A kernel that accepts PSI
triggers wakes a round at once on a CPU stall; on one that refuses them, the fast path alone
keeps the reaction to an LS spike within a fast period or two (koordlet: 1-2 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import replace

from nriplugin.kernel.psi_trigger import PressureWatch, Trigger, open_trigger
from nriplugin.node.desired import DesiredState
from nriplugin.node.model import POD_PREFIX, NodeModel
from nriplugin.obs.unobserved import Unobserved
from nriplugin.pacing.turns import Pacer
from nriplugin.policy.cache import RuleCache
from nriplugin.policy.qos import QoSClass
from nriplugin.qos import node_resource, scores
from nriplugin.qos.cpu_burst import BURST, Burster, CPUBurstStrategy
from nriplugin.qos.cpu_suppress import SUPPRESS, CPUSuppressStrategy, Limiter
from nriplugin.qos.eviction import loop as eviction_loop  # noqa: F401 - registers CPUEvict, MemoryEvict
from nriplugin.qos.levels import Assessor, Level, thresholds_of
from nriplugin.qos.sample import LS_CLASSES, NodeSample
from nriplugin.qos.strategy import (
    REGISTRY,
    CollectorView,
    Decision,
    EvictionHook,
    FastUsage,
    Owner,
    Round,
    Strategy,
    StrategyObserver,
)
from nriplugin.qos.trends import Trends
from nriplugin.qos.usage import UsageWindows

__all__ = ["BURST", "SUPPRESS", "Decision", "EvictionHook", "PodGroups", "QoSManager"]

# Every strategy, in the order they run; fails here, at import, unless each of the policy's
# plugin names has its registered strategy (importing a strategy's module registers it).
STRATEGIES = REGISTRY.strategies()

HISTORY = 300.0  # seconds of samples kept for the trends: five minutes

log = logging.getLogger("nriplugin.qos")

FAST_PERIOD = 0.03  # seconds between fast samples (two /proc reads and a few counters: cheap)
FAST_FOLLOW = 0.03  # seconds from the sample that shows a rise of non-BE usage to the first that measures it
FAST_REFINE = 0.02  # seconds between the samples that follow a rise after that (each measures it from its start)
FAST_IDLE = 0.25  # seconds between fast samples while BE uses next to no CPU: nothing to cut
FAST_BE_BUSY = 0.05  # cores: BE using less than this (over a fast interval) has nothing to cut
FAST_JUMP = 0.15  # cores: a change in non-BE usage that calls for a decision now
# cores: a followed rise's last interval this far above its measure since its start began
# later (more than a short interval's tick error): it is followed from the sample before
FAST_RESTART = 0.3
FAST_WINDOW = 0.15  # seconds of /proc/stat samples non-BE usage is measured over without a pods counter
FAST_OUTSIDE = 1.0  # seconds of /proc/stat samples what runs outside the pods is measured over


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
        self,
        model: NodeModel,
        desired: DesiredState,
        pressure_path: Callable[[str], str | None] = lambda g: None,
        pacer: Pacer | None = None,
    ) -> None:
        self.pacer = Pacer() if pacer is None else pacer
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
            await self.pacer.give_way()
        return self.moved()

    def refresh_steps(self) -> Iterator[None]:
        turn = self.pacer.turn()
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
        collector: CollectorView,
        rules: RuleCache,
        observer: StrategyObserver | None = None,
        psi_path: str | None = "/proc/pressure/cpu",
        eviction: EvictionHook | None = None,
        pacer: Pacer | None = None,
        usage: UsageWindows | None = None,
    ) -> None:
        """``pacer``: the loop shared with the hooks (the agent's): a round gives it back
        between turns; default: turns measured in time alone. ``usage``: where each round's
        measurements are kept over time for the NodeMetric report (None: no report)."""
        self.model = model
        self.usage = usage
        self.eviction = eviction
        self.desired = desired
        self.owner = owner
        self.collector = collector
        self.rules = rules
        self.observer: StrategyObserver = observer or Unobserved()
        self.decisions: deque[Decision] = deque(maxlen=50)
        self.last: NodeSample | None = None
        self.trends = Trends(HISTORY)  # the scores' 5-minute trends, kept incrementally
        cfg = rules.policy.qosManager
        self.cpu = Assessor.from_config(cfg.cpuPressure)
        self.memory = Assessor.from_config(cfg.memoryPressure)
        self.level = Level.LOW
        self.ratio = 1.0
        self.cpu_terms: dict[str, float] | None = None  # the last raw CPU score's terms
        self.groups: list[str] = []  # the QoS-level groups holding BE pods
        self.pods = PodGroups(model, desired, collector.pressure_path, pacer)
        self._fast = node_resource.FastWindow(FAST_WINDOW, FAST_OUTSIDE)  # node and BE usage between rounds
        self._fast_groups: list[str] = []  # the BE groups whose counters the window sums
        self._fast_roots: list[str] = []  # the pods roots holding them (their counters: all pods)
        self._non_be = 0.0  # non-BE usage at the last decision
        self._rise: float | None = None  # the sample that first showed the rise being followed
        self._rise_stall: int | None = None  # the LS pods' CPU waits (µs) at that sample
        self._follows = 0  # samples that measured the rise followed (FAST_FOLLOW, then FAST_REFINE)
        self._last: tuple[float, int | None] | None = None  # the last fast sample's time, LS's waits then
        self._be_idle = False  # BE used next to no CPU in the last fast interval (FAST_IDLE)
        self._task: asyncio.Task[None] | None = None
        self.psi_path = psi_path
        self._trigger: Trigger | None = None
        self.ls_pressure: PressureWatch | None = None  # the LS pods' cpu.pressure (cgroup v2)
        self._ls_refused_said = False
        self._no_capacity_said = False
        self._wake = asyncio.Event()
        self.strategies: tuple[Strategy, ...] = tuple(cls(self) for cls in STRATEGIES)
        self._by_name: dict[str, Strategy] = {s.name: s for s in self.strategies}

    @property
    def limiter(self) -> Limiter:
        """BE's limit (CPUSuppress's)."""
        return REGISTRY.made(self._by_name, CPUSuppressStrategy).limiter

    @property
    def burster(self) -> Burster:
        """The LS bursts (CPUBurst's)."""
        return REGISTRY.made(self._by_name, CPUBurstStrategy).burster

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

    def give_back(self, why: str) -> None:
        """The agent is going: every overlay withdrawn (BE's quota and its ceiling, LS bursts),
        so the groups the kubelet owns are left as it set them; the caller writes the result.
        BE keeps its tasks' SCHED_IDLE, so LS still takes every CPU it wakes on until the next
        agent's first round."""
        self.withdraw_all(why)

    def stop(self) -> None:
        """Stop deciding (:meth:`give_back` first, on the way out)."""
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
            rising = False
            try:
                now = time.monotonic()
                if now >= next_round or self._wake.is_set():
                    self._wake.clear()
                    await self.round_async()
                    next_round = now + self._sync_period()
                # every turn, a full round's too: a round read over the last second would
                # otherwise leave a spike that began just before it unseen for a fast period
                rising = self.fast_round()
            except asyncio.CancelledError:
                raise
            except Exception:  # a round must never end the loop
                log.exception("QoS round failed; trying again next round")
            # a rise followed: the next sample sooner, measuring it from inside; past a tick,
            # when every CPU's counters are current (kernel/tick.py)
            wait = self.collector.wake(self._wait(rising))
            if self._trigger is None and not (self.ls_pressure and self.ls_pressure.fds):
                await asyncio.sleep(wait)  # nothing else can wake us: the cheap wait
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), wait)

    def _wait(self, rising: bool) -> float:
        """Until the next fast sample: sooner while a rise is followed — the first that
        measures it a whole FAST_FOLLOW inside it (a shorter interval would read the counters'
        tick lag as load), the next ones sooner still, since each measures from the rise's
        start and so over a longer interval; slower while BE runs next to nothing."""
        if rising:
            return FAST_REFINE if self._follows else FAST_FOLLOW
        return FAST_IDLE if self._be_idle else FAST_PERIOD

    def _sync_period(self) -> float:
        return float(self.rules.policy.qosManager.syncPeriod)

    # rounds -----------------------------------------------------------------------------------

    def round(self) -> None:
        """One full round, in one go (tests, tools)."""
        on = self._enabled()
        if on or self.usage is not None:
            self._pods_moved(self.pods.refresh())
            sample = self.collector.sample(self.groups, self._ls_waits())
            self._measured(sample)
            if on:
                self._decide(sample)

    async def round_async(self) -> None:
        """One full round; the pods' news and the collection give the event loop back
        between turns (the agent's loop: hooks are not held up by a large node's round).
        With the manager off a round still measures when a usage report reads it, and decides
        nothing."""
        on = self._enabled()
        if on or self.usage is not None:
            self._pods_moved(await self.pods.refresh_async())
            sample = await self.collector.sample_async(self.groups, self._ls_waits())
            self._measured(sample)
            if on:
                self._decide(sample)

    def _ls_waits(self) -> bool:
        """Whether a strategy the policy runs decides on LS's waits for a CPU this round."""
        policy = self.rules.policy
        return any(c.reads_ls_waits(policy) for c in STRATEGIES)

    def _measured(self, sample: NodeSample) -> None:
        """The round's measurements into the usage kept over time (the NodeMetric report's)."""
        if self.usage is not None:
            self.usage.add(sample, self.collector.by_container, self.model.pod)

    def _enabled(self) -> bool:
        """False when the manager is off (its overlays withdrawn)."""
        if not self.rules.policy.qosManager.enable:
            self.withdraw_all("the QoS manager is disabled")
            return False
        return True

    def _pods_moved(self, moved: bool) -> None:
        if moved:
            self.groups = self.pods.be()
            self.watch_ls_pressure()

    def _decide(self, sample: NodeSample) -> None:
        """Assess and let the strategies decide on a round's sample. Its latency is the
        collection's own time plus this (not the waits between collection chunks)."""
        t0 = time.perf_counter()
        self.assess(sample)
        r = Round(
            sample.t, sample, self.level, self.cpu.score, self.memory.score, self.rules.policy, cpu_terms=self.cpu_terms
        )
        for s in self.strategies:
            why = self._why_not(s, r)
            if why is None:
                s.decide(r)
            else:
                self._stand_down(s, r.t, why)
        if r.capacity is not None:
            self._non_be = r.capacity.non_be_usage
        self.observer.round_done(time.perf_counter() - t0 + sample.collect_seconds, sample.collect_seconds)

    def _why_not(self, s: Strategy, r: Round) -> str | None:
        """Why ``s`` does not run this round (None: it runs)."""
        if not s.runs(r.config):
            return f"{s.name} is off"
        if s.needs_capacity and r.capacity is None:
            if not self._no_capacity_said:
                need = ", ".join(c.name for c in STRATEGIES if c.needs_capacity and c.runs(r.config))
                log.warning("NodeQOSResource is off: without the node's capacity %s do not run", need)
                self._no_capacity_said = True
            return f"{s.name} needs the node's capacity and NodeQOSResource is off"
        if r.capacity is not None:
            self._no_capacity_said = False
        return None

    def _stand_down(self, s: Strategy, t: float, why: str) -> None:
        if s.off(t, why):
            log.info("QoS overlays withdrawn (%s): %s", s.name, why)

    def fast_round(self) -> bool:
        """Between rounds: node CPU, BE's usage and the pods' only; decide now if non-BE usage
        fell or rose by FAST_JUMP. A rise is followed for FAST_WINDOW: the sample that first
        shows it straddles its start (it shows only part of it) and decides nothing; the next
        samples come sooner, each measuring the pods from that sample on (all inside the
        rise, more exactly with each), and each decides. Returns whether a rise is being
        followed. BE births that never reached StartContainer end here (node/births.py)."""
        self.model.births.expire()
        last = self.last
        if not self.rules.policy.qosManager.enable or not self.groups or last is None:
            self._be_idle = last is not None  # no BE group (or the manager off): nothing to cut
            return False
        if self.groups != self._fast_groups:  # the counters' sum is over other groups now
            self._fast.reset()
            self._fast_groups = list(self.groups)
            self._fast_roots = sorted({root for g in self.groups if (root := g.rpartition("/")[0])})
            self._rise = None
        fast = self.collector.fast((self.groups, self._fast_roots))
        be_seconds, pods_seconds = fast.seconds
        usage = self._fast.add(fast.t, fast.interval, fast.cpu_busy_cores, be_seconds, pods_seconds)
        if usage is None:
            self._rise, self._be_idle = None, False
            return False
        # BE that runs next to nothing takes no CPU from LS: sampling it slower costs no
        # reaction (a BE that wakes is seen within FAST_IDLE, and the cut follows at FAST_PERIOD)
        self._be_idle = usage.be < FAST_BE_BUSY
        rise, before, self._last = self._rise, self._last, None
        if rise is not None and fast.t - rise < FAST_WINDOW:
            since = self._fast.since(rise)
            self._follows += 1
            waiting = self._waiting(usage if since is None else since, fast.t)
            self._between(fast.t, last, replace(waiting, rise=rise))
            if since is not None and before is not None and usage.non_be - since.non_be >= FAST_RESTART:
                # LS rose again after the sample the rise is followed from (that one showed
                # something smaller: noise, another load): from here on it is measured from
                # the sample before this one, the last that did not show it
                self._rise, self._rise_stall = before
                self._follows = 0
            return True
        self._rise = None
        if abs(usage.non_be - self._non_be) < FAST_JUMP:
            return False
        if usage.non_be > self._non_be:
            self._rise, self._follows = fast.t, 0  # followed from here
            self._rise_stall = self.collector.stall_us(self.pods.ls())
            self._last = (fast.t, self._rise_stall)
            return True
        self._between(fast.t, last, usage)
        return False

    def _waiting(self, usage: FastUsage, t: float) -> FastUsage:
        """What LS needs while a rise is followed: what it uses, and the time its pods had a
        task waiting for a CPU since the rise began (their PSI ``some``, where the kernel keeps
        it per group: v2, or a v1 host's unified hierarchy). Under contention LS's use shows
        only part of what it asks for — BE's tasks still hold CPUs until the cut — and a cut
        sized by use alone would leave BE above what LS leaves it."""
        rise, before = self._rise, self._rise_stall
        now = None if rise is None or before is None or t <= rise else self.collector.stall_us(self.pods.ls())
        self._last = (t, now)
        if rise is None or before is None or now is None:
            return usage
        waiting = max(0, now - before) / 1e6 / (t - rise)
        held = None if usage.held is None else usage.held + waiting
        return replace(usage, non_be=usage.non_be + waiting, held=held)

    def _between(self, t: float, last: NodeSample, usage: FastUsage) -> None:
        """The strategies' decisions between rounds, on what the fast path measured and the
        last full round's sample."""
        policy = self.rules.policy
        r = Round(t, last, self.level, self.cpu.score, self.memory.score, policy, usage, cpu_terms=self.cpu_terms)
        for s in self.strategies:
            if s.runs(r.config) and not (s.needs_capacity and r.capacity is None):
                s.between_rounds(r)
        self._non_be = usage.non_be

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

    # assessment -------------------------------------------------------------------------------

    def assess(self, sample: NodeSample) -> None:
        """The pressure scores (scores.py) over the last five minutes, smoothed into levels."""
        self.trends.add(sample)
        cfg = self.rules.policy.qosManager
        for assessor, pc in ((self.cpu, cfg.cpuPressure), (self.memory, cfg.memoryPressure)):
            assessor.configure(thresholds_of(pc), pc.hysteresis, pc.fallTime)  # a reload applies at once
        raw = scores.cpu_pressure(scores.cpu_inputs(sample, self.trends))
        self.cpu_terms = raw.terms
        cpu = self.cpu.update(sample.t, raw.total)
        mem = self.memory.update(sample.t, scores.memory_pressure(scores.memory_inputs(sample, self.trends)).total)
        self.last = sample
        self.level = cpu.level
        self.ratio = cfg.cpuSuppress.suppressRatio.of(cpu.level)
        self.observer.scores(cpu.score, cpu.level.name, mem.score, mem.level.name)

    def withdraw_all(self, why: str) -> None:
        """The manager is off: every strategy withdraws its overlays, the last one first."""
        t = time.monotonic()
        for s in reversed(self.strategies):
            self._stand_down(s, t, why)
