"""Block I/O by class: a weight (``blkio.weight`` / ``io.weight``) and per-device throttles
(``blkio.throttle.*_device`` / ``io.max``) for the devices the policy names. Devices are
resolved to MAJOR:MINOR from real block device nodes under /dev; other block types
(volumegroup, podvolume) need the volume inventory and are skipped for now."""

from __future__ import annotations

import os
import stat
from functools import lru_cache

from nriplugin.features.registry import feature
from nriplugin.intent.core import Context, Intent

THROTTLES = (
    ("readBPS", "blkio.throttle.read_bps_device"),
    ("writeBPS", "blkio.throttle.write_bps_device"),
    ("readIOPS", "blkio.throttle.read_iops_device"),
    ("writeIOPS", "blkio.throttle.write_iops_device"),
)
CONTROLLERS = {"blkio", "io"}  # the probe reports the kernel's names: v1's, v2's


@lru_cache(maxsize=256)
def resolve_device(name: str) -> str | None:
    """``/dev/vda`` -> ``"253:0"``; None for anything that is not a block device under /dev."""
    real = os.path.realpath(name)
    if not real.startswith("/dev/"):
        return None
    try:
        st = os.stat(real)
    except OSError:
        return None
    if not stat.S_ISBLK(st.st_mode):
        return None
    return f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"


@feature("blkio", order=70)  # reads only its own policy section
def desired(ctx: Context, intent: Intent) -> None:
    cfg = ctx.policy.class_qos(ctx.qos).blkioQOS
    if not cfg.enable or ctx.container is None or not CONTROLLERS & set(ctx.caps.controllers):
        return
    for block in cfg.blocks:
        if block.type != "device":
            continue
        dev = resolve_device(block.name)
        if dev is None:
            continue
        io = block.ioCfg
        if io.ioWeightPercent is not None and ctx.has("blkio.weight"):
            w = io.ioWeightPercent * 10  # the policy takes 1-100: blkio.weight's [10, 1000]
            intent.set("blkio.weight", w, f"{ctx.qos}: ioWeightPercent {io.ioWeightPercent}")
        for field, resource in THROTTLES:
            value = getattr(io, field)
            if value:
                intent.set(resource, value, f"{ctx.qos}: {field} on {block.name} ({dev})", device=dev)
