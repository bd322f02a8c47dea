"""One agent per runtime, on the private containerd (every runtime line): a second agent stands by and takes
over on SIGTERM; a pre-registered launcher and a socket-mode agent share a runtime; a killed
pre-registered agent is restarted; start-up errors stop the agent before it registers."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nriplugin.agent.lock import lock_path, read_holder
from nriplugin.cli.main import install
from testkit.containerd import Containerd, Runtime, read_cgroup
from testkit.plugin import ROOT, PluginProcess, alive, children, free_port, runtime_args, scrape

BE = {"koordinator.sh/qosClass": "BE"}


def shares(rt: Containerd, pod: Any, cid: str) -> int:
    return int(read_cgroup(rt.container_cgroup(pod, cid), "cpu.shares"))


def containerd_log(rt: Containerd) -> str:
    return (rt.base / "logs" / "containerd.log").read_text(errors="replace")


def registrations(rt: Containerd) -> int:
    """containerd's "plugin ... registered as ..." lines (logrus escapes the quotes)."""
    return sum("registered as" in ln for ln in containerd_log(rt).splitlines())


def wait_for(cond: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def be_pod(rt: Containerd, name: str) -> tuple[Any, str]:
    pod = rt.run_pod(name, "BestEffort", BE)
    return pod, rt.create_container(pod, "main", cpu_shares=1024)


def standing_by(p: PluginProcess) -> bool:
    code, body = p.get("/readyz")
    return code == 200 and body.startswith("standby:")


def test_second_agent_stands_by_and_takes_over_on_sigterm(
    runtime: Containerd, plugin_factory: Callable[..., PluginProcess]
) -> None:
    first = plugin_factory(runtime)
    second = plugin_factory(runtime, wait=False)
    wait_for(lambda: standing_by(second), 20, "the second agent to stand by")
    assert second.metric('nriplugin_connection_state{state="standby"}') == 1
    assert second.metric("nriplugin_registrations_total") == 0
    assert second.get("/healthz")[0] == 200
    said = [ln for ln in second.logs().splitlines() if "holds the runtime" in ln]
    assert len(said) == 1 and f"pid {first.proc.pid}" in said[0], said
    holder = read_holder(lock_path(runtime.nri_socket))
    assert holder is not None and holder.pid == first.proc.pid and holder.mode == "socket"
    argv = ["doctor", "--format", "json", "--socket", runtime.nri_socket, "--agent", f"127.0.0.1:{second.port}"]
    doc = subprocess.run(
        [sys.executable, "-m", "nriplugin", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    report = json.loads(doc.stdout)
    assert report["agent"]["connection"] == "standby"
    assert report["nri"]["lock"]["holder"]["pid"] == first.proc.pid

    # Both running: BE pods are adjusted exactly as with one agent.
    made = [be_pod(runtime, f"both-{i}") for i in range(3)]
    assert [shares(runtime, p, c) for p, c in made] == [2, 2, 2]
    assert "both tried to set" not in containerd_log(runtime)
    assert registrations(runtime) == 1

    first.proc.send_signal(signal.SIGTERM)
    assert first.proc.wait(10) == 0
    assert [shares(runtime, p, c) for p, c in made] == [2, 2, 2]  # nothing reset on the way out
    second.wait_ready()
    gap = second.metric('nriplugin_agent_gap_seconds_sum{cause="handover"}')
    assert second.metric('nriplugin_agent_gap_seconds_count{cause="handover"}') == 1
    print(f"handover gap reported by the new agent: {gap * 1000:.1f} ms")
    pod, cid = be_pod(runtime, "after")
    assert shares(runtime, pod, cid) == 2

    # A pod created while no agent answers (the next one is held stopped meanwhile) is
    # converged once that agent takes over (Synchronize).
    third = plugin_factory(runtime, wait=False)
    wait_for(lambda: standing_by(third), 20, "the third agent to stand by")
    os.kill(third.proc.pid, signal.SIGSTOP)
    try:
        second.proc.send_signal(signal.SIGTERM)
        assert second.proc.wait(10) == 0
        gap_pod, gap_cid = be_pod(runtime, "in-the-gap")
        assert shares(runtime, gap_pod, gap_cid) == 1024  # born with no agent
    finally:
        os.kill(third.proc.pid, signal.SIGCONT)
    third.wait_ready()
    wait_for(lambda: shares(runtime, gap_pod, gap_cid) == 2, 10, "the gap's pod to converge")
    assert "both tried to set" not in containerd_log(runtime)


def _end(pids: list[int]) -> None:
    """Stop what the test started outside the fixtures (supervised agents), by pid."""
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def _launcher(rt: Containerd, port: int, tmp: Path) -> Path:
    log = tmp / "launcher.log"
    args = ["--socket", rt.nri_socket, "--metrics-address", f"127.0.0.1:{port}", *runtime_args(rt)]
    install(str(rt.plugin_dir), "nriplugin", "10", args, log_file=str(log))
    return log


def _supervised(rt: Containerd) -> tuple[int, int]:
    """(supervisor, agent): containerd's child and its child."""
    assert rt.proc is not None
    (sup,) = children(rt.proc.pid)
    (agent,) = children(sup)
    return sup, agent


def test_preregistered_launcher_and_socket_agent_share_a_runtime(
    runtime_factory: Callable[..., Containerd], plugin_factory: Callable[..., PluginProcess], tmp_path: Path
) -> None:
    rt = runtime_factory(start=False)
    port = free_port()
    log = _launcher(rt, port, tmp_path)
    rt.start()
    rt.import_images()
    pids = list(_supervised(rt))
    try:
        # The launcher's agent serves; the DaemonSet-like agent stands by.
        agent = plugin_factory(rt, wait=False)
        wait_for(lambda: standing_by(agent), 20, "the socket agent to stand by")
        pod, cid = be_pod(rt, "launcher-serves")
        assert shares(rt, pod, cid) == 2
        # containerd restarts: the launcher's agent goes with the connection, the socket agent
        # takes the runtime, and the fresh launcher registers inert (standby) -- pods still start.
        rt.stop()
        wait_for(lambda: not standing_by(agent), 10, "the socket agent to take the runtime")
        rt.start()
        agent.wait_ready()
        pids += list(_supervised(rt))
        wait_for(lambda: scrape(port, 'nriplugin_connection_state{state="standby"}') == 1, 20, "launcher standby")
        assert registrations(rt) == 3  # before the restart one; after it the standby over its fd and the agent
        pod, cid = be_pod(rt, "agent-serves")
        assert shares(rt, pod, cid) == 2
        # The socket agent leaves (a rolling update without a successor): the launcher's agent
        # takes over on the socket and adjusts new pods.
        agent.proc.send_signal(signal.SIGTERM)
        assert agent.proc.wait(10) == 0
        wait_for(lambda: scrape(port, 'nriplugin_connection_state{state="registered"}') == 1, 20, "launcher takeover")
        pod, cid = be_pod(rt, "launcher-again")
        assert shares(rt, pod, cid) == 2
        assert scrape(port, 'nriplugin_agent_gap_seconds_count{cause="handover"}') == 1
        assert "both tried to set" not in containerd_log(rt)
    finally:
        _end(pids + [p for p in _descendants(pids) if p not in pids])
        if log.exists():
            print(log.read_text()[-3000:])


def _descendants(pids: list[int]) -> list[int]:
    out: list[int] = []
    for p in pids:
        if alive(p):
            out += children(p)
    return out


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _holder(rt: Containerd) -> int:
    """The pid of the agent that holds the runtime now (0: none)."""
    holder = read_holder(lock_path(rt.nri_socket))
    return holder.pid if holder is not None and alive(holder.pid) else 0


def _adjusted_again(rt: Containerd, tag: str) -> list[tuple[Any, str]]:
    """Make BE pods until one is adjusted (an agent serves again); all of them."""
    t0 = time.monotonic()
    made: list[tuple[Any, str]] = []
    while True:
        pod, cid = be_pod(rt, f"{tag}-{len(made)}")
        made.append((pod, cid))
        if shares(rt, pod, cid) == 2:
            print(f"{tag}: a new BE pod was adjusted again {time.monotonic() - t0:.2f} s after SIGKILL")
            return made
        assert time.monotonic() - t0 < 10, f"{tag}: no agent adjusted new BE pods within 10 s"
        time.sleep(0.1)


def test_killed_preregistered_agent_is_restarted(
    runtime_factory: Callable[..., Containerd], runtime_line: Runtime, tmp_path: Path
) -> None:
    """The launched supervisor hands a crashed agent's restart to a successor supervisor.
    containerd 2.x kills the launched process once its plugin's connection closed (1.7 leaves
    it): the successor and the restarted agent live on either way, and a second crash is
    restarted too. (The runtime's processes are in its cgroup: teardown kills them by pid.)"""
    rt = runtime_factory(start=False)
    port = free_port()
    log = _launcher(rt, port, tmp_path)
    rt.start()
    rt.import_images()
    sup, agent = _supervised(rt)
    pod, cid = be_pod(rt, "before")
    assert shares(rt, pod, cid) == 2
    os.kill(agent, signal.SIGKILL)
    made = _adjusted_again(rt, "first crash")
    # Pods born while no agent ran converge too (Synchronize of the restarted agent).
    wait_for(lambda: all(shares(rt, p, c) == 2 for p, c in made), 10, "the gap's pods to converge")
    assert scrape(port, 'nriplugin_agent_gap_seconds_count{cause="crash"}') == 1
    gap = scrape(port, 'nriplugin_agent_gap_seconds_sum{cause="crash"}')
    print(f"time without an agent, reported by the restarted agent: {gap:.2f} s")
    assert 0 < gap < 10
    text = log.read_text()
    assert "was killed by SIGKILL" in text
    # The restarted agent's Synchronize gave the gap's pods their values; on a runtime whose NRI
    # can deadlock on a plugin's UpdateContainers (1.7, 2.1: containerd#13733) in its answer.
    how = "pushed with UpdateContainers" if runtime_line.safe_plugin_updates else "in the answer"
    assert re.search(rf"synchronized \d+ pods, \d+ containers, [1-9]\d* updates {how}", text), text[-3000:]
    restarted = _holder(rt)
    assert restarted not in (0, agent)
    successor = _parent(restarted)
    assert successor != sup and "supervise" in Path(f"/proc/{successor}/cmdline").read_text()
    if runtime_line.kills_closed_plugins:
        wait_for(lambda: not alive(sup), 10, "containerd 2.x to kill the launched supervisor")
    else:
        assert alive(sup) and _parent(successor) == sup  # containerd 1.7 leaves its plugin be
    # A second crash: the successor restarts the agent again.
    os.kill(restarted, signal.SIGKILL)
    _adjusted_again(rt, "second crash")
    wait_for(lambda: _holder(rt) not in (0, restarted), 10, "a third agent to hold the runtime")
    assert _parent(_holder(rt)) == successor
    assert set(rt.processes()) >= {successor, _holder(rt)}


def test_startup_errors_are_one_line_before_registering(runtime: Containerd, tmp_path: Path) -> None:
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    taken = busy.getsockname()[1]
    not_a_socket = runtime.base / "config.toml"
    cases = {
        "metrics address in use": (["--metrics-address", f"127.0.0.1:{taken}"], "--metrics-address", "in use"),
        "socket directory missing": (["--socket", str(tmp_path / "no" / "nri.sock")], "--socket", "does not exist"),
        "socket path not a socket": (["--socket", str(not_a_socket)], "--socket", "not a socket"),
        "policy unreadable": (["--policy", str(tmp_path / "none.yaml")], "--policy", "cannot read"),
        "cgroup root missing": (["--cgroup-root", str(tmp_path / "cgroup")], "--cgroup-root", "does not exist"),
    }
    try:
        for case, (extra, option, problem) in cases.items():
            argv = ["run", "--socket", runtime.nri_socket, *runtime_args(runtime), "--log-format", "text"]
            argv += ["--metrics-address", f"127.0.0.1:{free_port()}", *extra]
            r = subprocess.run(
                [sys.executable, "-m", "nriplugin", *argv],
                capture_output=True,
                text=True,
                timeout=60,
                cwd=ROOT,
            )
            lines = r.stderr.splitlines()
            print(f"{case}: exit {r.returncode}: {r.stderr.strip()}")
            assert r.returncode == 2, (case, r.stderr)
            assert len(lines) == 1 and option in lines[0] and problem in lines[0], (case, r.stderr)
            assert "Traceback" not in r.stderr
        assert registrations(runtime) == 0
        assert not lock_path(runtime.nri_socket).exists() or read_holder(lock_path(runtime.nri_socket)) is None
    finally:
        busy.close()
