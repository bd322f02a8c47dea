"""The agent's idle footprint on a node with real containers, next to the Go stub plugin's.

On the private containerd 1.7 with NRI: N containers (half BE with batch resources, half LS
with a quota) run; the agent is started against them (Synchronize), left to settle, then
measured over a window with nothing happening but its own safety nets (one reconciler pass
and one CRI inventory per ``--resync-seconds``): CPU (utime + stime from /proc) as a share
of one core, and resident memory (VmRSS, and VmHWM, the peak). The Go stub plugin
(``go-nri-refplugin``: one value per BE container, no reconciler) is measured the same way
on the same containers, one after the other.

``--beside koordlet`` measures nriplugin and Koordinator's koordlet v1.8.0 instead, side by
side on one host-process Kubernetes node (testkit/hostnode.py: a real kubelet on the private
containerd 2.4, etcd and kube-apiserver): N pods created through the API server (half BE, half
LS), then rounds in which each agent runs alone, started, settled and measured, the order
alternating round by round. Both have their QoS loops and cluster side on and read the same
NodeSLO (written directly: BE suppression on at 65 %, each agent's own default policy).

Usage (root): .venv/bin/python -m bench.footprint [--containers 200] [--window 60] [--write BENCHMARKS.md]
              .venv/bin/python -m bench.footprint --beside koordlet [--rounds 4] [--write BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.hook_latency import commit
from bench.report import replace_section, shown_command
from bench.rounds import interval
from testkit import containerd as harness
from testkit import koordlet
from testkit.go_peers import go_peer
from testkit.hostnode import HostNode, until
from testkit.plugin import free_port, scrape

BE = {"koordinator.sh/qosClass": "BE"}
LS = {"koordinator.sh/qosClass": "LS"}
BATCH = (
    '{"containers":{"main":{"requests":{"kubernetes.io/batch-cpu":"500","kubernetes.io/batch-memory":"256Mi"},'
    '"limits":{"kubernetes.io/batch-cpu":"1k","kubernetes.io/batch-memory":"512Mi"}}}}'
)
ROOT = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def populate(rt: harness.Containerd, n: int) -> None:
    def make(i: int) -> None:
        if i % 2 == 0:
            pod = rt.run_pod(f"be-{i}", "BestEffort", BE, {"node.koordinator.sh/extended-resource-spec": BATCH})
            rt.create_container(pod, "main", cpu_shares=2)
        else:
            pod = rt.run_pod(f"ls-{i}", "Burstable", LS)
            rt.create_container(pod, "main", cpu_shares=512, cpu_quota=100000)

    with ThreadPoolExecutor(8) as ex:
        list(ex.map(make, range(n)))


def measure(proc: subprocess.Popen[bytes], settle: float, window: float) -> dict[str, float]:
    time.sleep(settle)
    c0, t0 = cpu_seconds(proc.pid), time.monotonic()
    time.sleep(window)
    c1, t1 = cpu_seconds(proc.pid), time.monotonic()
    return {
        "cpu_percent": (c1 - c0) / (t1 - t0) * 100,
        "rss_mib": status_kib(proc.pid, "VmRSS") / 1024,
        "peak_rss_mib": status_kib(proc.pid, "VmHWM") / 1024,
    }


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run(rt: harness.Containerd, n: int, settle: float, window: float, resync: float) -> dict[str, Any]:
    populate(rt, n)
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
            "--resync-seconds",
            str(resync),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while scrape(port, "nriplugin_reconcile_entries") < n:
            if time.monotonic() > deadline:
                raise TimeoutError("the agent did not take in the containers")
            time.sleep(0.2)
        ours = measure(agent, settle, window)
        ours["entries"] = scrape(port, "nriplugin_reconcile_entries")
        ours["passes"] = scrape(port, "nriplugin_reconcile_passes_total")
    finally:
        stop(agent)
    peer = go_peer("go-nri-refplugin")
    go: dict[str, float] = {}
    if peer is not None:
        gop = subprocess.Popen(
            [str(peer), "-socket", rt.nri_socket], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            go = measure(gop, settle, window)
        finally:
            stop(gop)
    return {"containers": n, "window_s": window, "resync_s": resync, "nriplugin": ours, "go": go}


def write_section(path: Path, r: dict[str, Any], cmd: str) -> None:
    ours, go = r["nriplugin"], r["go"]

    def row(name: str, m: dict[str, float]) -> str:
        if not m:
            return f"| {name} | - | - | - |"
        return f"| {name} | {m['cpu_percent']:.2f} % | {m['rss_mib']:.1f} MiB | {m['peak_rss_mib']:.1f} MiB |"

    section = f"""<!-- footprint:begin -->
