"""The policy: the plugin's own YAML, shaped like Koordinator's NodeSLO spec where they overlap
(resourceQOSStrategy, cpuBurstStrategy, resourceUsedThresholdWithBE) plus per-feature switches
and failure policies, and the QoS manager's ``qosManager`` section (its tuning profiles are
in ``profiles.py``). A NodeSLO object is accepted as a file too.

Every field is validated; an error names the field path and the bad value.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from nriplugin.policy.bandwidth import check_class_bandwidth, parse_total_bandwidth
from nriplugin.policy.profiles import PROFILES, Profile, overlay
from nriplugin.policy.quantity import parse_quantity

Percent = Annotated[int, Field(ge=0, le=100)]


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class CPUQOS(_M):
    enable: bool = True
    groupIdentity: Annotated[int, Field(ge=-1, le=2)] | None = None
    schedIdle: Annotated[int, Field(ge=0, le=1)] | None = None
    coreExpeller: bool | None = None


class MemoryQOS(_M):
    enable: bool = False
    minLimitPercent: Percent | None = None
    lowLimitPercent: Percent | None = None
    throttlingPercent: Percent | None = None
    wmarkRatio: Percent | None = None
    wmarkScalePermill: Annotated[int, Field(ge=1, le=1000)] | None = None
    wmarkMinAdj: Annotated[int, Field(ge=-25, le=50)] | None = None
    priorityEnable: Annotated[int, Field(ge=0, le=1)] | None = None
    priority: Annotated[int, Field(ge=0, le=12)] | None = None
    oomKillGroup: Annotated[int, Field(ge=0, le=1)] | None = None


class ResctrlQOS(_M):
    enable: bool = False
    catRangeStartPercent: Percent = 0
    catRangeEndPercent: Percent = 100
    mbaPercent: Percent = 100

    @model_validator(mode="after")
    def _range(self) -> ResctrlQOS:
        if self.catRangeStartPercent >= self.catRangeEndPercent:
            raise ValueError(
                f"catRangeStartPercent ({self.catRangeStartPercent}) must be below "
                f"catRangeEndPercent ({self.catRangeEndPercent})"
            )
        return self


class IOCfg(_M):
    readIOPS: Annotated[int, Field(ge=0)] | None = None
    writeIOPS: Annotated[int, Field(ge=0)] | None = None
    readBPS: Annotated[int, Field(ge=0)] | None = None
    writeBPS: Annotated[int, Field(ge=0)] | None = None
    ioWeightPercent: Annotated[int, Field(ge=1, le=100)] | None = None


class BlockCfg(_M):
    name: Annotated[str, Field(min_length=1, max_length=255, pattern=r"^[A-Za-z0-9_./:-]+$")]
    type: Literal["device", "volumegroup", "podvolume"] = "device"
    ioCfg: IOCfg = IOCfg()


class BlkIOQOS(_M):
    enable: bool = False
    blocks: list[BlockCfg] = []


def _bandwidth(v: Any) -> Any:
    """A class's bandwidth as Koordinator's CRD takes it: an integer is a percentage of
    ``systemStrategy.totalNetworkBandwidth`` (0-100), ``"N%"`` the same, any other string a
    Kubernetes quantity in bits/s (``"50M"``). Checked here, converted by ``netqos/desired.py``."""
    return check_class_bandwidth(v)


Bandwidth = Annotated[int | str, BeforeValidator(_bandwidth)]


class NetworkQOS(_M):
    """Koordinator's ``networkQOS`` of a class (L0/L1/L2 in tc, see ``netqos/desired.py``):
    ``*Request`` is the class's guaranteed rate, ``*Limit`` its ceiling. Off by default, as in
    Koordinator: network QoS does nothing until a class enables it or a pod carries a
    bandwidth annotation."""

    enable: bool = False
    ingressRequest: Bandwidth = 0
    ingressLimit: Bandwidth = 100
    egressRequest: Bandwidth = 0
    egressLimit: Bandwidth = 100


class ResourceQOS(_M):
    cpuQOS: CPUQOS = CPUQOS()
    memoryQOS: MemoryQOS = MemoryQOS()
    resctrlQOS: ResctrlQOS = ResctrlQOS()
    blkioQOS: BlkIOQOS = BlkIOQOS()
    networkQOS: NetworkQOS = NetworkQOS()


class Policies(_M):
    cpuPolicy: Literal["groupIdentity", "coreSched"] = "groupIdentity"
    # "tc": nriplugin shapes with Linux tc; "terway-qos": Terway's datapath does it, we do nothing.
    netQOSPolicy: Literal["tc", "terway-qos"] = "tc"


class ResourceQOSStrategy(_M):
    policies: Policies = Policies()
    lsrClass: ResourceQOS = ResourceQOS(cpuQOS=CPUQOS(groupIdentity=2))
    lsClass: ResourceQOS = ResourceQOS(cpuQOS=CPUQOS(groupIdentity=2))
    beClass: ResourceQOS = ResourceQOS(cpuQOS=CPUQOS(groupIdentity=-1, schedIdle=1))
    systemClass: ResourceQOS = ResourceQOS(cpuQOS=CPUQOS(enable=False))


class CPUBurstStrategyPolicy(_M):
    policy: Literal["none", "cpuBurstOnly", "cfsQuotaBurstOnly", "auto"] = "cpuBurstOnly"
    cpuBurstPercent: Annotated[int, Field(ge=1, le=10000)] = 1000
    cfsQuotaBurstPercent: Annotated[int, Field(ge=100)] = 300
    cfsQuotaBurstPeriodSeconds: Annotated[int, Field(ge=-1)] = -1
    sharePoolThresholdPercent: Percent = 50


class ResourceThresholdStrategy(_M):
    """Koordinator's NodeSLO usage thresholds. For CPU suppression they are the usage-based
    alternative to ``qosManager.cpuSuppress``'s level-based budget: BE may use
    ``total x cpuSuppressThresholdPercent % - non-BE usage`` (BE's own usage is not counted,
    as in the pressure score), at least ``cpuSuppressMinPercent`` % of the node. When
    ``enable`` is set the manager takes the lower of the two budgets. ``cpuSuppressPolicy`` is
    the suppression policy unless ``qosManager.cpuSuppress.policy`` names one.

    ``cpuSuppressThresholdPercent`` is 90 here where koordlet's default is 65: koordlet's loop
    sees an LS rise a second or two late and keeps a third of the node idle for it; this
    agent's fast path cuts BE within a fast sample or two of it, and at 65 the node cannot be busier than
    65 % whenever BE fills the rest (the colocation benchmark, docs/benchmarks.md). A
    NodeSLO's own value wins."""

    enable: bool = True
    cpuSuppressThresholdPercent: Percent = 90
    cpuSuppressMinPercent: Percent | None = None
    cpuSuppressPolicy: Literal["cfsQuota", "cpuset"] = "cfsQuota"
    memoryEvictThresholdPercent: Percent = 70
    memoryEvictLowerPercent: Percent | None = None
    cpuEvictBESatisfactionUpperPercent: Percent | None = None
    cpuEvictBESatisfactionLowerPercent: Percent | None = None
    cpuEvictBEUsageThresholdPercent: Percent | None = None
    cpuEvictTimeWindowSeconds: Annotated[int, Field(gt=0)] | None = None
    cpuEvictPolicy: Literal["evictByRealLimit", "evictByAllocatable"] | None = None


