"""The node's CPUs as features see them: which belong to whom. LSE/LSR containers hold
exclusive sets (handed out when the node model takes a container in, never while computing
values); everyone else shares the rest, the share pool."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from nriplugin.kernel.cpulist import format_cpulist
from nriplugin.kernel.probe import Topology


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
