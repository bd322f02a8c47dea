"""Net suppress: BE's (L2's) network ceiling lowered while L0+L1 use most of the node's
bandwidth, as CPU suppress lowers BE's quota.

HTB already serves L0/L1 first and lends them what they are guaranteed; what it cannot do is
stop L2 from borrowing up to its ceiling in the moments L0/L1 are idle, and then hold the
uplink's queue when they come back. Under pressure (L0+L1 at ``threshold`` of the total) L2's
ceiling is cut to what L0+L1 leave, with ``headroom`` for them to grow, never below ``floor``;
a cut lands at once, a raise only when it is worth ``deadband`` and has held for ``hold``
seconds; the overlay is withdrawn after ``hold`` seconds below ``release``. The decision is
a pure function (:func:`decide`); :class:`NetSuppress` measures the class counters and sets
the decision as an overlay (owner ``qos:netSuppress``) that the network reconciler applies.
Off unless BE's networkQOS is enabled and the QoS manager runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from nriplugin.netqos.desired import DIRECTIONS, NetLevel, suppress_resource
from nriplugin.netqos.tc import LEVEL_MINOR, Snapshot
from nriplugin.node.overlays import Overlays
from nriplugin.policy.bandwidth import MIN_RATE
from nriplugin.policy.model import Policy

OWNER = "qos:netSuppress"


@dataclass(frozen=True, slots=True)
class Config:
    threshold: float = 0.8
    release: float = 0.6
    headroom: float = 0.1
    floor: float = 0.05
    deadband: float = 0.05
    hold: float = 5.0


@dataclass(frozen=True, slots=True)
class SuppressState:
    ceiling: int | None = None  # the overlay in force (None: none)
    calm_since: float | None = None  # when L0+L1 fell below ``release``
    raise_since: float | None = None  # when a higher target first appeared


def decide(total: int, hi_bps: float, st: SuppressState, now: float, cfg: Config = Config()) -> SuppressState:
    """The next state from the L0+L1 rate ``hi_bps`` (bits/s) of a node of ``total``."""
    used = hi_bps / total if total > 0 else 0.0
    if used < cfg.release:
        if st.ceiling is None:
            return SuppressState()
        calm = st.calm_since if st.calm_since is not None else now
        return SuppressState() if now - calm >= cfg.hold else SuppressState(st.ceiling, calm_since=calm)
    if used < cfg.threshold and st.ceiling is None:
        return SuppressState()
    target = int(max(cfg.floor * total, total - hi_bps - cfg.headroom * total, MIN_RATE))
    if st.ceiling is None or target <= st.ceiling:  # a cut, or the same ceiling: no timer runs
        return SuppressState(target)
    if target - st.ceiling < cfg.deadband * total:
        return SuppressState(st.ceiling)
    since = st.raise_since if st.raise_since is not None else now
    return SuppressState(target) if now - since >= cfg.hold else SuppressState(st.ceiling, raise_since=since)


class NetSuppress:
    """Measures L0+L1 from the tree's byte counters between rounds and keeps the overlay."""

    def __init__(self, overlays: Overlays, key: str, cfg: Config = Config()) -> None:
        self.overlays = overlays
        self.key = key
        self.cfg = cfg
        self.state = {d: SuppressState() for d in DIRECTIONS}
        self._last: tuple[float, dict[tuple[str, int], int]] | None = None

    def step(self, policy: Policy, total: int, snap: Snapshot | None, now: float) -> bool:
        """Returns whether the overlay changed."""
        on = policy.resourceQOSStrategy.beClass.networkQOS.enable and policy.qosManager.enable
        if not on or snap is None:
            self._last = None
            self.state = {d: SuppressState() for d in DIRECTIONS}
            return self.overlays.withdraw(self.key, OWNER)
        last, self._last = self._last, (now, dict(snap.bytes))
        if last is None or now <= last[0]:
            return False
        dt = now - last[0]
        values: dict[str, int | str] = {}
        for d in DIRECTIONS:
            hi = 0
            for level in (NetLevel.L0, NetLevel.L1):
                k = (d, LEVEL_MINOR + int(level))
                hi += max(0, snap.bytes.get(k, 0) - last[1].get(k, 0))
            self.state[d] = decide(total, hi * 8 / dt, self.state[d], now, self.cfg)
            c = self.state[d].ceiling
            if c is not None:
                values[suppress_resource(NetLevel.L2, d)] = c
        if not values:
            return self.overlays.withdraw(self.key, OWNER)
        why = "L0+L1 use most of the node's bandwidth"
        return self.overlays.set(self.key, OWNER, values, why)
