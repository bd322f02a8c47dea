"""CPUSuppress: how much CPU best-effort work may have, and when to change it.

Two bounds, the tighter wins:
- the level's: ``(total - LS reserve - system reserved - LS burst granted) x ratio(level)`` —
  LS bursts are served first, BE gets what is left, so the sum never exceeds the node. The LS
  reserve is LS's request from ``reserveLSRequestFrom`` (HIGH) up, and below it what LS uses:
  a calm LS's unused request goes to BE, and the usage budget below takes it back within a
  fast sample or two when LS needs it;
- Koordinator's usage budget (NodeSLO ``cpuSuppressThresholdPercent``): ``total x threshold -
  what everything but BE uses now``. It follows LS's actual use, so it reacts to an LS spike
  within the first fast sample whose interval lies inside it, long before a pressure level (smoothed, with hysteresis)
  moves, and gives BE back what LS leaves idle.
A floor keeps BE from being starved to zero.

When to write (:class:`Limiter`): a tighter limit is applied at once when it is more than the
deadband below the current one (LS needs it now); a looser one only after it has stayed more than
the deadband above for ``relax_hold`` seconds — doubled for each raise that followed a cut in the
last minute — and at most ``max_relax_per_minute`` such raises a minute; a rise the fast path
follows starts that hold again. A stationary LS load, noisy or not, therefore leaves the limit
alone — unlike koordlet's cpuset path, which can rewrite BE's cpuset every second
(koordinator#1103).
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from nriplugin.kernel.cgroup import CFS_PERIOD_US, MIN_QUOTA_US
from nriplugin.policy.model import CPUSuppress, QoSManagerPolicy
from nriplugin.policy.qos import QoSClass
from nriplugin.qos.levels import Level
from nriplugin.qos.strategy import Capacity, Decision, Host, Round, Strategy, register

log = logging.getLogger("nriplugin.qos")

SUPPRESS = "qos:cpuSuppress"  # the overlays' owner
IDLE = "qos:giveBackIdle"  # the owner of the cpu.idle a previous agent left on BE's groups
KUBELET_BE_SHARES = 2  # the kubelet's cpu.shares for its besteffort group (MinShares)
REFINE_CORES = 0.02  # cores: the step a cut made for a rise may be refined by while it is followed


@dataclass(frozen=True, slots=True)
class Target:
    cores: float  # math.inf: no quota at all (see CPUSuppressStrategy.unquoted)
    why: str


def be_target(
    cap: Capacity,
    ratio: float,
    level: str,
    *,
    usage_threshold_percent: float = 0.0,
    burst_granted: float = 0.0,
    floor: float = 0.0,
    ls_reserve: float | None = None,
) -> Target:
    """BE's CPU limit in cores, and which bound set it. ``ls_reserve``: what the level's bound
    keeps for LS when that is less than LS's request (LS's use, below ``reserveLSRequestFrom``);
    None keeps the request."""
    if ls_reserve is None or ls_reserve >= cap.ls_request:
        kept, what = cap.ls_request, "LS request"
    else:
        kept, what = max(0.0, ls_reserve), "LS use"
    by_level = max(0.0, cap.for_be(kept) - burst_granted) * ratio
    why = (
        f"{level}: ({cap.total:g} total - {kept:.2f} {what} - {cap.system_reserved:g} reserved"
        + (f" - {burst_granted:.2f} LS burst" if burst_granted else "")
        + f") x {ratio:g}"
    )
    cores = by_level
    if usage_threshold_percent > 0:
        usage = cap.total * usage_threshold_percent / 100 - cap.non_be_usage
        if usage < cores:
            cores = usage
            why = (
                f"{cap.total:g} x {usage_threshold_percent:g}% - {cap.non_be_usage:.2f} used by LS and the system "
                f"(the level's bound, {by_level:.2f}, is looser)"
            )
    if cores < floor:
        return Target(floor, f"{why}; floor {floor:g} (BE is never starved to zero)")
    return Target(cores, why)


def be_groups(pods_roots: Iterable[str]) -> list[str]:
    """kubelet's besteffort group under each pods root, as either cgroup driver names it."""
    out = []
    for root in pods_roots:
        r = root.strip("/")
        name = r.rpartition("/")[2]
        if name.endswith(".slice"):
            out.append(f"{r}/{name.removesuffix('.slice')}-besteffort.slice")
        else:
            out.append(f"{r}/besteffort")
    return out


