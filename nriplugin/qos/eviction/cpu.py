"""CPUEvict: when suppressing BE is not enough, evict BE pods to give LS its CPU back.

The trigger: the CPU pressure score at ``evictThreshold`` (EMERGENCY), BE already suppressed to
what the level allows, LS suffering, and BE's tasks not SCHED_IDLE (``beProcess.schedIdle``): an idle BE
gives up each CPU the moment an LS task wakes there, so what LS waits for is not BE's. The agent
cannot see request latency, so LS suffering is what the kernel shows of it: the share of time
LS had runnable tasks waiting for a CPU (PSI ``some`` of the LS containers' own ``cpu.pressure``
on cgroup v2; on v1, which has no per-group PSI, their tasks' run-queue delay summed; the node's
PSI, which counts BE's waits, only when neither could be read) or LS containers throttled at
their quota. The conditions must hold for ``sustain`` seconds (a one-round spike is
suppression's job), and after an eviction CPUEvict waits ``cooldown``.

How much: ``release = 1.2 x (LS demand - LS available)`` — 20 % more than the shortage, so
one eviction is enough — with ``available = total - system - BE usage`` (the system's share
is what it uses or what is reserved for it, whichever is more) and the demand estimated from
what LS used and how long it waited: ``usage x (1 + max(stall share, throttled share))``. LS
using all it has shows no shortage by usage alone; its waiting does: on 64 cores, 4 for the
system and 8 for BE, LS using the 52 left and stalled 13 % of the time is short of 6.8 cores;
the release is 8.1, three BE pods of 3 cores.

Koordinator's BE-satisfaction variant (NodeSLO ``cpuEvictBESatisfactionLowerPercent`` /
``UpperPercent``, ``cpuEvictBEUsageThresholdPercent``, ``cpuEvictTimeWindowSeconds``): when
BE's real limit is at most the lower percent of what BE requested while BE uses at least the
usage threshold of that limit, averaged over the window, release ``request x (upper -
limit/request)`` counted in the victims' requests.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from nriplugin.qos.eviction.victims import Candidate, Candidates, EvictionPlan, Release, listed, rank_cpu

RELEASE_FACTOR = 1.2  # 20 % over the shortage: one eviction, not a second round of them
MIN_CORES = 0.001  # a pod using less than a millicore is idle: evicting it frees nothing


@dataclass(frozen=True, slots=True)
class CpuFacts:
    """What one round measured (cores, shares 0-1)."""

    t: float
    level: int  # the CPU pressure level (0 LOW ... 4 EMERGENCY)
    score: float
    suppressed: bool  # BE's limit is already at what this level allows
    total: float
    system_reserved: float
    ls_usage: float
    be_usage: float
    other_usage: float = 0.0  # neither LS nor BE: the system's daemons, anything outside the pods
    ls_stall: float = 0.0  # share of the interval LS had runnable tasks waiting
    ls_throttled: float = 0.0  # LS throttled periods / periods
    be_request: float = 0.0  # what BE pods requested (batch-cpu)
    be_limit: float | None = None  # BE's real limit (None: unlimited)
    be_idle: bool = False  # BE's tasks run SCHED_IDLE (they yield every CPU LS wakes on)


@dataclass(frozen=True, slots=True)
class CpuConfig:
    threshold: float = 90.0  # score (EMERGENCY)
    cooldown: float = 60.0
    sustain: float = 2.0
    stall_threshold: float = 0.1
    throttle_threshold: float = 0.2
    release_factor: float = RELEASE_FACTOR
    satisfaction_lower: float | None = None  # percent
    satisfaction_upper: float | None = None
    be_usage_threshold: float = 90.0  # percent of BE's limit
    window: float = 60.0


def shortage(f: CpuFacts) -> tuple[float, float, float]:
    """(LS demand, LS available, shortage) in cores."""
    available = max(0.0, f.total - max(f.system_reserved, f.other_usage) - f.be_usage)
    demand = f.ls_usage * (1.0 + max(f.ls_stall, f.ls_throttled))
    return demand, available, demand - available


def suffering(f: CpuFacts, cfg: CpuConfig) -> bool:
    return f.ls_stall >= cfg.stall_threshold or f.ls_throttled >= cfg.throttle_threshold


def emergency_release(f: CpuFacts, cfg: CpuConfig) -> Release | None:
    """The release under emergency (score, BE suppressed, LS suffering, a shortage), or None
    when its conditions do not all hold, or when BE runs SCHED_IDLE: an LS task that wakes then
    takes the CPU from BE at once, so LS's waits are for LS's own tasks and the system's, and
    evicting BE would not shorten them (the colocation benchmark near its knee: evictions with
    BE at its floor left LS stalled as much, and its tail worse for the teardown)."""
    if f.be_idle or f.score < cfg.threshold or not f.suppressed or not suffering(f, cfg):
        return None
    demand, available, short = shortage(f)
    if short <= 0:
        return None
    amount = cfg.release_factor * short
    why = (
        f"CPU score {f.score:.0f} >= {cfg.threshold:g}, BE suppressed, LS stalled {f.ls_stall:.0%} / throttled "
        f"{f.ls_throttled:.0%}: LS wants {demand:.2f} cores, has {available:.2f} "
        f"({f.total:g} - {max(f.system_reserved, f.other_usage):.2f} system - {f.be_usage:.2f} BE); "
        f"release {cfg.release_factor:g} x {short:.2f} = {amount:.2f} cores"
    )
    return Release(amount, "emergency", why)


def satisfaction_release(request: float, limit: float, usage: float, cfg: CpuConfig) -> Release | None:
    """Koordinator's BE-satisfaction release from window averages, or None."""
    lo, up = cfg.satisfaction_lower, cfg.satisfaction_upper
    if lo is None or up is None or request <= 0 or limit <= 0:
        return None
    if limit >= 1.0 and usage / limit < cfg.be_usage_threshold / 100:
        return None  # BE does not even use what it has: more CPU would not help it
    rate = limit / request
    if rate > lo / 100 or up / 100 - rate <= 0:
        return None
    amount = request * (up / 100 - rate)
    why = (
        f"BE satisfaction {rate:.0%} (limit {limit:.2f} / request {request:.2f}) <= {lo:g}% with BE using "
        f"{usage:.2f} cores; release {request:.2f} x ({up:g}% - {rate:.0%}) = {amount:.2f} requested cores"
    )
    return Release(amount, "be_satisfaction", why)


