"""The core chain pinned at its boundaries (the kept mutation score): overlays refuse what they
cannot apply and keep their owners' order; the desired state merges overlays, a class's CFS
ceiling (inclusive, at least 1 ms) and its cpuset limit, remembers what an overlay replaced, and
tells its subscribers exactly which keys changed."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from nriplugin.features import Intent, Setting
from nriplugin.kernel.cpulist import format_cpulist
from nriplugin.node.desired import DesiredState
from nriplugin.node.model import NodeModel, pod_key
from nriplugin.node.overlays import GROUP_PREFIX, NET_RESOURCES, OverlayDecision, Overlays, group_key
from nriplugin.nri import api_pb2 as api
from nriplugin.policy.cache import RuleCache
from nriplugin.policy.model import Policy
from nriplugin.policy.qos import QoSClass
from testkit.runtime_peer import make_container, make_lsr, make_pod
from tests.test_features import caps

# --- overlays -------------------------------------------------------------------------------


def test_group_key() -> None:
    assert GROUP_PREFIX == "group:"
    assert group_key("/kubepods/besteffort/") == "group:kubepods/besteffort"
    assert group_key("kubepods") == "group:kubepods"


def test_the_network_ceilings_are_the_six_classes_and_directions() -> None:
    assert {f"net.L{i}.{d}Ceil" for i in range(3) for d in ("ingress", "egress")} == NET_RESOURCES


@pytest.mark.parametrize("value", [0, -1, True, "100", 1.5])
def test_a_network_ceiling_must_be_a_positive_int(value: object) -> None:
    o = Overlays()
    with pytest.raises(ValueError, match=r"overlay qos:n: net\.L0\.egressCeil must be a positive number of bits/s"):
        o.set("k", "qos:n", {"net.L0.egressCeil": value}, "r")  # type: ignore[dict-item]
    assert o.targets() == []


def test_a_network_ceiling_of_one_is_taken_without_the_cgroup_table() -> None:
    o = Overlays()
    assert o.set("k", "qos:n", {"net.L2.ingressCeil": 1}, "r")
    assert o.of("k") == [OverlayDecision("qos:n", (("net.L2.ingressCeil", 1),), "r")]


def test_an_overlay_needs_an_owner_and_values_and_known_valid_resources() -> None:
    o = Overlays()
    cases: list[tuple[str, dict[str, int | str]]] = [("", {"cpu.shares": 2}), ("qos:x", {})]
    for owner, values in cases:
        with pytest.raises(ValueError, match="an overlay needs an owner and at least one value"):
            o.set("k", owner, values, "r")
    with pytest.raises(ValueError, match=r"overlay qos:x: unknown resource 'cpu\.nope'"):
        o.set("k", "qos:x", {"cpu.shares": 2, "cpu.nope": "1"}, "r")
    with pytest.raises(ValueError, match="outside"):
        o.set("k", "qos:x", {"cpu.shares": 1}, "r")
    assert o.targets() == [] and o.of("k") == []


def test_values_are_kept_sorted_and_a_change_replaces_the_owners_decision() -> None:
    o = Overlays()
    assert o.set("k", "a", {"cpu.shares": 4, "cpu.cfs_quota_us": 5000}, "first")
    assert o.of("k") == [OverlayDecision("a", (("cpu.cfs_quota_us", 5000), ("cpu.shares", 4)), "first")]
    assert not o.set("k", "a", {"cpu.cfs_quota_us": 5000, "cpu.shares": 4}, "first")
    assert o.set("k", "a", {"cpu.shares": 4, "cpu.cfs_quota_us": 5000}, "another reason")
    assert o.set("k", "b", {"cpu.shares": 8}, "b's")
    assert o.set("k", "a", {"cpu.shares": 6}, "again")  # a keeps its place: first set first
    assert [d.owner for d in o.of("k")] == ["a", "b"]
    assert o.of("k")[0].values == (("cpu.shares", 6),)


def test_withdraw_forget_and_targets() -> None:
    o = Overlays()
    assert not o.withdraw("k", "a")  # no key
    o.set("k", "a", {"cpu.shares": 4}, "r")
    o.set("k", "b", {"cpu.shares": 4}, "r")
    o.set("j", "b", {"cpu.shares": 4}, "r")
    assert not o.withdraw("k", "c")  # no such owner
    assert o.targets() == ["k", "j"] and o.targets("a") == ["k"] and o.targets("b") == ["k", "j"]
    assert o.withdraw("k", "a")
    assert o.targets() == ["k", "j"]  # b is still on k
    assert o.withdraw("k", "b")
    assert o.targets() == ["j"] and o.of("k") == []
    o.forget("j")
    o.forget("nothing")
    assert o.targets() == []


# --- desired state --------------------------------------------------------------------------


class Scene:
    """A node model with a BE pod (container 1) and an LS pod (container 2, 2-core limit)."""

    def __init__(self, current: int | str | None = 777, policy: Policy | None = None, cpuset: bool = False) -> None:
        self.model = NodeModel()
        self.rules = RuleCache(policy or Policy())
        self.invalid: list[str] = []
        self.asked: list[tuple[str, str]] = []

        def cur(key: str, resource: str) -> int | str | None:
            self.asked.append((key, resource))
            return current

        self.d = DesiredState(
            self.model, self.rules, caps(**{"cpuset.cpus": cpuset}), on_invalid=self.invalid.append, current=cur
        )
        self.model.subscribe(self.d)
        self.told: list[list[str]] = []
        self.d.subscribe(self.told.append)
        self.be_pod = make_pod(1, "BE")
        self.be = make_container(1, self.be_pod)
        self.ls_pod = make_pod(2, "LS")
        self.ls = make_container(2, self.ls_pod)
        self.ls.linux.resources.cpu.quota.value = 200000
        self.ls.linux.resources.cpu.period.value = 100000
        self.model.container_started(self.be_pod, self.be)
        self.model.container_started(self.ls_pod, self.ls)
        self.told.clear()

    def value(self, key: str, resource: str) -> int | str | None:
        intent = self.d.intent(key)
        assert intent is not None
        return intent.get(resource)

    def setting(self, key: str, resource: str) -> Setting:
        intent = self.d.intent(key)
        assert intent is not None
        return intent.files[(resource, "")]


def test_the_class_of_a_key() -> None:
    s = Scene()
    assert s.d.qos_of(s.be.id) is QoSClass.BE
    assert s.d.qos_of(pod_key(s.ls_pod.id)) is QoSClass.LS
    assert s.d.qos_of("nothing") is None


def test_a_bad_label_is_counted_reported_and_unmanaged(caplog: pytest.LogCaptureFixture) -> None:
    s = Scene()
    bad = make_pod(3, "BE")
    bad.labels["koordinator.sh/qosClass"] = "NOPE"
    c = make_container(3, bad)
    with caplog.at_level(logging.WARNING, "nriplugin.node.desired"):
        s.model.container_started(bad, c)
        assert s.d.intent(c.id) is None
        assert s.d.qos_of(c.id) is None
    assert s.d.rejected_labels == 1 and s.invalid == ["qos_label"]  # decided once per pod
    assert "pod default/pod-3:" in caplog.text and "leaving it untouched" in caplog.text
    rec = caplog.records[0]
    assert (rec.pod, rec.reason) == ("default/pod-3", "invalid_label")  # type: ignore[attr-defined]
    assert s.d.intent_before_known(bad, make_container(4, bad)) is None
    s.d.set_ceiling(QoSClass.BE, 0.5, "qos:s", "r")
    assert s.d.birth_key(bad, make_container(4, bad)) is None


def test_an_overlay_is_merged_with_its_owner_and_reason() -> None:
    s = Scene()
    assert s.d.set_overlay(s.be.id, "qos:x", {"cpu.cfs_quota_us": 50000}, "because")
    st = s.setting(s.be.id, "cpu.cfs_quota_us")
    assert (st.value, st.why, st.owner) == (50000, "because", "qos:x")
    assert s.told == [[s.be.id]]
    assert not s.d.set_overlay(s.be.id, "qos:x", {"cpu.cfs_quota_us": 50000}, "because")
    assert s.told == [[s.be.id]]  # nothing changed: nobody told


def test_the_value_an_overlay_replaced_comes_back() -> None:
    """Where no feature sets a resource, withdrawing the last overlay on it puts back what was
    there: a container's runtime request, a group's value read from the kernel."""
    s = Scene(current=-1)
    g = group_key("kubepods/besteffort")
    s.d.set_overlay(g, "qos:s", {"cpu.cfs_quota_us": 50000}, "limit")
    assert s.asked == [(g, "cpu.cfs_quota_us")]
    s.d.set_overlay(g, "qos:t", {"cpu.cfs_quota_us": 60000}, "another")
    assert s.asked == [(g, "cpu.cfs_quota_us")]  # already remembered: not read again
    assert s.value(g, "cpu.cfs_quota_us") == 60000  # the later owner wins
    s.d.withdraw_overlay(g, "qos:t")
    assert s.value(g, "cpu.cfs_quota_us") == 50000
    assert s.d.withdraw_overlay(g, "qos:s")
    assert not s.d.withdraw_overlay(g, "qos:s")
    st = s.setting(g, "cpu.cfs_quota_us")
    assert (st.value, st.owner, st.why) == (-1, "baseline", "the value before an overlay replaced it")
    # a container: the runtime's request, from the facts, not the kernel
    s.d.set_overlay(s.ls.id, "qos:b", {"cpu.cfs_quota_us": 300000}, "burst")
    assert (s.ls.id, "cpu.cfs_quota_us") not in s.asked
    s.d.withdraw_overlay(s.ls.id, "qos:b")
    assert s.value(s.ls.id, "cpu.cfs_quota_us") == 200000


def test_a_feature_value_is_not_remembered_as_a_baseline() -> None:
    s = Scene()
    s.d.set_overlay(s.be.id, "qos:x", {"cpu.shares": 8}, "r")  # cpuQOS sets BE's shares
    assert s.asked == []
    s.d.withdraw_overlay(s.be.id, "qos:x")
    assert s.setting(s.be.id, "cpu.shares").owner == "cpuQOS"


def test_no_baseline_when_the_kernel_value_is_unknown() -> None:
    s = Scene(current=None)
    g = group_key("kubepods/besteffort")
    s.d.set_overlay(g, "qos:s", {"cpu.cfs_quota_us": 50000}, "limit")
    s.d.withdraw_overlay(g, "qos:s")
    intent = s.d.intent(g)
    assert intent is not None and ("cpu.cfs_quota_us", "") not in intent.files


def test_a_refused_overlay_keeps_nothing() -> None:
    s = Scene()
    g = group_key("kubepods/besteffort")
    with pytest.raises(ValueError):
        s.d.set_overlay(g, "qos:s", {"cpu.cfs_quota_us": 5}, "bad")
    assert s.told == [] and s.d.overlays.targets() == []
    s.d.set_overlay(g, "qos:s", {"cpu.shares": 2}, "ok")
    s.d.withdraw_overlay(g, "qos:s")
    assert s.value(g, "cpu.cfs_quota_us") is None  # the refused one left no baseline


def _quota_overlay(s: Scene, quota: int, period: int | None = None) -> None:
    values: dict[str, int | str] = {"cpu.cfs_quota_us": quota}
    if period is not None:
        values["cpu.cfs_period_us"] = period
    s.d.set_overlay(s.be.id, "qos:x", values, "batch")


@pytest.mark.parametrize(
    ("quota", "period", "cores", "expect"),
    [
        (50000, None, 0.5, 50000),  # at the ceiling: kept (inclusive)
        (50001, None, 0.5, 50000),
        (80000, 200000, 0.3, 60000),  # the period the intent has
        (80000, None, 0.001, 1000),  # at least 1 ms
        (-1, None, 0.5, -1),  # unlimited under a limited parent is allowed
        (0 + 1000, None, 0.0, 1000),
    ],
)
def test_a_class_ceiling_caps_a_finite_quota(quota: int, period: int | None, cores: float, expect: int) -> None:
    s = Scene()
    _quota_overlay(s, quota, period)
    before = s.setting(s.be.id, "cpu.cfs_quota_us")
    s.d.set_ceiling(QoSClass.BE, cores, "qos:cpuSuppress", "BE is limited")
    st = s.setting(s.be.id, "cpu.cfs_quota_us")
    assert st.value == expect
    if expect == quota:
        assert st == before
    else:
        assert st.owner == "qos:cpuSuppress"
        assert st.why == f"batch; at most {cores:.2f} cores while BE is limited"


def test_a_ceiling_caps_the_burst_at_the_capped_quota() -> None:
    s = Scene()
    s.d.set_overlay(s.be.id, "qos:x", {"cpu.cfs_quota_us": 100000, "cpu.cfs_burst_us": 100000}, "r")
    s.d.set_ceiling(QoSClass.BE, 0.25, "qos:s", "r")
    assert s.value(s.be.id, "cpu.cfs_quota_us") == 25000
    assert s.value(s.be.id, "cpu.cfs_burst_us") == 25000


def test_a_ceiling_leaves_a_quota_the_intent_does_not_have_and_other_classes() -> None:
    s = Scene()
    s.d.set_ceiling(QoSClass.BE, 0.5, "qos:s", "r")
    assert s.value(s.be.id, "cpu.cfs_quota_us") is None
    s.d.set_overlay(s.ls.id, "qos:b", {"cpu.cfs_quota_us": 300000}, "burst")
    assert s.value(s.ls.id, "cpu.cfs_quota_us") == 300000


def test_ceilings_tell_the_class_once_and_withdraw_only_what_is_there() -> None:
    s = Scene()
    assert not s.d.capped(s.be.id)
    s.d.set_ceiling(QoSClass.BE, 0.5, "qos:s", "r")
    assert s.told == [[pod_key(s.be_pod.id), s.be.id]]
    assert s.d.capped(s.be.id) and s.d.capped(pod_key(s.be_pod.id))
    assert not s.d.capped(s.ls.id)
    s.d.set_ceiling(QoSClass.BE, 0.5, "qos:s", "r")
    assert len(s.told) == 1  # the same ceiling: nothing to tell
    s.d.set_ceiling(QoSClass.BE, 0.5, "qos:s", "other reason")
    assert len(s.told) == 2
    s.d.withdraw_ceiling(QoSClass.LS)
    assert len(s.told) == 2
    s.d.withdraw_ceiling(QoSClass.BE)
    assert len(s.told) == 3 and not s.d.capped(s.be.id)
    g0 = s.d.generation(s.be.id)
    s.d.set_ceiling(QoSClass.LSR, 1.0, "qos:s", "r")  # a class with no members: no one told
    assert len(s.told) == 3 and s.d.generation(s.be.id) == g0


def test_a_class_decision_moves_its_members_generation_only() -> None:
    s = Scene()
    be0, ls0 = s.d.generation(s.be.id), s.d.generation(s.ls.id)
    s.d.set_ceiling(QoSClass.BE, 0.5, "qos:s", "r")
    be1 = s.d.generation(s.be.id)
    assert be1 != be0 and be1[2] == be0[2] + 1
    assert s.d.generation(s.ls.id) == ls0
    s.d.set_cpuset_limit(QoSClass.BE, 1, "qos:s", "r")
    assert s.d.generation(s.be.id)[2] == be1[2] + 1


def test_a_cpuset_limit_puts_containers_on_part_of_the_share_pool() -> None:
    s = Scene(cpuset=True)
    pool = s.d.cpus.share_pool()
    s.d.set_cpuset_limit(QoSClass.BE, 1, "qos:s", "BE on 1 CPU")
    st = s.setting(s.be.id, "cpuset.cpus")
    assert (st.owner, st.why) == ("qos:s", "BE on 1 CPU")
    assert st.value == format_cpulist(s.d.cpus.shared_subset(1))
    assert s.value(pod_key(s.be_pod.id), "cpuset.cpus") is None  # containers only
    s.d.set_cpuset_limit(QoSClass.BE, None, "qos:s", "the whole pool again")
    assert s.value(s.be.id, "cpuset.cpus") == format_cpulist(pool)
    told = len(s.told)
    s.d.set_cpuset_limit(QoSClass.BE, None, "qos:s", "the whole pool again")
    assert len(s.told) == told


def test_no_cpuset_limit_where_the_kernel_has_no_cpuset() -> None:
    s = Scene()
    s.d.set_cpuset_limit(QoSClass.BE, 1, "qos:s", "r")
    assert s.value(s.be.id, "cpuset.cpus") is None


def test_invalidate_tells_and_stamps_known_keys_only() -> None:
    s = Scene()
    g = group_key("x")
    gen = s.d.generation(s.be.id)
    assert s.d.invalidate([]) == [] and s.told == []
    assert s.d.invalidate([s.be.id, g, "gone"]) == [s.be.id, g, "gone"]
    assert s.told == [[s.be.id, g, "gone"]]
    g1 = s.d.generation(s.be.id)
    assert g1[1] > gen[1]
    assert s.d.generation(g)[1] > 0
    assert s.d.generation("gone")[1] == 0  # not known: no generation kept
    s.d.invalidate([s.be.id])
    assert s.d.generation(s.be.id)[1] > g1[1]


def test_a_policy_change_recomputes_everything_and_overlaid_groups() -> None:
    s = Scene()
    g = group_key("kubepods/besteffort")
    s.d.set_overlay(g, "qos:s", {"cpu.shares": 2}, "r")
    s.d.set_overlay(s.be.id, "qos:s", {"cpu.shares": 4}, "r")
    s.told.clear()
    e0 = s.d.generation(s.be.id)[0]
    s.rules.set(Policy.model_validate({"qosManager": {"enable": False}}), "test")
    assert s.told == [[*s.model, g]]
    assert s.d.generation(s.be.id)[0] == e0 + 1


def test_the_cache_is_per_generation() -> None:
    s = Scene()
    a = s.d.intent(s.be.id)
    assert s.d.intent(s.be.id) is a
    s.d.set_ceiling(QoSClass.BE, 0.5, "qos:s", "r")
    assert s.d.intent(s.be.id) is not a


def test_settings_of_an_unmanaged_key_are_empty() -> None:
    s = Scene()
    gen, settings = s.d.settings("nothing")
    assert settings == [] and gen == (0, 0, 0)
    gen, settings = s.d.settings(s.be.id)
    assert [x.resource for x in settings] == ["cpu.shares"]


def test_a_removed_key_leaves_nothing_behind() -> None:
    s = Scene(current=-1)
    s.d.set_overlay(s.be.id, "qos:x", {"cpu.cfs_quota_us": 5000}, "r")
    s.model.container_removed(s.be.id)
    assert s.d.overlays.of(s.be.id) == []
    assert s.d.generation(s.be.id) == (0, 0, 0)
    s.model.container_started(s.be_pod, s.be)  # back: no overlay, no baseline
    assert s.value(s.be.id, "cpu.cfs_quota_us") is None
    told = len(s.told)
    s.d.set_ceiling(QoSClass.BE, 0.5, "qos:s", "r")
    assert s.be.id in s.told[told]


def test_a_pods_class_is_forgotten_with_the_pod() -> None:
    s = Scene()
    s.model.pod_removed(s.ls_pod.id)
    assert s.ls_pod.id not in s.d._classes
    s.d.set_ceiling(QoSClass.LS, 0.5, "qos:s", "r")
    assert s.told == [] or all(s.ls.id not in keys for keys in s.told)


def test_intent_before_known_is_what_intent_gives_once_known() -> None:
    s = Scene()
    pod = make_pod(5, "BE")
    c = make_container(5, pod)
    early = s.d.intent_before_known(pod, c)
    s.model.container_started(pod, c)
    assert early is not None and early.files == s.d.intent(c.id).files  # type: ignore[union-attr]
    c6 = make_container(6, s.be_pod)
    assert s.d.intent_before_known(s.be_pod, c6) is not None  # the pod's class, already decided


def test_once_logs_each_reason_once_and_forgets_past_1000(caplog: pytest.LogCaptureFixture) -> None:
    s = Scene()
    with caplog.at_level(logging.WARNING, "nriplugin.node.desired"):
        s.d._once(("k", "r"), "said %s", "x")
        s.d._once(("k", "r"), "said %s", "x")
        assert caplog.text.count("said x") == 1
        for i in range(1000):
            s.d._once(("k", str(i)), "n")
        assert len(s.d._logged) == 1001  # with ("k", "r")
        s.d._once(("k", "last"), "n")
        assert s.d._logged == {("k", "last")}
        s.d._once(("k", "r"), "said %s", "x")
        assert caplog.text.count("said x") == 2
    assert caplog.records[0].reason == "k"  # type: ignore[attr-defined]


def test_an_intent_copy_is_not_shared() -> None:
    s = Scene()
    base = s.d.intent(s.be.id)
    s.d.set_overlay(s.be.id, "qos:x", {"cpu.shares": 9}, "r")
    assert isinstance(base, Intent) and base.get("cpu.shares") == 2
    assert s.value(s.be.id, "cpu.shares") == 9


def test_pins_only_lse_and_lsr_while_the_cpuset_feature_is_on() -> None:
    on = Policy.model_validate({"features": {"cpuset": {"enable": True}}})
    off = Policy.model_validate({"features": {"cpuset": {"enable": False}}})
    s = Scene(policy=on)
    assert s.d.pins(make_pod(7, "LSR")) and s.d.pins(make_pod(8, "LSE"))
    assert not s.d.pins(make_pod(9, "LS")) and not s.d.pins(make_pod(10, "BE"))
    s.rules.set(off, "test")
    assert not s.d.pins(make_pod(7, "LSR"))


def test_whether_a_pod_not_yet_known_is_managed_by_its_key_and_without_one() -> None:
    """What the take-in queue notes of a container answered before the model knows it: the
    agent manages the classes it has a desired state for, not SYSTEM's, not a bad label's."""
    s = Scene()
    for n, label, managed in ((11, "LS", True), (12, "BE", True), (13, None, True), (14, "SYSTEM", False)):
        pod = make_pod(n, label)
        key = s.d.birth_key(pod, make_container(n, pod))
        assert key is not None and s.d.born_managed(key) is managed, label
        assert s.d.manages(pod) is managed, label
    bad = make_pod(15, "NOPE")
    assert s.d.birth_key(bad, make_container(15, bad)) is None
    assert s.d.manages(bad) is False


def test_a_pod_that_pins_has_no_birth_key_while_the_cpuset_feature_is_on() -> None:
    """Exclusive CPUs are handed out to each container: no answer of its shape to share."""
    on = Policy.model_validate({"features": {"cpuset": {"enable": True}}})
    off = Policy.model_validate({"features": {"cpuset": {"enable": False}}})
    s = Scene(policy=on)
    for n, label in ((7, "LSR"), (8, "LSE")):
        pod = make_pod(n, label)
        assert s.d.birth_key(pod, make_container(n, pod)) is None
    ls = make_pod(9, "LS")
    assert s.d.birth_key(ls, make_container(9, ls)) is not None
    s.rules.set(off, "test")
    lsr = make_pod(7, "LSR")
    assert s.d.birth_key(lsr, make_container(7, lsr)) is not None


def test_sharers_are_the_containers_not_pinned_but_the_skipped_one() -> None:
    s = Scene()
    assert s.d.sharers() == [s.be.id, s.ls.id]
    assert s.d.sharers(skip=s.be.id) == [s.ls.id]
    s.d.cpus.exclusive[s.ls.id] = frozenset({0})
    assert s.d.sharers() == [s.be.id]


def test_a_changed_key_is_recomputed_and_told() -> None:
    s = Scene()
    g = s.d.generation(s.be.id)
    s.d.changed(s.be.id)
    assert s.told == [[s.be.id]] and s.d.generation(s.be.id) > g


def test_every_value_is_checked_after_a_network_ceiling() -> None:
    o = Overlays()
    with pytest.raises(ValueError, match=r"unknown resource 'cpu\.nope'"):
        o.set("k", "qos:n", {"net.L0.egressCeil": 1000, "cpu.nope": 1}, "r")
    with pytest.raises(ValueError, match="positive"):
        o.set("k", "qos:n", {"net.L0.egressCeil": 1000, "net.L1.egressCeil": 0}, "r")


def test_an_overlaid_quota_caps_the_features_burst() -> None:
    s = Scene()
    assert s.value(s.ls.id, "cpu.cfs_burst_us") == 200000  # the feature's, at the runtime's quota
    s.d.set_overlay(s.ls.id, "qos:x", {"cpu.cfs_quota_us": 100000}, "cut")
    assert s.value(s.ls.id, "cpu.cfs_burst_us") == 100000


def test_a_cpuset_limit_leaves_exclusive_containers_alone() -> None:
    s = Scene(cpuset=True)
    s.d.cpus.exclusive[s.be.id] = frozenset({0})
    s.d.invalidate([s.be.id])
    before = s.d.intent(s.be.id)
    s.d.set_cpuset_limit(QoSClass.BE, 1, "qos:s", "r")
    after = s.d.intent(s.be.id)
    assert before is not None and after is not None and after.files == before.files


def test_a_container_value_the_runtime_did_not_ask_for_comes_back_from_the_kernel() -> None:
    s = Scene(current=-1)
    s.d.set_overlay(s.be.id, "qos:x", {"cpu.cfs_quota_us": 50000}, "r")
    assert s.asked == [(s.be.id, "cpu.cfs_quota_us")]  # BE asked for no quota: the kernel's is kept
    s.d.withdraw_overlay(s.be.id, "qos:x")
    assert s.value(s.be.id, "cpu.cfs_quota_us") == -1
    pod = pod_key(s.be_pod.id)
    s.d.set_overlay(pod, "qos:x", {"cpu.cfs_quota_us": 50000}, "r")
    assert s.asked[-1] == (pod, "cpu.cfs_quota_us")
    s.d.withdraw_overlay(pod, "qos:x")
    assert s.value(pod, "cpu.cfs_quota_us") == -1


def test_a_container_of_an_unseen_pod_with_a_bad_label_is_unmanaged() -> None:
    s = Scene()
    bad = make_pod(11, "BE")
    bad.labels["koordinator.sh/qosClass"] = "NOPE"
    assert s.d.intent_before_known(bad, make_container(11, bad)) is None
    assert s.d.rejected_labels == 0  # reported when the model takes the pod in, not here


def test_a_new_container_gets_its_class_ceiling_and_cpuset_limit_before_it_is_known() -> None:
    s = Scene(cpuset=True)
    s.d.set_cpuset_limit(QoSClass.BE, 1, "qos:s", "BE on 1 CPU")
    early = s.d.intent_before_known(s.be_pod, make_container(6, s.be_pod))
    assert early is not None and early.files[("cpuset.cpus", "")].owner == "qos:s"


def test_a_pods_class_by_its_parent_is_capped() -> None:
    s = Scene()
    s.d.set_ceiling(QoSClass.BE, 0.5, "qos:s", "r")
    for n, parent, capped in ((12, "/kubepods/besteffort/pod12", True), (13, "/kubepods/burstable/pod13", False)):
        pod = make_pod(n, None, parent=parent)
        ctr = make_container(n, pod)
        s.model.container_started(pod, ctr)
        assert s.d.capped(ctr.id) is capped


def test_the_ceiling_takes_the_default_period() -> None:
    s = Scene()
    _quota_overlay(s, 150000)
    s.d.set_ceiling(QoSClass.BE, 1.0, "qos:s", "r")
    assert s.value(s.be.id, "cpu.cfs_quota_us") == 100000


def test_no_cpuset_limit_when_the_capabilities_do_not_name_cpuset() -> None:
    s = Scene()
    del s.d.caps.files["cpuset.cpus"]
    s.d.set_cpuset_limit(QoSClass.BE, 1, "qos:s", "r")
    assert s.value(s.be.id, "cpuset.cpus") is None


def test_every_policy_change_is_a_new_epoch() -> None:
    s = Scene()
    for n in (1, 2, 3):
        s.rules.set(Policy.model_validate({"qosManager": {"enable": n % 2 == 0}}), "test")
        assert s.d.generation(s.be.id)[0] == n


def test_a_features_value_is_not_read_from_the_kernel_but_a_second_owners_is() -> None:
    """The first overlay on a resource a feature sets replaces the feature's value (it comes
    back by itself); a second owner replaces the first owner's, which is read and remembered."""
    s = Scene()
    pod = pod_key(s.be_pod.id)  # cpuQOS sets the pod's shares
    s.d.set_overlay(pod, "qos:a", {"cpu.shares": 8}, "r")
    assert s.asked == []
    s.d.set_overlay(pod, "qos:b", {"cpu.shares": 16}, "r")
    assert s.asked == [(pod, "cpu.shares")]
    s.d.withdraw_overlay(pod, "qos:a")
    s.d.withdraw_overlay(pod, "qos:b")
    assert s.setting(pod, "cpu.shares").owner == "cpuQOS"  # the feature's value wins over what was read
    assert s.value(pod, "cpu.shares") == 2


