"""pids limit: the most tasks one container of a class may hold (``pids.max``), from the
policy's ``containerPidsLimit`` (none by default: then only the kubelet's pod-level
``podPidsLimit`` applies, as before). A BE fork bomb runs out of pids in its own container
before it takes the pod's or the node's.

The value is one desired setting like any other; how it gets there is the runtime's NRI's
business, decided once at Configure (``node/hooks.py``): ``LinuxResources.pids`` in the
CreateContainer adjustment where the runtime carries it (NRI v0.8+), else cgroup v2's
``unified`` map, else (cgroup v1) the agent writes it at StartContainer, before the container's
first instruction. The reconciler keeps it either way.
"""

from __future__ import annotations

from nriplugin.features.registry import feature
from nriplugin.intent.core import Context, Intent


@feature("pidsLimit", order=80)  # reads only its own policy section
def desired(ctx: Context, intent: Intent) -> None:
    if ctx.container is None or not ctx.has("pids.max"):
        return
    limit = ctx.policy.containerPidsLimit.of(ctx.qos)
    if limit is not None:
        intent.set("pids.max", limit, f"{ctx.qos}: containerPidsLimit")
