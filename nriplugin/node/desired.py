"""The desired state of every object the agent manages: the features' values (one function per
feature, ``features/``) with the overlays (``overlays.py``) merged over them.

Computed once per key and kept until something it depends on changes; each key has its own
generation, so a new overlay or an in-place resize recomputes and re-applies only the keys it
touches. A new policy recomputes everything; exclusive CPUs handed out or returned recompute
the containers that follow the share pool. Subscribers (the reconciler) are told which keys
changed: a changed desired state is applied, never counted as drift.

The one side effect that belongs to knowing a container — assigning exclusive CPUs — is an
explicit step when the node model adds it (:meth:`added`), never part of computing values.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Literal, TypeGuard

from nriplugin.features import (
    POD_ANNOTATIONS,
    POD_LABELS,
    Context,
    EnabledSteps,
    FeatureFailed,
    Intent,
    InvalidInput,
    Setting,
    cpuset,
    desired_state,
)
from nriplugin.intent.core import PodSpecs, cap_burst, requested
from nriplugin.intent.cpus import CPUAllocator
from nriplugin.kernel.cgroup import MIN_QUOTA_US, cfs_period
from nriplugin.kernel.cpulist import format_cpulist
from nriplugin.kernel.probe import Capabilities
from nriplugin.node.model import POD_PREFIX, NodeModel
from nriplugin.node.overlays import GROUP_PREFIX, Overlays
from nriplugin.nri import api_pb2 as api
from nriplugin.policy.cache import RuleCache
from nriplugin.policy.qos import QOS_LABEL, InvalidQoSLabel, QoSClass, kubernetes_class, labelled_class, qos_class

log = logging.getLogger("nriplugin.node.desired")

# The labels a birth key holds besides the QoS label (read once, on its own, for the class too).
_KEY_LABELS = tuple(name for name in POD_LABELS if name != QOS_LABEL)

Generation = tuple[int, int, int]  # (policy epoch, the key's own generation, its class's)


def _managed(qos: object) -> TypeGuard[QoSClass]:
    """Whether a pod of class ``qos`` has a desired state: a class, and not the system's."""
    return qos is not None and qos is not QoSClass.SYSTEM


