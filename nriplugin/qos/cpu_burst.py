"""CPUBurst: an LS container at its CPU limit may exceed it while the node has
idle CPU — its quota raised by a ratio that depends on how idle the node is, for at most
``burstDuration``, then ``burstCooldown`` before the next burst.

The ratio by how idle the node is (BE left out: it yields): above ``fullBurstNodeCPUIdle``
(30 %) the full ``burstRatio`` (1.5), from ``minNodeCPUIdle`` (20 %) the ``partialBurstRatio``
(1.3), below none — the idler the node, the more an LS container may take without hurting
anyone. Bursts are granted before BE is suppressed: what they add comes out of BE's share. The quota is raised
through an overlay; the kernel's CFS burst (``cpu.cfs_burst_us``) stays at most the quota (the
one writer caps and orders it), unlike koordlet's 1000 % default that cgroup v2 refuses.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from nriplugin.intent.core import requested
from nriplugin.policy.model import CPUBurst as Config
from nriplugin.policy.model import QoSManager as ManagerConfig
from nriplugin.qos.cpu_suppress import PERIOD_US
from nriplugin.qos.sample import LS_CLASSES
from nriplugin.qos.strategy import Capacity, Decision, Host, Round, Strategy, register

log = logging.getLogger("nriplugin.qos")

BURST = "qos:cpuBurst"  # the overlays' owner


def burst_ratio(
    idle_fraction: float,
    full: float = 1.5,
    partial: float = 1.3,
    min_idle: float = 0.2,
    full_idle: float = 0.3,
) -> float:
    """More than ``full_idle`` idle -> ``full``; from ``min_idle`` ->
    ``partial``; below -> 1.0 (no burst)."""
    if idle_fraction > full_idle:
        return full
    if idle_fraction >= min_idle:
        return partial
    return 1.0


def wants_burst(throttled_ratio: float, usage_cores: float, limit_cores: float) -> bool:
    """At its limit: throttled in more than a tenth of the periods, or using 90 % of it."""
    return limit_cores > 0 and (throttled_ratio > 0.1 or usage_cores >= 0.9 * limit_cores)


@dataclass
class _State:
    since: float | None = None  # bursting since
    ratio: float = 1.0
    cooldown_until: float = 0.0


@dataclass(frozen=True, slots=True)
class Change:
    key: str
    ratio: float  # 1.0: withdraw the burst
    why: str


@dataclass
class Burster:
    duration: float = 10.0
    cooldown: float = 30.0
    _states: dict[str, _State] = field(default_factory=dict)
    grants: int = 0

    def bursting(self) -> dict[str, float]:
        """Containers bursting now, with their ratio."""
        return {k: s.ratio for k, s in self._states.items() if s.since is not None}

    def step(self, now: float, key: str, wants: bool, ratio: float) -> Change | None:
        st = self._states.setdefault(key, _State())
        if st.since is not None:
            if not wants or ratio <= 1.0 or now - st.since >= self.duration:
                why = (
                    "at most the burst duration" if now - st.since >= self.duration else "no longer needed or idle gone"
                )
                st.since, st.ratio, st.cooldown_until = None, 1.0, now + self.cooldown
                return Change(key, 1.0, f"burst over ({why}); cooldown {self.cooldown:g} s")
            return None
        if wants and ratio > 1.0 and now >= st.cooldown_until:
            st.since, st.ratio = now, ratio
            self.grants += 1
            return Change(
                key, ratio, f"at its limit with the node idle: quota x{ratio:g} for at most {self.duration:g} s"
            )
        return None

    def forget(self, live: set[str]) -> None:
        """Containers the node model no longer has."""
        for key in [k for k in self._states if k not in live]:
            del self._states[key]


@register
class CPUBurstStrategy(Strategy):
    """Grants and ends LS bursts as quota overlays; tells CPUSuppress how much they take."""

    name = "CPUBurst"
    needs_capacity = True

    def __init__(self, host: Host) -> None:
        self.host = host
        self.burster = Burster()
        self.extra = 0.0  # cores granted to bursts now

    @classmethod
    def configured(cls, cfg: ManagerConfig) -> bool:
        return cfg.cpuBurst.enabled

    def decide(self, r: Round) -> None:
        if r.capacity is not None:
            self.extra = self.burst(r.t, r.capacity, r.config.cpuBurst)
        r.burst_extra = self.extra

    def between_rounds(self, r: Round) -> None:
        r.burst_extra = self.extra  # bursts change only in full rounds

    def off(self, t: float, why: str) -> bool:
        bursting = bool(self.burster.bursting())
        for key in self.burster.bursting():
            self.host.desired.withdraw_overlay(key, BURST)
            self.host.decisions.append(Decision(t, BURST, key[:12], "x1", why))
        self.burster.forget(set())
        self.extra = 0.0
        return bursting

    def burst(self, now: float, cap: Capacity, b: Config) -> float:
        """LS containers at their limit get ``limit x ratio`` while the node (BE left out: it
        yields) is idle enough and the extra fits; returns the extra cores granted."""
        self.burster.duration, self.burster.cooldown = b.burstDuration, b.burstCooldown
        idle = max(0.0, 1.0 - cap.non_be_usage / cap.total) if cap.total else 0.0
        ratio = burst_ratio(idle, b.burstRatio, b.partialBurstRatio, b.minNodeCPUIdle, b.fullBurstNodeCPUIdle)
        usage = self.host.collector.by_container
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
            self._apply(now, key, change)
            delta = (
                u.limit_cores * (change.ratio - 1)
                if change.ratio > 1
                else -u.limit_cores * (bursting.get(key, 1.0) - 1)
            )
            extra += delta
            headroom -= delta
        self.burster.forget(live)
        return max(0.0, extra)

    def _apply(self, now: float, key: str, change: Change) -> None:
        host = self.host
        r = host.model.get(key)
        if r is None or r.container is None:
            return
        quota = requested(r.container, "cpu.cfs_quota_us")
        if change.ratio > 1 and quota:
            period = requested(r.container, "cpu.cfs_period_us") or PERIOD_US
            values: dict[str, int | str] = {"cpu.cfs_quota_us": int(quota * change.ratio), "cpu.cfs_period_us": period}
            host.desired.set_overlay(key, BURST, values, change.why)
        else:
            host.desired.withdraw_overlay(key, BURST)
        host.observer.burst(change.ratio > 1)
        who = f"{r.pod.namespace}/{r.pod.name}/{r.container.name}"
        host.decisions.append(Decision(now, BURST, who, f"x{change.ratio:g}", change.why))
        log.info("%s: CPU burst x%g: %s", who, change.ratio, change.why, extra={"ratio": change.ratio})
