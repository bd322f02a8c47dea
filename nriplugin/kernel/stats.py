"""Reading the kernel's counters: cgroup CPU, throttling, memory and PSI, and the node's /proc
files. ``cgroup.py`` owns the settable values; this module only reads, never writes.

Parsers are small pure functions (text in, values out) that never raise on malformed text:
they return None or leave a value out, so a fuzzed or truncated file cannot break a round.
Reads go through one reader (:class:`OpenFiles`: O_NOFOLLOW, files kept open between rounds,
the cgroup's directory checked against the root by ``Cgroups.group_path``), and a file that is
not there — a container that just went away, a kernel without PSI — reads as None, never as
an exception.

psutil is not used: its /proc root is process-wide state (not injectable per reader), it
parses more than a round needs, and it has no cgroup counters.
"""

from __future__ import annotations

import contextlib
import math
import os
import resource
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from nriplugin.kernel.cgroup import Cgroups, Version

_CHUNK = 65536
_LIMIT = 1 << 20  # no counter file is anywhere near this: a bound, not a size estimate


def _pread_all(fd: int) -> str:  # pragma: no mutate block (file I/O, not a parser: tools/mutation.py)
    """Read from offset 0: a kernel seq file regenerates its text, so an fd kept open reads
    current values. One call suffices unless the buffer fills."""
    data = os.pread(fd, _CHUNK, 0)
    if len(data) == _CHUNK:
        parts = [data]
        total = len(data)
        while total < _LIMIT:
            more = os.pread(fd, _CHUNK, total)
            if not more:
                break
            parts.append(more)
            total += len(more)
        data = b"".join(parts)
    return data.decode("latin-1")  # the kernel writes ASCII; latin-1 cannot fail


def _nofile_budget() -> int:
    """How many files to keep open: a quarter of the soft RLIMIT_NOFILE, at most 4096 (the
    agent's sockets, inotify and the writer need the rest)."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return 0
    if soft == resource.RLIM_INFINITY:
        return 4096
    return max(0, min(4096, soft // 4))


class OpenFiles:  # pragma: no mutate block (file I/O, not a parser: tools/mutation.py)
    """Counter files kept open between rounds: opening (the path walk) is most of a small
    file's cost, and the kernel regenerates a seq file on each read from offset 0 — a round
    of 200 containers costs about half as much.

    Bounded (``limit`` descriptors; beyond it files are opened and closed per read). An open
    file does not keep its cgroup from being removed: its reads then fail (ENODEV) and it is
    closed at once; :meth:`retain` closes those of groups the caller no longer reads."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = _nofile_budget() if limit is None else limit
        self._fds: dict[str, int] = {}
        self._owned: dict[str, list[str]] = {}  # owner (a cgroup; "" for /proc) -> its paths

    def __len__(self) -> int:
        return len(self._fds)

    def read(self, path: str, owner: str = "", keep: bool = True) -> str | None:
        """``path``'s text (None when it cannot be read); ``keep`` False: opened and closed
        now, for a file whose name does not outlive a round (a task's, or a cgroup's
        ``tasks``, whose kept-open reads the kernel may serve from its cached list)."""
        fd = self._fds.get(path)
        if fd is not None:
            try:
                return _pread_all(fd)
            except OSError:  # gone (ENODEV): look again, as for a file never opened
                self.forget(owner)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return None
        try:
            text = _pread_all(fd)
        except OSError:
            os.close(fd)
            return None
        if keep and len(self._fds) < self.limit:
            self._fds[path] = fd
            self._owned.setdefault(owner, []).append(path)
        else:
            os.close(fd)
        return text

    def forget(self, owner: str) -> None:
        """Close the files kept for ``owner`` (its cgroup is gone, or no longer read)."""
        for path in self._owned.pop(owner, ()):
            with contextlib.suppress(OSError):
                os.close(self._fds.pop(path))

    def retain(self, owners: set[str]) -> int:
        """Close the files of cgroups not in ``owners`` (node files stay). Returns how many
        cgroups were let go."""
        gone = [o for o in self._owned if o and o not in owners]
        for o in gone:
            self.forget(o)
        return len(gone)

    def close(self) -> None:
        for o in list(self._owned):
            self.forget(o)


# parsers ------------------------------------------------------------------------------------


class ProcCpu(NamedTuple):
    """The aggregate ``cpu`` line of /proc/stat in clock ticks, and the online CPUs."""

    busy: int
    total: int
    ncpu: int


class PsiLine(NamedTuple):
    avg10: float
    avg60: float
    avg300: float
    total_us: int


