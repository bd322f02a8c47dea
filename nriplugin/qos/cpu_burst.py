"""CPUBurst: an LS container at its CPU limit may exceed it while the node has
idle CPU — its quota raised by a ratio that depends on how idle the node is, for at most
``burstDuration``, then ``burstCooldown`` before the next burst.

The ratio by how idle the node is (BE left out: it yields): above ``fullBurstNodeCPUIdle``
(30 %) the full ``burstRatio`` (1.5), from ``minNodeCPUIdle`` (20 %) the ``partialBurstRatio``
(1.3), below none — the idler the node, the more an LS container may take without hurting
anyone. Bursts are granted before BE is suppressed: what they add comes out of BE's share. The quota is raised
through an overlay; the kernel's CFS burst (``cpu.cfs_burst_us``) stays at most the quota (the
one writer caps and orders it), unlike koordlet's 1000 % default that cgroup v2 refuses.

Where the pod's group has a quota of its own (the kubelet gives a pod whose containers all
have a CPU limit the sum of the limits), the container alone cannot run above it: cgroup v1
refuses a child's quota above its parent's, v2 takes it and the parent throttles. The pod's
quota is raised by what its bursting containers add, as an overlay of its own: the one writer
raises the pod before the container and lowers the container before the pod. A burst is
counted as granted only once the kernel holds the container's raised quota (checked the next
round); one the kernel did not take is withdrawn and said.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

from nriplugin.intent.core import requested
from nriplugin.kernel.cgroup import CFS_PERIOD_US, MIN_QUOTA_US
from nriplugin.node.model import pod_key
from nriplugin.policy.model import CPUBurst, QoSManagerPolicy
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
        # pod key -> (the pod group's quota and period before any burst, container key -> the
        # extra quota its burst adds to the pod, in the pod's period)
        self._pods: dict[str, tuple[int, int, dict[str, int]]] = {}
        self._unverified: dict[str, int] = {}  # container key -> the quota its burst asked for
        self._granted: set[str] = set()  # bursts the kernel took (counted as granted)

    @classmethod
    def configured(cls, cfg: QoSManagerPolicy) -> bool:
        return cfg.cpuBurst.enabled

    def decide(self, r: Round) -> None:
        self._verify(r.t)
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
        for pk in list(self._pods):  # after the containers: they come down first
            self.host.desired.withdraw_overlay(pk, BURST)
        self._pods.clear()
        self._unverified.clear()
        self._granted.clear()
        self.burster.forget(set())
        self.extra = 0.0
        return bursting

    def burst(self, now: float, cap: Capacity, b: CPUBurst) -> float:
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
        pk = pod_key(r.pod.id)
        if change.ratio > 1 and quota:
            period = requested(r.container, "cpu.cfs_period_us") or CFS_PERIOD_US
            raised = int(quota * change.ratio)
            self._pod_share(pk, key, (raised - quota) / period, change.why)  # the pod first
            values: dict[str, int | str] = {"cpu.cfs_quota_us": raised, "cpu.cfs_period_us": period}
            host.desired.set_overlay(key, BURST, values, change.why)
            self._unverified[key] = raised
        else:
            host.desired.withdraw_overlay(key, BURST)
            self._pod_share(pk, key, 0.0, change.why)  # after the container
            self._unverified.pop(key, None)
            if key in self._granted:
                self._granted.discard(key)
                host.observer.burst(False)
        who = f"{r.pod.namespace}/{r.pod.name}/{r.container.name}"
        host.decisions.append(Decision(now, BURST, who, f"x{change.ratio:g}", change.why))
        log.info("%s: CPU burst x%g asked: %s", who, change.ratio, change.why, extra={"ratio": change.ratio})

    def _pod_share(self, pk: str, key: str, extra_cores: float, why: str) -> None:
        """The pod's quota with ``key``'s extra (0: none): raised over the kubelet's by what
        its bursting containers add; back to the kubelet's when none bursts. Pods without a
        quota of their own are left alone."""
        desired = self.host.desired
        held = self._pods.get(pk)
        if held is None:
            if extra_cores <= 0:
                return
            base = desired.current(pk, "cpu.cfs_quota_us")
            if not isinstance(base, int) or base < MIN_QUOTA_US:
                return  # no pod-level quota (-1): the container's is the only one
            period = desired.current(pk, "cpu.cfs_period_us")
            ok = isinstance(period, int) and 1000 <= period <= 1_000_000
            held = self._pods[pk] = (base, period if ok and isinstance(period, int) else CFS_PERIOD_US, {})
        base, period, extras = held
        if extra_cores > 0:
            extras[key] = math.ceil(extra_cores * period)
        else:
            extras.pop(key, None)
        if not extras:
            desired.withdraw_overlay(pk, BURST)
            del self._pods[pk]
            return
        values: dict[str, int | str] = {"cpu.cfs_quota_us": base + sum(extras.values()), "cpu.cfs_period_us": period}
        desired.set_overlay(pk, BURST, values, f"its containers burst: {why}")

    def _verify(self, now: float) -> None:
        """Bursts asked last round: granted once the kernel holds the container's quota; one
        it does not hold is withdrawn (the kernel refused it), so nothing counts what did not
        happen."""
        if not self._unverified:
            return
        desired = self.host.desired
        for key, want in list(self._unverified.items()):
            del self._unverified[key]
            if key not in self.burster.bursting():
                continue
            have = desired.current(key, "cpu.cfs_quota_us")
            if have == want:
                self._granted.add(key)
                self.host.observer.burst(True)
                continue
            self.burster.step(now, key, False, 1.0)  # over: cooldown
            self._apply(now, key, Change(key, 1.0, f"the kernel did not take the burst (quota {have}, asked {want})"))
            log.warning("%s: CPU burst not in force: cpu.cfs_quota_us reads %s, asked %s", key[:12], have, want)
