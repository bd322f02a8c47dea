"""The hook adapter: turns NRI events into node-model updates, and the desired state into NRI
answers — adjustments at creation, updates at Synchronize and UpdateContainer, UpdateContainers
pushes when the share pool moves — plus, through the one writer, the values NRI cannot carry
(cgroup v1 files at StartContainer, pod-level values at RunPodSandbox)."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable
from typing import NamedTuple

from nriplugin.features import FeatureFailed, Intent, born_with, resctrl
from nriplugin.intent.core import requested
from nriplugin.kernel.cgroup import Cgroups, Version
from nriplugin.kernel.cpulist import format_cpulist
from nriplugin.node.assembly import Node
from nriplugin.nri import api_pb2 as api
from nriplugin.nri.runtime import RuntimeCaps
from nriplugin.nri.stub import Plugin
from nriplugin.pacing.turns import Pacer
from nriplugin.policy.model import Policy
from nriplugin.policy.qos import InvalidQoSLabel, QoSClass, qos_class

log = logging.getLogger("nriplugin.node.hooks")

PUSH_CHUNK = 256  # updates per UpdateContainers call (keeps each message far below 4 MiB)

# Logical resources the NRI adjustment carries itself (LinuxResources fields).
NRI_FIELDS = (
    "cpu.shares",
    "cpu.cfs_quota_us",
    "cpu.cfs_period_us",
    "cpuset.cpus",
    "cpuset.mems",
    "memory.limit_in_bytes",
)


def carried(runtime: RuntimeCaps) -> tuple[str, ...]:
    """The logical resources this runtime's NRI carries as ``LinuxResources`` fields: every
    NRI's :data:`NRI_FIELDS`, and ``pids.max`` from v0.8 (``LinuxResources.pids``)."""
    return (*NRI_FIELDS, "pids.max") if runtime.supports("pids_limit") else NRI_FIELDS


def to_resources(intent: Intent, cg: Cgroups, out: api.LinuxResources, fields: tuple[str, ...] = NRI_FIELDS) -> bool:
    """Fill ``out`` with the values NRI can carry (``fields``: those the runtime's NRI has as
    fields, :func:`carried`; on cgroup v2 everything else goes in ``unified``); returns
    whether anything was set."""
    v = intent.values
    if "cpu.shares" in v:
        out.cpu.shares.value = int(v["cpu.shares"])
    if "cpu.cfs_quota_us" in v:
        out.cpu.quota.value = int(v["cpu.cfs_quota_us"])
    if "cpu.cfs_period_us" in v:
        out.cpu.period.value = int(v["cpu.cfs_period_us"])
    if "cpuset.cpus" in v:
        out.cpu.cpus = str(v["cpuset.cpus"])
    if "cpuset.mems" in v:
        out.cpu.mems = str(v["cpuset.mems"])
    if "memory.limit_in_bytes" in v:
        out.memory.limit.value = int(v["memory.limit_in_bytes"])
    if "pids.max" in v and "pids.max" in fields:
        out.pids.limit = int(v["pids.max"])
    for s in intent.files.values():
        if s.resource not in fields and not s.device:
            entry = cg.unified_entry(s.resource, s.value)
            if entry is not None:
                out.unified[entry[0]] = entry[1]
    if intent.rdt_class:
        out.rdt_class.value = intent.rdt_class
    return bool(intent.files) or bool(intent.rdt_class)


def rdt_groups(policy: Policy) -> list[str]:
    """The resctrl groups the policy puts containers in (one per class with resctrlQOS on)."""
    return sorted({resctrl.group_name(q) for q in ("LSR", "LS", "BE") if policy.class_qos(q).resctrlQOS.enable})


