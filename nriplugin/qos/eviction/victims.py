"""Which pods eviction may take, in which order, and how many.

Pure: candidates are plain facts (no model, no kernel), so worked examples are unit tests.
Only BE pods are ever candidates: LS, LSR, LSE and SYSTEM pods are never evicted by the QoS
manager, whatever their usage.

Order (what matters least to the cluster goes first, and as few pods as free enough):
- CPU: lowest priority first, then the highest CPU usage, then the newest pod;
- memory: leaking pods (growth over ``leak_bytes_per_min``, 5 MB/min by default) first, then
  lowest priority, then the most memory that eviction frees (anonymous memory: page cache is
  reclaimed without evicting anyone), then the newest.

Priority is the pod's priority where the cluster knows it, else Koordinator's
``koordinator.sh/priority`` label, else 0 (Kubernetes' default priority).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from nriplugin.policy.qos import QoSClass

PRIORITY_LABEL = "koordinator.sh/priority"
LEAK_BYTES_PER_MIN = 5 * 1024 * 1024  # a pod growing faster than 5 MB/min leaks
# A victim frees at least this share of a plan's release (or of the best candidate's share,
# when none can cover that): evicting a pod that frees (next to) nothing of what is needed
# disrupts it and relieves no one.
MIN_SHARE = 0.05


@dataclass(frozen=True, slots=True)
class Candidate:
    """One pod, as eviction sees it."""

    uid: str
    namespace: str
    name: str
    qos: QoSClass
    priority: int = 0
    cpu_cores: float = 0.0  # used over the last interval
    cpu_request_cores: float = 0.0  # requested (batch-cpu for BE pods)
    freeable_bytes: int = 0  # anonymous memory: what eviction gives back
    growth_bytes_per_min: float = 0.0
    started: float = 0.0  # when it became known (monotonic); larger is newer
    sandbox_id: str = ""  # the runtime's pod id, for the runtime backend

    @property
    def who(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Release:
    amount: float  # cores, or bytes for memory
    trigger: str
    why: str


@dataclass(frozen=True, slots=True)
class EvictionPlan:
    strategy: str
    release: Release
    victims: list[Candidate]  # ranked; the evictor takes them in order until enough is freed
    unit: str  # what ``amount`` counts: "cores" (usage), "request" (cores requested) or "bytes"
    horizon: float = 0.0  # seconds: a memory victim also counts what it would grow by within
    urgent: bool = False  # the limit is seconds away: through the runtime, no grace

    def share(self, c: Candidate) -> float:
        """What evicting ``c`` counts towards the release, in the plan's unit."""
        if self.unit == "bytes":
            return c.freeable_bytes + max(0.0, c.growth_bytes_per_min) / 60 * self.horizon
        return c.cpu_request_cores if self.unit == "request" else c.cpu_cores

    def meaningful(self, c: Candidate) -> bool:
        """Whether evicting ``c`` frees a meaningful share (``MIN_SHARE``) of the release. For
        CPU, when no candidate can cover that much (BE already cut to its floor while LS
        starves), the share is of what the best of them frees: the pods that free most still
        go, one that frees next to nothing beside them does not. Memory has no such fallback:
        a few MiB do not keep the kernel's OOM killer away."""
        share = self.share(c)
        bar = MIN_SHARE * self.release.amount
        if self.unit != "bytes":
            best = max((self.share(v) for v in self.victims), default=share)
            if max(best, share) < bar:
                bar = MIN_SHARE * max(best, share)
        return share > 0 and share >= bar

    def chosen(self) -> list[Candidate]:
        """The victims if every eviction succeeds."""
        return pick([c for c in self.victims if self.meaningful(c)], self.release.amount, self.share)


def evictable(c: Candidate) -> bool:
    """Only BE pods; never LS, LSR, LSE or SYSTEM."""
    return c.qos is QoSClass.BE


def label_priority(labels: dict[str, str] | None) -> int | None:
    """Koordinator's ``koordinator.sh/priority`` label; None when absent or not an integer
    (untrusted input: a bad value is not a priority)."""
    raw = (labels or {}).get(PRIORITY_LABEL)
    if raw is None or len(raw) > 12:
        return None
    try:
        return int(raw.strip())
    except ValueError:
        return None


def rank_cpu(cands: Iterable[Candidate]) -> list[Candidate]:
    """CPU order: lowest priority, highest usage, newest."""
    return sorted(
        (c for c in cands if evictable(c)),
        key=lambda c: (c.priority, -c.cpu_cores, -c.started, c.uid),
    )


def leaking(c: Candidate, leak_bytes_per_min: float = LEAK_BYTES_PER_MIN) -> bool:
    return c.growth_bytes_per_min > leak_bytes_per_min


def rank_memory(cands: Iterable[Candidate], leak_bytes_per_min: float = LEAK_BYTES_PER_MIN) -> list[Candidate]:
    """Memory order: leaking pods first, then lowest priority, then the most
    memory eviction frees, then newest."""
    return sorted(
        (c for c in cands if evictable(c)),
        key=lambda c: (
            not leaking(c, leak_bytes_per_min),
            c.priority,
            -c.freeable_bytes,
            -c.started,
            c.uid,
        ),
    )


def pick(ranked: Sequence[Candidate], target: float, amount: Callable[[Candidate], float]) -> list[Candidate]:
    """The first candidates, in order, whose ``amount`` adds up to ``target``: stop as
    soon as enough is freed. A candidate that frees nothing is skipped.
    Fewer than needed are returned when all of them together fall short."""
    out: list[Candidate] = []
    freed = 0.0
    for c in ranked:
        if freed >= target:
            break
        a = amount(c)
        if a <= 0:
            continue
        out.append(c)
        freed += a
    return out


def fewest(cands: Iterable[Candidate], target: float, amount: Callable[[Candidate], float]) -> int:
    """The fewest evictable pods that would free ``target`` (largest first); for judging a
    plan (the bench), never for choosing one. 0 when none are needed, -1 when all fall short."""
    if target <= 0:
        return 0
    freed = 0.0
    for n, a in enumerate(sorted((amount(c) for c in cands if evictable(c)), reverse=True), 1):
        if a <= 0:
            break
        freed += a
        if freed >= target:
            return n
    return -1


# The candidates, or a function that makes them: a strategy that does not act never asks, so a
# round on a quiet node does not walk every BE pod.
Candidates = Sequence[Candidate] | Callable[[], Sequence[Candidate]]


def listed(cands: Candidates) -> Sequence[Candidate]:
    return cands() if callable(cands) else cands
