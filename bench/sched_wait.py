"""What an idle-class BE costs LS in the kernel alone: no containerd, no agent.

The colocation benchmark found that BE's CPU costs LS's tail whatever BE's priority. This
bench asks the kernel directly, in three cgroups of the host's cgroup v1 ``cpu`` hierarchy
(under ``nriplugin-sched-wait-<pid>``, removed at the end):

- ``ls``: bench/colocation's LS server (``coloc serve``, ``--work-us`` of CPU per request);
- ``client``: its open-loop load generator at ``--rates``, top weight (cpu.shares 262144);
- ``be``: a 2-thread register-only spinner (``coloc cpu``: no cache or memory traffic) or
  nothing, idle one of two ways: ``group``, the group has ``cpu.idle`` 1 (SCHED_IDLE for the
  whole group, as the agent once made the kubelet's besteffort group); ``task``, the group is
  as the kubelet leaves its besteffort group (``cpu.shares`` 2, ``cpu.idle`` 0) and the
  spinner's threads run SCHED_IDLE (as the agent makes BE's tasks now).

Each rate runs ``--pairs`` rounds of ``--seconds`` windows, without the spinner and with it
each way, alternating. Per window: LS latency p50/p99/p99.9 (from each request's due time: open loop),
and the time LS's threads spent runnable but waiting for a CPU (``run_delay``, the second field
of ``/proc/<tid>/schedstat``, summed over the server's threads) per request, with their
involuntary context switches. Figures are the median over rounds and the ratios, round by
round, of each spinner to none and of ``task`` to ``group``.

Usage (root, cgroup v1 with cpu.idle, Go for the workload binary):
    .venv/bin/python -m bench.sched_wait [--rates 450,520] [--pairs 4] [--seconds 20]
        [--write BENCHMARKS.md] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.colocation import calibrate, go_binary, latencies_ms, parse_load, percentile
from bench.hook_latency import commit
from bench.report import replace_section, shown_command
from testkit.plugin import free_port

CPU_ROOT = Path("/sys/fs/cgroup/cpu")
MAX_SHARES = 262144


# pure parts ----------------------------------------------------------------------------------------


def run_delay_ns(schedstat: str) -> int:
    """``/proc/<tid>/schedstat``: on-CPU ns, run-queue wait ns, timeslices. The wait."""
    fields = schedstat.split()
    if len(fields) != 3:
        raise ValueError(f"not a schedstat line: {schedstat[:100]!r}")
    return int(fields[1])


def involuntary(status: str) -> int:
    for line in status.splitlines():
        if line.startswith("nonvoluntary_ctxt_switches:"):
            return int(line.split()[1])
    raise ValueError("no nonvoluntary_ctxt_switches in the status")


def window(load_output: str, wait_ns: int, switches: int) -> dict[str, Any]:
    """One window's figures from the generator's output and the LS threads' counters."""
    _, reqs = parse_load(load_output)
    lat = latencies_ms(reqs)
    if not lat:
        raise ValueError("the load generator sent no request")
    return {
        "requests": len(lat),
        "errors": sum(1 for r in reqs if not r.ok),
        "p50_ms": percentile(lat, 0.5),
        "p99_ms": percentile(lat, 0.99),
        "p999_ms": percentile(lat, 0.999),
        "wait_us_per_request": wait_ns / 1e3 / len(lat),
        "involuntary_switches": switches,
    }


KEYS = ("p50_ms", "p99_ms", "p999_ms", "wait_us_per_request")
MODES = ("none", "group", "task")  # no spinner; idle by its group's cpu.idle; idle per task


