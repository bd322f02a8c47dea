"""The rule cache: the current validated policy with a version, swapped atomically; a bad new
policy is rejected with a clear error and the last good one stays. Hot reload of the policy
file (watchdog) feeds it."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from .model import Policy, from_document
from .nodeslo import NodeSLOError

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
    def base(self) -> Policy:
        """The policy under the layer (what a new layer applies over)."""
        return self._base[0]

    def set(self, policy: Policy, source: str) -> Versioned:
        """A new base policy; the layer, if any, applies over it."""
        return self._commit((policy, source), self._layer)

    def set_layer(self, layer: Layer | None, source: str = "") -> Versioned:
        """A new layer over the base (None: none). Raises PolicyError if it does not fit the
        base; the policy in force stays."""
        return self._commit(self._base, (layer, source) if layer is not None else None)

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
            return self.set(policy, str(path))
        except PolicyError:
            self.rejected += 1  # the file does not fit under the NodeSLO in force
            raise


def _digest(p: Policy) -> str:
    return hashlib.sha256(p.model_dump_json().encode()).hexdigest()[:16]


class PolicyWatcher:
    """Reloads the policy file when it changes (editors replace files, so the folder is
    watched). Events arrive on watchdog's thread and are handed to the event loop."""

    def __init__(self, path: Path, cache: RuleCache, loop: asyncio.AbstractEventLoop, debounce: float = 0.1) -> None:
        self.path = path.resolve()
        self.cache = cache
        self.loop = loop
        self.debounce = debounce
        self._pending: asyncio.TimerHandle | None = None
        self._observer: Any = None
        self._lock = threading.Lock()

    def start(self) -> None:
        from watchdog.events import FileSystemEvent, FileSystemEventHandler
        from watchdog.observers import Observer

        watcher = self

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event: FileSystemEvent) -> None:
                # Our own reads raise opened/closed_no_write events: reacting to them would loop.
                if event.event_type not in ("modified", "created", "moved", "deleted", "closed"):
                    return
                paths = {str(event.src_path), str(getattr(event, "dest_path", "") or "")}
                if str(watcher.path) in paths:
                    watcher.loop.call_soon_threadsafe(watcher._schedule)

        self._observer = Observer()
        self._observer.schedule(Handler(), str(self.path.parent), recursive=False)
        self._observer.daemon = True
        self._observer.start()

    def _schedule(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
        self._pending = self.loop.call_later(self.debounce, self._reload)

    def _reload(self) -> None:
        self._pending = None
        if not self.path.exists():
            log.warning("policy file %s removed; keeping policy version %d", self.path, self.cache.current.version)
            return
        try:
            self.cache.load_file(self.path)
        except PolicyError as exc:
            log.error("policy rejected, keeping version %d: %s", self.cache.current.version, exc)

    def stop(self) -> None:
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(5)
