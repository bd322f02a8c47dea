"""cgroup v1 and v2 behind one interface: logical resource names (the v1 names), their file in
each version, value conversions, validated writes, and the "unsupported" memory.

Writes are range-checked, refuse any path that resolves outside the root, and turn the
kernel's EINVAL/EPERM/ENOENT for a file the kernel does not have into "unsupported": reported
once (the caller logs it), then skipped without touching the file again.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path

from nriplugin.kernel.cpulist import parse_cpulist

MAX_SHARES, MIN_SHARES = 262144, 2
MAX_WEIGHT, MIN_WEIGHT = 10000, 1
PID_MAX_LIMIT = 4 * 1024 * 1024  # the kernel's ceiling on pid numbers (64-bit), so on pids.max
MIN_QUOTA_US = 1000  # the kernel's smallest CFS quota (1 ms)
CFS_PERIOD_US = 100_000  # the kernel's default CFS period (100 ms), and the kubelet's: where none is set
HYBRID_UNIFIED = "unified"  # where a v1 hybrid host mounts the cgroup v2 hierarchy, under the cgroup root


def cfs_period(value: object) -> int:
    """A CFS period as read or requested, or the default where there is none (unset, unread)."""
    return value if isinstance(value, int) and value > 0 else CFS_PERIOD_US


# Resources whose "no limit" is the word "max" in cgroup v1 too (v1's others take -1).
MAX_WORD_V1 = frozenset({"pids.max"})


class Version(IntEnum):
    """The cgroup hierarchy; what differs between them is asked through the properties here
    (and :class:`Cgroups`), never by comparing versions outside ``kernel/``."""

    V1 = 1
    V2 = 2

    @property
    def unified(self) -> bool:
        """A runtime can set any of the group's files at creation, through OCI's ``unified``
        map (cgroup v2); on v1 only what the runtime's resources have fields for."""
        return self is Version.V2

    @property
    def parent_caps_quota(self) -> bool:
        """The kernel refuses a child's CFS quota above its parent's (cgroup v1; v2's
        ``cpu.max`` of each level simply applies)."""
        return self is Version.V1

    @property
    def controllers(self) -> tuple[str, ...]:
        """The hierarchies a group the agent manages has a directory in: one per controller
        on v1 (cpu, cpuset, memory, blkio), the one tree ("") on v2."""
        return ("cpu", "cpuset", "memory", "blkio") if self is Version.V1 else ("",)


def shares_to_weight(shares: int) -> int:
    """cgroup v1 cpu.shares -> v2 cpu.weight, linearly (runc before 1.3.2, kubelet's own
    helper): the default 1024 shares become weight 39, not 100."""
    shares = min(max(shares, MIN_SHARES), MAX_SHARES)
    return 1 + ((shares - MIN_SHARES) * (MAX_WEIGHT - 1)) // (MAX_SHARES - MIN_SHARES)


def weight_to_shares(weight: int) -> int:
    weight = min(max(weight, MIN_WEIGHT), MAX_WEIGHT)
    return MIN_SHARES + ((weight - 1) * (MAX_SHARES - MIN_SHARES) + MAX_WEIGHT - 2) // (MAX_WEIGHT - 1)


def shares_to_weight_log(shares: int) -> int:
    """cpu.shares -> cpu.weight as runc 1.3.2+ and crun 1.23+ convert (kubernetes#131216): a
    quadratic in log2(shares) through the minimum, the maximum and the defaults (1024 -> 100)."""
    if shares <= MIN_SHARES:
        return MIN_WEIGHT
    if shares >= MAX_SHARES:
        return MAX_WEIGHT
    lg = math.log2(shares)
    return math.ceil(10 ** ((lg * lg + 125 * lg) / 612.0 - 7.0 / 34.0))


def weight_to_shares_log(weight: int) -> int:
    """The least shares that :func:`shares_to_weight_log` maps to ``weight`` or above (it is
    monotonic: a bisection over the shares range)."""
    lo, hi = MIN_SHARES, MAX_SHARES
    while lo < hi:
        mid = (lo + hi) // 2
        if shares_to_weight_log(mid) >= weight:
            hi = mid
        else:
            lo = mid + 1
    return lo


# How the runtime turns cpu.shares into cpu.weight on cgroup v2: name -> (to weight, back).
WEIGHT_MAPPINGS: dict[str, tuple[Callable[[int], int], Callable[[int], int]]] = {
    "linear": (shares_to_weight, weight_to_shares),
    "log": (shares_to_weight_log, weight_to_shares_log),
}