def summarize(pairs: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """Medians over the rounds of each mode's figures, and of the per-round ratios: each
    spinner mode to ``none`` (``ratio``), and ``task`` to ``group`` where both ran."""
    modes = [m for m in MODES if m in pairs[0]] + [m for m in pairs[0] if m not in MODES]
    out: dict[str, Any] = {"modes": modes}
    for mode in modes:
        out[mode] = {k: statistics.median(p[mode][k] for p in pairs) for k in KEYS}
    out["ratio"] = {
        mode: {k: statistics.median(p[mode][k] / p["none"][k] for p in pairs) for k in KEYS}
        for mode in modes
        if mode != "none"
    }
    if "task" in modes and "group" in modes:
        out["task_vs_group"] = {k: statistics.median(p["task"][k] / p["group"][k] for p in pairs) for k in KEYS}
    out["pairs"] = len(pairs)
    return out


# the kernel side -----------------------------------------------------------------------------------


GROUPS = ("ls", "client", "be", "be_task")


class Groups:
    """ls, client, be (``cpu.idle`` 1) and be_task (the kubelet's besteffort: shares 2, not
    idle) under one parent of the cpu hierarchy; removed by :meth:`close`."""

    def __init__(self) -> None:
        self.root = CPU_ROOT / f"nriplugin-sched-wait-{os.getpid()}"
        self.root.mkdir()
        for g in GROUPS:
            (self.root / g).mkdir()
        (self.root / "client" / "cpu.shares").write_text(str(MAX_SHARES))
        (self.root / "be_task" / "cpu.shares").write_text("2")
        idle = self.root / "be" / "cpu.idle"
        if not idle.exists():
            self.close()
            raise RuntimeError("this kernel has no cpu.idle (Linux 5.15 and later): nothing to measure")
        idle.write_text("1")

    def start(self, group: str, argv: list[str], idle: bool = False, **kw: Any) -> subprocess.Popen[bytes]:
        """``argv`` in ``group``; ``idle``: SCHED_IDLE from its first instruction (its threads
        inherit it), as BE born so or given it at start."""
        procs = self.root / group / "cgroup.procs"

        def enter() -> None:
            procs.write_text(str(os.getpid()))
            if idle:
                os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))

        return subprocess.Popen(argv, preexec_fn=enter, **kw)  # it joins its group before exec

    def tasks(self, group: str) -> list[int]:
        return [int(t) for t in (self.root / group / "tasks").read_text().split()]

    def counters(self, group: str) -> tuple[int, int]:
        """Summed run-queue wait (ns) and involuntary switches of the group's threads now."""
        wait = switches = 0
        for tid in self.tasks(group):
            try:
                wait += run_delay_ns(Path(f"/proc/{tid}/schedstat").read_text())
                switches += involuntary(Path(f"/proc/{tid}/status").read_text())
            except FileNotFoundError:  # a thread that ended meanwhile
                continue
        return wait, switches

    def close(self) -> None:
        for g in GROUPS:
            d = self.root / g
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # a task still leaving
                    time.sleep(0.05)
        self.root.rmdir()


def stop(p: subprocess.Popen[bytes] | None) -> None:
    if p is not None and p.poll() is None:
        p.kill()
    if p is not None:
        p.wait()


def run_window(binary: Path, iters: int, rate: float, seconds: float, mode: str, out: Path) -> dict[str, Any]:
    """One window: ``mode`` none (no spinner), group (in ``be``) or task (in ``be_task``, its
    threads SCHED_IDLE)."""
    groups = Groups()
    server = be = None
    try:
        port = free_port()
        server = groups.start("ls", [str(binary), "serve", "-addr", f"127.0.0.1:{port}", "-iters", str(iters)])
        if mode != "none":
            spin = [str(binary), "cpu", "-threads", "2", "-out", str(out / "be.out")]
            be = groups.start("be" if mode == "group" else "be_task", spin, idle=mode == "task")
        time.sleep(1.0)
        w0, s0 = groups.counters("ls")
        with (out / "load.txt").open("wb") as f:
            client = groups.start(
                "client",
                [
                    str(binary),
                    "load",
                    "-url",
                    f"http://127.0.0.1:{port}/",
                    "-rate",
                    str(rate),
                    "-seconds",
                    str(seconds),
                ],
                stdout=f,
            )
            if client.wait(seconds + 60) != 0:
                raise RuntimeError(f"the load generator failed ({client.returncode})")
        w1, s1 = groups.counters("ls")
        return window((out / "load.txt").read_text(), w1 - w0, s1 - s0)
    finally:
        stop(be)
        stop(server)
        groups.close()


