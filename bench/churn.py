"""Memory under pod churn: the agent's RSS against the pods that came and went.

On the private containerd 1.7 with NRI, the agent running as in production (hooks, CRI
inventory, reconciler, QoS manager, metrics): about ``--live`` pods stay alive while pods are
created (one container each, half BE with batch resources, half LS with a quota, each with a
2 KB ``kubectl.kubernetes.io/last-applied-configuration``) and the oldest removed (its pod
cgroup too, as kubelet does), for
``--minutes``. The agent's VmRSS and open fds are sampled as pods churn; reported: RSS after
the warm-up and at the end, the growth per pod that came and went (least squares over the
samples after the warm-up), fds, and the hook failures the agent counted. The warm-up is by
time (default 5 min): the QoS manager keeps 5-minute trends, which fill up whatever the pods
do; growth after that is what pods leave behind.

``--checkout DIR`` runs the agent from another checkout (e.g. /work/main, for a before/after).

Usage (root): .venv/bin/python -m bench.churn [--minutes 8] [--warmup 300] [--live 20] [--checkout DIR]
       [--write BENCHMARKS.md] [--plot bench/churn.png]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.footprint import BATCH, BE, LS, status_kib, stop
from bench.report import replace_section, shown_command
from testkit import containerd as harness
from testkit.cri import msg
from testkit.plugin import free_port, scrape

ROOT = Path(__file__).resolve().parent.parent
AGENT = [sys.executable, "-m", "nriplugin", "run"]
NOTE = (
    '{"apiVersion":"v1","kind":"Pod","spec":{"containers":[{"env":['
    + ",".join(f'{{"name":"FLAG_{k}","value":"enabled-for-tenant-{k}"}}' for k in range(45))
    + "]}]}}"
)


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def slope(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of y over x."""
    n = len(points)
    if n < 2:
        return float("nan")
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else float("nan")


def remove_pod_cgroup(parent: str) -> None:
    """What kubelet does once a pod is gone: its pod-level cgroup goes too (containerd leaves
    it: kubelet made it). Left behind, every pod directory would stay watched, rightly."""
    for h in harness.CGROUP_FS.iterdir():
        d = h / parent.lstrip("/")
        if not d.is_dir() or h.is_symlink():
            continue
        for sub in sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                sub.rmdir()
        with contextlib.suppress(OSError):
            d.rmdir()


class Churner:
    """Pods come and go; ``churned`` counts those that came and went."""

    def __init__(self, rt: harness.Containerd, live: int) -> None:
        self.rt = rt
        self.live = live
        self.pods: collections.deque[harness.Pod] = collections.deque()
        self.lock = threading.Lock()
        self.churned = 0
        self.made = 0
        self.errors = 0
        self.stopping = threading.Event()

    def one(self) -> None:
        with self.lock:
            i = self.made
            self.made += 1
        ann = {"kubectl.kubernetes.io/last-applied-configuration": NOTE}
        if i % 2 == 0:
            ann["node.koordinator.sh/extended-resource-spec"] = BATCH
            pod = self.rt.run_pod(f"be-{i}", "BestEffort", BE, ann)
            self.rt.create_container(pod, "main", cpu_shares=2)
        else:
            pod = self.rt.run_pod(f"ls-{i}", "Burstable", LS, ann)
            self.rt.create_container(pod, "main", cpu_shares=512, cpu_quota=100000)
        with self.lock:
            self.pods.append(pod)
            old = self.pods.popleft() if len(self.pods) > self.live else None
        if old is not None:
            cri = self.rt.cri
            assert cri is not None
            cri.call("StopPodSandbox", msg("StopPodSandboxRequest", pod_sandbox_id=old.id))
            cri.call("RemovePodSandbox", msg("RemovePodSandboxRequest", pod_sandbox_id=old.id))
            remove_pod_cgroup(old.config.linux.cgroup_parent)
            with self.lock:
                self.churned += 1

    def worker(self) -> None:
        while not self.stopping.is_set():
            try:
                self.one()
            except Exception as exc:  # a slow runtime on a loaded machine: count it, go on
                self.errors += 1
                print(f"churn: {exc}", file=sys.stderr)
                time.sleep(0.5)


