"""The QoS manager's collection: one full round (:meth:`Collector.sample`, every syncPeriod)
and a cheap fast path (:meth:`Collector.fast`, every 30 ms between rounds).

Only containers the node model knows and has seen running are read — never a CREATED one,
whose cgroup runc may still be building — and only those with a QoS class the manager acts
on (SYSTEM and unknown pods are skipped, and cost nothing). Counters are turned into rates
over the interval; per-container readings are kept only for keys the model still has, so
memory stays flat under churn.

A round is a few sysfs reads per container, and one per LS pod whose group has a CPU quota
(its throttling: the pod as a whole is throttled there). The agent's loop drives it with
:meth:`Collector.sample_async`, which gives the event loop back at the end of every turn
(``pacing/turns.py``), so that an NRI hook never waits behind a whole round on a node with thousands
of containers; :meth:`Collector.sample` runs the same steps in one go (tests, tools).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple, Protocol

from nriplugin.features import batch
from nriplugin.intent.core import InvalidInput, requested
from nriplugin.kernel import paths
from nriplugin.kernel.cgroup import CFS_PERIOD_US, Cgroups, cfs_period
from nriplugin.kernel.stats import CpuStat, MemInfo, ProcCpu, Psi, Stats
from nriplugin.kernel.tick import Tick
from nriplugin.node.model import Record, State, pod_key
from nriplugin.nri import api_pb2 as api
from nriplugin.pacing.turns import Pacer
from nriplugin.policy.qos import QoSClass
from nriplugin.qos.history import Counters
from nriplugin.qos.sample import ClassUsage, FastSample, NodeSample, Pressure

GROUPS_KEY = "groups:"  # the counters of QoS-level groups, next to the containers'
LS_CLASSES = frozenset({QoSClass.LSE, QoSClass.LSR, QoSClass.LS})
MEMORY_EVERY = 5  # rounds between reads of a known container's memory files
ABSENT_MAX_WAIT = 64  # rounds at most between looks for a container's missing cgroup


class Containers(Protocol):
    """What collection needs of the node model."""

    revision: int

    def records(self) -> list[Record]: ...


class Classes(Protocol):
    """What collection needs of the desired state."""

    def qos_of(self, key: str) -> QoSClass | None: ...


@dataclass(frozen=True, slots=True)
class ContainerUsage:
    """One container in the last round (for strategies that pick containers, e.g. eviction)."""

    qos: QoSClass
    pod_id: str
    cpu_cores: float
    memory_bytes: int
    rss_bytes: int
    limit_cores: float | None = None  # requested quota / period; None: unlimited
    # The share of its periods over the last interval in which its CPU was throttled, at its own
    # quota or at its pod's, whichever is higher: kubelet gives a pod whose containers all have
    # limits a quota of their sum, and a pod whose tasks spend it is throttled as a whole while
    # each container's own cpu.stat counts nothing. A container that ran no period of its own
    # (its first reading, or idle) was not throttled: 0.
    throttled_ratio: float = 0.0
    stall_ratio: float | None = None  # share of it with a task waiting for a CPU (v2, LS only)
    # Its pod's group's own throttled periods / periods over the interval (0.0 when the pod has
    # no quota, or on the pod's first reading); LS containers with a quota only.
    pod_throttled_ratio: float = 0.0
    # Its pod's quota / period as read from the pod's group (None: the pod has no quota, or the
    # container is not LS with a quota): raising the container's quota above it does nothing
    # (v1 refuses it outright), the pod's must be raised too.
    pod_limit_cores: float | None = None


class _Facts(NamedTuple):
    """What a round needs of a container that only changes with the node model."""

    qos: QoSClass
    group: str | None
    throttling: bool  # LS with a quota: the only ones whose throttling matters (bursts)
    limit: float | None  # cores; None: unlimited
    request: float  # cores


def batch_cpu_request(pod: api.PodSandbox, c: api.Container) -> float | None:
    """A BE container's ``kubernetes.io/batch-cpu`` request in cores (None: none, or an
    annotation that cannot be used). A pod sized by Koordinator's batch resources asks kubelet
    for no CPU, so the runtime's request is kubelet's minimum shares; this is what it was
    scheduled with, and what the batch feature gave it shares for. Parsed by the batch
    feature's own parser (cached per annotation text: pods of one workload share it)."""
    raw = pod.annotations.get(batch.ANNOTATION)
    if raw is None:
        return None
    parsed = batch._parse(raw)
    if isinstance(parsed, InvalidInput):
        return None
    found = parsed.get(c.name)
    milli = None if found is None else found[0].get(batch.BATCH_CPU)
    return None if milli is None else milli / 1000


