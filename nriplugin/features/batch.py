"""Batch resources: BE containers sized from Koordinator's ``kubernetes.io/batch-cpu`` (in
milli-cores) and ``kubernetes.io/batch-memory`` in ``node.koordinator.sh/extended-resource-spec``
— the annotation Koordinator's webhook adds, or, without it, the same built from the pod's spec
as the API server has it (``Context.specs``, the cluster side's pod cache): the runtime carries
no extended resource, and koordlet without the webhook leaves such a pod at the kubelet's values
until its reconciler. The annotation wins when both are there.

shares = clamp(request * 1024 / 1000, 2, 262144); quota = max(limit * 100 µs, 1000) per 100 ms
period (none without a limit, or with a limit of 0); memory limit = batch-memory limit. A pod's
values are its containers' sums; its limit only when every container has one.
"""

from __future__ import annotations

from functools import lru_cache

from nriplugin.features.registry import feature
from nriplugin.intent.core import Context, Intent, InvalidInput, annotation_json
from nriplugin.kernel.cgroup import CFS_PERIOD_US, MIN_QUOTA_US
from nriplugin.policy.quantity import parse_quantity

ANNOTATION = "node.koordinator.sh/extended-resource-spec"
BATCH_CPU, BATCH_MEMORY = "kubernetes.io/batch-cpu", "kubernetes.io/batch-memory"
MAX_MILLI = 1 << 30  # a billion cores: anything above is garbage, not a node


Limits = tuple[dict[str, int], dict[str, int]]


def container_batch(ctx: Context, name: str) -> Limits | None:
    """(requests, limits) of one container: batch-cpu in milli-cores, batch-memory in bytes."""
    parsed = _annotation(ctx)
    return None if parsed is None else parsed.get(name)


def _annotation(ctx: Context) -> dict[str, Limits] | None:
    raw = ctx.pod.annotations.get(ANNOTATION)
    if raw is None and ctx.specs is not None:
        raw = ctx.specs.extended_resource_spec(ctx.pod.uid)
    if raw is None:
        return None
    parsed = _parse(raw)
    if isinstance(parsed, InvalidInput):
        raise InvalidInput(parsed.key, parsed.why)  # a fresh one: a cached exception's traceback grows
    return parsed


@lru_cache(maxsize=1024)
def _parse(raw: str) -> dict[str, Limits] | InvalidInput:
    """The whole annotation, parsed and validated once per distinct text (pods of one workload
    share it; Synchronize sees it hundreds of times)."""
    try:
        spec = annotation_json(ANNOTATION, raw)
        if not isinstance(spec, dict) or not isinstance(spec.get("containers", {}), dict):
            raise InvalidInput(ANNOTATION, 'expected {"containers": {NAME: {...}}}')
        return {str(n): _container(str(n), e) for n, e in list(spec.get("containers", {}).items())[:256]}
    except InvalidInput as exc:
        return exc


def _container(name: str, entry: object) -> Limits:
    if not isinstance(entry, dict):
        raise InvalidInput(ANNOTATION, f"containers.{name[:64]} is not an object")
    out: list[dict[str, int]] = []
    for part in ("requests", "limits"):
        section = entry.get(part) or {}
        if not isinstance(section, dict):
            raise InvalidInput(ANNOTATION, f"containers.{name[:64]}.{part} is not an object")
        vals: dict[str, int] = {}
        for key, hi in ((BATCH_CPU, MAX_MILLI), (BATCH_MEMORY, 1 << 62)):
            if key not in section:
                continue
            try:
                q = parse_quantity(section[key])
            except ValueError as exc:
                raise InvalidInput(ANNOTATION, f"containers.{name[:64]}.{part}.{key}: {exc}") from exc
            if q < 0 or q > hi or q != q.to_integral_value():
                raise InvalidInput(ANNOTATION, f"containers.{name[:64]}.{part}.{key}={section[key]!r:.40} out of range")
            vals[key] = int(q)
        out.append(vals)
    return out[0], out[1]


def pod_batch(ctx: Context) -> Limits | None:
    """Pod-level sums; a limit counts only if every container has one."""
    parsed = _annotation(ctx)
    if not parsed:
        return None
    req: dict[str, int] = {}
    lim: dict[str, int] = {}
    per = list(parsed.values())
    for key in (BATCH_CPU, BATCH_MEMORY):
        rs = [p[0][key] for p in per if key in p[0]]
        if rs:
            req[key] = sum(rs)
        # Koordinator: the pod is unlimited once one container is (no limit, or a limit of 0).
        ls = [p[1].get(key, 0) for p in per]
        if all(v > 0 for v in ls):
            lim[key] = sum(ls)
    return req, lim


# first: cpuQOS and cpuBurst read the shares and quota it sets
@feature("batchResource", order=10, annotations=(ANNOTATION,))
def desired(ctx: Context, intent: Intent) -> None:
    if ctx.qos != "BE":
        return
    where = ANNOTATION if ANNOTATION in ctx.pod.annotations else "the pod's spec (no webhook annotation)"
    if ctx.container is None:
        found = pod_batch(ctx)
        src = f"{where}, summed over the pod's containers"
    else:
        found = container_batch(ctx, ctx.container.name)
        src = f"{where} of container {ctx.container.name}"
    if found is None:
        return
    req, lim = found
    if BATCH_CPU in req:
        shares = min(max(req[BATCH_CPU] * 1024 // 1000, 2), 262144)
        intent.set("cpu.shares", shares, f"batch-cpu request {req[BATCH_CPU]}m -> {shares} shares ({src})")
    if lim.get(BATCH_CPU, 0) > 0:  # a limit of 0 is no limit (Koordinator: quota -1)
        quota = max(lim[BATCH_CPU] * CFS_PERIOD_US // 1000, MIN_QUOTA_US)
        intent.set("cpu.cfs_quota_us", quota, f"batch-cpu limit {lim[BATCH_CPU]}m -> {quota} us per {CFS_PERIOD_US} us")
        intent.set("cpu.cfs_period_us", CFS_PERIOD_US, "batch quota period")
    if BATCH_MEMORY in lim and lim[BATCH_MEMORY] >= 4096:
        intent.set("memory.limit_in_bytes", lim[BATCH_MEMORY], f"batch-memory limit ({src})")