_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def _seconds(v: Any) -> Any:
    """Seconds from a number or a Go duration string, as Kubernetes users write them
    (``500ms``, ``1s``, ``1m30s``)."""
    if isinstance(v, bool):
        raise ValueError("expected seconds or a duration such as 500ms, 1s, 30s")
    if not isinstance(v, str):
        return v  # numbers go on to float validation
    text = v.strip()
    pos, total = 0, 0.0
    while pos < len(text):
        m = _DURATION.match(text, pos)
        if m is None:
            break
        total += float(m.group(1)) * _UNIT[m.group(2)]
        pos = m.end()
    if not text or pos != len(text):
        raise ValueError(f"not a duration: {text[:40]!r} (use seconds, or e.g. 500ms, 1s, 30s, 1m)")
    return total


def _cores(v: Any) -> Any:
    """CPU cores from a number or a Kubernetes CPU quantity (``500m``, ``1.5``)."""
    if isinstance(v, bool):
        raise ValueError("expected cores, e.g. 0.5 or 500m")
    if isinstance(v, str):
        m = re.fullmatch(r"(\d+(?:\.\d+)?)(m?)", v.strip())
        if m is None:
            raise ValueError(f"not a CPU quantity: {v[:40]!r} (use cores, e.g. 0.5 or 500m)")
        return float(m.group(1)) / (1000 if m.group(2) else 1)
    return v