def _facts(qos: QoSClass, r: Record) -> _Facts:
    c = r.container
    quota = requested(c, "cpu.cfs_quota_us")
    limited = bool(quota and quota > 0)
    limit = quota / (requested(c, "cpu.cfs_period_us") or CFS_PERIOD_US) if quota and limited else None
    request = batch_cpu_request(r.pod, c) if qos is QoSClass.BE and c is not None else None
    if request is None:
        request = (requested(c, "cpu.shares") or 0) / 1024
    return _Facts(qos, r.group, qos in LS_CLASSES and limited, limit, request)


class _PodQuota(NamedTuple):
    """A pod's CFS quota as read from its group, with what it was read for."""

    shape: tuple[float, ...]  # its LS containers' limits when read: a resize reads it again
    group: str | None
    limit: float | None  # cores; None: no quota (its cpu.stat is not read)


def _pod_group(pod: api.PodSandbox) -> str | None:
    try:
        return paths.pod_dir(pod.linux.cgroup_parent)
    except paths.BadCgroupPath:
        return None


class _Acc:
    __slots__ = (
        "containers",
        "cpu",
        "limit",
        "mem",
        "periods",
        "request",
        "rss",
        "stall",
        "stalls",
        "throttled",
        "unlimited",
    )

    def __init__(self) -> None:
        self.containers = 0
        self.cpu = self.request = self.limit = self.stall = 0.0
        self.unlimited = False
        self.periods = self.mem = self.rss = self.stalls = 0
        self.throttled = 0.0  # periods, a container's weighted by its pod's ratio where higher

    def add(self, f: _Facts) -> None:
        self.containers += 1
        self.request += f.request
        if f.limit is None:
            self.unlimited = True
        else:
            self.limit += f.limit

    def usage(self) -> ClassUsage:
        return ClassUsage(
            containers=self.containers,
            cpu_cores=self.cpu,
            cpu_request_cores=self.request,
            cpu_limit_cores=None if self.unlimited else self.limit,
            throttled_ratio=self.throttled / self.periods if self.periods else 0.0,
            stall_ratio=self.stall / self.stalls if self.stalls else None,
            memory_bytes=self.mem,
            rss_bytes=self.rss,
        )