# A group with cpu.idle=1 runs at the kernel's idle weight and refuses (EINVAL) any weight
# written until cpu.idle is 0 again (which resets it to the default: cpu.weight 100, cpu.shares
# 1024). cgroup v2 reads its cpu.weight as 0; v1 (5.15 and later) reads its cpu.shares as 3.
# The default policy gives BE both cpu.idle=1 and shares: the weight is then in place, not drift.
IDLE_WEIGHT = "0"
IDLE_SHARES_V1 = "3"

# Writing the key resets the values named: after a change of cpu.idle the weight is the
# kernel's again (idle, or the default), so a weight wanted in the same group is written after
# it, whether or not it read as in place before.
RESETS: dict[str, tuple[str, ...]] = {"cpu.idle": ("cpu.shares",)}
RESET_BY_OTHERS = frozenset(r for named in RESETS.values() for r in named)


class InvalidValue(ValueError):
    pass


@dataclass(frozen=True)
class Resource:
    """One logical setting. ``v1``: (controller, file); ``v2``: file; None where absent."""

    name: str
    v1: tuple[str, str] | None
    v2: str | None
    lo: int | None = None  # inclusive range of the logical (v1) value; None: not an integer
    hi: int | None = None
    unlimited: int | None = None  # the logical value meaning "no limit" (-1), written "max" on v2
    to_v2: Callable[[int], int] | None = None
    from_v2: Callable[[int], int] | None = None

    def check(self, value: int | str) -> int | str:
        if self.lo is None:
            if not isinstance(value, str) or len(value) > 4096 or "\n" in value.rstrip("\n"):
                raise InvalidValue(f"{self.name}: expected a single-line string, got {value!r:.80}")
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidValue(f"{self.name}: expected an integer, got {value!r:.80}")
        if value == self.unlimited:
            return value
        assert self.hi is not None
        if not self.lo <= value <= self.hi:
            raise InvalidValue(f"{self.name}={value} is outside [{self.lo}, {self.hi}]")
        return value


