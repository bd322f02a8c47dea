"""Feature modules: each computes its desired values once, in ``desired(ctx, intent)``; the NRI
hook and the reconciler both call :func:`desired_state`. Each module registers its function
under its policy switch with an order number (``registry.py``): later features see the values
earlier ones set (batch sizes BE before CPU QoS floors it; burst follows the quota)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

# Importing a feature module registers its function.
from nriplugin.features import batch, blkio, core_sched, cpu_burst, cpu_qos, cpuset, memory_qos, pids, resctrl
from nriplugin.features.registry import REGISTRY, Feature
from nriplugin.intent.core import Context, Intent, InvalidInput, Setting
from nriplugin.policy.model import Policy

log = logging.getLogger("nriplugin.features")

# Every feature in evaluation order; fails here, at import, unless each of the policy's
# switches has its registered feature.
PIPELINE: tuple[Feature, ...] = REGISTRY.pipeline()
# The pod annotations and labels some feature reads (each declares its own): with the class, the
# container's name and resources, and the node's state, all a new container's values depend on.
POD_ANNOTATIONS: tuple[str, ...] = tuple(sorted({a for f in PIPELINE for a in f.annotations}))
POD_LABELS: tuple[str, ...] = tuple(sorted({a for f in PIPELINE for a in f.labels}))


class FeatureFailed(Exception):
    """A fail-closed feature could not compute its values: the container must be refused."""


@dataclass
class FeaturesOutcome:
    intent: Intent
    failed: list[tuple[str, str]] = field(default_factory=list)  # (feature, reason) skipped fail-open


Step = tuple[str, Callable[[Context, Intent], None], bool]  # (name, desired function, fail-closed)


def enabled(policy: Policy) -> tuple[Step, ...]:
    """The features ``policy`` turns on, in order."""
    switches = policy.features
    return tuple(
        (f.name, f.desired, getattr(switches, f.name).failurePolicy == "fail-closed")
        for f in PIPELINE
        if getattr(switches, f.name).enable
    )


class EnabledSteps:
    """:func:`enabled`, worked out once per policy and kept by whoever runs the features on
    every hook (the desired state): a policy changes a few times a day."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: tuple[Policy, tuple[Step, ...]] | None = None

    def __call__(self, policy: Policy) -> tuple[Step, ...]:
        last = self._last
        if last is None or last[0] is not policy:
            last = self._last = (policy, enabled(policy))
        return last[1]


def desired_state(ctx: Context, steps: tuple[Step, ...] | None = None) -> FeaturesOutcome:
    """Run every enabled feature for ``ctx`` (``steps``: :func:`enabled`'s for its policy,
    when the caller keeps them). Bad input in a fail-open feature skips that feature
    (recorded in ``failed``); in a fail-closed one it raises FeatureFailed."""
    intent = Intent()
    failed: list[tuple[str, str]] = []
    for name, fn, fail_closed in enabled(ctx.policy) if steps is None else steps:
        # to undo a failed feature's settings (a tuple: this runs for every feature of every hook)
        before = (dict(intent.files), intent.resctrl_group, intent.core_sched_group, intent.rdt_class)
        intent.owner = name
        try:
            fn(ctx, intent)
        except InvalidInput as exc:
            if fail_closed:
                raise FeatureFailed(f"{name}: {exc}") from exc
            intent.files, intent.resctrl_group, intent.core_sched_group, intent.rdt_class = before
            failed.append((name, str(exc)))
    intent.owner = ""
    return FeaturesOutcome(intent, failed)


__all__ = [
    "PIPELINE",
    "POD_ANNOTATIONS",
    "POD_LABELS",
    "Context",
    "Feature",
    "FeatureFailed",
    "FeaturesOutcome",
    "Intent",
    "InvalidInput",
    "Setting",
    "batch",
    "blkio",
    "core_sched",
    "cpu_burst",
    "cpu_qos",
    "cpuset",
    "desired_state",
    "enabled",
    "memory_qos",
    "pids",
    "resctrl",
]
