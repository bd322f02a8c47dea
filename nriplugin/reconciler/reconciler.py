"""Drift repair. The desired values come from the plugin's feature pipeline (the same
``intent()`` the hooks use); this module only compares files with them and writes back.

Events: inotify on each managed cgroup directory (one instance, read from the event loop, no
threads) tells us within a millisecond that a file changed; we re-read it and repair if it
differs (our own writes read back as equal, so they are not drift). New directories are seen
too: under the pod roots (``kubepods``...) and in tracked pods, a new pod or container cgroup
is either one we expect (tracked before its directory existed: converged at once) or unknown
(reported to ``on_new_dir``, which asks the runtime what it is). A periodic full pass is the
safety net. A file that keeps being reverted by someone else is a fight: repairs back off
exponentially and the conflict is reported, until the policy changes or the other writer stops.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..kernel import paths
from ..kernel.cgroup import RESOURCES, Cgroups, InvalidValue
from ..kernel.inotify import IN_CREATE, IN_DELETE, IN_IGNORED, IN_ISDIR, IN_MODIFY, IN_Q_OVERFLOW, Inotify
from ..nri import api_pb2 as api

log = logging.getLogger("nriplugin.reconciler")

FIGHT_WINDOW = 10.0  # seconds
FIGHT_REPAIRS = 3  # repairs of one file within the window that make it a fight
BACKOFF_MIN, BACKOFF_MAX = 1.0, 300.0
# A container's cgroup (cgroupfs: its 64-hex id; systemd: a .scope), as opposed to a QoS or pod
# directory, whose new children we want to see as well.
_CONTAINER_DIR = re.compile(r"^([0-9a-f]{64}|.*\.scope)$")
# Directories whose children we follow. cgroupfs (kernfs) sends no IN_IGNORED when a watched
# directory is removed, so removals are seen on the parent (IN_DELETE) and the watch dropped.
CHILDREN = IN_CREATE | IN_DELETE


@dataclass
class Entry:
    """One managed cgroup: a container (or a pod when ``container`` is None)."""

    pod: api.PodSandbox
    container: api.Container | None
    group: str  # relative cgroup path
    cache: tuple[object, dict[str, int | str]] | None = None  # (state version, desired values)
    since: float = field(default_factory=time.monotonic)  # when it was tracked
    # Created but not started: runc may be building its cgroup right now, and it reads back
    # what it writes (cpu.shares): touching the files then fails the container's start. Left
    # alone until the runtime says the task exists (StartContainer, or CRI shows it running).
    pending: bool = False


@dataclass
class FileState:
    repairs: list[float] = field(default_factory=list)
    backoff: float = 0.0
    blocked_until: float = 0.0
    conflicts: int = 0


class Observer(Protocol):
    """What the reconciler reports (metrics.ReconcilerMetrics implements it)."""

    def drift(self, resource: str) -> None: ...
    def repaired(self, resource: str, seconds: float) -> None: ...
    def write_error(self, errno: int) -> None: ...
    def conflict(self, resource: str, path: str) -> None: ...
    def pass_done(self, seconds: float, cpu_seconds: float, entries: int) -> None: ...


class _Quiet:
    def drift(self, resource: str) -> None:
        pass

    def repaired(self, resource: str, seconds: float) -> None:
        pass

    def write_error(self, errno: int) -> None:
        pass

    def conflict(self, resource: str, path: str) -> None:
        pass

    def pass_done(self, seconds: float, cpu_seconds: float, entries: int) -> None:
        pass


class Reconciler:
    def __init__(
        self,
        intent: Callable[[api.PodSandbox, api.Container | None], Any],
        cgroups: Cgroups,
        observer: Observer | None = None,
        resync_period: float = 60.0,
        watch: bool = True,
        version: Callable[[], object] = lambda: None,
        roots: Sequence[str] = (),
        on_new_dir: Callable[[str], None] | None = None,
    ) -> None:
        self.intent = intent
        self.version = version  # desired values are cached per entry until this changes
        self.cgroups = cgroups
        self.observer: Observer = observer or _Quiet()
        self.resync_period = resync_period
        self.entries: dict[str, Entry] = {}  # key: container id, or "pod:<id>"
        self.by_dir: dict[str, str] = {}  # watched directory -> entry key
        self.files: dict[str, FileState] = {}  # file path -> fight state
        self.loop: asyncio.AbstractEventLoop | None = None
        self._watch_enabled = watch
        self._inotify: Inotify | None = None
        self._watches: dict[str, int] = {}  # directory -> inotify watch descriptor
        self._masks: dict[str, int] = {}  # directory -> its watch mask
        self._task: asyncio.Task[None] | None = None
        self.passes = 0
        # Relative cgroup paths under which new pod/container directories are looked for.
        self.roots = [r.strip("/") for r in roots if r.strip("/")]
        self.on_new_dir = on_new_dir
        self._new_dirs: dict[str, int] = {}  # directories watched for new children -> depth left
        self._awaiting: dict[str, set[str]] = {}  # directory above pod roots -> those roots

    # inventory -------------------------------------------------------------------------------

    def track(self, pod: api.PodSandbox, container: api.Container | None, pending: bool = False) -> None:
        try:
            if container is None:
                key, group = f"pod:{pod.id}", paths.pod_dir(pod.linux.cgroup_parent)
            else:
                key = container.id
                group = paths.container_dir(container.linux.cgroups_path, pod.linux.cgroup_parent, container.id)
        except paths.BadCgroupPath as exc:
            log.warning("not tracking %s/%s: %s", pod.namespace, pod.name, exc)
            return
        self.entries[key] = Entry(pod, container, group, pending=pending and container is not None)
        if self.entries[key].pending:
            for d in self._dirs(group):
                self.by_dir[str(d)] = key
        else:
            self._watch_entry(key)

    def activate(self, key: str) -> int:
        """A pending container's task exists now: watch it and converge it; returns repairs."""
        entry = self.entries.get(key)
        if entry is None:
            return 0
        entry.pending = False
        self._watch_entry(key)
        return self.check(key)

    def _watch_entry(self, key: str) -> None:
        entry = self.entries[key]
        for i, d in enumerate(self._dirs(entry.group)):
            self.by_dir[str(d)] = key
            # the first hierarchy's pod directory also reports new container directories
            self._add_watch(d, IN_MODIFY | CHILDREN if i == 0 and entry.container is None else IN_MODIFY)

    def forget(self, key: str) -> None:
        entry = self.entries.pop(key, None)
        if entry is None:
            return
        for d in self._dirs(entry.group):
            self.by_dir.pop(str(d), None)
            self._remove_watch(d)

    def _dirs(self, group: str) -> list[Path]:
        ctrls = ("cpu", "cpuset", "memory", "blkio") if self.cgroups.version == 1 else ("",)
        out = []
        for c in ctrls:
            try:
                out.append(self.cgroups.group_dir(group, c) if c else self.cgroups.group_dir(group))
            except PermissionError:
                continue
        return out

    # desired vs actual -----------------------------------------------------------------------

    def desired(self, entry: Entry) -> dict[str, int | str]:
        v = self.version()
        if entry.cache is not None and entry.cache[0] == v:
            return entry.cache[1]
        intent = self.intent(entry.pod, entry.container)
        want = {} if intent is None else {k: x for k, x in intent.values.items() if k in RESOURCES or " " in k}
        entry.cache = (v, want)
        return want

    def check(self, key: str, only: str | None = None, event_time: float | None = None) -> int:
        """Compare one entry's files with its desired values and repair; returns repairs made."""
        entry = self.entries.get(key)
        if entry is None or entry.pending:
            return 0
        try:
            want = self.desired(entry)
        except Exception as exc:
            log.debug("no desired state for %s: %s", key, exc)
            return 0
        period = want.get("cpu.cfs_period_us")
        repairs = 0
        for name, value in want.items():
            resource, _, device = name.partition(" ")
            if only is not None and resource != only:
                continue
            v: int | str = f"{device} {value}" if device else value
            try:
                ok = self.cgroups.matches(entry.group, resource, v, period if isinstance(period, int) else None)
            except InvalidValue:
                continue
            if ok is None or ok:
                continue  # gone (the runtime will tell us) or right
            path = str(self.cgroups.file(entry.group, resource))
            self.observer.drift(resource)
            if not self._may_repair(path, resource):
                continue
            res = self.cgroups.write(
                entry.group, resource, v, period=period if isinstance(period, int) else None, force=True
            )
            if res.status == "written":
                repairs += 1
                t = event_time if event_time is not None else time.perf_counter()
                self.observer.repaired(resource, time.perf_counter() - t)
            elif res.status == "rejected":
                self.observer.write_error(res.errno)
        return repairs

    def _may_repair(self, path: str, resource: str) -> bool:
        now = time.monotonic()
        st = self.files.setdefault(path, FileState())
        if now < st.blocked_until:
            return False
        st.repairs = [t for t in st.repairs if now - t < FIGHT_WINDOW]
        st.repairs.append(now)
        if len(st.repairs) > FIGHT_REPAIRS:
            st.backoff = min(BACKOFF_MAX, max(BACKOFF_MIN, st.backoff * 2))
            st.blocked_until = now + st.backoff
            st.conflicts += 1
            self.observer.conflict(resource, path)
            log.warning(
                "another writer keeps reverting %s; backing off %.0f s",
                path,
                st.backoff,
                extra={"path": path, "resource": resource, "backoff_s": st.backoff},
            )
        return True

    def policy_changed(self) -> None:
        """A new policy: forget backoffs and re-apply everything now."""
        self.files.clear()
        self.full_pass()

    def full_pass(self) -> int:
        t0, c0 = time.perf_counter(), time.process_time()
        repairs = sum(self.check(k) for k in list(self.entries))
        self.passes += 1
        self.observer.pass_done(time.perf_counter() - t0, time.process_time() - c0, len(self.entries))
        return repairs

    # event plumbing --------------------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        if self._watch_enabled:
            self._inotify = Inotify()
            loop.add_reader(self._inotify.fd, self._on_readable)
            for key, entry in list(self.entries.items()):
                if not entry.pending:
                    self._watch_entry(key)
            for root in self.roots:
                self._watch_root(root)
        self._task = loop.create_task(self._resync())

    def _watch_root(self, root: str) -> bool:
        """Watch a pod root's tree, and every existing directory above it for its children, so
        that the root's appearance (the agent started before kubelet made it) and its removal
        are both seen. Returns whether the tree was newly watched."""
        try:
            d = self.cgroups.group_dir(root)
            top = self.cgroups.group_dir("")
        except PermissionError as exc:
            log.warning("not watching pod root %s: %s", root, exc)
            return False
        anc = d
        while anc != top:
            anc = anc.parent
            if anc.is_dir() and root not in self._awaiting.get(str(anc), ()):
                self._awaiting.setdefault(str(anc), set()).add(root)
                self._add_watch(anc, CHILDREN)
        if str(d) in self._new_dirs or not d.is_dir():
            return False
        self._watch_tree(d, depth=2)
        return str(d) in self._new_dirs

    def _watch_tree(self, d: Path, depth: int) -> None:
        """Watch ``d`` for new directories, and its existing non-container subdirectories down
        to ``depth`` more levels (root -> QoS -> pod)."""
        if not d.is_dir() or not self._add_watch(d, CHILDREN):
            return
        self._new_dirs[str(d)] = depth
        if depth > 0:
            for child in d.iterdir():
                if child.is_dir() and not _CONTAINER_DIR.match(child.name):
                    self._watch_tree(child, depth - 1)

    async def _resync(self) -> None:
        while True:
            await asyncio.sleep(self.resync_period)
            self.full_pass()

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._inotify is not None:
            if self.loop is not None:
                self.loop.remove_reader(self._inotify.fd)
            self._inotify.close()
            self._inotify = None
        self._watches.clear()
        self._masks.clear()
        self._new_dirs.clear()
        self._awaiting.clear()

    def _add_watch(self, d: Path, mask: int = IN_MODIFY) -> bool:
        """Watch ``d`` (IN_MODIFY: our own reads of thousands of files wake nothing). A watch
        is one mask per directory, so a directory keeps what each of its roles needs: a tracked
        cgroup's IN_MODIFY, a followed directory's CHILDREN."""
        if self._inotify is None:
            return False
        path = str(d)
        if path in self._new_dirs or path in self._awaiting:
            mask |= CHILDREN
        if path in self.by_dir:
            mask |= IN_MODIFY
        wd = self._watches.get(path)
        if wd is not None and wd in self._inotify.paths and mask == self._masks.get(path):
            return True
        try:
            self._watches[path] = self._inotify.add(path, mask)
            self._masks[path] = mask
            return True
        except OSError as exc:  # not there (yet, or any more): its IN_CREATE or a pass will do
            log.debug("cannot watch %s: %s", d, exc)
            return False

    def _remove_watch(self, d: Path) -> None:
        if str(d) in self._new_dirs or str(d) in self._awaiting:
            return  # a pod root or QoS directory: still wanted for new children
        self._masks.pop(str(d), None)
        wd = self._watches.pop(str(d), None)
        if wd is not None and self._inotify is not None:
            self._inotify.remove(wd)

    def _on_readable(self) -> None:
        assert self._inotify is not None
        now = time.perf_counter()
        events = self._inotify.read()
        if any(mask & IN_Q_OVERFLOW for _, _, mask in events):
            log.warning("inotify queue overflowed: running a full pass")
            self.full_pass()
            if self.on_new_dir is not None:  # new directories may have been missed too
                self.on_new_dir("")
            return
        for d, name, mask in events:
            if mask & IN_IGNORED:  # the kernel dropped the watch (not on cgroupfs: see CHILDREN)
                self._dropped(d)
            elif mask & IN_DELETE:
                if mask & IN_ISDIR:
                    self._dropped(f"{d}/{name}")
            elif mask & IN_CREATE:
                if mask & IN_ISDIR:
                    self._on_new_dir(Path(d) / name)
            else:
                self._on_change(f"{d}/{name}", now)

    def _on_new_dir(self, d: Path) -> None:
        for root in list(self._awaiting.get(str(d.parent), ())):  # a step towards a pod root
            if self._watch_root(root) and self.on_new_dir is not None:
                self.on_new_dir(root)  # what it holds by now was made before our watch
        key = self.by_dir.get(str(d))
        if key is not None and key in self.entries:  # tracked before its cgroup existed
            if self.entries[key].pending:
                return  # runc is building it: StartContainer or the inventory activates it
            self._watch_entry(key)
            self.check(key)
            if key.startswith("pod:"):
                self._existing_children(d)
            return
        parent_depth = self._new_dirs.get(str(d.parent))
        if parent_depth is None:
            parent = self.by_dir.get(str(d.parent), "")
            if not parent.startswith("pod:"):
                return
            parent_depth = 0  # a tracked pod's directory: its children are containers
        if not _CONTAINER_DIR.match(d.name) and parent_depth > 0:
            self._watch_tree(d, parent_depth - 1)
            self._existing_children(d)
        if self.on_new_dir is not None:
            try:
                rel = d.relative_to(self.cgroups.group_dir(""))
            except ValueError:
                return
            self.on_new_dir(str(rel))

    def _dropped(self, d: str) -> None:
        """Directory ``d`` is gone: drop its watch (a removed cgroup's watch would otherwise
        pin its inode) and wait again for a pod root that went with it."""
        self._new_dirs.pop(d, None)
        self._awaiting.pop(d, None)
        self._remove_watch(Path(d))
        for root in self.roots:  # a pod root, or a directory above one, went: wait for it again
            try:
                rd = str(self.cgroups.group_dir(root))
                if (rd == d or rd.startswith(d + "/")) and self._watch_root(root) and self.on_new_dir is not None:
                    self.on_new_dir(root)  # made again before we got here
            except PermissionError:
                continue

    def _existing_children(self, d: Path) -> None:
        """Children made before our watch on ``d`` was in place (mkdir -p, runc) raised no
        event: look at them now."""
        try:
            children = [c for c in d.iterdir() if c.is_dir()]
        except OSError:
            return
        for child in children:
            self._on_new_dir(child)

    def _on_change(self, path: str, when: float) -> None:
        p = Path(path)
        key = self.by_dir.get(str(p.parent))
        if key is None:
            return
        for resource in _BY_FILE.get(p.name, ()):
            self.check(key, only=resource, event_time=when)


def _by_file() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name, res in RESOURCES.items():
        for f in ([res.v1[1]] if res.v1 else []) + ([res.v2] if res.v2 else []):
            out.setdefault(f, []).append(name)
    return out


_BY_FILE = _by_file()
