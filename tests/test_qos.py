"""QoS classes and the default policy's plugin, including hostile labels."""

from __future__ import annotations

import re

import pytest

from nriplugin.node.hooks import QoSPlugin
from nriplugin.nri import api_pb2 as api
from nriplugin.policy.qos import (
    InvalidQoSLabel,
    QoSClass,
    kubernetes_class,
    kubernetes_qos,
    labelled_class,
    qos_class,
)
from testkit.runtime_peer import make_container, make_pod


@pytest.mark.parametrize(
    ("parent", "k8s"),
    [
        ("/kubepods/besteffort/pod1", "BestEffort"),
        ("/kubepods/burstable/pod1", "Burstable"),
        ("/kubepods/pod1", "Guaranteed"),
        ("kubepods-besteffort-pod1_2.slice", "BestEffort"),
        ("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice", "Burstable"),
        ("kubepods-pod1.slice", "Guaranteed"),
    ],
)
def test_kubernetes_qos_from_cgroup_parent(parent: str, k8s: str) -> None:
    assert kubernetes_qos(parent) == k8s


def test_label_wins_and_fallback_maps_classes() -> None:
    assert qos_class({"koordinator.sh/qosClass": "LS"}, "/kubepods/besteffort/p") is QoSClass.LS
    assert qos_class({}, "/kubepods/besteffort/p") is QoSClass.BE
    assert qos_class({}, "/kubepods/burstable/p") is QoSClass.LS
    assert qos_class({}, "/kubepods/p") is QoSClass.LSR
    assert qos_class({"koordinator.sh/qosClass": "SYSTEM"}, "") is QoSClass.SYSTEM


def test_a_label_read_already_gives_the_same_class() -> None:
    """labelled_class and kubernetes_class are qos_class in two steps, for a caller that read
    the label (CreateContainer's birth key): an empty label is no label."""
    for value in ("LSE", "LSR", "LS", "BE", "SYSTEM"):
        assert labelled_class(value) is qos_class({"koordinator.sh/qosClass": value}, "") is QoSClass(value)
    assert labelled_class(None) is None and labelled_class("") is None
    assert qos_class({"koordinator.sh/qosClass": ""}, "/kubepods/besteffort/p") is QoSClass.BE
    for parent, cls in (("/kubepods/besteffort/p", "BE"), ("/kubepods/burstable/p", "LS"), ("/kubepods/p", "LSR")):
        assert kubernetes_class(parent) is qos_class({}, parent) is QoSClass(cls)
    with pytest.raises(InvalidQoSLabel, match=re.escape("koordinator.sh/qosClass='be'")):
        labelled_class("be")


@pytest.mark.parametrize("value", ["be", "../../etc", "BE\n", "x" * 10_000, "LS;rm -rf /"])
def test_hostile_label_is_rejected(value: str) -> None:
    with pytest.raises(InvalidQoSLabel) as e:
        qos_class({"koordinator.sh/qosClass": value}, "/kubepods/besteffort/p")
    assert len(str(e.value)) < 200  # the message quotes a bounded prefix only
    # The first 64 characters, quoted, and the classes there are.
    assert str(e.value) == f"koordinator.sh/qosClass={value[:64]!r} is not one of LSE, LSR, LS, BE, SYSTEM"


def test_plugin_adjusts_only_be() -> None:
    p = QoSPlugin()
    be = make_pod(1, "BE")
    adj = p.create_container(be, make_container(1, be))
    assert isinstance(adj, api.ContainerAdjustment) and adj.linux.resources.cpu.shares.value == 2
    for qos in ("LS", "LSR", "LSE", "SYSTEM"):
        pod = make_pod(2, qos)
        assert p.create_container(pod, make_container(2, pod)) is None
    bad = make_pod(3, "nonsense", parent="/kubepods/besteffort/pod3")
    assert p.create_container(bad, make_container(3, bad)) is None  # untouched, not guessed
    assert p.desired.rejected_labels == 1
    unlabelled = make_pod(4, None, parent="/kubepods/besteffort/pod4")
    assert p.create_container(unlabelled, make_container(4, unlabelled)) is not None


def test_synchronize_and_update_use_the_same_desired_state() -> None:
    p = QoSPlugin()
    pods = [make_pod(1, "BE"), make_pod(2, "LS")]
    ctrs = [make_container(1, pods[0], shares=1024), make_container(2, pods[1]), make_container(3, pods[0], shares=2)]
    orphan = api.Container(id="orphan", pod_sandbox_id="gone")
    ups = p.synchronize(pods, [*ctrs, orphan])
    assert [(u.container_id, u.linux.resources.cpu.shares.value) for u in ups] == [(ctrs[0].id, 2)]
    res = api.LinuxResources()
    res.cpu.shares.value = 512
    (u,) = p.update_container(pods[0], ctrs[0], res)
    assert u.linux.resources.cpu.shares.value == 2
    res.cpu.shares.value = 2
    assert p.update_container(pods[0], ctrs[0], res) == []
    assert p.update_container(pods[1], ctrs[1], res) == []