def test_the_pool_moving_tells_the_sharers_once() -> None:
    s = Scene()
    assert s.d._pool_moved() == []
    s.d.cpus.generation += 1
    assert s.d._pool_moved(skip=s.be.id) == [s.ls.id]
    assert s.d._pool_moved() == []


def test_a_pinned_container_leaving_moves_the_others_not_itself() -> None:
    s = Scene()
    s.d.cpus.exclusive[s.ls.id] = frozenset({0})
    s.model.container_removed(s.ls.id)
    assert s.told == [[s.be.id]]


def test_a_container_of_a_pod_with_a_bad_label_leaves_quietly() -> None:
    s = Scene()
    bad = make_pod(3, "BE")
    bad.labels["koordinator.sh/qosClass"] = "NOPE"
    c = make_container(3, bad)
    s.model.container_started(bad, c)
    s.model.container_removed(c.id)
    s.model.pod_removed(bad.id)
    assert c.id not in s.model


def test_a_removed_key_forgets_its_cached_intent() -> None:
    s = Scene()
    s.d.set_overlay(s.be.id, "qos:x", {"cpu.shares": 9}, "r")
    assert s.value(s.be.id, "cpu.shares") == 9  # cached
    s.model.container_removed(s.be.id)
    s.model.container_started(s.be_pod, s.be)
    assert s.value(s.be.id, "cpu.shares") == 2


