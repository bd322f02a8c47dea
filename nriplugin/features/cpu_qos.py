"""CPU QoS: BE yields CPU (lowest shares unless batch resources size it), and each class gets
its scheduling identity by the policy's cpuPolicy: groupIdentity (``cpu.bvt_warp_ns``, where
the kernel has it) or coreSched (``cpu.idle`` = schedIdle: the whole group runs SCHED_IDLE;
the kernel then gives it the idle weight, so it is never a silent fallback) plus core
scheduling cookies by group (core_sched.py) where the kernel has them.

BE's tasks run SCHED_IDLE (``beProcess.schedIdle``): born so where the runtime carries NRI's
scheduler adjustment (born_with.py), and given it by the agent when they start wherever the
runtime did not (an older NRI, or an OCI runtime that ignores the field): never ``cpu.idle`` on
a group the kubelet writes the weight of (kernel/sched.py says why)."""

from __future__ import annotations

from nriplugin.features import core_sched
from nriplugin.features.registry import feature
from nriplugin.intent.core import Context, Intent


# after batchResource: BE gets the lowest shares only where batch set none
@feature("cpuQOS", order=20, labels=(core_sched.GROUP_LABEL,))
def desired(ctx: Context, intent: Intent) -> None:
    cfg = ctx.policy.class_qos(ctx.qos).cpuQOS
    if not cfg.enable:
        return
    if ctx.qos == "BE":
        if "cpu.shares" not in intent.values:
            shares = ctx.policy.beMinCPUShares
            intent.set("cpu.shares", shares, f"BE: lowest CPU weight (beMinCPUShares={shares})")
        if ctx.container is not None and ctx.policy.beProcess.schedIdle:
            intent.join("sched", "idle", "BE's tasks run SCHED_IDLE (beProcess.schedIdle)")
    policy = ctx.policy.resourceQOSStrategy.policies.cpuPolicy
    if policy == "groupIdentity" and cfg.groupIdentity is not None and ctx.has("cpu.bvt_warp_ns"):
        intent.set("cpu.bvt_warp_ns", cfg.groupIdentity, f"group identity of {ctx.qos}")
        return
    if policy == "coreSched":
        if cfg.schedIdle is not None and ctx.has("cpu.idle"):
            intent.set("cpu.idle", cfg.schedIdle, f"{ctx.qos} schedIdle={cfg.schedIdle} (coreSched policy)")
        core_sched.desired(ctx, intent)
