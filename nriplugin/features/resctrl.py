"""resctrl (LLC CAT and MBA) by QoS class: one group per class (``koordlet-BE`` ...) whose
schemata come from catRangeStartPercent/catRangeEndPercent of the cache ways and mbaPercent;
containers join their class's group when their task starts (the runtime then knows the pid and
the workload has not run yet)."""

from __future__ import annotations

import contextlib

from ..kernel.resctrl import ResctrlFS
from ..policy.model import Policy
from .base import Context, Intent

GROUP_PREFIX = "koordlet-"


def group_name(qos: str) -> str:
    return GROUP_PREFIX + ("LSR" if qos == "LSE" else qos)


def desired(ctx: Context, intent: Intent) -> None:
    cfg = ctx.policy.class_qos(ctx.qos).resctrlQOS
    if not cfg.enable or ctx.container is None or not ctx.caps.resctrl.mounted:
        return
    group = group_name(ctx.qos)
    if ctx.policy.resctrlRuntimeClasses:
        intent.rdt_class = group
    intent.join(
        "resctrl",
        group,
        f"L3 ways {cfg.catRangeStartPercent}-{cfg.catRangeEndPercent}%, memory bandwidth {cfg.mbaPercent}%",
    )


def join(fs: ResctrlFS, policy: Policy, group: str, tids: list[int]) -> None:
    """Move threads into a class's group (created on first use with the class's schemata).
    Threads that exit meanwhile (ESRCH) are skipped; other errors raise (OSError, ResctrlError)."""
    cfg = policy.class_qos(group.removeprefix(GROUP_PREFIX)).resctrlQOS
    fs.ensure_group(group, fs.schemata(cfg.catRangeStartPercent, cfg.catRangeEndPercent, cfg.mbaPercent))
    have = fs.tasks(group) if len(tids) > 1 else set()
    for tid in tids:
        if tid not in have:
            with contextlib.suppress(ProcessLookupError):
                fs.add_task(group, tid)