def test_a_skipped_feature_is_said_with_its_pod_and_reason(caplog: pytest.LogCaptureFixture) -> None:
    s = Scene()
    with caplog.at_level(logging.WARNING, "nriplugin.node.desired"):
        s.d._invalid(s.be_pod, "blkio", "no such device")
    assert caplog.records[-1].getMessage() == "pod default/pod-1: blkio skipped: no such device"
    assert s.invalid == ["blkio"]


def test_a_failing_feature_is_said_with_its_pod_and_reason(caplog: pytest.LogCaptureFixture) -> None:
    s = Scene()
    pod = make_pod(14, "LS")
    pod.annotations["koordinator.sh/cpuBurst"] = '{"policy": "yes"}'
    c = make_container(14, pod)
    c.linux.resources.cpu.quota.value = 50000
    with caplog.at_level(logging.WARNING, "nriplugin.node.desired"):
        s.model.container_started(pod, c)
        s.d.intent(c.id)
    msg = next(r.getMessage() for r in caplog.records if "skipped" in r.getMessage())
    assert msg.startswith("pod default/pod-14: cpuBurst skipped: ") and len(msg) > len(
        "pod default/pod-14: cpuBurst skipped: "
    )
    assert s.invalid == ["cpuBurst"]


def test_settings_carry_the_keys_own_generation() -> None:
    s = Scene()
    s.d.invalidate([s.be.id])
    gen, settings = s.d.settings(s.be.id)
    assert gen == s.d.generation(s.be.id) and gen[1] > 0
    assert settings == s.d.intent(s.be.id).settings()  # type: ignore[union-attr]