def quota_us(cores: float) -> int:
    return max(MIN_QUOTA_US, int(cores * CFS_PERIOD_US))


@dataclass
class Limiter:
    """Deadband, hold and rate limit between a target and the limit actually written.

    The rate limit is on *reversals*: a raise that follows a cut counts (that is what a
    flapping load does), further raises on the way back up do not, so BE gets its CPU back in
    as many steps as the pressure falls through. ``tighten_only`` steps (the fast path:
    short windows) may cut but never touch the hold of a raise, which full rounds
    (1 s windows) decide, though they count towards the lowest target seen while a raise is
    held: a raise goes only as high as every sample of the hold allowed."""

    # The policy's defaults (qosManager.cpuSuppress), until a round applies the policy in force.
    deadband: float = CPUSuppress().deadbandCores  # cores
    relax_hold: float = CPUSuppress().raiseDelay  # seconds a looser target must last before it is applied
    max_relax_per_minute: int = CPUSuppress().maxWritesPerMinute
    current: float | None = None
    writes: int = 0
    _above_since: float | None = None
    _relaxed: deque[float] = field(default_factory=deque)
    _last_was_cut: bool = True
    _lowest: float = 0.0  # the lowest target since the hold began

    def step(
        self,
        now: float,
        target: float,
        tighten_only: bool = False,
        held: float | None = None,
        band: float | None = None,
    ) -> float | None:
        """The limit to write now, or None to leave it. ``held``: what the sample allows over a
        longer window than ``target``'s (the fast path's), for the lowest target of a hold.
        ``band``: a cut's deadband for this step, when smaller than the policy's (a cut being
        refined as the rise it was made for is measured more exactly)."""
        cur = self.current
        cut_band = self.deadband if band is None else min(band, self.deadband)
        if cur is None or target < cur - cut_band:
            self._above_since = None
            self._last_was_cut = cur is not None
            return self._write(target)
        if self._above_since is not None:  # every sample counts, the fast path's too
            self._lowest = min(self._lowest, target if held is None else held)
        if tighten_only:
            return None
        if target <= cur + self.deadband:
            self._above_since = None
            return None
        if self._above_since is None:
            self._above_since, self._lowest = now, target
        while self._relaxed and now - self._relaxed[0] >= 60.0:
            self._relaxed.popleft()
        reversal = self._last_was_cut
        if now - self._above_since < self.hold(reversal):
            return None
        # Up to the lowest target seen while held: a load that keeps coming back (noisy LS)
        # holds BE where its peaks put it instead of raising it between them.
        up = min(target, self._lowest)
        if up <= cur + self.deadband:
            self._above_since, self._lowest = now, target
            return None
        if reversal and len(self._relaxed) >= self.max_relax_per_minute:
            return None
        if reversal:
            self._relaxed.append(now)
        self._above_since = None
        self._last_was_cut = False
        return self._write(up)

    def rising(self, now: float) -> None:
        """The fast path is following a rise of what LS needs: a raise's hold starts again.
        A load that keeps rising again (noisy LS) is not gone between its peaks, and a raise
        between them is undone by the next one."""
        if self._above_since is not None:
            self._above_since = None

    def hold(self, reversal: bool) -> float:
        """How long a higher target must last: ``relax_hold``, doubled for each reversal in the
        last minute when this raise would be one more (at most a minute). An LS load that
        comes and goes every half minute gets BE's CPU back within seconds each time; one that
        flaps every few seconds waits longer and longer."""
        if not reversal:
            return self.relax_hold
        return min(60.0, self.relax_hold * float(2 ** len(self._relaxed)))

    def _write(self, target: float) -> float:
        self.current = target
        self.writes += 1
        return target

    def reset(self) -> None:
        """The limit was withdrawn (the manager disabled): start again from nothing."""
        self.current, self._above_since, self._last_was_cut = None, None, True
        self._relaxed.clear()