def rdt_path(policy: Policy, runtime: RuntimeCaps, mounted: bool) -> tuple[bool, str]:
    """Whether the runtime places containers in their resctrl group (NRI v0.11's
    ``LinuxRdt``: the CLOS and its schemata in the container's spec, so runc puts the task in
    the group before it runs), and why; else the agent joins each container at its start."""
    nri = runtime.nri_version
    if not mounted:
        return False, "not here (no resctrl mount)"
    if not rdt_groups(policy):
        return False, "off (no class enables resctrlQOS)"
    if policy.resctrlRuntimeClasses:
        return False, "the runtime's own RDT classes (resctrlRuntimeClasses: LinuxResources.rdt_class)"
    if runtime.supports("rdt"):
        return True, (
            f"placed by the runtime (NRI LinuxRdt: CLOS and schemata at CreateContainer, runtime NRI {nri});"
            " the agent makes the groups with their schemata (at Configure, and after a policy change)"
        )
    return False, f"joined by the agent at StartContainer (runtime NRI {nri} < v0.11 has no LinuxRdt)"


def pod_resize_path(runtime: RuntimeCaps, seen_since: float | None = None) -> str:
    """What becomes of a pod-level in-place resize. A runtime whose NRI knows UpdatePodSandbox
    lets the agent subscribe to it, but sends it only if it also implements CRI
    UpdatePodSandboxResources, and not every one does. So "followed" is claimed from the first
    event the runtime delivered (``seen_since``, epoch seconds), never from the version; until
    then the reconciler keeps the pod's files, as on older runtimes."""
    nri = runtime.nri_version
    if not runtime.supports("pod_update"):
        return f"not told (runtime NRI {nri} < v0.10): the reconciler repairs the pod's files when they change"
    if seen_since is None:
        return (
            f"subscribed (UpdatePodSandbox, runtime NRI {nri}), followed once the runtime sends one; a runtime"
            " without CRI UpdatePodSandboxResources sends none, and the reconciler repairs the pod's files"
            " when they change"
        )
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seen_since))
    return (
        f"followed (UpdatePodSandbox seen since {since}, runtime NRI {nri}):"
        " the pod's values are recomputed and applied"
    )


def runtime_paths(
    policy: Policy,
    runtime: RuntimeCaps,
    cgroup: Version | None,
    resctrl_mounted: bool = False,
    pod_updates_since: float | None = None,
) -> dict[str, str]:
    """Which path is in force, on this runtime, for what newer NRIs carry besides BE's birth
    attributes (those: ``born_with``): logged at Configure, shown by ``doctor`` and ``explain``.
    ``pod_updates_since``: when the runtime delivered its first UpdatePodSandbox (None: none
    seen, or not known here), see :func:`pod_resize_path`."""
    nri = runtime.nri_version
    limits = policy.containerPidsLimit
    if not policy.features.pidsLimit.enable or all(limits.of(q) is None for q in ("LSR", "LS", "BE")):
        pids = "off (policy containerPidsLimit sets none: the runtime's)"
    elif runtime.supports("pids_limit"):
        pids = f"in force through NRI (LinuxResources.pids at CreateContainer, runtime NRI {nri})"
    elif cgroup is not None and cgroup.unified:
        pids = f"in force through NRI's cgroup v2 unified map (runtime NRI {nri} < v0.8 has no pids field)"
    else:
        pids = f"in force, written by the agent at StartContainer (runtime NRI {nri} < v0.8, cgroup v1)"
    if runtime.supports("plugin_updates"):
        updates = f"pushed with UpdateContainers (runtime NRI {nri})"
    else:
        updates = (
            f"in Synchronize's answer; the share pool's moves written by the agent (runtime NRI {nri} < v0.12.1 "
            "can deadlock on a plugin's UpdateContainers: containerd#13733)"
        )
    return {
        "pids limit": pids,
        "pod-level resize": pod_resize_path(runtime, pod_updates_since),
        "resctrl": rdt_path(policy, runtime, resctrl_mounted)[1],
        "updates outside hooks": updates,
    }


MAX_SHAPES = 256  # CreateContainer answers kept (a node runs a few dozen workload shapes)
# Containers created and not yet taken in, at most: more than a node runs (the kubelet's
# maxPods is 110 by default), so only a runtime's synthetic flood reaches it.
MAX_WAITING = 4096


class Waiting(NamedTuple):
    """A container answered and not taken in yet: its pod, whether the agent manages its class
    (a share pool's move includes it), and its CreateContainer request as the runtime sent it."""

    pod_id: str
    managed: bool
    request: bytes