def run(args: argparse.Namespace) -> dict[str, Any]:
    binary = go_binary()
    iters = calibrate(binary, args.work_us)
    result: dict[str, Any] = {"work_us": args.work_us, "iters": iters, "seconds": args.seconds, "rates": {}}
    with tempfile.TemporaryDirectory(prefix="nriplugin-sched-wait-") as d:
        for rate in args.rates:
            pairs = []
            for i in range(args.pairs):
                pair = {}
                for mode in MODES:
                    pair[mode] = run_window(binary, iters, rate, args.seconds, mode, Path(d))
                    m = pair[mode]
                    print(
                        f"{rate:g}/s pair {i + 1} {mode:8s} p50 {m['p50_ms']:.2f} p99 {m['p99_ms']:.2f} "
                        f"p99.9 {m['p999_ms']:.2f} ms, LS run-queue wait {m['wait_us_per_request']:.0f} µs/request",
                        flush=True,
                    )
                pairs.append(pair)
            result["rates"][str(rate)] = {"pairs": pairs, "summary": summarize(pairs)}
    return result


HEADER = (
    "| LS rate | no spinner p50 / p99 / p99.9 | idle group | idle tasks | group / none | tasks / none "
    "| tasks / group | LS run-queue wait per request (none / group / tasks) |\n|---|---|---|---|---|---|---|---|"
)


def write_section(path: Path, result: dict[str, Any], command: str) -> None:
    def lat(m: dict[str, Any]) -> str:
        return f"{m['p50_ms']:.2f} / {m['p99_ms']:.2f} / {m['p999_ms']:.2f} ms"

    def ratio(x: dict[str, Any]) -> str:
        return f"{x['p50_ms']:.2f}x / **{x['p99_ms']:.2f}x** / {x['p999_ms']:.2f}x"

    rows = []
    for rate, r in result["rates"].items():
        s = r["summary"]
        n, g, t, x = s["none"], s["group"], s["task"], s["ratio"]
        rows.append(
            f"| {float(rate):g}/s | {lat(n)} | {lat(g)} | {lat(t)} | {ratio(x['group'])} | {ratio(x['task'])} "
            f"| {ratio(s['task_vs_group'])} | {n['wait_us_per_request']:.0f} / {g['wait_us_per_request']:.0f} / "
            f"{t['wait_us_per_request']:.0f} µs |"
        )
    section = f"""<!-- sched_wait:begin -->
## An idle-class BE's cost to LS in the kernel alone (`bench/sched_wait.py`)

Command: `.venv/bin/{command}` ({os.cpu_count()} CPUs, {result["date"]}), commit `{result["commit"]}`. No
containerd and no agent: bench/colocation's LS server ({result["work_us"]} µs of CPU per request),
its open-loop load generator (top weight) and a 2-thread register-only spinner, idle one of two
ways: *group*, in a group with `cpu.idle` 1 (what the agent once did to the kubelet's
besteffort group); *task*, in a group as the kubelet leaves its besteffort group (`cpu.shares`
2, `cpu.idle` 0) with the spinner's threads SCHED_IDLE (what the agent does now); or no
spinner; cgroups of the host's cgroup v1 tree. {next(iter(result["rates"].values()))["summary"]["pairs"]} rounds of
{result["seconds"]:g} s windows per rate, the three alternating; medians over the rounds, and of
the per-round ratios. *Run-queue wait*: the time the server's threads were runnable but not
running (`/proc/<tid>/schedstat`), per request.

{HEADER}
{chr(10).join(rows)}

Reading: SCHED_IDLE does not make BE free: LS's threads wait longer for a CPU beside it (the
kernel hands LS the CPU, but not at once), and the nearer the LS service is to its knee, the
more queueing turns that small wait into a tail. *tasks / group* is the change the agent made
when it stopped writing `cpu.idle` to the kubelet's group (docs/qos-manager.md).
<!-- sched_wait:end -->
"""
    replace_section(path, "sched_wait", section)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")], default=[450.0, 520.0])
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--work-us", type=int, default=1000, help="LS work per request, µs on this host")
    ap.add_argument("--write", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if os.geteuid() != 0 or not (CPU_ROOT / "cpu.shares").exists():
        print("needs root and the cgroup v1 cpu hierarchy at /sys/fs/cgroup/cpu", file=sys.stderr)
        return 2
    result = run(args)
    result["date"] = time.strftime("%Y-%m-%d")
    result["commit"] = commit()
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    print(json.dumps({rate: r["summary"] for rate, r in result["rates"].items()}))
    if args.write:
        write_section(args.write, result, shown_command("python -m bench.sched_wait", sys.argv[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
