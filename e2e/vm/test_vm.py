"""The cgroup v2 lane: a real v2 kernel in a VM (testkit/vm.py). The harness itself is checked
here; the product's tests that must run on the real kernel live in e2e/vm/guest/ and run inside
the guest in one pytest process per containerd line (every module on the selected line, the
containerd tests again on the second, :func:`testkit.vm.runtime_lines`, in the same boot); each
of them is one test here per line, failing with the guest's report."""

from __future__ import annotations

import ast
import os
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from testkit import vm

pytestmark = pytest.mark.vm
HERE = Path(__file__).resolve().parent
GUEST_MODULES = sorted((HERE / "guest").glob("v2_*.py"))


CONTAINERD_MODULE = "v2_containerd"  # the tests that run on every line


def guest_tests() -> list[tuple[str, str]]:
    """``(line, module::test)`` of every guest test on every line it runs on, read from the
    source (not imported on the host)."""
    first, *others = vm.runtime_lines()
    ids = []
    for mod in GUEST_MODULES:
        tree = ast.parse(mod.read_text())
        names = [f.name for f in tree.body if isinstance(f, ast.FunctionDef) and f.name.startswith("test_")]
        lines = [first, *others] if mod.stem == CONTAINERD_MODULE else [first]
        ids += [(line, f"{mod.stem}::{name}") for line in lines for name in names]
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


def test_the_session_guest_runs_systemd_as_pid_1(guest: vm.Guest) -> None:
    """The lane's guest boots systemd (testkit/vm/init: one unit serves the scripts) for the
    systemd cgroup driver's tests; cgroup v2 stays with every controller enabled."""
    out = guest.run("cat /proc/1/comm; systemctl is-system-running; cat /proc/self/cgroup").check().split()
    assert out[:3] == ["systemd", "running", "0::/system.slice/vm-serve.service"], out
    info = guest.run("cat /sys/fs/cgroup/cgroup.subtree_control").check().split()
    assert {"cpu", "cpuset", "memory", "io", "pids"} <= set(info), info


Report = dict[tuple[str, str], tuple[str, str]]


@pytest.fixture(scope="session")
def guest_report(guest: vm.Guest, guest_runtime: list[str]) -> Report:
    """Runs the guest tests, one pytest process in the guest per line: ``(line, module::test)``
    -> (outcome, message), and each run's whole output under ``(line, "")`` (printed on the
    host with -s)."""
    first, *others = guest_runtime
    report = _run_in_guest(guest, first, GUEST_MODULES)
    for line in others:
        report |= _run_in_guest(guest, line, [HERE / "guest" / f"{CONTAINERD_MODULE}.py"])
    return report


def _run_in_guest(guest: vm.Guest, line: str, modules: list[Path]) -> Report:
    root = HERE.parent.parent
    xml = guest.xchg / f"guest-junit-{line}.xml"
    mods = " ".join(str(m.relative_to(root)) for m in modules)
    t0 = time.monotonic()
    r = guest.run(
        f"cd {root} && NRIPLUGIN_IN_VM=1 NRIPLUGIN_RUNTIME={line} PYTHONPATH={root}"
        f" {root}/.venv/bin/python -m pytest -p no:cacheprovider"
        f" -o addopts= -v -s -rA --junitxml={xml} {mods}",
        timeout=1500,
    )
    print(f"guest {guest.release}, containerd {line}: pytest rc {r.rc} after {time.monotonic() - t0:.0f} s\n{r.output}")
    report: Report = {(line, ""): ("output", r.output)}
    if not xml.exists():
        return report
    for case in ET.parse(xml).getroot().iter("testcase"):
        key = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        outcome, msg = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome, msg = tag, f"{el.get('message', '')}\n{el.text or ''}"
        report[(line, key)] = (outcome, msg)
    return report


@pytest.mark.parametrize(("line", "name"), guest_tests(), ids=[f"{ln}-{n}" for ln, n in guest_tests()])
def test_in_guest(line: str, name: str, guest: vm.Guest, guest_report: Report) -> None:
    where = f"in the guest ({guest.release}, containerd {line})"
    if (line, name) not in guest_report:
        output = guest_report.get((line, ""), ("", "(no run)"))[1]
        pytest.fail(f"{name} did not run {where}:\n{output[-4000:]}")
    outcome, msg = guest_report[(line, name)]
    if outcome == "skipped" and os.environ.get("NRIPLUGIN_REQUIRE_PEERS") != "1":
        pytest.skip(f"{where}: {msg}")
    assert outcome == "passed", f"{where}: {outcome}: {msg[-4000:]}"