RESOURCES: dict[str, Resource] = {
    r.name: r
    for r in (
        Resource(
            "cpu.shares",
            ("cpu", "cpu.shares"),
            "cpu.weight",
            MIN_SHARES,
            MAX_SHARES,
            None,
            shares_to_weight,
            weight_to_shares,
        ),
        # cpu.max on v2 is "QUOTA PERIOD"; quota and period are handled as one pair below.
        Resource("cpu.cfs_quota_us", ("cpu", "cpu.cfs_quota_us"), "cpu.max", MIN_QUOTA_US, 2**44, -1),
        Resource("cpu.cfs_period_us", ("cpu", "cpu.cfs_period_us"), "cpu.max", 1000, 1_000_000),
        Resource("cpu.cfs_burst_us", ("cpu", "cpu.cfs_burst_us"), "cpu.max.burst", 0, 2**44),
        Resource("cpu.bvt_warp_ns", ("cpu", "cpu.bvt_warp_ns"), "cpu.bvt_warp_ns", -1, 2),
        Resource("cpu.idle", ("cpu", "cpu.idle"), "cpu.idle", 0, 1),
        Resource("cpuset.cpus", ("cpuset", "cpuset.cpus"), "cpuset.cpus"),
        Resource("cpuset.mems", ("cpuset", "cpuset.mems"), "cpuset.mems"),
        Resource("memory.limit_in_bytes", ("memory", "memory.limit_in_bytes"), "memory.max", 4096, 2**62, -1),
        # Mainline v1 has no min/low/high (some kernels, e.g. Anolis, add them under these names).
        Resource("memory.min", ("memory", "memory.min"), "memory.min", 0, 2**62),
        Resource("memory.low", ("memory", "memory.low"), "memory.low", 0, 2**62),
        Resource("memory.high", ("memory", "memory.high"), "memory.high", 0, 2**62, -1),
        Resource("memory.oom.group", None, "memory.oom.group", 0, 1),
        # v1's nearest thing to memory.low: under node-wide memory pressure, groups above their soft
        # limit are reclaimed first (reads back as a huge number when unlimited).
        Resource("memory.soft_limit_in_bytes", ("memory", "memory.soft_limit_in_bytes"), None, 0, 2**62, -1),
        # The most tasks (threads) the group may hold; "max" (-1 here) in both versions.
        Resource("pids.max", ("pids", "pids.max"), "pids.max", 0, PID_MAX_LIMIT, -1),
        # Per-device throttles: the value is "MAJOR:MINOR N" (v2: one io.max key per resource).
        Resource("blkio.throttle.read_bps_device", ("blkio", "blkio.throttle.read_bps_device"), "io.max"),
        Resource("blkio.throttle.write_bps_device", ("blkio", "blkio.throttle.write_bps_device"), "io.max"),
        Resource("blkio.throttle.read_iops_device", ("blkio", "blkio.throttle.read_iops_device"), "io.max"),
        Resource("blkio.throttle.write_iops_device", ("blkio", "blkio.throttle.write_iops_device"), "io.max"),
        Resource(
            "blkio.weight",
            ("blkio", "blkio.weight"),
            "io.weight",
            10,
            1000,
            None,
            lambda w: max(1, min(10000, w * 10)),
            lambda w: max(10, min(1000, w // 10)),
        ),
    )
}


DEVICE_RULES = {
    "blkio.throttle.read_bps_device": "rbps",
    "blkio.throttle.write_bps_device": "wbps",
    "blkio.throttle.read_iops_device": "riops",
    "blkio.throttle.write_iops_device": "wiops",
}
# Byte values the kernel keeps in pages (page_counter_memparse): they read back rounded down.
PAGE_ROUNDED = frozenset(
    ("memory.limit_in_bytes", "memory.min", "memory.low", "memory.high", "memory.soft_limit_in_bytes")
)
_DEVICE_RULE = re.compile(r"^([0-9]{1,4}):([0-9]{1,7}) ([0-9]{1,19})$")


@dataclass
class WriteOutcome:
    status: str  # "written", "unchanged", "unsupported", "missing" (cgroup gone), "rejected"; "held" (the writer's)
    errno: int = 0
    detail: str = ""


@dataclass
class Cgroups:
    """The cgroup tree at ``root`` (``/sys/fs/cgroup`` in production)."""

    root: Path = Path("/sys/fs/cgroup")
    version: Version | None = None  # detected from the tree when None
    unsupported: set[str] = field(default_factory=set)
    on_unsupported: Callable[[str, str], None] | None = None  # (resource, why): reported once
    # cgroup v2: the runtime's cpu.shares -> cpu.weight mapping ("linear" until learned from a
    # container the runtime created: see learn_weight_mapping)
    weight_mapping: str = "linear"
    weight_learned: bool = False

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        self._dirs: dict[tuple[str, str], str] = {}
        self._ctrls: set[str] = set()  # controllers in _dirs' keys
        self._root = str(self.root).rstrip("/") or "/"
        self._prefix = self._root.rstrip("/")  # "" for a root of "/": paths are joined to it
        self._real_bases: dict[str, str] = {}
        self._resolved: dict[str, str] = {}  # directory -> its real path
        self._child_files: frozenset[str] | None = None  # v2 with no group yet: a probe group's files
        self._hybrid: bool | None = None  # v1 with the unified hierarchy beside it (pressure_file)
        if self.version is None:
            self.version = detect_version(self.root)

    # paths -----------------------------------------------------------------------------------

    def file(self, group: str, resource: str) -> Path:
        """The file of ``resource`` for cgroup ``group`` (relative, as from paths.relative)."""
        return Path(self._file(group, resource))

    def _file(self, group: str, resource: str) -> str:
        res = RESOURCES[resource]
        if self.version is Version.V1:
            if res.v1 is None:
                raise KeyError(f"{resource} has no cgroup v1 file")
            return f"{self._dir(res.v1[0], group)}/{res.v1[1]}"
        if res.v2 is None:
            raise KeyError(f"{resource} has no cgroup v2 file")
        return f"{self._dir('', group)}/{res.v2}"

    def group_dir(self, group: str, controller: str = "cpu") -> Path:
        return Path(self.group_path(group, controller))

    def group_path(self, group: str, controller: str = "cpu", checked: bool = True) -> str:
        """:meth:`group_dir` as a string (the reconciler keeps thousands). ``checked=False``
        only names the path (a key to recognise it by), without resolving it: never open,
        write or watch such a path before checking it."""
        ctrl = controller if self.version is Version.V1 else ""
        if not checked:
            return self._path(ctrl, group)
        return self._dir(ctrl, group)

    def pressure_file(self, group: str, resource: str = "cpu") -> str | None:
        """A group's PSI file (``cpu.pressure``): on v2 in its own directory; on a v1 hybrid
        host in the unified hierarchy (``<root>/unified``), where runc and the kubelet create
        each group too and the kernel keeps per-group PSI whatever the v1 controllers. None
        on a v1 host without that hierarchy: v1 itself has no per-group PSI."""
        if self.version is Version.V2:
            return f"{self._dir('', group)}/{resource}.pressure"
        if self._hybrid is None:
            self._hybrid = os.path.exists(f"{self._path(HYBRID_UNIFIED)}/cgroup.controllers")
        if not self._hybrid:
            return None
        return f"{self._dir(HYBRID_UNIFIED, group)}/{resource}.pressure"

    def _path(self, controller: str, group: str = "") -> str:
        return "/".join([self._prefix, *(p for p in (controller, group) if p)]) or "/"

    def _dir(self, controller: str, group: str) -> str:
        """A group's directory, checked once to resolve inside the root (then cached: the
        reconciler asks for the same few thousand directories on every pass). File names are
        fixed resource names and are opened with O_NOFOLLOW, so no per-file check is needed."""
        key = (controller, group)
        d = self._dirs.get(key)
        if d is None:
            d = self._contained(self._path(controller), self._path(controller, group))
            if len(self._dirs) > 65536:
                self._dirs.clear()
            self._dirs[key] = d
            self._ctrls.add(controller)
        return d

    def forget(self, group: str) -> None:
        """``group`` is gone (its container or pod left): its cached paths go too, so a node
        that churns pods all day does not keep a path per pod it ever had."""
        for c in self._ctrls:
            self._dirs.pop((c, group), None)
            self._resolved.pop(self._path(c, group), None)

    def _contained(self, base: str, path: str) -> str:
        real_base = self._real_bases.get(base)
        if real_base is None:  # a hierarchy root (cpu -> cpu,cpuacct): resolved once
            real_base = self._real_bases[base] = os.path.realpath(base)
        real = self._resolve(path)
        if real != real_base and not real.startswith(real_base + os.sep):
            raise PermissionError(f"refusing {path}: resolves outside {base}")
        return path

    def _resolve(self, path: str) -> str:
        """``os.path.realpath`` with the parent's resolution remembered: a new container's
        directory costs one lstat, not one per path component (its pod's is known)."""
        parent, _, name = path.rpartition("/")
        if not parent or name in ("", ".", ".."):
            return os.path.realpath(path)
        real_parent = self._resolved.get(parent)
        if real_parent is None:
            real_parent = self._resolve(parent)
            if len(self._resolved) > 65536:
                self._resolved.clear()
            self._resolved[parent] = real_parent
        try:
            link = stat.S_ISLNK(os.lstat(f"{real_parent}/{name}").st_mode)
        except OSError:
            link = False  # not there (yet): nothing to follow
        return os.path.realpath(f"{real_parent}/{name}") if link else f"{real_parent}/{name}"

    def threads(self, group: str, processes: bool = False) -> list[int]:
        """Thread ids in ``group`` (v1 ``tasks`` of the cpu hierarchy, v2 ``cgroup.threads``),
        or process ids (``cgroup.procs``); empty when the group is gone."""
        name = "cgroup.procs" if processes else "tasks" if self.version is Version.V1 else "cgroup.threads"
        try:
            text = _read(self.group_dir(group) / name)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return [int(t) for t in text.split() if t.isdigit()]

    # values ----------------------------------------------------------------------------------

    def encode(self, resource: str, value: int | str, period: int | None = None) -> str:
        res = RESOURCES[resource]
        value = res.check(value)
        if resource in DEVICE_RULES:
            m = _DEVICE_RULE.match(str(value))
            if not m or int(m.group(3)) >= 2**63:
                raise InvalidValue(f"{resource}: expected 'MAJOR:MINOR N', got {str(value)[:60]!r}")
            if self.version is Version.V2:
                return f"{m.group(1)}:{m.group(2)} {DEVICE_RULES[resource]}={m.group(3)}"
            return str(value)
        if res.unlimited is not None and value == res.unlimited and resource in MAX_WORD_V1:
            return "max"
        if self.version is Version.V1 or isinstance(value, str):
            return str(value)
        if resource == "cpu.cfs_quota_us":
            return f"{'max' if value == -1 else value} {period or CFS_PERIOD_US}"
        if res.unlimited is not None and value == res.unlimited:
            return "max"
        if resource == "cpu.shares":
            return str(WEIGHT_MAPPINGS[self.weight_mapping][0](value))
        return str(res.to_v2(value) if res.to_v2 else value)

    def decode(self, resource: str, text: str) -> int | str:
        res = RESOURCES[resource]
        text = text.strip()
        if res.lo is None:
            return text
        if self.version is Version.V2:
            if resource in ("cpu.cfs_quota_us", "cpu.cfs_period_us"):
                quota, _, period = text.partition(" ")
                text = quota if resource == "cpu.cfs_quota_us" else period
            if resource == "blkio.weight" and text.startswith("default "):
                text = text.split()[1]
            if text == "max":
                return -1  # every unlimited value is -1 (memory.low's "max" too)
            v = int(text)
            if resource == "cpu.shares":
                return WEIGHT_MAPPINGS[self.weight_mapping][1](v)
            return res.from_v2(v) if res.from_v2 else v
        if text == "max" and resource in MAX_WORD_V1:
            return -1
        return int(text)

    def matches(self, group: str, resource: str, value: int | str, period: int | None = None) -> bool | None:
        """Does the file already hold ``value``? None when the cgroup or file is gone. Compared in
        the file's own terms, so kernel normalisation (cpu lists, page rounding, "max", the
        v1 "unlimited" number) is not mistaken for drift."""
        try:
            path = self._file(group, resource)
            text = _read(path)
        except (FileNotFoundError, KeyError, NotADirectoryError):
            return None
        want = self.encode(resource, value, period)
        if text == want:
            return True
        if resource in ("cpuset.cpus", "cpuset.mems"):
            try:
                return parse_cpulist(text) == parse_cpulist(want)
            except ValueError:
                return False
        if resource in DEVICE_RULES:
            dev, _, kv = want.partition(" ")
            return any(ln.split(" ")[0] == dev and kv in ln.split(" ")[1:] for ln in text.splitlines())
        if resource == "cpu.shares" and text == IDLE_SHARES_V1 and self.version is Version.V1:
            return _idle_flag(path)  # an idle group's weight: in place, not drift
        res = RESOURCES[resource]
        assert isinstance(value, int)  # the string resources were all compared above
        try:
            have = self.decode(resource, text)
        except ValueError:
            return False
        if res.unlimited is not None and value == res.unlimited:
            return have == res.unlimited or (isinstance(have, int) and have >= 2**62)
        if resource in PAGE_ROUNDED:
            return isinstance(have, int) and have == value // 4096 * 4096
        if self.version is Version.V2 and resource == "cpu.shares":
            # either runtime's conversion of the value is the value: not drift to "repair";
            # nor is an idle group's weight (see IDLE_WEIGHT)
            return text.strip() in {IDLE_WEIGHT, *(str(to(value)) for to, _ in WEIGHT_MAPPINGS.values())}
        if self.version is Version.V2 and res.to_v2 is not None:
            return isinstance(have, int) and res.to_v2(have) == res.to_v2(value)
        return have == value

    @property
    def hierarchy(self) -> Version:
        """The tree's version (detected at construction when not given)."""
        assert self.version is not None
        return self.version

    def unified_entry(self, resource: str, value: int | str) -> tuple[str, str] | None:
        """The OCI ``unified`` map's entry (v2 file, encoded value) that sets ``resource`` at
        creation; None where there is none (cgroup v1, or no v2 file)."""
        res = RESOURCES.get(resource)
        if self.version is not Version.V2 or res is None or res.v2 is None:
            return None
        return res.v2, self.encode(resource, value)

    @property
    def weight_to_learn(self) -> bool:
        """cgroup v2 and the runtime's cpu.shares -> cpu.weight mapping not learned yet."""
        return self.version is Version.V2 and not self.weight_learned

    def learn_weight_mapping(self, group: str, shares: int) -> str | None:
        """cgroup v2: which cpu.shares -> cpu.weight mapping the runtime used, from a container
        it just created with ``shares`` (StartContainer: nobody else has written its weight
        yet). Learned once, from the first container whose shares the mappings tell apart;
        returns the mapping when this call learned it, else None."""
        if self.version is not Version.V2 or self.weight_learned:
            return None
        found = {name for name, (to, _) in WEIGHT_MAPPINGS.items() if to(shares) == self._weight(group)}
        if len(found) != 1:
            return None  # unreadable, or the mappings agree on these shares (2, 262144, ...)
        self.weight_mapping, self.weight_learned = found.pop(), True
        return self.weight_mapping

    def _weight(self, group: str) -> int | None:
        try:
            return int(_read(self._file(group, "cpu.shares")))
        except (OSError, KeyError, ValueError):
            return None

    def read(self, group: str, resource: str) -> int | str | None:
        try:
            return self.decode(resource, _read(self._file(group, resource)))
        except (FileNotFoundError, KeyError):
            return None

    def write(
        self, group: str, resource: str, value: int | str, *, period: int | None = None, force: bool = False
    ) -> WriteOutcome:
        """Write one value (validated first; raises InvalidValue). Skips unchanged values."""
        text = self.encode(resource, value, period)
        if resource in self.unsupported:
            return WriteOutcome("unsupported")
        try:
            path = self.file(group, resource)
        except KeyError as exc:
            self._mark_unsupported(resource, str(exc.args[0]))
            return WriteOutcome("unsupported")
        if not path.parent.is_dir():
            return WriteOutcome("missing", errno.ENOENT, f"cgroup {group} does not exist")
        if not force:
            try:
                if path.read_text().strip() == text:
                    return WriteOutcome("unchanged")
            except FileNotFoundError:
                pass
            except OSError:
                pass  # write-only or racing: just write
        try:
            fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
        except FileNotFoundError:
            self._mark_unsupported(resource, f"{path.name} does not exist on this kernel")
            return WriteOutcome("unsupported", errno.ENOENT)
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # the file is a symbolic link: never followed
                raise PermissionError(f"refusing {path}: a symbolic link") from exc
            raise
        try:
            os.write(fd, text.encode())
        except OSError as exc:
            # The kernel refused: either it lacks the feature or the value is out of its own
            # bounds. Re-probe the feature at the top of the hierarchy before deciding.
            if exc.errno == errno.EINVAL and self._idle_weight(resource, path):
                return WriteOutcome("unchanged", exc.errno, f"{path.parent}: cpu.idle=1, the kernel keeps its weight")
            refused = exc.errno in (errno.EINVAL, errno.EPERM, errno.EACCES, errno.EOPNOTSUPP)
            if refused and not self.supported(resource):
                self._mark_unsupported(resource, f"{exc.strerror} writing {path.name}")
                return WriteOutcome("unsupported", exc.errno or 0)
            return WriteOutcome("rejected", exc.errno or 0, f"{exc.strerror} writing {text!r} to {path}")
        finally:
            os.close(fd)
        return WriteOutcome("written")

    def fit_descendants(self, group: str, quota: int, period: int | None = None) -> list[tuple[str, int, int]]:
        """Make room for ``group`` to take ``quota`` per ``period`` (its own period when None).

        cgroup v1 refuses a group's CFS bandwidth below any descendant's, at any depth, so one
        group under BE's that the agent does not hold (a pod's group left behind, a sub-group a
        runtime made) would make every cut of BE's group fail. Every descendant above the new
        bandwidth is lowered to it first, deepest first, each at its own period (never under the
        kernel's 1 ms; its burst first when that is above the new quota). cgroup v2 has no such
        rule, a lift (-1) needs no room, and a quota under 1 ms is the kernel's to refuse: nothing
        is done. Returns (descendant, old quota, new quota) for each one lowered; one that cannot
        be lowered is left for the group's own write to report."""
        if self.version is not Version.V1 or quota < MIN_QUOTA_US:
            return []
        top = self._dir("cpu", group)
        base = self._path("cpu")
        lowered: list[tuple[str, int, int]] = []
        for d, _, _ in os.walk(top, topdown=False):  # deepest first; no links followed
            if d == top:
                break  # the group itself comes last: a leaf (a container's group) costs one listing
            if period is None:  # read once, and only for a group that has descendants
                period = cfs_period(self.read(group, "cpu.cfs_period_us"))
            try:
                old = int(_read(f"{d}/cpu.cfs_quota_us"))
                new = max(MIN_QUOTA_US, quota * int(_read(f"{d}/cpu.cfs_period_us")) // period)
                if new >= old:  # unlimited (-1), or within the new bandwidth already
                    continue
                with contextlib.suppress(FileNotFoundError, ValueError):  # a kernel without burst
                    if int(_read(f"{d}/cpu.cfs_burst_us")) > new:
                        _write(f"{d}/cpu.cfs_burst_us", new)
                _write(f"{d}/cpu.cfs_quota_us", new)
            except (OSError, ValueError):
                continue  # gone meanwhile, unreadable, or refused
            lowered.append((os.path.relpath(d, base), old, new))
        return lowered

    def _idle_weight(self, resource: str, path: Path) -> bool:
        """Is ``path`` the weight of an idle group (the kernel refuses any weight written there)?"""
        if resource != "cpu.shares":
            return False
        if self.version is Version.V1:
            return _idle_flag(path)
        try:
            return _read(path) == IDLE_WEIGHT
        except OSError:
            return False

    def supported(self, resource: str) -> bool:
        """Does the kernel have ``resource``'s file (probed at the top of its hierarchy)?"""
        res = RESOURCES[resource]
        if self.version is Version.V1:
            if res.v1 is None:
                return False
            top = self.root / res.v1[0]
            if (top / res.v1[1]).exists():
                return True
            child = _first_child(top)  # the root group has no pids.max: look one level down
            return child is not None and (child / res.v1[1]).exists()
        if res.v2 is None:
            return False
        # v2 has no cpu.max/memory.max at the root: look one level down.
        probe = _first_child(self.root)
        if probe is not None:
            return (probe / res.v2).exists()
        if self._child_files is None:
            self._child_files = _probe_child(self.root)
        return res.v2 in self._child_files

    def pods_roots(self) -> list[str]:
        """The kubelet's pods groups in this tree: ``kubepods`` (cgroupfs driver) or
        ``kubepods.slice`` (systemd) at the top, or one level down when the kubelet has a
        ``cgroupRoot`` (kind's ``/kubelet``: ``kubelet/kubepods`` or
        ``kubelet.slice/kubelet-kubepods.slice``). Empty when the kubelet has made none yet."""
        top = self.root / "cpu" if self.version is Version.V1 else self.root
        found = [name for name in ("kubepods", "kubepods.slice") if (top / name).is_dir()]
        if found:
            return found
        try:
            parents = sorted(p.name for p in top.iterdir() if p.is_dir())
        except OSError:
            return []
        for parent in parents:
            stem = parent.removesuffix(".slice")
            name = f"{stem}-kubepods.slice" if parent.endswith(".slice") else "kubepods"
            if (top / parent / name).is_dir():
                found.append(f"{parent}/{name}")
        return found

    def _mark_unsupported(self, resource: str, why: str) -> None:
        if resource not in self.unsupported:
            self.unsupported.add(resource)
            if self.on_unsupported is not None:
                self.on_unsupported(resource, why)


def _idle_flag(weight_file: str | Path) -> bool:
    """Does the group of this (v1) ``cpu.shares`` file have ``cpu.idle`` 1 beside it?"""
    try:
        return _read(os.path.join(os.path.dirname(weight_file), "cpu.idle")) == "1"
    except OSError:
        return False


def _write(path: str, value: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
    try:
        os.write(fd, str(value).encode())
    finally:
        os.close(fd)


def _read(path: str | Path) -> str:
    """A small kernel file, without the text-IO layers (the reconciler reads thousands)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        return os.read(fd, 65536).decode().strip()
    finally:
        os.close(fd)


def detect_version(root: Path) -> Version:
    """v2 when the root is a unified hierarchy with controllers; v1 (incl. hybrid) otherwise."""
    ctl = root / "cgroup.controllers"
    if ctl.exists() and ctl.read_text().split():
        return Version.V2
    return Version.V1


def _probe_child(root: Path) -> frozenset[str]:
    """The files a new group gets on a v2 tree that has no group yet (a fresh node with the
    cgroupfs driver: found on the real kernel, where the agent then took every v2 file for
    missing): a transient group made under the root, listed and removed."""
    probe = root / f"nriplugin-probe-{os.getpid()}"
    try:
        probe.mkdir()
    except FileExistsError:
        pass
    except OSError:
        return frozenset()
    try:
        return frozenset(p.name for p in probe.iterdir())
    except OSError:
        return frozenset()
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()


def _first_child(root: Path) -> Path | None:
    for name in ("kubepods.slice", "kubepods", "system.slice"):
        if (root / name).is_dir():
            return root / name
    try:
        return next((p for p in sorted(root.iterdir()) if p.is_dir()), None)
    except OSError:
        return None