Seconds = Annotated[float, BeforeValidator(_seconds)]
Cores = Annotated[float, BeforeValidator(_cores)]
Score = Annotated[float, Field(ge=0, le=100)]
Ratio = Annotated[float, Field(gt=0, le=1)]


class CPUPressure(_M):
    """Level boundaries of a pressure score: below ``low`` is LOW, below ``medium``
    MEDIUM, below ``high`` HIGH, below ``critical`` CRITICAL, from ``critical`` on EMERGENCY.
    ``hysteresis``: a level is left downwards only this many points below its boundary;
    ``fallTime``: the time constant at which a falling score is followed (a rising one is
    taken at once, so an LS spike acts on the first sample)."""

    low: Score = 40.0
    medium: Score = 60.0
    high: Score = 75.0
    critical: Score = 90.0
    hysteresis: Annotated[float, Field(ge=0, le=50)] = 5.0
    fallTime: Annotated[Seconds, Field(ge=0, le=600)] = 5.0

    @model_validator(mode="after")
    def _increasing(self) -> CPUPressure:
        b = (self.low, self.medium, self.high, self.critical)
        if not b[0] < b[1] < b[2] < b[3]:
            raise ValueError(
                f"thresholds must increase: low ({b[0]:g}) < medium ({b[1]:g}) < high ({b[2]:g}) < critical ({b[3]:g})"
            )
        return self


class MemoryPressure(CPUPressure):
    low: Score = 50.0
    medium: Score = 70.0
    high: Score = 80.0
    critical: Score = 90.0


class SuppressRatio(_M):
    """The share of BE's budget (total - LS reserve - system reserved) BE keeps, by CPU level."""

    low: Ratio = 1.0
    medium: Ratio = 0.8
    high: Ratio = 0.5
    critical: Ratio = 0.3
    emergency: Ratio = 0.1

    @model_validator(mode="after")
    def _non_increasing(self) -> SuppressRatio:
        r = (self.low, self.medium, self.high, self.critical, self.emergency)
        if not r[0] >= r[1] >= r[2] >= r[3] >= r[4]:
            raise ValueError(
                f"ratios must not increase with the level: low ({r[0]:g}) >= medium ({r[1]:g}) >= "
                f"high ({r[2]:g}) >= critical ({r[3]:g}) >= emergency ({r[4]:g})"
            )
        return self

    def of(self, level: int) -> float:
        """The ratio of a level (0 LOW ... 4 EMERGENCY, as ``nriplugin.qos.levels.Level``)."""
        return (self.low, self.medium, self.high, self.critical, self.emergency)[max(0, min(4, int(level)))]


# the names of nriplugin.qos.levels.Level, in its order (the policy layer does not import qos)
LevelName = Literal["LOW", "MEDIUM", "HIGH", "CRITICAL", "EMERGENCY"]


