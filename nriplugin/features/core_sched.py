"""Core scheduling groups (part of CPU QoS under ``cpuPolicy: coreSched``, where the kernel has
it): which tasks may share a physical core's SMT siblings.

A pod's group is its ``koordinator.sh/core-sched-group-id`` label when set (pods that trust
each other opt into sharing), else: every LS/LSR/LSE pod is its own group (its uid), and all
BE pods share one group. BE therefore never runs beside LS on one core, and LS pods never
beside each other's tasks. SYSTEM pods are not touched.
"""

from __future__ import annotations

import re

from nriplugin.intent.core import Context, Intent, InvalidInput

GROUP_LABEL = "koordinator.sh/core-sched-group-id"
_GROUP = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


def group_of(ctx: Context) -> tuple[str, str]:
    """(group, why) for the pod in ``ctx``; a malformed label is rejected, never used."""
    label = ctx.pod.labels.get(GROUP_LABEL)
    if label is not None:
        if not _GROUP.match(label):
            raise InvalidInput(GROUP_LABEL, f"{label[:64]!r} is not a group id (1-63 of A-Z a-z 0-9 . _ -)")
        return f"label:{label}", f"{GROUP_LABEL}={label}"
    if ctx.qos == "BE":
        return "class:BE", "BE pods share one cookie: never beside LS on a core"
    return f"pod:{ctx.pod.uid or ctx.pod.id}", f"{ctx.qos}: the pod's own cookie"


def desired(ctx: Context, intent: Intent) -> None:
    if (
        ctx.container is None
        or ctx.policy.resourceQOSStrategy.policies.cpuPolicy != "coreSched"
        or not ctx.caps.core_sched
    ):
        return
    group, why = group_of(ctx)
    intent.join("coresched", group, why)