class Psi(NamedTuple):
    """A PSI file: ``some`` and ``full`` (cpu had no ``full`` line before Linux 5.13: zeros)."""

    some: PsiLine
    full: PsiLine


NO_STALL = PsiLine(0.0, 0.0, 0.0, 0)


class MemInfo(NamedTuple):
    """/proc/meminfo, in bytes."""

    total: int
    available: int
    swap_total: int
    swap_free: int


class CpuStat(NamedTuple):
    """A cgroup's CPU counters, in the same units on v1 and v2."""

    usage_ns: int
    nr_periods: int = 0
    nr_throttled: int = 0
    throttled_ns: int = 0
    # a task runnable, not running: v2 cpu.pressure "some" total, v1 the tasks' run_delay summed
    waiting_us: int | None = None


class MemStat(NamedTuple):
    """A cgroup's memory in bytes: usage (page cache included), RSS (anonymous) and cache."""

    usage: int
    rss: int
    cache: int


def parse_int(text: str) -> int | None:
    try:
        return int(text.strip())
    except ValueError:
        return None


def field(text: str, key: str) -> int | None:
    """The value of the ``key N`` line of a flat-keyed file (cpu.stat, memory.stat): found by
    search, not by splitting every line (v1 memory.stat has 40 lines, a round reads hundreds)."""
    if text.startswith(key + " "):
        i = len(key) + 1
    else:
        i = text.find("\n" + key + " ")
        if i < 0:
            return None
        i += len(key) + 2
    end = text.find("\n", i)
    return parse_int(text[i:] if end < 0 else text[i:end])


def parse_proc_stat(text: str) -> ProcCpu | None:
    """/proc/stat: busy and total ticks of the ``cpu`` line. Busy excludes idle and iowait;
    guest and guest_nice are left out of both, since the kernel already counts them in user
    and nice."""
    end = text.find("\n")
    first = text if end < 0 else text[:end]
    fields = first.split()
    if len(fields) < 5 or fields[0] != "cpu":
        return None
    try:
        ticks = [int(f) for f in fields[1:9]]
    except ValueError:
        return None
    if any(t < 0 for t in ticks):
        return None
    total = sum(ticks)
    busy = total - ticks[3] - (ticks[4] if len(ticks) > 4 else 0)
    return ProcCpu(busy, total, max(1, text.count("\ncpu")))


def parse_loadavg(text: str) -> float | None:
    """/proc/loadavg: the 1-minute load average."""
    try:
        v = float(text.split(maxsplit=1)[0])
    except (IndexError, ValueError):
        return None
    return v if math.isfinite(v) and v >= 0 else None


def _psi_line(rest: str) -> PsiLine | None:
    vals = dict(f.partition("=")[::2] for f in rest.split())
    try:
        line = PsiLine(float(vals["avg10"]), float(vals["avg60"]), float(vals["avg300"]), int(vals["total"]))
    except (KeyError, ValueError):
        return None
    if not all(math.isfinite(a) and a >= 0 for a in line[:3]) or line.total_us < 0:
        return None
    return line


def parse_psi(text: str) -> Psi | None:
    """``some avg10=.. avg60=.. avg300=.. total=..`` and ``full ...`` (/proc/pressure/*, a
    v2 cgroup's ``*.pressure``). None without a usable ``some`` line."""
    some = full = None
    for raw in text.splitlines():
        kind, _, rest = raw.partition(" ")
        if kind == "some":
            some = _psi_line(rest)
        elif kind == "full":
            full = _psi_line(rest)
    if some is None:
        return None
    return Psi(some, full or NO_STALL)


def parse_psi_some_total(text: str) -> int | None:
    """Only the ``some`` total (the fast path): no dictionary, no floats."""
    if not text.startswith("some "):
        return None
    i = text.find("total=")
    if i < 0:
        return None
    end = text.find("\n", i)
    return parse_int(text[i + 6 : end if end >= 0 else len(text)])


_MEMINFO = {"MemTotal:": 0, "MemAvailable:": 1, "SwapTotal:": 2, "SwapFree:": 3}


def parse_meminfo(text: str) -> MemInfo | None:
    """/proc/meminfo (values in kB) -> bytes. None without MemTotal; a kernel before 3.14 has
    no MemAvailable (0 here: the caller decides)."""
    vals = [0, 0, 0, 0]
    found = False
    for line in text.splitlines():
        parts = line.split()
        i = _MEMINFO.get(parts[0]) if len(parts) >= 2 else None
        if i is None:
            continue
        try:
            vals[i] = int(parts[1]) * 1024
        except ValueError:
            continue
        found = found or i == 0
    return MemInfo(*vals) if found else None