class CPUSuppress(_M):
    """BE limit = max(minCores, (total - LS reserve - systemReserved) x suppressRatio[level]).

    The LS reserve is LS's request from level ``reserveLSRequestFrom`` (HIGH) up; below it,
    what LS uses now (never more than its request). Requests are sized for peaks: reserving a
    calm LS's unused request kept it from BE on top of the usage budget's headroom (the
    colocation benchmark, docs/benchmarks.md). The usage budget's fast path gives it back to LS
    within a fast sample or two of LS needing it, and BE's tasks run SCHED_IDLE (``beProcess.schedIdle``). ``LOW``
    reserves the request at every level (the seed's formula).

    ``policy`` None follows ``resourceUsedThresholdWithBE.cpuSuppressPolicy`` (cfsQuota by
    default; see ``Policy.cpu_suppress_policy``). ``minCores``: BE is never starved to zero, so
    its processes still answer SIGTERM, probes and the Eviction API's graceful shutdown; with the
    cpuset policy the floor is one whole CPU (two SMT siblings where they are paired).
    Against flapping and write storms: a new limit within ``deadbandCores`` of the current one is
    not written; a cut is written at once (LS first), a raise only once the higher target has held
    for ``raiseDelay`` (then to the lowest target seen over that time). A raise that reverses a
    cut waits ``raiseDelay`` doubled for each such reversal in the last minute, and at most
    ``maxWritesPerMinute`` of them land in a minute: LS load that comes back every half minute
    gives BE its CPU back within seconds each time, a flapping one ever more slowly.
    ``quotaFrom``: while BE's tasks run SCHED_IDLE (``beProcess.schedIdle``; within whatever
    quota BE has, an LS task that wakes takes the CPU) and the policy is cfsQuota, BE has no
    quota at all below this level: SCHED_IDLE gives LS every
    CPU it wakes up on, and a quota only makes BE run in bursts from each period's start, which
    the colocation benchmark measured as LS's tail. From this level on the bounds above apply
    (near the knee BE's CPU hurts LS whatever its priority; only less of it helps). ``LOW``: a
    quota at every level.

    ``beGroupIdle`` is accepted and no longer applied: it wrote ``cpu.idle`` 1 on the kubelet's
    besteffort group, where the kernel then refuses the kubelet's own weight writes (it could
    not update its QoS groups, nor start). BE's tasks get the same idle class per task
    (``beProcess.schedIdle``), and an agent that finds the flag left on a group gives it back."""

    enabled: bool = True
    beGroupIdle: bool | None = None
    policy: Literal["cfsQuota", "cpuset"] | None = None
    suppressRatio: SuppressRatio = SuppressRatio()
    reserveLSRequestFrom: LevelName = "HIGH"
    quotaFrom: LevelName = "HIGH"
    minCores: Annotated[Cores, Field(gt=0, le=1024)] = 0.1
    deadbandCores: Annotated[Cores, Field(ge=0, le=1024)] = 0.2
    raiseDelay: Annotated[Seconds, Field(ge=0, le=600)] = 2.0
    maxWritesPerMinute: Annotated[int, Field(ge=1, le=600)] = 4


class CPUEvict(_M):
    """Evict BE pods when the CPU score is at ``evictThreshold``, BE is already suppressed and
    LS suffers (stalled at least ``stallThreshold`` of the time, or throttled in at least
    ``throttleThreshold`` of its periods) for ``sustain`` seconds; free ``releaseFactor`` x the
    LS shortage; then wait ``evictCooldown`` (see ``nriplugin/qos/eviction/cpu.py``)."""

    enabled: bool = True
    evictThreshold: Score = 90.0
    evictCooldown: Annotated[Seconds, Field(ge=0, le=86400)] = 60.0
    sustain: Annotated[Seconds, Field(ge=0, le=600)] = 2.0
    stallThreshold: Annotated[float, Field(gt=0, le=1)] = 0.1
    throttleThreshold: Annotated[float, Field(gt=0, le=1)] = 0.2
    releaseFactor: Annotated[float, Field(ge=1, le=10)] = 1.2


