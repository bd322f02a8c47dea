"""Time without an agent on the private containerd 1.7.24, in two situations:

- handover: agent A serves, agent B stands by (runtime lock held by A); SIGTERM to A.
  Figures: the gap B reports (A's NRI connection closed -> B registered and synchronized:
  no agent answers hooks in between), SIGTERM -> B ready as seen from outside (polling
  B's /readyz every 2 ms), and SIGTERM -> A exited.
- crash: a pre-registered launcher (supervisor + agent, started by containerd); SIGKILL to
  the agent. Figures: the gap the restarted agent reports (the supervisor saw the death ->
  restarted agent registered and synchronized on the runtime's socket) and SIGKILL -> a
  restarted agent ready as seen from outside. Each round starts a fresh containerd, so every
  crash is a first crash (repeated crashes back off: 0.5 s, doubling to 10 s).

Usage (root): .venv/bin/python -m bench.handover [--rounds 10] [--write BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from functools import partial
from pathlib import Path

from bench.report import replace_section
from nriplugin.cli.main import install
from testkit import containerd as harness
from testkit.plugin import PluginProcess, free_port, runtime_args, scrape


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
            body: bytes = r.read()
            return r.status == 200 and body.startswith(b"ready")
    except (urllib.error.URLError, OSError):
        return False


def standby(p: PluginProcess) -> bool:
    return p.get("/readyz")[1].startswith("standby:")


def handed_over(p: PluginProcess) -> bool:
    return p.metric('nriplugin_agent_gap_seconds_count{cause="handover"}') == 1


def until(cond: Callable[[], object], timeout: float = 30.0, step: float = 0.002) -> float:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise TimeoutError("timed out")
        time.sleep(step)
    return time.monotonic()


def handovers(rt: harness.Containerd, rounds: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"gap": [], "sigterm_to_ready": [], "sigterm_to_exit": []}
    a = PluginProcess(rt.nri_socket, *runtime_args(rt))
    a.wait_ready()
    made = [a]
    try:
        for _ in range(rounds):
            b = PluginProcess(rt.nri_socket, *runtime_args(rt))
            made.append(b)
            until(partial(standby, b))
            t0 = time.monotonic()
            a.proc.send_signal(signal.SIGTERM)
            t_ready = until(partial(ready, b.port))
            a.proc.wait(10)
            t_exit = time.monotonic()
            until(partial(handed_over, b))
            out["gap"].append(b.metric('nriplugin_agent_gap_seconds_sum{cause="handover"}'))
            out["sigterm_to_ready"].append(t_ready - t0)
            out["sigterm_to_exit"].append(t_exit - t0)
            a.stop()
            a = b
    finally:
        for p in made:
            p.stop()
    return out


def children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for c in (task / "children").read_text().split():
            try:
                if b"nriplugin" in Path(f"/proc/{c}/cmdline").read_bytes():
                    out.append(int(c))
            except FileNotFoundError:
                pass
    return out


def crash_once(pkg: Path) -> tuple[float, float]:
    """(reported gap, SIGKILL -> restarted agent ready) on a fresh containerd."""
    rt = harness.Containerd(pkg, Path(tempfile.mkdtemp(prefix="nriplugin-bench-")))
    port = free_port()
    args = ["--socket", rt.nri_socket, "--metrics-address", f"127.0.0.1:{port}", *runtime_args(rt)]
    rt.write_config()
    install(str(rt.plugin_dir), "nriplugin", "10", args)
    tree: list[int] = []
    try:
        rt.start()
        assert rt.proc is not None
        (sup,) = children(rt.proc.pid)
        (agent,) = children(sup)
        tree = [sup, agent]
        until(partial(ready, port))
        t0 = time.monotonic()
        os.kill(agent, signal.SIGKILL)
        until(lambda: not ready(port))
        t_ready = until(partial(ready, port))
        tree += children(sup)
        return scrape(port, 'nriplugin_agent_gap_seconds_sum{cause="crash"}'), t_ready - t0
    finally:
        for pid in tree:  # the supervisor forwards SIGTERM to a live agent
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        time.sleep(0.5)
        rt.teardown()


def crashes(pkg: Path, rounds: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"gap": [], "sigkill_to_ready": []}
    for _ in range(rounds):
        gap, seen = crash_once(pkg)
        out["gap"].append(gap)
        out["sigkill_to_ready"].append(seen)
    return out


def fmt(v: list[float]) -> str:
    return f"{statistics.median(v) * 1000:.0f} ms (min {min(v) * 1000:.0f}, max {max(v) * 1000:.0f})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--write", type=Path)
    ns = ap.parse_args()
    pkg = harness.install()
    rt = harness.Containerd(pkg, Path(tempfile.mkdtemp(prefix="nriplugin-bench-")))
    try:
        rt.start()
        h = handovers(rt, ns.rounds)
    finally:
        rt.teardown()
    c = crashes(pkg, ns.rounds)
    load = os.getloadavg()[0]
    section = f"""<!-- handover:begin -->
## Handover and crash restart (`bench/handover.py`)

`.venv/bin/python -m bench.handover --rounds {ns.rounds} --write BENCHMARKS.md` on the private
containerd 1.7.24 ({os.cpu_count()} CPUs, load {load:.1f}; median, min, max over {ns.rounds} rounds).

| situation | figure | value |
|---|---|---|
| handover: SIGTERM to the serving agent, the next one standing by | gap without an agent ¹ | {fmt(h["gap"])} |
| | SIGTERM -> new agent ready (`/readyz` polled every 2 ms) | {fmt(h["sigterm_to_ready"])} |
| | SIGTERM -> old agent exited | {fmt(h["sigterm_to_exit"])} |
| crash: SIGKILL to a pre-registered agent, its supervisor restarts it | gap without an agent ¹ | {fmt(c["gap"])} |
| | SIGKILL -> restarted agent ready | {fmt(c["sigkill_to_ready"])} |

¹ `nriplugin_agent_gap_seconds`, reported by the agent that took over: from the old agent's
NRI connection closing (handover) or its death (crash) to the new one registered and synchronized.

The handover gap is the time containerd has no agent to route hooks to; a pod created in it
is born with the runtime's defaults and converged by the new agent's Synchronize (checked in
`e2e/test_handover.py`). The crash gap is dominated by starting a Python process and loading
the plugin; a DaemonSet pod restarted by kubelet adds kubelet's own restart delay.
<!-- handover:end -->
"""
    print(section)
    if ns.write:
        replace_section(ns.write, "handover", section)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
