"""The embedded default policy, until the full policy model lands.

One desired-state function per setting: the hook and the Synchronize path both call it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .qos import QoSClass


@dataclass(frozen=True, slots=True)
class DefaultPolicy:
    version: str = "embedded-1"
    be_cpu_shares: int = 2  # the kernel's minimum: BE yields to everyone


def desired_cpu_shares(policy: DefaultPolicy, qos: QoSClass) -> int | None:
    """CPU shares a container of class ``qos`` must have; None means leave as requested."""
    if qos is QoSClass.BE:
        return policy.be_cpu_shares
    return None