def test_a_gone_keys_generation_is_dropped_on_invalidate() -> None:
    s = Scene()
    s.d.invalidate([s.be.id])
    s.model.container_removed(s.be.id)
    s.d.invalidate([s.be.id])  # a late invalidation of a key that went
    assert s.d.generation(s.be.id)[1] == 0
    assert s.be.id not in s.d._gens


def test_a_fail_closed_failure_leaves_the_files_and_says_why_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    closed = Policy.model_validate({"features": {"cpuBurst": {"failurePolicy": "fail-closed"}}})
    s = Scene(policy=closed)
    pod = make_pod(15, "LS")
    pod.annotations["koordinator.sh/cpuBurst"] = '{"policy": "yes"}'
    c = make_container(15, pod)
    c.linux.resources.cpu.quota.value = 50000
    s.model.container_started(pod, c)
    with caplog.at_level(logging.DEBUG, "nriplugin.node.desired"):
        gen, settings = s.d.settings(c.id)
    assert settings == [] and gen == s.d.generation(c.id)
    msg = caplog.records[-1].getMessage()
    assert msg.startswith(f"no desired state for {c.id}: cpuBurst: ")


def test_every_resource_of_an_overlay_is_considered_for_its_baseline() -> None:
    s = Scene()
    pod = pod_key(s.be_pod.id)
    s.d.set_overlay(pod, "qos:a", {"cpu.shares": 8, "cpu.cfs_quota_us": 50000}, "r")
    assert s.asked == [(pod, "cpu.cfs_quota_us")]  # the shares are the feature's; the quota is read


