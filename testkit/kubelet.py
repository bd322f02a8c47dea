"""A test-side kubelet for the cgroupfs driver: the node-allocatable, QoS-class and pod-level
cgroups kubelet makes and keeps, written the way it writes them, every write recorded.

On a real node the agent shares these groups with kubelet. Kubelet rewrites the QoS-class
groups' CPU weight on every pod change and periodically (whether or not it changed), makes each
pod's group with a pod-level quota and memory limit before the sandbox exists, and exits when a
QoS-class group refuses its write at start. A harness without that second writer cannot show an
agent change that breaks it, so tests lay pods out through this object and assert on
:meth:`Kubelet.writes`.

What it follows (kubernetes v1.35, ``pkg/kubelet/cm``): ``qos_container_manager_linux.go``
(``Start``, ``UpdateCgroups``, ``setCPUCgroupConfig``), ``helpers_linux.go``
(``MilliCPUToShares``, ``MilliCPUToQuota``, ``ResourceConfigForPod``),
``pod_container_manager_linux.go`` (``EnsureExists``, ``Destroy``),
``node_container_manager_linux.go`` (the node-allocatable group, no reservations),
``cgroup_manager_linux.go`` (``toResources``: on cgroup v2 kubelet turns shares into
``cpu.weight`` itself, with its linear ``getCPUWeight``), ``kuberuntime``'s
``calculateLinuxResources`` (a container's own values), and libcontainer's ``fs``/``fs2`` ``Set``
(which files, in which order; v1's ``cpu.shares`` read back; a refused period retried after the
quota). Left out: hugetlb, pids and cpuset limits, ``QOSReserved`` memory, MemoryQoS, init
containers and pod-level resources, the systemd driver.

The values from pod specs are pure functions (unit-tested against kubelet's numbers in
``tests/test_kubelet_layout.py``); :class:`Kubelet` does the I/O.
"""

from __future__ import annotations

import contextlib
import errno as errnos
import os
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

CGROUP_FS = Path("/sys/fs/cgroup")

# pkg/kubelet/cm/helpers_linux.go
MIN_SHARES, MAX_SHARES = 2, 262144
SHARES_PER_CPU, MILLI_CPU_TO_CPU = 1024, 1000
QUOTA_PERIOD, MIN_QUOTA_PERIOD = 100000, 1000
QOS_RESYNC = 60.0  # periodicQOSCgroupUpdateInterval (qos_container_manager_linux.go)

GUARANTEED, BURSTABLE, BEST_EFFORT = "Guaranteed", "Burstable", "BestEffort"
QOS_CLASSES = (GUARANTEED, BURSTABLE, BEST_EFFORT)
NODE_GROUP = "kubepods"
QOS_GROUPS = {GUARANTEED: NODE_GROUP, BURSTABLE: "kubepods/burstable", BEST_EFFORT: "kubepods/besteffort"}


# -- the values (pure) ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Resources:
    """One container's requests and limits as its spec states them: millicores and bytes, 0
    for unset. A limit without a request is the request too (the API server's defaulting)."""

    cpu_request: int = 0
    cpu_limit: int = 0
    memory_request: int = 0
    memory_limit: int = 0

    def __post_init__(self) -> None:
        if min(self.cpu_request, self.cpu_limit, self.memory_request, self.memory_limit) < 0:
            raise ValueError(f"negative resources: {self}")
        if self.cpu_limit and self.cpu_request > self.cpu_limit:
            raise ValueError(f"cpu request above its limit: {self}")
        if self.memory_limit and self.memory_request > self.memory_limit:
            raise ValueError(f"memory request above its limit: {self}")

    @property
    def cpu_requested(self) -> int:
        return self.cpu_request or self.cpu_limit

    @property
    def memory_requested(self) -> int:
        return self.memory_request or self.memory_limit


@dataclass(frozen=True)
class GroupConfig:
    """What kubelet asks libcontainer to put into one cgroup (its ``ResourceConfig``); None
    leaves that file alone."""

    cpu_shares: int | None = None
    cpu_quota: int | None = None  # -1: no limit
    cpu_period: int | None = None
    memory: int | None = None


