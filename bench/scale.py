"""The agent at node scale: 200 to 5000 pods with realistic annotations.

The runtime is `nri-runtime-scale` (testkit/peers: the official containerd/nri v0.6.1
adaptation library, the code containerd 1.7 runs): it hands N pods (one container each; LS,
BE with batch resources, LSR; each with a multi-KB kubectl.kubernetes.io/last-applied-
configuration) to the plugin at Synchronize — one message, over 4 MiB from about 1500 pods —,
then times CreateContainer calls (each followed by RemoveContainer and RemovePodSandbox, so the
node keeps its size). The agent runs as in production (hooks, reconciler, QoS manager, metrics;
no CRI here) on the host's real cgroup v1 tree: every pod and container has its cgroup
(cpu and memory hierarchies) under a private top directory, so the reconciler watches and
passes over real files.

Per size: Synchronize as the runtime times it (the answer) and the agent's take-in after it
(model, desired state, updates pushed); CreateContainer p50/p99 afterwards; the agent's RSS;
the reconciler's steady full pass (the one ``--resync-seconds`` after start, not the first,
which applies) and its inotify watches; a QoS round. The Go stub plugin (go-nri-refplugin) is
driven the same way for its Synchronize and hook figures, where it works (ttrpc's 4 MiB).

Usage (root, cgroup v1): .venv/bin/python -m bench.scale [--sizes 200,1000,2000,5000]
       [--note-bytes 3000] [--calls 2000] [--write BENCHMARKS.md] [--plot bench/scale.png]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.footprint import status_kib, stop
from bench.hook_latency import commit
from bench.report import replace_section, shown_command
from nriplugin.kernel.inotify import watches_of
from testkit.containerd import remove_cgroups
from testkit.go_peers import go_peer
from testkit.plugin import free_port

ROOT = Path(__file__).resolve().parent.parent
CGROUP = Path("/sys/fs/cgroup")
MUX_FRAME = 1 << 24  # containerd 1.7's NRI mux refuses to write a larger frame (EMSGSIZE)
POD_BYTES = 2700  # a pod and its container in Synchronize without the note (measured: 5.6 KB with 3 KB)


def note_for(n: int, note: int) -> int:
    """The note size that lets the runtime send Synchronize at all: containerd 1.7 writes it in
    one mux frame, at most 16 MiB; with 3 KB notes that is about 2,900 pods."""
    return max(0, min(note, int(MUX_FRAME * 0.95 / n) - POD_BYTES))


AGENT = [sys.executable, "-m", "nriplugin", "run"]


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[int((len(s) - 1) * p)] if s else float("nan")


def metrics(port: int) -> dict[str, float]:
    import urllib.request

    out = {}
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
    return out


def failures_by(m: dict[str, float]) -> dict[str, float]:
    """The agent's hook failures, ``event reason`` -> count (those that happened)."""
    out: dict[str, float] = {}
    for k, v in m.items():
        if k.startswith("nriplugin_hook_failures_total{") and v:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', k))
            name = f"{labels.get('event', '?')} {labels.get('reason', '?')}"
            out[name] = out.get(name, 0) + v
    return out


def errors_cell(o: dict[str, Any]) -> str:
    """The runtime's failed calls plus the agent's hook failures, the latter named."""
    total = f"{o['errors'] + o['hook_failures']:.0f}"
    named = ", ".join(f"{k}: {v:.0f}" for k, v in sorted(o.get("hook_failures_by", {}).items()))
    return f"{total} ({named})" if named else total


def build_tree(top: str, n: int) -> None:
    """The cgroups of the pods and containers the runtime peer names (same ids)."""
    for k in range(n):
        i = 100000 + k
        qos = ("LS", "BE", "LSR")[k % 3]
        uid = f"0000{i % 10000:04d}-aaaa-bbbb-cccc-{i:012d}"
        parent = f"{top}/kubepods/{'besteffort' if qos == 'BE' else 'burstable'}/pod{uid}"
        for c in ("cpu", "memory"):
            (CGROUP / c / parent / f"c{i:063d}").mkdir(parents=True, exist_ok=True)


