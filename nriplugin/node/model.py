"""The node model: the one registry of the pods and containers on this node, their facts (the
NRI view: labels, annotations, cgroup paths, resources) and their state.

Three sources feed it — NRI events, Synchronize and the CRI inventory — and everything else
reads it: the hook adapter, the desired state, the reconciler and the QoS manager. Components
that must act when something changes subscribe; they are told in subscription order (the
desired state first: CPUs are assigned before anyone computes a container's values).

Keys: a container's id, or ``pod:<id>`` for a pod.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from nriplugin.kernel import paths
from nriplugin.node.births import Births
from nriplugin.nri import api_pb2 as api

log = logging.getLogger("nriplugin.node.model")

POD_PREFIX = "pod:"


def pod_key(pod_id: str) -> str:
    return POD_PREFIX + pod_id


class State(enum.Enum):
    CREATED = "created"  # runc may be building its cgroup: nobody touches its files yet
    RUNNING = "running"


@dataclass
class Record:
    pod: api.PodSandbox
    container: api.Container | None  # None: the pod itself
    state: State
    since: float = field(default_factory=time.monotonic)  # when it became known
    _group: str | None = field(default=None, repr=False)
    _group_known: bool = field(default=False, repr=False)

    @property
    def group(self) -> str | None:
        """The relative cgroup path (None when unusable), worked out when first needed (not
        on the hook path that made the record)."""
        if not self._group_known:
            self._group, self._group_known = _group(self.pod, self.container), True
        return self._group


class Listener(Protocol):
    """What the model tells its subscribers. ``started(existing=True)``: the container ran
    before we knew it (Synchronize, inventory), so all its tasks exist already."""

    def added(self, key: str) -> None: ...
    def started(self, key: str, existing: bool) -> None: ...
    def changed(self, key: str) -> None: ...
    def removed(self, key: str) -> None: ...
    def resynced(self) -> None: ...  # a complete listing was taken in (Synchronize)


def _group(pod: api.PodSandbox, container: api.Container | None) -> str | None:
    try:
        if container is None:
            return paths.pod_dir(pod.linux.cgroup_parent)
        return paths.container_dir(container.linux.cgroups_path, pod.linux.cgroup_parent, container.id)
    except paths.BadCgroupPath as exc:
        log.warning("%s/%s: not managing its cgroup: %s", pod.namespace, pod.name, exc)
        return None


class NodeModel:
    def __init__(self) -> None:
        self._records: dict[str, Record] = {}
        self._of_pod: dict[str, dict[str, None]] = {}  # pod id -> its containers' keys, in order
        self._listeners: list[Listener] = []
        self._told: dict[str, list[Callable[..., None]]] = {}  # event -> the listeners' bound methods
        # Moves on every change listeners are told of: readers that derive something from the
        # whole model (the BE groups, per-container facts) recompute only when it moved.
        self.revision = 0
        self.births = Births()  # BE containers between CreateContainer and StartContainer

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)
        for event in ("added", "started", "changed", "removed"):
            self._told.setdefault(event, []).append(getattr(listener, event))

    # reading ---------------------------------------------------------------------------------

    def get(self, key: str) -> Record | None:
        return self._records.get(key)

    def pod(self, pod_id: str) -> api.PodSandbox | None:
        r = self._records.get(pod_key(pod_id))
        return None if r is None else r.pod

    def __contains__(self, key: object) -> bool:
        return key in self._records

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._records))  # a copy: listeners may add or remove while iterating

    def records(self) -> list[Record]:
        """Every record, pods' too, as a copy (a container's key is its ``container.id``): a
        plain copy of the values, a tenth of the time the same pairs with their keys take."""
        return list(self._records.values())

    def containers(self) -> Iterator[tuple[str, Record]]:
        return ((k, r) for k, r in self._records.items() if r.container is not None)

    def count(self, state: State) -> int:
        return sum(1 for r in self._records.values() if r.container is not None and r.state is state)

    # NRI events --------------------------------------------------------------------------------

    def pod_seen(self, pod: api.PodSandbox) -> None:
        """RunPodSandbox, or a pod from Synchronize/the inventory. Known pods keep their record."""
        key = pod_key(pod.id)
        if key in self._records:
            return
        self._records[key] = Record(pod, None, State.RUNNING)
        self._tell("added", key)

    def pod_removed(self, pod_id: str) -> None:
        """The pod is gone, and its containers with it (a runtime need not tell each one)."""
        for key in list(self._of_pod.get(pod_id, ())):
            self._remove(key)
        self._remove(pod_key(pod_id))

    def container_created(self, pod: api.PodSandbox, container: api.Container) -> None:
        self._add(pod, container, State.CREATED)

    def container_started(self, pod: api.PodSandbox, container: api.Container, existing: bool = False) -> None:
        """StartContainer (``existing=False``: only the init process exists), or a container
        seen running by Synchronize/the inventory."""
        r = self._records.get(container.id)
        if r is None:
            self._add(pod, container, State.RUNNING)
        elif r.state is State.RUNNING:
            return
        else:
            r.state = State.RUNNING
            if container.pid and r.container is not None:
                r.container.pid = container.pid
        self._tell("started", container.id, existing)

    def container_updated(self, container_id: str, resources: api.LinuxResources) -> bool:
        """New resources (UpdateContainer: an in-place resize). Values derived from them
        follow. Returns whether anything changed."""
        r = self._records.get(container_id)
        if r is None or r.container is None:
            return False
        have = r.container.linux.resources
        merged = api.LinuxResources()
        merged.CopyFrom(have)
        merged.MergeFrom(resources)
        if merged == have:
            return False
        have.CopyFrom(merged)
        self._tell("changed", container_id)
        return True

    def pod_updated(self, pod_id: str, resources: api.LinuxResources, overhead: api.LinuxResources) -> bool:
        """New pod-level resources (UpdatePodSandbox: a pod-level in-place resize; ``resources``
        the sum of its containers', ``overhead`` the runtime class's). Values derived from
        them follow. Returns whether anything changed."""
        r = self._records.get(pod_key(pod_id))
        if r is None:
            return False
        linux = r.pod.linux
        if linux.pod_resources == resources and linux.pod_overhead == overhead:
            return False
        linux.pod_resources.CopyFrom(resources)
        linux.pod_overhead.CopyFrom(overhead)
        self._tell("changed", pod_key(pod_id))
        return True

    def refresh(self, key: str) -> None:
        """The runtime applied new facts (after UpdateContainer): values that depend on them
        are converged again."""
        if key in self._records:
            self._tell("changed", key)

    def knows(self, key: str, running: bool = False) -> bool:
        """Whether ``key`` is known (with ``running``: seen running): the inventory need not
        ask the runtime about it."""
        r = self._records.get(key)
        return r is not None and (not running or r.state is State.RUNNING)

    def pending(self) -> int:
        """Containers created but not yet seen started (the inventory looks again soon)."""
        return self.count(State.CREATED)

    def container_removed(self, container_id: str) -> None:
        self._remove(container_id)

    # bulk sources ------------------------------------------------------------------------------

    def observe(self, pods: Iterable[api.PodSandbox], containers: Iterable[api.Container]) -> int:
        """What the runtime says exists (Synchronize, the CRI inventory). Unknown pods and
        created/running containers are added, known created ones that now run are started;
        what NRI told us stands. Returns how many containers were new."""
        by_id = {p.id: p for p in pods}
        for p in by_id.values():
            self.pod_seen(p)
        new = 0
        for c in containers:
            pod = by_id.get(c.pod_sandbox_id) or self.pod(c.pod_sandbox_id)
            if pod is None or c.state not in (api.CONTAINER_CREATED, api.CONTAINER_RUNNING):
                continue
            r = self._records.get(c.id)
            if r is None:
                new += 1
                if c.state == api.CONTAINER_CREATED:
                    self.container_created(pod, c)
                    continue
            if c.state == api.CONTAINER_RUNNING:
                self.container_started(pod, c, existing=True)
        return new

    def synchronize(self, pods: list[api.PodSandbox], containers: list[api.Container]) -> None:
        """NRI's Synchronize: the runtime's complete list, taken under its lock, so what is not
        in it is gone (removed while we were disconnected)."""
        listed_at = time.monotonic()
        self.observe(pods, containers)
        self.prune({c.id for c in containers} | {pod_key(p.id) for p in pods}, listed_at)
        for listener in self._listeners:
            listener.resynced()

    def prune(self, live: set[str], listed_at: float) -> int:
        """Forget containers and pods the runtime no longer has (removals missed while
        disconnected); those that became known after the listing began stay. Returns how many
        containers were forgotten."""
        gone = [k for k, r in self._records.items() if k not in live and r.since < listed_at]
        for key in gone:
            self._remove(key)
        if gone:
            log.info("forgot %d containers/pods the runtime no longer has", len(gone))
        return sum(1 for k in gone if not k.startswith(POD_PREFIX))

    # -------------------------------------------------------------------------------------------

    def _add(self, pod: api.PodSandbox, container: api.Container, state: State) -> None:
        if container.id in self._records:
            return
        self.pod_seen(pod)
        self._records[container.id] = Record(pod, container, state)
        self._of_pod.setdefault(pod.id, {})[container.id] = None
        self._tell("added", container.id)

    def _remove(self, key: str) -> None:
        r = self._records.get(key)
        if r is None:
            return
        self._tell("removed", key)  # listeners still see the record while they let go
        del self._records[key]
        if r.container is not None:
            keys = self._of_pod.get(r.pod.id)
            if keys is not None:
                keys.pop(key, None)
                if not keys:
                    del self._of_pod[r.pod.id]

    def _tell(self, event: str, key: str, *args: object) -> None:
        self.revision += 1
        for fn in self._told.get(event, ()):
            fn(key, *args)
