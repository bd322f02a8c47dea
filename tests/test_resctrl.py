"""resctrl on a temporary tree laid out like /sys/fs/resctrl (this machine has none)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from nriplugin.kernel.probe import resctrl
from nriplugin.kernel.resctrl import ResctrlError, ResctrlFS, cat_mask, mba_value
from nriplugin.node.assembly import Node
from nriplugin.node.hooks import QoSPlugin
from nriplugin.policy.cache import RuleCache
from nriplugin.policy.model import Policy
from testkit.kernel_tree import resctrl_tree
from testkit.runtime_peer import make_container, make_pod
from tests.test_features import caps


@given(st.integers(1, 20), st.integers(0, 99), st.integers(1, 100), st.integers(1, 3))
def test_cat_masks_are_contiguous_and_in_range(ways: int, start: int, end: int, min_bits: int) -> None:
    assume(start < end and min_bits <= ways)
    m = cat_mask(ways, start, end, min_bits)
    bits = bin(m)[2:]
    assert m > 0 and m < (1 << ways)
    assert "01" not in bits.rstrip("0")  # one run of ones: contiguous, as CAT requires
    assert bits.count("1") >= min_bits


def test_masks_and_bandwidth(tmp_path: Path) -> None:
    info = resctrl(resctrl_tree(tmp_path, cbm_mask="7ff"))  # 11 ways
    assert cat_mask(11, 0, 30, 1) == 0b1111  # ceil(3.3) = 4 ways from the bottom
    assert cat_mask(11, 0, 100, 1) == 0x7FF
    assert mba_value(55, info) == 60 and mba_value(1, info) == 10 and mba_value(100, info) == 100


def test_groups_schemata_and_tasks(tmp_path: Path) -> None:
    root = resctrl_tree(tmp_path)
    (root / "schemata").write_text("L3:0=7ff;1=7ff\nMB:0=100;1=100\n")
    fs = ResctrlFS(root, resctrl(root))
    sch = fs.schemata(0, 30, 50)
    assert sch == "L3:0=f;1=f\nMB:0=50;1=50\n"
    assert fs.ensure_group("koordlet-BE", sch)
    assert (root / "koordlet-BE" / "schemata").read_text() == sch
    assert not fs.ensure_group("koordlet-BE", sch)  # unchanged: no write
    (root / "koordlet-BE" / "tasks").write_text("")
    fs.add_task("koordlet-BE", 1234)
    fs.add_task("koordlet-BE", 1235)
    assert (root / "koordlet-BE" / "tasks").read_text() == "1234\n1235\n"
    for bad in ("../x", "a/b", "", "x" * 100, ".."):
        with pytest.raises(ResctrlError):
            fs.ensure_group(bad, sch)
    with pytest.raises(ResctrlError):
        fs.add_task("koordlet-BE", -1)


def test_plugin_puts_tasks_in_their_class_group(tmp_path: Path) -> None:
    root = resctrl_tree(tmp_path)
    c = caps()
    c.resctrl = resctrl(root)
    policy = Policy.model_validate(
        {
            "resourceQOSStrategy": {
                "beClass": {"resctrlQOS": {"enable": True, "catRangeEndPercent": 30, "mbaPercent": 40}},
                "lsClass": {"resctrlQOS": {"enable": True}},
            }
        }
    )
    invalid: list[str] = []
    p = QoSPlugin(Node.create(RuleCache(policy), caps=c, resctrl_root=root, on_invalid=invalid.append))
    be = make_pod(1, "BE")
    ctr = make_container(1, be)
    ctr.pid = 4242
    # the kernel creates tasks/schemata in a new group; on the fake tree we pre-create them
    (root / "koordlet-BE").mkdir()
    (root / "koordlet-BE" / "tasks").write_text("")
    p.start_container(be, ctr)
    assert (root / "koordlet-BE" / "tasks").read_text() == "4242\n"
    assert (root / "koordlet-BE" / "schemata").read_text().startswith("L3:0=f\n")
    ls = make_pod(2, "LS")
    lsc = make_container(2, ls)
    lsc.pid = 77
    assert invalid == []
    p.start_container(ls, lsc)  # the fake tree has no tasks file for a fresh group: reported, no crash
    assert invalid == ["resctrl"]


def test_rdt_class_in_the_adjustment_is_opt_in(tmp_path: Path) -> None:
    root = resctrl_tree(tmp_path)
    c = caps()
    c.resctrl = resctrl(root)
    on = {"resourceQOSStrategy": {"beClass": {"resctrlQOS": {"enable": True}}}}
    be = make_pod(1, "BE")
    plain = QoSPlugin(Node.create(RuleCache(Policy.model_validate(on)), caps=c, resctrl_root=root))
    adj = plain.create_container(be, make_container(1, be))
    assert adj is not None and not isinstance(adj, tuple) and not adj.linux.resources.HasField("rdt_class")
    runtime = QoSPlugin(
        Node.create(RuleCache(Policy.model_validate({**on, "resctrlRuntimeClasses": True})), caps=c, resctrl_root=root)
    )
    adj = runtime.create_container(be, make_container(1, be))
    assert adj is not None and not isinstance(adj, tuple)
    assert adj.linux.resources.rdt_class.value == "koordlet-BE"