class MemoryEvict(_M):
    """Evict BE pods when the pods' memory reaches ``resourceUsedThresholdWithBE.
    memoryEvictThresholdPercent``, grows fast enough to reach the limit within ``oomHorizon``
    seconds, or the memory score reaches ``evictThreshold``; free ``releaseFactor`` x what is
    above ``memoryEvictLowerPercent``. Within ``urgentSeconds`` of the limit the runtime stops
    the victims with no grace period (see ``nriplugin/qos/eviction/memory.py``)."""

    enabled: bool = True
    evictThreshold: Score = 85.0
    memoryGrowthThreshold: Annotated[float, Field(ge=0)] = 5.0  # MB/min: a pod growing faster leaks
    oomScoreAdjust: Annotated[int, Field(ge=-1000, le=1000)] = 1000
    releaseFactor: Annotated[float, Field(ge=1, le=10)] = 1.3
    oomHorizon: Annotated[Seconds, Field(gt=0, le=3600)] = 10.0
    urgentSeconds: Annotated[Seconds, Field(ge=0, le=600)] = 5.0


class EvictionPolicy(_M):
    """How evictions are carried out, for every strategy: ``dryRun`` logs and counts what would
    be evicted and touches nothing; at most ``maxPerMinute`` pods a minute over all strategies;
    ``gracePeriodSeconds`` for a pod to shut down; a pod is not evicted again within
    ``repeatAfter`` seconds, and one a disruption budget protected is tried again after
    ``retryAfter``."""

    dryRun: bool = False
    maxPerMinute: Annotated[int, Field(ge=1, le=600)] = 10
    gracePeriodSeconds: Annotated[int, Field(ge=0, le=3600)] = 5
    repeatAfter: Annotated[Seconds, Field(ge=0, le=86400)] = 120.0
    retryAfter: Annotated[Seconds, Field(ge=0, le=86400)] = 30.0


class CPUBurst(_M):
    """LS containers may exceed their CPU limit by ``burstRatio`` while the node is at least
    ``fullBurstNodeCPUIdle`` idle, by ``partialBurstRatio`` down to ``minNodeCPUIdle``, not below
    (by default 1.5 above 30 % idle, 1.3 at 20-30 %, none under 20 %); for at most
    ``burstDuration``, then not again for ``burstCooldown``. This is the manager's dynamic quota
    raise; ``cpuBurstStrategy`` is the static burst (``cpu.cfs_burst_us``) set at birth."""

    enabled: bool = True
    burstRatio: Annotated[float, Field(ge=1, le=10)] = 1.5
    partialBurstRatio: Annotated[float, Field(ge=1, le=10)] = 1.3
    burstDuration: Annotated[Seconds, Field(gt=0, le=3600)] = 10.0
    burstCooldown: Annotated[Seconds, Field(ge=0, le=3600)] = 30.0
    minNodeCPUIdle: Annotated[float, Field(ge=0, le=1)] = 0.2
    fullBurstNodeCPUIdle: Annotated[float, Field(ge=0, le=1)] = 0.3

    @model_validator(mode="before")
    @classmethod
    def _follow(cls, data: Any) -> Any:
        """A partial ratio or full-burst idle share left unset follows the field it must not
        pass (``burstRatio: 1.2`` alone is not an error about a default)."""
        if not isinstance(data, dict):
            return data
        out = dict(data)
        for dep, on, default, cmp in (
            ("partialBurstRatio", "burstRatio", 1.3, min),
            ("fullBurstNodeCPUIdle", "minNodeCPUIdle", 0.3, max),
        ):
            if dep not in out and isinstance(out.get(on), (int, float)) and not isinstance(out[on], bool):
                out[dep] = cmp(default, out[on])
        return out

    @model_validator(mode="after")
    def _ordered(self) -> CPUBurst:
        if self.partialBurstRatio > self.burstRatio:
            raise ValueError(f"partialBurstRatio ({self.partialBurstRatio:g}) exceeds burstRatio ({self.burstRatio:g})")
        if self.minNodeCPUIdle > self.fullBurstNodeCPUIdle:
            raise ValueError(
                f"minNodeCPUIdle ({self.minNodeCPUIdle:g}) exceeds fullBurstNodeCPUIdle ({self.fullBurstNodeCPUIdle:g})"
            )
        return self


