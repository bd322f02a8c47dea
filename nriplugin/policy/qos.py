"""QoS classes of pods, from Koordinator's label or, failing that, Kubernetes QoS.

The label is untrusted input: an unknown value is ignored (and reported by the caller), never
passed on. Kubernetes QoS is not in the NRI data as such; kubelet encodes it in the pod's
cgroup parent (``kubepods/besteffort``, ``kubepods-burstable.slice``, or neither for
Guaranteed), for both cgroup drivers.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

QOS_LABEL = "koordinator.sh/qosClass"


class QoSClass(StrEnum):
    LSE = "LSE"
    LSR = "LSR"
    LS = "LS"
    BE = "BE"
    SYSTEM = "SYSTEM"


_BY_NAME = {c.value: c for c in QoSClass}


class InvalidQoSLabel(ValueError):
    pass


def kubernetes_qos(cgroup_parent: str) -> str:
    """``Guaranteed``, ``Burstable`` or ``BestEffort`` from a kubelet cgroup parent."""
    p = cgroup_parent.lower()
    if "besteffort" in p:
        return "BestEffort"
    if "burstable" in p:
        return "Burstable"
    return "Guaranteed"


_FROM_K8S = {"Guaranteed": QoSClass.LSR, "Burstable": QoSClass.LS, "BestEffort": QoSClass.BE}


def qos_class(labels: Mapping[str, str], cgroup_parent: str) -> QoSClass:
    """The pod's class; raises :class:`InvalidQoSLabel` for a label value we do not know."""
    return labelled_class(labels.get(QOS_LABEL)) or kubernetes_class(cgroup_parent)


def labelled_class(value: str | None) -> QoSClass | None:
    """The class the pod's label ``value`` names (None: no label, the cgroup parent decides);
    raises :class:`InvalidQoSLabel` for a value we do not know. For a caller that read the
    label already (a read of a parsed request's map is not free)."""
    if not value:
        return None
    cls = _BY_NAME.get(value)
    if cls is None:
        raise InvalidQoSLabel(f"{QOS_LABEL}={value[:64]!r} is not one of {', '.join(_BY_NAME)}")
    return cls


def kubernetes_class(cgroup_parent: str) -> QoSClass:
    """The class of a pod without the label, from its Kubernetes QoS."""
    return _FROM_K8S[kubernetes_qos(cgroup_parent)]
