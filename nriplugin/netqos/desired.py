"""Network QoS: the one desired state of the node's tc tree and of each pod's place in it.

Workloads map to three network levels, as Koordinator's: LSE/LSR -> L0, LS -> L1, BE -> L2. The
contention point is the node's bandwidth, shared by every pod, so (as Terway does) each
direction has one HTB tree whose root rate is ``systemStrategy.totalNetworkBandwidth``; the
three levels are classes with rate = the class's ``*Request`` and ceil = its ``*Limit``, HTB
priority L0 < L1 < L2 (lower levels borrow spare bandwidth first); each shaped pod is a leaf
of its level, capped by its ``kubernetes.io/{ingress,egress}-bandwidth`` annotation.

Units, as Koordinator's CRD and code take them: a class's bandwidth is an integer percentage of
the total (0-100), ``"N%"`` the same, or a Kubernetes quantity string in bits/s (``"50M"``);
``totalNetworkBandwidth`` is an integer in Mbit/s (the CRD's unit) or a quantity string in
bits/s (``"100M"``). The pod annotations are quantities in bits/s, as the bandwidth CNI
plugin and kubelet read them (1 kbit/s .. 1 Tbit/s here).

Network QoS does nothing unless a class has ``networkQOS.enable`` or a pod has a bandwidth
annotation; the embedded default enables no class (as Koordinator). Pure: the apply path
(``netqos/``) and its reconcile both compute through these functions.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nriplugin.intent.core import InvalidInput
from nriplugin.policy.bandwidth import MIN_RATE, bits, class_bits
from nriplugin.policy.qos import QoSClass

if TYPE_CHECKING:
    from nriplugin.policy.model import NetworkQOS, Policy

INGRESS_KEY = "kubernetes.io/ingress-bandwidth"
EGRESS_KEY = "kubernetes.io/egress-bandwidth"
DEFAULT_TOTAL = 10 * 10**9  # no totalNetworkBandwidth: pods' own caps still apply under 10 Gbit/s
DIRECTIONS = ("ingress", "egress")  # as the pod sees it


class NetLevel(enum.IntEnum):
    """A network QoS level; its value is the HTB priority (lower is served first)."""

    L0 = 0
    L1 = 1
    L2 = 2


LEVEL_OF = {QoSClass.LSE: NetLevel.L0, QoSClass.LSR: NetLevel.L0, QoSClass.LS: NetLevel.L1, QoSClass.BE: NetLevel.L2}


def suppress_resource(level: NetLevel, direction: str) -> str:
    """The overlay resource that lowers a level's ceiling (the QoS manager's net suppress)."""
    return f"net.{level.name}.{direction}Ceil"


def annotation_bits(key: str, raw: str) -> int:
    """A pod bandwidth annotation in bits/s; InvalidInput (naming the key) otherwise."""
    try:
        return bits(raw)
    except ValueError as exc:
        raise InvalidInput(key, str(exc)) from exc


@dataclass(frozen=True, slots=True)
class Rates:
    """An HTB class's guaranteed rate and ceiling, bits/s."""

    rate: int
    ceil: int


@dataclass(frozen=True, slots=True)
class NodeNet:
    """The shared tree of one node: the total, and each (level, direction) class's rates."""

    total: int
    classes: tuple[tuple[NetLevel, str, Rates], ...]
    why: str

    def rates(self, level: NetLevel, direction: str) -> Rates:
        for lv, d, r in self.classes:
            if lv is level and d == direction:
                return r
        raise KeyError((level, direction))


@dataclass(frozen=True, slots=True)
class PodNet:
    """A pod's place in the tree: its level and its own caps per direction (None: the class's)."""

    level: NetLevel
    ingress_cap: int | None
    egress_cap: int | None
    why: str

    def cap(self, direction: str) -> int | None:
        return self.ingress_cap if direction == "ingress" else self.egress_cap


def class_policy(policy: Policy, level: NetLevel) -> NetworkQOS:
    s = policy.resourceQOSStrategy
    return (s.lsrClass, s.lsClass, s.beClass)[level].networkQOS


def active(policy: Policy) -> bool:
    """Whether nriplugin shapes at all (``netQOSPolicy: terway-qos`` leaves it to Terway)."""
    return policy.resourceQOSStrategy.policies.netQOSPolicy == "tc"


def node_state(policy: Policy, overlays: Mapping[str, int] | None = None) -> NodeNet:
    """The shared tree. A class that is not enabled still exists (its pods with their own
    caps hang there) with no guarantee and the whole node as ceiling. ``overlays``: the QoS
    manager's lowered ceilings (``suppress_resource`` -> bits/s)."""
    total_set = policy.systemStrategy.total_bits()
    total = total_set if total_set is not None else DEFAULT_TOTAL
    out = []
    for level in NetLevel:
        npol = class_policy(policy, level)
        for d in DIRECTIONS:
            if npol.enable:
                req = npol.ingressRequest if d == "ingress" else npol.egressRequest
                lim = npol.ingressLimit if d == "ingress" else npol.egressLimit
                ceil = max(MIN_RATE, min(total, class_bits(lim, total)))
                rate = max(MIN_RATE, min(ceil, class_bits(req, total)))
            else:
                rate, ceil = MIN_RATE, total
            low = (overlays or {}).get(suppress_resource(level, d))
            if low is not None:
                ceil = max(MIN_RATE, min(ceil, low))
                rate = min(rate, ceil)
            out.append((level, d, Rates(rate, ceil)))
    why = f"total {total} bit/s" + ("" if total_set is not None else " (default: totalNetworkBandwidth not set)")
    return NodeNet(total, tuple(out), why)


def pod_state(policy: Policy, qos: QoSClass, annotations: Mapping[str, str]) -> PodNet | None:
    """Where the pod goes (None: not shaped). Raises InvalidInput for a bad annotation: the
    caller leaves the pod unshaped and counts it."""
    if not active(policy):
        return None
    level = LEVEL_OF.get(qos)
    if level is None:
        return None
    caps: dict[str, int | None] = {}
    for d, key in (("ingress", INGRESS_KEY), ("egress", EGRESS_KEY)):
        raw = annotations.get(key)
        caps[d] = None if raw is None else annotation_bits(key, raw)
    enabled = class_policy(policy, level).enable
    if not enabled and caps["ingress"] is None and caps["egress"] is None:
        return None
    parts = [f"{qos.value} -> {level.name}" + ("" if enabled else " (class not enabled: own caps only)")]
    parts += [f"{d} cap {c} bit/s" for d, c in caps.items() if c is not None]
    return PodNet(level, caps["ingress"], caps["egress"], "; ".join(parts))


def leaf_rates(node: NodeNet, pod: PodNet, direction: str) -> Rates:
    """A pod leaf: no guarantee of its own (its level's rate is the guarantee, shared by its
    pods), ceiling = its cap, else the node (its level's ceiling holds it anyway, so a lowered
    level ceiling rewrites one class, not every leaf)."""
    cap = pod.cap(direction)
    ceil = node.total if cap is None else max(MIN_RATE, min(cap, node.total))
    return Rates(MIN_RATE, ceil)