def test_an_unmanaged_pods_container_has_no_settings() -> None:
    s = Scene()
    bad = make_pod(16, "BE")
    bad.labels["koordinator.sh/qosClass"] = "NOPE"
    c = make_container(16, bad)
    s.model.container_started(bad, c)
    assert s.d.settings(c.id)[1] == []


def test_a_group_key_strips_only_slashes() -> None:
    assert group_key("/kubepods/podX/") == "group:kubepods/podX"
    assert group_key("X/pod") == "group:X/pod"


def test_the_refusal_of_an_empty_overlay_says_exactly_why() -> None:
    with pytest.raises(ValueError, match=r"^an overlay needs an owner and at least one value$"):
        Overlays().set("k", "", {"cpu.shares": 2}, "r")


def test_an_overlay_applies_to_an_unmanaged_container_too() -> None:
    s = Scene()
    bad = make_pod(17, "BE")
    bad.labels["koordinator.sh/qosClass"] = "NOPE"
    c = make_container(17, bad)
    s.model.container_started(bad, c)
    assert s.d.intent(c.id) is None
    s.d.set_overlay(c.id, "qos:x", {"cpu.shares": 4}, "r")
    assert s.value(c.id, "cpu.shares") == 4


def _pinning(tmp_path: Path, policy: Policy | None = None) -> tuple[DesiredState, NodeModel, list[str]]:
    from dataclasses import replace as dc_replace

    from tests.test_cpuset import topo

    model = NodeModel()
    invalid: list[str] = []
    c = dc_replace(caps(**{"cpuset.cpus": True}), topology=topo(tmp_path, 4, 2, 1))  # 8 CPUs
    on = policy or Policy.model_validate({"features": {"cpuset": {"enable": True}}})
    d = DesiredState(model, RuleCache(on), c, on_invalid=invalid.append)
    model.subscribe(d)
    return d, model, invalid