def _total_bandwidth(v: Any) -> Any:
    """The node's bandwidth, kept as written (checked here; ``SystemStrategy.total_bits``
    converts): an integer is Mbit/s (the CRD's unit), a string a Kubernetes quantity in
    bits/s (``"100M"`` = 100 Mbit/s). Zero is not set, as Koordinator reads it (koord-manager's
    default NodeSLO writes ``"0"``)."""
    if v is None or _zero(v):
        return None
    parse_total_bandwidth(v)
    return v


def _zero(v: Any) -> bool:
    if isinstance(v, bool):
        return False
    if isinstance(v, int):
        return v == 0
    try:
        return isinstance(v, str) and parse_quantity(v) == 0
    except ValueError:
        return False


class SystemStrategy(_M):
    """Koordinator's NodeSLO ``systemStrategy``, the part nriplugin uses."""

    totalNetworkBandwidth: Annotated[int | str | None, BeforeValidator(_total_bandwidth)] = None

    def total_bits(self) -> int | None:
        """The node's bandwidth in bits/s (None: not set)."""
        v = self.totalNetworkBandwidth
        return None if v is None else parse_total_bandwidth(v)


class SystemReserved(_M):
    """CPU kept for the system and its daemons (NodeQOSResource / SystemQOSResource)."""

    cpu: Annotated[Cores, Field(ge=0, le=1024)] = 0.0


# The QoS manager's strategies, in the one order they run: the node's capacity, less what the
# system keeps, is known first; LS bursts are granted before BE is limited within what is left;
# eviction acts only when limiting BE is not enough. Each name has exactly one strategy
# (``nriplugin/qos/strategy.py``'s registry, checked when the manager is imported).
PluginName = Literal["NodeQOSResource", "SystemQOSResource", "CPUBurst", "CPUSuppress", "CPUEvict", "MemoryEvict"]
PLUGINS: tuple[PluginName, ...] = get_args(PluginName)


class QoSManagerPolicy(_M):
    """The QoS manager. ``profile`` (``profiles.py``) applies first; fields set here win."""

    enable: bool = True
    profile: Profile = "balanced"
    syncPeriod: Annotated[Seconds, Field(ge=0.1, le=60)] = 1.0
    cpuPressure: CPUPressure = CPUPressure()
    memoryPressure: MemoryPressure = MemoryPressure()
    cpuSuppress: CPUSuppress = CPUSuppress()
    cpuEvict: CPUEvict = CPUEvict()
    memoryEvict: MemoryEvict = MemoryEvict()
    eviction: EvictionPolicy = EvictionPolicy()
    cpuBurst: CPUBurst = CPUBurst()
    # Which strategies run (each also needs its own section enabled, where it has one); the
    # order they run in is always PLUGINS' (listed order is ignored). NodeQOSResource left out:
    # the strategies that size CPU (CPUBurst, CPUSuppress, CPUEvict) cannot run either;
    # SystemQOSResource left out: nothing is held back for the system.
    plugins: list[PluginName] = list(PLUGINS)
    systemReserved: SystemReserved = SystemReserved()

    @model_validator(mode="before")
    @classmethod
    def _profile(cls, data: Any) -> Any:
        if data is None:
            return {}  # `qosManager:` with everything under it commented out
        if not isinstance(data, dict):
            return data
        explicit = explicit_fields(data)
        preset = PROFILES.get(str(explicit.get("profile", "balanced")))
        return overlay(preset, explicit) if preset is not None else explicit

    @field_validator("plugins")
    @classmethod
    def _plugins(cls, v: list[str]) -> list[str]:
        dup = sorted({p for p in v if v.count(p) > 1})
        if dup:
            raise ValueError(f"listed more than once: {', '.join(dup)}")
        return [p for p in PLUGINS if p in v]


def explicit_fields(data: Any) -> Any:
    """What was given, as plain data: a model instance contributes only the fields set on it,
    so a profile can still fill the others."""
    if isinstance(data, BaseModel):
        return {k: explicit_fields(getattr(data, k)) for k in data.model_fields_set}
    if isinstance(data, dict):
        return {k: explicit_fields(v) for k, v in data.items()}
    return data