## Idle footprint with real containers (`bench/footprint.py`)

Command: `.venv/bin/python -m {cmd}` ({os.cpu_count()} CPUs, {time.strftime("%Y-%m-%d")}), on
the private containerd 1.7.24 with NRI: {r["containers"]} running containers (half BE with batch
resources, half LS with a quota); each plugin measured over {r["window_s"]:.0f} s after it settled,
with nothing happening but its own loops (nriplugin: the QoS manager's 1 s rounds and 30 ms
fast path (250 ms while BE idles), a reconciler pass and a CRI inventory every {r["resync_s"]:.0f} s;
{ours.get("entries", 0):.0f} managed cgroups, {ours.get("passes", 0):.0f} full passes so far).

| plugin | CPU (share of one core) | RSS | peak RSS |
|---|---|---|---|
{row("nriplugin (agent: hooks, reconciler, inventory, QoS manager, metrics)", ours)}
{row("Go stub (`go-nri-refplugin`: hooks only)", go)}

Targets: under 1 % of a core and under 80 MiB with 200 containers (issue "One node model"; with the
QoS manager on, its issue asks under 2 %). Before the QoS manager (same command, 2026-12-01):
0.08 % and 62 MiB; its rounds over 200 containers are what the rest costs.
<!-- footprint:end -->
"""
    replace_section(path, "footprint", section)


# -- beside koordlet, on a host-process node ---------------------------------------------------

# The NodeSLO both agents read: BE suppression on at koordlet's default threshold; the policy is
# each agent's own default (koordlet: cpuset, nriplugin: cfsQuota).
NODESLO = {"resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressThresholdPercent": 65}}
KOORDLET_GATES = "BECPUSuppress=true"


def host_pods(node: HostNode, n: int) -> list[dict[str, Any]]:
    """Half BE (Koordinator's label and batch annotation, BestEffort), half LS (Burstable: a
    small request the node's allocatable takes n of, a one-CPU limit)."""
    pods = []
    for i in range(n):
        if i % 2 == 0:
            pods.append(node.pod_manifest(f"be-{i}", BE, {"node.koordinator.sh/extended-resource-spec": BATCH}))
        else:
            res = {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"cpu": "1"}}
            pods.append(node.pod_manifest(f"ls-{i}", LS, resources=res))
    return pods


def nriplugin_on(
    node: HostNode, n: int, log: Path | None = None, extra: tuple[str, ...] = ()
) -> tuple[subprocess.Popen[bytes], int]:
    """nriplugin as the host node's agent (cluster side on: NodeSLO and NodeMetric), once it
    has taken in the node's containers; its log appended to ``log`` if given (else dropped),
    ``extra`` arguments after the rest (e.g. a policy file under the NodeSLO)."""
    assert node.runtime is not None
    port = free_port()
    argv = [sys.executable, "-m", "nriplugin", "run", "--socket", node.runtime.nri_socket]
    argv += ["--cri-socket", node.runtime.address, "--pods-root", node.pods_root]
    argv += ["--metrics-address", f"127.0.0.1:{port}", "--cluster", "on", "--kubeconfig", str(node.kubeconfig)]
    argv += ["--node-name", node.name, *extra]
    sink: Any = log.open("ab") if log is not None else subprocess.DEVNULL
    agent = subprocess.Popen(argv, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT)
    if log is not None:
        sink.close()
    try:
        until(lambda: scrape(port, "nriplugin_reconcile_entries") >= n, 120, "nriplugin took in the containers", 0.2)
    except BaseException:
        stop(agent)
        raise
    return agent, port