def peer(bench: Path, sock: Path, n: int, calls: int, note: int, prefix: str, linger: str) -> subprocess.Popen[str]:
    argv = [str(bench), "-socket", str(sock), "-sync-pods", str(n), "-n", str(calls), "-note-bytes", str(note)]
    argv += ["-cgroup-prefix", prefix, "-linger", linger, "-wait", "60s", "-settle", "5s"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    deadline = time.monotonic() + 30
    while not sock.exists():
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise RuntimeError("nri-runtime-scale did not start listening")
        time.sleep(0.01)
    return proc


def run_ours(bench: Path, n: int, calls: int, note: int, resync: float) -> dict[str, Any]:
    top = f"nriplugin-scale-{os.getpid()}"
    t0 = time.monotonic()
    build_tree(top, n)
    mkdir_s = time.monotonic() - t0
    port = free_port()
    with tempfile.TemporaryDirectory() as d:
        sock, logf = Path(d) / "nri.sock", Path(d) / "agent.log"
        rt = peer(bench, sock, n, calls, note, f"/{top}", "600s")
        argv = [*AGENT, "--socket", str(sock), "--cri-socket", "", "--pods-root", f"{top}/kubepods"]
        argv += ["--metrics-address", f"127.0.0.1:{port}", "--resync-seconds", str(resync), "--log-format", "text"]
        with open(logf, "w") as log:
            agent = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log)
        started = time.monotonic()
        try:
            assert rt.stdout is not None
            line = rt.stdout.readline()
            result: dict[str, Any] = json.loads(line)
            # The steady pass: a periodic one (the pass right after Synchronize applies).
            m0 = m = metrics(port)
            while time.monotonic() < started + resync * 3:
                m = metrics(port)
                if m.get("nriplugin_reconcile_passes_total", 0) > max(1, m0.get("nriplugin_reconcile_passes_total", 0)):
                    break
                m0 = m if m.get("nriplugin_reconcile_passes_total", 0) < 1 else m0
                time.sleep(0.25)
            dn = m.get("nriplugin_reconcile_passes_total", 0) - m0.get("nriplugin_reconcile_passes_total", 0)
            ds = m.get("nriplugin_reconcile_pass_seconds_sum", 0) - m0.get("nriplugin_reconcile_pass_seconds_sum", 0)
            result["steady_pass_ms"] = ds / dn * 1e3 if dn > 0 else float("nan")
            result["rss_mib"] = status_kib(agent.pid, "VmRSS") / 1024
            result["peak_rss_mib"] = status_kib(agent.pid, "VmHWM") / 1024
            result["watches"] = watches_of(agent.pid)
            result["fds"] = len(os.listdir(f"/proc/{agent.pid}/fd"))
            result["entries"] = m.get("nriplugin_reconcile_entries", 0)
            result["passes"] = m.get("nriplugin_reconcile_passes_total", 0)
            result["qos_round_ms"] = m.get("nriplugin_qos_decision_latency_milliseconds_sum", 0) / max(
                1, m.get("nriplugin_qos_decision_latency_milliseconds_count", 0)
            )
            result["hook_failures_by"] = failures_by(m)
            result["hook_failures"] = sum(result["hook_failures_by"].values())
        finally:
            stop(agent)
            rt.kill()
            rt.wait()
            text = logf.read_text()
            t1 = time.monotonic()
            remove_cgroups(top)
            rmdir_s = time.monotonic() - t1
    took = re.search(r"updates (in the answer|pushed with UpdateContainers) \(taken in in (\d+) ms", text)
    result["take_in_ms"] = float(took.group(2)) if took else float("nan")
    result["take_in_answered"] = took is not None and took.group(1) == "in the answer"
    result["mkdir_s"], result["rmdir_s"] = mkdir_s, rmdir_s
    return result


