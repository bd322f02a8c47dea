"""CPU burst: LS containers with a CFS quota may bank unused quota (``cpu.cfs_burst_us`` /
``cpu.max.burst``). burst = quota * cpuBurstPercent / 100, capped at the quota (the kernel
refuses more). A pod may set its own ``koordinator.sh/cpuBurst`` (JSON) within the same bounds.

Containers only: the kernel refuses a quota below its group's burst, and on a pod-level
resize the kubelet lowers the pod group's quota itself, after its containers' (no hook comes
first), so a pod burst would make that write fail."""

from __future__ import annotations

from nriplugin.features.registry import feature
from nriplugin.intent.core import Context, Intent, InvalidInput

ANNOTATION = "koordinator.sh/cpuBurst"
POLICIES = ("none", "cpuBurstOnly", "cfsQuotaBurstOnly", "auto")


@feature("cpuBurst", order=30, annotations=(ANNOTATION,))  # after batchResource: the burst follows the quota batch set
def desired(ctx: Context, intent: Intent) -> None:
    if ctx.qos not in ("LSE", "LSR", "LS") or ctx.container is None or not ctx.has("cpu.cfs_burst_us"):
        return
    s = ctx.policy.cpuBurstStrategy
    policy, percent = s.policy, s.cpuBurstPercent
    override = ctx.annotation_json(ANNOTATION)
    if override is not None:
        if not isinstance(override, dict):
            raise InvalidInput(ANNOTATION, "expected a JSON object")
        policy = override.get("policy", policy)
        percent = override.get("cpuBurstPercent", percent)
        if policy not in POLICIES:
            raise InvalidInput(ANNOTATION, f"policy {str(policy)[:40]!r} is not one of {', '.join(POLICIES)}")
        if isinstance(percent, bool) or not isinstance(percent, int) or not 1 <= percent <= 10000:
            raise InvalidInput(ANNOTATION, f"cpuBurstPercent {str(percent)[:40]!r} is not an integer in [1, 10000]")
    if policy not in ("cpuBurstOnly", "auto"):
        return
    quota = intent.get("cpu.cfs_quota_us")
    if quota is None:
        quota = ctx.requested("cpu.cfs_quota_us")
    if not isinstance(quota, int) or quota <= 0:
        return
    burst = min(quota * percent // 100, quota)
    intent.set("cpu.cfs_burst_us", burst, f"{percent}% of quota {quota} us, capped at the quota")
