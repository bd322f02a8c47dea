"""Memory QoS: memcg protection and throttling by class, Koordinator's formulas:

    memory.min  = request * minLimitPercent / 100
    memory.low  = request * lowLimitPercent / 100
    memory.high = request + throttlingPercent / 100 * (limit - request), page aligned
                  (none when that rounds to 0: a high of 0 would throttle every allocation)
    memory.oom.group = oomKillGroup

The request is what the runtime does not tell NRI: it is known for Guaranteed containers
(request == limit) and for BE from batch-memory; otherwise protection is skipped (explain
says so). Mainline cgroup v1 has none of these files; its one equivalent is the soft limit
(groups above it are reclaimed first under node-wide memory pressure), which carries the memory.low
value there. min and high have no v1 equivalent and are skipped.
"""

from __future__ import annotations

from nriplugin.features import batch
from nriplugin.features.registry import feature
from nriplugin.intent.core import Context, Intent

PAGE = 4096


def _request(ctx: Context) -> tuple[int | None, int | None, str]:
    limit = ctx.requested("memory.limit_in_bytes")
    if ctx.qos == "BE" and ctx.container is not None:
        found = batch.container_batch(ctx, ctx.container.name)
        if found:
            req, lim = found
            return req.get(batch.BATCH_MEMORY), lim.get(batch.BATCH_MEMORY, limit), "batch-memory"
    if ctx.qos in ("LSE", "LSR") and limit and limit > 0:
        return limit, limit, "Guaranteed: request = limit"
    return None, limit, ""


# reads batch-memory from the annotation itself, not batch's values
@feature("memoryQOS", order=50, annotations=(batch.ANNOTATION,))
def desired(ctx: Context, intent: Intent) -> None:
    cfg = ctx.policy.class_qos(ctx.qos).memoryQOS
    if not cfg.enable or ctx.container is None:
        return
    request, limit, source = _request(ctx)
    if request is None or request <= 0:
        return
    if cfg.minLimitPercent and ctx.has("memory.min"):
        v = request * cfg.minLimitPercent // 100 // PAGE * PAGE
        intent.set("memory.min", v, f"{cfg.minLimitPercent}% of request {request} ({source})")
    if cfg.lowLimitPercent:
        v = request * cfg.lowLimitPercent // 100 // PAGE * PAGE
        why = f"{cfg.lowLimitPercent}% of request {request} ({source})"
        if ctx.has("memory.low"):
            intent.set("memory.low", v, why)
        elif ctx.has("memory.soft_limit_in_bytes"):
            intent.set("memory.soft_limit_in_bytes", v, f"{why}; v1 soft limit in place of memory.low")
    if cfg.throttlingPercent and limit and limit > request and ctx.has("memory.high"):
        v = (request + (limit - request) * cfg.throttlingPercent // 100) // PAGE * PAGE
        if v > 0:  # under a page rounds to 0, which would throttle every allocation: the limit alone
            intent.set("memory.high", v, f"request + {cfg.throttlingPercent}% of (limit - request)")
    if cfg.oomKillGroup is not None and ctx.has("memory.oom.group"):
        intent.set("memory.oom.group", cfg.oomKillGroup, "oomKillGroup")
