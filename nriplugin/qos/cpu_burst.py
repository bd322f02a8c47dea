"""CPUBurst (seed 004 §7.5.4): an LS container at its CPU limit may exceed it while the node has
idle CPU — its quota raised by a ratio that depends on how idle the node is, for at most
``burstDuration``, then ``burstCooldown`` before the next burst.

The seed's ratios: idle > 30 % → 1.5, 20-30 % → 1.3, below 20 % → none. With the policy's
``burstRatio`` and ``minNodeCPUIdle`` the same shape: above ``minNodeCPUIdle + 0.1`` the full
ratio, from ``minNodeCPUIdle`` the ratio's 60 % (1.3 for 1.5), below none. Bursts are granted
before BE is suppressed (§7.6): what they add comes out of BE's share. The quota is raised
through an overlay; the kernel's CFS burst (``cpu.cfs_burst_us``) stays at most the quota (the
one writer caps and orders it), unlike koordlet's 1000 % default that cgroup v2 refuses.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def burst_ratio(
    idle_fraction: float,
    full: float = 1.5,
    partial: float = 1.3,
    min_idle: float = 0.2,
    full_idle: float = 0.3,
) -> float:
    """The seed's table: more than ``full_idle`` idle -> ``full``; from ``min_idle`` ->
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