class _Round:
    """One round's sums as its containers are read: per class, and per container.

    Pod-level throttling comes in after the containers (:meth:`pod_throttled`), once per pod:
    each LS container with a quota counts its own periods, as throttled in the share that its
    own ratio or its pod's gives, whichever is higher. A pod's periods and throttled periods
    are never added beside its containers' (the same time counted twice, nested), nor once
    per container (its throttling multiplied by its containers): a pod alone in its class
    shows its own ratio, whatever the number of its containers."""

    __slots__ = ("acc", "by_container", "groups", "limited", "ls_growth", "ls_pods", "seen", "unlimited")

    def __init__(self) -> None:
        self.acc: dict[QoSClass, _Acc] = {}
        self.seen: set[str] = set()  # keys whose counters stay
        self.groups: set[str] = set()  # cgroups whose files stay open
        self.ls_growth = 0  # RSS growth of LS containers measured in the last round too
        self.by_container: dict[str, ContainerUsage] = {}
        # pod id -> its LS containers with a quota read this round: (key, class sums, periods,
        # throttled periods)
        self.limited: dict[str, list[tuple[str, _Acc, int, int]]] = {}
        # pod id -> the pod and its running LS containers' limits (a shape: see _PodQuota)
        self.ls_pods: dict[str, tuple[api.PodSandbox, list[float]]] = {}
        self.unlimited: set[str] = set()  # pods with an LS container without a quota

    def _of(self, f: _Facts) -> _Acc:
        a = self.acc.get(f.qos)
        if a is None:
            a = self.acc[f.qos] = _Acc()
        a.add(f)
        return a

    def ls(self, pod: api.PodSandbox, limit: float | None) -> None:
        """An LS container of ``pod`` running this round (read or not): kubelet gives the pod
        a quota only when every container has a limit."""
        if limit is None:
            self.unlimited.add(pod.id)
        else:
            self.ls_pods.setdefault(pod.id, (pod, []))[1].append(limit)

    def read(self, key: str, f: _Facts, u: ContainerUsage, periods: int, throttled: int) -> None:
        """A container read this round."""
        a = self._of(f)
        a.cpu += u.cpu_cores
        a.periods += periods
        a.throttled += throttled
        if f.throttling:
            self.limited.setdefault(u.pod_id, []).append((key, a, periods, throttled))
        if u.stall_ratio is not None:
            a.stall += u.stall_ratio
            a.stalls += 1
        a.mem += u.memory_bytes
        a.rss += u.rss_bytes
        self.by_container[key] = u

    def pod_throttled(self, pod_id: str, ratio: float, limit: float) -> None:
        """The pod's own throttled ratio over the interval and its quota (cores), into its
        limited containers read this round and their classes' sums."""
        for key, a, periods, throttled in self.limited.get(pod_id, ()):
            u = self.by_container[key]
            own = u.throttled_ratio
            ratio_c = max(own, ratio) if periods else own
            a.throttled += periods * ratio_c - throttled
            self.by_container[key] = replace(
                u, throttled_ratio=ratio_c, pod_throttled_ratio=ratio, pod_limit_cores=limit
            )

    def carried(self, key: str, f: _Facts, before: ContainerUsage) -> None:
        """A container not read this round: its last memory counts, its CPU is its group's."""
        a = self._of(f)
        a.mem += before.memory_bytes
        a.rss += before.rss_bytes
        self.by_container[key] = before

    def by_class(self) -> dict[str, ClassUsage]:
        return {q.value: a.usage() for q, a in self.acc.items()}


class _Node(NamedTuple):
    """A round's node-wide readings, as differences from the last round's where they count."""

    busy: float
    psi_cpu: Pressure
    psi_memory: Pressure
    pgscan_direct: int
    pgscan_kswapd: int
    mem: MemInfo | None


def busy_cores(prev: ProcCpu | None, now: ProcCpu | None) -> float:
    """Node CPU in cores between two /proc/stat readings: the busy share of the ticks that
    passed, times the online CPUs (the kernel's ticks are the clock, so a late wake-up does not
    skew it). Steal counts as busy: CPU the hypervisor takes is not there for BE either."""
    if prev is None or now is None:
        return 0.0
    total = now.total - prev.total
    busy = now.busy - prev.busy
    if total <= 0 or busy < 0:
        return 0.0
    return min(busy / total, 1.0) * now.ncpu


def _pressure(prev: Psi | None, now: Psi | None) -> Pressure:
    if now is None:
        return Pressure()
    if prev is None:
        return Pressure(now.some.avg10, now.full.avg10)
    return Pressure(
        now.some.avg10,
        now.full.avg10,
        max(0, now.some.total_us - prev.some.total_us),
        max(0, now.full.total_us - prev.full.total_us),
    )


