"""resctrl on a temporary tree laid out like /sys/fs/resctrl (this machine has none)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from nriplugin.kernel.probe import resctrl
from nriplugin.kernel.resctrl import ResctrlError, ResctrlFS, cat_mask, mba_value
from nriplugin.node.assembly import Node
from nriplugin.node.hooks import QoSPlugin, runtime_paths
from nriplugin.nri.runtime import RuntimeCaps
from nriplugin.pacing.turns import Pacer
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


def _be_policy() -> Policy:
    be = {"resctrlQOS": {"enable": True, "catRangeEndPercent": 30, "mbaPercent": 40}}
    return Policy.model_validate({"resourceQOSStrategy": {"beClass": be}})


def test_a_runtime_with_linux_rdt_places_new_containers_and_the_agent_joins_the_rest(tmp_path: Path) -> None:
    """NRI v0.11+: the CLOS and its schemata travel in the CreateContainer answer (runc puts
    the task in the group before it runs) and the agent writes no task; a container this agent
    did not answer (created while it was away) is still joined by the agent at its start."""
    root = resctrl_tree(tmp_path)
    c = caps()
    c.resctrl = resctrl(root)
    p = QoSPlugin(Node.create(RuleCache(_be_policy()), caps=c, resctrl_root=root))
    p.runtime_caps(RuntimeCaps(runtime="containerd", nri=(0, 12, 5), source="runtime"))
    # the group is made at Configure, before any container names it
    assert (root / "koordlet-BE" / "schemata").read_text() == "L3:0=f\nMB:0=40\n"
    (root / "koordlet-BE" / "tasks").write_text("")  # the kernel's file, on the fake tree
    be = make_pod(1, "BE")
    ctr = make_container(1, be)
    adj = p.create_container(be, ctr)
    assert adj is not None and not isinstance(adj, tuple)
    assert adj.linux.rdt.clos_id.value == "koordlet-BE"
    assert list(adj.linux.rdt.schemata.value) == ["L3:0=f", "MB:0=40"]
    assert not adj.linux.resources.HasField("rdt_class")
    ctr.pid = 4242
    p.start_container(be, ctr)
    assert (root / "koordlet-BE" / "tasks").read_text() == ""  # the runtime placed it
    assert p.writer.rdt_placed == set()
    away = make_container(2, be)  # created before this agent answered anything
    away.pid = 4343
    p.start_container(be, away)
    assert (root / "koordlet-BE" / "tasks").read_text() == "4343\n"
    ls = make_pod(3, "LS")  # resctrlQOS off for LS: nothing asked of the runtime
    ls_adj = p.create_container(ls, make_container(3, ls))
    assert ls_adj is None or (not isinstance(ls_adj, tuple) and not ls_adj.linux.HasField("rdt"))
    paths = runtime_paths(p.desired.rules.policy, p.runtime, None, resctrl_mounted=True)
    assert paths["resctrl"].startswith("placed by the runtime (NRI LinuxRdt")
    gone = make_container(4, be)  # placed, then removed in a burst, before its take-in

    async def burst() -> None:
        # the same node on the agent's loop, where a burst's take-in waits (the burst goes on)
        q = QoSPlugin(p.node, pacer=Pacer(asyncio.get_running_loop(), wait_out_bursts=True, settle=60.0))
        q.runtime_caps(p.runtime)
        q.create_container(be, gone)
        assert q.writer.rdt_placed == {gone.id} and gone.id in q._created
        q.remove_container(be, gone)
        assert not q._created

    asyncio.run(burst())
    assert p.writer.rdt_placed == set() and gone.id not in p.model and not p._created


def test_an_older_runtime_leaves_the_join_to_the_agent(tmp_path: Path) -> None:
    root = resctrl_tree(tmp_path)
    c = caps()
    c.resctrl = resctrl(root)
    p = QoSPlugin(Node.create(RuleCache(_be_policy()), caps=c, resctrl_root=root))
    p.runtime_caps(RuntimeCaps(runtime="containerd", runtime_version="2.1.9", nri=(0, 8, 0), source="inferred"))
    assert not (root / "koordlet-BE").exists()  # made on first use, as before
    be = make_pod(1, "BE")
    ctr = make_container(1, be)
    adj = p.create_container(be, ctr)
    assert adj is None or (not isinstance(adj, tuple) and not adj.linux.HasField("rdt"))
    (root / "koordlet-BE").mkdir()
    (root / "koordlet-BE" / "tasks").write_text("")
    ctr.pid = 4242
    p.start_container(be, ctr)
    assert (root / "koordlet-BE" / "tasks").read_text() == "4242\n"
    why = runtime_paths(p.desired.rules.policy, p.runtime, None, resctrl_mounted=True)["resctrl"]
    assert why == "joined by the agent at StartContainer (runtime NRI v0.8.0 < v0.11 has no LinuxRdt)"
    assert runtime_paths(p.desired.rules.policy, p.runtime, None)["resctrl"] == "not here (no resctrl mount)"
    assert runtime_paths(Policy(), p.runtime, None, True)["resctrl"] == "off (no class enables resctrlQOS)"


def test_a_group_that_cannot_be_made_leaves_the_agents_join_in_force(tmp_path: Path) -> None:
    root = resctrl_tree(tmp_path)
    (root / "koordlet-BE").write_text("")  # not a directory: mkdir fails as when out of CLOSIDs
    c = caps()
    c.resctrl = resctrl(root)
    invalid: list[str] = []
    p = QoSPlugin(Node.create(RuleCache(_be_policy()), caps=c, resctrl_root=root, on_invalid=invalid.append))
    p.runtime_caps(RuntimeCaps(nri=(0, 12, 5), source="runtime"))
    assert invalid == ["resctrl"]
    be = make_pod(1, "BE")
    ctr = make_container(1, be)
    adj = p.create_container(be, ctr)
    # never a CLOS the runtime cannot use
    assert adj is None or (not isinstance(adj, tuple) and not adj.linux.HasField("rdt"))
    assert p.writer.rdt_placed == set()


def test_runtime_classes_win_over_linux_rdt(tmp_path: Path) -> None:
    """resctrlRuntimeClasses names containerd's own configured classes: that path stays."""
    root = resctrl_tree(tmp_path)
    c = caps()
    c.resctrl = resctrl(root)
    policy = Policy.model_validate({**_be_policy().model_dump(exclude_defaults=True), "resctrlRuntimeClasses": True})
    p = QoSPlugin(Node.create(RuleCache(policy), caps=c, resctrl_root=root))
    p.runtime_caps(RuntimeCaps(nri=(0, 12, 5), source="runtime"))
    be = make_pod(1, "BE")
    adj = p.create_container(be, make_container(1, be))
    assert adj is not None and not isinstance(adj, tuple)
    assert adj.linux.resources.rdt_class.value == "koordlet-BE" and not adj.linux.HasField("rdt")
