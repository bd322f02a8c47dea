"""What the QoS manager's rounds measured, kept over time for a reader that reports usage over
windows (the NodeMetric report, ``cluster/nodemetric.py``): the node's usage, the system's
(the node's minus its pods'), and each pod's.

Fed by the manager after each round with the sample it collected anyway, so nothing here reads
the kernel. Bounded whatever the uptime: the node's series keeps at most ``max_points`` points
over the longest window asked for (thinned evenly beyond that), and each pod a fixed number of
buckets over the pods' window; a pod leaves with its last container. Percentiles are taken as
koordlet's metric cache takes them (the sorted values' ``floor(n·p)``-th, the first at least),
so a reader compares like with like.
"""

from __future__ import annotations

import bisect
import math
from array import array
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from nriplugin.nri import api_pb2 as api
from nriplugin.qos.collect import ContainerUsage
from nriplugin.qos.sample import NodeSample

MAX_POINTS = 4096  # the node's series at most (one a round: more than an hour at 1 s)
POD_BUCKETS = 10  # a pod's window in this many buckets: its average spans the window and at most a tenth more
COLD_RATIO = 0.5  # a window whose samples span less than this share of it is cold (koordlet's validateTimeRangeRatio)
PERCENTILES = (("p50", 500), ("p90", 900), ("p95", 950), ("p99", 990))  # name, per mille


@dataclass(frozen=True, slots=True)
class Usage:
    """CPU in cores, memory in bytes (without page cache)."""

    cpu_cores: float
    memory_bytes: float


@dataclass(frozen=True, slots=True)
class Spread:
    """One window's statistics of a series: its average and percentiles, each of CPU and
    memory taken apart (a p90 of CPU and a p90 of memory need not be one moment's)."""

    avg: Usage
    by_percentile: Mapping[str, Usage]  # "p50", "p90", "p95", "p99"


@dataclass(frozen=True, slots=True)
class PodWindow:
    """A pod's average usage over the pods' window, with what names it."""

    uid: str
    namespace: str
    name: str
    labels: Mapping[str, str]
    qos: str  # its QoS class (LSE, LSR, LS, BE)
    usage: Usage


class _Series:
    """The node's and the system's usage, one point a round, in columns of floats (a point
    costs five floats, not five objects): time, node CPU, node memory, system CPU, system
    memory. Times only grow, so a window is found by bisection; points that age out are
    dropped from the front in batches."""

    __slots__ = ("cols", "head")

    def __init__(self) -> None:
        self.cols = tuple(array("d") for _ in range(5))
        self.head = 0  # the first live point

    def __len__(self) -> int:
        return len(self.cols[0]) - self.head

    def last_t(self) -> float | None:
        return self.cols[0][-1] if len(self) else None

    def append(self, t: float, node: Usage, system: Usage) -> None:
        values = (t, node.cpu_cores, node.memory_bytes, system.cpu_cores, system.memory_bytes)
        for col, v in zip(self.cols, values, strict=True):
            col.append(v)

    def drop_before(self, t: float) -> None:
        times = self.cols[0]
        self.head = bisect.bisect_left(times, t, self.head)
        if self.head > 64 and self.head * 2 > len(times):
            for col in self.cols:
                del col[: self.head]
            self.head = 0

    def window(self, start: float, end: float) -> tuple[int, int]:
        """The points with ``start <= t <= end``, as a slice."""
        times = self.cols[0]
        return bisect.bisect_left(times, start, self.head), bisect.bisect_right(times, end, self.head)


@dataclass(slots=True)
class _Pod:
    uid: str
    namespace: str
    name: str
    labels: Mapping[str, str]
    qos: str
    buckets: array[float] = field(default_factory=lambda: _empty())


def _empty() -> array[float]:
    """A pod's POD_BUCKETS + 1 buckets, four values each: bucket index, CPU sum, memory sum,
    samples (a ring: the bucket of index i is at i modulo its length)."""
    return array("d", [-1.0, 0.0, 0.0, 0.0] * (POD_BUCKETS + 1))


