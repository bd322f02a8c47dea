"""What a feature sees (Context) and what it produces (Intent)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..kernel.probe import Capabilities
from ..nri import api_pb2 as api
from ..policy.model import Policy
from ..policy.qos import QoSClass

if TYPE_CHECKING:
    from .cpuset import CPUAllocator

MAX_ANNOTATION = 16 * 1024


class InvalidInput(ValueError):
    """A pod label/annotation that cannot be used (untrusted input); names the key."""

    def __init__(self, key: str, why: str) -> None:
        super().__init__(f"{key}: {why}")
        self.key = key
        self.why = why


@dataclass(frozen=True)
class Context:
    pod: api.PodSandbox
    container: api.Container | None  # None for pod-level intents
    qos: QoSClass
    policy: Policy
    caps: Capabilities
    cpus: CPUAllocator | None = None  # node CPU state (cpuset feature)

    def has(self, resource: str) -> bool:
        return self.caps.files.get(resource, False)

    def requested(self, resource: str) -> int | None:
        """What the runtime was asked for (CRI), in logical units; None when not set."""
        c = self.container
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

    def annotation_json(self, key: str) -> Any:
        raw = self.pod.annotations.get(key)
        return None if raw is None else annotation_json(key, raw)


def annotation_json(key: str, raw: str) -> Any:
    if len(raw) > MAX_ANNOTATION:
        raise InvalidInput(key, f"longer than {MAX_ANNOTATION} bytes")
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InvalidInput(key, f"not valid JSON ({exc.msg})") from exc
    except RecursionError as exc:
        raise InvalidInput(key, "JSON nested too deeply") from exc


@dataclass
class Intent:
    """Desired values for one container or pod, by logical resource (v1 names), with reasons."""

    values: dict[str, int | str] = field(default_factory=dict)
    why: dict[str, str] = field(default_factory=dict)
    rdt_class: str | None = None

    def set(self, resource: str, value: int | str, why: str) -> None:
        self.values[resource] = value
        self.why[resource] = why

    def get(self, resource: str) -> int | str | None:
        return self.values.get(resource)
