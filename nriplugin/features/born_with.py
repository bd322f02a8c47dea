"""What a BE container's process is born with, through the runtime (NRI's
``LinuxContainerAdjustment``): nothing to write later, nothing that can lag the first
instruction the container runs.

- ``SCHED_IDLE`` (NRI scheduler, v0.11+): the kernel's own "run only when nothing else wants
  this CPU". A SCHED_IDLE task weighs 3 against a normal task's 1024 at nice 0 and never
  preempts one at wakeup, so LS keeps its latency even inside the quota BE is allowed.
- IO priority idle class (NRI v0.10+): BE's reads and writes are served only when no other
  class has IO queued on the disk (under BFQ; other schedulers ignore the class).
- ``oom_score_adj`` (NRI v0.8+, Koordinator's oomscoreadj hook): the kernel's OOM killer takes
  BE first. The default is 1000, the kernel's maximum: the kubelet gives a Burstable LS
  container 2-999 and a Guaranteed one -997, so only 1000 puts every BE process, however
  small, ahead of every LS one (a smaller value lets a large LS process outscore a small BE
  one). Raising the value needs no privilege, so no runtime refuses it.

Each is on for BE by default (``Policy.beProcess``), asked of the runtime only where its NRI
carries it (:class:`RuntimeCaps`, learnt once at Configure): on an older runtime it is not
asked for, and BE keeps today's protection (``cpu.shares`` 2, group identity or, under the
coreSched policy, ``cpu.idle``, and the QoS manager's quota). LS, LSR and SYSTEM containers are never touched.

The OCI runtime applies ``process.scheduler`` and ``process.ioPriority`` from runc 1.2 on; an
older runc ignores them silently (``doctor`` cannot see the OCI runtime, the docs say so).
Pure: :func:`plan` is computed once per (policy, runtime), the hook merges its template.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nriplugin.nri import api_pb2 as api
from nriplugin.nri.runtime import FEATURES, RuntimeCaps
from nriplugin.policy.model import BEProcess, Policy


@dataclass(frozen=True)
class Item:
    """One attribute: its name for people, the NRI feature that carries it, whether it is in
    force, and why (or why not)."""

    name: str
    nri_feature: str
    in_force: bool
    why: str


@dataclass(frozen=True)
class BirthPlan:
    """What BE containers are born with on this runtime under this policy."""

    items: tuple[Item, ...]
    template: api.LinuxContainerAdjustment = field(default_factory=api.LinuxContainerAdjustment)

    @property
    def empty(self) -> bool:
        return not any(i.in_force for i in self.items)

    def lines(self) -> dict[str, str]:
        """``{"SCHED_IDLE for BE": "in force (NRI scheduler, runtime NRI v0.12.5)"}``, ..."""
        return {i.name: i.why for i in self.items}

    def apply(self, adj: api.ContainerAdjustment) -> bool:
        """Merge into a BE container's adjustment; whether anything was added."""
        if self.empty:
            return False
        adj.linux.MergeFrom(self.template)
        return True


def _since(feature: str) -> str:
    v = FEATURES[feature]
    return f"v{v[0]}.{v[1]}"


def _item(
    name: str,
    feature: str,
    wanted: bool,
    off_by: str,
    runtime: RuntimeCaps,
    via: str,
    without: str = "today's path in force",
) -> Item:
    if not wanted:
        return Item(name, feature, False, f"off (policy beProcess.{off_by})")
    if not runtime.supports(feature):
        return Item(
            name,
            feature,
            False,
            f"not available (runtime NRI {runtime.nri_version} < {_since(feature)}); {without}",
        )
    return Item(name, feature, True, f"in force ({via}, runtime NRI {runtime.nri_version})")


def plan(policy: Policy, runtime: RuntimeCaps) -> BirthPlan:
    """The attributes in force, decided once per policy and runtime (the one place)."""
    cfg: BEProcess = policy.beProcess
    adj = cfg.oomScoreAdj
    items = (
        _item(
            "SCHED_IDLE for BE",
            "linux_scheduler",
            cfg.schedIdle,
            "schedIdle",
            runtime,
            "NRI scheduler",
            "set by the agent at StartContainer",
        ),
        _item(
            "IO priority idle for BE", "io_priority", cfg.ioPriorityIdle, "ioPriorityIdle", runtime, "NRI IO priority"
        ),
        _item(
            f"oom_score_adj {adj} for BE" if adj is not None else "oom_score_adj for BE",
            "oom_score_adj",
            adj is not None,
            "oomScoreAdj",
            runtime,
            "NRI OOM score adjustment",
        ),
    )
    t = api.LinuxContainerAdjustment()
    on = {i.nri_feature for i in items if i.in_force}
    if "linux_scheduler" in on:
        t.scheduler.policy = api.SCHED_IDLE  # nice, priority 0: SCHED_IDLE takes neither
    if "io_priority" in on:
        t.io_priority.CopyFrom(api.LinuxIOPriority(priority=0))
        setattr(t.io_priority, "class", api.IOPRIO_CLASS_IDLE)  # "class" is a Python keyword
    if "oom_score_adj" in on and adj is not None:
        t.oom_score_adj.value = adj
    return BirthPlan(items, t)


class BirthPlans:
    """:func:`plan`, kept while the policy and runtime stay, by whoever asks on every BE
    create (the hook adapter)."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: tuple[Policy, RuntimeCaps, BirthPlan] | None = None

    def __call__(self, policy: Policy, runtime: RuntimeCaps) -> BirthPlan:
        last = self._last
        if last is None or last[0] is not policy or last[1] != runtime:
            last = self._last = (policy, runtime, plan(policy, runtime))
        return last[2]