def percentile(values: list[float], per_mille: int) -> float:
    """koordlet's percentile of ``values`` (not empty): the ``floor(n·p)``-th smallest, the
    smallest when that is below one."""
    ordered = sorted(values)
    return ordered[max(0, len(ordered) * per_mille // 1000 - 1)]


class UsageWindows:
    """The node's, the system's and the pods' usage over time (see the module's docstring)."""

    def __init__(self, *, max_points: int = MAX_POINTS) -> None:
        self.max_points = max(2, max_points)
        self.horizon = 0.0  # seconds of the node's series kept (the longest window asked for)
        self.pod_seconds = 0.0  # the pods' window
        self._width = 0.0  # a pod bucket's seconds
        self._series = _Series()
        self._pods: dict[str, _Pod] = {}  # pod sandbox id -> its buckets
        self.rounds = 0  # samples taken in

    def __len__(self) -> int:
        """Pods tracked."""
        return len(self._pods)

    @property
    def points(self) -> int:
        """Points of the node's series kept."""
        return len(self._series)

    def keep(self, horizon: float, pod_seconds: float) -> None:
        """How far back the node's series reaches, and the pods' window (their buckets start
        again when it changes: a bucket's width is a tenth of it)."""
        self.horizon = max(0.0, horizon)
        if pod_seconds != self.pod_seconds:
            self.pod_seconds = max(0.0, pod_seconds)
            self._width = self.pod_seconds / POD_BUCKETS
            for p in self._pods.values():
                p.buckets = _empty()

    # taking rounds in -------------------------------------------------------------------------

    def add(
        self,
        sample: NodeSample,
        containers: Mapping[str, ContainerUsage],
        pod_of: Callable[[str], api.PodSandbox | None],
    ) -> None:
        """One round: the node's usage from /proc, the pods' from their classes' sums (BE's CPU
        from its QoS-level groups, read every round), each pod's from its containers. The first
        round (no interval yet: every rate is zero) is not a measurement."""
        if sample.interval <= 0 or not self.horizon:
            return
        self.rounds += 1
        node = Usage(sample.cpu_busy_cores, float(max(0, sample.mem_total - sample.mem_available)))
        pods_cpu = sum(u.cpu_cores for u in sample.by_class.values())
        pods_mem = sum(u.memory_bytes for u in sample.by_class.values())
        system = Usage(max(0.0, node.cpu_cores - pods_cpu), max(0.0, node.memory_bytes - pods_mem))
        last = self._series.last_t()
        if last is None or sample.t - last >= self.horizon / self.max_points:  # else thinned out
            self._series.append(sample.t, node, system)
            self._series.drop_before(sample.t - self.horizon)
        if self._width > 0:
            self._add_pods(sample.t, containers, pod_of)

    def _add_pods(
        self, t: float, containers: Mapping[str, ContainerUsage], pod_of: Callable[[str], api.PodSandbox | None]
    ) -> None:
        sums: dict[str, list[float]] = {}
        qos: dict[str, str] = {}
        for u in containers.values():
            s = sums.get(u.pod_id)
            if s is None:
                s = sums[u.pod_id] = [0.0, 0.0]
                qos[u.pod_id] = u.qos.value
            s[0] += u.cpu_cores
            s[1] += u.memory_bytes
        index = float(math.floor(t / self._width))
        slot = 4 * (int(index) % (POD_BUCKETS + 1))
        for pod_id, (cpu, mem) in sums.items():
            p = self._pods.get(pod_id)
            if p is None:
                sandbox = pod_of(pod_id)
                if sandbox is None:
                    continue
                # its labels are the node model's (a reference: no copy per pod)
                p = self._pods[pod_id] = _Pod(sandbox.uid, sandbox.namespace, sandbox.name, sandbox.labels, qos[pod_id])
            b = p.buckets
            if b[slot] != index:
                b[slot], b[slot + 1], b[slot + 2], b[slot + 3] = index, 0.0, 0.0, 0.0
            b[slot + 1] += cpu
            b[slot + 2] += mem
            b[slot + 3] += 1
        for pod_id in [k for k in self._pods if k not in sums and pod_of(k) is None]:
            del self._pods[pod_id]  # gone from the node

    # reading ----------------------------------------------------------------------------------

    def average(self, now: float, seconds: float) -> tuple[Usage, Usage] | None:
        """The node's and the system's average usage over the last ``seconds`` (None: no
        sample in it)."""
        lo, hi = self._series.window(now - seconds, now)
        if lo >= hi:
            return None
        n = hi - lo
        _, ncpu, nmem, scpu, smem = (math.fsum(c[lo:hi]) / n for c in self._series.cols)
        return Usage(ncpu, nmem), Usage(scpu, smem)

    def spread(self, now: float, seconds: float) -> tuple[Spread, Spread] | None:
        """The node's and the system's statistics over the last ``seconds``; None while the
        window is cold (its samples span less than half of it, as koordlet judges)."""
        lo, hi = self._series.window(now - seconds, now)
        times, ncpu, nmem, scpu, smem = self._series.cols
        if lo >= hi or times[hi - 1] - times[lo] < COLD_RATIO * seconds:
            return None
        return _spread(ncpu[lo:hi].tolist(), nmem[lo:hi].tolist()), _spread(scpu[lo:hi].tolist(), smem[lo:hi].tolist())

    def pods(self, now: float) -> list[PodWindow]:
        """Each pod's average over the pods' window (at bucket granularity: the window and at
        most a bucket more), pods without a sample in it left out."""
        if self._width <= 0:
            return []
        first = math.floor(now / self._width) - POD_BUCKETS
        out = []
        for p in self._pods.values():
            b = p.buckets
            cpu = mem = n = 0.0
            for i in range(0, len(b), 4):
                if b[i] >= first:
                    cpu += b[i + 1]
                    mem += b[i + 2]
                    n += b[i + 3]
            if n:
                out.append(PodWindow(p.uid, p.namespace, p.name, p.labels, p.qos, Usage(cpu / n, mem / n)))
        return out


def _spread(cpu: list[float], mem: list[float]) -> Spread:
    n = len(cpu)
    return Spread(
        Usage(math.fsum(cpu) / n, math.fsum(mem) / n),
        {name: Usage(percentile(cpu, pm), percentile(mem, pm)) for name, pm in PERCENTILES},
    )
