"""Hook latency: nriplugin against the official Go NRI stub plugin, as the runtime sees it.

Both plugins are driven by `nri-runtime-bench` (shared/peers: the runtime side on the
containerd/nri v0.6.1 adaptation library containerd 1.7 runs), alternately, for several
rounds in one run, so machine noise hits both alike. Reported: CreateContainer round trip
p50/p99 per plugin, Synchronize of 300 pods, the ratios nriplugin / Go, and nriplugin's
plugin-side handling time (bytes in -> response written, measured inside the process).

With --containerd (root, the e2e harness's private containerd 1.7): CRI CreateContainer
latency with no plugin, the Go plugin and nriplugin, alternating; and pre-registered
"process start -> registered" for both plugins. --plot draws the distributions to a PNG.

Usage: .venv/bin/python -m bench.hook_latency [--rounds 4] [--calls 3000] [--sync-pods 300]
       [--containerd] [--write BENCHMARKS.md] [--plot bench/hook_latency.png]
(--plot needs the bench extra: pip install -e '.[bench]')
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
import time
from pathlib import Path
from typing import Any

from bench.report import replace_section
from tests.go_peers import go_peer

ROOT = Path(__file__).resolve().parent.parent


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[int((len(s) - 1) * p)] if s else float("nan")


def runtime_bench(bench: Path, sock: Path, calls: int, sync_pods: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [str(bench), "-socket", str(sock), "-n", str(calls), "-sync-pods", str(sync_pods), "-wait", "30s"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    deadline = time.monotonic() + 10
    while not sock.exists():
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("nri-runtime-bench did not start listening")
        time.sleep(0.005)
    return proc


def run_external(bench: Path, plugin_cmd: list[str], calls: int, sync_pods: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        sock = Path(d) / "nri.sock"
        rt = runtime_bench(bench, sock, calls, sync_pods)
        plugin = subprocess.Popen(
            [*plugin_cmd, "-socket" if "go-nri" in plugin_cmd[0] else "--socket", str(sock)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            out, _ = rt.communicate(timeout=300)
        finally:
            plugin.kill()
            plugin.wait()
        return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def run_inprocess(bench: Path, calls: int, sync_pods: int) -> tuple[dict[str, Any], list[float]]:
    """nriplugin in this process, timing each data_received that answered a request."""
    from nriplugin.nri import transport
    from nriplugin.nri.stub import Stub, StubOptions
    from nriplugin.plugin import QoSPlugin

    handled: list[float] = []
    original = transport.Trunk.data_received

    def timed(self: transport.Trunk, data: bytes) -> None:
        t0 = time.perf_counter_ns()
        original(self, data)
        handled.append((time.perf_counter_ns() - t0) / 1000)

    took: list[float] = []  # the model taking in Synchronize's containers (after the answer)
    take_in = QoSPlugin._take_in

    def timed_take_in(self: QoSPlugin, pods: Any, ctrs: Any) -> Any:
        t0 = time.perf_counter_ns()
        out = take_in(self, pods, ctrs)
        took.append((time.perf_counter_ns() - t0) / 1e6)
        return out

    async def main(sock: Path) -> dict[str, Any]:
        transport.Trunk.data_received = timed  # type: ignore[method-assign]
        QoSPlugin._take_in = timed_take_in  # type: ignore[method-assign,assignment]
        plugin = QoSPlugin()
        stub = Stub(plugin, StubOptions(socket_path=str(sock), backoff_initial=0.01))
        plugin.push = stub.update_containers  # as the agent has it: updates pushed after the answer
        task = asyncio.ensure_future(stub.run())
        try:
            rt = await asyncio.to_thread(runtime_bench, bench, sock, calls, sync_pods)
            out, _ = await asyncio.to_thread(rt.communicate, None, 300)
        finally:
            stub.stop()
            await task
            transport.Trunk.data_received = original  # type: ignore[method-assign]
            QoSPlugin._take_in = take_in  # type: ignore[method-assign]
        result = json.loads(out.strip().splitlines()[-1])
        result["sync_take_in_ms"] = took[0] if took else None
        return result  # type: ignore[no-any-return]

    with tempfile.TemporaryDirectory() as d:
        result = asyncio.run(main(Path(d) / "nri.sock"))
    # The last `calls` reads are the timed CreateContainer calls (one request per read: the
    # runtime waits for each answer before sending the next).
    return result, handled[-calls:]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--sync-pods", type=int, default=300)
    ap.add_argument("--write", type=Path, help="update this BENCHMARKS.md section")
    ap.add_argument("--plot", type=Path, help="write the latency distributions to this PNG")
    ap.add_argument("--containerd", action="store_true", help="also measure on the private containerd")
    ap.add_argument("--cri-rounds", type=int, default=5)
    ap.add_argument("--cri-per-round", type=int, default=60)
    ap.add_argument("--start-reps", type=int, default=6)
    args = ap.parse_args()
    bench = go_peer("nri-runtime-bench")
    goplugin = go_peer("go-nri-refplugin")
    if bench is None or goplugin is None:
        print("Go peers unavailable (need ../shared/peers)", file=sys.stderr)
        return 2
    # no CRI here (a stand-in runtime): the inventory is off, as it would find nothing
    ours = [sys.executable, "-m", "nriplugin", "run", "--metrics-address", "127.0.0.1:0", "--cri-socket", ""]
    runs: dict[str, list[dict[str, Any]]] = {"go": [], "nriplugin": []}
    for r in range(args.rounds):
        order = [("go", [str(goplugin)]), ("nriplugin", ours)]
        for name, cmd in order if r % 2 == 0 else order[::-1]:
            res = run_external(bench, cmd, args.calls, args.sync_pods)
            if not res.get("ready") or res.get("errors"):
                print(f"{name} round {r}: {res}", file=sys.stderr)
                return 1
            runs[name].append(res)
            print(
                f"round {r} {name:9s} p50 {res['p50_us']:7.1f} us  p99 {res['p99_us']:7.1f} us  "
                f"sync {res['sync_ms']:6.2f} ms",
                file=sys.stderr,
            )
    inproc, handled = run_inprocess(bench, args.calls, args.sync_pods)

    def med(name: str, key: str) -> float:
        return float(statistics.median(float(x[key]) for x in runs[name]))

    summary = {k: {"p50_us": med(k, "p50_us"), "p99_us": med(k, "p99_us"), "sync_ms": med(k, "sync_ms")} for k in runs}
    ratios = {key: summary["nriplugin"][key] / summary["go"][key] for key in ("p50_us", "p99_us", "sync_ms")}
    plugin_side = {
        "p50_us": pct(handled, 0.5),
        "p99_us": pct(handled, 0.99),
        "n": len(handled),
        "be_adjusted": inproc.get("be_adjusted"),
        "sync_answer_ms": inproc.get("sync_ms"),
        "sync_take_in_ms": inproc.get("sync_take_in_ms"),
    }
    out: dict[str, Any] = {
        "rounds": args.rounds,
        "calls": args.calls,
        "sync_pods": args.sync_pods,
        "median_of_rounds": summary,
        "ratio_nriplugin_over_go": ratios,
        "nriplugin_plugin_side": plugin_side,
        "runs": runs,
    }
    raw: dict[str, Any] = {}
    if args.containerd:
        from bench import containerd_latency as cl

        raw["cri"] = cl.cri_create_latency(goplugin, args.cri_rounds, args.cri_per_round)
        raw["start"] = cl.preregistered_start(goplugin, args.start_reps)
        out["cri_create_ms"] = {k: cl.summary(v) for k, v in raw["cri"].items()}
        out["preregistered_start_ms"] = {k: cl.summary(v) for k, v in raw["start"].items()}
        out["cri_added_ci_ms"] = {
            k: {q: cl.diff_ci(raw["cri"][k], raw["cri"]["none"], x) for q, x in (("p50", 0.5), ("p99", 0.99))}
            for k in ("go", "nriplugin")
        }
    if args.plot:
        plot(args.plot, out, handled, raw)
    print(json.dumps({k: v for k, v in out.items() if k != "runs"}, indent=1))
    if args.write:
        write_section(args.write, out, " ".join(["python -m bench.hook_latency", *sys.argv[1:]]))
    return 0


def plot(path: Path, out: dict[str, Any], handled: list[float], raw: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    ax = axes[0][0]
    names = ["go", "nriplugin"]
    for i, q in enumerate(("p50_us", "p90_us", "p99_us")):
        vals = [statistics.median(float(r[q]) for r in out["runs"][n]) for n in names]
        ax.bar([j * 4 + i for j in range(2)], vals, label=q.split("_")[0])
    ax.set_xticks([1, 5], ["Go stub plugin", "nriplugin"])
    ax.set_ylabel("µs")
    ax.set_title("CreateContainer round trip as the runtime sees it\n(nri-runtime-bench, median of rounds)")
    ax.legend()
    ax = axes[0][1]
    ax.hist(handled, bins=[10 * 1.1**k for k in range(60)], color="tab:orange")
    ax.set_xscale("log")
    ax.set_xlabel("µs")
    ax.set_title("nriplugin plugin-side handling of CreateContainer")
    ax = axes[1][0]
    if raw.get("cri"):
        for name, vals in raw["cri"].items():
            s = sorted(vals)
            ax.plot(s, [(k + 1) / len(s) for k in range(len(s))], label=name)
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction of calls")
        ax.legend()
    ax.set_title("CRI CreateContainer on containerd 1.7.24 (CDF)")
    ax = axes[1][1]
    if raw.get("start"):
        for j, vals in enumerate(raw["start"].values()):
            ax.scatter([j] * len(vals), vals)
        ax.set_xticks(range(len(raw["start"])), list(raw["start"]))
        ax.axhline(300, color="grey", linestyle="--", label="target 300 ms")
        ax.set_ylabel("ms")
        ax.legend()
    ax.set_title("pre-registered: process start -> registered")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def row(name: str, x: dict[str, float]) -> str:
    return f"| {name} | {x['p50_us']:.0f} µs | {x['p99_us']:.0f} µs | {x['sync_ms']:.1f} ms |"


def containerd_part(out: dict[str, Any]) -> str:
    if "cri_create_ms" not in out:
        return ""
    c, st = out["cri_create_ms"], out["preregistered_start_ms"]
    lines = [
        "",
        "On the private containerd 1.7.24 (e2e harness, its root on a tmpfs): CRI CreateContainer (not started;",
        f"a BE pod, so both plugins adjust it), {c['none']['n']} calls per configuration, alternating by round:",
        "",
        "| plugin | p50 | p90 | p99 | added at p50 (95 % CI) | added at p99 (95 % CI) |",
        "|---|---|---|---|---|---|",
    ]
    ci = out["cri_added_ci_ms"]
    for name in ("none", "go", "nriplugin"):
        x = c[name]
        added = ["-", "-"]
        if name != "none":
            added = [
                f"{x[q] - c['none'][q]:+.2f} ms ({ci[name][q][0]:+.2f} .. {ci[name][q][1]:+.2f})"
                for q in ("p50", "p99")
            ]
        lines.append(
            f"| {name} | {x['p50']:.2f} ms | {x['p90']:.2f} ms | {x['p99']:.2f} ms | {added[0]} | {added[1]} |"
        )
    ours, rtt = ci["nriplugin"], out["median_of_rounds"]["nriplugin"]["p99_us"]
    lines += [
        "",
        f"Reading: nriplugin adds {c['nriplugin']['p50'] - c['none']['p50']:+.2f} ms at p50 "
        f"(95 % interval {ours['p50'][0]:+.2f} .. {ours['p50'][1]:+.2f} ms). At p99 the interval is "
        f"{ours['p99'][0]:+.2f} .. {ours['p99'][1]:+.2f} ms for nriplugin (and as wide for Go): the CRI tail on this",
        "shared 2-core machine (containerd, runc and snapshots competing for two cores) is too noisy to confirm or",
        "refute a 1 ms difference there. What the plugin itself adds is bounded by its round trip as the runtime sees",
        f"it, p99 {rtt:.0f} µs in the table above.",
        "",
        f"Pre-registered mode, launcher start -> containerd logs the registration ({st['go']['n']} starts each):",
        f"Go stub p50 {st['go']['p50']:.0f} ms (max {st['go']['max']:.0f} ms); "
        f"nriplugin p50 {st['nriplugin']['p50']:.0f} ms (max {st['nriplugin']['max']:.0f} ms).",
    ]
    return "\n".join(lines) + "\n"


def write_section(path: Path, out: dict[str, Any], command: str) -> None:
    s, r, p = out["median_of_rounds"], out["ratio_nriplugin_over_go"], out["nriplugin_plugin_side"]
    host = f"{os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}"
    section = f"""<!-- hook_latency:begin -->