class DesiredState:
    def __init__(
        self,
        model: NodeModel,
        rules: RuleCache,
        caps: Capabilities,
        cpus: CPUAllocator | None = None,
        overlays: Overlays | None = None,
        on_invalid: Callable[[str], None] = lambda reason: None,
        current: Callable[[str, str], int | str | None] = lambda key, resource: None,
    ) -> None:
        self.model = model
        self.rules = rules
        self.caps = caps
        self.cpus = cpus if cpus is not None else CPUAllocator(caps.topology)
        self.overlays = overlays if overlays is not None else Overlays()
        self.on_invalid = on_invalid
        self._steps = EnabledSteps()  # the policy's features, worked out once per policy
        self._cache: dict[str, tuple[Intent | None, int]] = {}  # key -> (intent, its class's generation)
        self._gens: dict[str, int] = {}
        self._epoch = 0
        self._next = 0
        self._pool = self.cpus.generation
        self._listeners: list[Callable[[list[str]], None]] = []
        # What an overlay replaced where no feature sets a value, so that withdrawing it puts
        # that back: key -> resource -> the value before (None: the runtime's, from the facts).
        self.current = current
        self._baselines: dict[str, dict[str, int | str | None]] = {}
        # Class-wide ceilings on CFS bandwidth (cores), owner and reason: cgroup v1 refuses a
        # child's quota above its parent's, so a limit on a QoS-level group (BE's) is also a
        # ceiling for every pod and container of the class, new ones at birth included.
        self._caps: dict[QoSClass, tuple[float, str, str]] = {}
        # What the kernel holds on the QoS-level groups that bound a class (group path -> cores,
        # None: no limit), learned at start-up and kept as the one writer writes them: a child
        # above what its parent holds *now* is refused, so the ceiling in force is the lower
        # of the one decided and the one held (a raise reaches the children once the parent
        # holds it; a restarted agent caps new containers at the previous agent's cut).
        self._held: dict[str, float | None] = {}
        self._bounds: dict[str, QoSClass] = {}
        self._in_force: dict[QoSClass, tuple[float, str, str]] = {}
        # Class-wide cpuset limits (the cpuset suppression policy): the class's containers run on
        # ``ncpus`` CPUs of the share pool (None: the whole pool again, kept so that a lifted
        # limit is written back), owner and reason.
        self._cpusets: dict[QoSClass, tuple[int | None, str, str]] = {}
        self._logged: set[tuple[str, str]] = set()
        self._classes: dict[str, QoSClass | None] = {}  # pod id -> its class (None: bad label)
        # Each class's keys (pods and containers), so that a class-wide decision touches that
        # class, without walking the node.
        self._members: dict[QoSClass, dict[str, None]] = {}
        self._member_of: dict[str, QoSClass] = {}
        # A class-wide decision (a ceiling, a cpuset limit) moves its class's generation: every
        # key of the class is recomputed when next asked, without a walk over them now.
        self._class_gens: dict[QoSClass, int] = {}
        self.rejected_labels = 0
        # The API server's pod specs (the cluster side's pod cache, once it runs): what the
        # runtime does not carry, i.e. the batch resources a pod asks without the webhook's annotation.
        self.specs: PodSpecs | None = None
        rules.subscribe(lambda _v: self.policy_changed())

    def subscribe(self, fn: Callable[[list[str]], None]) -> None:
        """``fn(keys)``: the desired state of ``keys`` changed (apply them)."""
        self._listeners.append(fn)

    # computing ----------------------------------------------------------------------------------

    def qos(self, pod: api.PodSandbox) -> QoSClass | None:
        try:
            return qos_class(pod.labels, pod.linux.cgroup_parent)
        except InvalidQoSLabel as exc:
            self.rejected_labels += 1
            self.on_invalid("qos_label")
            log.warning(
                "pod %s/%s: %s; leaving it untouched",
                pod.namespace,
                pod.name,
                exc,
                extra={"pod": f"{pod.namespace}/{pod.name}", "reason": "invalid_label"},
            )
            return None

    def qos_of(self, key: str) -> QoSClass | None:
        """The QoS class of a pod or container the node model knows (None: unknown key, or a
        label that could not be used)."""
        r = self.model.get(key)
        return None if r is None else self._class_of(r.pod)

    def _class_of(self, pod: api.PodSandbox) -> QoSClass | None:
        """Decided (and a bad label reported) once per pod of the node model."""
        if pod.id not in self._classes:
            self._classes[pod.id] = self.qos(pod)
        return self._classes[pod.id]

    def _context(
        self, pod: api.PodSandbox, container: api.Container | None, qos: QoSClass | None = None
    ) -> Context | None:
        qos = self._class_of(pod) if qos is None else qos
        if _managed(qos):
            return Context(pod, container, qos, self.rules.policy, self.caps, self.cpus, self.specs)
        return None

    def _features(self, ctx: Context | None) -> Intent | None:
        """The features' values (None: not managed). Raises FeatureFailed when a fail-closed
        feature cannot compute its values."""
        if ctx is None:
            return None
        out = desired_state(ctx, self._steps(ctx.policy))
        for feature, reason in out.failed:
            self._invalid(ctx.pod, feature, reason)
        return out.intent

    def intent(self, key: str) -> Intent | None:
        """The merged desired state of ``key`` (features ⊕ overlays); cached per generation."""
        stamp = self._class_stamp(key)
        cached = self._cache.get(key)
        if cached is not None and cached[1] == stamp:
            return cached[0]
        r = self.model.get(key)
        if r is None:
            intent: Intent | None = self._compose(key, None, None, None)
        else:
            intent = self._compose(key, r.pod, r.container, self._class_of(r.pod))
        if self._known(key):  # a gone container's key (a late check) is not kept
            self._cache[key] = (intent, stamp)
        return intent

    def intent_before_known(self, pod: api.PodSandbox, container: api.Container) -> Intent | None:
        """The desired state of a container the node model does not know yet — CreateContainer
        answers with it before the model takes the container in (right after the answer) —
        the same :meth:`intent` gives once it is known. Not cached. A pod whose label cannot
        be used is unmanaged (None); the model reports it when it takes the pod in."""
        try:
            qos = self._class_before_known(pod, pod.labels.get(QOS_LABEL))
        except InvalidQoSLabel:
            return None
        return self._compose(container.id, pod, container, qos)

    def _class_before_known(self, pod: api.PodSandbox, label: str | None) -> QoSClass | None:
        """The class the model decided for the pod, or for a pod it does not know yet its QoS
        ``label``'s (the value, read by the caller; raises InvalidQoSLabel, not reported here:
        the model reports it when it takes the pod in)."""
        pid = pod.id  # read once: each read of a field makes a new str
        if pid in self._classes:  # not try/except: a pod not known yet is the usual case
            return self._classes[pid]
        return labelled_class(label) or kubernetes_class(pod.linux.cgroup_parent)

    def manages(self, pod: api.PodSandbox) -> bool:
        """Whether the pod's containers have a desired state (a class the agent manages), known
        to the model or not: what :meth:`intent` being None says, without working it out."""
        try:
            return _managed(self._class_before_known(pod, pod.labels.get(QOS_LABEL)))
        except InvalidQoSLabel:
            return False

    @staticmethod
    def born_managed(key: tuple[object, ...]) -> bool:
        """What :meth:`manages` says of the pod a :meth:`birth_key` was made for (asked once
        per key: the answer is kept with the key's)."""
        return _managed(key[0])

    def birth_key(self, pod: api.PodSandbox, container: api.Container) -> tuple[object, ...] | None:
        """Everything :meth:`intent_before_known`'s values for ``container`` depend on, as one
        hashable key: the class (first: :meth:`born_managed`), the pod annotations and labels
        the features declare, the container's name and resources, and the stamps of the node's
        state (policy epoch, the class's generation — its ceiling and cpuset limit —, the share
        pool's). Containers with equal keys get equal values, whatever their pod's name, uid or
        other metadata.
        None: nothing to share (a bad label, state of its own already — an overlay —, or
        exclusive CPUs to hand out: :meth:`pins`). Each map of the request is read once (a read
        makes a new wrapper)."""
        labels = pod.labels
        label = labels.get(QOS_LABEL)  # read once: for the pin rule, the class and the key
        if self._pins(label):
            return None
        try:
            qos = self._class_before_known(pod, label)
        except InvalidQoSLabel:
            return None
        cid = container.id
        if qos is None or cid in self.overlays or cid in self._baselines:
            return None
        return (
            qos,
            self._epoch,
            self._class_gens.get(qos, 0),
            self.cpus.generation,
            tuple(map(pod.annotations.get, POD_ANNOTATIONS)),
            None if self.specs is None else self.specs.extended_resource_spec(pod.uid),
            label,
            tuple(map(labels.get, _KEY_LABELS)),
            container.name,
            container.linux.resources.SerializeToString(deterministic=True),
        )

    def _compose(
        self, key: str, pod: api.PodSandbox | None, container: api.Container | None, qos: QoSClass | None
    ) -> Intent | None:
        """Features ⊕ overlays ⊕ the class's ceiling and cpuset limit (``pod`` None: a key
        the model does not know, e.g. a QoS-level group: its overlays alone)."""
        intent = self._features(self._context(pod, container, qos)) if pod is not None else Intent()
        decisions = self.overlays.of(key)
        base = self._baselines.get(key)
        if base and intent is not None:
            intent = intent.copy()
            for resource, value in base.items():
                if value is None and pod is not None:
                    value = requested(container, resource)
                if value is not None and (resource, "") not in intent.files:
                    intent.files[(resource, "")] = Setting(
                        resource, value, "the value before an overlay replaced it", owner="baseline"
                    )
        if decisions:
            intent = intent.copy() if intent is not None else Intent()
            for d in decisions:
                for resource, value in d.values:
                    intent.files[(resource, "")] = Setting(resource, value, d.reason, owner=d.owner)
            cap_burst(intent.files)
        cap = self._in_force.get(qos) if qos is not None else None
        if cap is not None and intent is not None:
            intent = self._ceiling(intent, *cap)
        limit = self._cpusets.get(qos) if qos is not None else None
        if limit is not None and intent is not None and container is not None:
            intent = self._cpuset_limit(key, intent, *limit)
        return intent

    def pins(self, pod: api.PodSandbox) -> bool:
        """Whether the pod's containers get exclusive CPUs when the model takes them in (then
        the share pool may move, and every sharer with it)."""
        return self._pins(pod.labels.get(QOS_LABEL))

    def _pins(self, label: str | None) -> bool:
        """:meth:`pins` from the value of the pod's QoS label (birth_key read it already)."""
        return self.rules.policy.features.cpuset.enable and cpuset.candidate_class(label)

    def _known(self, key: str) -> bool:
        """Something that exists: in the node model, or a QoS-level group (owned, not modelled).
        Per-key state is kept only for these, so keys that went leave nothing behind."""
        return key in self.model or key.startswith(GROUP_PREFIX)

    @staticmethod
    def _ceiling(intent: Intent, cores: float, owner: str, reason: str) -> Intent:
        q = intent.files.get(("cpu.cfs_quota_us", ""))
        if q is None or not isinstance(q.value, int) or q.value < 0:
            return intent  # no finite quota: under a limited parent, unlimited is allowed
        p = intent.get("cpu.cfs_period_us")
        period = cfs_period(p)
        ceiling = max(MIN_QUOTA_US, int(cores * period))
        if q.value <= ceiling:
            return intent
        intent = intent.copy()
        why = f"{q.why}; at most {cores:.2f} cores while {reason}"
        intent.files[("cpu.cfs_quota_us", "")] = Setting("cpu.cfs_quota_us", ceiling, why, owner=owner)
        cap_burst(intent.files)
        return intent

    def _cpuset_limit(self, key: str, intent: Intent, ncpus: int | None, owner: str, reason: str) -> Intent:
        if key in self.cpus.exclusive or not self.caps.files.get("cpuset.cpus", False):
            return intent
        cpus = self.cpus.share_pool() if ncpus is None else self.cpus.shared_subset(ncpus)
        intent = intent.copy()
        intent.files[("cpuset.cpus", "")] = Setting("cpuset.cpus", format_cpulist(cpus), reason, owner=owner)
        return intent

    def settings(self, key: str) -> tuple[Generation, list[Setting]]:
        """The cgroup file settings of ``key`` and the generation they belong to. A fail-closed
        failure cannot refuse something that exists: it leaves the files as they are."""
        gen = self.generation(key)
        try:
            intent = self.intent(key)
        except FeatureFailed as exc:
            log.debug("no desired state for %s: %s", key, exc)
            return gen, []
        return gen, [] if intent is None else intent.settings()

    def generation(self, key: str) -> Generation:
        return self._epoch, self._gens.get(key, 0), self._class_stamp(key)

    def _class_stamp(self, key: str) -> int:
        qos = self._member_of.get(key)
        return 0 if qos is None else self._class_gens.get(qos, 0)

    def _class_changed(self, qos: QoSClass) -> None:
        """Every key of ``qos`` has a new desired state: recomputed when asked; the
        subscribers are told which keys (they apply them in turns)."""
        self._class_gens[qos] = self._class_gens.get(qos, 0) + 1
        keys = list(self._members.get(qos, ()))
        if keys:
            for fn in self._listeners:
                fn(keys)

    # what changes it ----------------------------------------------------------------------------

    def invalidate(self, keys: Iterable[str]) -> list[str]:
        """Forget what was computed for ``keys`` and tell the subscribers."""
        changed = []
        for key in keys:
            self._cache.pop(key, None)
            self._next += 1
            if self._known(key):
                self._gens[key] = self._next
            else:
                self._gens.pop(key, None)
            changed.append(key)
        if changed:
            for fn in self._listeners:
                fn(changed)
        return changed

    def use_specs(self, specs: PodSpecs | None) -> None:
        """The cluster side's pod specs from now on (None: no more). Nothing worked out without
        them is reused (a new epoch); the pods they change are told through :meth:`spec_changed`."""
        self.specs = specs
        self._epoch += 1
        self._cache.clear()

    def spec_changed(self, uid: str) -> None:
        """What the API server says of pod ``uid`` changed (it was seen for the first time, say,
        after its containers were created): its keys are worked out again and applied."""
        model = self.model
        keys = [k for k in model if (r := model.get(k)) is not None and r.pod.uid == uid]
        if keys:
            self.invalidate(keys)

    def policy_changed(self) -> None:
        self._epoch += 1
        self._cache.clear()
        keys = [*self.model, *(k for k in self.overlays.targets() if k not in self.model)]
        for fn in self._listeners:
            fn(keys)

    def set_overlay(
        self,
        key: str,
        owner: str,
        values: dict[str, int | str],
        reason: str,
        before: dict[str, int | str] | None = None,
    ) -> bool:
        """Layer ``owner``'s decision over ``key``'s desired state; re-applies that key only.
        Where no feature sets a resource, the value it replaces is remembered and comes back
        when the last overlay on it is withdrawn (for a container: what the runtime asked;
        ``before``: what the owner knows it was, when the file may still hold a previous
        agent's overlay)."""
        try:
            have = self.intent(key)
        except FeatureFailed:
            have = None
        base = self._baselines.get(key, {})
        r = self.model.get(key)
        new: dict[str, int | str | None] = {}
        for resource in values:
            if resource in base or (
                have is not None and have.get(resource) is not None and not self._overlaid(key, resource)
            ):
                continue
            asked = requested(r.container, resource) if r is not None else None
            if before is not None and resource in before:
                new[resource] = before[resource]
            else:
                new[resource] = None if asked is not None else self.current(key, resource)
        if not self.overlays.set(key, owner, values, reason):  # raises on a bad value: nothing kept
            return False
        if new:
            self._baselines[key] = {**base, **new}
        self.invalidate([key])
        return True

    def set_ceiling(self, qos: QoSClass, cores: float, owner: str, reason: str) -> None:
        """A CFS-bandwidth ceiling for every pod and container of ``qos`` (see ``_caps``); in
        force at once when it is lower than what the class's groups hold, once they hold it
        when higher."""
        if self._caps.get(qos) == (cores, owner, reason):
            return
        self._caps[qos] = (cores, owner, reason)
        self._recap(qos)

    def bound(self, qos: QoSClass, group: str) -> None:
        """``group`` is a QoS-level group above every pod of ``qos`` (BE's): what it holds
        bounds them (see ``_held``), read now and followed from now on through
        :meth:`group_written`."""
        group = group.strip("/")
        if self._bounds.get(group) is qos:
            return
        self._bounds[group] = qos
        cores = self._read_held(group)
        self._held[group] = None if cores is False else cores
        self._recap(qos)

    def learn_held(self, qos: QoSClass, groups: Iterable[str]) -> dict[str, float]:
        """Read what the kernel holds on ``groups`` (those that exist), QoS-level groups above
        every pod of ``qos``, before the first hook is answered: a restarted agent caps new
        containers at what the previous one left. Returns the limited ones (cores)."""
        for g in groups:
            if self._read_held(g.strip("/")) is not False:
                self.bound(qos, g)
        return {g: c for g, c in self._held.items() if c is not None and self._bounds.get(g) is qos}

    def group_written(self, group: str, resource: str) -> None:
        """The one writer wrote ``resource`` of ``group``: when it is a bounding group's CFS
        bandwidth, what it holds now moves the ceiling in force."""
        if resource not in ("cpu.cfs_quota_us", "cpu.cfs_period_us"):
            return
        qos = self._bounds.get(group.strip("/"))
        if qos is None:
            return
        cores = self._read_held(group.strip("/"))
        self._held[group.strip("/")] = None if cores is False else cores
        self._recap(qos)

    def _read_held(self, group: str) -> float | Literal[False] | None:
        """The group's CFS bandwidth in cores (None: no limit; False: no such group)."""
        key = GROUP_PREFIX + group
        quota = self.current(key, "cpu.cfs_quota_us")
        if not isinstance(quota, int):
            return False
        if quota < 0:
            return None
        period = self.current(key, "cpu.cfs_period_us")
        return quota / cfs_period(period)

    def _recap(self, qos: QoSClass) -> None:
        """The ceiling in force for ``qos``: the lower of the one decided and what its groups
        hold; the class's keys are recomputed when it moves."""
        want = self._caps.get(qos)
        held = [c for g, c in self._held.items() if c is not None and self._bounds.get(g) is qos]
        low = min(held, default=None)
        now = want
        if low is not None and (want is None or low < want[0] - 1e-5):  # 1 us a period: the same quota
            owner = want[1] if want is not None else "kernel"
            now = (low, owner, f"its QoS-level group holds {low:.2f} cores")
        if self._in_force.get(qos) == now:
            return
        if now is None:
            self._in_force.pop(qos, None)
        else:
            self._in_force[qos] = now
        self._class_changed(qos)

    def set_cpuset_limit(self, qos: QoSClass, ncpus: int | None, owner: str, reason: str) -> None:
        """Every container of ``qos`` on ``ncpus`` CPUs of the share pool (None: all of it).
        Containers only: on cgroup v1 a parent's cpuset cannot shrink below its children's, and
        the containers' own sets already confine every task; their parents keep theirs."""
        if self._cpusets.get(qos) == (ncpus, owner, reason):
            return
        self._cpusets[qos] = (ncpus, owner, reason)
        self._class_changed(qos)

    def capped(self, key: str) -> bool:
        """Whether a class-wide CFS ceiling applies to ``key`` now (its class is suppressed)."""
        return bool(self._in_force) and self.qos_of(key) in self._in_force

    def withdraw_ceiling(self, qos: QoSClass) -> None:
        """No decided ceiling any more; what the class's groups hold still bounds it until
        they are raised."""
        if self._caps.pop(qos, None) is not None:
            self._recap(qos)

    def _overlaid(self, key: str, resource: str) -> bool:
        return any(resource in dict(d.values) for d in self.overlays.of(key))

    def withdraw_overlay(self, key: str, owner: str) -> bool:
        if self.overlays.withdraw(key, owner):
            self.invalidate([key])
            return True
        return False

    def sharers(self, skip: str = "") -> list[str]:
        """Containers that follow the share pool (not pinned to exclusive CPUs)."""
        return [k for k, _ in self.model.containers() if k not in self.cpus.exclusive and k != skip]

    def _pool_moved(self, skip: str = "") -> list[str]:
        """Exclusive CPUs changed hands: the sharers' cpusets follow. Returns them."""
        if self.cpus.generation == self._pool:
            return []
        self._pool = self.cpus.generation
        return self.invalidate(self.sharers(skip))

    # node model listener ------------------------------------------------------------------------

    def added(self, key: str) -> None:
        r = self.model.get(key)
        if r is None:
            return
        qos = self._class_of(r.pod)
        if qos is not None:
            self._members.setdefault(qos, {})[key] = None
            self._member_of[key] = qos
        if r.container is None or not cpuset.candidate(r.pod):
            return
        ctx = self._context(r.pod, r.container)
        if ctx is not None and self.rules.policy.features.cpuset.enable:
            try:
                shortfall = cpuset.assign(ctx)
            except InvalidInput as exc:
                self._invalid(r.pod, "cpuset", str(exc))
            else:
                if shortfall is not None:
                    self.on_invalid("cpuset_capacity")
                    self._once(
                        ("cpuset_capacity", shortfall),
                        "%s/%s/%s: %s container runs in the share pool: %s (said once per shortfall; "
                        'nriplugin_invalid_input_total{reason="cpuset_capacity"} counts each)',
                        r.pod.namespace,
                        r.pod.name,
                        r.container.name,
                        ctx.qos,
                        shortfall,
                    )
        self._pool_moved()

    def started(self, key: str, existing: bool) -> None:
        pass

    def resynced(self) -> None:
        pass

    def changed(self, key: str) -> None:
        self.invalidate([key])

    def removed(self, key: str) -> None:
        qos = self._member_of.pop(key, None)
        if qos is not None:
            self._members[qos].pop(key, None)
        if key.startswith(POD_PREFIX):
            self._classes.pop(key[len(POD_PREFIX) :], None)
        self._cache.pop(key, None)
        self._gens.pop(key, None)
        self._baselines.pop(key, None)
        self.overlays.forget(key)
        if self.cpus.release(key):
            self._pool_moved(skip=key)

    def _invalid(self, pod: api.PodSandbox, feature: str, reason: str) -> None:
        self.on_invalid(feature)
        self._once((feature, reason), "pod %s/%s: %s skipped: %s", pod.namespace, pod.name, feature, reason)

    def _once(self, what: tuple[str, str], msg: str, *args: object) -> None:
        """Log once per distinct (kind, reason); the metric counts every occurrence."""
        if what in self._logged:
            return
        if len(self._logged) > 1000:
            self._logged.clear()
        self._logged.add(what)
        log.warning(msg, *args, extra={"reason": what[0]})
