"""The policy: the plugin's own YAML, shaped like Koordinator's NodeSLO spec where they overlap
(resourceQOSStrategy, cpuBurstStrategy, resourceUsedThresholdWithBE) plus per-feature switches
and failure policies. A NodeSLO object is accepted as a file too.

Every field is validated; an error names the field path and the bad value.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

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


class ResourceQOS(_M):
    cpuQOS: CPUQOS = CPUQOS()
    memoryQOS: MemoryQOS = MemoryQOS()
    resctrlQOS: ResctrlQOS = ResctrlQOS()
    blkioQOS: BlkIOQOS = BlkIOQOS()


class Policies(_M):
    cpuPolicy: Literal["groupIdentity", "coreSched"] = "groupIdentity"


class ResourceQOSStrategy(_M):
    policies: Policies = Policies()
    lsrClass: ResourceQOS = ResourceQOS(cpuQOS=CPUQOS(groupIdentity=2))
    lsClass: ResourceQOS = ResourceQOS(cpuQOS=CPUQOS(groupIdentity=2))
    beClass: ResourceQOS = ResourceQOS(cpuQOS=CPUQOS(groupIdentity=-1, schedIdle=1))
    systemClass: ResourceQOS = ResourceQOS(cpuQOS=CPUQOS(enable=False))


class CPUBurstStrategy(_M):
    policy: Literal["none", "cpuBurstOnly", "cfsQuotaBurstOnly", "auto"] = "cpuBurstOnly"
    cpuBurstPercent: Annotated[int, Field(ge=1, le=10000)] = 1000
    cfsQuotaBurstPercent: Annotated[int, Field(ge=100)] = 300
    cfsQuotaBurstPeriodSeconds: Annotated[int, Field(ge=-1)] = -1
    sharePoolThresholdPercent: Percent = 50


class ResourceThresholdStrategy(_M):
    enable: bool = True
    cpuSuppressThresholdPercent: Percent = 65
    cpuSuppressMinPercent: Percent | None = None
    cpuSuppressPolicy: Literal["cfsQuota", "cpuset"] = "cfsQuota"
    memoryEvictThresholdPercent: Percent = 70
    memoryEvictLowerPercent: Percent | None = None
    cpuEvictBESatisfactionUpperPercent: Percent | None = None
    cpuEvictBESatisfactionLowerPercent: Percent | None = None
    cpuEvictBEUsageThresholdPercent: Percent | None = None
    cpuEvictTimeWindowSeconds: Annotated[int, Field(gt=0)] | None = None
    cpuEvictPolicy: Literal["evictByRealLimit", "evictByAllocatable"] | None = None


FEATURES = ("cpuQOS", "batchResource", "cpuBurst", "memoryQOS", "cpuset", "resctrl", "blkio")


class FeatureSwitch(_M):
    enable: bool = True
    failurePolicy: Literal["fail-open", "fail-closed"] = "fail-open"


class Features(_M):
    cpuQOS: FeatureSwitch = FeatureSwitch()
    batchResource: FeatureSwitch = FeatureSwitch()
    cpuBurst: FeatureSwitch = FeatureSwitch()
    memoryQOS: FeatureSwitch = FeatureSwitch()
    cpuset: FeatureSwitch = FeatureSwitch()
    resctrl: FeatureSwitch = FeatureSwitch()
    blkio: FeatureSwitch = FeatureSwitch()


class Policy(_M):
    """The whole node policy. ``Policy()`` is the embedded default."""

    features: Features = Features()
    beMinCPUShares: Annotated[int, Field(ge=2, le=262144)] = 2
    # Also name the class in the NRI adjustment (LinuxResources.rdt_class) so the runtime places
    # the container itself. Only for runtimes with RDT configured (containerd's rdt_config_file
    # defining these classes): elsewhere the runtime refuses the container.
    resctrlRuntimeClasses: bool = False
    resourceQOSStrategy: ResourceQOSStrategy = ResourceQOSStrategy()
    cpuBurstStrategy: CPUBurstStrategy = CPUBurstStrategy()
    resourceUsedThresholdWithBE: ResourceThresholdStrategy = ResourceThresholdStrategy()

    def class_qos(self, qos: str) -> ResourceQOS:
        s = self.resourceQOSStrategy
        return {"LSE": s.lsrClass, "LSR": s.lsrClass, "LS": s.lsClass, "BE": s.beClass}.get(qos, s.systemClass)


NODESLO_IGNORED = ("systemStrategy", "extensions", "hostApplications")


def from_document(doc: Any) -> tuple[Policy, list[str]]:
    """A Policy from a parsed YAML/JSON document (our format, or a NodeSLO object).

    Returns the policy and notes about what was ignored. Raises pydantic.ValidationError.
    """
    notes: list[str] = []
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise TypeError(f"a policy must be a mapping, got {type(doc).__name__}")
    if doc.get("kind") == "NodeSLO":
        spec = doc.get("spec") or {}
        if not isinstance(spec, dict):
            raise TypeError("NodeSLO spec must be a mapping")
        spec = dict(spec)
        for key in NODESLO_IGNORED:
            if spec.pop(key, None) is not None:
                notes.append(f"NodeSLO spec.{key} is not used by nriplugin; ignored")
        doc = spec
    return Policy.model_validate(_merge(Policy().model_dump(), doc)), notes


def _merge(base: Any, over: Any) -> Any:
    """Deep-merge ``over`` onto the defaults, so a partial policy keeps every default it does
    not mention (lists and scalars replace)."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            out[k] = _merge(base[k], v) if k in base else v
        return out
    return over
