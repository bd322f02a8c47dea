"""CPUSet pools from the node's real topology: LSE/LSR containers get exclusive whole cores
(SMT siblings together, one NUMA node where it fits), everyone else shares the rest.

Exclusive cores come from Koordinator's scheduler decision in
``scheduling.koordinator.sh/resource-status`` ({"cpuset": "2-3"}) when present, else from the
local allocator sized by the container's CFS quota (limit == request for these classes). Only
pods labelled LSE/LSR explicitly are pinned: a Guaranteed pod without the label is left to
kubelet's CPU manager rather than fought over.
"""

from __future__ import annotations

import math

from nriplugin.features.registry import feature
from nriplugin.intent.core import Context, Intent, InvalidInput
from nriplugin.intent.cpus import NoCapacity
from nriplugin.kernel.cgroup import CFS_PERIOD_US
from nriplugin.kernel.cpulist import format_cpulist, parse_cpulist
from nriplugin.nri import api_pb2 as api
from nriplugin.policy.qos import QOS_LABEL

RESOURCE_STATUS = "scheduling.koordinator.sh/resource-status"


def scheduled_cpus(ctx: Context) -> set[int] | None:
    status = ctx.annotation_json(RESOURCE_STATUS)
    if status is None:
        return None
    if not isinstance(status, dict):
        raise InvalidInput(RESOURCE_STATUS, "expected a JSON object")
    raw = status.get("cpuset")
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise InvalidInput(RESOURCE_STATUS, "cpuset must be a cpu list string")
    try:
        return set(parse_cpulist(raw))
    except ValueError as exc:
        raise InvalidInput(RESOURCE_STATUS, f"cpuset {raw[:40]!r}: {exc}") from exc


def candidate(pod: api.PodSandbox) -> bool:
    """Only pods labelled LSE/LSR are pinned (see the module's docstring)."""
    return candidate_class(pod.labels.get(QOS_LABEL))


def candidate_class(label: str | None) -> bool:
    """:func:`candidate` from the value of the pod's QoS label (a caller that read it already)."""
    return label in ("LSE", "LSR")


def assign(ctx: Context) -> str | None:
    """The allocation step, taken once when a container becomes known (CreateContainer,
    Synchronize, the inventory), never while computing desired state: pin an LSE/LSR container
    to exclusive cores. Returns None when pinned or not a candidate, else the capacity
    shortfall (the container then runs in the share pool, never on someone's exclusive core).
    A malformed scheduling annotation raises InvalidInput (it, too, leaves the container in
    the share pool)."""
    alloc = ctx.cpus
    if alloc is None or ctx.container is None or not ctx.has("cpuset.cpus"):
        return None
    if not candidate(ctx.pod):
        return None
    owner = ctx.container.id
    if owner in alloc.exclusive:
        return None
    try:
        wanted = scheduled_cpus(ctx)
    except InvalidInput as exc:
        alloc.notes[owner] = f"cannot pin: {exc}"
        raise
    if wanted is not None:
        try:
            alloc.claim(owner, wanted)
        except NoCapacity as exc:  # the scheduler's decision cannot be honoured as written
            alloc.notes[owner] = f"cannot pin: {RESOURCE_STATUS}: {exc}"
            raise InvalidInput(RESOURCE_STATUS, str(exc)) from exc
        alloc.notes[owner] = f"{ctx.qos}: exclusive, as scheduled ({RESOURCE_STATUS})"
        return None
    try:
        quota, period = ctx.requested("cpu.cfs_quota_us"), ctx.requested("cpu.cfs_period_us") or CFS_PERIOD_US
        if not quota or quota <= 0:
            return None
        n = math.ceil(quota / period)
        alloc.allocate(owner, n)
        alloc.notes[owner] = f"{ctx.qos}: {n} CPUs as whole cores from the node's topology"
        return None
    except NoCapacity as exc:
        alloc.notes[owner] = f"cannot pin: {exc}"
        return str(exc)


# reads only the CPU allocator's assignment
@feature("cpuset", order=40, annotations=(RESOURCE_STATUS,), labels=(QOS_LABEL,))
def desired(ctx: Context, intent: Intent) -> None:
    """Reads the assignment (see :func:`assign`); allocates nothing."""
    alloc = ctx.cpus
    if alloc is None or ctx.container is None or not ctx.has("cpuset.cpus"):
        return
    owner = ctx.container.id
    cpus = alloc.exclusive.get(owner)
    note = alloc.notes.get(owner, "")
    if cpus is not None:
        intent.set("cpuset.cpus", format_cpulist(cpus), note)
        return
    if note.startswith("cannot pin: ") and ctx.policy.features.cpuset.failurePolicy == "fail-closed":
        raise InvalidInput("cpuset", note)  # fail-closed: refuse rather than run unpinned
    pool = alloc.share_pool()
    # Until something is first pinned, the runtime's default (all CPUs) is right; from then on
    # the sharers' cpuset is ours, all CPUs again once the last exclusive set is gone (the
    # reconciler puts it back where the runtime cannot be told: containerd#13733).
    if pool != alloc.online or alloc.generation:
        why = f"{ctx.qos}: the share pool (online CPUs minus exclusive ones)"
        intent.set("cpuset.cpus", format_cpulist(pool), f"{why}; {note}" if note else why)
