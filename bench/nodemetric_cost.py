"""What the NodeMetric report costs the agent: CPU and RSS with N running containers, report on
against off, alternating round by round on the same containers.

On the private containerd 1.7 with NRI, N containers (half BE with batch resources, half LS with
a quota, as ``bench/footprint.py``) run, and the stand-in API server (``tests/kube_standin.py``)
serves the node's pods, its NodeMetric (reporting at the interval floor, 30 s, over koordlet's
default 300 s window) and status patches. Each round starts the agent with the cluster side on
and ``--nodemetric on`` or ``off``, waits until it manages every container, lets it settle, and
measures its CPU (utime + stime) over the window, its RSS and peak RSS; the reports it patched
in the window are counted, and the last one's size.

Usage (root):
.venv/bin/python -m bench.nodemetric_cost [--containers 200] [--rounds 3] [--window 60] [--write BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.footprint import ROOT, measure, populate, stop
from bench.report import replace_section, shown_command
from testkit import containerd as harness
from testkit.plugin import free_port, scrape
from tests.kube_standin import KubeStandIn
from tests.test_cluster import kubeconfig

NODE = "node-1"
INTERVAL = 30  # the reporter's floor (koordlet's too): the most reports a window holds


def on_loop(loop: asyncio.AbstractEventLoop, fn: Callable[..., object], *args: Any, **kw: Any) -> None:
    """The stand-in's methods run on its own loop."""

    async def call() -> None:
        fn(*args, **kw)

    asyncio.run_coroutine_threadsafe(call(), loop).result(30)


@contextmanager
def standin(tmp: Path) -> Iterator[tuple[KubeStandIn, str, asyncio.AbstractEventLoop]]:
    """The stand-in API server on a loop of its own thread."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    s = KubeStandIn()
    asyncio.run_coroutine_threadsafe(s.start(), loop).result(30)
    try:
        yield s, kubeconfig(tmp, s), loop
    finally:
        asyncio.run_coroutine_threadsafe(s.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def one_round(
    rt: harness.Containerd, s: KubeStandIn, config: str, n: int, report: bool, settle: float, window: float
) -> dict[str, float]:
    port = free_port()
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "nriplugin",
            "run",
            "--socket",
            rt.nri_socket,
            "--cri-socket",
            rt.address,
            "--pods-root",
            f"{rt.cgroup_root}/kubepods",
            "--metrics-address",
            f"127.0.0.1:{port}",
            "--kubeconfig",
            config,
            "--node-name",
            NODE,
            "--nodemetric",
            "on" if report else "off",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 90
        while scrape(port, "nriplugin_reconcile_entries") < n:
            if time.monotonic() > deadline:
                raise TimeoutError("the agent did not take in the containers")
            time.sleep(0.2)
        before = len(s.status_patches)
        m = measure(agent, settle, window)
        patches = s.status_patches[before:]
        m["reports"] = float(len(patches))
        m["report_bytes"] = float(len(json.dumps(patches[-1][1]))) if patches else 0.0
    finally:
        stop(agent)
    return m


def run(rt: harness.Containerd, n: int, rounds: int, settle: float, window: float) -> dict[str, Any]:
    populate(rt, n)
    out: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory(prefix="nriplugin-nm-") as tmp, standin(Path(tmp)) as (s, config, loop):
        for i in range(n):  # the node's pods as the API server lists them
            name, prio = (f"be-{i}", 5000) if i % 2 == 0 else (f"ls-{i}", 9000)
            on_loop(loop, s.add_pod, "bench", name, NODE, priority=prio)
        on_loop(loop, s.put_nodemetric, NODE, {"metricCollectPolicy": {"reportIntervalSeconds": INTERVAL}})
        for r in range(rounds):
            for report in (False, True) if r % 2 == 0 else (True, False):
                m = one_round(rt, s, config, n, report, settle, window)
                out["on" if report else "off"].append(m)
                print(f"round {r + 1}/{rounds}, report {'on' if report else 'off'}: {m}", flush=True)
    return {"containers": n, "rounds": rounds, "window_s": window, "settle_s": settle, **out}


def summary(ms: list[dict[str, float]], key: str) -> tuple[float, float, float]:
    vals = [m[key] for m in ms]
    return statistics.median(vals), min(vals), max(vals)


def write_section(path: Path, r: dict[str, Any], cmd: str, commit: str) -> None:
    def cell(which: str, key: str, unit: str, fmt: str = ".2f") -> str:
        med, lo, hi = summary(r[which], key)
        return f"{med:{fmt}}{unit} ({lo:{fmt}}..{hi:{fmt}})"

    def row(which: str) -> str:
        cpu, rss = cell(which, "cpu_percent", " %"), cell(which, "rss_mib", " MiB", ".1f")
        return f"| {which} | {cpu} | {rss} | {cell(which, 'peak_rss_mib', ' MiB', '.1f')} |"

    on_cpu, off_cpu = summary(r["on"], "cpu_percent")[0], summary(r["off"], "cpu_percent")[0]
    on_rss, off_rss = summary(r["on"], "rss_mib")[0], summary(r["off"], "rss_mib")[0]
    reports = summary(r["on"], "reports")[0]
    size = summary(r["on"], "report_bytes")[0]
    section = f"""<!-- nodemetric_cost:begin -->
## What the NodeMetric report costs (`bench/nodemetric_cost.py`)

Command: `.venv/bin/python -m {cmd}` ({os.cpu_count()} CPUs, {time.strftime("%Y-%m-%d")}), commit
`{commit}`, on the private containerd 1.7 with NRI: {r["containers"]} running containers (half
BE with batch resources, half LS with a quota), the stand-in API server serving their pods, the
node's NodeMetric (reporting every {INTERVAL} s, the floor, over the default 300 s window) and the
status patches. The agent with the cluster side on, `--nodemetric off` and `on` alternating,
{r["rounds"]} rounds each; each measured over {r["window_s"]:.0f} s after {r["settle_s"]:.0f} s
settling. Median (min..max) over the rounds.

| `--nodemetric` | CPU (share of one core) | RSS | peak RSS | reports in the window | report size |
|---|---|---|---|---|---|
{row("off")} - | - |
{row("on")} {reports:.0f} | {size / 1024:.1f} KiB |

The report costs {on_cpu - off_cpu:+.2f} points of a core and {on_rss - off_rss:+.1f} MiB
(medians, on less off): the QoS manager's rounds keep what they measured (node series, ten
buckets a pod) and the report is built and patched once an interval.
<!-- nodemetric_cost:end -->
"""
    replace_section(path, "nodemetric_cost", section)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--containers", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--settle", type=float, default=10.0)
    ap.add_argument("--window", type=float, default=60.0)
    ap.add_argument("--write", type=Path)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root (containerd, cgroups)", file=sys.stderr)
        return 2
    git = ["git", "rev-parse", "--short", "HEAD"]
    commit = subprocess.run(git, cwd=ROOT, capture_output=True, text=True).stdout.strip()
    rt = harness.Containerd(harness.install(), Path(tempfile.mkdtemp(prefix="nriplugin-bench-")))
    try:
        rt.start()
        rt.import_images()
        result = run(rt, args.containers, args.rounds, args.settle, args.window)
    finally:
        rt.teardown()
    print(result)
    if args.write:
        write_section(args.write, result, shown_command("bench.nodemetric_cost", sys.argv[1:]), commit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
