"""The rule cache: the current validated policy with a version, swapped atomically; a bad new
policy is rejected with a clear error and the last good one stays. Hot reload of the policy
file (inotify, through symlink swaps such as a ConfigMap's) feeds it."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import ValidationError

from nriplugin.kernel.inotify import (
    IN_CLOSE_WRITE,
    IN_CREATE,
    IN_DELETE,
    IN_IGNORED,
    IN_MODIFY,
    IN_MOVED_FROM,
    IN_MOVED_TO,
    IN_Q_OVERFLOW,
    Inotify,
)
from nriplugin.policy.document import from_document
from nriplugin.policy.model import NodeSLOError, Policy

log = logging.getLogger("nriplugin.policy")
MAX_POLICY_BYTES = 1 << 20


class PolicyError(ValueError):
    """A policy that cannot be used; the message names the field and the bad value."""


@dataclass(frozen=True)
class Versioned:
    version: int
    policy: Policy
    digest: str
    source: str


def describe(exc: ValidationError) -> str:
    parts = []
    for e in exc.errors():
        where = ".".join(str(x) for x in e["loc"]) or "(top level)"
        value = e.get("input")
        shown = json.dumps(value, default=str)[:80] if not isinstance(value, dict) else "{...}"
        parts.append(f"{where}: {e['msg']} (got {shown})")
    return "; ".join(parts)


def parse(text: str, source: str = "<text>") -> tuple[Policy, list[str]]:
    if len(text.encode()) > MAX_POLICY_BYTES:
        raise PolicyError(f"{source}: larger than {MAX_POLICY_BYTES} bytes")
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PolicyError(f"{source}: not valid YAML: {exc}") from exc
    try:
        return from_document(doc)
    except ValidationError as exc:
        raise PolicyError(f"{source}: {describe(exc)}") from exc
    except (TypeError, NodeSLOError) as exc:
        raise PolicyError(f"{source}: {exc}") from exc


Layer = Callable[[Policy], Policy]


class RuleCache:
    """The policy in force = the base (the policy file, or the embedded default) with at most
    one layer over it (the cluster's NodeSLO). Either can change alone: a reloaded file keeps
    the NodeSLO over it, a new NodeSLO keeps the file under it."""

    def __init__(self, policy: Policy | None = None, source: str = "embedded default") -> None:
        p = policy or Policy()
        self._current = Versioned(1, p, _digest(p), source)
        self._base = (p, source)
        self._layer: tuple[Layer, str] | None = None
        self._listeners: list[Callable[[Versioned], None]] = []
        # What each source's document had that is not used (a NodeSLO's fields nriplugin does
        # not implement, values left out), kept while that source is in force: for explain
        # and the agent's metrics (doctor), not only a log line said once.
        self._notes: dict[str, tuple[str, ...]] = {"base": (), "layer": ()}
        self._notes_listeners: list[Callable[[tuple[str, ...]], None]] = []
        self.rejected = 0

    @property
    def current(self) -> Versioned:
        return self._current  # one reference read: readers never see a half-applied policy

    @property
    def policy(self) -> Policy:
        return self._current.policy

    def subscribe(self, fn: Callable[[Versioned], None]) -> None:
        self._listeners.append(fn)

    @property
    def notes(self) -> tuple[str, ...]:
        """What the base's and the layer's documents had that is not used, each with its source."""
        return self._notes["base"] + self._notes["layer"]

    def subscribe_notes(self, fn: Callable[[tuple[str, ...]], None]) -> None:
        """``fn(notes)`` whenever :attr:`notes` changes."""
        self._notes_listeners.append(fn)

    def _set_notes(self, which: str, source: str, notes: Sequence[str]) -> None:
        new = tuple(f"{source}: {n}" for n in notes)
        if self._notes[which] == new:
            return
        self._notes[which] = new
        for fn in self._notes_listeners:
            fn(self.notes)

    @property
    def base(self) -> Policy:
        """The policy under the layer (what a new layer applies over)."""
        return self._base[0]

    def set(self, policy: Policy, source: str, notes: Sequence[str] = ()) -> Versioned:
        """A new base policy; the layer, if any, applies over it. ``notes``: what its document
        had that is not used."""
        v = self._commit((policy, source), self._layer)
        self._set_notes("base", source, notes)
        return v

    def set_layer(self, layer: Layer | None, source: str = "", notes: Sequence[str] = ()) -> Versioned:
        """A new layer over the base (None: none). Raises PolicyError if it does not fit the
        base; the policy in force stays."""
        v = self._commit(self._base, (layer, source) if layer is not None else None)
        self._set_notes("layer", source, notes if layer is not None else ())
        return v

    def reject(self, source: str, why: str) -> None:
        """A policy from ``source`` that could not be used: counted and logged, the last good kept."""
        self.rejected += 1
        log.error("policy from %s rejected, keeping version %d: %s", source, self._current.version, why)

    def _commit(self, base: tuple[Policy, str], layer: tuple[Layer, str] | None) -> Versioned:
        policy, source = base
        if layer is not None:
            try:
                policy, source = layer[0](policy), f"{layer[1]} over {source}"
            except ValidationError as exc:
                raise PolicyError(f"{layer[1]} over {source}: {describe(exc)}") from exc
        self._base, self._layer = base, layer
        digest = _digest(policy)
        cur = self._current
        if digest == cur.digest:
            return cur
        new = Versioned(cur.version + 1, policy, digest, source)
        self._current = new
        log.info("policy version %d from %s", new.version, source, extra={"policy_version": new.version})
        for fn in self._listeners:
            fn(new)
        return new

    def load_file(self, path: Path) -> Versioned:
        """Validate and apply ``path``; on any error keep the current policy and raise."""
        try:
            text = path.read_text()
        except OSError as exc:
            self.rejected += 1
            raise PolicyError(f"{path}: cannot read: {exc.strerror}") from exc
        try:
            policy, notes = parse(text, str(path))
        except PolicyError:
            self.rejected += 1
            raise
        for n in notes:
            log.warning("%s: %s", path, n)
        try:
            return self.set(policy, str(path), notes)
        except PolicyError:
            self.rejected += 1  # the file does not fit under the NodeSLO in force
            raise


def _digest(p: Policy) -> str:
    return hashlib.sha256(p.model_dump_json().encode()).hexdigest()[:16]


def chain(path: str) -> list[str]:
    """The names that resolving ``path`` goes through and that a rename can swap: each symlink
    met on the way (the path itself, a directory link such as a ConfigMap volume's ``..data``),
    then the file it ends at. Each name's directory part holds no symlink, so a watch on that
    directory sees the name change. Resolved component by component, as the kernel does (a
    ``..`` after a link is the link target's parent); ends after 40 links, the kernel's ELOOP."""
    names: list[str] = []
    todo = list(reversed(Path(os.path.abspath(path)).parts[1:]))  # next component last
    cur = "/"
    while todo:
        part = todo.pop()
        if part == "..":
            cur = os.path.dirname(cur)  # cur holds no symlink: its parent is the real one
            continue
        nxt = os.path.join(cur, part)
        try:
            target = os.readlink(nxt)
        except OSError:  # not a link (or not there): a plain component
            cur = nxt
            continue
        names.append(nxt)
        if len(names) > 40:
            return names
        if target.startswith("/"):
            cur = "/"
        todo.extend(reversed([t for t in target.split("/") if t not in ("", ".")]))
    names.append(cur)
    return names


_EVENTS = IN_MODIFY | IN_CLOSE_WRITE | IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO


class PolicyWatcher:
    """Reloads the policy when what its path names changes, through symlink swaps.

    The path is watched as given, never resolved once: kubelet mounts a ConfigMap as
    ``policy.yaml -> ..data/policy.yaml`` with ``..data -> ..2026_...`` and updates it by
    writing a new timestamped directory, renaming a new ``..data`` link over the old one and
    removing the old directory; editors rename a new file over the old. So the directory of
    every name on the path's :func:`chain` is watched (one inotify instance, read on the event
    loop), a change to any of those names re-resolves the chain and moves the watches, and
    only then is the file read, so no change made after the move can be missed."""

    def __init__(self, path: Path, cache: RuleCache, loop: asyncio.AbstractEventLoop, debounce: float = 0.1) -> None:
        self.path = Path(os.path.abspath(path))
        self.cache = cache
        self.loop = loop
        self.debounce = debounce
        self._pending: asyncio.TimerHandle | None = None
        self._ino: Inotify | None = None
        self._names: set[str] = set()
        self._wds: dict[str, int] = {}  # watched directory -> watch descriptor

    def start(self) -> None:
        self._ino = Inotify()
        self._rewatch()
        self.loop.add_reader(self._ino.fd, self._on_events)

    def watched(self) -> list[str]:
        return sorted(self._wds)

    def _rewatch(self) -> None:
        assert self._ino is not None
        names = chain(str(self.path))
        dirs = {os.path.dirname(n) for n in names}
        for d in set(self._wds) - dirs:
            self._ino.remove(self._wds.pop(d))
        for d in sorted(dirs - set(self._wds)):
            try:
                self._wds[d] = self._ino.add(d, _EVENTS)
            except OSError as exc:  # gone already (the chain changed again): its event follows
                log.debug("cannot watch %s: %s", d, exc)
        self._names = set(names)

    def _on_events(self) -> None:
        assert self._ino is not None
        relevant = False
        while events := self._ino.read():
            for d, name, mask in events:
                if mask & IN_IGNORED:  # a watched directory went away (kubelet removed the old one)
                    self._wds.pop(d, None)
                    relevant = True
                elif mask & IN_Q_OVERFLOW or os.path.join(d, name) in self._names:
                    relevant = True
        if relevant:
            self._schedule()

    def _schedule(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
        self._pending = self.loop.call_later(self.debounce, self._reload)

    def _reload(self) -> None:
        self._pending = None
        self._rewatch()
        if not self.path.exists():
            log.warning("policy file %s removed; keeping policy version %d", self.path, self.cache.current.version)
            return
        try:
            self.cache.load_file(self.path)
        except PolicyError as exc:
            log.error("policy rejected, keeping version %d: %s", self.cache.current.version, exc)

    def stop(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
        if self._ino is not None:
            self.loop.remove_reader(self._ino.fd)
            self._ino.close()
            self._ino = None
            self._wds.clear()