def stop_agent(proc: subprocess.Popen[bytes] | None, k: koordlet.Koordlet | None) -> None:
    """Whichever agent a trial started, stopped by its PID."""
    if proc is not None:
        stop(proc)
    if k is not None:
        k.stop()


def beside_main(
    prefix: str,
    run: Callable[[], dict[str, Any]],
    write: Callable[[Path, dict[str, Any], str, str], None],
    json_path: Path | None,
    write_path: Path | None,
) -> int:
    """A ``--beside koordlet`` run's end: the commit measured taken before it, the raw results
    printed (and saved to ``json_path``), the section written into ``write_path``."""
    head = commit()
    r = run()
    print(json.dumps(r))
    if json_path:
        json_path.write_text(json.dumps(r, indent=1))
    if write_path:
        write(write_path, r, shown_command(prefix, sys.argv[1:]), head)
    return 0


def beside_koordlet(n: int, rounds: int, settle: float, window: float) -> dict[str, Any]:
    binary = koordlet.build()
    node = HostNode(nodeslo_spec=NODESLO, max_pods=n + 20)
    out: dict[str, Any] = {"containers": n, "rounds": rounds, "settle_s": settle, "window_s": window}
    out["nriplugin"], out["koordlet"], out["order"] = [], [], []
    try:
        node.start()
        t0 = time.monotonic()
        names: list[str] = []
        for chunk in range(0, n, 50):
            names += node.create_pods(host_pods(node, n)[chunk : chunk + 50])
        node.wait_running(names, 900)
        out["pods_up_s"] = time.monotonic() - t0
        for r in range(rounds):
            order = ("nriplugin", "koordlet") if r % 2 == 0 else ("koordlet", "nriplugin")
            out["order"].append(order[0])
            for name in order:
                if name == "nriplugin":
                    agent, port = nriplugin_on(node, n)
                    try:
                        m = measure(agent, settle, window)
                        m["entries"] = scrape(port, "nriplugin_reconcile_entries")
                    finally:
                        stop(agent)
                else:
                    k = koordlet.Koordlet(binary, node, feature_gates=KOORDLET_GATES)
                    k.start()
                    try:
                        m = {"registered_s": k.wait_registered(120)}
                        assert k.proc is not None
                        m |= measure(k.proc, settle, window)
                    finally:
                        k.stop()
                out[name].append(m)
                print(f"round {r + 1}/{rounds} {name}: {m}", file=sys.stderr, flush=True)
    finally:
        node.stop()
    return out


def _median(xs: list[float]) -> float:
    ys = sorted(xs)
    mid = len(ys) // 2
    return ys[mid] if len(ys) % 2 else (ys[mid - 1] + ys[mid]) / 2


def ratio(r: dict[str, Any], key: str) -> tuple[float, float, float]:
    """koordlet / nriplugin on ``key``: the ratio of the medians over the rounds, and its 95 %
    bootstrap interval (the same rounds picked for both)."""
    ours, theirs = [m[key] for m in r["nriplugin"]], [m[key] for m in r["koordlet"]]

    def stat(picks: list[int]) -> float:
        return _median([theirs[i] for i in picks]) / max(_median([ours[i] for i in picks]), 1e-9)

    lo, hi = interval(len(ours), stat)
    return stat(list(range(len(ours)))), lo, hi


