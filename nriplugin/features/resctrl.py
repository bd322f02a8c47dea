"""resctrl (LLC CAT and MBA) by QoS class: one group per class (``koordlet-BE`` ...) whose
schemata come from catRangeStartPercent/catRangeEndPercent of the cache ways and mbaPercent;
containers join their class's group when their task starts (the runtime then knows the pid and
the workload has not run yet)."""

from __future__ import annotations

from nriplugin.features.registry import feature
from nriplugin.intent.core import Context, Intent

GROUP_PREFIX = "koordlet-"


def group_name(qos: str) -> str:
    return GROUP_PREFIX + ("LSR" if qos == "LSE" else qos)


def class_of(group: str) -> str:
    """The QoS class whose settings a group has (its name without the prefix)."""
    return group.removeprefix(GROUP_PREFIX)


@feature("resctrl", order=60)  # a group to join, independent of the files set before
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