def parse_pgscan(text: str) -> tuple[int, int]:
    """/proc/vmstat: pages scanned by direct reclaim and by kswapd, summed over the kernel's
    variants (``pgscan_direct`` since 4.8, per-zone ``pgscan_direct_{dma,normal,...}`` before).
    ``pgscan_direct_throttle`` counts throttling events, not pages: left out."""
    direct = kswapd = 0
    start = 0 if text.startswith("pgscan_") else text.find("\npgscan_")  # they are listed together
    if start < 0:
        return 0, 0
    for line in text[start:].splitlines():
        if not line.startswith("pgscan_"):
            continue
        k, _, v = line.partition(" ")
        try:
            n = int(v)
        except ValueError:
            continue
        if k.startswith("pgscan_direct") and k != "pgscan_direct_throttle":
            direct += n
        elif k.startswith("pgscan_kswapd"):
            kswapd += n
    return direct, kswapd


def parse_v1_cpu(usage: str, cpu_stat: str | None) -> CpuStat | None:
    """v1: ``cpuacct.usage`` (ns) and the cpu hierarchy's ``cpu.stat`` (throttled_time in ns)."""
    ns = parse_int(usage)
    if ns is None:
        return None
    if not cpu_stat:
        return CpuStat(ns)
    return CpuStat(
        ns,
        field(cpu_stat, "nr_periods") or 0,
        field(cpu_stat, "nr_throttled") or 0,
        field(cpu_stat, "throttled_time") or 0,
    )


def parse_schedstat(text: str) -> int | None:
    """``/proc/<tid>/schedstat``: time on the CPU, time waiting on a run queue, timeslices (ns,
    ns, count). Returns the wait (``run_delay``)."""
    parts = text.split()
    if len(parts) < 2 or not (parts[1].isascii() and parts[1].isdigit()):  # "¹" is a digit too
        return None
    return int(parts[1])


class RunDelay:
    """A v1 cgroup's run-queue wait, summed over its tasks, as a counter that only grows.

    cgroup v1 has no per-group PSI, so a container's own wait for a CPU is the sum of its tasks'
    ``run_delay`` (``/proc/<tid>/schedstat``). Tasks come and go between readings: an exited
    task's wait stays counted, a new task's counts from 0 (it began after the last reading),
    and a tid read lower than before is a new task under a reused id. The sum counts tasks
    waiting at the same time once each, so a share of the interval can pass 1 (the reader
    caps it): an upper bound of PSI ``some``, and LS's own, never BE's."""

    __slots__ = ("_last", "total_ns")

    def __init__(self) -> None:
        self._last: dict[int, int] = {}
        self.total_ns = 0

    def update(self, delays: dict[int, int]) -> int:
        """The tasks' ``run_delay`` by tid, read now; returns the total so far (ns)."""
        last = self._last
        for tid, ns in delays.items():
            before = last.get(tid, 0)
            self.total_ns += ns - before if ns >= before else ns
        self._last = delays
        return self.total_ns


def parse_v2_cpu(cpu_stat: str) -> CpuStat | None:
    """v2 ``cpu.stat`` (µs). Without the cpu controller enabled it has only the usage lines:
    no throttling (zeros)."""
    us = field(cpu_stat, "usage_usec")
    if us is None:
        return None
    return CpuStat(
        us * 1000,
        field(cpu_stat, "nr_periods") or 0,
        field(cpu_stat, "nr_throttled") or 0,
        (field(cpu_stat, "throttled_usec") or 0) * 1000,
    )


def parse_v1_memory(usage: str, memory_stat: str | None) -> MemStat | None:
    """v1 ``memory.usage_in_bytes`` and ``memory.stat``: the hierarchical ``total_*`` lines when
    present (a pod's group counts its children), else the group's own."""
    n = parse_int(usage)
    if n is None:
        return None
    if not memory_stat:
        return MemStat(n, 0, 0)
    rss = field(memory_stat, "total_rss")
    cache = field(memory_stat, "total_cache")
    return MemStat(
        n,
        field(memory_stat, "rss") or 0 if rss is None else rss,
        field(memory_stat, "cache") or 0 if cache is None else cache,
    )