def run(rt: harness.Containerd, minutes: float, live: int, warmup: float, checkout: Path) -> dict[str, Any]:
    port = free_port()
    argv = [*AGENT, "--socket", rt.nri_socket, "--cri-socket", rt.address]
    argv += ["--pods-root", f"{rt.cgroup_root}/kubepods", "--metrics-address", f"127.0.0.1:{port}"]
    agent = subprocess.Popen(
        argv,
        cwd=checkout,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    churner = Churner(rt, live)
    workers = [threading.Thread(target=churner.worker, daemon=True) for _ in range(2)]
    samples: list[tuple[int, float, int]] = []  # (pods churned, RSS MiB, fds)
    warm = 0  # pods churned when the warm-up ended
    try:
        deadline = time.monotonic() + 30
        while scrape(port, 'nriplugin_connection_state{state="registered"}') < 1:
            if time.monotonic() > deadline or agent.poll() is not None:
                raise RuntimeError("the agent did not register")
            time.sleep(0.2)
        for w in workers:
            w.start()
        t0 = time.monotonic()
        end = t0 + minutes * 60
        last = -1
        while time.monotonic() < end:
            if not warm and time.monotonic() - t0 >= warmup:
                warm = churner.churned
            time.sleep(1.0)
            n = churner.churned
            if n != last:
                samples.append((n, status_kib(agent.pid, "VmRSS") / 1024, fds(agent.pid)))
                last = n
        churner.stopping.set()
        for w in workers:
            w.join(60)
        failures = scrape(port, "nriplugin_hook_failures_total")
        entries = scrape(port, "nriplugin_reconcile_entries")
    finally:
        churner.stopping.set()
        stop(agent)
    after = [(n, r) for n, r, _ in samples if warm and n >= warm]
    if len(after) < 2:
        raise RuntimeError(f"the run ({minutes} min) is not longer than the warm-up ({warmup} s)")
    first = next(s for s in samples if s[0] >= warm)
    return {
        "minutes": minutes,
        "live": live,
        "warmup_s": warmup,
        "warm_pods": warm,
        "churned": churner.churned,
        "errors": churner.errors,
        "rss_warm_mib": first[1],
        "rss_end_mib": samples[-1][1],
        "growth_kib_per_pod": slope(after) * 1024,
        "fds_warm": first[2],
        "fds_end": samples[-1][2],
        "hook_failures": failures,
        "entries_end": entries,
        "samples": samples,
        "checkout": str(checkout),
    }


def plot(results: list[dict[str, Any]], labels: list[str], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    for r, label in zip(results, labels, strict=True):
        ax.plot([n for n, _, _ in r["samples"]], [m for _, m, _ in r["samples"]], label=label)
    ax.set_xlabel("pods that came and went")
    ax.set_ylabel("agent RSS (MiB)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def write_section(path: Path, results: list[dict[str, Any]], labels: list[str], cmd: str, png: str) -> None:
    rows = "\n".join(
        f"| {label} | {r['churned']} | {r['rss_warm_mib']:.1f} → {r['rss_end_mib']:.1f} MiB | "
        f"{r['growth_kib_per_pod']:.2f} KB | {r['fds_warm']} → {r['fds_end']} | {r['hook_failures']:.0f} |"
        for r, label in zip(results, labels, strict=True)
    )
    r = results[0]
    section = f"""<!-- churn:begin -->
## Memory under pod churn (`bench/churn.py`)

Command: `.venv/bin/python -m {cmd}` ({os.cpu_count()} CPUs, {time.strftime("%Y-%m-%d")}), on the private
containerd 1.7.24 with NRI and the agent as in production (hooks, CRI inventory, reconciler, QoS
manager, metrics): {r["live"]} pods alive while pods were created (one container, half BE
with batch resources, half LS with a quota, each with a 2 KB last-applied-configuration) and
the oldest removed (with its pod cgroup, as kubelet does), for {r["minutes"]:g} minutes. Growth:
least-squares slope of the agent's RSS over the pods that came and went after a
{r["warmup_s"]:.0f} s warm-up (the QoS manager's 5-minute trends fill up in it whatever the pods do).

| agent | pods that came and went | RSS (after warm-up → end) | growth per pod | fds | hook failures |
|---|---|---|---|---|---|
{rows}

Target: under 1 KB per pod that came and went. `tests/test_churn.py` checks every
per-container structure empties when its container goes.

![RSS against pods churned]({png})
<!-- churn:end -->
"""
    replace_section(path, "churn", section)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=8.0)
    ap.add_argument("--live", type=int, default=20)
    ap.add_argument("--warmup", type=float, default=300.0, help="seconds of churn before the growth is measured")
    ap.add_argument("--checkout", type=Path, action="append", help="run the agent from this checkout (repeatable)")
    ap.add_argument("--write", type=Path)
    ap.add_argument("--plot", type=Path)
    ap.add_argument("--json", type=Path, help="also write the raw results here")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root (containerd, cgroups)", file=sys.stderr)
        return 2
    checkouts = args.checkout or [ROOT]
    results = []
    for checkout in checkouts:
        rt = harness.Containerd(harness.install(), Path(tempfile.mkdtemp(prefix="nriplugin-bench-")))
        try:
            rt.start()
            rt.import_images()
            results.append(run(rt, args.minutes, args.live, args.warmup, checkout.resolve()))
        finally:
            rt.teardown()
        brief = {k: v for k, v in results[-1].items() if k != "samples"}
        print(json.dumps(brief), flush=True)
    labels = ["this branch" if c.resolve() == ROOT else str(c) for c in checkouts]
    if args.json:
        args.json.write_text(json.dumps(results))
    if args.plot:
        plot(results, labels, args.plot)
    if args.write:
        png = os.path.relpath(args.plot, args.write.parent) if args.plot else "churn.png"
        write_section(args.write, results, labels, shown_command("bench.churn", sys.argv[1:]), png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
