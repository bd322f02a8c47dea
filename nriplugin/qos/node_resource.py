"""NodeQOSResource and SystemQOSResource (seed 004 §7.6 steps 1-2): what the node has, what
the system keeps, what LS asked for — the base every later strategy divides up."""

from __future__ import annotations

from dataclasses import dataclass

from nriplugin.qos.sample import NodeSample

LS_CLASSES = ("LSE", "LSR", "LS")


@dataclass(frozen=True, slots=True)
class Capacity:
    total: float  # online CPUs
    system_reserved: float  # kept for the system and its daemons (policy)
    ls_request: float  # what LS pods requested (cores)
    ls_usage: float  # what they use now
    be_usage: float
    non_be_usage: float  # node busy minus BE: LS, system daemons, anything not BE

    @property
    def schedulable(self) -> float:
        """The seed's "available CPU" before LS: total minus the system's share."""
        return max(0.0, self.total - self.system_reserved)

    @property
    def for_be(self) -> float:
        """The seed's ``available_cpu = total - LS request - system reserved`` (never negative)."""
        return max(0.0, self.total - self.ls_request - self.system_reserved)


def capacity(sample: NodeSample, system_reserved: float) -> Capacity:
    ls = [sample.usage(q) for q in LS_CLASSES]
    be = sample.usage("BE").cpu_cores
    return Capacity(
        total=float(sample.ncpu),
        system_reserved=min(max(0.0, system_reserved), float(sample.ncpu)),
        ls_request=sum(u.cpu_request_cores for u in ls),
        ls_usage=sum(u.cpu_cores for u in ls),
        be_usage=be,
        non_be_usage=max(0.0, sample.cpu_busy_cores - be),
    )