class QoSPlugin(Plugin):
    def __init__(
        self,
        node: Node | None = None,
        push: Callable[[list[api.ContainerUpdate]], Awaitable[object]] | None = None,
        pacer: Pacer | None = None,
    ) -> None:
        """``pacer``: the loop shared with the hooks (the agent's); default: no loop, the
        take-in of created containers runs in the hook (``explain``, tests)."""
        self.node = node or Node.create()
        self.pacer = Pacer() if pacer is None else pacer
        self.model = self.node.model
        self.desired = self.node.desired
        self.writer = self.node.writer
        self.cgroups = self.node.cgroups
        self.push = push  # UpdateContainers from outside handlers (the stub's)
        self._pushes: set[asyncio.Future[None]] = set()  # UpdateContainers in flight (kept referenced)
        # Containers answered, not yet in the model, by id: taken in once a burst of hooks is
        # over (pacing.turns.BurstWait), and by any hook about one of them before it looks at the model.
        self._created: collections.OrderedDict[str, Waiting] = collections.OrderedDict()
        self.runtime = RuntimeCaps()  # what the runtime's NRI carries: learnt at Configure
        self.fields = carried(self.runtime)  # the resources its LinuxResources has as fields
        # When this connection's runtime delivered its first UpdatePodSandbox (pod_resize_path)
        self.pod_updates_since: float | None = None
        # CreateContainer's answer by the container's shape (DesiredState.birth_key): the pods
        # of one workload come in bursts and get the same values, computed once; the key
        # carries the node's state, so a decision since then makes a new key. With the answer,
        # what is not asked again each time: whether it names a resctrl CLOS
        # (_placed_by_runtime), whether the agent manages the container (born_managed),
        # and whether it is BE's (its birth lifts BE's quota: node/births.py).
        self._answers: dict[tuple[object, ...], tuple[api.ContainerAdjustment | None, bool, bool, bool]] = {}
        # LinuxRdt by resctrl group, while the policy and runtime stay (None: not this path)
        self._rdt: tuple[Policy, dict[str, api.LinuxRdt] | None] | None = None
        self._born_with = born_with.BirthPlans()  # what BE is born with, while the policy and runtime stay

    def runtime_caps(self, caps: RuntimeCaps) -> None:
        """Decided once per connection: which process attributes BE is born with, which
        resources the adjustment carries, which pod events are subscribed. Whether pod updates
        come is learnt again on each connection: the runtime may have changed meanwhile."""
        self.runtime = caps
        self.fields = carried(caps)
        self.pod_updates_since = None
        self._answers.clear()
        self._rdt = None
        policy = self.desired.rules.policy
        for name, why in self._born_with(policy, caps).lines().items():
            log.info("%s: %s", name, why)
        for name, why in runtime_paths(policy, caps, self.cgroups.version, self.writer.resctrl is not None).items():
            log.info("%s: %s", name, why)
        self._rdt_templates()  # the groups are made now, before the first container names one

    def _rdt_templates(self) -> dict[str, api.LinuxRdt] | None:
        """The ``LinuxRdt`` each resctrl group's containers are created with, when the runtime
        places them (:func:`rdt_path`); decided once per policy and runtime, the groups made
        then. A group that cannot be made leaves the agent's own join in force."""
        policy = self.desired.rules.policy
        if self._rdt is not None and self._rdt[0] is policy:
            return self._rdt[1]
        templates: dict[str, api.LinuxRdt] | None = None
        if rdt_path(policy, self.runtime, self.writer.resctrl is not None)[0]:
            schemata = {g: self.writer.resctrl_schemata(g) for g in rdt_groups(policy)}
            err = self.writer.ensure_resctrl_groups(schemata)
            if err is None:
                templates = {}
                for g, text in schemata.items():
                    t = templates[g] = api.LinuxRdt()
                    t.clos_id.value = g
                    t.schemata.value.extend(text.splitlines())
            else:
                log.warning("resctrl: the agent joins containers itself, the runtime cannot place them: %s", err)
        self._rdt = (policy, templates)
        return templates

    def _take_in_created(self, in_turns: bool = False, quiet: bool = True) -> None:
        """The model takes in the containers answered and not taken in yet, in order; ``in_turns``
        (on the loop, after the answers), a turn at a time: a request that arrives meanwhile
        waits for one container's take-in, not for a burst's. ``quiet``: each next turn waits
        for the hooks to stop again (:meth:`Pacer.when_quiet`), else it follows at once."""
        created = self._created
        turn = self.pacer.turn() if in_turns else None
        while created:
            _, waiting = created.popitem(last=False)
            self._adopt(waiting)
            if turn is not None and created and turn.over():
                (self.pacer.when_quiet if quiet else self.pacer.soon)(self._take_in_created, True, quiet)
                return

    def _take_in_one(self, cid: str) -> None:
        """The model takes in container ``cid`` if it waits to be: a hook about it looks at the
        model next, and the others (a burst's) stay queued, so the hook's work does not grow
        with them."""
        queued = self._created.pop(cid, None)
        if queued is not None:
            self._adopt(queued)

    def _adopt(self, waiting: Waiting) -> None:
        req = api.CreateContainerRequest.FromString(waiting.request)
        self.model.container_created(req.pod, req.container)

    def _take_in_pod(self, pod_id: str) -> None:
        """The model takes in the waiting containers of pod ``pod_id`` (a pod hook looks at the
        model next); a look at each waiting container, none of the others taken in."""
        for cid in [cid for cid, w in self._created.items() if w.pod_id == pod_id]:
            self._take_in_one(cid)

    def _pool_updates(self, skip: str = "") -> list[api.ContainerUpdate]:
        """Updates moving every sharer to the current share pool: those in the model, and
        those created and waiting to be taken in (their values are worked out at their
        take-in, with the pool as it is then)."""
        if not self.desired.rules.policy.features.cpuset.enable or not self.desired.caps.files.get("cpuset.cpus"):
            return []
        pool = format_cpulist(self.desired.cpus.share_pool())
        known = [cid for cid in self.desired.sharers(skip) if self.desired.intent(cid) is not None]
        waiting = [cid for cid, w in self._created.items() if w.managed]
        out = []
        for cid in known + waiting:
            u = api.ContainerUpdate(container_id=cid, ignore_failure=True)
            u.linux.resources.cpu.cpus = pool
            out.append(u)
        return out

    def _push_later(self, updates: list[api.ContainerUpdate]) -> None:
        """UpdateContainers must not be called from inside a handler: right after it. Not at
        all where the runtime's NRI can deadlock on it (``plugin_updates``): the reconciler
        writes the files, as it does when a push fails."""
        if not updates or self.push is None or not self.runtime.supports("plugin_updates"):
            return
        task = asyncio.ensure_future(self._push(self.push, updates))
        self._pushes.add(task)
        task.add_done_callback(self._pushes.discard)

    @staticmethod
    async def _push(
        push: Callable[[list[api.ContainerUpdate]], Awaitable[object]], updates: list[api.ContainerUpdate]
    ) -> None:
        """A push that fails is logged; the reconciler still converges the files."""
        try:
            failed = await push(updates)
        except Exception as exc:
            log.warning("UpdateContainers of %d containers failed: %s", len(updates), exc)
            return
        if isinstance(failed, list) and failed:
            log.info("the runtime could not update %d of %d containers (gone meanwhile?)", len(failed), len(updates))

    # hooks -----------------------------------------------------------------------------------

    keeps_requests = True  # the take-in queue holds requests as they came (Plugin.keeps_requests)

    def create_container(
        self, pod: api.PodSandbox, container: api.Container, request: bytes = b""
    ) -> api.ContainerAdjustment | tuple[api.ContainerAdjustment, list[api.ContainerUpdate]] | None:
        """The answer first. The model takes the container in once the burst of hooks is over
        (:meth:`Pacer.when_quiet`; right after the answer outside bursts), unless the container gets
        exclusive CPUs, which must be handed out before its values are worked out. Nothing a
        container's values depend on moves when a container without exclusive CPUs is taken
        in, and one that has not started holds nothing the agent manages, so its take-in can
        wait: a hook about it takes it in first (and a request the loop runs before a queued
        take-in does not do that work in its own answer). The queue holds ``request``, the
        request's wire bytes (given by the stub; made here for other callers), not the
        messages: their parse is several times larger, and a burst would parse every request
        into new memory."""
        key = self.desired.birth_key(pod, container)  # None for a pod that pins, among others
        born = self._answers.get(key) if key is not None else None
        if born is None:
            if key is None and self.desired.pins(pod):
                return self._create_pinned(pod, container)
            try:
                intent = self.desired.intent_before_known(pod, container)
            except FeatureFailed as exc:
                raise RuntimeError(f"refusing {pod.namespace}/{pod.name}/{container.name}: {exc}") from exc
            be = _is_be(pod)
            adj = self._adjustment(intent, pod, be)
            managed = self.desired.born_managed(key) if key is not None else self.desired.manages(pod)
            born = adj, _names_clos(adj), managed, be
            if key is not None:
                if len(self._answers) >= MAX_SHAPES:  # old stamps: unreachable anyway
                    self._answers.clear()
                self._answers[key] = born
        adj, placed, managed, be = born
        cid = container.id
        if be:
            self.model.births.begin(cid)
        self._placed_by_runtime(cid, placed)
        if not request:
            request = api.CreateContainerRequest(pod=pod, container=container).SerializeToString()
        created = self._created
        created[cid] = Waiting(pod.id, managed, request)
        if len(created) == 1:
            self.pacer.when_quiet(self._take_in_created, True)
        elif len(created) == MAX_WAITING:
            self.pacer.soon(self._take_in_created, True, False)
        return adj

    def _create_pinned(
        self, pod: api.PodSandbox, container: api.Container
    ) -> api.ContainerAdjustment | tuple[api.ContainerAdjustment, list[api.ContainerUpdate]] | None:
        generation = self.desired.cpus.generation
        self.model.container_created(pod, container)
        try:
            intent = self.desired.intent(container.id)
        except FeatureFailed as exc:
            self.model.container_removed(container.id)  # refused: it will never exist
            raise RuntimeError(f"refusing {pod.namespace}/{pod.name}/{container.name}: {exc}") from exc
        adj = self._adjustment(intent, pod, _is_be(pod))
        self._placed_by_runtime(container.id, _names_clos(adj))
        if adj is not None and self.desired.cpus.generation != generation:  # cores left the share pool
            return adj, self._pool_updates(skip=container.id)
        return adj

    def _placed_by_runtime(self, cid: str, placed: bool) -> None:
        """An answer naming a resctrl CLOS (``placed``, :func:`_names_clos`): the runtime puts
        the container in its group, so its start joins it to none (``TaskGroups``)."""
        if placed:
            self.writer.rdt_placed.add(cid)

    def _adjustment(self, intent: Intent | None, pod: api.PodSandbox, be: bool) -> api.ContainerAdjustment | None:
        """The cgroup values NRI carries, the resctrl group where the runtime places
        containers, and for BE the process attributes the runtime's NRI carries
        (``born_with``: one template merged, whatever the node's size)."""
        adj = api.ContainerAdjustment()
        some = False
        if intent is not None:
            some = to_resources(self._in_spec(intent, be), self.cgroups, adj.linux.resources, self.fields)
            if intent.resctrl_group is not None:
                rdt = (self._rdt_templates() or {}).get(str(intent.resctrl_group.value))
                if rdt is not None:
                    adj.linux.rdt.CopyFrom(rdt)
                    some = True
        if be:
            some = self._born_with(self.desired.rules.policy, self.runtime).apply(adj) or some
        return adj if some else None

    def _in_spec(self, intent: Intent, be: bool) -> Intent:
        """What of ``intent`` may travel in a not-yet-started container's spec: all of it but,
        when :meth:`_quota_late`, its quota."""
        if not self._quota_late(intent, be):
            return intent
        intent = intent.copy()
        intent.files.pop(("cpu.cfs_quota_us", ""), None)
        return intent

    def start_container(self, pod: api.PodSandbox, container: api.Container) -> None:
        """cgroup v1: values NRI cannot carry (burst, identity, idle) go to the files now: the
        runtime created the task (so the cgroup exists and the pid is known) and has not
        started it yet. Starting it in the model joins its task groups and lets the
        reconciler converge whatever NRI did not carry at creation, right after this answer."""
        key = container.id
        self.model.births.end(key)
        self._take_in_one(key)
        self.model.container_started(pod, container)
        try:
            intent = self.desired.intent(key)
        except FeatureFailed:
            return
        r = self.model.get(key)
        if r is not None and r.group is not None and self.cgroups.weight_to_learn:
            self._learn_weight_mapping(r.group, intent, container)
        if intent is not None and r is not None and r.group is not None:
            uncarried = not self.cgroups.hierarchy.unified  # a unified map carried all but devices
            late = self._quota_late(intent, _is_be(pod))
            extra = [
                s
                for s in intent.settings()
                if s.device
                or (uncarried and s.resource not in self.fields)
                or (late and s.resource == "cpu.cfs_quota_us")
            ]
            if extra:
                self.writer.apply(r.group, extra, f"{pod.namespace}/{pod.name}/{container.name}")

    def _learn_weight_mapping(self, group: str, intent: Intent | None, container: api.Container) -> None:
        """cgroup v2: the runtime converted this container's cpu.shares (ours if we adjusted
        them) to cpu.weight moments ago; learn its mapping, so our own writes and repairs agree
        with what it gives every other container (runc 1.3.2 changed it)."""
        shares = intent.get("cpu.shares") if intent is not None else None
        if not isinstance(shares, int):
            shares = requested(container, "cpu.shares")
        if shares is None:
            return
        mapping = self.cgroups.learn_weight_mapping(group, shares)
        if mapping is not None:
            log.info("cgroup v2: the runtime maps cpu.shares to cpu.weight %s; following it", mapping)

    def _quota_late(self, intent: Intent, be: bool) -> bool:
        """cgroup v1 refuses a child's quota above its parent's, and the QoS manager may cut
        BE's QoS-level group at any moment: between the answer that puts a BE container's
        quota in its spec (CreateContainer, or an update pushed after Synchronize) and runc
        writing it when the task is created — tens of ms, or as long as a created container
        waits to be started — a cut makes runc fail the container (EINVAL). So on v1 a BE
        container's own finite quota never travels in its spec: the one writer writes it at
        StartContainer (the cgroup exists, the process has not run), capped as the group is
        then. Until then it runs nothing, so nothing escapes the limit."""
        if not be or not self.cgroups.hierarchy.parent_caps_quota:
            return False
        q = intent.get("cpu.cfs_quota_us")
        return isinstance(q, int) and q > 0

    def remove_container(self, pod: api.PodSandbox, container: api.Container) -> None:
        """A container that never left the take-in queue is only dropped from it: nothing but
        its answer's resctrl placement knows it (a pod's first container created and removed
        in one burst costs no take-in, nor its pod's)."""
        cid = container.id
        self.model.births.end(cid)
        if self._created.pop(cid, None) is not None and cid not in self.model:
            self.writer.rdt_placed.discard(cid)
            return
        generation = self.desired.cpus.generation
        self.model.container_removed(cid)
        if self.desired.cpus.generation != generation:  # the share pool grew
            self._push_later(self._pool_updates())

    def run_pod_sandbox(self, pod: api.PodSandbox) -> None:
        """Pod-level values (NRI has no pod adjustment) go to the pod's cgroup. (None of its
        containers can wait to be taken in: they come after it.)"""
        self.model.pod_seen(pod)
        r = self.model.get(f"pod:{pod.id}")
        intent = self.desired.intent(f"pod:{pod.id}")
        if intent is not None and intent.files and r is not None and r.group is not None:
            self.writer.apply(r.group, intent.settings(), f"{pod.namespace}/{pod.name}")

    def remove_pod_sandbox(self, pod: api.PodSandbox) -> None:
        self._take_in_pod(pod.id)
        self.model.pod_removed(pod.id)

    def update_pod_sandbox(self, pod: api.PodSandbox, resources: api.LinuxResources) -> None:
        """A pod-level in-place resize (NRI v0.10+; ``resources``: the new sum of its
        containers', absent over StateChange): the model takes the pod's new resources and
        the pod's values are recomputed and applied by the one writer (none derives from the
        pod's quota: a pod burst would block the kubelet's lowering of it, see cpu_burst).
        Nothing to answer: NRI has no pod adjustment."""
        if self.pod_updates_since is None:
            self._first_pod_update()
        self._take_in_pod(pod.id)
        if self.model.pod(pod.id) is None:
            self.model.pod_seen(pod)
        new = resources if resources.ByteSize() else pod.linux.pod_resources
        if new.ByteSize():  # nothing said (StateChange of a runtime that fills no pod resources)
            self.model.pod_updated(pod.id, new, pod.linux.pod_overhead)

    def _first_pod_update(self) -> None:
        """The runtime does pass pod-level resizes on: said once, as the registration said it."""
        self.pod_updates_since = time.time()
        log.info("pod-level resize: %s", pod_resize_path(self.runtime, self.pod_updates_since))

    def post_update_pod_sandbox(self, pod: api.PodSandbox) -> None:
        """The resize is through (the kubelet writes the pod group itself): converge the pod's
        values again, over whatever it wrote."""
        self._take_in_pod(pod.id)
        self.model.refresh(f"pod:{pod.id}")

    def update_container(
        self, pod: api.PodSandbox, container: api.Container, resources: api.LinuxResources
    ) -> list[api.ContainerUpdate]:
        """An in-place resize: the model takes the new resources, so every value derived from
        them (burst from the quota) follows; the desired values are kept in the update."""
        self._take_in_one(container.id)
        if container.id not in self.model:
            self.model.container_started(pod, container, existing=True)
        before = self.model.get(container.id)
        old_quota = requested(before.container, "cpu.cfs_quota_us") if before is not None else None
        self.model.container_updated(container.id, resources)
        intent = self.desired.intent(container.id)
        if intent is None:
            return []
        new_quota = resources.cpu.quota.value if resources.cpu.HasField("quota") else None
        if old_quota is not None and new_quota is not None and 0 < new_quota < old_quota:
            self._burst_before_quota(container.id, intent)
        u = api.ContainerUpdate(container_id=container.id)
        if not to_resources(intent, self.cgroups, u.linux.resources, self.fields) or _covers(
            resources, u.linux.resources
        ):
            return []
        return [u]

    def _burst_before_quota(self, key: str, intent: Intent) -> None:
        """The kernel refuses a quota below its group's burst (v1 and v2), and NRI does not
        carry the burst: when a resize lowers the quota, the burst worked out from the new one
        (at most the new quota, so under the old one too) is written now, before the runtime
        writes the new quota. Any other resize leaves the burst to the reconciler, once the
        model took the resize in."""
        burst = intent.files.get(("cpu.cfs_burst_us", ""))
        r = self.model.get(key)
        if burst is not None and r is not None and r.group is not None:
            self.writer.apply(r.group, [burst], key[:12])

    def post_update_container(self, pod: api.PodSandbox, container: api.Container) -> None:
        """The runtime applied the new resources: converge what depends on them (a burst that
        the old quota would not admit)."""
        self._take_in_one(container.id)
        self.model.refresh(container.id)

    def synchronize(self, pods: list[api.PodSandbox], containers: list[api.Container]) -> list[api.ContainerUpdate]:
        """Containers that existed before we connected. The runtime holds its lock (every pod
        and container event waits) until we answer, so the answer goes out as soon as the
        message is read; right after it, in order before any later event, the model takes
        them in (the reconciler converges their files, the task groups take their tasks), and
        the NRI updates they need are worked out a turn at a time and pushed with
        UpdateContainers, hooks answered in between. Where a plugin's UpdateContainers is not
        safe (NRI before v0.12.1: ``plugin_updates``), the answer carries the updates instead,
        applied under the runtime's lock: its events wait for the take-in and the updates
        (``bench.scale`` measures it), the runtime does not wedge."""
        self._take_in_created()
        if self.push is None or not self.runtime.supports("plugin_updates"):
            return self._take_in(pods, containers)  # also: nothing to push with (tests, explain)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return self._take_in(pods, containers)
        loop.call_soon(self._synchronized, pods, containers)
        return []

    def _synchronized(self, pods: list[api.PodSandbox], containers: list[api.Container]) -> None:
        took = self._observe_sync(pods, containers)
        task = asyncio.ensure_future(self._push_sync_updates(pods, containers, took))
        self._pushes.add(task)
        task.add_done_callback(self._pushes.discard)

    async def _push_sync_updates(
        self, pods: list[api.PodSandbox], containers: list[api.Container], took: float
    ) -> None:
        t0 = time.perf_counter()
        batch: list[api.ContainerUpdate] = []
        n = 0
        turn = self.pacer.turn()
        for c in containers:
            u = self._sync_update(c)
            if u is not None:
                batch.append(u)
                n += 1
            if len(batch) == PUSH_CHUNK:
                self._push_later(batch)
                batch = []
            if turn.over():
                await self.pacer.give_way()
                turn.restart()
        self._push_later(batch)
        self._log_sync(pods, containers, n, took, time.perf_counter() - t0, "pushed with UpdateContainers")

    def _take_in(self, pods: list[api.PodSandbox], containers: list[api.Container]) -> list[api.ContainerUpdate]:
        """The model takes Synchronize's containers in; returns the updates they need."""
        took = self._observe_sync(pods, containers)
        t0 = time.perf_counter()
        updates = [u for c in containers if (u := self._sync_update(c)) is not None]
        self._log_sync(pods, containers, len(updates), took, time.perf_counter() - t0, "in the answer")
        return updates

    def _observe_sync(self, pods: list[api.PodSandbox], containers: list[api.Container]) -> float:
        """The model takes the listing in (in one piece: later events must find it); seconds."""
        t0 = time.perf_counter()
        self.model.synchronize(pods, containers)
        return time.perf_counter() - t0

    @staticmethod
    def _log_sync(
        pods: list[api.PodSandbox],
        containers: list[api.Container],
        updates: int,
        took: float,
        worked: float,
        how: str,
    ) -> None:
        log.info(
            "synchronized %d pods, %d containers, %d updates %s (taken in in %.0f ms; updates worked out in %.0f ms)",
            len(pods),
            len(containers),
            updates,
            how,
            took * 1e3,
            worked * 1e3,
            extra={"take_in_ms": round(took * 1e3, 1), "updates_ms": round(worked * 1e3, 1), "updates_sent": how},
        )

    def _sync_update(self, c: api.Container) -> api.ContainerUpdate | None:
        """The update a synchronized container needs (None: it has its values already)."""
        if c.id not in self.model:
            return None
        try:
            intent = self.desired.intent(c.id)
        except FeatureFailed as exc:  # cannot refuse what runs: left as it is
            log.warning("%s: %s", c.id[:12], exc)
            return None
        if intent is None:
            return None
        if c.state == api.CONTAINER_CREATED:  # not started: the update goes to its spec
            intent = self._in_spec(intent, self.desired.qos_of(c.id) is QoSClass.BE)
        u = api.ContainerUpdate(container_id=c.id)
        if to_resources(intent, self.cgroups, u.linux.resources, self.fields) and not _covers(
            c.linux.resources, u.linux.resources
        ):
            return u
        return None


