"""The QoS manager on the private containerd 1.7 and the host's real cgroup v1 tree, with the
agent's embedded default policy and one change, ``quotaFrom: LOW`` (QUOTA_POLICY): an LS pod
requesting one core, a BE pod spinning two threads, the agent deciding BE's quota on kubelet's
besteffort group. The default puts no quota on BE's idle group below the HIGH CPU level, so with
it an idle LS leaves BE unlimited and there is no quota to cut or give back; this bench measures
how fast the quota reacts, so it asks for one at every level (bench/colocation.py measures what
the default itself does to LS).

- reaction to an LS spike: a host ``yes``, kept stopped inside the LS container's cpu and
  cpuacct cgroups (and its unified-hierarchy group on a hybrid host, as runc puts each of the
  container's processes), is continued (SIGCONT); from that instant, the time until BE's group quota
  (``kubepods/besteffort/cpu.cfs_quota_us``, polled every ~5 ms) reads at or below the cut
  (``--cut`` cores, 0.8: what LS's one-core request leaves BE at MEDIUM, (2 - 1) x 0.8; the
  usage budget may cut deeper), and until BE's measured usage (the BE
  pod's cpuacct over trailing 100 ms windows) is under the limit in force. The spinner spins for
  ``--spike-seconds`` and is stopped; the next spike waits for its slot (``--interval``, 31 s)
  and for BE's limit to be given back. The slot is chosen for the embedded default: a raise
  after a cut waits ``raiseDelay`` (2 s) doubled for each such raise in the last minute, so with
  one spike every ~31 s a raise waits about 4 s. Around each spike the spinner is checked to
  be alive and still in its groups (a SIGCONT to a dead, unreaped child succeeds silently: the
  run stops instead), and a spike is measurable only if the spinner itself ran (``SPUN``);
- BE-limit writes under a stationary noisy LS load: the same spinner continued and stopped in
  random chunks (busy and idle each uniform in 100-300 ms, seeded: a 50 % duty cycle on
  average, 25-75 % chunk by chunk) for ``--noise-minutes``; changes counted by the agent
  (``nriplugin_qos_cpu_suppress_total``, its log) and in the quota file (sampled every 50 ms);
- decision latency and agent CPU with ``--containers`` more containers (half BE, half LS, busybox
  sleep; the LS ones without a CPU request, so the seed's budget is not zeroed by 100 LS
  requests on 2 CPUs): ``nriplugin_qos_decision_latency_milliseconds`` and
  ``nriplugin_qos_collect_milliseconds`` over ``--window`` seconds (mean = sum/count, p50/p99
  interpolated in the buckets), the agent's utime+stime over the same window, RSS;
- a timeline PNG of the first spike that starts from BE's limit given back: LS usage, BE usage,
  BE's limit (the quota file), the CPU pressure score (/metrics), sampled every 50 ms.

No timing is asserted: the script reports figures. Everything (containerd, pods, the agent, the
spinner, cgroups, temp dirs) is set up and torn down by the script.

Usage (root, cgroup v1, 2 CPUs): .venv/bin/python -m bench.qos [--spikes 12] [--noise-minutes 3]
       [--containers 200] [--plot bench/qos_timeline.png] [--write BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import calendar
import itertools
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.footprint import beside_main, nriplugin_on, ratio, status_kib, stop_agent
from bench.footprint import cpu_seconds as proc_cpu_seconds
from bench.report import replace_section, shown_command
from testkit import containerd as harness
from testkit import koordlet
from testkit.hostnode import HostNode
from testkit.plugin import PluginProcess, runtime_args

BE = {"koordinator.sh/qosClass": "BE"}
LS = {"koordinator.sh/qosClass": "LS"}
SPIN_TWO = ["/bin/sh", "-c", "yes >/dev/null & yes >/dev/null"]
POLL = 0.005  # seconds between reads of the quota file and the counters during a spike
SAMPLE = 0.05  # seconds between timeline / noise samples
WINDOW = 0.1  # seconds: BE's "measured usage" is over trailing windows this long (one CFS period)
SPUN = 0.5  # cores: a spike counts only if the spinner itself ran at least this much (one thread: ~1)
METRIC = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$")


# reading the kernel and the agent -----------------------------------------------------------------


def read_int(path: Path) -> int:
    return int(path.read_text())


def quota_cores(group: Path) -> float:
    q = read_int(group / "cpu.cfs_quota_us")
    return float("inf") if q < 0 else q / read_int(group / "cpu.cfs_period_us")


def acct_seconds(group: Path) -> float:
    return read_int(group / "cpuacct.usage") / 1e9


def node_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs from /proc/stat (busy: everything but idle and iowait)."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(f) - f[3] - f[4], sum(f)


def busy_cores(j0: tuple[int, int], j1: tuple[int, int]) -> float:
    return (j1[0] - j0[0]) / max(1, j1[1] - j0[1]) * (os.cpu_count() or 1)


def metrics(plugin: PluginProcess) -> dict[str, float]:
    """Every sample of the agent's /metrics, keyed ``name`` or ``name{labels}``."""
    _, body = plugin.get("/metrics")
    out: dict[str, float] = {}
    for line in body.splitlines():
        m = METRIC.match(line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def family_sum(m: dict[str, float], family: str) -> float:
    return sum(v for k, v in m.items() if k == family or k.startswith(family + "{"))


def histogram(m0: dict[str, float], m1: dict[str, float], name: str) -> dict[str, float]:
    """A histogram's change between two scrapes: count, mean, and p50/p99 interpolated linearly
    inside the bucket (as Prometheus' histogram_quantile does); +Inf answers the last bound."""
    count = m1.get(f"{name}_count", 0.0) - m0.get(f"{name}_count", 0.0)
    total = m1.get(f"{name}_sum", 0.0) - m0.get(f"{name}_sum", 0.0)
    buckets: list[tuple[float, float]] = []
    for k, v in m1.items():
        if k.startswith(f"{name}_bucket{{"):
            le = k.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float("inf") if le == "+Inf" else float(le), v - m0.get(k, 0.0)))
    buckets.sort()

    def quantile(q: float) -> float:
        if count <= 0:
            return float("nan")
        rank, lo, below = q * count, 0.0, 0.0
        for le, cum in buckets:
            if cum >= rank:
                if le == float("inf"):
                    return lo
                return lo + (le - lo) * ((rank - below) / (cum - below) if cum > below else 1.0)
            lo, below = le, cum
        return lo

    return {
        "count": count,
        "mean": total / count if count else float("nan"),
        "p50": quantile(0.5),
        "p99": quantile(0.99),
        "max_bucket": next((le for le, cum in buckets if cum >= count), float("nan")) if count else float("nan"),
    }