class WorkingSet(NamedTuple):
    """A memory group's use as the OOM killer sees it (bytes): usage minus the inactive page
    cache the kernel drops first (kubelet's working set), and its limit (None: unlimited)."""

    usage: int
    working_set: int
    limit: int | None
    anon: int = 0  # anonymous memory (v1 ``total_rss``, v2 ``anon``): what ending its tasks frees


UNLIMITED_V1 = 1 << 62  # v1 reports "no limit" as PAGE_COUNTER_MAX pages, a value near 2**63


def parse_limit(text: str) -> int | None:
    """``memory.limit_in_bytes`` / ``memory.max``: bytes, or None for no limit (v2 ``max``,
    v1's huge sentinel) or unreadable text."""
    t = text.strip()
    if t == "max":
        return None
    n = parse_int(t)
    return None if n is None or n <= 0 or n >= UNLIMITED_V1 else n


def working_set(usage: int, memory_stat: str | None, v2: bool) -> int:
    """Usage minus inactive file pages (hierarchical ``total_inactive_file`` on v1)."""
    if not memory_stat:
        return usage
    key = "inactive_file" if v2 else "total_inactive_file"
    inactive = field(memory_stat, key)
    if inactive is None and not v2:
        inactive = field(memory_stat, "inactive_file")
    return max(0, usage - (inactive or 0))


def parse_v2_memory(current: str, memory_stat: str | None) -> MemStat | None:
    """v2 ``memory.current`` and ``memory.stat`` (``anon``, ``file``; already hierarchical)."""
    n = parse_int(current)
    if n is None:
        return None
    if not memory_stat:
        return MemStat(n, 0, 0)
    return MemStat(n, field(memory_stat, "anon") or 0, field(memory_stat, "file") or 0)


# reading ------------------------------------------------------------------------------------