## Hook latency: nriplugin vs the official Go stub (`bench/hook_latency.py`)

Command: `.venv/bin/{command}` ({host}). The runtime side is `nri-runtime-bench`
(containerd/nri v0.6.1 `pkg/adaptation`, what containerd 1.7 runs); the plugins run
alternately, {out["rounds"]} rounds x {out["calls"]} CreateContainer calls (BE/LS alternating, realistic
pods), {out["sync_pods"]} pods at Synchronize. Figures are the median over rounds.

| plugin | CreateContainer p50 | p99 | Synchronize ({out["sync_pods"]} pods) |
|---|---|---|---|
{row("Go stub (`go-nri-refplugin`)", s["go"])}
{row("nriplugin", s["nriplugin"])}
| **ratio nriplugin / Go** | **{r["p50_us"]:.2f}** | **{r["p99_us"]:.2f}** | **{r["sync_ms"]:.2f}** |

nriplugin plugin-side handling of CreateContainer (bytes in -> response written, inside the
process, {p["n"]} calls): p50 {p["p50_us"]:.0f} µs, p99 {p["p99_us"]:.0f} µs.

Synchronize: nriplugin answers as soon as the message is read (the runtime holds its lock, and
every pod event waits, until the answer); right after it the node model takes the containers
in and their NRI updates are pushed with UpdateContainers. In the in-process run (one sample)
the runtime had the answer after {p["sync_answer_ms"]:.1f} ms, and taking the {out["sync_pods"]} containers in
took {p["sync_take_in_ms"]:.1f} ms more, after the answer, outside the runtime's lock.
{containerd_part(out)}
![latency distributions](bench/hook_latency.png)
<!-- hook_latency:end -->
"""
    replace_section(path, "hook_latency", section)


if __name__ == "__main__":
    sys.exit(main())