def _run(steps: Generator[None, None, NodeSample]) -> NodeSample:
    """Run a round's steps in one go."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


def summed(read: Callable[[str], float | None], groups: Sequence[str]) -> float | None:
    """The CPU ``groups`` used so far, together, each as ``read`` gives it (None: none, or one
    unreadable)."""
    if not groups:
        return None
    total = 0.0
    for g in groups:
        v = read(g)
        if v is None:
            return None
        total += v
    return total


class Collector:
    """Measures the node and the QoS classes of the containers ``model`` knows.

    The first :meth:`sample` after start has interval 0 and zero deltas (CPU, throttling, PSI
    stalls, page scans): there is nothing to take a difference from yet. Levels (memory, load,
    PSI averages) are filled from the first round. A container seen for the first time also
    contributes zero CPU in that round. The same holds for the first :meth:`fast`. A memory
    read that fails while CPU could be read (the group going away mid-round) counts the
    container's last known memory.
    """

    def __init__(
        self,
        model: Containers,
        desired: Classes,
        cgroups: Cgroups,
        proc_root: Path = Path("/proc"),
        *,
        clock: Callable[[], float] = time.monotonic,
        max_open: int | None = None,
        memory_every: int = MEMORY_EVERY,
        pacer: Pacer | None = None,
        tick: Tick | None = None,
    ) -> None:
        """``pacer``: the loop shared with the hooks (the agent's): :meth:`sample_async` gives
        it back between turns; default: turns measured in time alone. ``tick``: the scheduler's
        (kernel/tick.py), which the fast samples are timed to and measured between; None: read
        when woken, timed by the clock alone."""
        self.tick = tick
        self.pacer = Pacer() if pacer is None else pacer
        self.model = model
        self.desired = desired
        self.stats = Stats(cgroups, proc_root, max_open)  # max_open: files kept open (None: by RLIMIT_NOFILE)
        self.clock = clock
        self.by_container: dict[str, ContainerUsage] = {}  # the last round's, rebuilt each round
        self.ncpu = os.cpu_count() or 1
        self._counters = Counters()
        self._rounds = -1  # the first round reads everything
        self.memory_every = max(1, memory_every)
        self._t: float | None = None
        self._cpu: ProcCpu | None = None
        self._psi: dict[str, Psi | None] = {"cpu": None, "memory": None}
        self._pgscan: tuple[int, int] | None = None
        self._ls_rss_held: float | None = None
        self._fast_t: float | None = None
        self._fast_cpu: ProcCpu | None = None
        self._fast_stall: int | None = None
        self._facts: dict[str, _Facts | None] = {}  # None: not collected (SYSTEM, unknown class)
        # Containers whose cgroup could not be read: key -> (the round to look again, the wait
        # after that). A running container's group is there; one that is not (its removal on the
        # way, a path that does not resolve) is not looked for every round (a failed lookup
        # walks the path and opens nothing: on a node of thousands, the bulk of a round).
        self._absent: dict[str, tuple[int, int]] = {}
        self._absent_rev = -1
        self._facts_rev = -1
        self._group_key = ""  # the counter of the BE groups read by the last round
        self._pod_quotas: dict[str, _PodQuota] = {}  # pod id -> its quota, for the pods of the last round

    # the full round -----------------------------------------------------------------------------

    def sample(self, be_groups: Sequence[str] = (), ls_waits: bool = True) -> NodeSample:
        """One round, in one go. With ``be_groups`` (the QoS-level groups that hold BE pods)
        BE's CPU is their counters' (a pod that just started counts at once), and BE
        containers' own CPU is read only with their memory (every ``memory_every`` rounds:
        what eviction ranks by): half the reads of a round where half the containers are BE.
        ``ls_waits``: also LS containers' waits for a CPU (on cgroup v1 every LS task's
        run-queue delay: a file per task), only when a strategy will use them."""
        return _run(self._sample(be_groups, ls_waits))

    async def sample_async(self, be_groups: Sequence[str] = (), ls_waits: bool = True) -> NodeSample:
        """:meth:`sample`, giving the event loop back between turns. Its ``collect_seconds``
        is the reading's own time, not the waits between turns."""
        steps = self._sample(be_groups, ls_waits)
        paused = 0.0  # time spent at yields (other callbacks' turn)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                sample: NodeSample = done.value
                return replace(sample, collect_seconds=sample.collect_seconds - paused)
            left = time.perf_counter()
            await self.pacer.give_way()
            paused += time.perf_counter() - left

    def _sample(self, be_groups: Sequence[str], ls_waits: bool = True) -> Generator[None, None, NodeSample]:
        """A round's steps: a yield at the end of each turn; the sample is the return value."""
        started = time.perf_counter()
        self._rounds += 1
        t = self.clock()
        interval = 0.0 if self._t is None else max(0.0, t - self._t)
        self._t = t
        node = self._node()
        be_group = self._group_cores(t, be_groups) if be_groups else None
        memory_read = self._rounds % self.memory_every == 0
        by_class, ls_growth = yield from self._classes(t, be_group is not None, memory_read, ls_waits)
        if be_group is not None and QoSClass.BE.value in by_class:
            by_class[QoSClass.BE.value] = replace(by_class[QoSClass.BE.value], cpu_cores=be_group[0])
        if self._ls_rss_held is None:
            self._ls_rss_held = float(sum(u.rss_bytes for q, u in by_class.items() if q in LS_CLASSES))
        else:
            self._ls_rss_held += ls_growth
        mem = node.mem
        return NodeSample(
            t=t,
            interval=interval,
            ncpu=self.ncpu,
            cpu_busy_cores=node.busy,
            load1=self.stats.load1() or 0.0,
            psi_cpu=node.psi_cpu,
            psi_memory=node.psi_memory,
            mem_total=mem.total if mem else 0,
            mem_available=mem.available if mem else 0,
            swap_total=mem.swap_total if mem else 0,
            swap_free=mem.swap_free if mem else 0,
            pgscan_direct=node.pgscan_direct,
            pgscan_kswapd=node.pgscan_kswapd,
            by_class=by_class,
            collect_seconds=time.perf_counter() - started,
            be_cpu_seconds=None if be_group is None else be_group[1],
            memory_read=memory_read,
            ls_rss_held=self._ls_rss_held,
        )

    def _node(self) -> _Node:
        """Node CPU, PSI (cpu and memory), page scans and memory: a few reads of /proc."""
        s = self.stats
        proc = s.proc_cpu()
        busy = busy_cores(self._cpu, proc)
        if proc is not None:
            self._cpu, self.ncpu = proc, proc.ncpu
        psi = {}
        for res in ("cpu", "memory"):
            now = s.node_pressure(res)
            psi[res] = _pressure(self._psi[res], now)
            if now is not None:
                self._psi[res] = now
        scans = s.pgscan()
        direct = kswapd = 0
        if scans is not None:
            if self._pgscan is not None:
                direct = max(0, scans[0] - self._pgscan[0])
                kswapd = max(0, scans[1] - self._pgscan[1])
            self._pgscan = scans
        return _Node(busy, psi["cpu"], psi["memory"], direct, kswapd, s.meminfo())

    def _group_cores(self, t: float, groups: Sequence[str]) -> tuple[float, float] | None:
        """The cores used by ``groups`` together since the last round (0.0 the first time) and
        their CPU seconds so far; None when one cannot be read (then BE's containers are read
        one by one)."""
        total = 0
        for g in groups:
            cpu = self.stats.cpu(g, throttling=False)
            if cpu is None:
                return None
            total += cpu.usage_ns
        self._group_key = GROUPS_KEY + ",".join(groups)
        d = self._counters.advance(self._group_key, t, (total,))
        return 0.0 if d is None else d[1][0] / 1e9 / d[0], total / 1e9

    def _classes(
        self, t: float, be_from_groups: bool, memory_read: bool, ls_waits: bool = True
    ) -> Generator[None, None, tuple[dict[str, ClassUsage], int]]:
        """Per-class sums, and the RSS growth of LS containers measured in the last round too;
        a step (yield) at the end of each turn. ``be_from_groups``: BE's CPU comes from its
        groups; its containers' only with their memory. ``memory_read``: every container's
        memory is read this round (else only a new one's). The containers are the
        model's at the start: one that comes between steps is read next round, one that
        leaves is skipped (its group is gone) and dropped with the next revision. The copy taken
        at the start is of the records alone: a copy of (key, record) pairs holds the loop in
        one piece for a large node, and costs several times this one."""
        rnd = _Round()
        if self.model.revision != self._facts_rev:  # a container came, went or changed
            self._facts.clear()
            self._facts_rev = self.model.revision
        turn = self.pacer.turn()
        for r in self.model.records():
            if r.container is None:
                continue
            if turn.over():
                yield
                turn.restart()
            self._container(rnd, t, r.container.id, r, be_from_groups, memory_read, ls_waits)
        quotas: dict[str, _PodQuota] = {}
        for pod, limits in rnd.ls_pods.values():
            if turn.over():
                yield
                turn.restart()
            self._pod(rnd, t, pod, limits, quotas)
        self._pod_quotas = quotas
        self._forget(rnd)
        self.by_container = rnd.by_container
        return rnd.by_class(), rnd.ls_growth

    def _container(
        self, rnd: _Round, t: float, key: str, r: Record, be_from_groups: bool, memory_read: bool, ls_waits: bool = True
    ) -> None:
        """One container into the round: skipped when not running (CREATED: runc may still be
        building its cgroup), not collected, or its cgroup missing (looked for again after a
        wait that doubles); a BE container between its memory reads carries its last; any
        other is read."""
        if r.state is not State.RUNNING:
            return
        if key in self._facts:
            f = self._facts[key]
        else:
            qos = self.desired.qos_of(key)
            f = self._facts[key] = None if qos is None or qos is QoSClass.SYSTEM else _facts(qos, r)
        if f is None:
            return
        if f.qos in LS_CLASSES:
            rnd.ls(r.pod, f.limit)
        rnd.seen.add(key)  # its counters stay even if this round's read fails
        group = f.group
        if group is None:
            return  # no usable path
        absent = self._absent.get(key)
        if absent is not None and self._rounds < absent[0]:
            return
        rnd.groups.add(group)
        before = self.by_container.get(key)
        full = before is None or memory_read
        if be_from_groups and f.qos is QoSClass.BE and before is not None and not full:
            rnd.carried(key, f, before)  # read again with its memory
            return
        cpu = self.stats.cpu(group, throttling=f.throttling, waiting=ls_waits and f.qos in LS_CLASSES)
        if cpu is None:  # the cgroup is gone (a removal on its way), or not there
            wait = min(ABSENT_MAX_WAIT, 2 * absent[1]) if absent is not None else 1
            self._absent[key] = (self._rounds + wait, wait)
            return
        if absent is not None:
            del self._absent[key]
        cores, throttled_ratio, periods, throttled, stall = self._rates(t, key, cpu)
        used, rss = self._memory(rnd, f, group, before, full)
        usage = ContainerUsage(f.qos, r.pod.id, cores, used, rss, f.limit, throttled_ratio, stall)
        rnd.read(key, f, usage, periods, throttled)

    def _pod(
        self, rnd: _Round, t: float, pod: api.PodSandbox, limits: list[float], quotas: dict[str, _PodQuota]
    ) -> None:
        """An LS pod's own throttling, into its limited containers read this round: its
        ``cpu.stat``, once per round, when its group has a quota. Not looked at when one of
        its containers has no limit (kubelet then gives the pod none) or none was read. Its
        quota is read when the pod is first seen and again when its containers' limits change
        (a resize), so a pod whose group has none costs nothing more after that."""
        if pod.id in rnd.unlimited or pod.id not in rnd.limited:
            return
        shape = tuple(sorted(limits))
        q = self._pod_quotas.get(pod.id)
        if q is None or q.shape != shape:
            group = _pod_group(pod)
            q = _PodQuota(shape, group, None if group is None else self._quota(group))
        quotas[pod.id] = q
        if q.group is None or q.limit is None:
            return
        key = pod_key(pod.id)
        rnd.seen.add(key)
        rnd.groups.add(q.group)
        cpu = self.stats.cpu(q.group)
        d = None if cpu is None else self._counters.advance(key, t, (cpu.nr_periods, cpu.nr_throttled))
        periods, throttled = (0, 0) if d is None else d[1]
        rnd.pod_throttled(pod.id, throttled / periods if periods > 0 else 0.0, q.limit)

    def _quota(self, group: str) -> float | None:
        """A group's CFS quota / period in cores (None: no quota, or it cannot be read)."""
        cg = self.stats.cgroups
        try:
            quota = cg.read(group, "cpu.cfs_quota_us")
            if not isinstance(quota, int) or quota <= 0:
                return None
            period = cg.read(group, "cpu.cfs_period_us")
        except (OSError, ValueError):
            return None
        return quota / cfs_period(period)

    def _rates(self, t: float, key: str, cpu: CpuStat) -> tuple[float, float, int, int, float | None]:
        """A container's cores and throttled ratio since its last reading (zeros the first time),
        with the periods and throttled periods behind the ratio, and the share of the time it
        had a task waiting for a CPU (None when its pressure was not read)."""
        waited_us = cpu.waiting_us
        d = self._counters.advance(key, t, (cpu.usage_ns, cpu.nr_periods, cpu.nr_throttled, waited_us or 0))
        if d is None:
            return 0.0, 0.0, 0, 0, None if waited_us is None else 0.0
        secs, (used_ns, periods, throttled, waited) = d
        stall = None if waited_us is None else min(1.0, waited / 1e6 / secs)
        return used_ns / 1e9 / secs, throttled / periods if periods > 0 else 0.0, periods, throttled, stall

    def _memory(self, rnd: _Round, f: _Facts, group: str, before: ContainerUsage | None, full: bool) -> tuple[int, int]:
        """A container's memory in use (without page cache) and RSS. Memory moves on a scale of
        minutes (its trends are per minute): it is read when ``full`` (every memory_every
        rounds, and for a container seen for the first time), else the last reading stands."""
        mem = self.stats.memory(group) if full else None
        if mem is not None:
            if before is not None and f.qos in LS_CLASSES:
                rnd.ls_growth += mem.rss - before.rss_bytes
            return max(0, mem.usage - mem.cache), mem.rss
        if before is not None:  # a failed read (or none due): the last known, not a fake drop
            return before.memory_bytes, before.rss_bytes
        return 0, 0

    def _forget(self, rnd: _Round) -> None:
        """Drop what the round did not see: leavers' counters, open files and absent entries."""
        if self._group_key:
            rnd.seen.add(self._group_key)  # the BE groups' counter stays too
        if self._counters.retain(rnd.seen):
            # close a leaver's files
            self.stats.retain(rnd.groups | set(self._group_key[len(GROUPS_KEY) :].split(",")))
        if self._absent and self._absent_rev != self._facts_rev:  # a container left: its entry too
            self._absent = {k: v for k, v in self._absent.items() if k in rnd.seen}
            self._absent_rev = self._facts_rev

    @property
    def tracked(self) -> int:
        """How many counters are kept (containers, LS pods with a quota, and BE's groups
        together): follows the node model, not its history."""
        return len(self._counters)

    def group_cpu_seconds(self, group: str) -> float | None:
        """CPU used so far by a QoS-level group (e.g. BE's): one counter read, for the fast path."""
        cpu = self.stats.cpu(group)
        return None if cpu is None else cpu.usage_ns / 1e9

    def pressure_path(self, group: str) -> str | None:
        """A group's ``cpu.pressure`` (cgroup v2, or a v1 host's unified hierarchy beside it;
        None on a v1 host without one: v1 has no per-group PSI)."""
        try:
            return self.stats.cgroups.pressure_file(group)
        except OSError:
            return None

    def stall_us(self, files: Iterable[str]) -> int | None:
        """How long these groups had a task waiting for a CPU, summed (µs; the fast path)."""
        return self.stats.stall_us(files)

    def close(self) -> None:
        """Close the counter files kept open between rounds."""
        self.stats.close()

    # the fast path ------------------------------------------------------------------------------

    def fast(self, sums: Sequence[Sequence[str]] = ()) -> FastSample:
        """Node CPU, the PSI cpu ``some`` stall total and the CPU each of ``sums`` (sets of
        QoS-level groups, e.g. BE's) has used so far: a few reads of /proc and one counter per
        group. With the tick known, the sample is timed at the tick before its reads, all of
        which fall between two ticks (read again, once, if one fell inside them)."""
        for _ in range(2):
            read = self.clock()
            proc = self.stats.proc_cpu()
            stall = self.stats.node_cpu_stall_us()
            seconds = tuple(self._sum(groups) for groups in sums)
            if self.tick is None:
                t = read
                break
            t = self.tick.last(read)
            if self.tick.last(self.clock()) == t:
                break
        interval = 0.0 if self._fast_t is None else max(0.0, t - self._fast_t)
        self._fast_t = t
        busy = busy_cores(self._fast_cpu, proc)
        if proc is not None:
            self._fast_cpu = proc
        delta = 0
        if stall is not None:
            if self._fast_stall is not None:
                delta = max(0, stall - self._fast_stall)
            self._fast_stall = stall
        return FastSample(t, interval, busy, delta, seconds)

    def _sum(self, groups: Sequence[str]) -> float | None:
        return summed(self.group_cpu_seconds, groups)

    def wake(self, wait: float) -> float:
        """Seconds until the next fast sample, ``wait`` after the last: past the tick at or
        before that, when the tick is known."""
        if self.tick is None or self._fast_t is None:
            return wait
        return self.tick.wake(self.clock(), self._fast_t, wait)
