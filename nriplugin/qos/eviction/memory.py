"""MemoryEvict: memory cannot be suppressed, only given back by evicting.

**The node's memory** is what pods may use: the smaller of MemTotal and the memory limit of
the pods root(s) (kubelet's node-allocatable cgroup, ``--pods-root``); its use is the pods
root's working set (usage minus inactive page cache, kubelet's ``allocatableMemory.available``
signal), since page cache is reclaimed before anything is OOM-killed.

**Triggers**, any of:
- ``threshold``: use at or above ``memoryEvictThresholdPercent`` (NodeSLO's, default 70);
- ``oom_risk``: the use grows fast enough to reach the limit within ``horizon`` seconds (a
  sustained growth: a one-off jump is not extrapolated), and then only growing pods are taken;
- ``pressure``: the memory pressure score at ``evictThreshold`` or the kernel's pressure
  notification at ``critical`` for the pods root.
The kernel wakes the manager for each (usage thresholds and pressure levels through
``cgroup.event_control`` on v1, ``memory.events`` and PSI on v2: ``kernel/memory_events.py``);
the strategy itself is pure.

**How much**: down to ``memoryEvictLowerPercent`` (default threshold - 2, Koordinator's) with
a 30 % buffer, ``1.3 x (use - lower x capacity)`` (what is freed is an estimate, and use
keeps moving while victims stop); under OOM risk at least what the
growth would add within the horizon beyond what is left. Memory already on its way out —
victims still terminating — is credited (``pending``), so a slow shutdown does not make the
next round evict again for the same bytes (koordinator#3137).

**Whom**: BE pods only; leaking pods first (growth over 5 MB/min), then the largest by what
eviction frees (anonymous memory, not page cache); a victim also counts what it would have
grown by within the horizon, since evicting it stops the growth. A pod that frees less than
5 % of the release (``victims.MIN_SHARE``) is never a victim: a quiet pod that frees about
0 MiB relieves nothing.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from nriplugin.qos.eviction.victims import LEAK_BYTES_PER_MIN, Candidates, EvictionPlan, Release, listed, rank_memory

RELEASE_FACTOR = 1.3  # 30 % over what is above the lower mark
MiB = 1 << 20


@dataclass(frozen=True, slots=True)
class MemoryFacts:
    t: float
    capacity: int  # bytes pods may use
    used: int  # the pods' working set
    growth: float = 0.0  # bytes per second, recent
    score: float = 0.0  # the memory pressure score
    critical: bool = False  # the kernel reported critical pressure since the last round
    pending: int = 0  # bytes still charged to victims being terminated


@dataclass(frozen=True, slots=True)
class MemoryConfig:
    threshold_percent: float = 70.0
    lower_percent: float | None = None  # None: threshold - 2
    score_threshold: float = 85.0
    horizon: float = 10.0  # seconds: growth that reaches the limit this soon is an OOM risk
    urgent: float = 5.0  # seconds: this close, through the runtime with no grace period
    release_factor: float = RELEASE_FACTOR
    leak_bytes_per_min: float = LEAK_BYTES_PER_MIN

    @property
    def lower(self) -> float:
        lo = self.threshold_percent - 2 if self.lower_percent is None else self.lower_percent
        return max(0.0, min(lo, self.threshold_percent))


def seconds_to_limit(f: MemoryFacts) -> float | None:
    """When the use reaches the capacity at the current growth (None: not growing)."""
    if f.growth <= 0:
        return None
    return max(0.0, (f.capacity - f.used) / f.growth)


def release(f: MemoryFacts, cfg: MemoryConfig) -> Release | None:
    """How many bytes to free and why; None when no trigger holds or nothing is to be freed."""
    if f.capacity <= 0:
        return None
    pct = 100.0 * f.used / f.capacity
    eta = seconds_to_limit(f)
    triggers = []
    if pct >= cfg.threshold_percent:
        triggers.append("threshold")
    if eta is not None and eta <= cfg.horizon:
        triggers.append("oom_risk")
    if f.score >= cfg.score_threshold or f.critical:
        triggers.append("pressure")
    if not triggers:
        return None
    lower = cfg.lower / 100 * f.capacity
    by_level = cfg.release_factor * max(0.0, f.used - lower)
    by_growth = f.growth * cfg.horizon - (f.capacity - f.used) if eta is not None else 0.0
    amount = max(by_level, by_growth) - f.pending
    figures = (
        f"pods use {f.used / MiB:.0f} of {f.capacity / MiB:.0f} MiB ({pct:.0f}%)"
        + (f", growing {f.growth / MiB:.1f} MiB/s (limit in {eta:.1f} s)" if eta is not None else "")
        + (f", pressure score {f.score:.0f}" if f.score >= cfg.score_threshold else "")
        + (", kernel reports critical pressure" if f.critical else "")
    )
    if amount <= 0:
        return None
    why = (
        f"{figures}: release {cfg.release_factor:g} x ({f.used / MiB:.0f} - {cfg.lower:g}% = {lower / MiB:.0f}) MiB"
        + (f" or the growth within {cfg.horizon:g} s" if by_growth > by_level else "")
        + (f", less {f.pending / MiB:.0f} MiB on its way out" if f.pending else "")
        + f" = {amount / MiB:.0f} MiB"
    )
    return Release(amount, triggers[0], why)


class MemoryEvictDecider:
    """The pods root's recent use, for its growth; :meth:`decide` per round or memory event."""

    def __init__(self, cfg: MemoryConfig | None = None, rate_window: float = 10.0) -> None:
        self.cfg = cfg or MemoryConfig()
        self.rate_window = rate_window
        self._points: deque[tuple[float, int]] = deque()

    def observe(self, t: float, used: int) -> float:
        """Record a reading; returns the growth in bytes/s (see :meth:`growth`)."""
        p = self._points
        if not p or t > p[-1][0]:
            p.append((t, used))
        while len(p) > 2 and t - p[0][0] > self.rate_window:
            p.popleft()
        return self.growth()

    def growth(self, step: float = 2.0) -> float:
        """The sustained growth in bytes/s: the smaller of the rates over the last ``step``
        seconds and the ``step`` before, so a one-off jump (pods starting together, a
        batch job loading its input) is not extrapolated into an OOM that never comes; 0
        until the readings span two steps."""
        p = self._points
        if len(p) < 3:
            return 0.0
        t_now, u_now = p[-1]
        a = b = None
        for t, u in reversed(p):
            if a is None and t <= t_now - step:
                a = (t, u)
            elif a is not None and t <= a[0] - step:
                b = (t, u)
                break
        if a is None or b is None:
            return 0.0
        r1 = (u_now - a[1]) / (t_now - a[0])
        r2 = (a[1] - b[1]) / (a[0] - b[0])
        return max(0.0, min(r1, r2))

    def decide(self, f: MemoryFacts, cands: Candidates) -> EvictionPlan | None:
        cfg = self.cfg
        rel = release(f, cfg)
        if rel is None:
            return None
        eta = seconds_to_limit(f)
        ranked = rank_memory(listed(cands), cfg.leak_bytes_per_min)
        plan = EvictionPlan(
            "MemoryEvict",
            rel,
            [],
            "bytes",
            horizon=cfg.horizon if eta is not None and eta <= cfg.horizon else 0.0,
            urgent=eta is not None and eta <= cfg.urgent,
        )
        victims = [c for c in ranked if plan.meaningful(c)]  # none that frees next to nothing
        if rel.trigger == "oom_risk":
            # Below the threshold, only the pods that grow are the risk: evicting a steady one
            # would not change where the growth leads.
            victims = [c for c in victims if c.growth_bytes_per_min > cfg.leak_bytes_per_min]
        if not victims:
            return None
        return EvictionPlan(plan.strategy, rel, victims, plan.unit, plan.horizon, plan.urgent)
