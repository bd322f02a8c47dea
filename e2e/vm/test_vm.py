"""The cgroup v2 lane: a real v2 kernel in a VM (testkit/vm.py). The harness itself is checked
here; the product's tests that must run on the real kernel live in e2e/vm/guest/ and run inside
the guest in one pytest process; each of them is one test here, failing with the guest's
report."""

from __future__ import annotations

import ast
import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from testkit import vm

pytestmark = pytest.mark.vm
HERE = Path(__file__).resolve().parent
GUEST_MODULES = sorted((HERE / "guest").glob("v2_*.py"))


def guest_tests() -> list[str]:
    """``module::test`` of every guest test, read from the source (not imported on the host)."""
    ids = []
    for mod in GUEST_MODULES:
        tree = ast.parse(mod.read_text())
        ids += [
            f"{mod.stem}::{f.name}" for f in tree.body if isinstance(f, ast.FunctionDef) and f.name.startswith("test_")
        ]
    return ids


def test_a_guest_runs_scripts_and_leaves_nothing(vm_kit: Path) -> None:
    g = vm.Guest(vm_kit, memory_mb=512)
    pid, base = g._proc.pid if g._proc else 0, g.base
    try:
        assert g.release and (vm_kit / "release").read_text().strip() == g.release
        r = g.run("echo hello; echo oops >&2; exit 3")
        assert (r.rc, r.output) == (3, "hello\noops\n")
        info = g.run("stat -fc %T /sys/fs/cgroup; cat /sys/fs/cgroup/cgroup.subtree_control").check().split()
        assert info[0] == "cgroup2fs" and {"cpu", "cpuset", "memory", "io", "pids"} <= set(info[1:])
        assert g.run(f"test -f {HERE / 'test_vm.py'} && test -d {vm.cache_dir()}").rc == 0  # checkout, caches
        assert g.run("touch /etc/written-in-guest").rc == 0  # the guest's writes stay in the guest
        assert not Path("/etc/written-in-guest").exists()
    finally:
        g.close()
    assert not base.exists()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.fixture(scope="session")
def guest_report(guest: vm.Guest, guest_runtime: str) -> dict[str, tuple[str, str]]:
    """Runs every guest test in one pytest process in the guest: ``module::test`` -> (outcome,
    message), and the guest's whole output under "" (printed on the host with -s)."""
    root = HERE.parent.parent
    xml = guest.xchg / "guest-junit.xml"
    mods = " ".join(str(m.relative_to(root)) for m in GUEST_MODULES)
    r = guest.run(
        f"cd {root} && NRIPLUGIN_IN_VM=1 NRIPLUGIN_RUNTIME={guest_runtime} PYTHONPATH={root}"
        f" {root}/.venv/bin/python -m pytest -p no:cacheprovider"
        f" -o addopts= -v -s -rA --junitxml={xml} {mods}",
        timeout=1500,
    )
    print(f"guest {guest.release}: pytest rc {r.rc}\n{r.output}")
    report = {"": ("output", r.output)}
    if not xml.exists():
        return report
    for case in ET.parse(xml).getroot().iter("testcase"):
        key = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        outcome, msg = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome, msg = tag, f"{el.get('message', '')}\n{el.text or ''}"
        report[key] = (outcome, msg)
    return report


@pytest.mark.parametrize("name", guest_tests())
def test_in_guest(name: str, guest: vm.Guest, guest_report: dict[str, tuple[str, str]]) -> None:
    if name not in guest_report:
        pytest.fail(f"{name} did not run in the guest ({guest.release}):\n{guest_report[''][1][-4000:]}")
    outcome, msg = guest_report[name]
    if outcome == "skipped" and os.environ.get("NRIPLUGIN_REQUIRE_PEERS") != "1":
        pytest.skip(f"in the guest: {msg}")
    assert outcome == "passed", f"in the guest ({guest.release}): {outcome}: {msg[-4000:]}"
