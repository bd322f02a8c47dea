"""Drift repair. The desired values come from the desired state (features ⊕ overlays, the same
the hooks use); this module only compares files with them and writes back through the one
writer. It follows the node model (containers and pods come and go) and owns QoS-level groups
(e.g. the BE parent, where suppression writes) the same way.

Applying is not repairing: when a key's desired state changed (a new policy, an overlay set
or withdrawn, a resize, the share pool moving) its files are written and nothing is counted.
Drift is a file that differs from a desired state we had already applied.

Events: inotify on each managed cgroup directory (one instance, read from the event loop, no
threads) tells us within a millisecond that a file changed; we re-read it and repair if it
differs (our own writes read back as equal, so they are not drift). New directories are seen
too: under the pod roots (``kubepods``...) and in tracked pods, a new pod or container cgroup
is either one we expect (tracked before its directory existed: converged at once) or unknown
(reported to ``on_new_dir``, which asks the runtime what it is). A periodic full pass is the
safety net. A file that keeps being reverted by someone else is a fight: repairs back off
exponentially and the conflict is reported, until the policy changes or the other writer stops;
a repair held back by the backoff is made when the backoff ends, never dropped.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from nriplugin.intent.core import QUOTA, Setting
from nriplugin.kernel.cgroup import RESET_BY_OTHERS, RESETS, RESOURCES, Cgroups, InvalidValue
from nriplugin.kernel.inotify import IN_CREATE, IN_DELETE, IN_IGNORED, IN_ISDIR, IN_MODIFY, IN_Q_OVERFLOW, Inotify
from nriplugin.node.model import NodeModel, State
from nriplugin.node.overlays import group_key
from nriplugin.node.writer import Writer, children_first, parents_first, period_of
from nriplugin.obs.unobserved import Unobserved
from nriplugin.pacing.turns import Pacer

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
    """One managed cgroup: a container, a pod (``pod:<id>``) or a QoS-level group."""

    group: str  # relative cgroup path
    children: bool = False  # its new child directories matter (a pod: its containers)
    # Created but not started: runc may be building its cgroup right now, and it reads back
    # what it writes (cpu.shares): touching the files then fails the container's start. Left
    # alone until the runtime says the task exists (StartContainer, or CRI shows it running).
    pending: bool = False
    applied: object = None  # the desired-state generation last applied in full
    dirs: list[str] | None = None  # its directory in each hierarchy, once watched
    watched: bool = False  # its directories existed and are watched


@dataclass
class FileState:
    repairs: list[float] = field(default_factory=list)
    backoff: float = 0.0
    blocked_until: float = 0.0
    conflicts: int = 0
    retry: asyncio.TimerHandle | None = None  # the repair held back by the backoff
    refused: int = 0  # the kernel's refusals in a row (EINVAL, ...)


class Desired(Protocol):
    """Where the reconciler gets a key's settings (desired.DesiredState implements it)."""

    def settings(self, key: str) -> tuple[object, list[Setting]]: ...
    def subscribe(self, fn: Callable[[list[str]], None]) -> None: ...


class ReconcilerObserver(Protocol):
    """What the reconciler reports (metrics.ReconcilerMetrics implements it)."""

    def drift(self, resource: str) -> None: ...
    def repaired(self, resource: str, seconds: float) -> None: ...
    def write_error(self, errno: int) -> None: ...
    def conflict(self, resource: str, path: str) -> None: ...
    def pass_done(self, seconds: float, cpu_seconds: float, entries: int) -> None: ...


