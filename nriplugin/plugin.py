"""The QoS plugin: runs the feature pipeline (one desired state) and turns it into NRI
adjustments at creation, cgroup writes for what NRI cannot carry on cgroup v1, pod-level
writes at RunPodSandbox, and updates at Synchronize and UpdateContainer."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from .features import Context, FeatureFailed, Intent, core_sched, desired_state
from .features.cpuset import CPUAllocator
from .kernel import paths
from .kernel.cgroup import RESOURCES, Cgroups, InvalidValue, Version
from .kernel.coresched import CoreSched
from .kernel.probe import Capabilities, format_cpulist, probe
from .kernel.resctrl import ResctrlError, ResctrlFS
from .nri import api_pb2 as api
from .nri.stub import Plugin
from .policy.cache import RuleCache
from .policy.qos import InvalidQoSLabel, QoSClass, qos_class
from .reconciler import Reconciler

log = logging.getLogger("nriplugin.plugin")

# Logical resources the NRI adjustment carries itself (LinuxResources fields).
NRI_FIELDS = (
    "cpu.shares",
    "cpu.cfs_quota_us",
    "cpu.cfs_period_us",
    "cpuset.cpus",
    "cpuset.mems",
    "memory.limit_in_bytes",
)


def to_resources(intent: Intent, cg: Cgroups, out: api.LinuxResources) -> bool:
    """Fill ``out`` with the values NRI can carry (on cgroup v2 everything else goes in
    ``unified``); returns whether anything was set."""
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
    if cg.version is Version.V2:
        for name, value in v.items():
            res = RESOURCES.get(name)
            if name not in NRI_FIELDS and res is not None and res.v2 is not None:
                out.unified[res.v2] = cg.encode(name, value)
    if intent.rdt_class:
        out.rdt_class.value = intent.rdt_class
    return bool(v) or bool(intent.rdt_class)


def file_only(intent: Intent) -> dict[str, int | str]:
    """cgroup values NRI cannot carry (resctrl groups and core scheduling cookies are not
    files: they are handled on their own)."""
    return {k: v for k, v in intent.values.items() if k not in NRI_FIELDS and (k in RESOURCES or " " in k)}


class QoSPlugin(Plugin):
    def __init__(
        self,
        rules: RuleCache | None = None,
        caps: Capabilities | None = None,
        cgroups: Cgroups | None = None,
        on_invalid: Callable[[str], None] | None = None,
        push: Callable[[list[api.ContainerUpdate]], Awaitable[object]] | None = None,
        resctrl_root: Path = Path("/sys/fs/resctrl"),
        coresched: CoreSched | None = None,
    ) -> None:
        self.rules = rules or RuleCache()
        self.cgroups = cgroups or Cgroups(Path("/sys/fs/cgroup"))
        self.caps = caps or probe(self.cgroups.root)
        self.on_invalid = on_invalid or (lambda reason: None)
        self.push = push  # UpdateContainers from outside handlers (the stub's)
        self.resctrl = ResctrlFS(resctrl_root, self.caps.resctrl)
        self.coresched = coresched or (CoreSched() if self.caps.core_sched else None)
        self.cpus = CPUAllocator(self.caps.topology)
        # Containers whose cpuset is the share pool: they follow it when exclusive cores change.
        self.sharers: set[str] = set()
        self._pushes: set[asyncio.Future[object]] = set()  # UpdateContainers in flight (kept referenced)
        self._logged: set[tuple[str, str]] = set()
        self.reconciler: Reconciler | None = None  # keeps the files true while containers run
        self.rejected_labels = 0

    # desired state ---------------------------------------------------------------------------

    def _qos(self, pod: api.PodSandbox) -> QoSClass | None:
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

    def intent(self, pod: api.PodSandbox, container: api.Container | None) -> Intent | None:
        """The one desired state of a container (or of the pod when ``container`` is None)."""
        qos = self._qos(pod)
        if qos is None or qos is QoSClass.SYSTEM:
            return None
        ctx = Context(pod, container, qos, self.rules.policy, self.caps, self.cpus)
        out = desired_state(ctx)
        for feature, reason in out.failed:
            self.on_invalid(feature)
            if (feature, reason) not in self._logged:  # once per distinct reason; the metric counts all
                if len(self._logged) > 1000:
                    self._logged.clear()
                self._logged.add((feature, reason))
                log.warning(
                    "pod %s/%s: %s skipped: %s",
                    pod.namespace,
                    pod.name,
                    feature,
                    reason,
                    extra={"pod": f"{pod.namespace}/{pod.name}", "feature": feature, "reason": "invalid_input"},
                )
        return out.intent

    def state_version(self) -> tuple[int, int]:
        """Changes whenever a container's desired values may have: a new policy, or exclusive
        CPUs handed out or returned (the share pool). Pod/container data is fixed per entry."""
        return self.rules.current.version, self.cpus.generation

    def _existing(self, pod: api.PodSandbox, container: api.Container) -> Intent | None:
        """The intent of a container that exists already (Synchronize, inventory), noting
        whether it follows the share pool. A fail-closed feature cannot refuse a container that
        runs: that is logged and the container left as it is (None)."""
        try:
            intent = self.intent(pod, container)
        except FeatureFailed as exc:
            log.warning("%s/%s/%s: %s", pod.namespace, pod.name, container.name, exc)
            return None
        self._track(pod, container, intent)
        return intent

    def _track(self, pod: api.PodSandbox, container: api.Container, intent: Intent | None) -> None:
        cpuset_on = self.rules.policy.features.cpuset.enable and self.caps.files.get("cpuset.cpus", False)
        if container.id in self.cpus.exclusive or intent is None or not cpuset_on:
            self.sharers.discard(container.id)
        else:
            self.sharers.add(container.id)

    def _pool_updates(self, skip: str = "") -> list[api.ContainerUpdate]:
        """Updates moving every sharer to the current share pool."""
        pool = format_cpulist(self.cpus.share_pool())
        out = []
        for cid in self.sharers:
            if cid == skip:
                continue
            u = api.ContainerUpdate(container_id=cid, ignore_failure=True)
            u.linux.resources.cpu.cpus = pool
            out.append(u)
        return out

    # hooks -----------------------------------------------------------------------------------

    def create_container(
        self, pod: api.PodSandbox, container: api.Container
    ) -> api.ContainerAdjustment | tuple[api.ContainerAdjustment, list[api.ContainerUpdate]] | None:
        generation = self.cpus.generation
        try:
            intent = self.intent(pod, container)
        except FeatureFailed as exc:
            raise RuntimeError(f"refusing {pod.namespace}/{pod.name}/{container.name}: {exc}") from exc
        self._track(pod, container, intent)
        if intent is None:
            return None
        adj = api.ContainerAdjustment()
        if not to_resources(intent, self.cgroups, adj.linux.resources):
            return None
        if self.cpus.generation != generation:  # cores left the share pool: sharers follow
            return adj, self._pool_updates(skip=container.id)
        return adj

    def remove_container(self, pod: api.PodSandbox, container: api.Container) -> None:
        self.sharers.discard(container.id)
        if self.coresched is not None and container.pid:
            self.coresched.forget([container.pid])
        if self.reconciler is not None:
            self.reconciler.forget(container.id)
        if self.cpus.release(container.id) and self.push is not None:
            # The share pool grew. UpdateContainers must not be called from inside a handler.
            updates = self._pool_updates()
            if updates:
                task = asyncio.ensure_future(self.push(updates))
                self._pushes.add(task)
                task.add_done_callback(self._pushes.discard)

    def start_container(self, pod: api.PodSandbox, container: api.Container) -> None:
        """cgroup v1: values NRI cannot carry (burst, identity, idle) go to the files now: the
        runtime created the task (so the cgroup exists and the pid is known) and has not
        started it yet. The task joins its class's resctrl group too."""
        intent = self.intent(pod, container)
        if intent is None:
            return
        who = f"{pod.namespace}/{pod.name}/{container.name}"
        extra = file_only(intent)
        if self.cgroups.version is not Version.V1:  # NRI's unified carried the rest on v2
            extra = {k: v for k, v in extra.items() if " " in k}
        if extra:
            self._write(
                paths.container_dir(container.linux.cgroups_path, pod.linux.cgroup_parent, container.id), extra, who
            )
        rec = self.reconciler
        if rec is not None:
            rec.track(pod, container)
            # runc has built the cgroup; converge whatever NRI did not carry at creation (a
            # container created before we were there) right after this answer.
            try:
                asyncio.get_running_loop().call_soon(rec.check, container.id)
            except RuntimeError:  # no loop (explain, tests)
                rec.check(container.id)
        # Not started yet: its one task is the init process; everything it forks inherits
        # both its resctrl group and its core scheduling cookie.
        group = intent.values.get("resctrl.group")
        if isinstance(group, str) and container.pid:
            self._join_resctrl(group, [container.pid], pod, who)
        cookie = intent.values.get(core_sched.RESOURCE)
        if isinstance(cookie, str) and container.pid:
            self._share_cookie(cookie, [container.pid], who)

    def _share_cookie(self, group: str, pids: list[int], who: str) -> None:
        if self.coresched is None:
            return
        try:
            self.coresched.assign(group, pids)
        except (OSError, ValueError) as exc:
            self.on_invalid("core_sched")
            log.warning("%s: cannot give core scheduling group %s: %s", who, group, exc)

    def _join_resctrl(self, group: str, tids: list[int], pod: api.PodSandbox, who: str) -> None:
        """Move threads into the class's resctrl group (created on first use). Threads that
        exit meanwhile (ESRCH) are skipped."""
        qos = self._qos(pod)
        cfg = self.rules.policy.class_qos(qos.value if qos else "BE").resctrlQOS
        try:
            self.resctrl.ensure_group(
                group, self.resctrl.schemata(cfg.catRangeStartPercent, cfg.catRangeEndPercent, cfg.mbaPercent)
            )
            have = self.resctrl.tasks(group) if len(tids) > 1 else set()
            for tid in tids:
                if tid in have:
                    continue
                with contextlib.suppress(ProcessLookupError):
                    self.resctrl.add_task(group, tid)
        except (OSError, ResctrlError) as exc:
            self.on_invalid("resctrl")
            log.warning("%s: cannot join resctrl group %s: %s", who, group, exc)

    def _join_existing(self, pod: api.PodSandbox, container: api.Container, intent: Intent) -> None:
        """A container that was already running when we learned of it: every thread of its
        cgroup joins the resctrl group and every process gets the core scheduling cookie
        (neither is inherited by tasks that exist already)."""
        group = intent.values.get("resctrl.group")
        cookie = intent.values.get(core_sched.RESOURCE)
        if not isinstance(group, str) and not isinstance(cookie, str):
            return
        who = f"{pod.namespace}/{pod.name}/{container.name}"
        try:
            cg = paths.container_dir(container.linux.cgroups_path, pod.linux.cgroup_parent, container.id)
            tids = self.cgroups.threads(cg) if isinstance(group, str) else []
            pids = self.cgroups.threads(cg, processes=True) if isinstance(cookie, str) else []
        except (paths.BadCgroupPath, PermissionError, OSError) as exc:
            log.warning("%s: cannot list tasks: %s", who, exc)
            return
        if isinstance(group, str) and tids:
            self._join_resctrl(group, tids, pod, who)
        if isinstance(cookie, str) and pids:
            self._share_cookie(cookie, pids, who)

    def run_pod_sandbox(self, pod: api.PodSandbox) -> None:
        """Pod-level values (NRI has no pod adjustment) go to the pod's cgroup."""
        intent = self.intent(pod, None)
        if intent is not None and intent.values:
            self._write(paths.pod_dir(pod.linux.cgroup_parent), intent.values, f"{pod.namespace}/{pod.name}")
            if self.reconciler is not None:
                self.reconciler.track(pod, None)

    def remove_pod_sandbox(self, pod: api.PodSandbox) -> None:
        if self.reconciler is not None:
            self.reconciler.forget(f"pod:{pod.id}")

    def update_container(
        self, pod: api.PodSandbox, container: api.Container, resources: api.LinuxResources
    ) -> list[api.ContainerUpdate]:
        """Keep the desired values when kubelet updates a container's resources."""
        intent = self.intent(pod, container)
        if intent is None:
            return []
        u = api.ContainerUpdate(container_id=container.id)
        if not to_resources(intent, self.cgroups, u.linux.resources) or _covers(resources, u.linux.resources):
            return []
        return [u]

    def synchronize(self, pods: list[api.PodSandbox], containers: list[api.Container]) -> list[api.ContainerUpdate]:
        """Bring containers that existed before we connected to the desired state: NRI updates
        now, file-only values right after the answer (off the hook path)."""
        by_id = {p.id: p for p in pods}
        updates = []
        later: list[tuple[str, dict[str, int | str], str]] = []
        for c in containers:
            pod = by_id.get(c.pod_sandbox_id)
            if pod is None:
                continue
            intent = self._existing(pod, c)
            if intent is None:
                continue
            u = api.ContainerUpdate(container_id=c.id)
            if to_resources(intent, self.cgroups, u.linux.resources) and not _covers(
                c.linux.resources, u.linux.resources
            ):
                updates.append(u)
            extra = file_only(intent)
            # not for created-but-not-started ones: runc may be building their cgroup now
            if extra and self.cgroups.version is Version.V1 and c.state == api.CONTAINER_RUNNING:
                try:
                    later.append(
                        (
                            paths.container_dir(c.linux.cgroups_path, pod.linux.cgroup_parent, c.id),
                            extra,
                            f"{pod.namespace}/{pod.name}/{c.name}",
                        )
                    )
                except paths.BadCgroupPath as exc:
                    log.warning("%s", exc)
        if self.reconciler is None and later:
            try:
                asyncio.get_running_loop().call_soon(self._write_all, later)
            except RuntimeError:  # no loop (explain, tests): write now
                self._write_all(later)
        if self.reconciler is not None:
            # Right after the answer (not on the runtime's clock): track everything that existed
            # and converge its file-only and pod-level values.
            asyncio.get_running_loop().call_soon(self._track_all, pods, containers)
        log.info("synchronized %d pods, %d containers, %d updates", len(pods), len(containers), len(updates))
        return updates

    def _track_all(self, pods: list[api.PodSandbox], containers: list[api.Container]) -> None:
        rec = self.reconciler
        if rec is None:
            return
        by_id = {p.id: p for p in pods}
        for c in containers:
            pod = by_id.get(c.pod_sandbox_id)
            if pod is not None and c.state in (api.CONTAINER_CREATED, api.CONTAINER_RUNNING):
                # not started yet: left alone until its StartContainer
                rec.track(pod, c, pending=c.state == api.CONTAINER_CREATED)
                if c.state == api.CONTAINER_RUNNING:
                    self._join_existing_tasks(pod, c)
        for pod in pods:
            rec.track(pod, None)
        rec.full_pass()

    def _join_existing_tasks(self, pod: api.PodSandbox, c: api.Container) -> None:
        if not self.caps.resctrl.mounted and self.coresched is None:
            return
        try:
            intent = self.intent(pod, c)
        except FeatureFailed:
            return
        if intent is not None:
            self._join_existing(pod, c, intent)

    def adopt(self, pods: list[api.PodSandbox], containers: list[api.Container]) -> int:
        """Inventory from the runtime itself (CRI), for when NRI did not tell us: track every
        pod and created/running container we do not know yet and converge it now (files,
        resctrl). NRI's view wins: known entries are left alone. Returns how many containers
        were adopted."""
        rec = self.reconciler
        if rec is None:
            return 0
        by_id = {p.id: p for p in pods}
        adopted = 0
        for p in pods:
            key = f"pod:{p.id}"
            if key not in rec.entries:
                rec.track(p, None)
                rec.check(key)
        for c in containers:
            pod = by_id.get(c.pod_sandbox_id)
            if pod is None or c.state not in (api.CONTAINER_CREATED, api.CONTAINER_RUNNING):
                continue
            known = rec.entries.get(c.id)
            if known is not None:
                if known.pending and c.state == api.CONTAINER_RUNNING:  # started, with no hook to say so
                    rec.activate(c.id)
                    self._join_existing_tasks(pod, c)
                continue
            intent = self._existing(pod, c)
            # Not started: runc may be building its cgroup now; it is converged once it runs.
            rec.track(pod, c, pending=c.state == api.CONTAINER_CREATED)
            if c.id in rec.entries:
                rec.check(c.id)
                adopted += 1
                if intent is not None and c.state == api.CONTAINER_RUNNING:
                    self._join_existing(pod, c, intent)
        if adopted:
            log.info("adopted %d containers from the runtime's inventory", adopted)
        return adopted

    def pending(self) -> int:
        """Containers created but not yet seen started (the inventory looks again soon)."""
        rec = self.reconciler
        return 0 if rec is None else sum(1 for e in rec.entries.values() if e.pending)

    def prune(self, live: set[str], listed_at: float) -> int:
        """Forget tracked containers and pods (``pod:<id>``) the runtime no longer has: a
        removal we missed while disconnected. Entries tracked after the listing began stay.
        Returns how many containers were forgotten."""
        rec = self.reconciler
        if rec is None:
            return 0
        gone = [k for k, e in rec.entries.items() if k not in live and e.since < listed_at]
        for key in gone:
            rec.forget(key)
            self.sharers.discard(key)
            self.cpus.release(key)  # the share pool grows; the reconciler rewrites the sharers' cpusets
        if gone:
            log.info("forgot %d containers/pods the runtime no longer has", len(gone))
        return sum(1 for k in gone if not k.startswith("pod:"))

    def _write_all(self, writes: list[tuple[str, dict[str, int | str], str]]) -> None:
        for group, values, who in writes:
            self._write(group, values, who)

    def _write(self, group: str, values: dict[str, int | str], who: str) -> None:
        period = values.get("cpu.cfs_period_us")
        # quota before burst: the kernel checks burst against the current quota
        order = sorted(values, key=lambda r: (r == "cpu.cfs_burst_us", r))
        for key in order:
            # per-device rules are keyed "RESOURCE MAJOR:MINOR"; the file takes "MAJOR:MINOR N"
            resource, _, device = key.partition(" ")
            value: int | str = f"{device} {values[key]}" if device else values[key]
            try:
                res = self.cgroups.write(group, resource, value, period=period if isinstance(period, int) else None)
            except (InvalidValue, PermissionError) as exc:
                self.on_invalid("write_refused")
                log.warning("%s: not writing %s: %s", who, resource, exc)
                continue
            if res.status == "missing":  # gone already, or not created yet: the reconciler's job
                log.debug("%s: %s: %s", who, resource, res.detail)
            elif res.status == "rejected":
                log.warning(
                    "%s: %s %s: %s",
                    who,
                    resource,
                    res.status,
                    res.detail,
                    extra={"resource": resource, "errno": res.errno},
                )


def _covers(have: api.LinuxResources, want: api.LinuxResources) -> bool:
    """Does ``have`` already hold every value ``want`` sets?"""
    for f in ("shares", "quota", "period"):
        if want.cpu.HasField(f) and (
            not have.cpu.HasField(f) or getattr(have.cpu, f).value != getattr(want.cpu, f).value
        ):
            return False
    if want.cpu.cpus and have.cpu.cpus != want.cpu.cpus:
        return False
    if want.memory.HasField("limit") and (
        not have.memory.HasField("limit") or have.memory.limit.value != want.memory.limit.value
    ):
        return False
    return all(have.unified.get(k) == v for k, v in want.unified.items())
