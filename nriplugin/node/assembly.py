"""The node's state, assembled once: the node model (what runs), the desired state (features ⊕
overlays), the one writer, and the task groups that follow containers as they start and go.
The hook adapter (plugin.py), the reconciler, the CRI inventory and the QoS manager are all
built on one :class:`Node`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nriplugin.features import FeatureFailed
from nriplugin.kernel.cgroup import RESOURCES, Cgroups
from nriplugin.kernel.coresched import CoreSched
from nriplugin.kernel.probe import Capabilities, probe
from nriplugin.kernel.resctrl import ResctrlFS
from nriplugin.kernel.sched import Scheduler
from nriplugin.node.desired import DesiredState
from nriplugin.node.model import NodeModel
from nriplugin.node.overlays import GROUP_PREFIX
from nriplugin.node.writer import Writer
from nriplugin.policy.cache import RuleCache

log = logging.getLogger("nriplugin.node.assembly")


class TaskGroups:
    """Joins a container's tasks to its resctrl group and core scheduling cookie, and gives
    them their scheduling policy (BE's SCHED_IDLE), when it starts: at StartContainer its init
    process (before the workload runs; children inherit all three), and for a container that
    already ran (Synchronize, inventory) every task, right after the current callback (off the
    hook path)."""

    def __init__(self, model: NodeModel, desired: DesiredState, writer: Writer) -> None:
        self.model = model
        self.desired = desired
        self.writer = writer

    def added(self, key: str) -> None:
        pass

    def changed(self, key: str) -> None:
        pass

    def resynced(self) -> None:
        pass

    def started(self, key: str, existing: bool) -> None:
        w = self.writer
        if w.resctrl is None and w.coresched is None and w.scheduler is None:
            return
        if not existing:
            self._join(key, new=True)
            return
        try:
            asyncio.get_running_loop().call_soon(self._join, key, False)
        except RuntimeError:  # no loop (tests, explain)
            self._join(key, new=False)

    def _join(self, key: str, new: bool) -> None:
        r = self.model.get(key)
        if r is None or r.container is None or r.group is None:
            return
        try:
            intent = self.desired.intent(key)
        except FeatureFailed:
            return
        if intent is None or (new and not r.container.pid):
            return
        who = f"{r.pod.namespace}/{r.pod.name}/{r.container.name}"
        placed = key in self.writer.rdt_placed  # by the runtime, at creation (NRI LinuxRdt)
        self.writer.rdt_placed.discard(key)
        self.writer.join(intent, r.group, r.container.pid if new else 0, who, resctrl_too=not (new and placed))

    def removed(self, key: str) -> None:
        self.writer.rdt_placed.discard(key)
        r = self.model.get(key)
        if self.writer.coresched is not None and r is not None and r.container is not None and r.container.pid:
            self.writer.coresched.forget([r.container.pid])


@dataclass
class Node:
    model: NodeModel
    desired: DesiredState
    writer: Writer

    @property
    def cgroups(self) -> Cgroups:
        return self.writer.cgroups

    @property
    def rules(self) -> RuleCache:
        return self.desired.rules

    @classmethod
    def create(
        cls,
        rules: RuleCache | None = None,
        caps: Capabilities | None = None,
        cgroups: Cgroups | None = None,
        resctrl_root: Path = Path("/sys/fs/resctrl"),
        coresched: CoreSched | None = None,
        on_invalid: Callable[[str], None] = lambda reason: None,
        scheduler: Scheduler | None = None,
    ) -> Node:
        rules = rules or RuleCache()
        cgroups = cgroups or Cgroups(Path("/sys/fs/cgroup"))
        caps = caps or probe(cgroups.root, resctrl_root)
        model = NodeModel()

        def current(key: str, resource: str) -> int | str | None:
            r = model.get(key)
            group = r.group if r is not None else key[len(GROUP_PREFIX) :] if key.startswith(GROUP_PREFIX) else None
            if group is None:
                return None
            try:
                value = cgroups.read(group, resource)
            except (OSError, ValueError):
                return None
            res = RESOURCES[resource]
            if isinstance(value, int) and res.unlimited is not None and res.hi is not None and value > res.hi:
                return res.unlimited  # v1 reads "no limit" back as a huge number
            return value

        desired = DesiredState(model, rules, caps, on_invalid=on_invalid, current=current)
        writer = Writer(
            cgroups,
            lambda: rules.policy,
            ResctrlFS(resctrl_root, caps.resctrl) if caps.resctrl.mounted else None,
            coresched or (CoreSched() if caps.core_sched else None),
            on_invalid=on_invalid,
            on_written=desired.group_written,
            scheduler=scheduler or Scheduler(),
        )
        model.subscribe(desired)  # first: CPUs are assigned before anyone computes values
        model.subscribe(TaskGroups(model, desired, writer))
        return cls(model, desired, writer)