def _names_clos(adj: api.ContainerAdjustment | None) -> bool:
    """Whether the answer names a resctrl CLOS (NRI ``LinuxRdt``): the runtime then places the
    container in its group (``TaskGroups``)."""
    return adj is not None and adj.linux.HasField("rdt")


def _is_be(pod: api.PodSandbox) -> bool:
    """A bad QoS label is not BE (the desired state reports it once and leaves the pod alone)."""
    try:
        return qos_class(pod.labels, pod.linux.cgroup_parent) is QoSClass.BE
    except InvalidQoSLabel:
        return False


def _covers(have: api.LinuxResources, want: api.LinuxResources) -> bool:
    """Does ``have`` already hold every value ``want`` sets?"""
    for f in ("shares", "quota", "period"):
        if want.cpu.HasField(f) and (
            not have.cpu.HasField(f) or getattr(have.cpu, f).value != getattr(want.cpu, f).value
        ):
            return False
    if want.HasField("pids") and (not have.HasField("pids") or have.pids.limit != want.pids.limit):
        return False
    if want.cpu.cpus and have.cpu.cpus != want.cpu.cpus:
        return False
    if want.memory.HasField("limit") and (
        not have.memory.HasField("limit") or have.memory.limit.value != want.memory.limit.value
    ):
        return False
    return all(have.unified.get(k) == v for k, v in want.unified.items())