def cpuset_size(cores: float) -> int:
    """Whole CPUs for the cpuset policy (at least one)."""
    return max(1, math.ceil(cores - 1e-9))


@register
class CPUSuppressStrategy(Strategy):
    """Limits BE's QoS-level groups, as a quota (cfsQuota) or a CPU count (cpuset)."""

    name = "CPUSuppress"
    needs_capacity = True

    def __init__(self, host: Host) -> None:
        self.host = host
        self.limiter = Limiter()
        self._applied: set[str] = set()  # QoS-level groups with our quota overlay
        self._mode: str | None = None  # the suppression policy in force (cfsQuota, cpuset)
        self._cpuset_n: int | None = None  # CPUs BE's containers are on (cpuset policy)
        self._checked_idle: set[str] = set()  # QoS-level groups checked for a left cpu.idle
        self._why = ""  # the reason of the quota in force (cfsQuota), for a birth's lift and back
        self._lifted: float | None = None  # when a BE birth lifted the quota (node/births.py)
        self._cut_for: float | None = None  # the rise (its first sample's time) the fast path cut for
        host.model.births.subscribe(self._births)

    @classmethod
    def configured(cls, cfg: QoSManagerPolicy) -> bool:
        return cfg.cpuSuppress.enabled

    def decide(self, r: Round) -> None:
        self._give_back_idle()
        r.be_idle = r.policy.beProcess.schedIdle
        cap = r.capacity
        if cap is None:
            return
        # Until BE's group has been read twice, what is not BE is not known: the usage budget
        # waits for it rather than taking BE's own CPU for LS's.
        self.apply(r, self.target(r, cap, usage_known=cap.be_measured))
        limit, target = self.limiter.current, self.target(r, cap).cores
        r.be_limit = limit if limit is not None and math.isfinite(limit) else None
        r.be_target = target if math.isfinite(target) else None

    def between_rounds(self, r: Round) -> None:
        """The fast path's cut. A rise is measured more exactly with each sample that follows
        it (a longer interval inside it): a cut made for it is refined by as little as
        REFINE_CORES until the rise is no longer followed, so its first, rough measure does
        not leave BE above what the rise allows (the deadband would keep it there). A rise that
        made no cut (BE was limited enough already) is not refined: a noisy load writes no more."""
        cap, fast = r.capacity, r.fast
        if cap is None:
            return
        held = None
        if fast is not None and fast.held is not None:
            held = self.target(r, replace(cap, non_be_usage=fast.held)).cores
        rise = None if fast is None else fast.rise
        if rise is not None:
            self.limiter.rising(r.t)
        band = REFINE_CORES if rise is not None and rise == self._cut_for else None
        writes = self.limiter.writes
        self.apply(r, self.target(r, cap), tighten_only=True, held=held, band=band)
        if rise is not None and self.limiter.writes != writes:
            self._cut_for = rise

    def unquoted(self, r: Round) -> bool:
        """Whether BE goes without a quota this round: its tasks run SCHED_IDLE
        (``beProcess.schedIdle``), the policy is cfsQuota and the level is below ``quotaFrom``.
        SCHED_IDLE already hands every CPU to an LS task the moment it wakes; a quota on top
        makes BE run in bursts from each period's start until throttled, and the colocation
        benchmark measured those bursts as LS's tail (docs/benchmarks.md)."""
        return (
            r.policy.beProcess.schedIdle
            and r.policy.cpu_suppress_policy() == "cfsQuota"
            and r.level < Level[r.config.cpuSuppress.quotaFrom]
        )

    def target(self, r: Round, cap: Capacity, usage_known: bool = True) -> Target:
        s, usage = r.config.cpuSuppress, r.policy.resourceUsedThresholdWithBE
        if self.unquoted(r):
            return Target(
                math.inf, f"{r.level.name}: below quotaFrom {s.quotaFrom}, BE runs SCHED_IDLE without a quota"
            )
        calm = r.level < Level[s.reserveLSRequestFrom]
        return be_target(
            cap,
            s.suppressRatio.of(r.level),
            r.level.name,
            usage_threshold_percent=usage.cpuSuppressThresholdPercent if usage.enable and usage_known else 0.0,
            burst_granted=r.burst_extra,
            floor=s.minCores,
            ls_reserve=cap.ls_usage if calm else None,
        )

    def apply(
        self, r: Round, target: Target, tighten_only: bool = False, held: float | None = None, band: float | None = None
    ) -> None:
        groups = self.host.groups
        if not groups:
            return
        mode = r.policy.cpu_suppress_policy()
        if mode != self._mode:
            self._switch(mode)
        s, lim = r.config.cpuSuppress, self.limiter
        lim.deadband, lim.relax_hold, lim.max_relax_per_minute = s.deadbandCores, s.raiseDelay, s.maxWritesPerMinute
        before = lim.current
        new = lim.step(r.t, target.cores, tighten_only, held, band)
        if new is None:
            return
        finite = math.isfinite(new)
        if mode == "cpuset":
            written = self._apply_cpuset(new, before, target.why)
        else:
            self._apply_quota(new, target.why)
            written = f"{new:.2f} cores" if finite else "no quota"
        if written is None:
            return
        host = self.host
        host.observer.be_limit(new if mode == "cfsQuota" else float(cpuset_size(new)))
        host.observer.suppressed(r.level.name)
        host.decisions.append(Decision(r.t, SUPPRESS, ",".join(groups), written, target.why))
        log.info(
            "BE limited to %s: %s%s" if finite else "BE not limited (%s): %s%s",
            written,
            target.why,
            r.cpu_said(),
            extra={
                "be_limit_cores": round(new, 3) if finite else None,
                "level": r.level.name,
                "policy": mode,
                "cpu_score": round(r.cpu_score, 1),
                **{f"cpu_{k}": round(v, 1) for k, v in (r.cpu_terms or {}).items()},  # scalars: one JSON field each
            },
        )

    def _apply_quota(self, new: float, why: str) -> None:
        """cfsQuota: BE's QoS-level group gets the quota; ``new`` infinite: no quota (-1
        written, so a previous agent's cut is lifted too). Its weight is the kubelet's (it
        rewrites it on every pod change): never written here."""
        unlimited = not math.isfinite(new)
        self._why = why
        born = not unlimited and self.host.model.births.open
        if born:
            why = f"{why}; no quota while a BE container is born (runc must freeze it: node/births.py)"
        self._count_lift(born)
        values: dict[str, int | str] = {
            "cpu.cfs_quota_us": -1 if unlimited or born else quota_us(new),
            "cpu.cfs_period_us": CFS_PERIOD_US,
        }
        # cgroup v1 refuses a child's quota above its parent's: BE's pods and containers get
        # the limit as a ceiling (new ones at birth too). The desired state keeps it in force
        # no higher than what the group holds (a raise reaches the children once the group
        # has it), and the one writer lowers children before the group.
        desired = self.host.desired
        if unlimited:
            desired.withdraw_ceiling(QoSClass.BE)  # what the groups hold bounds until they are raised
        else:
            desired.set_ceiling(QoSClass.BE, new, SUPPRESS, f"BE's group is limited to {new:.2f} cores")
        for group in self.host.groups:
            desired.bound(QoSClass.BE, group)
            key = self.host.owner.own_group(group)
            # kubelet sets no quota on its QoS-level groups: lifting BE's limit restores none,
            # whatever a previous agent's cut the group held when this one started
            desired.set_overlay(key, SUPPRESS, values, why, before={"cpu.cfs_quota_us": -1})
            self._applied.add(key)

    def _births(self, born: bool) -> None:
        """The first BE birth began (``born``) or the last one ended: under a quota (cfsQuota),
        BE's groups lose it until then, and get it back after. The one writer writes the lift
        right after the hook's answer, before the runtime gets to ``runc create``."""
        current = self.limiter.current
        if self._mode != "cfsQuota" or not self._applied or current is None or not math.isfinite(current):
            self._count_lift(False)
            return
        self._apply_quota(current, self._why)

    def _count_lift(self, born: bool) -> None:
        if born and self._lifted is None:
            self._lifted = time.monotonic()
            self.host.observer.birth_lift(None)
        elif not born and self._lifted is not None:
            self.host.observer.birth_lift(time.monotonic() - self._lifted)
            self._lifted = None

    def _apply_cpuset(self, new: float, before: float | None, why: str) -> str | None:
        """cpuset: BE's containers on whole CPUs of the share pool (SMT siblings together),
        as many as the limit rounded up (at least one). Only a change in the count is written,
        so the integer steps are a deadband of their own (koordlet rewrites it every tick,
        koordinator#1103)."""
        n = cpuset_size(new)
        if before is not None and self._cpuset_n == n:
            return None
        self._cpuset_n = n
        self.host.desired.set_cpuset_limit(QoSClass.BE, n, SUPPRESS, f"{why}; BE on {n} CPU(s) of the share pool")
        return f"{n} CPU(s)"

    def _switch(self, mode: str) -> None:
        """The suppression policy changed: lift what the other one set, start afresh."""
        if mode != "cpuset":
            self._lift_cpuset(f"the suppression policy is now {mode}")
        if mode != "cfsQuota" and self._applied:
            self._lift_quota()
        self.limiter.reset()
        self._mode = mode

    def _lift_quota(self) -> None:
        for key in sorted(self._applied):  # the group first: its children rise after it
            self.host.desired.withdraw_overlay(key, SUPPRESS)
        self.host.desired.withdraw_ceiling(QoSClass.BE)
        self._applied.clear()

    def _lift_cpuset(self, why: str) -> None:
        if self._cpuset_n is not None:
            self.host.desired.set_cpuset_limit(QoSClass.BE, None, SUPPRESS, f"{why}: BE on the whole share pool again")
            self._cpuset_n = None

    def _give_back_idle(self) -> None:
        """A previous agent (an older policy's ``beGroupIdle``) may have left ``cpu.idle`` 1 on
        BE's QoS-level groups: the kernel then refuses the kubelet's weight writes there. Put
        0 back, and the kubelet's own lowest weight (which ``cpu.idle`` 0 resets to the
        default), once per group this agent sees."""
        desired = self.host.desired
        if not desired.caps.files.get("cpu.idle", False):
            return
        for group in self.host.groups:
            if group in self._checked_idle:
                continue
            self._checked_idle.add(group)
            key = self.host.owner.own_group(group)
            if desired.current(key, "cpu.idle") != 1:
                continue
            values: dict[str, int | str] = {"cpu.idle": 0, "cpu.shares": KUBELET_BE_SHARES}
            why = "given back: cpu.idle 1 on the kubelet's group (left by a previous agent) refuses its weight writes"
            desired.set_overlay(key, IDLE, values, why, before=values)
            desired.withdraw_overlay(key, IDLE)  # the values before stay as the baseline
            log.warning("%s: %s", group, why, extra={"group": group})

    def off(self, t: float, why: str) -> bool:
        """BE gets its CPU back: the quota and its ceiling withdrawn, the whole pool again."""
        held = bool(self._applied) or self._cpuset_n is not None
        if held:
            self._lift_quota()
            self._lift_cpuset(why)
            self.host.decisions.append(Decision(t, SUPPRESS, "all", "withdrawn", why))
        self._mode = None
        self.limiter.reset()
        return held
