"""Network QoS's pure parts: rate parsing (bad input refused with the key named), the node's
tree and each pod's place from the policy, and net suppress's decisions."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from nriplugin.intent.core import InvalidInput
from nriplugin.netqos.desired import (
    DEFAULT_TOTAL,
    EGRESS_KEY,
    INGRESS_KEY,
    NetLevel,
    NodeNet,
    Rates,
    annotation_bits,
    leaf_rates,
    node_state,
    pod_state,
    suppress_resource,
)
from nriplugin.netqos.suppress import Config, NetSuppress, SuppressState, decide
from nriplugin.netqos.tc import LEVEL_MINOR, Snapshot
from nriplugin.node.overlays import Overlays
from nriplugin.policy.bandwidth import MIN_RATE, check_class_bandwidth, class_bits, parse_total_bandwidth
from nriplugin.policy.document import from_document
from nriplugin.policy.model import Policy
from nriplugin.policy.qos import QoSClass

E2E_POLICY = {
    "resourceQOSStrategy": {
        "policies": {"netQOSPolicy": "tc"},
        "lsClass": {
            "networkQOS": {
                "enable": True,
                "ingressRequest": "50%",
                "ingressLimit": "100%",
                "egressRequest": "50M",
                "egressLimit": "100%",
            }
        },
        "beClass": {"networkQOS": {"enable": True, "ingressLimit": "20%", "egressLimit": 20}},
    },
    "systemStrategy": {"totalNetworkBandwidth": "100M"},
}


def policy(doc: dict[str, object] | None = None) -> Policy:
    return from_document(doc if doc is not None else E2E_POLICY)[0]


def test_the_agreed_policy_gives_the_classes_their_rates() -> None:
    node = node_state(policy())
    assert node.total == 100_000_000
    ls_in, ls_out = node.rates(NetLevel.L1, "ingress"), node.rates(NetLevel.L1, "egress")
    assert (ls_in.rate, ls_in.ceil) == (50_000_000, 100_000_000)
    assert (ls_out.rate, ls_out.ceil) == (50_000_000, 100_000_000)  # "50M" is bits/s
    be = node.rates(NetLevel.L2, "egress")
    assert (be.rate, be.ceil) == (MIN_RATE, 20_000_000)  # integer 20 = 20 % of the total
    l0 = node.rates(NetLevel.L0, "ingress")  # not enabled: no guarantee, the node as ceiling
    assert (l0.rate, l0.ceil) == (MIN_RATE, 100_000_000)


def test_units_of_the_total() -> None:
    assert parse_total_bandwidth(100) == 100_000_000  # an integer is Mbit/s, as the CRD says
    assert parse_total_bandwidth("100M") == 100_000_000
    assert parse_total_bandwidth("1G") == 10**9
    for bad in (0, -5, "abc", True, "2T", 1.5):
        with pytest.raises(ValueError):
            parse_total_bandwidth(bad)
    assert node_state(Policy()).total == DEFAULT_TOTAL


@pytest.mark.parametrize(
    "bad",
    [
        {"ingressLimit": 101},
        {"egressRequest": "abc"},
        {"egressLimit": "-5M"},
        {"ingressRequest": "12.5%"},
        {"egressLimit": True},
    ],
)
def test_a_bad_class_bandwidth_refuses_the_policy_with_the_field_named(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError, match=next(iter(bad))):
        policy({"resourceQOSStrategy": {"beClass": {"networkQOS": {"enable": True, **bad}}}})


def test_the_default_shapes_nothing_and_terway_is_left_alone() -> None:
    assert pod_state(Policy(), QoSClass.BE, {}) is None
    assert pod_state(policy(), QoSClass.LSR, {}) is None  # L0 not enabled, no annotation
    terway = policy({**E2E_POLICY, "resourceQOSStrategy": {"policies": {"netQOSPolicy": "terway-qos"}}})
    assert pod_state(terway, QoSClass.BE, {EGRESS_KEY: "20M"}) is None


def test_levels_and_caps() -> None:
    p = policy()
    ls = pod_state(p, QoSClass.LS, {})
    assert ls is not None and ls.level is NetLevel.L1 and ls.egress_cap is None
    be = pod_state(p, QoSClass.BE, {EGRESS_KEY: "20M"})
    assert be is not None and be.level is NetLevel.L2 and be.egress_cap == 20_000_000 and be.ingress_cap is None
    node = node_state(p)
    assert leaf_rates(node, be, "egress").ceil == 20_000_000
    assert leaf_rates(node, be, "ingress").ceil == node.total
    # a pod of a class not enabled is shaped by its own annotation alone
    lse = pod_state(p, QoSClass.LSE, {INGRESS_KEY: "5M"})
    assert lse is not None and lse.level is NetLevel.L0 and lse.ingress_cap == 5_000_000
    assert pod_state(p, QoSClass.SYSTEM, {INGRESS_KEY: "5M"}) is None


@pytest.mark.parametrize("raw", ["abc", "-20M", "2T", "0", "500", "1e40", "20 M", ""])
def test_a_bad_annotation_is_refused_with_the_key_named(raw: str) -> None:
    with pytest.raises(InvalidInput) as exc:
        pod_state(policy(), QoSClass.BE, {EGRESS_KEY: raw})
    assert exc.value.key == EGRESS_KEY


@given(st.text(max_size=30))
def test_any_annotation_is_a_rate_in_range_or_refused(raw: str) -> None:
    try:
        bits = annotation_bits(INGRESS_KEY, raw)
    except InvalidInput as exc:
        assert exc.key == INGRESS_KEY
    else:
        assert 1_000 <= bits <= 10**12


@given(st.integers(min_value=1, max_value=10**12), st.sampled_from(["", "k", "M", "G", "Ki", "Mi"]))
def test_quantities_in_range_parse_to_their_value(n: int, suffix: str) -> None:
    mult = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "Ki": 2**10, "Mi": 2**20}[suffix]
    value = n * mult
    if 1_000 <= value <= 10**12:
        assert annotation_bits(EGRESS_KEY, f"{n}{suffix}") == value
    else:
        with pytest.raises(InvalidInput):
            annotation_bits(EGRESS_KEY, f"{n}{suffix}")


@given(st.integers(min_value=0, max_value=100), st.integers(min_value=1_000, max_value=10**12))
def test_percentages_are_of_the_total(p: int, total: int) -> None:
    assert class_bits(p, total) == class_bits(f"{p}%", total) == total * p // 100


def test_an_overlay_lowers_a_class_ceiling() -> None:
    node = node_state(policy(), {suppress_resource(NetLevel.L2, "egress"): 5_000_000})
    assert node.rates(NetLevel.L2, "egress").ceil == 5_000_000
    assert node.rates(NetLevel.L2, "ingress").ceil == 20_000_000
    o = Overlays()
    with pytest.raises(ValueError):
        o.set("net:node", "qos:netSuppress", {suppress_resource(NetLevel.L2, "egress"): -1}, "x")


def test_net_suppress_cuts_at_once_raises_late_and_withdraws_when_calm() -> None:
    total, cfg = 100_000_000, Config(hold=5.0)
    s = decide(total, 50e6, SuppressState(), 0.0, cfg)
    assert s.ceiling is None  # below the threshold: nothing
    s = decide(total, 85e6, s, 1.0, cfg)
    assert s.ceiling == 5_000_000  # 100 - 85 - 10 = 5 M (also the floor)
    s = decide(total, 82e6, s, 2.0, cfg)
    assert s.ceiling == 5_000_000  # a raise within the deadband: held
    s = decide(total, 70e6, s, 3.0, cfg)
    assert s.ceiling == 5_000_000 and s.raise_since == 3.0  # a raise waits ``hold``
    s = decide(total, 70e6, s, 8.5, cfg)
    assert s.ceiling == 20_000_000
    s = decide(total, 10e6, s, 9.0, cfg)
    assert s.ceiling == 20_000_000  # calm starts
    s = decide(total, 10e6, s, 14.5, cfg)
    assert s == SuppressState()


def test_net_suppress_sets_and_withdraws_the_overlay_from_counters() -> None:
    o = Overlays()
    ns = NetSuppress(o, "net:node", Config(hold=0.0))
    p = policy()
    snap = Snapshot(bytes={("egress", 0x11): 0})
    assert not ns.step(p, 100_000_000, snap, 0.0)
    snap = Snapshot(bytes={("egress", 0x11): 90_000_000 // 8})  # 90 Mbit in 1 s of L1
    assert ns.step(p, 100_000_000, snap, 1.0)
    assert dict(o.of("net:node")[0].values) == {suppress_resource(NetLevel.L2, "egress"): 5_000_000}
    assert ns.step(p, 100_000_000, snap, 2.0)  # nothing sent since: calm, withdrawn (hold 0)
    assert o.of("net:node") == []
    off = policy({**E2E_POLICY, "qosManager": {"enable": False}})
    assert not ns.step(off, 100_000_000, snap, 3.0)


def test_the_example_policy_is_valid_and_shapes_ls_and_be() -> None:
    """examples/net-qos.yaml (README, the e2e test, bench/netqos.py) stays a valid policy with
    the rates it documents."""
    from pathlib import Path

    import yaml

    from nriplugin.netqos.desired import NetLevel, Rates, node_state
    from nriplugin.policy.document import from_document

    doc = yaml.safe_load((Path(__file__).resolve().parent.parent / "examples" / "net-qos.yaml").read_text())
    policy, notes = from_document(doc)
    assert notes == []
    node = node_state(policy, {})
    assert node.total == 90_000_000
    for d in ("ingress", "egress"):
        assert node.rates(NetLevel.L1, d) == Rates(45_000_000, 90_000_000)
        assert node.rates(NetLevel.L2, d) == Rates(4_500_000, 18_000_000)


def test_the_range_ends_are_accepted() -> None:
    assert annotation_bits(EGRESS_KEY, "1k") == MIN_RATE
    assert annotation_bits(EGRESS_KEY, "1T") == 10**12
    assert parse_total_bandwidth(1) == 10**6
    assert parse_total_bandwidth(1_000_000) == 10**12  # 1 Tbit/s in Mbit/s
    with pytest.raises(ValueError):
        parse_total_bandwidth(1_000_001)


@pytest.mark.parametrize(
    ("check", "value", "message"),
    [
        (check_class_bandwidth, True, "expected a percentage (0-100) or a bandwidth such as 50M"),
        (check_class_bandwidth, 1.5, "expected a percentage (0-100) or a bandwidth such as 50M, got float"),
        (check_class_bandwidth, "abc%", "not a percentage: 'abc%'"),
        (check_class_bandwidth, "12.5%", "percentages are whole numbers: '12.5%'"),
        (check_class_bandwidth, 101, "a percentage must be within 0-100, got 101"),
        (check_class_bandwidth, " -5M", "negative: '-5M'"),
        (check_class_bandwidth, "2T", "2T is outside 1k..1T bits/s"),
        (parse_total_bandwidth, True, "expected Mbit/s or a bandwidth such as 100M"),
        (parse_total_bandwidth, 0, "0 Mbit/s is outside 1..1000000"),
        (parse_total_bandwidth, 1.5, "expected Mbit/s or a bandwidth such as 100M, got float"),
    ],
)
def test_a_refused_bandwidth_says_why(check: Callable[[object], object], value: object, message: str) -> None:
    with pytest.raises(ValueError) as exc:
        check(value)
    assert str(exc.value) == message


@pytest.mark.parametrize(
    ("value", "prefix"),
    [
        ("-" + "9" * 60, "negative: "),
        ("x" * 60 + "%", "not a percentage: "),
        ("1" * 60 + ".5%", "percentages are whole numbers: "),
    ],
)
def test_a_long_bad_bandwidth_is_quoted_cut_to_40_characters(value: str, prefix: str) -> None:
    with pytest.raises(ValueError) as exc:
        check_class_bandwidth(value)
    assert str(exc.value) == prefix + repr(value[:40])


def test_a_bad_annotation_names_its_key_and_the_reason() -> None:
    with pytest.raises(InvalidInput) as exc:
        pod_state(policy(), QoSClass.BE, {EGRESS_KEY: "2T"})
    assert exc.value.why == "2T is outside 1k..1T bits/s"
    assert str(exc.value) == f"{EGRESS_KEY}: 2T is outside 1k..1T bits/s"


def test_a_quantity_is_bits_not_a_percentage() -> None:
    assert class_bits("30M", 10**9) == 30_000_000
    assert class_bits("30%", 10**9) == 300_000_000


def test_each_direction_takes_its_own_request_and_limit() -> None:
    doc = {
        "resourceQOSStrategy": {
            "policies": {"netQOSPolicy": "tc"},
            "lsClass": {
                "networkQOS": {
                    "enable": True,
                    "ingressRequest": 10,
                    "ingressLimit": "40%",
                    "egressRequest": "20M",
                    "egressLimit": 80,
                }
            },
        },
        "systemStrategy": {"totalNetworkBandwidth": 100},
    }
    node = node_state(policy(doc))
    assert node.rates(NetLevel.L1, "ingress") == Rates(10_000_000, 40_000_000)
    assert node.rates(NetLevel.L1, "egress") == Rates(20_000_000, 80_000_000)


def test_an_overlay_below_the_guarantee_lowers_the_guarantee_too() -> None:
    node = node_state(policy(), {suppress_resource(NetLevel.L1, "ingress"): 5_000_000})
    assert node.rates(NetLevel.L1, "ingress") == Rates(5_000_000, 5_000_000)  # HTB refuses rate > ceil
    assert node.rates(NetLevel.L1, "egress") == Rates(50_000_000, 100_000_000)


def test_a_pod_leaf_has_no_guarantee_of_its_own() -> None:
    node = node_state(policy())
    be = pod_state(policy(), QoSClass.BE, {EGRESS_KEY: "20M", INGRESS_KEY: "1T"})
    assert be is not None
    assert leaf_rates(node, be, "egress") == Rates(MIN_RATE, 20_000_000)
    assert leaf_rates(node, be, "ingress") == Rates(MIN_RATE, node.total)  # a cap above the node: the node


def test_the_tree_and_each_pod_say_why() -> None:
    assert node_state(policy()).why == "total 100000000 bit/s"
    assert node_state(Policy()).why == f"total {DEFAULT_TOTAL} bit/s (default: totalNetworkBandwidth not set)"
    p = policy()
    ls = pod_state(p, QoSClass.LS, {})
    assert ls is not None and ls.why == "LS -> L1"
    be = pod_state(p, QoSClass.BE, {INGRESS_KEY: "10M", EGRESS_KEY: "20M"})
    assert be is not None and be.why == "BE -> L2; ingress cap 10000000 bit/s; egress cap 20000000 bit/s"
    lse = pod_state(p, QoSClass.LSE, {INGRESS_KEY: "5M"})
    assert lse is not None and lse.why == "LSE -> L0 (class not enabled: own caps only); ingress cap 5000000 bit/s"


def test_a_class_missing_from_a_tree_is_a_key_error_naming_it() -> None:
    with pytest.raises(KeyError) as exc:
        NodeNet(1_000_000, (), "empty").rates(NetLevel.L0, "ingress")
    assert exc.value.args == ((NetLevel.L0, "ingress"),)


@pytest.mark.parametrize("total", [1, 1_000, 10**12])
def test_net_suppress_measures_use_against_any_positive_total(total: int) -> None:
    s = decide(total, float(total), SuppressState(), 0.0)  # L0+L1 use it all: L2 down to its floor
    assert s.ceiling == max(MIN_RATE, int(0.05 * total))


def test_net_suppress_leaves_a_node_of_no_known_size_alone() -> None:
    assert decide(0, 5e6, SuppressState(), 0.0) == SuppressState()
    assert decide(0, 5e6, SuppressState(ceiling=1_000_000), 0.0) == SuppressState(ceiling=1_000_000, calm_since=0.0)


def test_net_suppress_thresholds_are_inclusive() -> None:
    total = 100_000_000
    assert decide(total, 80e6, SuppressState(), 0.0).ceiling == 10_000_000  # at the threshold: cut
    s = decide(total, 60e6, SuppressState(ceiling=5_000_000), 1.0)  # at ``release``: not calm yet
    assert s.calm_since is None and s.ceiling == 5_000_000
    s = decide(total, 80e6, SuppressState(ceiling=5_000_000), 1.0)  # a raise of exactly the deadband waits
    assert s == SuppressState(ceiling=5_000_000, raise_since=1.0)
    assert decide(total, 80e6, s, 6.0) == SuppressState(ceiling=10_000_000)  # after exactly ``hold``


def test_net_suppress_never_cuts_below_the_minimum_rate() -> None:
    s = decide(100_000_000, 100e6, SuppressState(), 0.0, Config(floor=0.0))
    assert s.ceiling == MIN_RATE


def test_net_suppress_a_steady_ceiling_is_not_a_pending_raise() -> None:
    total, cfg = 100_000_000, Config(deadband=0.0, hold=5.0)
    s = decide(total, 85e6, SuppressState(), 0.0, cfg)
    s = decide(total, 85e6, s, 1.0, cfg)
    assert s == SuppressState(ceiling=5_000_000)
    s = decide(total, 70e6, s, 2.0, cfg)  # the raise appears now: it waits ``hold`` from here
    assert decide(total, 70e6, s, 6.5, cfg).ceiling == 5_000_000
    assert decide(total, 70e6, s, 7.0, cfg).ceiling == 20_000_000


def _bytes(ingress: dict[NetLevel, int], egress: dict[NetLevel, int]) -> Snapshot:
    out = {("ingress", LEVEL_MINOR + int(lv)): n for lv, n in ingress.items()}
    out |= {("egress", LEVEL_MINOR + int(lv)): n for lv, n in egress.items()}
    return Snapshot(bytes=out)


def test_net_suppress_ceiling_is_what_l0_and_l1_leave_from_their_counters() -> None:
    o = Overlays()
    ns = NetSuppress(o, "net:node", Config(hold=0.0, floor=0.0, headroom=0.0))
    p = policy()
    # L1 egress appears between the rounds (counted from 0); no L0 ingress class at all
    assert not ns.step(p, 100_000_000, _bytes({NetLevel.L1: 5_000_000}, {NetLevel.L0: 1_000_000}), 100.0)
    later = _bytes({NetLevel.L1: 25_000_000}, {NetLevel.L0: 11_000_000, NetLevel.L1: 10_000_000})
    assert ns.step(p, 100_000_000, later, 102.0)  # 20 MB in 2 s each way: 80 Mbit/s
    (d,) = o.of("net:node")
    assert d.owner == "qos:netSuppress" and d.reason == "L0+L1 use most of the node's bandwidth"
    assert dict(d.values) == {
        suppress_resource(NetLevel.L2, "ingress"): 20_000_000,
        suppress_resource(NetLevel.L2, "egress"): 20_000_000,
    }
    assert not ns.step(p, 100_000_000, later, 102.0)  # no time has passed: nothing measured


def test_net_suppress_off_withdraws_at_once_and_starts_afresh() -> None:
    o = Overlays()
    ns = NetSuppress(o, "net:node")
    p, total = policy(), 100_000_000
    busy = [_bytes({}, {NetLevel.L1: t * 90_000_000 // 8}) for t in range(6)]  # 90 Mbit/s of L1
    ns.step(p, total, busy[0], 0.0)
    assert ns.step(p, total, busy[1], 1.0) and o.of("net:node") != []
    manager_off = policy({**E2E_POLICY, "qosManager": {"enable": False}})
    assert ns.step(manager_off, total, busy[2], 2.0)  # still busy, but the manager is off
    assert o.of("net:node") == []
    assert not ns.step(p, total, busy[3], 3.0)  # back on: the first round only reads the counters
    assert ns.step(p, total, busy[4], 4.0) and o.of("net:node") != []
    assert ns.step(p, total, None, 5.0)  # no counters (the tree is gone): withdrawn
    assert o.of("net:node") == []