class Stats:  # pragma: no mutate block (file I/O, not a parser: tools/mutation.py)
    """The counters of cgroups under ``cgroups.root`` and of the node under ``proc_root``.

    Every method returns None (or zeros) when its file is missing or unreadable."""

    def __init__(self, cgroups: Cgroups, proc_root: Path = Path("/proc"), max_open: int | None = None) -> None:
        self.cgroups = cgroups
        self.files = OpenFiles(max_open)
        self.v2 = cgroups.version is Version.V2
        proc = str(proc_root).rstrip("/") or "/"
        self._stat = f"{proc}/stat"
        self._loadavg = f"{proc}/loadavg"
        self._meminfo = f"{proc}/meminfo"
        self._vmstat = f"{proc}/vmstat"
        self._pressure = f"{proc}/pressure/"
        self._proc = proc
        self._run_delay: dict[str, RunDelay] = {}  # v1: LS groups' tasks' waits

    def retain(self, groups: set[str]) -> int:
        """Close the kept files of cgroups not in ``groups`` (containers the model dropped)."""
        for gone in [g for g in self._run_delay if g not in groups]:
            del self._run_delay[gone]
        return self.files.retain(groups)

    def close(self) -> None:
        self.files.close()

    def _dir(self, group: str, controller: str) -> str | None:
        try:
            return self.cgroups.group_path(group, controller)
        except OSError:  # resolves outside the root (PermissionError), or cannot be resolved
            return None

    # cgroups ------------------------------------------------------------------------------------

    def cpu(self, group: str, throttling: bool = True, waiting: bool = False) -> CpuStat | None:
        """CPU used (cumulative) and throttling; None when the group is gone. On v1 usage is in
        the cpuacct hierarchy (its own mount, or ``cpu,cpuacct`` behind the ``cpuacct`` link)
        and throttling in the cpu hierarchy's ``cpu.stat`` (not read with ``throttling=False``:
        a group without a quota is never throttled, and it is one kernel file less).
        ``waiting``: also the group's own wait for a CPU: its PSI ``some`` on v2, its tasks'
        summed run-queue delay on v1 (:class:`RunDelay`; v1 has no per-group PSI)."""
        if self.v2:
            d = self._dir(group, "cpu")
            text = None if d is None else self.files.read(f"{d}/cpu.stat", group)
            if text is None:
                self.files.forget(group)  # gone: none of its kept files will read again
                return None
            stat = parse_v2_cpu(text)
            if waiting and stat is not None:
                psi = self.files.read(f"{d}/cpu.pressure", group)
                total = None if psi is None else parse_psi_some_total(psi)
                if total is not None:
                    stat = stat._replace(waiting_us=total)
            return stat
        acct = self._dir(group, "cpuacct")
        usage = None if acct is None else self.files.read(f"{acct}/cpuacct.usage", group)
        if usage is None:
            self.files.forget(group)  # gone: none of its kept files will read again
            return None
        cpu = self._dir(group, "cpu") if throttling or waiting else None
        stat = parse_v1_cpu(usage, None if cpu is None or not throttling else self.files.read(f"{cpu}/cpu.stat", group))
        if waiting and stat is not None and cpu is not None:
            delays = self._task_delays(cpu)
            if delays is not None:
                acc = self._run_delay.setdefault(group, RunDelay())
                stat = stat._replace(waiting_us=acc.update(delays) // 1000)
        return stat

    def _task_delays(self, cpu_dir: str) -> dict[int, int] | None:
        """v1: the ``run_delay`` of each task in the group's ``tasks`` (None when it cannot be
        read); a task that exits while being read is skipped."""
        tasks = self.files.read(f"{cpu_dir}/tasks", keep=False)
        if tasks is None:
            return None
        out: dict[int, int] = {}
        for tid in tasks.split():
            if not tid.isdigit():
                continue
            text = self.files.read(f"{self._proc}/{tid}/schedstat", keep=False)
            ns = None if text is None else parse_schedstat(text)
            if ns is not None:
                out[int(tid)] = ns
        return out

    def memory(self, group: str) -> MemStat | None:
        d = self._dir(group, "memory")
        if d is None:
            return None
        if self.v2:
            current = self.files.read(f"{d}/memory.current", group)
            return None if current is None else parse_v2_memory(current, self.files.read(f"{d}/memory.stat", group))
        usage = self.files.read(f"{d}/memory.usage_in_bytes", group)
        return None if usage is None else parse_v1_memory(usage, self.files.read(f"{d}/memory.stat", group))

    def working_set(self, group: str) -> WorkingSet | None:
        """A group's usage, working set and limit, read now (memory eviction: the pods roots
        every round and on memory events, BE pods when MemoryEvict acts)."""
        d = self._dir(group, "memory")
        if d is None:
            return None
        names = ("memory.current", "memory.max") if self.v2 else ("memory.usage_in_bytes", "memory.limit_in_bytes")
        texts = []
        for name in (*names, "memory.stat"):
            text = self.files.read(f"{d}/{name}", group)  # kept open: the pods roots are read every round
            if text is None and name != "memory.stat":
                return None
            texts.append(text or "")
        usage = parse_int(texts[0])
        if usage is None:
            return None
        stat = texts[2]
        anon = field(stat, "anon" if self.v2 else "total_rss") if stat else None
        return WorkingSet(usage, working_set(usage, stat, self.v2), parse_limit(texts[1]), anon or 0)

    def pressure(self, group: str, resource: str = "cpu") -> Psi | None:
        """A cgroup's PSI (``cpu``, ``memory``, ``io``): cgroup v2 only (None on v1)."""
        if not self.v2:
            return None
        d = self._dir(group, "cpu")
        text = None if d is None else self.files.read(f"{d}/{resource}.pressure", group)
        return None if text is None else parse_psi(text)

    # the node -----------------------------------------------------------------------------------

    def proc_cpu(self) -> ProcCpu | None:
        text = self.files.read(self._stat)
        return None if text is None else parse_proc_stat(text)

    def load1(self) -> float | None:
        text = self.files.read(self._loadavg)
        return None if text is None else parse_loadavg(text)

    def node_pressure(self, resource: str) -> Psi | None:
        """/proc/pressure/<resource>; None on a kernel without PSI (or booted with psi=0)."""
        text = self.files.read(self._pressure + resource)
        return None if text is None else parse_psi(text)

    def node_cpu_stall_us(self) -> int | None:
        """The ``some`` total of /proc/pressure/cpu alone (the fast path)."""
        text = self.files.read(self._pressure + "cpu")
        return None if text is None else parse_psi_some_total(text)

    def stall_us(self, files: Iterable[str]) -> int | None:
        """The ``some`` totals of these PSI files summed (µs): how long each group had a
        task waiting for a CPU. Opened and closed per read: they are read only while the
        fast path follows a rise, and a pod's file goes with its pod. None when none reads."""
        total, read = 0, False
        for path in files:
            text = self.files.read(path, keep=False)
            v = None if text is None else parse_psi_some_total(text)
            if v is not None:
                total, read = total + v, True
        return total if read else None

    def meminfo(self) -> MemInfo | None:
        text = self.files.read(self._meminfo)
        return None if text is None else parse_meminfo(text)

    def pgscan(self) -> tuple[int, int] | None:
        text = self.files.read(self._vmstat)
        return None if text is None else parse_pgscan(text)