def milli_cpu_to_shares(milli: int) -> int:
    """``MilliCPUToShares``: no request is the least weight, not the kernel's default."""
    if milli == 0:
        return MIN_SHARES
    return min(max(milli * SHARES_PER_CPU // MILLI_CPU_TO_CPU, MIN_SHARES), MAX_SHARES)


def milli_cpu_to_quota(milli: int, period: int = QUOTA_PERIOD) -> int:
    """``MilliCPUToQuota``: 0 (no quota) for no limit, never under the kernel's least quota."""
    if milli == 0:
        return 0
    return max(milli * period // MILLI_CPU_TO_CPU, MIN_QUOTA_PERIOD)


def cpu_weight(shares: int) -> int:
    """kubelet's ``getCPUWeight`` (cgroup_manager_linux.go): the linear shares -> cpu.weight
    mapping, which kubelet applies itself to the groups it writes on cgroup v2 (the OCI
    runtime's own mapping, linear or not, plays no part there)."""
    if shares >= MAX_SHARES:
        return 10000
    return 1 + (shares - MIN_SHARES) * 9999 // (MAX_SHARES - MIN_SHARES)


def qos_class(containers: Iterable[Resources]) -> str:
    """``GetPodQOS``: BestEffort with no request or limit anywhere; Guaranteed when every
    container limits CPU and memory and the pod's requests equal its limits; else Burstable."""
    requests: dict[str, int] = {}
    limits: dict[str, int] = {}
    guaranteed = True
    for c in containers:
        for name, req, lim in (
            ("cpu", c.cpu_requested, c.cpu_limit),
            ("memory", c.memory_requested, c.memory_limit),
        ):
            if req > 0:
                requests[name] = requests.get(name, 0) + req
            if lim > 0:
                limits[name] = limits.get(name, 0) + lim
        if not (c.cpu_limit and c.memory_limit):
            guaranteed = False
    if not requests and not limits:
        return BEST_EFFORT
    if guaranteed and all(limits.get(name) == q for name, q in requests.items()) and len(requests) == len(limits):
        return GUARANTEED
    return BURSTABLE


def pod_config(qos: str, containers: Iterable[Resources], enforce_cpu_limits: bool = True) -> GroupConfig:
    """``ResourceConfigForPod``: the pod group's weight from the sum of requests; a CFS quota
    (the sum of limits) only if every container has a CPU limit, a memory limit only if every
    container has one (always, for Guaranteed); BestEffort gets the least weight alone."""
    cs = list(containers)
    if qos == BEST_EFFORT:
        return GroupConfig(cpu_shares=MIN_SHARES)
    shares = milli_cpu_to_shares(sum(c.cpu_requested for c in cs))
    quota = milli_cpu_to_quota(sum(c.cpu_limit for c in cs)) if enforce_cpu_limits else -1
    memory = sum(c.memory_limit for c in cs)
    if qos == GUARANTEED:
        return GroupConfig(cpu_shares=shares, cpu_quota=quota, cpu_period=QUOTA_PERIOD, memory=memory)
    if qos != BURSTABLE:
        raise ValueError(f"unknown QoS class {qos!r}")
    cpu_declared = all(c.cpu_limit for c in cs)
    memory_declared = all(c.memory_limit for c in cs)
    return GroupConfig(
        cpu_shares=shares,
        cpu_quota=quota if cpu_declared else None,
        cpu_period=QUOTA_PERIOD if cpu_declared else None,
        memory=memory if memory_declared else None,
    )


def qos_configs(pods: Iterable[tuple[str, Iterable[Resources]]]) -> dict[str, GroupConfig]:
    """``UpdateCgroups`` (``setCPUCgroupConfig``): burstable's weight from the sum of the
    Burstable pods' CPU requests, besteffort's the least; the node group gets nothing. In the
    order written here (kubelet ranges over a Go map, so any order can happen)."""
    milli = sum(sum(c.cpu_requested for c in cs) for qos, cs in pods if qos == BURSTABLE)
    return {
        NODE_GROUP: GroupConfig(),
        QOS_GROUPS[BURSTABLE]: GroupConfig(cpu_shares=milli_cpu_to_shares(milli)),
        QOS_GROUPS[BEST_EFFORT]: GroupConfig(cpu_shares=MIN_SHARES),
    }


def qos_start_configs() -> dict[str, GroupConfig]:
    """``Start``: the two QoS-class groups made or updated, besteffort with the least weight,
    burstable with nothing (``UpdateCgroups`` follows at once)."""
    return {QOS_GROUPS[BURSTABLE]: GroupConfig(), QOS_GROUPS[BEST_EFFORT]: GroupConfig(cpu_shares=MIN_SHARES)}


def node_config(cpu_milli: int, memory: int) -> GroupConfig:
    """The node-allocatable group (``getCgroupConfig`` of the node's capacity, nothing
    reserved): weight from the node's CPUs, its memory as the limit."""
    return GroupConfig(cpu_shares=milli_cpu_to_shares(cpu_milli), memory=memory or None)


def container_resources(r: Resources) -> tuple[int, int, int, int]:
    """``calculateLinuxResources``: a container's (cpu shares, CFS quota, period, memory limit)
    in its CRI config; 0 quota and 0 memory mean no limit."""
    return milli_cpu_to_shares(r.cpu_requested), milli_cpu_to_quota(r.cpu_limit), QUOTA_PERIOD, r.memory_limit


def pod_group(qos: str, uid: str) -> str:
    """The pod's group under the cgroup root (cgroupfs driver)."""
    return f"{QOS_GROUPS[qos]}/pod{uid}"


def planned_writes(cfg: GroupConfig, version: int) -> list[tuple[str, str, str]]:
    """(controller, file, value) in the order libcontainer's ``Set`` writes them: memory before
    CPU; on v1 shares, period, quota; on v2 ``cpu.weight`` then ``cpu.max``. libcontainer
    skips a zero value (unset), as here."""
    out: list[tuple[str, str, str]] = []
    if cfg.memory:
        out.append(("memory", "memory.limit_in_bytes" if version == 1 else "memory.max", str(cfg.memory)))
    quota, period = cfg.cpu_quota or 0, cfg.cpu_period or 0
    if version == 1:
        if cfg.cpu_shares:
            out.append(("cpu", "cpu.shares", str(cfg.cpu_shares)))
        if period:
            out.append(("cpu", "cpu.cfs_period_us", str(period)))
        if quota:
            out.append(("cpu", "cpu.cfs_quota_us", str(quota)))
        return out
    if cfg.cpu_shares:
        out.append(("cpu", "cpu.weight", str(cpu_weight(cfg.cpu_shares))))
    if quota or period:
        text = str(quota) if quota > 0 else "max"
        out.append(("cpu", "cpu.max", f"{text} {period}" if period else text))
    return out


def weight_file(version: int) -> str:
    return "cpu.shares" if version == 1 else "cpu.weight"


def weight_value(shares: int, version: int) -> str:
    """What kubelet writes for ``shares`` into :func:`weight_file`."""
    return str(shares if version == 1 else cpu_weight(shares))


# -- the writes (I/O) ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Write:
    """One file kubelet wrote or tried to. ``errno``/``error``: the kernel's refusal as kubelet
    would log it; ``ignored``: a refusal kubelet goes on after (libcontainer retries a v1 period
    after the quota)."""

    group: str  # under the cgroup root: "kubepods/besteffort"
    file: str
    value: str
    cause: str  # start, restart, periodic, pod-added, pod-removed, pod-create
    at: float  # time.monotonic()
    path: Path
    errno: int | None = None
    error: str = ""
    ignored: bool = False

    @property
    def ok(self) -> bool:
        return not self.error

    def __str__(self) -> str:
        return f"{self.group}/{self.file} <- {self.value} ({self.cause}): {self.error or 'ok'}"


class KubeletExited(RuntimeError):
    """What kubelet does when it cannot update a QoS-class group at start: it exits."""


def detect_version(fs: Path = CGROUP_FS) -> int:
    return 2 if (fs / "cgroup.controllers").exists() else 1


class Kubelet:
    """kubelet's cgroup work for pods under ``/<cgroup_root>/kubepods`` (cgroupfs driver).

    :meth:`start` makes the node-allocatable and QoS-class groups (or updates them, and raises
    :class:`KubeletExited` where kubelet would exit) and rewrites the QoS-class groups every
    ``resync`` seconds on a thread; :meth:`add_pod` before a pod's sandbox, :meth:`remove_pod`
    after it; :meth:`stop` joins the thread and leaves the groups (the runtime's teardown removes
    them). Every write is in :meth:`writes`."""

    def __init__(
        self,
        cgroup_root: str,
        *,
        resync: float = QOS_RESYNC,
        cpu_milli: int | None = None,
        memory: int | None = None,
        fs: Path = CGROUP_FS,
        version: int | None = None,
    ) -> None:
        self.cgroup_root = cgroup_root.strip("/")
        if not self.cgroup_root or ".." in self.cgroup_root.split("/"):
            raise ValueError(f"refusing cgroup root {cgroup_root!r}")
        self.fs = fs
        self.version = version or detect_version(fs)
        self.resync = resync
        self.cpu_milli = cpu_milli if cpu_milli is not None else len(os.sched_getaffinity(0)) * MILLI_CPU_TO_CPU
        self.memory = memory if memory is not None else _mem_total()
        self._pods: dict[str, tuple[str, tuple[Resources, ...]]] = {}
        self._records: list[Write] = []
        self._lock = threading.Lock()  # UpdateCgroups holds the QoS manager's lock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.started = 0  # how many times start() ran: a second one is a kubelet restart

    # life ------------------------------------------------------------------------------------

    def start(self) -> None:
        """kubelet's start: the node-allocatable group, then the QoS-class groups (made, or
        updated where they exist: a refused update there is kubelet's exit), one
        ``UpdateCgroups``, then the periodic rewrites."""
        if self._thread is not None:
            raise RuntimeError("kubelet already running")
        cause = "restart" if self.started else "start"
        self.started += 1
        with self._lock:
            self._ensure(NODE_GROUP, node_config(self.cpu_milli, self.memory), cause)
            for group, cfg in qos_start_configs().items():
                if not self._exists(group):
                    self._create(group, cfg, cause)
                elif (failed := self._set(group, cfg, cause)) is not None:
                    qos = next(q for q, g in QOS_GROUPS.items() if g == group)
                    raise KubeletExited(f"failed to update top level {qos} QOS cgroup : {failed.error}")
        self.update_qos(cause)
        self._stop.clear()
        self._thread = threading.Thread(target=self._periodic, name="test-kubelet", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the periodic rewrites and wait for the thread; the groups stay. Idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            if self._thread.is_alive():
                raise RuntimeError("the test kubelet's thread did not stop")
            self._thread = None

    def restart(self) -> None:
        """Stop and start again (kubelet restarted: its start updates the QoS-class groups)."""
        self.stop()
        self.start()

    def __enter__(self) -> Kubelet:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _periodic(self) -> None:
        while not self._stop.wait(self.resync):
            self.update_qos("periodic")

    # pods ------------------------------------------------------------------------------------

    def add_pod(self, uid: str, qos: str, containers: Mapping[str, Resources] | None = None) -> str:
        """A pod admitted: the QoS-class groups updated with it counted, then its own group made
        with kubelet's pod-level values (SyncPod, before the sandbox). A pod with no containers
        given counts as one container without requests or limits. Returns the pod's group."""
        if qos not in QOS_CLASSES:
            raise ValueError(f"unknown QoS class {qos!r}")
        spec = tuple((containers or {"main": Resources()}).values())
        with self._lock:
            self._pods[uid] = (qos, spec)
        self.update_qos("pod-added")
        group = pod_group(qos, uid)
        with self._lock:
            self._create(group, pod_config(qos, spec), "pod-create")
        return group

    def remove_pod(self, uid: str) -> None:
        """A pod gone (after its sandbox): the QoS-class groups updated without it, then its
        group removed (``Destroy``: every empty group under it, deepest first)."""
        with self._lock:
            entry = self._pods.pop(uid, None)
        if entry is None:
            return
        self.update_qos("pod-removed")
        group = pod_group(entry[0], uid)
        for h in self._hierarchies():
            top = h / self.cgroup_root / group
            if not top.is_dir():
                continue
            dirs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
            for d in [*dirs, top]:
                with contextlib.suppress(OSError):
                    d.rmdir()

    def pods(self) -> list[str]:
        with self._lock:
            return list(self._pods)

    def update_qos(self, cause: str = "periodic") -> bool:
        """``UpdateCgroups``: every QoS-class group's weight written as kubelet computes it,
        changed or not; the first refused group ends the round (kubelet returns its error)."""
        with self._lock:
            configs = qos_configs(self._pods.values())
            for group, cfg in configs.items():
                if self._set(group, cfg, cause) is not None:
                    return False
        return True

    # records ---------------------------------------------------------------------------------

    def writes(self, group: str | None = None, since: float = 0.0, file: str | None = None) -> list[Write]:
        """The writes so far (oldest first): of one group (under the cgroup root), at or after
        ``since`` (``time.monotonic()``), of one file."""
        with self._lock:
            return [
                w
                for w in self._records
                if (group is None or w.group == group) and w.at >= since and (file is None or w.file == file)
            ]

    def refused(self, group: str | None = None, since: float = 0.0) -> list[Write]:
        """The writes the kernel refused and kubelet failed on."""
        return [w for w in self.writes(group, since) if not w.ok and not w.ignored]

    def last_value(self, group: str, file: str) -> str | None:
        """What kubelet last wrote into ``group``'s ``file`` successfully (what it left there)."""
        done = [w for w in self.writes(group, file=file) if w.ok]
        return done[-1].value if done else None

    # cgroupfs --------------------------------------------------------------------------------

    def group_path(self, group: str, controller: str = "cpu") -> Path:
        """A group's directory (``group`` under the cgroup root) in ``controller``'s hierarchy."""
        if self.version == 1:
            return self.fs / controller / self.cgroup_root / group
        return self.fs / self.cgroup_root / group

    def _hierarchies(self) -> list[Path]:
        if self.version == 2:
            return [self.fs]
        return sorted(h for h in self.fs.iterdir() if h.is_dir() and (h / "cgroup.procs").exists())

    def _exists(self, group: str) -> bool:
        return self.group_path(group).is_dir()

    def _ensure(self, group: str, cfg: GroupConfig, cause: str) -> None:
        """The node-allocatable group: made if missing, then updated (an update kubelet
        retries in the background on failure, never exiting for it)."""
        if not self._exists(group):
            self._create(group, cfg, cause)
        else:
            self._set(group, cfg, cause)

    def _create(self, group: str, cfg: GroupConfig, cause: str) -> None:
        """``Create``: the group in every hierarchy (libcontainer's ``Apply(-1)``), then its
        values (a refused one is logged by kubelet, not returned)."""
        for h in self._hierarchies():
            self._mkdirs(h, f"{self.cgroup_root}/{group}")
        self._set(group, cfg, cause)

    def _mkdirs(self, hierarchy: Path, rel: str) -> None:
        """Each missing level, as libcontainer makes it: on v1 a new cpuset group gets its
        parent's CPUs and memory nodes (else no task could join it); on v2 each parent enables
        its controllers for its children."""
        d = hierarchy
        for part in rel.split("/"):
            if self.version == 2:
                _enable_controllers(d)
            d = d / part
            if d.is_dir():
                continue
            d.mkdir()
            if self.version == 1 and (d / "cpuset.cpus").exists():
                for name in ("cpuset.cpus", "cpuset.mems"):
                    if not (d / name).read_text().strip():
                        (d / name).write_text((d.parent / name).read_text().strip())

    def _set(self, group: str, cfg: GroupConfig, cause: str) -> Write | None:
        """libcontainer's ``Set`` on one group: the refused write that ended it, else None."""
        deferred: tuple[Path, str] | None = None
        plan = planned_writes(cfg, self.version)
        for controller, name, value in plan:
            path = self.group_path(group, controller) / name
            w = self._write(group, name, value, cause, path)
            if (
                not w.ok
                and name == "cpu.cfs_period_us"
                and w.errno == errnos.EINVAL
                and any(n == "cpu.cfs_quota_us" for _, n, _ in plan)
            ):
                # a period below the current one may be refused until the quota is lowered
                self._records[-1] = replace(w, ignored=True)
                deferred = (path, value)
                continue
            if not w.ok:
                return w
            if name == "cpu.shares":
                read = _read(path)
                if read is not None and read != value:
                    which = "maximum" if int(value) > int(read) else "minimum"
                    self._records[-1] = w = replace(w, error=f"the {which} allowed cpu-shares is {read}")
                    return w
        if deferred is not None:
            w = self._write(group, "cpu.cfs_period_us", deferred[1], cause, deferred[0])
            if not w.ok:
                return w
        return None

    def _write(self, group: str, name: str, value: str, cause: str, path: Path) -> Write:
        """One write as libcontainer's ``WriteFile`` does it (open for writing, truncate, one
        write), recorded."""
        code, error = None, ""
        try:
            fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
            try:
                os.write(fd, value.encode())
            finally:
                os.close(fd)
        except OSError as exc:
            code = exc.errno
            op = "open" if isinstance(exc, FileNotFoundError) else "write"
            error = f'failed to write "{value}": {op} {path}: {os.strerror(exc.errno or 0).lower()}'
        w = Write(group, name, value, cause, time.monotonic(), path, code, error)
        self._records.append(w)
        return w


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _enable_controllers(d: Path) -> None:
    """cgroup v2: let ``d``'s children have every controller ``d`` has (as runc's fs2 does,
    one at a time, a refusal left alone)."""
    have = (_read(d / "cgroup.controllers") or "").split()
    enabled = set((_read(d / "cgroup.subtree_control") or "").split())
    for c in have:
        if c not in enabled:
            with contextlib.suppress(OSError):
                (d / "cgroup.subtree_control").write_text(f"+{c}")


def _mem_total() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return 0