def write_beside_section(path: Path, r: dict[str, Any], cmd: str, head: str) -> None:
    rows = []
    for key, label, unit in (
        ("cpu_percent", "CPU (share of one core)", "%"),
        ("rss_mib", "RSS", "MiB"),
        ("peak_rss_mib", "peak RSS", "MiB"),
    ):
        ours = _median([m[key] for m in r["nriplugin"]])
        theirs = _median([m[key] for m in r["koordlet"]])
        x, lo, hi = ratio(r, key)
        rows.append(f"| {label} | {ours:.2f} {unit} | {theirs:.2f} {unit} | {x:.2f}x ({lo:.2f}..{hi:.2f}) |")
    per_round = " · ".join(
        f"{a['cpu_percent']:.2f} / {b['cpu_percent']:.2f} % ({o})"
        for o, a, b in zip(r["order"], r["nriplugin"], r["koordlet"], strict=True)
    )
    reg = _median([m["registered_s"] for m in r["koordlet"]])
    section = f"""<!-- footprint_koordlet:begin -->
## Idle footprint beside koordlet, same node (`bench/footprint.py --beside koordlet`)

Command: `flock -x /tmp/nriplugin-cpu.lock .venv/bin/python -m {cmd}` ({os.cpu_count()} CPUs,
{time.strftime("%Y-%m-%d")}), commit `{head}`. One host-process Kubernetes node
(`testkit/hostnode.py`: kubelet v1.35.4, cgroupfs driver, cgroup v1, on the private containerd
2.4.2 with NRI; etcd and kube-apiserver on loopback) with {r["containers"]} running pods created
through its API server (half BE with Koordinator's label and batch annotation, half LS with a
10m request and a one-CPU limit; all up in {r["pods_up_s"]:.0f} s). {r["rounds"]} rounds; in each,
nriplugin and koordlet run alone one after the other (first in the round alternating), each
started, settled {r["settle_s"]:.0f} s and measured over {r["window_s"]:.0f} s with nothing
happening but its own loops: CPU (utime + stime of its process) as a share of one core, RSS and
peak RSS at the end of the window. Medians over the rounds; the ratio is koordlet / nriplugin
with its 95 % bootstrap interval over rounds.

The same configuration for both: one NodeSLO (written directly, no koord-manager):
`resourceUsedThresholdWithBE: {{enable: true, cpuSuppressThresholdPercent: 65}}`, each agent's
default suppression policy (koordlet: cpuset; nriplugin: cfsQuota). nriplugin: `nriplugin run`
with its embedded default policy (QoS manager's 1 s rounds and 30 ms fast path (250 ms while BE idles), reconciler,
CRI inventory, metrics) and its cluster side on (`--cluster on`: NodeSLO watch, NodeMetric
report). koordlet v1.8.0 (`testkit/peers/koordlet.sh`, `testkit/koordlet.py`): host mode,
`-feature-gates={KOORDLET_GATES}` over its defaults, `-v=2`, its NRI plugin registered
(median {reg:.1f} s after its start), reading pods from the kubelet, NodeMetric report every
20 s (the NodeMetric's collect policy).

| | nriplugin | koordlet | koordlet / nriplugin |
|---|---|---|---|
{chr(10).join(rows)}

Per round, CPU nriplugin / koordlet (who went first): {per_round}.
<!-- footprint_koordlet:end -->
"""
    replace_section(path, "footprint_koordlet", section)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--beside", choices=["koordlet"], help="measure beside this peer on a host-process node")
    ap.add_argument("--rounds", type=int, default=4, help="with --beside: rounds, each agent once per round")
    ap.add_argument("--json", type=Path, help="also write the raw results here")
    ap.add_argument("--containers", type=int, default=200)
    ap.add_argument("--settle", type=float, default=10.0)
    ap.add_argument("--window", type=float, default=60.0)
    ap.add_argument("--resync-seconds", type=float, default=60.0)
    ap.add_argument("--write", type=Path)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root (containerd, cgroups)", file=sys.stderr)
        return 2
    if args.beside == "koordlet":
        return beside_main(
            "bench.footprint",
            lambda: beside_koordlet(args.containers, args.rounds, args.settle, args.window),
            write_beside_section,
            args.json,
            args.write,
        )
    rt = harness.Containerd(harness.install(), Path(tempfile.mkdtemp(prefix="nriplugin-bench-")))
    try:
        rt.start()
        rt.import_images()
        result = run(rt, args.containers, args.settle, args.window, args.resync_seconds)
    finally:
        rt.teardown()
    print(result)
    if args.write:
        write_section(args.write, result, shown_command("bench.footprint", sys.argv[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