class FeatureSwitch(_M):
    enable: bool = True
    failurePolicy: Literal["fail-open", "fail-closed"] = "fail-open"


class Features(_M):
    """One switch per feature: the names feature modules register under
    (``nriplugin/features/registry.py``, which fails at import unless the two match)."""

    cpuQOS: FeatureSwitch = FeatureSwitch()
    batchResource: FeatureSwitch = FeatureSwitch()
    cpuBurst: FeatureSwitch = FeatureSwitch()
    memoryQOS: FeatureSwitch = FeatureSwitch()
    cpuset: FeatureSwitch = FeatureSwitch()
    resctrl: FeatureSwitch = FeatureSwitch()
    blkio: FeatureSwitch = FeatureSwitch()
    pidsLimit: FeatureSwitch = FeatureSwitch()


PidsLimit = Annotated[int, Field(ge=1, le=4 * 1024 * 1024)] | None  # the kernel's pid ceiling


class ContainerPidsLimit(_M):
    """The most tasks (processes and threads) one container of a class may hold: its
    ``pids.max``, through the runtime's NRI where it carries it (v0.8+), else written by the
    agent (``nriplugin/features/pids.py``). None (the default): the runtime's, i.e. only the
    kubelet's pod-level ``podPidsLimit``. LSE takes lsrClass's; SYSTEM is never touched."""

    lsrClass: PidsLimit = None
    lsClass: PidsLimit = None
    beClass: PidsLimit = None

    def of(self, qos: str) -> int | None:
        return {"LSE": self.lsrClass, "LSR": self.lsrClass, "LS": self.lsClass, "BE": self.beClass}.get(qos)


class BEProcess(_M):
    """What a BE container's process is born with, through the runtime's NRI, where the
    runtime carries it (``nriplugin/features/born_with.py``): ``SCHED_IDLE`` (NRI v0.11+), IO
    priority idle class (v0.10+), ``oom_score_adj`` (v0.8+; null: leave the kubelet's). Each
    is on by default; set it false (null) to turn it off. LS, LSR and SYSTEM are never touched."""

    schedIdle: bool = True
    ioPriorityIdle: bool = True
    # 0-1000: a BE process is never shielded from the OOM killer (lowering needs privilege too)
    oomScoreAdj: Annotated[int, Field(ge=0, le=1000)] | None = 1000


class Policy(_M):
    """The whole node policy. ``Policy()`` is the embedded default."""

    features: Features = Features()
    beMinCPUShares: Annotated[int, Field(ge=2, le=262144)] = 2
    # Also name the class in the NRI adjustment (LinuxResources.rdt_class) so the runtime places
    # the container itself. Only for runtimes with RDT configured (containerd's rdt_config_file
    # defining these classes): elsewhere the runtime refuses the container.
    resctrlRuntimeClasses: bool = False
    resourceQOSStrategy: ResourceQOSStrategy = ResourceQOSStrategy()
    cpuBurstStrategy: CPUBurstStrategyPolicy = CPUBurstStrategyPolicy()
    resourceUsedThresholdWithBE: ResourceThresholdStrategy = ResourceThresholdStrategy()
    qosManager: QoSManagerPolicy = QoSManagerPolicy()
    systemStrategy: SystemStrategy = SystemStrategy()
    beProcess: BEProcess = BEProcess()
    containerPidsLimit: ContainerPidsLimit = ContainerPidsLimit()

    def cpu_suppress_policy(self) -> Literal["cfsQuota", "cpuset"]:
        """``qosManager.cpuSuppress.policy`` if set, else the NodeSLO's ``cpuSuppressPolicy``."""
        return self.qosManager.cpuSuppress.policy or self.resourceUsedThresholdWithBE.cpuSuppressPolicy

    def class_qos(self, qos: str) -> ResourceQOS:
        s = self.resourceQOSStrategy
        return {"LSE": s.lsrClass, "LSR": s.lsrClass, "LS": s.lsClass, "BE": s.beClass}.get(qos, s.systemClass)


class NodeSLOError(ValueError):
    """A NodeSLO its CRD rejects; the message names every offending field."""
