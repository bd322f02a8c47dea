"""The vocabulary of the desired state: what a feature sees of a pod or container (Context)
and what it produces (Intent: Settings, each with its value, why and owner), the one rule that
binds values across features and overlays (:func:`cap_burst`), and reading the runtime's
request and the pods' annotations (untrusted input: :class:`InvalidInput`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from nriplugin.intent.cpus import CPUAllocator
from nriplugin.kernel.probe import Capabilities
from nriplugin.nri import api_pb2 as api
from nriplugin.policy.model import Policy
from nriplugin.policy.qos import QoSClass

MAX_ANNOTATION = 16 * 1024
QUOTA, BURST, PERIOD = "cpu.cfs_quota_us", "cpu.cfs_burst_us", "cpu.cfs_period_us"


class InvalidInput(ValueError):
    """A pod label/annotation that cannot be used (untrusted input); names the key."""

    def __init__(self, key: str, why: str) -> None:
        super().__init__(f"{key}: {why}")
        self.key = key
        self.why = why


class PodSpecs(Protocol):
    """What the API server's pod spec says that the runtime does not carry (the cluster side's
    pod cache): the extended resources a pod's containers ask, as the text of Koordinator's
    ``node.koordinator.sh/extended-resource-spec`` annotation (None: none asked, or the pod not
    seen yet)."""

    def extended_resource_spec(self, uid: str) -> str | None: ...


class Context(NamedTuple):
    """What a feature sees of one pod or container (immutable; a tuple: built on every hook)."""

    pod: api.PodSandbox
    container: api.Container | None  # None for pod-level intents
    qos: QoSClass
    policy: Policy
    caps: Capabilities
    cpus: CPUAllocator | None = None  # node CPU state (cpuset feature)
    specs: PodSpecs | None = None  # the API server's pod specs (the cluster side), None without it

    def has(self, resource: str) -> bool:
        return self.caps.files.get(resource, False)

    def requested(self, resource: str) -> int | None:
        return requested(self.container, resource)

    def annotation_json(self, key: str) -> Any:
        raw = self.pod.annotations.get(key)
        return None if raw is None else annotation_json(key, raw)


def requested(c: api.Container | None, resource: str) -> int | None:
    """What the runtime was asked for (CRI), in logical units; None when not set."""
    if c is None or not c.HasField("linux"):
        return None
    r = c.linux.resources
    if resource == "cpu.shares" and r.cpu.HasField("shares"):
        return int(r.cpu.shares.value)
    if resource == "cpu.cfs_quota_us" and r.cpu.HasField("quota"):
        return int(r.cpu.quota.value)
    if resource == "cpu.cfs_period_us" and r.cpu.HasField("period"):
        return int(r.cpu.period.value)
    if resource == "memory.limit_in_bytes" and r.memory.HasField("limit"):
        return int(r.memory.limit.value)
    return None


def annotation_json(key: str, raw: str) -> Any:
    if len(raw) > MAX_ANNOTATION:
        raise InvalidInput(key, f"longer than {MAX_ANNOTATION} bytes")
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InvalidInput(key, f"not valid JSON ({exc.msg})") from exc
    except RecursionError as exc:
        raise InvalidInput(key, "JSON nested too deeply") from exc


class Setting(NamedTuple):
    """One desired cgroup value: a logical resource (v1 name), for per-device rules the device
    ("MAJOR:MINOR"), the value, why, and who decided it (a feature, or an overlay's owner).
    Immutable (a tuple: several are built on every hook)."""

    resource: str
    value: int | str
    why: str
    device: str = ""
    owner: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return (self.resource, self.device)

    @property
    def file_value(self) -> int | str:
        """What the file takes: per-device rules are written as "MAJOR:MINOR N"."""
        return f"{self.device} {self.value}" if self.device else self.value

    @property
    def label(self) -> str:
        return f"{self.resource} {self.device}" if self.device else self.resource


@dataclass
class Intent:
    """Desired state of one container, pod or QoS-level group: cgroup file settings, and the
    task groups its tasks join (resctrl, core scheduling: memberships, not files)."""

    files: dict[tuple[str, str], Setting] = field(default_factory=dict)
    resctrl_group: Setting | None = None
    core_sched_group: Setting | None = None
    # the scheduling policy its tasks run under ("idle": SCHED_IDLE), where the runtime may not
    # have given it at birth (an older NRI or OCI runtime): a task attribute, not a file
    sched_policy: Setting | None = None
    rdt_class: str | None = None  # the NRI adjustment's RDT class (runtimes with RDT configured)
    owner: str = ""  # who sets values now (the pipeline names the feature it runs)

    def set(self, resource: str, value: int | str, why: str, device: str = "") -> None:
        self.files[(resource, device)] = Setting(resource, value, why, device, self.owner)

    def join(self, kind: str, group: str, why: str) -> None:
        """Tasks join ``group``: kind "resctrl" (a resctrl group), "coresched" (a cookie) or
        "sched" (a scheduling policy: "idle")."""
        s = Setting(f"{kind}.group", group, why, owner=self.owner)
        if kind == "resctrl":
            self.resctrl_group = s
        elif kind == "coresched":
            self.core_sched_group = s
        elif kind == "sched":
            self.sched_policy = s
        else:
            raise ValueError(f"unknown task group kind {kind!r}")

    def get(self, resource: str, device: str = "") -> int | str | None:
        s = self.files.get((resource, device))
        return None if s is None else s.value

    @property
    def values(self) -> dict[str, int | str]:
        """The device-less file values by resource (what features read back from each other)."""
        return {s.resource: s.value for s in self.files.values() if not s.device}

    @property
    def why(self) -> dict[str, str]:
        return {s.resource: s.why for s in self.files.values() if not s.device}

    def settings(self) -> list[Setting]:
        return list(self.files.values())

    def copy(self) -> Intent:
        return Intent(
            dict(self.files), self.resctrl_group, self.core_sched_group, self.sched_policy, self.rdt_class, self.owner
        )


def cap_burst(files: dict[tuple[str, str], Setting]) -> None:
    """Burst never above the quota (the kernel refuses it): an overlay that lowers a quota
    lowers the burst with it."""
    b, q = files.get((BURST, "")), files.get((QUOTA, ""))
    if b is None or q is None or not isinstance(q.value, int) or not isinstance(b.value, int):
        return
    if q.value != -1 and b.value > q.value:
        files[(BURST, "")] = b._replace(value=q.value, why=f"{b.why}; capped at the quota {q.value} us")