def test_a_cpuset_shortfall_is_said_once_with_the_container(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    d, model, invalid = _pinning(tmp_path)
    pod, ctr = make_lsr(1, 800000)  # 8 CPUs: one core must stay shared
    with caplog.at_level(logging.WARNING, "nriplugin.node.desired"):
        model.container_started(pod, ctr)
    assert invalid == ["cpuset_capacity"] and d.cpus.exclusive == {}
    rec = caplog.records[-1]
    assert rec.getMessage().startswith(
        "default/pod-1/main: LSR container runs in the share pool: needs 4 whole core(s)"
    )
    assert rec.getMessage().endswith(
        '(said once per shortfall; nriplugin_invalid_input_total{reason="cpuset_capacity"} counts each)'
    )
    assert rec.reason == "cpuset_capacity"  # type: ignore[attr-defined]


def test_a_bad_scheduling_decision_is_said_with_its_reason(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _, model, invalid = _pinning(tmp_path)
    pod, ctr = make_lsr(2, 200000, '{"cpuset": 5}')
    with caplog.at_level(logging.WARNING, "nriplugin.node.desired"):
        model.container_started(pod, ctr)
    assert invalid == ["cpuset"]
    msg = caplog.records[-1].getMessage()
    assert msg.startswith("pod default/pod-2: cpuset skipped: ") and "cpuset must be a cpu list string" in msg


def test_nothing_is_pinned_while_the_cpuset_feature_is_off(tmp_path: Path) -> None:
    off = Policy.model_validate({"features": {"cpuset": {"enable": False}}})
    d, model, _ = _pinning(tmp_path, off)
    pod, ctr = make_lsr(3, 200000)
    model.container_started(pod, ctr)
    assert d.cpus.exclusive == {}
    d2, model2, _ = _pinning(tmp_path / "on")
    model2.container_started(pod, ctr)
    assert len(d2.cpus.exclusive) == 1


def test_the_allocator_and_overlays_handed_in_are_used() -> None:
    from nriplugin.intent.cpus import CPUAllocator
    from nriplugin.kernel.probe import Topology

    alloc, ov = CPUAllocator(Topology()), Overlays()
    d = DesiredState(NodeModel(), RuleCache(Policy()), caps(), cpus=alloc, overlays=ov)
    assert d.cpus is alloc and d.overlays is ov


def test_a_new_state_does_not_move_the_pool_at_its_first_container() -> None:
    model = NodeModel()
    d = DesiredState(model, RuleCache(Policy()), caps())
    model.subscribe(d)
    told: list[list[str]] = []
    d.subscribe(told.append)
    pod = make_pod(1, "BE")
    model.container_started(pod, make_container(1, pod))
    assert told == []


def test_every_bad_label_is_counted_and_said_with_its_error(caplog: pytest.LogCaptureFixture) -> None:
    s = Scene()
    with caplog.at_level(logging.WARNING, "nriplugin.node.desired"):
        for i in (20, 21):
            bad = make_pod(i, "BE")
            bad.labels["koordinator.sh/qosClass"] = "NOPE"
            s.model.container_started(bad, make_container(i, bad))
    assert s.d.rejected_labels == 2
    msg = caplog.records[0].getMessage()
    assert msg.startswith("pod default/pod-20: ") and msg.endswith("; leaving it untouched")
    assert "NOPE" in msg


def test_a_failing_features_reason_is_said(caplog: pytest.LogCaptureFixture) -> None:
    s = Scene()
    pod = make_pod(22, "LS")
    pod.annotations["koordinator.sh/cpuBurst"] = '{"policy": "yes"}'
    c = make_container(22, pod)
    c.linux.resources.cpu.quota.value = 50000
    with caplog.at_level(logging.WARNING, "nriplugin.node.desired"):
        s.model.container_started(pod, c)
        s.d.intent(c.id)
    msg = next(r.getMessage() for r in caplog.records if "skipped" in r.getMessage())
    assert not msg.endswith(": None") and "policy" in msg


def test_a_fail_closed_failure_keeps_no_baseline() -> None:
    """An overlay on a container whose features fail closed: what it replaces is read, since
    nothing is known of the features' values."""
    closed = Policy.model_validate({"features": {"cpuBurst": {"failurePolicy": "fail-closed"}}})
    s = Scene(policy=closed)
    pod = make_pod(23, "LS")
    pod.annotations["koordinator.sh/cpuBurst"] = '{"policy": "yes"}'
    c = make_container(23, pod)
    s.model.container_started(pod, c)
    assert s.d.set_overlay(c.id, "qos:x", {"cpu.shares": 4}, "r")
    assert s.asked == []  # the runtime asked for shares: that is what comes back


# --- what BE's QoS-level group holds bounds the ceiling in force ----------------------------------

BE_GROUP = "kubepods/besteffort"


class Held:
    """A BE container with a 2-core quota under BE's QoS-level group, whose CFS bandwidth the
    kernel holds as ``kernel`` says ((key, resource) -> value; absent: the group is not there)."""

    def __init__(self, quota: int | None = 50000, period: int | None = 100000) -> None:
        self.kernel: dict[tuple[str, str], int | str | None] = {}
        self.asked: list[tuple[str, str]] = []
        self.hold(quota, period)
        self.model = NodeModel()

        def cur(key: str, resource: str) -> int | str | None:
            self.asked.append((key, resource))
            return self.kernel.get((key, resource))

        self.d = DesiredState(self.model, RuleCache(Policy()), caps(), current=cur)
        self.model.subscribe(self.d)
        self.be_pod = make_pod(1, "BE")
        self.be = make_container(1, self.be_pod)
        self.model.container_started(self.be_pod, self.be)
        self.d.set_overlay(self.be.id, "qos:x", {"cpu.cfs_quota_us": 200000}, "batch")

    def hold(self, quota: int | None, period: int | None = 100000) -> None:
        for resource, value in (("cpu.cfs_quota_us", quota), ("cpu.cfs_period_us", period)):
            if value is None:
                self.kernel.pop((group_key(BE_GROUP), resource), None)
            else:
                self.kernel[(group_key(BE_GROUP), resource)] = value

    def quota(self) -> Setting:
        intent = self.d.intent(self.be.id)
        assert intent is not None
        return intent.files[("cpu.cfs_quota_us", "")]


def test_a_restarted_agent_caps_be_at_the_cut_its_group_holds_owned_by_the_kernel() -> None:
    h = Held(quota=50000)
    assert h.d.learn_held(QoSClass.BE, ["/" + BE_GROUP + "/", "kubepods/nowhere"]) == {BE_GROUP: 0.5}
    q = h.quota()
    assert (q.value, q.owner) == (50000, "kernel")
    assert q.why == "batch; at most 0.50 cores while its QoS-level group holds 0.50 cores"


def test_learn_held_binds_only_the_groups_that_are_there_and_returns_the_limited() -> None:
    h = Held(quota=-1)  # unlimited: bound, not returned, no ceiling
    assert h.d.learn_held(QoSClass.BE, [BE_GROUP]) == {}
    assert h.quota().value == 200000 and not h.d.capped(h.be.id)
    h = Held(quota=None)  # not there: not bound, so a later write of it is not followed
    assert h.d.learn_held(QoSClass.BE, [BE_GROUP]) == {}
    h.hold(30000)
    h.d.group_written(BE_GROUP, "cpu.cfs_quota_us")
    assert h.quota().value == 200000 and not h.d.capped(h.be.id)


def test_a_held_cut_lower_than_the_decided_ceiling_is_in_force_under_its_owner() -> None:
    h = Held(quota=50000)
    h.d.set_ceiling(QoSClass.BE, 1.0, "qos:cpuSuppress", "BE is limited")
    assert h.quota().value == 100000  # not bound yet: the decided ceiling
    h.d.bound(QoSClass.BE, "/" + BE_GROUP + "/")
    q = h.quota()
    assert (q.value, q.owner) == (50000, "qos:cpuSuppress")
    assert q.why == "batch; at most 0.50 cores while its QoS-level group holds 0.50 cores"
    h.asked.clear()
    h.d.bound(QoSClass.BE, BE_GROUP)  # bound already: followed through group_written, not read again
    assert h.asked == []
    h.d.set_ceiling(QoSClass.BE, 0.25, "qos:cpuSuppress", "BE is limited")  # lower than held: decided
    assert h.quota().value == 25000


def test_the_group_written_moves_the_ceiling_with_what_it_holds() -> None:
    h = Held(quota=50000)
    h.d.set_ceiling(QoSClass.BE, 1.0, "qos:cpuSuppress", "BE is limited")
    h.d.bound(QoSClass.BE, BE_GROUP)
    h.hold(80000)
    h.d.group_written("/" + BE_GROUP + "/", "cpu.shares")  # not CFS bandwidth: nothing moves
    assert h.quota().value == 50000
    h.d.group_written("/" + BE_GROUP + "/", "cpu.cfs_quota_us")
    assert h.quota().value == 80000
    h.hold(80000, 200000)  # 0.4 cores
    h.d.group_written("/" + BE_GROUP + "/", "cpu.cfs_period_us")
    assert h.quota().value == 40000
    h.hold(80000, None)  # a period that cannot be read: the kernel's 100 ms
    h.d.group_written(BE_GROUP, "cpu.cfs_period_us")
    assert h.quota().value == 80000
    h.hold(-1)  # raised to no limit: the decided ceiling again
    h.d.group_written(BE_GROUP, "cpu.cfs_quota_us")
    assert h.quota().value == 100000
    h.hold(30000)
    h.d.group_written(BE_GROUP, "cpu.cfs_quota_us")
    assert h.quota().value == 30000
    h.hold(None, None)  # the group went away: it bounds nothing
    h.d.group_written(BE_GROUP, "cpu.cfs_quota_us")
    assert h.quota().value == 100000
    h.d.group_written("kubepods/burstable", "cpu.cfs_quota_us")  # not a bounding group
    assert h.quota().value == 100000


def test_only_the_groups_of_a_class_bound_it_and_an_unlimited_one_bounds_nothing() -> None:
    h = Held(quota=-1)
    h.kernel[(group_key("kubepods/burstable"), "cpu.cfs_quota_us")] = 10000
    h.d.bound(QoSClass.LS, "kubepods/burstable")  # LS's group: not BE's bound
    h.d.bound(QoSClass.BE, BE_GROUP)  # no limit
    assert h.quota().value == 200000 and not h.d.capped(h.be.id)
    h.d.set_ceiling(QoSClass.BE, 1.5, "qos:cpuSuppress", "BE is limited")
    assert h.quota().value == 150000
    h.d.bound(QoSClass.BE, "kubepods/gone")  # not there: bounds nothing
    assert h.quota().value == 150000


def test_a_class_decision_changes_the_birth_key_of_its_new_containers_only() -> None:
    h = Held()
    ls_pod = make_pod(2, "LS")
    new_be, new_ls = make_container(7, h.be_pod), make_container(8, ls_pod)
    be_key, ls_key = h.d.birth_key(h.be_pod, new_be), h.d.birth_key(ls_pod, new_ls)
    assert be_key is not None and ls_key is not None
    assert be_key[0] is QoSClass.BE and be_key[2] == 0 and ls_key[2] == 0  # no class decision yet
    twin = make_container(9, h.be_pod)
    assert h.d.birth_key(h.be_pod, twin) == be_key  # equal containers: equal keys, whatever their ids
    h.d.set_ceiling(QoSClass.BE, 0.5, "qos:cpuSuppress", "BE is limited")
    moved = h.d.birth_key(h.be_pod, new_be)
    assert moved is not None and moved[2] == 1 and h.d.birth_key(ls_pod, new_ls) == ls_key
    assert h.d.birth_key(h.be_pod, h.be) is None  # state of its own (an overlay): nothing to share


def test_a_container_whose_kernel_values_come_back_shares_no_birth_key() -> None:
    h = Held()
    h.d.withdraw_overlay(h.be.id, "qos:x")  # the value it replaced comes back: still its own state
    assert h.be.id not in h.d.overlays and h.d.birth_key(h.be_pod, h.be) is None


def test_equal_resources_give_equal_birth_keys_whatever_their_maps_order() -> None:
    h = Held()
    a, b = make_container(7, h.be_pod), make_container(8, h.be_pod)
    names = [f"memory.k{i}" for i in range(32)]
    for k in names:
        a.linux.resources.unified[k] = "1"
    for k in reversed(names):
        b.linux.resources.unified[k] = "1"
    plain = a.linux.resources.SerializeToString(), b.linux.resources.SerializeToString()
    assert plain[0] != plain[1], "a plain serialization no longer shows the order: pick other entries"
    assert h.d.birth_key(h.be_pod, a) == h.d.birth_key(h.be_pod, b)


def test_a_known_pod_keeps_the_class_the_model_decided_whatever_label_a_request_carries() -> None:
    """The class of a pod the model knows is the model's (what the reconciler will hold its
    containers to), not the label of the request at hand."""
    h = Held()
    assert h.d.intent(h.be.id) is not None  # the model decided BE for the pod
    relabelled = api.PodSandbox()
    relabelled.CopyFrom(h.be_pod)
    relabelled.labels["koordinator.sh/qosClass"] = "LS"
    key = h.d.birth_key(relabelled, make_container(9, relabelled))
    assert key is not None and key[0] is QoSClass.BE
    unknown = make_pod(9, "LS")
    other = h.d.birth_key(unknown, make_container(9, unknown))
    assert other is not None and other[0] is QoSClass.LS


def test_a_held_cut_within_one_microsecond_a_period_leaves_the_decided_ceiling() -> None:
    h = Held(quota=25000)
    h.d.bound(QoSClass.BE, BE_GROUP)
    h.d.set_ceiling(QoSClass.BE, 0.25 + 1e-5, "qos:cpuSuppress", "BE is limited")  # 1 us above what is held
    assert h.quota().why == "batch; at most 0.25 cores while BE is limited"
    h.d.set_ceiling(QoSClass.BE, 0.25 + 2e-5, "qos:cpuSuppress", "BE is limited")
    assert h.quota().why == "batch; at most 0.25 cores while its QoS-level group holds 0.25 cores"
