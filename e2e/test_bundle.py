"""The self-contained executable from ``image/bundle.sh`` as a pre-registered plugin: it
installs itself into the private containerd's plugin dir, containerd starts it with no
arguments and no environment but the NRI connection, and a BE pod is adjusted. No Python from
this machine is involved: every process of the plugin runs the bundle.

Built once per test session (an unchanged tree is not rebuilt).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from testkit.containerd import Containerd, read_cgroup
from testkit.plugin import alive, build_script, children, free_port, runtime_args, scrape, until

ROOT = Path(__file__).resolve().parent.parent
BE = {"koordinator.sh/qosClass": "BE"}


@pytest.fixture(scope="session")
def bundle(pkg_root: Path) -> Path:
    return build_script("bundle.sh")


def descendants(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for c in (task / "children").read_text().split():
            out += [int(c), *descendants(int(c))]
    return out


def test_bundle_started_by_containerd(bundle: Path, runtime_factory: Callable[..., Containerd]) -> None:
    rt = runtime_factory(start=False)
    port = free_port()
    log = rt.base / "logs" / "plugin.log"
    run_args = ["--socket", rt.nri_socket, "--metrics-address", f"127.0.0.1:{port}", *runtime_args(rt)]
    # The bundle installs itself (no --bundle needed), with its options next to it.
    r = subprocess.run(
        [str(bundle), "install", "--plugin-dir", str(rt.plugin_dir), "--log-file", str(log), "--", *run_args],
        capture_output=True,
        text=True,
        env={},
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    target = rt.plugin_dir / "10-nriplugin"
    assert target.read_bytes() == bundle.read_bytes()
    options = json.loads((rt.plugin_dir / "10-nriplugin.options.json").read_text())
    assert options == {"args": run_args, "logFile": str(log)}

    rt.start()
    rt.import_images()
    assert rt.proc is not None
    plugins = children(rt.proc.pid)
    assert plugins, "containerd did not start the bundle"
    try:
        until(lambda: scrape(port, "nriplugin_registrations_total") >= 1, 30, "the bundled agent did not register")
        tree = [plugins[0], *descendants(plugins[0])]
        exes = {os.readlink(f"/proc/{p}/exe") for p in tree}
        assert exes == {str(target)}, exes  # the bundle throughout: supervisor and agent, no Python

        pod = rt.run_pod("be", "BestEffort", BE)
        cid = rt.create_container(pod, "main", cpu_shares=1024)
        assert read_cgroup(rt.container_cgroup(pod, cid), "cpu.shares") == "2"

        # The supervisor in the bundle restarts a crashed agent on the runtime's socket.
        agent = max(tree)  # the last started: the agent's Python process
        os.kill(agent, signal.SIGKILL)
        until(
            lambda: scrape(port, 'nriplugin_agent_gap_seconds_count{cause="crash"}') >= 1,
            30,
            f"no restarted agent:\n{log.read_text(errors='replace')[-2000:]}",
        )
        pod2 = rt.run_pod("be2", "BestEffort", BE)
        cid2 = rt.create_container(pod2, "main", cpu_shares=1024)
        assert read_cgroup(rt.container_cgroup(pod2, cid2), "cpu.shares") == "2"
    finally:
        # SIGTERM first: the bundle's outer process forwards it and removes its unpacked folder.
        left = [q for p in plugins if alive(p) for q in [p, *descendants(p)]]
        for p in plugins:
            if alive(p):
                os.kill(p, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while any(alive(q) for q in left) and time.monotonic() < deadline:
            time.sleep(0.05)
        for q in left:
            if alive(q):
                os.kill(q, signal.SIGKILL)