class Reconciler:
    def __init__(
        self,
        desired: Desired,
        writer: Writer,
        model: NodeModel | None = None,
        observer: ReconcilerObserver | None = None,
        resync_period: float = 60.0,
        watch: bool = True,
        roots: Sequence[str] = (),
        on_new_dir: Callable[[str], None] | None = None,
        pacer: Pacer | None = None,
    ) -> None:
        """``pacer``: the loop shared with the hooks (the agent's); default: no loop, the
        model's news and desired changes are applied when told (``explain``, tests)."""
        self.pacer = Pacer() if pacer is None else pacer
        self.desired = desired
        self.writer = writer
        self.cgroups: Cgroups = writer.cgroups
        self.observer: ReconcilerObserver = observer or Unobserved()
        self.resync_period = resync_period
        self.entries: dict[str, Entry] = {}  # key: container id, "pod:<id>" or "group:<path>"
        self.by_dir: dict[str, str] = {}  # watched directory -> entry key
        self.files: dict[str, FileState] = {}  # file path -> fight state
        self.loop: asyncio.AbstractEventLoop | None = None
        self._watch_enabled = watch
        self._inotify: Inotify | None = None
        self._watches: dict[str, int] = {}  # directory -> inotify watch descriptor
        self._masks: dict[str, int] = {}  # directory -> its watch mask
        self._task: asyncio.Task[None] | None = None
        self._to_apply: set[str] = set()  # keys whose desired state changed, applied soon
        self._batch: collections.deque[str] = collections.deque()  # the batch being applied, in turns
        self._batch_refused: list[str] = []  # its keys the kernel refused: tried again after the rest
        self._held_rises: list[str] = []  # its keys whose quota rises: after the first sweep
        self._rising: collections.deque[str] = collections.deque()  # the second sweep, parents first
        self._applying = False  # an _apply_pending is scheduled
        self._passes: set[asyncio.Task[int]] = set()  # chunked full passes running
        self.rejections = 0  # writes the kernel refused
        self._events: collections.deque[tuple[Callable[[str], object], str]] = collections.deque()
        self.passes = 0
        # Relative cgroup paths under which new pod/container directories are looked for.
        self.roots = [r.strip("/") for r in roots if r.strip("/")]
        self.on_new_dir = on_new_dir
        self._new_dirs: dict[str, int] = {}  # directories watched for new children -> depth left
        self._awaiting: dict[str, set[str]] = {}  # directory above pod roots -> those roots
        self.model = model
        desired.subscribe(self.desired_changed)
        if model is not None:  # track what the node model knows, as it comes and goes
            model.subscribe(self)
            for key in model:
                self.added(key)

    # inventory -------------------------------------------------------------------------------

    # The node model's events arrive on the hook path (CreateContainer, Synchronize): they
    # are queued and taken in order right after the current callback, so the hook's answer
    # never waits for watches and path checks.

    def added(self, key: str) -> None:
        self._later(self._added, key)

    def started(self, key: str, existing: bool) -> None:
        self._later(self.activate, key)

    def changed(self, key: str) -> None:
        pass  # the desired state tells us (desired_changed) when the change moves a value

    def removed(self, key: str) -> None:
        self._later(self.forget, key)

    def resynced(self) -> None:
        """After Synchronize: a full pass right after the answer (what changed while we were
        not connected converges), in chunks between which hooks are answered."""
        self._later(lambda _key: self._pass_soon(), "")

    def _pass_soon(self) -> None:
        loop = self.pacer.loop
        if loop is None:
            self.full_pass()
            return
        task = loop.create_task(self.full_pass_chunked())
        self._passes.add(task)
        task.add_done_callback(self._passes.discard)

    def _added(self, key: str) -> None:
        r = None if self.model is None else self.model.get(key)
        if r is not None and r.group is not None:
            self.track(key, r.group, pending=r.state is State.CREATED, children=r.container is None)

    def _later(self, fn: Callable[[str], object], key: str) -> None:
        first = not self._events
        self._events.append((fn, key))
        if not first:
            return
        if self.pacer.loop is None:
            self._drain()
            return
        self.pacer.soon(self._drain, True)  # in the same loop callback as the take-in that told us

    def _drain(self, in_turns: bool = False) -> None:
        """Take the queued news in order; ``in_turns`` (on the loop), a turn at a time, the
        rest right after whatever else is ready (a hook's request goes first)."""
        turn = self.pacer.turn()
        while self._events:
            fn, key = self._events.popleft()
            fn(key)
            if in_turns and self._events and turn.over():
                self.pacer.next_turn(self._drain, True)
                return

    @property
    def busy(self) -> bool:
        """News or changed keys still queued (taken a turn at a time, soon)."""
        return bool(self._events or self._to_apply or self._batch or self._rising)

    def own_group(self, path: str) -> str:
        """Own a QoS-level cgroup (e.g. the BE parent): tracked, watched and repaired like a
        container; its values are overlays. Returns its key."""
        key = group_key(path)
        if key not in self.entries:
            self.track(key, path.strip("/"))
            self.check(key)
        return key

    def track(self, key: str, group: str, pending: bool = False, children: bool = False) -> None:
        """A pending entry costs nothing until it runs: no paths, no watches (its directory
        appearing is runc's doing, and StartContainer or the inventory activates it)."""
        self.forget(key)
        self.entries[key] = Entry(group, children=children, pending=pending)
        if not pending and self._watch_entry(key):
            self.apply_soon([key])  # converged (and its values marked applied) right away

    def activate(self, key: str) -> None:
        """A pending container's task exists now: watch it and converge it (right after the
        hook's answer when there is a loop)."""
        entry = self.entries.get(key)
        if entry is None or not entry.pending:
            return
        entry.pending = False
        self._watch_entry(key)
        self.apply_soon([key])

    def _watch_entry(self, key: str) -> bool:
        """Watch an entry's directories; False when its cgroup does not exist (yet): then its
        appearance (IN_CREATE on a followed parent, or a full pass) converges it."""
        entry = self.entries[key]
        if entry.dirs is None:  # named only; checked below before anything is watched
            entry.dirs = self._dirs(entry.group, checked=False)
            for d in entry.dirs:
                self.by_dir[d] = key
        if not entry.dirs or not os.path.isdir(entry.dirs[0]):
            return False
        if self._dirs(entry.group) != entry.dirs:  # resolves outside the root: never watched
            log.warning("not watching %s: it resolves outside the cgroup root", entry.group)
            return False
        for i, d in enumerate(entry.dirs):
            # the first hierarchy's pod directory also reports new container directories
            self._add_watch(d, IN_MODIFY | CHILDREN if i == 0 and entry.children else IN_MODIFY)
        entry.watched = True
        return True

    def forget(self, key: str) -> None:
        """Let go of an entry: its watches, its files' fight state, its cached paths."""
        entry = self.entries.pop(key, None)
        if entry is None:
            return
        self._to_apply.discard(key)
        for d in entry.dirs or ():
            self.by_dir.pop(str(d), None)
            self._remove_watch(d)
        if self.files and entry.dirs:
            prefixes = tuple(f"{d}/" for d in entry.dirs)
            for path in [p for p in self.files if p.startswith(prefixes)]:
                st = self.files.pop(path)
                if st.retry is not None:
                    st.retry.cancel()
        self.cgroups.forget(entry.group)

    def _dirs(self, group: str, checked: bool = True) -> list[str]:
        ctrls = self.cgroups.hierarchy.controllers
        out = []
        for c in ctrls:
            try:
                out.append(
                    self.cgroups.group_path(group, c, checked) if c else self.cgroups.group_path(group, "", checked)
                )
            except PermissionError:
                continue
        return out

    # desired vs actual -----------------------------------------------------------------------

    def apply_soon(self, keys: list[str]) -> None:
        """The desired state of ``keys`` changed: write them right after the current callback
        (a hook's answer goes first), batched. Only entries whose cgroups are there: a pending
        one is converged when it starts, one not there yet when it appears (its IN_CREATE, or a
        full pass) — a class-wide change on a node of thousands touches only what exists."""
        entries = self.entries
        self._to_apply.update(k for k in keys if (e := entries.get(k)) is not None and e.watched and not e.pending)
        if self._applying or not self._to_apply:
            return
        loop = self.pacer.loop
        if loop is None:
            self._apply_pending()
            return
        self._applying = True
        loop.call_soon(self._apply_pending)

    def flush(self, rounds: int = 8) -> None:
        """Apply everything pending now, to the end, off turns (the agent's way out: nothing
        runs after it). A batch may make more (a raised group lets its class's ceiling rise):
        applied too, up to ``rounds`` batches."""
        for _ in range(rounds):
            if not (self._to_apply or self._batch or self._rising):
                return
            self._apply_pending(in_turns=False)

    def _apply_pending(self, in_turns: bool | None = None) -> None:
        """Apply a batch in the order the kernel accepts (``node/writer.py``): cgroup v1 refuses
        a child's CFS quota above its parent's, so keys go deepest first, and a key whose quota
        rises waits for a second sweep, parents first. What was still refused (someone else
        moved a value meanwhile) is tried again after the rest of the batch. On the loop, a
        turn at a time."""
        self._applying = False
        if in_turns is None:
            in_turns = self.pacer.loop is not None
        if not self._batch and not self._rising:
            self._batch = collections.deque(children_first(self._to_apply, self._group_of))
            self._to_apply = set()
        turn = self.pacer.turn()
        while self._batch or self._rising:
            if self._batch:
                key = self._batch.popleft()
                if self._refused_in(key, self._held_rises):
                    self._batch_refused.append(key)
                if not self._batch:  # the first sweep is done: the rises, parents first
                    self._rising = collections.deque(parents_first(self._held_rises, self._group_of))
                    self._held_rises = []
            else:
                key = self._rising.popleft()
                if self._refused_in(key):
                    self._batch_refused.append(key)
            if in_turns and (self._batch or self._rising) and turn.over():
                self._applying = True
                self.pacer.next_turn(self._apply_pending)
                return
        refused, self._batch_refused = self._batch_refused, []
        for key in [k for k in refused if self._refused_in(k)]:  # after the rest of the batch
            self.check(key)  # refused again: it waits out a backoff now
        if self._to_apply:  # came while the batch was applied
            if in_turns:
                self._applying = True
                self.pacer.next_turn(self._apply_pending)
            else:
                self._apply_pending()

    def _group_of(self, key: str) -> str:
        entry = self.entries.get(key)
        return "" if entry is None else entry.group

    def _refused_in(self, key: str, rising: list[str] | None = None) -> bool:
        before = self.rejections
        self.check(key, retrying=True, rising=rising)
        return self.rejections > before

    def check(
        self,
        key: str,
        only: str | None = None,
        event_time: float | None = None,
        retrying: bool = False,
        rising: list[str] | None = None,
    ) -> int:
        """Compare one entry's files with its desired values and write what differs; returns
        the writes made. A difference from a desired state already applied is drift (counted,
        subject to fight detection); one from a new desired state is applied quietly.
        ``rising`` (a batch's first sweep): a key whose CFS quota would rise writes nothing
        now and is added to it, for the sweep that raises parents first."""
        entry = self.entries.get(key)
        if entry is None or entry.pending:
            return 0
        if not entry.watched and not self._watch_entry(key):
            return 0  # its cgroup is not there (yet)
        try:
            gen, want = self.desired.settings(key)
        except Exception as exc:
            log.debug("no desired state for %s: %s", key, exc)
            return 0
        applying = gen != entry.applied
        period = period_of(want)
        wrong: list[Setting] = []
        paths: dict[tuple[str, str], str] = {}  # the files of the settings that differ
        complete = True
        reset: set[str] = set()  # what the writes make the kernel reset (RESETS)
        in_place: list[Setting] = []  # of those, the ones that read as wanted
        for s in want:
            if only is not None and s.resource != only:
                continue
            try:
                ok = self.cgroups.matches(entry.group, s.resource, s.file_value, period)
            except InvalidValue:
                continue
            if ok is None:
                complete = False  # gone (the runtime will tell us), or not there yet
                continue
            if ok:
                if s.resource in RESET_BY_OTHERS:
                    in_place.append(s)
                continue
            path = paths[s.key] = str(self.cgroups.file(entry.group, s.resource))
            if self._refused_until(path, retrying):
                complete = False
                continue
            if not applying:
                self.observer.drift(s.resource)
                if not self._may_repair(path, s.resource, key):
                    continue
            wrong.append(s)
            reset.update(RESETS.get(s.resource, ()))
        for s in in_place:  # the kernel moves these when an earlier write lands: the writer's
            if s.resource in reset:  # order (by key) puts them after it
                paths[s.key] = str(self.cgroups.file(entry.group, s.resource))
                wrong.append(s)
        quota_moves = applying and any(s.resource == QUOTA for s in wrong)
        if rising is not None and quota_moves and self.writer.quota_rises(entry.group, want):
            rising.append(key)
            return 0
        writes, written = self._write(entry.group, key, wrong, paths, period, applying, retrying, event_time)
        if only is None and complete and written:
            entry.applied = gen
        return writes

    def _write(
        self,
        group: str,
        key: str,
        wrong: list[Setting],
        paths: dict[tuple[str, str], str],
        period: int | None,
        applying: bool,
        retrying: bool,
        event_time: float | None,
    ) -> tuple[int, bool]:
        """Write the settings that differ; returns the writes made and whether none was refused."""
        writes, complete = 0, True
        for s, res in self.writer.apply(group, wrong, key, period=period, force=True):
            if res.status == "written":
                writes += 1
                st = self.files.get(paths[s.key])
                if st is not None:
                    st.refused = 0
                if not applying:
                    t = event_time if event_time is not None else time.perf_counter()
                    self.observer.repaired(s.resource, time.perf_counter() - t)
            elif res.status == "rejected":
                self.observer.write_error(res.errno)
                self._refused(paths[s.key], key, s.resource, retrying)
                complete = False
            elif res.status == "held":  # applied when what it waits for moves (the entry changes)
                complete = False
        return writes, complete

    def _refused(self, path: str, key: str, resource: str, retrying: bool) -> None:
        """The kernel refused a write. Within a batch it is tried again after the rest;
        otherwise it waits, 1 s doubling to 5 min, and is tried again then: never a loop (a
        refused write still raises IN_MODIFY on the file, which would call the check again)."""
        self.rejections += 1
        if retrying:
            return
        now = time.monotonic()
        st = self.files.setdefault(path, FileState())
        st.refused += 1
        st.backoff = min(BACKOFF_MAX, max(BACKOFF_MIN, st.backoff * 2))
        st.blocked_until = now + st.backoff
        if st.retry is None and self.loop is not None:
            st.retry = self.loop.call_later(st.backoff, self._retry, path, key, resource)

    def _refused_until(self, path: str, retrying: bool) -> bool:
        """Is this file waiting out a refusal? (A batch retry is not held back.)"""
        st = self.files.get(path)
        return not retrying and st is not None and st.refused > 0 and time.monotonic() < st.blocked_until

    def _may_repair(self, path: str, resource: str, key: str) -> bool:
        now = time.monotonic()
        st = self.files.setdefault(path, FileState())
        if now < st.blocked_until:
            # Held back, not dropped: looked at again when the backoff ends.
            if st.retry is None and self.loop is not None:
                st.retry = self.loop.call_later(st.blocked_until - now, self._retry, path, key, resource)
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

    def _retry(self, path: str, key: str, resource: str) -> None:
        st = self.files.get(path)
        if st is not None:
            st.retry = None
        self.check(key, only=resource)

    def desired_changed(self, keys: list[str]) -> None:
        """The desired state's subscriber: apply what changed. A change to every key (a new
        policy) forgets fight backoffs too: the new values go out at once."""
        if len(keys) >= len(self.entries) and self.entries:
            self._forget_backoffs()
        self.apply_soon(keys)

    def policy_changed(self) -> None:
        """A new policy: forget backoffs and re-apply everything now."""
        self._forget_backoffs()
        self.full_pass()

    def _forget_backoffs(self) -> None:
        for st in self.files.values():
            if st.retry is not None:
                st.retry.cancel()
        self.files.clear()

    def full_pass(self) -> int:
        t0, c0 = time.perf_counter(), time.process_time()
        repairs = sum(self.check(k) for k in list(self.entries))
        self.passes += 1
        self.observer.pass_done(time.perf_counter() - t0, time.process_time() - c0, len(self.entries))
        return repairs

    async def full_pass_chunked(self) -> int:
        """:meth:`full_pass` a turn at a time, giving the loop back between turns. Its
        figures are the turns' own time (what the pass costs), not the waits between."""
        wall = cpu = 0.0
        repairs = 0
        turn = self.pacer.turn()
        t0, c0 = time.perf_counter(), time.process_time()
        for key in list(self.entries):
            repairs += self.check(key)
            if turn.over():
                wall += time.perf_counter() - t0
                cpu += time.process_time() - c0
                await self.pacer.give_way()
                turn.restart()
                t0, c0 = time.perf_counter(), time.process_time()
        wall += time.perf_counter() - t0
        cpu += time.process_time() - c0
        self.passes += 1
        self.observer.pass_done(wall, cpu, len(self.entries))
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
            await self.full_pass_chunked()

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for task in self._passes:
            task.cancel()
        for st in self.files.values():
            if st.retry is not None:
                st.retry.cancel()
                st.retry = None
        if self._inotify is not None:
            if self.loop is not None:
                self.loop.remove_reader(self._inotify.fd)
            self._inotify.close()
            self._inotify = None
        self._watches.clear()
        self._masks.clear()
        self._new_dirs.clear()
        self._awaiting.clear()

    def _add_watch(self, d: str | Path, mask: int = IN_MODIFY) -> bool:
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

    def _remove_watch(self, d: str | Path) -> None:
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
            if self.entries[key].children:
                self._existing_children(d)
            return
        parent_depth = self._new_dirs.get(str(d.parent))
        if parent_depth is None:
            parent = self.entries.get(self.by_dir.get(str(d.parent), ""))
            if parent is None or not parent.children:
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