class CpuEvictDecider:
    """The stateful part: how long the conditions have held, the satisfaction window, the
    cooldown. :meth:`decide` is called once per round."""

    def __init__(self, cfg: CpuConfig | None = None) -> None:
        self.cfg = cfg or CpuConfig()
        self._since: float | None = None  # the emergency conditions hold since
        self._window: deque[tuple[float, float, float, float]] = deque()  # t, request, limit, usage
        self.last_evicted: float | None = None

    def evicted(self, t: float) -> None:
        """An eviction went out: the cooldown starts."""
        self.last_evicted = t

    def decide(self, f: CpuFacts, cands: Candidates) -> EvictionPlan | None:
        cfg = self.cfg
        rel = emergency_release(f, cfg)
        if rel is None:
            self._since = None
        elif self._since is None:
            self._since = f.t
        if rel is not None and f.t - (self._since or f.t) < cfg.sustain:
            rel = None  # not yet sustained
        sat = self._satisfaction(f)
        if self.last_evicted is not None and f.t - self.last_evicted < cfg.cooldown:
            return None
        if rel is not None:
            return self._plan(rel, [c for c in listed(cands) if c.cpu_cores >= MIN_CORES], "cores")
        if sat is not None:
            return self._plan(sat, listed(cands), "request")
        return None

    @staticmethod
    def _plan(rel: Release, cands: Iterable[Candidate], unit: str) -> EvictionPlan | None:
        """The ranked victims that each free a meaningful share of the release, or None."""
        plan = EvictionPlan("CPUEvict", rel, rank_cpu(cands), unit)
        victims = [c for c in plan.victims if plan.meaningful(c)]
        return EvictionPlan("CPUEvict", rel, victims, unit) if victims else None

    def _satisfaction(self, f: CpuFacts) -> Release | None:
        cfg = self.cfg
        w = self._window
        if cfg.satisfaction_lower is None or cfg.satisfaction_upper is None or f.be_limit is None:
            w.clear()
            return None
        w.append((f.t, f.be_request, f.be_limit, f.be_usage))
        while w and f.t - w[0][0] > cfg.window:
            w.popleft()
        if w[-1][0] - w[0][0] < cfg.window / 3:
            return None  # too little history (Koordinator: a third of the window)
        n = len(w)
        avg = [sum(x[i] for x in w) / n for i in (1, 2, 3)]
        by_avg = satisfaction_release(avg[0], avg[1], avg[2], cfg)
        now = satisfaction_release(f.be_request, f.be_limit, f.be_usage, cfg)
        if by_avg is None or now is None:
            return None
        return by_avg if by_avg.amount <= now.amount else now  # the smaller of the two