def pct(v: list[float], q: float) -> float:
    s = sorted(v)
    return s[min(len(s) - 1, round((len(s) - 1) * q))] if s else float("nan")


# the LS load: a host `yes` kept stopped inside the LS container ------------------------------------


class Spinner:
    """One thread of ``yes`` inside the LS container's CPU cgroups, stopped until
    :meth:`go`. It is started stopped (``kill -STOP $$`` before ``exec yes``) and moved while
    stopped, so it never spins outside LS, and continued once at set-up so the exec is done."""

    def __init__(self, cgroups: list[Path]) -> None:
        self.cgroups = cgroups
        self.proc = subprocess.Popen(["/bin/sh", "-c", "kill -STOP $$; exec yes >/dev/null"])
        try:
            self._wait_state("T")
            for g in cgroups:
                (g / "cgroup.procs").write_text(str(self.proc.pid))
            self.go()
            time.sleep(0.05)
            self.stop()
        except BaseException:
            self.kill()  # not left stopped (or spinning) behind a failed set-up
            raise

    def _wait_state(self, want: str) -> None:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
            if stat.rsplit(")", 1)[1].split()[0] == want:
                return
            time.sleep(0.001)
        raise TimeoutError(f"spinner {self.proc.pid} not in state {want}")

    def check(self) -> None:
        """Raise unless the spinner is alive and still in every group it joined: a signal to a
        dead child (a zombie) succeeds silently, and a spike without its load measures nothing."""
        rc = self.proc.poll()
        if rc is not None:
            how = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit status {rc}"
            raise RuntimeError(f"the LS spinner {self.proc.pid} exited: {rc} ({how})")
        left = [str(g) for g in self.cgroups if str(self.proc.pid) not in (g / "cgroup.procs").read_text().split()]
        if left:
            raise RuntimeError(f"the LS spinner {self.proc.pid} is no longer in {', '.join(left)}")

    def cpu_seconds(self) -> float:
        """The spinner's own CPU time (utime + stime)."""
        f = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

    def go(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


# the node -----------------------------------------------------------------------------------------


class Node:
    def __init__(self, rt: harness.Containerd, plugin: PluginProcess) -> None:
        self.rt, self.plugin = rt, plugin
        ls = rt.run_pod("web", "Burstable", LS)
        ls_c = rt.create_container(ls, "main", cpu_shares=1024)  # requests one core
        be = rt.run_pod("batch", "BestEffort", BE)
        rt.create_container(be, "main", cpu_shares=2, command=SPIN_TWO)
        self.ls_acct = rt.container_cgroup(ls, ls_c, "cpuacct")
        self.be_acct = harness.CGROUP_FS / "cpuacct" / be.config.linux.cgroup_parent.lstrip("/")
        self.be_group = harness.CGROUP_FS / "cpu" / rt.cgroup_root / "kubepods" / "besteffort"
        # where runc put the container: the v1 cpu and cpuacct groups, and on a hybrid host its
        # group in the unified hierarchy too (where the kernel keeps the container's PSI)
        groups = [rt.container_cgroup(ls, ls_c, c) for c in ("cpu", "cpuacct", "unified")]
        self.spinner = Spinner([g for g in groups if g.is_dir()])

    def quota(self) -> float:
        return quota_cores(self.be_group)

    def wait_quota(self, cond: Any, timeout: float) -> float | None:
        """Seconds until ``cond(quota)`` holds, polled every POLL; None if it never did."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if cond(self.quota()):
                return time.monotonic() - t0
            time.sleep(POLL)
        return None

    def log_lines(self) -> list[str]:
        return [ln for ln in self.plugin.logs().splitlines() if "BE limited to" in ln]

    def decisions(self, since: float, until: float) -> list[tuple[float, float]]:
        """The agent's BE-limit decisions logged between two wall-clock times: (when, cores).
        A decision is logged where it is made, in the fast sample that showed the change (its
        time to the millisecond), before the writer writes it."""
        out = []
        for ln in self.log_lines():
            try:
                rec = json.loads(ln)
                ts = str(rec["ts"])
                t = calendar.timegm(time.strptime(ts[:19], "%Y-%m-%dT%H:%M:%S")) + int(ts[20:23]) / 1e3
                cores = float(rec["be_limit_cores"])
            except (ValueError, KeyError, TypeError):
                continue
            if since <= t <= until:
                out.append((t, cores))
        return out


class Timeline(threading.Thread):
    """LS usage, BE usage, BE's limit and the CPU pressure score every SAMPLE seconds."""

    def __init__(self, node: Node) -> None:
        super().__init__(daemon=True)
        self.node = node
        self.rows: list[tuple[float, float, float, float, float]] = []  # t, ls s, be s, limit, score
        self.done = threading.Event()

    def run(self) -> None:
        n = self.node
        while not self.done.is_set():
            t = time.monotonic()
            score = metrics(n.plugin).get("nriplugin_qos_cpu_pressure_score", float("nan"))
            self.rows.append((t, acct_seconds(n.ls_acct), acct_seconds(n.be_acct), n.quota(), score))
            time.sleep(max(0.0, SAMPLE - (time.monotonic() - t)))


# 1. reaction to LS spikes ---------------------------------------------------------------------------


def spike(node: Node, cut: float, spin: float) -> dict[str, Any]:
    """One spike: continue the spinner, poll until BE is cut and its usage is under the limit,
    keep it spinning ``spin`` seconds, stop it, wait for the limit to be given back."""
    before = node.quota()
    samples: list[tuple[float, float, float]] = []  # t since the spike, BE cpu seconds, quota
    j0, ls0, be0 = node_jiffies(), acct_seconds(node.ls_acct), acct_seconds(node.be_acct)
    node.spinner.check()
    spinner0 = node.spinner.cpu_seconds()
    w0 = time.time()  # the log's clock (its timestamps are wall-clock, to the millisecond)
    t0 = time.monotonic()
    node.spinner.go()
    first = reached = usage_under = None
    while True:
        t = time.monotonic() - t0
        q, be = node.quota(), acct_seconds(node.be_acct)
        samples.append((t, be, q))
        if first is None and q != before:
            first = t
        if reached is None and q <= cut:
            reached = t
        if usage_under is None and reached is not None:
            # BE's usage over the trailing window, counted only once the window starts after the cut
            j = next((i for i in range(len(samples) - 1, -1, -1) if t - samples[i][0] >= WINDOW), None)
            if j is not None and samples[j][0] >= reached:
                used = (be - samples[j][1]) / (t - samples[j][0])
                if used <= q * 1.05:
                    usage_under = t
        if t >= spin:
            break
        time.sleep(POLL)
    after = node.quota()
    node.spinner.stop()
    spun = time.monotonic() - t0
    spinner = (node.spinner.cpu_seconds() - spinner0) / spun
    node.spinner.check()
    # the log's timestamps are truncated to the millisecond: a decision in the spike's first
    # millisecond may read as before it
    made = node.decisions(w0 - 0.001, w0 + spun)
    decided = made[0][0] if made else None
    cut_decided = next((t for t, cores in made if cores <= cut), None)
    ls, be = (acct_seconds(node.ls_acct) - ls0) / spun, (acct_seconds(node.be_acct) - be0) / spun
    other = busy_cores(j0, node_jiffies()) - ls - be
    back = node.wait_quota(lambda q: q > cut + 0.1, 25.0)
    return {
        "before": before,
        "after": after,
        "first_change_ms": None if first is None else first * 1e3,
        "cut_ms": None if reached is None else reached * 1e3,
        "usage_under_ms": None if usage_under is None else usage_under * 1e3,
        "decision_ms": None if decided is None else max(0.0, decided - w0) * 1e3,
        "cut_decision_ms": None if cut_decided is None else max(0.0, cut_decided - w0) * 1e3,
        "given_back_s": back,
        "restored": node.quota(),
        "ls_cores": ls,
        "spinner_cores": spinner,
        "be_cores": be,
        "other_cores": other,
    }


def spikes(node: Node, n: int, interval: float, cut: float, spin: float, plot: Path | None) -> dict[str, Any]:
    out: list[dict[str, Any]] = []
    timeline: Timeline | None = None
    plotted = 0  # the spike drawn (1-based), 0: none yet
    start = time.monotonic()
    for k in range(n):
        slot = start + k * interval
        time.sleep(max(0.0, slot - time.monotonic()))
        # BE's limit given back (and a limit in force): else the spike cannot show a cut, e.g.
        # while other work on the host uses what LS does not (the usage budget counts it too)
        waited = node.wait_quota(lambda q: cut + 0.1 < q < float("inf"), 45.0)
        if plot is not None and not plotted:  # the first spike that starts from a limit given back
            timeline = Timeline(node)
            timeline.start()
            time.sleep(2.0)
        r = spike(node, cut, spin)
        r["waited_for_limit_s"] = waited
        # measurable: from a limit given back, and with the load there (the spinner ran)
        r["valid"] = waited is not None and r["before"] > cut + 0.1 and r["spinner_cores"] >= SPUN
        if timeline is not None:
            time.sleep(3.0)
            timeline.done.set()
            timeline.join()
            if r["valid"]:
                draw(timeline, r, spin, plot)  # type: ignore[arg-type]
                plotted = k + 1
            timeline = None
        out.append(r)
        print(f"spike {k + 1}/{n}: {r}", flush=True)
    return {"episodes": out, "interval_s": interval, "cut_cores": cut, "spin_s": spin, "plotted": plotted}


def draw(tl: Timeline, ep: dict[str, Any], spin: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = tl.rows
    t_spike = rows[0][0] + 2.0  # the timeline starts 2 s before the spinner is continued
    ts, ls, be, lim, score = [], [], [], [], []
    for a, b in itertools.pairwise(rows):
        dt = b[0] - a[0]
        ts.append(b[0] - t_spike)
        ls.append((b[1] - a[1]) / dt)
        be.append((b[2] - a[2]) / dt)
        lim.append(b[3] if b[3] != float("inf") else float("nan"))
        score.append(b[4])
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.plot(ts, ls, label="LS container usage, cores", color="tab:blue", lw=1)
    ax.plot(ts, be, label="BE usage, cores", color="tab:orange", lw=1)
    ax.step(ts, lim, where="post", label="BE limit (besteffort cfs_quota), cores", color="tab:red", lw=2)
    ax.axvspan(0, spin, color="tab:blue", alpha=0.08, label="LS spinner running")
    ax.set_xlabel("seconds from the LS spike")
    ax.set_ylabel("cores (of 2)")
    ax.set_ylim(0, 2.2)
    ax2 = ax.twinx()
    ax2.plot(ts, score, label="CPU pressure score", color="tab:green", lw=1, ls="--")
    ax2.set_ylabel("CPU pressure score")
    ax2.set_ylim(0, 100)
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="upper right", fontsize=8)
    cut = ep.get("cut_ms")
    ax.set_title(
        "nriplugin QoS manager, embedded default (quotaFrom LOW): one LS spike"
        + (f" (BE cut after {cut:.0f} ms)" if cut is not None else ""),
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# 2. writes under a stationary noisy LS load ---------------------------------------------------------


def noise(node: Node, minutes: float, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    seen: list[tuple[float, float]] = []  # (t, quota) at every change seen in the 50 ms samples
    stop = threading.Event()

    def sampler() -> None:
        last = None
        while not stop.is_set():
            q = node.quota()
            if q != last:
                seen.append((time.monotonic(), q))
                last = q
            time.sleep(SAMPLE)

    node.spinner.check()
    m0, logs0 = metrics(node.plugin), len(node.log_lines())
    ls0, be0, j0 = acct_seconds(node.ls_acct), acct_seconds(node.be_acct), node_jiffies()
    th = threading.Thread(target=sampler, daemon=True)
    t0 = time.monotonic()
    th.start()
    busy = 0.0
    end = t0 + minutes * 60
    while time.monotonic() < end:
        on, off = rng.uniform(0.1, 0.3), rng.uniform(0.1, 0.3)
        node.spinner.go()
        time.sleep(on)
        node.spinner.stop()
        busy += on
        time.sleep(off)
    elapsed = time.monotonic() - t0
    stop.set()
    th.join()
    node.spinner.check()
    m1 = metrics(node.plugin)
    changes = [(t - t0, q) for t, q in seen[1:]]  # the first sample is the starting value
    return {
        "minutes": elapsed / 60,
        "seed": seed,
        "duty": busy / elapsed,
        "ls_cores": (acct_seconds(node.ls_acct) - ls0) / elapsed,
        "be_cores": (acct_seconds(node.be_acct) - be0) / elapsed,
        "node_busy_cores": busy_cores(j0, node_jiffies()),
        "suppress_delta": family_sum(m1, "nriplugin_qos_cpu_suppress_total")
        - family_sum(m0, "nriplugin_qos_cpu_suppress_total"),
        "log_writes": len(node.log_lines()) - logs0,
        "file_changes": changes,
        "start_quota": seen[0][1] if seen else float("nan"),
        "end_quota": node.quota(),
    }


# 3. decision latency and agent CPU with many containers ---------------------------------------------


def populate(rt: harness.Containerd, n: int) -> None:
    """``n`` sleeping busybox containers, half BE, half LS (LS: Burstable without a CPU request,
    shares 2, as kubelet gives it: 100 LS pods requesting half a core each, as in
    bench/footprint.py, would ask for 50 cores of 2 and floor BE's budget)."""

    def make(i: int) -> None:
        if i % 2 == 0:
            pod = rt.run_pod(f"be-{i}", "BestEffort", BE)
            rt.create_container(pod, "main", cpu_shares=2)
        else:
            pod = rt.run_pod(f"ls-{i}", "Burstable", LS)
            rt.create_container(pod, "main", cpu_shares=2)

    with ThreadPoolExecutor(8) as ex:
        list(ex.map(make, range(n)))


def many(node: Node, n: int, settle: float, window: float) -> dict[str, Any]:
    t0 = time.monotonic()
    populate(node.rt, n)
    made = time.monotonic() - t0
    deadline = time.monotonic() + 120
    while metrics(node.plugin).get("nriplugin_reconcile_entries", 0.0) < 2 * n:
        if time.monotonic() > deadline:
            raise TimeoutError("the agent did not take in the containers")
        time.sleep(0.2)
    time.sleep(settle)
    pid = node.plugin.proc.pid
    m0, c0, w0, j0 = metrics(node.plugin), proc_cpu_seconds(pid), time.monotonic(), node_jiffies()
    time.sleep(window)
    m1, c1, w1 = metrics(node.plugin), proc_cpu_seconds(pid), time.monotonic()
    busy = busy_cores(j0, node_jiffies())
    return {
        "containers": n,
        "create_s": made,
        "entries": m1.get("nriplugin_reconcile_entries", 0.0),
        "window_s": w1 - w0,
        "decision": histogram(m0, m1, "nriplugin_qos_decision_latency_milliseconds"),
        "collect": histogram(m0, m1, "nriplugin_qos_collect_milliseconds"),
        "cpu_percent": (c1 - c0) / (w1 - w0) * 100,
        "rss_mib": status_kib(pid, "VmRSS") / 1024,
        "peak_rss_mib": status_kib(pid, "VmHWM") / 1024,
        "be_limit": node.quota(),
        "node_busy_cores": busy,
    }


# the run --------------------------------------------------------------------------------------------


# the embedded default with a quota at every CPU level (see the module's docstring)
QUOTA_POLICY = "qosManager:\n  cpuSuppress:\n    quotaFrom: LOW\n"


def run(rt: harness.Containerd, args: argparse.Namespace) -> dict[str, Any]:
    policy = rt.base / "qos-policy.yaml"
    policy.write_text(QUOTA_POLICY)
    plugin = PluginProcess(rt.nri_socket, *runtime_args(rt), "--policy", str(policy))
    try:
        plugin.wait_ready()
        node = Node(rt, plugin)
        try:
            t = node.wait_quota(lambda q: q < float("inf"), 20.0)
            if t is None:
                raise RuntimeError(f"the manager never limited BE: {plugin.logs()[-3000:]}")
            time.sleep(args.settle)
            result: dict[str, Any] = {"initial_limit": node.quota()}
            result["spikes"] = spikes(node, args.spikes, args.interval, args.cut, args.spike_seconds, args.plot)
            time.sleep(max(0.0, args.interval - args.spike_seconds - 10))  # the last raise out of the rate window
            result["noise"] = noise(node, args.noise_minutes, args.seed)
            print(f"noise: {result['noise']}", flush=True)
            result["many"] = many(node, args.containers, args.settle, args.window)
            print(f"many: {result['many']}", flush=True)
            result["log"] = node.log_lines()  # every "BE limited to" line, for the report's reading
            result["log_writes_total"] = len(result["log"])
            return result
        finally:
            node.spinner.kill()
    finally:
        plugin.stop()


def summarize(r: dict[str, Any]) -> dict[str, Any]:
    every = r["spikes"]["episodes"]
    eps = [e for e in every if e["valid"]] or every

    def col(key: str) -> list[float]:
        return [e[key] for e in eps if e[key] is not None]

    cut, use, first = col("cut_ms"), col("usage_under_ms"), col("first_change_ms")
    back = col("given_back_s")
    decided, cut_decided = col("decision_ms"), col("cut_decision_ms")
    # the write: from the decision that cut to the quota file showing it (the file polled every
    # POLL, the log to the millisecond)
    written = [
        e["cut_ms"] - e["cut_decision_ms"] for e in eps if e["cut_ms"] is not None and e["cut_decision_ms"] is not None
    ]
    return {
        "n": len(eps),
        "all": len(every),
        "other": (min(e["other_cores"] for e in every), max(e["other_cores"] for e in every)),
        "cut": (len(cut), pct(cut, 0.5), pct(cut, 0.99), max(cut, default=float("nan"))),
        "first": (len(first), pct(first, 0.5), max(first, default=float("nan"))),
        "decided": (len(decided), pct(decided, 0.5), pct(decided, 0.99), max(decided, default=float("nan"))),
        "cut_decided": (
            len(cut_decided),
            pct(cut_decided, 0.5),
            pct(cut_decided, 0.99),
            max(cut_decided, default=float("nan")),
        ),
        "written": (len(written), pct(written, 0.5), max(written, default=float("nan"))),
        "usage": (len(use), pct(use, 0.5), pct(use, 0.99), max(use, default=float("nan"))),
        "back": (len(back), pct(back, 0.5), max(back, default=float("nan"))),
        "after": statistics.median(e["after"] for e in eps),
        "before": statistics.median(e["before"] for e in eps),
    }


def commit() -> str:
    """The commit measured (``-dirty`` with local changes to the agent or the benchmarks)."""
    root = Path(__file__).resolve().parents[1]
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=root)
    code = ["nriplugin", "bench/*.py", "pyproject.toml"]
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no", "--", *code], capture_output=True, text=True, cwd=root
    )
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def write_section(path: Path, r: dict[str, Any], command: str, plot: Path | None) -> None:
    s = summarize(r)
    sp, nz, mn = r["spikes"], r["noise"], r["many"]
    dec, col = mn["decision"], mn["collect"]
    per_min = nz["suppress_delta"] / nz["minutes"]
    file_per_min = len(nz["file_changes"]) / nz["minutes"]
    changes = ", ".join(f"{t:.1f} s: {q:.2f}" for t, q in nz["file_changes"]) or "none"
    png = (
        f"\nThe timeline of spike {sp['plotted']} (the first that started from BE's limit given back):\n\n"
        f"![one LS spike]({plot})\n"
        if plot is not None and sp.get("plotted")
        else ""
    )
    ms = "{:.0f} ms".format
    rows = [
        (
            f"LS spike -> BE's quota <= {sp['cut_cores']:g} cores, p50 (cut in {s['cut'][0]} of {s['n']} "
            f"measurable spikes, {s['all']} in all)",
            ms(s["cut"][1]),
            "< 200 ms (koordlet: 1-2 s)",
        ),
        ("same, p99", ms(s["cut"][2]), "< 200 ms"),
        ("same, max", ms(s["cut"][3]), ""),
        ("LS spike -> BE's first quota write, p50 / max", f"{s['first'][1]:.0f} / {s['first'][2]:.0f} ms", ""),
        (
            "LS spike -> the agent's first decision (made in the first sample that shows the spike), "
            f"p50 / p99 / max ({s['decided'][0]} spikes)",
            f"{s['decided'][1]:.0f} / {s['decided'][2]:.0f} / {s['decided'][3]:.0f} ms",
            "",
        ),
        (
            f"LS spike -> the decision that cuts BE to <= {sp['cut_cores']:g} cores, p50 / p99 / max",
            f"{s['cut_decided'][1]:.0f} / {s['cut_decided'][2]:.0f} / {s['cut_decided'][3]:.0f} ms",
            "",
        ),
        (
            "that decision -> the quota file shows it (the write; the file polled every 5 ms), p50 / max",
            f"{s['written'][1]:.0f} / {s['written'][2]:.0f} ms",
            "",
        ),
        (
            "LS spike -> BE's usage (100 ms windows after the cut) under its limit, p50 / p99 / max",
            f"{s['usage'][1]:.0f} / {s['usage'][2]:.0f} / {s['usage'][3]:.0f} ms",
            "",
        ),
        (
            "other work on the node during the spikes (busy minus LS minus BE), min / max",
            f"{s['other'][0]:.2f} / {s['other'][1]:.2f} cores",
            "",
        ),
        ("BE's limit before a spike -> during it (median)", f"{s['before']:.2f} -> {s['after']:.2f} cores", ""),
        (
            f"spinner stopped -> BE's limit given back (> {sp['cut_cores'] + 0.1:g} cores): within 25 s in "
            f"{s['back'][0]} of {s['n']} spikes; p50 / max of those",
            f"{s['back'][1]:.1f} / {s['back'][2]:.1f} s",
            "raiseDelay 2 s + a round",
        ),
        (
            f"decision latency per full round, {mn['containers']} more containers, mean "
            f"({dec['count']:.0f} rounds in {mn['window_s']:.0f} s)",
            f"{dec['mean']:.2f} ms",
            "< 5 ms (seed: < 100 ms)",
        ),
        ("same, p50 / p99 (bucket-interpolated)", f"{dec['p50']:.2f} / {dec['p99']:.2f} ms", ""),
        (
            "collection per round, mean / p50 / p99",
            f"{col['mean']:.2f} / {col['p50']:.2f} / {col['p99']:.2f} ms",
            "",
        ),
        (
            f"agent CPU with the manager on, {mn['containers']} more containers, BE spinning ({mn['window_s']:.0f} s)",
            f"{mn['cpu_percent']:.2f} % of a core",
            "< 2 %",
        ),
        ("agent RSS / peak RSS", f"{mn['rss_mib']:.1f} / {mn['peak_rss_mib']:.1f} MiB", ""),
        (
            f"BE-limit writes per minute, stationary noisy LS load ({nz['minutes']:.1f} min, "
            "`nriplugin_qos_cpu_suppress_total`)",
            f"{per_min:.2f}",
            "<= 2 (koordlet's cpuset path: up to 60)",
        ),
        ("same, changes seen in the quota file (sampled every 50 ms)", f"{file_per_min:.2f}", "<= 2"),
    ]
    table = "\n".join(["| figure | value | target |", "|---|---|---|"] + [f"| {a} | {b} | {c} |" for a, b, c in rows])
    section = f"""<!-- qos:begin -->
## QoS manager: reaction, decision latency, footprint, writes under noise (`bench/qos.py`)

Command: `.venv/bin/{command}` ({os.cpu_count()} CPUs, {time.strftime("%Y-%m-%d")}), commit `{r["commit"]}`,
on the private containerd 1.7.24 and the host's cgroup v1 tree, the agent with its **embedded default policy and
`quotaFrom: LOW`** (a quota at every CPU level: the default gives BE's idle group none below HIGH,
so an idle LS would leave nothing to cut; `bench/colocation.py` measures the default itself;
balanced profile, syncPeriod 1 s, the 30 ms fast path (250 ms while BE idles), usage budget 90 %, deadband 0.2 cores,
raiseDelay 2 s, doubled for each raise after a cut in the last minute, at most 4 such a minute): an
LS pod requesting one core, a BE pod spinning two threads. A spike is a host `yes` kept stopped
inside the LS container's cpu and cpuacct cgroups (and its group in the unified hierarchy beside
them, as runc places the container's own processes) and continued (SIGCONT) for {sp["spin_s"]:g} s,
one every {sp["interval_s"]:g} s at the earliest (an LS load that comes back every half minute), and
only once BE's limit has been given back (else a spike cannot show a cut; waited for up to 45 s);
BE's quota is read from
`kubepods/besteffort/cpu.cfs_quota_us` every ~5 ms.

{table}

Reading: a decision round is {dec["mean"]:.1f} ms on average, of which collection is {col["mean"]:.1f} ms.
The give-back waits for the CPU pressure level to fall back (see the score in the timeline),
not only for raiseDelay. Below `reserveLSRequestFrom` (HIGH) BE's limit follows what LS uses
and waits for as the fast path measures it: the pods root's CPU counter (what runs outside the
pods from `/proc/stat` over a second) and, while a rise is followed, the time LS's pods had a
task waiting for a CPU (their PSI `some`, here from the unified hierarchy beside v1); a rise is
followed with a sample 30 ms after the one that first showed it and then every 20 ms, each
measuring it from that first sample, so the cut is decided by the first sample whose interval
lies inside the spike, and refined (by 0.02 cores or more) as that measure sharpens. The
samples are timed just past the scheduler's tick and measured between ticks (28 and 20 ms
here), where every other CPU's counter is current: before that (`bac7621`) the first
measuring sample read what LS needed 0.07-0.10 cores short in 4 of 12 spikes (a tick of the
cgroup counter's lag over 30 ms) and a refinement 20-40 ms later made the cut. The rows "the
agent's first decision" and "the decision that cuts" are the log's timestamps of those
decisions (each made in the fast sample that showed the change, to the millisecond); "the
write" is from that decision to the quota file showing it. The figures move with whatever
else runs on this shared machine: the usage budget counts any non-BE work, not only LS's.

Noisy load: the spinner continued and stopped in chunks, busy and idle each uniform in
100-300 ms (seed {nz["seed"]}; duty {nz["duty"] * 100:.0f} %, LS used {nz["ls_cores"]:.2f} cores and BE
{nz["be_cores"]:.2f} cores on average,
the whole node {nz["node_busy_cores"]:.2f}). BE's limit at its start: {nz["start_quota"]:.2f} cores; the
changes seen in the file (seconds from the start: cores): {changes}.

The {mn["containers"]} containers (half BE, half LS, busybox `sleep`; the LS ones Burstable without a
CPU request) were added after the spikes and the noise, next to the two pods above; the agent
then managed {mn["entries"]:.0f} cgroups (the node was
{mn["node_busy_cores"]:.2f} cores busy in the window). Agent CPU is its utime+stime over the window, with BE
spinning, so the fast path runs every 30 ms throughout.
{png}<!-- qos:end -->
"""
    replace_section(path, "qos", section)


# -- beside koordlet, on a host-process node ---------------------------------------------------
#
# The spikes and the noise above, run by the same functions against each agent in turn on the
# host node of bench/footprint.py --beside koordlet: the LS and BE pods created through its API
# server, the spinner in the LS container's groups, BE's quota read from the kubelet's
# besteffort group. Each agent alone, the first in a round alternating.

KOORDLET_QOS_GATES = "BECPUSuppress=true"
# The same cpuSuppressThresholdPercent for both: nriplugin's default (koordlet's is 65, which on
# 2 CPUs leaves an idle-LS budget of 1.3 cores less the node's own use, too close to the cut).
SUPPRESS_PERCENT = 90
KOORDLET_WRITE = "succeeded to write cfs_quota_us"  # koordlet's log line for each quota write


class AgentView:
    """What the spike and noise functions read of an agent: its /metrics (nriplugin's; koordlet's
    families are other names, so its counters read 0) and its log since the trial began."""

    def __init__(self, log: Path, port: int | None) -> None:
        self.log, self.port = log, port
        self.offset = log.stat().st_size if log.exists() else 0

    def get(self, path: str) -> tuple[int, str]:
        if self.port is None:
            return 200, ""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return r.status, r.read().decode()
        except OSError:
            return 0, ""

    def logs(self) -> str:
        with self.log.open("rb") as f:
            f.seek(self.offset)
            return f.read().decode(errors="replace")


class HostQosNode(Node):
    """:class:`Node` on the host node: an LS pod requesting one core and a BE pod spinning two
    threads, made once for the run (each agent meets the same pods)."""

    def __init__(self, node: HostNode) -> None:  # no super(): the pods come from the API server
        self.host = node
        res = {"requests": {"cpu": "1", "memory": "64Mi"}}
        pods = [node.pod_manifest("web", LS, resources=res), node.pod_manifest("batch", BE, command=SPIN_TWO)]
        node.wait_running(node.create_pods(pods), 120)
        listed = {p.metadata.name: p for p in node.core().list_namespaced_pod("default").items}
        cpu, acct, unified = (harness.CGROUP_FS / c / node.pods_root for c in ("cpu", "cpuacct", "unified"))
        ls = listed["web"]
        cid = ls.status.container_statuses[0].container_id.split("://", 1)[-1]
        ls_dir = f"burstable/pod{ls.metadata.uid}/{cid}"
        self.ls_acct = acct / ls_dir
        self.be_acct = acct / f"besteffort/pod{listed['batch'].metadata.uid}"
        self.be_group = cpu / "besteffort"
        # as in the standalone mode: the container's v1 cpu and cpuacct groups, and on a hybrid
        # host its group in the unified hierarchy too (the kubelet's cgroupfs driver and runc
        # put it at the same path there), where the kernel keeps the PSI the agent reads for LS
        groups = [cpu / ls_dir, acct / ls_dir, unified / ls_dir]
        self.spinner = Spinner([g for g in groups if g.is_dir()])
        self.plugin: Any = None

    def log_lines(self) -> list[str]:
        return [ln for ln in self.plugin.logs().splitlines() if "BE limited to" in ln or KOORDLET_WRITE in ln]


def qos_nodeslo(policy: str) -> dict[str, Any]:
    return {
        "resourceUsedThresholdWithBE": {
            "enable": True,
            "cpuSuppressThresholdPercent": SUPPRESS_PERCENT,
            "cpuSuppressPolicy": policy,
        }
    }


def qos_trial(host: HostQosNode, agent: str, binary: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One agent alone: BE's quota reset to the kubelet's (none), the agent started and its
    first limit awaited, then the spikes and the noise."""
    node = host.host
    (host.be_group / "cpu.cfs_quota_us").write_text("-1")  # what the last agent left is not this one's
    proc, k = None, None
    try:
        if agent == "nriplugin":
            policy = node.base / "qos-policy.yaml"
            policy.write_text(QUOTA_POLICY)
            log = node.base / "nriplugin-qos.log"
            view_offset = AgentView(log, None).offset
            proc, port = nriplugin_on(node, 2, log, ("--policy", str(policy)))
            host.plugin = AgentView(log, port)
            host.plugin.offset = view_offset
        else:
            k = koordlet.Koordlet(binary, node, feature_gates=KOORDLET_QOS_GATES)
            host.plugin = AgentView(k.log, None)
            k.start()
            k.wait_registered(120)
        first = host.wait_quota(lambda q: q < float("inf"), 30.0)
        if first is None:
            raise RuntimeError(f"{agent} never limited BE: {host.plugin.logs()[-3000:]}")
        time.sleep(args.settle)
        out: dict[str, Any] = {"agent": agent, "first_limit_s": first, "initial_limit": host.quota()}
        out["spikes"] = spikes(host, args.spikes, args.interval, args.cut, args.spike_seconds, None)
        time.sleep(max(0.0, args.interval - args.spike_seconds - 10))
        out["noise"] = noise(host, args.noise_minutes, args.seed)
        nz = out["noise"]
        nz["agent_writes"] = nz["suppress_delta"] if agent == "nriplugin" else nz["log_writes"]
        return out
    finally:
        stop_agent(proc, k)


def round_figures(t: dict[str, Any], cut: float) -> dict[str, Any]:
    """A trial's figures: cut and give-back medians over its measurable spikes, writes per minute."""
    eps = [e for e in t["spikes"]["episodes"] if e["valid"]]
    cuts = [e["cut_ms"] for e in eps if e["cut_ms"] is not None]
    back = [e["given_back_s"] for e in eps if e["given_back_s"] is not None]
    nz = t["noise"]
    return {
        "cut_ms": statistics.median(cuts) if cuts else float("nan"),
        "cuts": cuts,
        "measurable": len(eps),
        "spikes": len(t["spikes"]["episodes"]),
        "back_s": statistics.median(back) if back else float("nan"),
        "backs": back,
        "file_per_min": len(nz["file_changes"]) / nz["minutes"],
        "agent_per_min": nz["agent_writes"] / nz["minutes"],
        "before": statistics.median(e["before"] for e in eps) if eps else float("nan"),
        "after": statistics.median(e["after"] for e in eps) if eps else float("nan"),
    }


def beside_koordlet(args: argparse.Namespace) -> dict[str, Any]:
    binary = koordlet.build()
    node = HostNode(nodeslo_spec=qos_nodeslo("cfsQuota"), max_pods=30)
    out: dict[str, Any] = {"rounds": args.rounds, "nriplugin": [], "koordlet": [], "order": [], "raw": []}
    host: HostQosNode | None = None
    try:
        node.start()
        host = HostQosNode(node)
        for r in range(args.rounds):
            order = ("nriplugin", "koordlet") if r % 2 == 0 else ("koordlet", "nriplugin")
            out["order"].append(order[0])
            for name in order:
                t = qos_trial(host, name, binary, args)
                out["raw"].append(t)
                out[name].append(round_figures(t, args.cut))
                print(f"round {r + 1}/{args.rounds} {name}: {out[name][-1]}", file=sys.stderr, flush=True)
    finally:
        if host is not None:
            host.spinner.kill()
        node.stop()
    return out


def write_beside_section(path: Path, r: dict[str, Any], cmd: str, head: str, args: argparse.Namespace) -> None:
    def pooled(a: str, key: str) -> list[float]:
        return [x for t in r[a] for x in t[key]]

    def fig(key: str, q: float, a: str, unit: str, fmt: str = "{:.0f}") -> str:
        xs = pooled(a, key)
        return (fmt.format(pct(xs, q)) + f" {unit}") if xs else "-"

    def med(a: str, key: str) -> float:
        return float(statistics.median(t[key] for t in r[a]))

    def rat(key: str) -> str:
        if any(t[key] != t[key] for a in ("nriplugin", "koordlet") for t in r[a]):  # nan: a round without
            return "-"
        x, lo, hi = ratio(r, key)
        return f"{x:.2f}x ({lo:.2f}..{hi:.2f})"

    n_sp = {a: (sum(t["measurable"] for t in r[a]), sum(t["spikes"] for t in r[a])) for a in ("nriplugin", "koordlet")}
    rows = [
        (
            f"LS spike -> BE's quota <= {args.cut:g} cores, p50 (pooled spikes)",
            fig("cuts", 0.5, "nriplugin", "ms"),
            fig("cuts", 0.5, "koordlet", "ms"),
            rat("cut_ms"),
        ),
        (
            "same, p99 (pooled; with this few spikes, the largest)",
            fig("cuts", 0.99, "nriplugin", "ms"),
            fig("cuts", 0.99, "koordlet", "ms"),
            "",
        ),
        (
            "spikes cut / measurable / all",
            "{} / {} / {}".format(len(pooled("nriplugin", "cuts")), *n_sp["nriplugin"]),
            "{} / {} / {}".format(len(pooled("koordlet", "cuts")), *n_sp["koordlet"]),
            "",
        ),
        (
            f"LS stopped -> BE's quota given back (> {args.cut + 0.1:g} cores), p50",
            fig("backs", 0.5, "nriplugin", "s", "{:.1f}"),
            fig("backs", 0.5, "koordlet", "s", "{:.1f}"),
            rat("back_s"),
        ),
        (
            "BE's quota before a spike -> during it (median)",
            f"{med('nriplugin', 'before'):.2f} -> {med('nriplugin', 'after'):.2f} cores",
            f"{med('koordlet', 'before'):.2f} -> {med('koordlet', 'after'):.2f} cores",
            "",
        ),
        (
            "quota changes per minute under the noisy LS load (the file, sampled every 50 ms)",
            f"{med('nriplugin', 'file_per_min'):.1f}",
            f"{med('koordlet', 'file_per_min'):.1f}",
            rat("file_per_min"),
        ),
        (
            "quota writes per minute the agent reports (nriplugin's counter / koordlet's log)",
            f"{med('nriplugin', 'agent_per_min'):.1f}",
            f"{med('koordlet', 'agent_per_min'):.1f}",
            "",
        ),
    ]
    table = "\n".join(f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows)
    per_round = " · ".join(
        f"{a['cut_ms']:.0f} / {b['cut_ms']:.0f} ms, {a['back_s']:.1f} / {b['back_s']:.1f} s, "
        f"{a['file_per_min']:.1f} / {b['file_per_min']:.1f} per min ({o})"
        for o, a, b in zip(r["order"], r["nriplugin"], r["koordlet"], strict=True)
    )
    section = f"""<!-- qos_koordlet:begin -->
## QoS reaction beside koordlet, same node (`bench/qos.py --beside koordlet`)

Command: `flock -x /tmp/nriplugin-cpu.lock .venv/bin/python -m {cmd}` ({os.cpu_count()} CPUs
shared with other work, {time.strftime("%Y-%m-%d")}), commit `{head}`. The host-process node of
the footprint row (`testkit/hostnode.py`: kubelet v1.35.4, cgroupfs, cgroup v1, containerd
2.4.2), with the pods of the section above created once through its API server: an LS pod
requesting one core, a BE pod spinning two threads. {r["rounds"]} rounds; in each, nriplugin and
koordlet run alone one after the other (first in the round alternating), each started with
BE's quota reset to none (the kubelet's), its first limit awaited, settled {args.settle:g} s, then
the same functions as the section above: {args.spikes} spikes (a `yes` continued inside the LS
container's cgroups, its v1 cpu and cpuacct groups and its group in the unified hierarchy, where
the kernel keeps the PSI nriplugin reads, for {args.spike_seconds:g} s, one every {args.interval:g} s at
the earliest and only once BE's quota is given back; measurable only if the `yes` itself ran
{SPUN:g} cores or more), BE's quota read from the kubelet's
`kubepods/besteffort/cpu.cfs_quota_us` every ~5 ms; then {args.noise_minutes:g} min of the noisy
LS load (busy and idle chunks uniform in 100-300 ms, seed {args.seed}).

One NodeSLO for both, written directly: `resourceUsedThresholdWithBE: {{enable: true,
cpuSuppressThresholdPercent: {SUPPRESS_PERCENT}, cpuSuppressPolicy: cfsQuota}}` (cfsQuota: a
quota on BE's group is the quantity measured for both; koordlet's default, cpuset, cannot cut
on this node: it never leaves BE fewer than 2 CPUs, `beMinCPUSetCores`, and the node has 2).
What each does with it: **koordlet** v1.8.0 (`-feature-gates={KOORDLET_QOS_GATES}`) every
second sets BE's quota to capacity x {SUPPRESS_PERCENT} % - non-BE pods' use - system use, from its
collectors' last 1-second samples, skipping changes under 1 % of the node and raising by at
most 10 % of the node per second; **nriplugin** (`nriplugin run --cluster on`, the embedded
default policy plus the section above's one change, `quotaFrom: LOW`, in a policy file under
the NodeSLO) takes the lower of its level budget and the same usage formula, in 1 s rounds plus
its fast path (a sample every 30 ms while BE runs, timed to the scheduler's tick; a rise measured
28 ms after the sample that shows it, counting LS's PSI waits), raising after a cut only after
`raiseDelay`, doubled for each raise in the last minute.

| figure | nriplugin | koordlet | koordlet / nriplugin |
|---|---|---|---|
{table}

Per round, nriplugin / koordlet (who went first): cut p50, give-back p50, quota changes per
minute under noise: {per_round}. The ratio is koordlet / nriplugin of the medians over rounds
with its 95 % bootstrap interval over rounds.
<!-- qos_koordlet:end -->
"""
    replace_section(path, "qos_koordlet", section)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spikes", type=int, default=12)
    ap.add_argument("--interval", type=float, default=31.0, help="seconds between spike starts")
    ap.add_argument("--spike-seconds", type=float, default=4.0)
    ap.add_argument("--cut", type=float, default=0.8, help="cores: BE counts as cut at or below this")
    ap.add_argument("--noise-minutes", type=float, default=3.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--containers", type=int, default=200)
    ap.add_argument("--settle", type=float, default=5.0)
    ap.add_argument("--window", type=float, default=60.0)
    ap.add_argument("--plot", type=Path, default=Path("bench/qos_timeline.png"))
    ap.add_argument("--write", type=Path)
    ap.add_argument("--json", type=Path, help="also save the raw results here")
    ap.add_argument("--beside", choices=["koordlet"], help="spikes and noise beside this peer on a host-process node")
    ap.add_argument("--rounds", type=int, default=2, help="with --beside: rounds, each agent once per round")
    args = ap.parse_args()
    if args.beside == "koordlet":
        return beside_main(
            "bench.qos",
            lambda: beside_koordlet(args),
            lambda path, r, cmd, head: write_beside_section(path, r, cmd, head, args),
            args.json,
            args.write,
        )
    if os.geteuid() != 0 or not (harness.CGROUP_FS / "cpu" / "cpu.cfs_quota_us").exists():
        print("needs root and cgroup v1 (containerd, cgroups)", file=sys.stderr)
        return 2
    if len(os.sched_getaffinity(0)) != 2:
        print(f"note: the figures are meant for a 2-CPU node; this one has {os.cpu_count()}", file=sys.stderr)
    rt = harness.Containerd(harness.install(), Path(tempfile.mkdtemp(prefix="nriplugin-bench-")))
    try:
        rt.start()
        rt.import_images()
        result = run(rt, args)
    finally:
        rt.teardown()
    result["commit"] = commit()
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    print({k: v for k, v in result.items() if k != "spikes"})
    print(summarize(result))
    if args.write:
        write_section(args.write, result, shown_command("python -m bench.qos", sys.argv[1:]), args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