def run_go(bench: Path, plugin: Path, n: int, calls: int, note: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        sock = Path(d) / "nri.sock"
        rt = peer(bench, sock, n, calls, note, "/go-scale", "0s")
        gop = subprocess.Popen(
            [str(plugin), "-socket", str(sock)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            out, _ = rt.communicate(timeout=300)
        finally:
            stop(gop)
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def plot(rows: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r["ours"].get("ready")]
    ns = [r["n"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
    ax = axes[0]
    answered = all(r["ours"].get("take_in_answered") for r in rows)  # the take-in ran before the answer
    label = "nriplugin: answer (take-in included)" if answered else "nriplugin: answer"
    ax.plot(ns, [r["ours"]["sync_ms"] for r in rows], "o-", label=label)
    if not answered:
        after = [r["ours"]["sync_ms"] + r["ours"]["take_in_ms"] for r in rows]
        ax.plot(ns, after, "o--", label="nriplugin: + take-in")
    go = [(r["n"], r["go"]["sync_ms"]) for r in rows if r["go"].get("ready")]
    if go:
        ax.plot([x for x, _ in go], [y for _, y in go], "s-", label="Go stub (fails > 4 MiB)")
    ax.axhline(2000, color="grey", ls=":", label="runtime deadline")
    ax.set_title("Synchronize (ms)")
    ax.set_xlabel("pods")
    ax.legend(fontsize=7)
    ax = axes[1]
    ax.plot(ns, [r["ours"]["p50_us"] for r in rows], "o-", label="nriplugin p50")
    ax.plot(ns, [r["ours"]["p99_us"] for r in rows], "o-", label="nriplugin p99")
    ax.set_title("CreateContainer round trip (µs)")
    ax.set_xlabel("pods")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)
    ax = axes[2]
    ax.plot(ns, [r["ours"]["rss_mib"] for r in rows], "o-", label="RSS (MiB)")
    ax.plot(ns, [r["ours"]["watches"] / 100 for r in rows], "o-", label="inotify watches / 100")
    ax.axhline(150, color="grey", ls=":", label="150 MiB target (2000 pods)")
    ax.set_title("agent RSS, watches")
    ax.set_xlabel("pods")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)
    for a in axes:
        a.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


HEADER = (
    "| pods | Synchronize message | Synchronize (take-in) | first CreateContainer | CreateContainer p50 / p99 "
    "| RSS | steady pass | inotify watches | QoS round | errors | Go stub |\n" + "|---" * 11 + "|"
)


def write_section(path: Path, rows: list[dict[str, Any]], cmd: str, png: str, note: int, measured: str) -> None:
    def go_cell(g: dict[str, Any]) -> str:
        if g.get("ready"):
            return f"{g['sync_ms']:.0f} ms, p99 {g['p99_us']:.0f} µs"
        err = str(g.get("sync_error", "")) or "no answer"
        return "fails: " + err[:60].replace("|", "/")

    def sync_cell(o: dict[str, Any]) -> str:
        if o.get("take_in_answered"):
            return f"{o['sync_ms']:.0f} ms ({o['take_in_ms']:.0f} ms of it)"
        return f"{o['sync_ms']:.0f} ms (+ {o['take_in_ms']:.0f} ms after)"

    def steady(o: dict[str, Any]) -> str:
        return f"{o['steady_pass_ms']:.0f} ms" if o["steady_pass_ms"] == o["steady_pass_ms"] else "-"

    lines = []
    for r in rows:
        o = r["ours"]
        if not o.get("ready"):
            lines.append(f"| {r['n']} | {o['sync_bytes'] / 2**20:.1f} MiB | fails: {o['sync_error']} |")
            continue
        lines.append(
            f"| {r['n']} ({r['note']} B note) | {o['sync_bytes'] / 2**20:.1f} MiB | "
            f"{sync_cell(o)} | "
            f"{o['first_create_us'] / 1e3:.0f} ms | {o['p50_us']:.0f} / {o['p99_us']:.0f} µs | "
            f"{o['rss_mib']:.1f} MiB | {steady(o)} | "
            f"{o['watches']} | {o['qos_round_ms']:.1f} ms | {errors_cell(o)} | "
            f"{go_cell(r['go'])} |"
        )
    ok = [r for r in rows if r["ours"].get("ready")]
    base = ok[0]["ours"]["p99_us"] if ok else float("nan")
    ratios = ", ".join(f"{r['n']}: {r['ours']['p99_us'] / base:.2f}" for r in ok[1:])
    section = f"""<!-- scale:begin -->
## Node scale: Synchronize, hooks, memory, reconciler (`bench/scale.py`)

Command: `.venv/bin/python -m {cmd}` ({os.cpu_count()} CPUs, {time.strftime("%Y-%m-%d")}),
commit `{measured}`. The runtime is
`nri-runtime-scale` (testkit/peers: the containerd/nri v0.6.1 adaptation library containerd 1.7
runs) with N pods of one container each (LS, BE with batch resources, LSR), every pod with a
{note}-byte `kubectl.kubernetes.io/last-applied-configuration`; Synchronize is one message, as
containerd 1.7 sends it. That message goes out in one mux frame, which containerd 1.7's NRI mux
limits to 16 MiB (it refuses a larger one: "message too long", whatever the plugin accepts): with
{note}-byte notes about 2,900 pods fit, so larger nodes are measured with the note shrunk to fit.
The agent runs as in production (hooks, reconciler, QoS manager,
metrics) on the host's real cgroup v1 tree (every pod and container has its cpu and memory
cgroup). CreateContainer: {rows[0]["ours"]["n"]} calls after Synchronize, each followed by
RemoveContainer and RemovePodSandbox (the node keeps its size), round trip as the runtime sees
it, after a 5 s pause for the agent to converge (hooks during convergence: see "first
CreateContainer"). The calls come back to back, so each container is removed while its
take-in still waits for the burst to end and is dropped from the queue: the node model never
takes these containers in. Synchronize: the runtime's call, and in brackets the agent's take-in (node
model, desired state, the containers' updates). On NRI v0.6.1 a plugin's UpdateContainers can
deadlock the runtime (containerd#13733), so the agent takes the node in before it answers and
the answer carries the updates: the call includes the take-in. (Where UpdateContainers is safe,
NRI v0.12.1 and later, the answer goes at once and the take-in follows it.) First
CreateContainer: the first call right after Synchronize (it waits for the reconciler's first
pass).
Steady pass: the reconciler's periodic full pass (read and compare every managed file).
Errors: the runtime's failed calls plus the agent's hook failures (`nriplugin_hook_failures_total`,
failed, late or over budget, named by event and reason).
Go stub: `go-nri-refplugin` on the same runtime and pods.

{HEADER}
{chr(10).join(lines)}

CreateContainer p99 relative to {rows[0]["n"]} pods: {ratios}. Targets: Synchronize of
2000 well within the runtime's 2 s; CreateContainer p99 within 10 % of the 200-pod figure; RSS
with 2000 containers under 150 MiB. The Go stub cannot take a Synchronize over ttrpc's 4 MiB
(its ttrpc discards the message and never answers: the runtime's "context deadline exceeded").
The QoS round column is the QoS manager's once-a-second round (the collector reads every
container's counters in 0.25 ms turns, between which hooks are answered); the reconciler's work
runs in such turns too.
`nriplugin doctor` shows the node's inotify headroom (watches in use against
`fs.inotify.max_user_watches`, and who holds them).

![scale]({png})
<!-- scale:end -->
"""
    replace_section(path, "scale", section)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="200,1000,2000,5000")
    ap.add_argument("--note-bytes", type=int, default=3000)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--resync-seconds", type=float, default=20.0)
    ap.add_argument("--no-go", action="store_true")
    ap.add_argument("--write", type=Path)
    ap.add_argument("--plot", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    measured = commit()  # before the run: what is measured is the code as it starts
    if os.geteuid() != 0 or not (CGROUP / "cpu" / "cpu.shares").exists():
        print("needs root and cgroup v1", file=sys.stderr)
        return 2
    bench = go_peer("nri-runtime-scale")
    goplugin = go_peer("go-nri-refplugin")
    if bench is None or goplugin is None:
        print("Go peers unavailable (need Go at /usr/local/go/bin/go, or set GO)", file=sys.stderr)
        return 2
    rows = []
    for n in [int(x) for x in args.sizes.split(",")]:
        note = note_for(n, args.note_bytes)
        ours = run_ours(bench, n, args.calls, note, args.resync_seconds)
        go = {} if args.no_go else run_go(bench, goplugin, n, args.calls, note)
        rows.append({"n": n, "note": note, "ours": ours, "go": go})
        print(json.dumps(rows[-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows))
    if args.plot:
        plot(rows, args.plot)
    if args.write:
        png = os.path.relpath(args.plot, args.write.parent) if args.plot else "scale.png"
        write_section(args.write, rows, shown_command("bench.scale", sys.argv[1:]), png, args.note_bytes, measured)
    return 0


if __name__ == "__main__":
    sys.exit(main())
