"""The one writer: every cgroup value the agent sets (at StartContainer and RunPodSandbox, in the
reconciler's repairs, for the QoS manager's overlays) goes through :meth:`Writer.apply`, and
every task-group membership (resctrl, core scheduling) and task scheduling policy (BE's
SCHED_IDLE) through :meth:`Writer.join`.

The ordering rules live here and nowhere else:
- burst is never above the quota (``intent.core.cap_burst``, applied to the desired state
  itself, so what is compared is what is written);
- quota and burst are written in the order the kernel accepts: it checks the burst against
  the quota in force, so a rising quota goes first and a falling one after the burst;
- across groups (a batch of keys, :func:`children_first` and :meth:`Writer.quota_rises`):
  cgroup v1 refuses a parent's CFS bandwidth below a child's and a child's above its
  parent's, so a batch writes the groups whose bandwidth falls deepest first and those whose
  bandwidth rises afterwards, parents first. Groups it does not hold (a pod's group left
  behind) are lowered under a falling quota before it (:meth:`Cgroups.fit_descendants`).
  Whatever the final state, no write in between is refused, so the kernel never says
  ``Invalid argument`` to a value the agent meant.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from nriplugin.features import resctrl
from nriplugin.intent.core import BURST, PERIOD, QUOTA, Intent, Setting
from nriplugin.kernel.cgroup import Cgroups, InvalidValue, WriteOutcome, cfs_period
from nriplugin.kernel.coresched import CoreSched
from nriplugin.kernel.resctrl import ResctrlError, ResctrlFS
from nriplugin.kernel.sched import IDLE, Scheduler
from nriplugin.policy.model import Policy

log = logging.getLogger("nriplugin.node.writer")


def depth(group: str) -> int:
    """How deep a cgroup is (its path's components)."""
    return group.strip("/").count("/")


def children_first(keys: Iterable[str], group_of: Callable[[str], str]) -> list[str]:
    """``keys`` ordered deepest group first (ties by key, so the order is stable)."""
    return sorted(keys, key=lambda k: (-depth(group_of(k)), k))


def parents_first(keys: Iterable[str], group_of: Callable[[str], str]) -> list[str]:
    return sorted(keys, key=lambda k: (depth(group_of(k)), k))


def period_of(settings: Iterable[Setting]) -> int | None:
    for s in settings:
        if s.resource == PERIOD and isinstance(s.value, int):
            return s.value
    return None


class Writer:
    def __init__(
        self,
        cgroups: Cgroups,
        policy: Callable[[], Policy],
        resctrl_fs: ResctrlFS | None = None,
        coresched: CoreSched | None = None,
        on_invalid: Callable[[str], None] = lambda reason: None,
        on_written: Callable[[str, str], None] | None = None,
        scheduler: Scheduler | None = None,
    ) -> None:
        self.cgroups = cgroups
        self.scheduler = scheduler
        self.sched_given = 0  # tasks the agent gave SCHED_IDLE (the runtime had not)
        # (group, resource) after each value the kernel took: the desired state follows what
        # the groups that bound a class hold (``DesiredState.group_written``).
        self.on_written = on_written
        self.policy = policy
        self.resctrl = resctrl_fs
        self.coresched = coresched
        self.on_invalid = on_invalid
        # Containers the runtime put in their resctrl group itself (NRI LinuxRdt in their
        # CreateContainer answer): their start joins nothing; the entry goes at that start.
        self.rdt_placed: set[str] = set()

    def resctrl_schemata(self, group: str) -> str:
        """The schemata of a class's resctrl group under the policy (needs a resctrl mount)."""
        assert self.resctrl is not None
        cfg = self.policy().class_qos(resctrl.class_of(group)).resctrlQOS
        return self.resctrl.schemata(cfg.catRangeStartPercent, cfg.catRangeEndPercent, cfg.mbaPercent)

    def ensure_resctrl_groups(self, schemata: dict[str, str]) -> str | None:
        """Make the classes' groups (group -> its schemata) before any container names them (a
        runtime that places containers needs them to exist); the error, if one cannot be made."""
        if self.resctrl is None:
            return "no resctrl mount"
        for group, text in schemata.items():
            try:
                self.resctrl.ensure_group(group, text)
            except (OSError, ResctrlError) as exc:
                self.on_invalid("resctrl")
                return f"resctrl group {group}: {exc}"
        return None

    def order(self, group: str, settings: Iterable[Setting]) -> list[Setting]:
        out = sorted(settings, key=lambda s: s.key)
        quota = next((s for s in out if s.resource == QUOTA), None)
        burst = next((s for s in out if s.resource == BURST), None)
        if quota is None or burst is None or not isinstance(quota.value, int):
            return out
        current = self.cgroups.read(group, QUOTA)
        rising = quota.value == -1 or (isinstance(current, int) and current != -1 and quota.value >= current)
        out = [s for s in out if s.resource not in (QUOTA, BURST)]
        return [quota, burst, *out] if rising else [burst, quota, *out]

    def quota_rises(self, group: str, settings: Iterable[Setting]) -> bool:
        """Would writing ``settings`` raise ``group``'s CFS bandwidth (quota per period) above
        what the kernel holds now? Lifting a limit (-1) is a rise; any value under no limit is
        not. Reads the group's quota (and period) only when ``settings`` set a quota."""
        settings = list(settings)
        quota = next((s.value for s in settings if s.resource == QUOTA), None)
        if not isinstance(quota, int):
            return False
        try:
            cur = self.cgroups.read(group, QUOTA)
        except (OSError, ValueError):
            return False
        if not isinstance(cur, int) or cur < 0 or cur >= 2**62:
            return False  # no limit now: nothing is above it
        if quota < 0:
            return True
        try:
            cur_period = self.cgroups.read(group, PERIOD)
        except (OSError, ValueError):
            cur_period = None
        have = cfs_period(cur_period)
        want = period_of(settings) or have
        return quota * have > cur * want

    def apply(
        self, group: str, settings: Iterable[Setting], who: str, *, period: int | None = None, force: bool = False
    ) -> list[tuple[Setting, WriteOutcome]]:
        """Write ``settings`` to cgroup ``group`` in the kernel's order; returns each outcome.
        A value the kernel lacks is reported once by the cgroup layer; a refused one is logged."""
        settings = list(settings)
        if period is None:
            period = period_of(settings)
        done = []
        held = self._burst_held(group, settings)
        for s in self.order(group, settings):
            if s is held:
                log.debug("%s: %s waits: above the quota in force", who, s.label)
                done.append((s, WriteOutcome("held", 0, "above the quota in force")))
                continue
            try:
                if s.resource == QUOTA and isinstance(s.value, int):
                    self._make_room(group, s.value, who)
                res = self.cgroups.write(group, s.resource, s.file_value, period=period, force=force)
            except (InvalidValue, PermissionError) as exc:
                self.on_invalid("write_refused")
                log.warning("%s: not writing %s: %s", who, s.label, exc)
                continue
            if res.status == "written" and self.on_written is not None:
                self.on_written(group, s.resource)
            elif res.status == "missing":  # gone already, or not created yet: the reconciler's job
                log.debug("%s: %s: %s", who, s.label, res.detail)
            elif res.status == "rejected":
                log.warning(
                    "%s: %s %s: %s",
                    who,
                    s.label,
                    res.status,
                    res.detail,
                    extra={"resource": s.resource, "errno": res.errno},
                )
            done.append((s, res))
        return done

    def _burst_held(self, group: str, settings: list[Setting]) -> Setting | None:
        """A burst that must wait: the kernel refuses a burst above the group's quota (v1 and
        v2), so one set without its quota (a resize raised the limit and the runtime has not
        written the new quota yet) waits for the quota to move rather than be refused."""
        burst = next((s for s in settings if s.resource == BURST), None)
        if burst is None or not isinstance(burst.value, int) or any(s.resource == QUOTA for s in settings):
            return None
        try:
            cur = self.cgroups.read(group, QUOTA)
        except (OSError, ValueError):
            return None
        if isinstance(cur, int) and 0 <= cur < 2**62 and burst.value > cur:
            return burst
        return None

    def _make_room(self, group: str, quota: int, who: str) -> None:
        """cgroup v1: lower any group under ``group`` whose bandwidth is above ``quota`` (ones
        the agent holds were ordered children first; this is for those it does not). The
        kernel checks the quota against the period in force when it is written, so that is
        the period read (a new one in the same batch is written before the quota, by key)."""
        for sub, old, new in self.cgroups.fit_descendants(group, quota):
            log.info(
                "%s: lowered %s's cpu.cfs_quota_us from %d to %d first: cgroup v1 refuses a group's "
                "quota below a descendant's",
                who,
                sub,
                old,
                new,
                extra={"group": sub, "old": old, "new": new},
            )

    def join(self, intent: Intent, group: str, pid: int, who: str, resctrl_too: bool = True) -> None:
        """Put a container's tasks in its task groups. ``pid``: a new container's init process
        (everything it forks inherits both groups); 0: a container that already ran, so every
        thread of its cgroup (resctrl) and every process (core scheduling) is moved.
        ``resctrl_too`` False: the runtime placed it in its resctrl group (NRI LinuxRdt).
        A scheduling policy (SCHED_IDLE) goes to every thread: for a new container its init
        process, whose children inherit it; one that already ran, each thread of its group."""
        self._sched(intent, group, pid, who)
        rg, cs = intent.resctrl_group, intent.core_sched_group
        if rg is not None and self.resctrl is not None and resctrl_too:
            tids = [pid] if pid else self._tasks(group, who, processes=False)
            if tids:
                group_name = str(rg.value)
                schemata = self.resctrl_schemata(group_name)
                try:
                    self.resctrl.join(group_name, schemata, tids)
                except (OSError, ResctrlError) as exc:
                    self.on_invalid("resctrl")
                    log.warning("%s: cannot join resctrl group %s: %s", who, rg.value, exc)
        if cs is not None and self.coresched is not None:
            pids = [pid] if pid else self._tasks(group, who, processes=True)
            if pids:
                try:
                    self.coresched.assign(str(cs.value), pids)
                except (OSError, ValueError) as exc:
                    self.on_invalid("core_sched")
                    log.warning("%s: cannot give core scheduling group %s: %s", who, cs.value, exc)

    def _sched(self, intent: Intent, group: str, pid: int, who: str) -> None:
        if intent.sched_policy is None or self.scheduler is None:
            return
        tids = [pid] if pid else self._tasks(group, who, processes=False)
        done = self.scheduler.ensure(tids, group, IDLE)
        self.sched_given += done.set
        if done.error is not None:
            self.on_invalid("sched_policy")
            log.warning("%s: cannot give its tasks SCHED_IDLE: %s", who, done.error)
        elif done.set:
            log.debug("%s: gave %d task(s) SCHED_IDLE (the runtime had not)", who, done.set)

    def _tasks(self, group: str, who: str, processes: bool) -> list[int]:
        try:
            return self.cgroups.threads(group, processes=processes)
        except (PermissionError, OSError) as exc:
            log.warning("%s: cannot list tasks: %s", who, exc)
            return []
