"""CPUSet pools from the node's real topology: LSE/LSR containers get exclusive whole cores
(SMT siblings together, one NUMA node where it fits), everyone else shares the rest.

Exclusive cores come from Koordinator's scheduler decision in
``scheduling.koordinator.sh/resource-status`` ({"cpuset": "2-3"}) when present, else from the
local allocator sized by the container's CFS quota (limit == request for these classes). Only
pods labelled LSE/LSR explicitly are pinned: a Guaranteed pod without the label is left to
kubelet's CPU manager rather than fought over.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..kernel.probe import Topology, format_cpulist, parse_cpulist
from ..nri import api_pb2 as api
from ..policy.qos import QOS_LABEL
from .base import Context, Intent, InvalidInput

RESOURCE_STATUS = "scheduling.koordinator.sh/resource-status"


class NoCapacity(Exception):
    pass


@dataclass
class CPUAllocator:
    """Which CPUs belong to whom. Exclusive sets never overlap; the share pool is the rest."""

    topo: Topology
    reserved: set[int] = field(default_factory=set)  # kept for the system, never handed out
    exclusive: dict[str, frozenset[int]] = field(default_factory=dict)  # owner (container id) -> cpus
    generation: int = 0  # bumped whenever the exclusive sets change (the share pool with them)
    # owner -> how its assignment went: why it is pinned, or why it could not be (then it shares)
    notes: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.online = frozenset(self.topo.online)
        # Physical cores as sibling groups, in a stable order.
        cores: dict[tuple[int, ...], None] = {}
        for c in sorted(self.online):
            cores[tuple(sorted(set(self.topo.siblings.get(c, [c])) & self.online))] = None
        self.cores = list(cores)

    def taken(self) -> set[int]:
        return set().union(*self.exclusive.values())

    def share_pool(self) -> frozenset[int]:
        pool = self.online - self.taken() - self.reserved
        return pool if pool else self.online - self.reserved  # never leave sharers with nothing

    def claim(self, owner: str, cpus: set[int]) -> frozenset[int]:
        have = self.exclusive.get(owner)
        if have is not None:
            return have
        if not cpus or not cpus <= self.online:
            raise NoCapacity(f"cpus {format_cpulist(cpus)} are not all online ({format_cpulist(self.online)})")
        clash = cpus & (self.taken() | self.reserved)
        if clash:
            raise NoCapacity(f"cpus {format_cpulist(clash)} are already exclusive to another container")
        self.exclusive[owner] = frozenset(cpus)
        self.generation += 1
        return self.exclusive[owner]

    def allocate(self, owner: str, ncpus: int) -> frozenset[int]:
        """Whole free cores, from one NUMA node if possible, else the fewest nodes."""
        have = self.exclusive.get(owner)
        if have is not None:
            return have
        busy = self.taken() | self.reserved
        free = [core for core in self.cores if not set(core) & busy]
        per = max(1, max((len(c) for c in self.cores), default=1))
        need = math.ceil(ncpus / per)
        if need > len(free) - 1:  # at least one core stays in the share pool
            raise NoCapacity(
                f"needs {need} whole core(s) for {ncpus} CPU(s); {len(free)} of {len(self.cores)} core(s) are free "
                "and one must stay in the share pool"
            )
        by_node: dict[int, list[tuple[int, ...]]] = {}
        for core in free:
            by_node.setdefault(self.topo.numa.get(core[0], 0), []).append(core)
        fits = [n for n, cs in sorted(by_node.items()) if len(cs) >= need]
        if fits:
            # the node with the fewest free cores that still fits: keeps big holes for big asks
            node = min(fits, key=lambda n: (len(by_node[n]), n))
            chosen = by_node[node][:need]
        else:
            chosen = [c for n in sorted(by_node, key=lambda n: -len(by_node[n])) for c in by_node[n]][:need]
        self.exclusive[owner] = frozenset(c for core in chosen for c in core)
        self.generation += 1
        return self.exclusive[owner]

    def shared_subset(self, ncpus: int) -> frozenset[int]:
        """``ncpus`` CPUs of the share pool for best-effort work squeezed by the cpuset policy:
        whole cores (SMT siblings together, so BE never shares a core with LS on the other
        thread), from the highest-numbered core down. The same count always gives the same
        CPUs, and a larger count a superset, so a changing limit moves as few CPUs as it can."""
        pool = self.share_pool()
        out: set[int] = set()
        for core in reversed(self.cores):
            if len(out) >= ncpus:
                break
            mine = set(core) & pool
            out |= mine
        return frozenset(out) if out else pool

    def release(self, owner: str) -> bool:
        self.notes.pop(owner, None)
        if self.exclusive.pop(owner, None) is None:
            return False
        self.generation += 1
        return True


def scheduled_cpus(ctx: Context) -> set[int] | None:
    status = ctx.annotation_json(RESOURCE_STATUS)
    if status is None:
        return None
    if not isinstance(status, dict):
        raise InvalidInput(RESOURCE_STATUS, "expected a JSON object")
    raw = status.get("cpuset")
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise InvalidInput(RESOURCE_STATUS, "cpuset must be a cpu list string")
    try:
        return set(parse_cpulist(raw))
    except ValueError as exc:
        raise InvalidInput(RESOURCE_STATUS, f"cpuset {raw[:40]!r}: {exc}") from exc


def candidate(pod: api.PodSandbox) -> bool:
    """Only pods labelled LSE/LSR are pinned (see the module's docstring)."""
    return pod.labels.get(QOS_LABEL) in ("LSE", "LSR")


def assign(ctx: Context) -> str | None:
    """The allocation step, taken once when a container becomes known (CreateContainer,
    Synchronize, the inventory), never while computing desired state: pin an LSE/LSR container
    to exclusive cores. Returns None when pinned or not a candidate, else the capacity
    shortfall (the container then runs in the share pool, never on someone's exclusive core).
    A malformed scheduling annotation raises InvalidInput (it, too, leaves the container in
    the share pool)."""
    alloc = ctx.cpus
    if alloc is None or ctx.container is None or not ctx.has("cpuset.cpus"):
        return None
    if not candidate(ctx.pod):
        return None
    owner = ctx.container.id
    if owner in alloc.exclusive:
        return None
    try:
        wanted = scheduled_cpus(ctx)
    except InvalidInput as exc:
        alloc.notes[owner] = f"cannot pin: {exc}"
        raise
    if wanted is not None:
        try:
            alloc.claim(owner, wanted)
        except NoCapacity as exc:  # the scheduler's decision cannot be honoured as written
            alloc.notes[owner] = f"cannot pin: {RESOURCE_STATUS}: {exc}"
            raise InvalidInput(RESOURCE_STATUS, str(exc)) from exc
        alloc.notes[owner] = f"{ctx.qos}: exclusive, as scheduled ({RESOURCE_STATUS})"
        return None
    try:
        quota, period = ctx.requested("cpu.cfs_quota_us"), ctx.requested("cpu.cfs_period_us") or 100000
        if not quota or quota <= 0:
            return None
        n = math.ceil(quota / period)
        alloc.allocate(owner, n)
        alloc.notes[owner] = f"{ctx.qos}: {n} CPUs as whole cores from the node's topology"
        return None
    except NoCapacity as exc:
        alloc.notes[owner] = f"cannot pin: {exc}"
        return str(exc)


def desired(ctx: Context, intent: Intent) -> None:
    """Reads the assignment (see :func:`assign`); allocates nothing."""
    alloc = ctx.cpus
    if alloc is None or ctx.container is None or not ctx.has("cpuset.cpus"):
        return
    owner = ctx.container.id
    cpus = alloc.exclusive.get(owner)
    note = alloc.notes.get(owner, "")
    if cpus is not None:
        intent.set("cpuset.cpus", format_cpulist(cpus), note)
        return
    if note.startswith("cannot pin: ") and ctx.policy.features.cpuset.failurePolicy == "fail-closed":
        raise InvalidInput("cpuset", note)  # fail-closed: refuse rather than run unpinned
    pool = alloc.share_pool()
    if pool != alloc.online:  # while nothing is exclusive, the runtime's default (all CPUs) is right
        why = f"{ctx.qos}: the share pool (online CPUs minus exclusive ones)"
        intent.set("cpuset.cpus", format_cpulist(pool), f"{why}; {note}" if note else why)
