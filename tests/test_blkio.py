"""Block I/O: weights and per-device throttles, on temporary v1/v2 trees and this machine's
real blkio controller."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nriplugin.features import blkio, desired_state
from nriplugin.kernel.cgroup import Cgroups, InvalidValue
from nriplugin.kernel.probe import probe
from nriplugin.node.assembly import Node
from nriplugin.node.hooks import QoSPlugin
from nriplugin.policy.cache import RuleCache
from nriplugin.policy.model import Policy
from testkit.kernel_tree import v1_tree, v2_tree
from testkit.runtime_peer import make_container, make_pod
from tests.test_features import caps, ctx


def a_block_device() -> tuple[str, str] | None:
    for dev in sorted(Path("/sys/class/block").glob("*")):
        node = Path("/dev") / dev.name
        if node.exists() and (dev / "dev").exists():
            return str(node), (dev / "dev").read_text().strip()
    return None


POLICY = {
    "resourceQOSStrategy": {
        "beClass": {
            "blkioQOS": {
                "enable": True,
                "blocks": [
                    {
                        "name": "DEV",
                        "type": "device",
                        "ioCfg": {"readBPS": 1048576, "writeIOPS": 100, "ioWeightPercent": 20},
                    },
                    {"name": "/etc/passwd", "type": "device", "ioCfg": {"readBPS": 1}},  # not a block device: ignored
                    {
                        "name": "vg0",
                        "type": "volumegroup",
                        "ioCfg": {"readBPS": 1},
                    },  # needs the volume inventory: skipped
                ],
            }
        }
    }
}


def policy_for(dev: str) -> Policy:
    import json

    return Policy.model_validate(json.loads(json.dumps(POLICY).replace("DEV", dev)))


def test_device_resolution() -> None:
    found = a_block_device()
    if found is None:
        pytest.skip("no block device")
    node, majmin = found
    assert blkio.resolve_device(node) == majmin
    assert blkio.resolve_device("/etc/passwd") is None
    assert blkio.resolve_device("/dev/../etc/passwd") is None
    assert blkio.resolve_device("/dev/does-not-exist") is None


def test_throttles_and_weight_on_v1_and_v2(tmp_path: Path) -> None:
    found = a_block_device()
    if found is None:
        pytest.skip("no block device")
    node, majmin = found
    c = caps(**{"blkio.weight": True})
    c.controllers = ["blkio", "cpu"]
    out = desired_state(ctx("BE", policy=policy_for(node), c=c)).intent
    assert out.get("blkio.throttle.read_bps_device", majmin) == 1048576
    assert out.get("blkio.throttle.write_iops_device", majmin) == 100
    assert out.get("blkio.weight") == 200
    assert desired_state(ctx("LS", policy=policy_for(node), c=c)).intent.values.get("blkio.weight") is None
    be = make_pod(1, "BE")
    ctr = make_container(1, be)
    group = ctr.linux.cgroups_path.lstrip("/")
    root = v1_tree(
        tmp_path / "v1",
        [group],
        {"blkio": {"blkio.throttle.read_bps_device": "", "blkio.throttle.write_iops_device": ""}},
    )
    p = QoSPlugin(Node.create(RuleCache(policy_for(node)), caps=c, cgroups=Cgroups(root)))
    p.start_container(be, ctr)
    assert (root / "blkio" / group / "blkio.throttle.read_bps_device").read_text() == f"{majmin} 1048576"
    assert (root / "blkio" / group / "blkio.throttle.write_iops_device").read_text() == f"{majmin} 100"
    assert (root / "blkio" / group / "blkio.weight").read_text() == "200"
    root2 = v2_tree(tmp_path / "v2", [group])
    (root2 / group / "io.max").write_text("")
    p2 = QoSPlugin(Node.create(RuleCache(policy_for(node)), caps=c, cgroups=Cgroups(root2)))
    p2.start_container(be, ctr)
    # (each write replaces the fake file; the kernel merges io.max keys per device)
    assert (root2 / group / "io.max").read_text() in (f"{majmin} rbps=1048576", f"{majmin} wiops=100")


@pytest.mark.parametrize("bad", ["8:0", "8:0 -1", "x:0 1", "8:0 1 2", "8:0 99999999999999999999", "8:0 1\n9:0 1"])
def test_device_rules_are_validated(tmp_path: Path, bad: str) -> None:
    cg = Cgroups(v1_tree(tmp_path, ["g"]))
    with pytest.raises(InvalidValue):
        cg.write("g", "blkio.throttle.read_bps_device", bad)


REAL = Path("/sys/fs/cgroup/blkio")


@pytest.mark.skipif(
    os.geteuid() != 0 or not (REAL / "blkio.throttle.read_bps_device").exists(), reason="needs root + cgroup v1 blkio"
)
def test_real_blkio_throttle() -> None:
    found = a_block_device()
    if found is None:
        pytest.skip("no block device")
    _, majmin = found
    group = f"nriplugin-test-{os.getpid()}"
    (REAL / group).mkdir()
    try:
        cg = Cgroups(Path("/sys/fs/cgroup"))
        res = cg.write(group, "blkio.throttle.read_bps_device", f"{majmin} 1048576")
        assert res.status == "written", res
        assert f"{majmin} 1048576" in (REAL / group / "blkio.throttle.read_bps_device").read_text()
    finally:
        (REAL / group).rmdir()


def test_the_feature_applies_on_v2_whose_controller_is_named_io(tmp_path: Path) -> None:
    """v2 names the controller ``io`` (v1: ``blkio``); the probe reports the kernel's names."""
    found = a_block_device()
    if found is None:
        pytest.skip("no block device")
    node, majmin = found
    be = make_pod(1, "BE")
    ctr = make_container(1, be)
    root = v2_tree(tmp_path, [ctr.linux.cgroups_path.lstrip("/")])
    c = probe(cgroup_root=root, resctrl_root=tmp_path / "none", core_sched=False)
    assert "io" in c.controllers and "blkio" not in c.controllers
    out = desired_state(ctx("BE", policy=policy_for(node), c=c)).intent
    assert out.get("blkio.throttle.read_bps_device", majmin) == 1048576
