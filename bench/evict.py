"""MemoryEvict on the private containerd 1.7 and the host's real cgroup v1 tree, with the
agent's embedded default policy and no API server (eviction through CRI).

Each trial: the pods root (``<top>/kubepods``, kubelet's node-allocatable cgroup) limited to
``--limit-mib`` (1024); an LS pod holding 100 MiB, BE pods holding 200, 150 and 100 MiB (busybox
``dd`` keeping its buffer while blocked on a pipe), then a BE pod growing about 30 MB/s. The
bench arms its own usage-threshold eventfd on the pods root at the agent's trigger (70 % of the
root's memory) and measures, from the instant the kernel reports the crossing:
- to the agent's decision (the timestamp of its ``evicting`` log line),
- to the victim's container no longer running (CRI ``ContainerStatus``, polled every 10 ms);
and counts the pods evicted against the fewest that would have covered the release the agent
computed (its log gives the amount; the pods' anonymous memory is read just before the crossing,
largest first). The peak use of the root and its OOM kills are reported too. The pods of a trial
are removed before the next (a new agent each trial: no cooldown or repeat rule carries over).

No timing is asserted: the script reports figures.

Usage (root, cgroup v1): .venv/bin/python -m bench.evict [--trials 5] [--write BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import asyncio
import calendar
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.footprint import beside_main, nriplugin_on, ratio, stop_agent
from bench.report import replace_section, shown_command
from nriplugin.kernel.memory_events import MemoryEvents
from testkit import containerd as harness
from testkit import koordlet
from testkit.cri import msg
from testkit.hostnode import HostNode, until
from testkit.plugin import PluginProcess, runtime_args
from testkit.workloads import BE, GROW, LS, limit_pods_root, oom_kills, running

MiB = 1 << 20
HOLD = "dd if=/dev/zero bs={n}M count=1 2>/dev/null | sleep 100000"


def hold(n: int) -> list[str]:
    return ["/bin/sh", "-c", HOLD.format(n=n)]


TRIGGER = 70.0  # the default memoryEvictThresholdPercent


def anon(path: Path) -> int:
    for line in (path / "memory.stat").read_text().splitlines():
        if line.startswith("total_rss "):
            return int(line.split()[1])
    return 0


def wall(ts: str) -> float:
    """An agent log timestamp (UTC, ms) as seconds since the epoch."""
    return calendar.timegm(time.strptime(ts[:19], "%Y-%m-%dT%H:%M:%S")) + int(ts[20:23]) / 1000


class Crossing:
    """The kernel's own notification that the pods root's usage crossed ``bytes_`` (upward)."""

    def __init__(self, root: Path, bytes_: int) -> None:
        self.at: float | None = None
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(root, bytes_), daemon=True)
        self.thread.start()
        self.ready.wait(5)

    def _run(self, root: Path, bytes_: int) -> None:
        asyncio.set_event_loop(self.loop)

        def fired(_: str) -> None:
            if self.at is None and int((root / "memory.usage_in_bytes").read_text()) >= bytes_ * 0.98:
                self.at = time.time()

        ev = MemoryEvents(self.loop, fired)
        why = ev.v1_threshold("trigger", str(root), bytes_)
        assert why is None, why
        self.ready.set()
        self.loop.run_forever()
        ev.close()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def trial(rt: harness.Containerd, limit_mib: int) -> dict[str, Any]:
    root = limit_pods_root(rt, limit_mib * MiB)
    cap = min(limit_mib * MiB, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    plugin = PluginProcess(rt.nri_socket, *runtime_args(rt))
    try:
        plugin.wait_ready()
        pods: dict[str, tuple[harness.Pod, str]] = {}
        ls = rt.run_pod("web", "Burstable", LS)
        pods["web"] = (ls, rt.create_container(ls, "main", cpu_shares=512, command=hold(100)))
        for n in (200, 150, 100):
            p = rt.run_pod(f"hold-{n}", "BestEffort", BE)
            pods[p.config.metadata.name] = (p, rt.create_container(p, "main", command=hold(n)))
        time.sleep(3)  # the holders have their memory
        sizes = {
            name: anon(harness.CGROUP_FS / "memory" / p.config.linux.cgroup_parent.lstrip("/"))
            for name, (p, _) in pods.items()
        }
        crossing = Crossing(root, int(cap * TRIGGER / 100))
        g = rt.run_pod("leaky", "BestEffort", BE)
        pods["leaky"] = (g, rt.create_container(g, "main", command=GROW))
        g_dir = harness.CGROUP_FS / "memory" / g.config.linux.cgroup_parent.lstrip("/")
        ids = {n: c for n, (_, c) in pods.items()}
        peak, _, stopped, before = watch(rt, root, crossing, sizes, g_dir, ids, 120)
        crossing.close()
        if os.environ.get("EVICT_BENCH_LOG"):
            Path(os.environ["EVICT_BENCH_LOG"]).write_text(plugin.logs())
        evicting = [json.loads(ln) for ln in plugin.logs().splitlines() if '"evicting ' in ln]
        releases = [json.loads(ln) for ln in plugin.logs().splitlines() if '"MemoryEvict: pods use' in ln]
        amount = 0.0
        if releases:
            m = re.search(r"= (\d+) MiB$", releases[0]["msg"])
            amount = float(m.group(1)) * MiB if m else 0.0
        need, got = 0, 0
        for n, size in enumerate(sorted(_be(before or sizes), reverse=True), 1):
            got += size
            if got >= amount:
                need = n
                break
        decided = wall(evicting[0]["ts"]) if evicting else None
        return {
            "crossed": crossing.at,
            "decision_s": None if decided is None or crossing.at is None else decided - crossing.at,
            "stopped_s": None if stopped is None or crossing.at is None else stopped - crossing.at,
            "evicted": [e["victim"] for e in evicting],
            "fewest": need,
            "release_mib": amount / MiB,
            "sizes_mib": {k: round(v / MiB) for k, v in (before or sizes).items()},
            "peak_mib": peak / MiB,
            "oom_kills": oom_kills(root),
            "failcnt": int((root / "memory.failcnt").read_text()),
            "ls_running": running(rt, pods["web"][1]),
        }
    finally:
        plugin.stop()
        assert rt.cri is not None
        for p in rt.cri.call("ListPodSandbox", msg("ListPodSandboxRequest")).items:
            with contextlib.suppress(Exception):
                rt.cri.call("StopPodSandbox", msg("StopPodSandboxRequest", pod_sandbox_id=p.id))
                rt.cri.call("RemovePodSandbox", msg("RemovePodSandboxRequest", pod_sandbox_id=p.id))


def watch(
    rt: harness.Containerd,
    root: Path,
    crossing: Any,
    sizes: dict[str, int],
    leak: Path,
    ids: dict[str, str],
    limit: float,
) -> tuple[int, int, float | None, dict[str, int]]:
    """Every 10 ms until 5 s after the first of ``ids``' containers stopped (at most ``limit``
    s): the pods root's peak use, the node's (MemTotal - MemAvailable), when the first stopped,
    and the pods' sizes at ``crossing`` (the leak's, ``sizes["leaky"]``, kept current till then)."""
    peak, peak_node, stopped = 0, 0, None
    before: dict[str, int] = {}
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        peak = max(peak, int((root / "memory.usage_in_bytes").read_text()))
        peak_node = max(peak_node, node_used())
        if crossing.at is None:
            sizes["leaky"] = anon(leak)
        elif not before:
            before = dict(sizes)
        down = [n for n, c in ids.items() if not running(rt, c)]
        if down and stopped is None:
            stopped = time.time()
        if stopped is not None and time.time() - stopped > 5:
            break
        time.sleep(0.01)
    return peak, peak_node, stopped, before


def _be(sizes: dict[str, int]) -> list[int]:
    return [v for k, v in sizes.items() if k != "web"]


def summarize(trials: list[dict[str, Any]]) -> dict[str, Any]:
    dec = [t["decision_s"] for t in trials if t["decision_s"] is not None]
    stop = [t["stopped_s"] for t in trials if t["stopped_s"] is not None]
    return {
        "trials": len(trials),
        "decision_ms": {"min": min(dec) * 1e3, "median": statistics.median(dec) * 1e3, "max": max(dec) * 1e3}
        if dec
        else None,
        "stopped_ms": {"min": min(stop) * 1e3, "median": statistics.median(stop) * 1e3, "max": max(stop) * 1e3}
        if stop
        else None,
        "extra_pods": max(len(t["evicted"]) - t["fewest"] for t in trials),
        "oom_kills": sum(t["oom_kills"] for t in trials),
        "failcnt": sum(t["failcnt"] for t in trials),
        "peak_mib": max(t["peak_mib"] for t in trials),
        "ls_kept": all(t["ls_running"] for t in trials),
    }


def write_section(path: Path, trials: list[dict[str, Any]], s: dict[str, Any], command: str, limit: int) -> None:
    d, st = s["decision_ms"], s["stopped_ms"]
    dec = f"{d['min']:.0f} / {d['median']:.0f} / {d['max']:.0f} ms"
    rows = "\n".join(
        f"| {i} | {t['decision_s'] * 1e3:.0f} | {t['stopped_s'] * 1e3:.0f} | {', '.join(t['evicted'])} | "
        f"{len(t['evicted'])} / {t['fewest']} | {t['release_mib']:.0f} | {t['peak_mib']:.0f} | {t['oom_kills']} |"
        for i, t in enumerate(trials, 1)
        if t["decision_s"] is not None and t["stopped_s"] is not None
    )
    section = f"""<!-- evict:begin -->
## MemoryEvict: threshold crossing to eviction (`bench/evict.py`)

Command: `.venv/bin/python -m {command}` (2 CPUs shared with other work, {time.strftime("%Y-%m-%d")}), on the
private containerd 1.7.24 and the host's cgroup v1 tree, embedded default policy (trigger at
70 % of the pods' memory, release down to 68 % x 1.3), no API server: eviction through CRI
(`StopContainer` with a 5 s grace period, then `StopPodSandbox`). Pods root limited to {limit} MiB; an LS
pod holding 100 MiB and BE pods holding 200, 150 and 100 MiB, then a BE pod growing about 30 MB/s.
The crossing is the kernel's own notification (the bench's usage-threshold eventfd on the pods
root at 70 %); the decision is the agent's `evicting` log line (ms timestamps); stopped is the
victim's container seen not running through CRI. The agent wakes on the same kernel event as the
bench, so its decision can be stamped before the bench's notification thread gets the CPU: a
negative figure means "within the kernel's own notification latency".

| figure | value | target |
|---|---|---|
| crossing -> decision (min / median / max, {s["trials"]} trials) | {dec} | < 1 s |
| crossing -> victim stopped | {st["min"]:.0f} / {st["median"]:.0f} / {st["max"]:.0f} ms | |
| pods evicted beyond the fewest that would have sufficed (worst trial) | {s["extra_pods"]} | <= 1 |
| OOM kills / limit hits (failcnt) in the pods root, all trials | {s["oom_kills"]} / {s["failcnt"]} | 0 |
| peak use of the pods root | {s["peak_mib"]:.0f} MiB of {limit} | |
| LS pod kept running | {"yes" if s["ls_kept"] else "NO"} | yes |

| trial | decision (ms) | stopped (ms) | evicted | evicted / fewest | release (MiB) | peak (MiB) | OOM kills |
|---|---|---|---|---|---|---|---|
{rows}

The leaking pod goes first (it grows far over 5 MB/min), so one eviction covers the release; the
larger holders stay. kubelet would look every 10 s (its housekeeping) and koordlet's memory
eviction every 1 s plus a 4 s cooldown.
<!-- evict:end -->
"""
    replace_section(path, "evict", section)


# -- beside koordlet, on a host-process node ---------------------------------------------------

# koordlet's gate for what nriplugin's MemoryEvict does (BE pods by memory used, largest first);
# its MemoryEvict gate takes pods by priority and needs evictEnabledPriorityThreshold.
KOORDLET_EVICT_GATES = "BEMemoryEvict=true"
TRIAL_HEAD = (
    "| round | agent | threshold P (of the node) | node / pods use before the leak (MiB) | decision (ms) "
    "| stopped (ms) | evicted | evicted / fewest | release (MiB) | peak pods / node (MiB) | OOM kills |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|"
)
# The leak as in the trial above, exiting on SIGTERM as a real program would: nriplugin stops a
# victim with a grace period (5 s) and the shell as PID 1 would otherwise ignore it.
GROW_TERM = ["/bin/sh", "-c", "trap 'exit 0' TERM; " + GROW[2]]
HEADROOM = 1 << 30  # node use under the threshold with the trial's holders up, before the leak
KLOG_TS = re.compile(r"^[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{6})")


def node_used() -> int:
    """koordlet's node memory use: MemTotal - MemAvailable (its ``MemUsageBytes``)."""
    info = {ln.split(":")[0]: int(ln.split()[1]) * 1024 for ln in Path("/proc/meminfo").read_text().splitlines()}
    return info["MemTotal"] - info["MemAvailable"]


class NodeCrossing:
    """The instant koordlet's quantity (node use over the node's capacity) reaches its
    threshold: /proc/meminfo polled every 10 ms (the kernel has no notification for it)."""

    def __init__(self, bytes_: int) -> None:
        self.at: float | None = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(bytes_,), daemon=True)
        self.thread.start()

    def _run(self, bytes_: int) -> None:
        while not self.done.is_set() and self.at is None:
            if node_used() >= bytes_:
                self.at = time.time()
            time.sleep(0.01)

    def close(self) -> None:
        self.done.set()
        self.thread.join(5)


def klog_wall(line: str) -> float | None:
    """A klog header's time (this machine's clock is UTC; klog writes local time, no year)."""
    m = KLOG_TS.match(line)
    if m is None:
        return None
    mo, d, h, mi, sec, us = (int(x) for x in m.groups())
    return calendar.timegm((time.gmtime().tm_year, mo, d, h, mi, sec, 0, 0, 0)) + us / 1e6


def host_trial_pods(node: HostNode) -> list[dict[str, Any]]:
    """The trial's pods before the leak, as in the single-agent trial: an LS pod holding
    100 MiB, BE pods holding 200, 150 and 100 MiB; never restarted (a killed container stays
    down, so both agents' victims are counted the same way)."""
    res = {"requests": {"cpu": "10m", "memory": "128Mi"}, "limits": {"cpu": "1", "memory": "256Mi"}}
    pods = [node.pod_manifest("web", LS, resources=res, command=hold(100))]
    pods += [node.pod_manifest(f"hold-{n}", BE, command=hold(n)) for n in (200, 150, 100)]
    for m in pods:
        m["spec"]["restartPolicy"] = "Never"
    return pods


def container_ids(node: HostNode) -> dict[str, str]:
    """Each running pod's container, by pod name (the runtime's id, from the pod's status)."""
    out = {}
    for p in node.core().list_namespaced_pod("default").items:
        for c in p.status.container_statuses or []:
            if c.container_id:
                out[p.metadata.name] = c.container_id.split("://", 1)[-1]
    return out


def pod_dirs(node: HostNode, root: Path) -> dict[str, Path]:
    """Each pod's memory cgroup under the kubelet's pods root, by pod name."""
    out = {}
    for p in node.core().list_namespaced_pod("default").items:
        found = list(root.glob(f"**/pod{p.metadata.uid}"))
        if found:
            out[p.metadata.name] = found[0]
    return out


def fewest(sizes: dict[str, int], amount: float) -> int:
    """The fewest BE pods, largest first, whose memory covers ``amount``."""
    got = 0
    for n, size in enumerate(sorted(_be(sizes), reverse=True), 1):
        got += size
        if got >= amount:
            return n
    return 0


def host_trial(node: HostNode, agent: str, percent: int, binary: Path) -> dict[str, Any]:
    """One agent alone on the node: the trial's pods, the agent started and settled, then the
    leak; from the agent's own quantity crossing ``percent`` of the node's memory to its
    decision (its log) and to the first of the trial's containers stopped (CRI)."""
    assert node.runtime is not None
    rt = node.runtime
    root = harness.CGROUP_FS / "memory" / node.pods_root
    cap = int(node.core().read_node(node.name).status.capacity["memory"].removesuffix("Ki")) * 1024
    kills0 = oom_kills(root)
    names = node.create_pods(host_trial_pods(node))
    node.wait_running(names, 120)
    log = node.base / f"{agent}.log"
    offset = log.stat().st_size if log.exists() else 0
    proc: subprocess.Popen[bytes] | None = None
    k: koordlet.Koordlet | None = None
    out: dict[str, Any] = {"agent": agent, "percent": percent, "capacity_mib": cap / MiB}
    try:
        if agent == "nriplugin":
            proc, _ = nriplugin_on(node, len(names), log)
            trigger = int(min(cap, int((root / "memory.limit_in_bytes").read_text())) * percent / 100)
        else:
            k = koordlet.Koordlet(binary, node, feature_gates=KOORDLET_EVICT_GATES)
            offset = k.log.stat().st_size if k.log.exists() else 0
            log = k.log
            k.start()
            out["registered_s"] = k.wait_registered(120)
            trigger = cap * percent // 100
        time.sleep(5)  # settled: koordlet's collectors have a second's samples of node and pods
        dirs = pod_dirs(node, root)
        sizes = {n: anon(d) for n, d in dirs.items()}
        out["node_used_mib"] = node_used() / MiB
        out["pods_mib"] = int((root / "memory.usage_in_bytes").read_text()) / MiB
        crossing: Crossing | NodeCrossing = Crossing(root, trigger) if agent == "nriplugin" else NodeCrossing(trigger)
        node.create_pods([_never(node.pod_manifest("leaky", BE, command=GROW_TERM))])
        until(lambda: "leaky" in container_ids(node), 60, "the leaking pod running")
        ids, dirs = container_ids(node), pod_dirs(node, root)
        peak, peak_node, stopped, before = watch(rt, root, crossing, sizes, dirs["leaky"], ids, 240)
        crossing.close()
        down = [n for n, c in ids.items() if not running(rt, c)]
        with log.open("rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
        decided, amount = _decision(agent, text)
        at = crossing.at
        out |= {
            "crossed": at,
            "decision_s": None if decided is None or at is None else decided - at,
            "stopped_s": None if stopped is None or at is None else stopped - at,
            "evicted": down,
            "fewest": fewest(before or sizes, amount),
            "release_mib": amount / MiB,
            "sizes_mib": {n: round(v / MiB) for n, v in (before or sizes).items()},
            "peak_pods_mib": peak / MiB,
            "peak_node_mib": peak_node / MiB,
            "trigger_mib": trigger / MiB,
            "oom_kills": oom_kills(root) - kills0,
            "ls_running": "web" not in down,
        }
        return out
    finally:
        stop_agent(proc, k)
        node.kubectl("delete", "pods", "--all", "-n", "default", "--wait=true", "--timeout=120s", timeout=180)


def _never(m: dict[str, Any]) -> dict[str, Any]:
    m["spec"]["restartPolicy"] = "Never"
    return m


def _decision(agent: str, text: str) -> tuple[float | None, float]:
    """The agent's first eviction decision (wall time) and the release it computed (bytes)."""
    if agent == "nriplugin":
        lines = [json.loads(ln) for ln in text.splitlines() if ln.startswith("{")]
        evicting = [ln for ln in lines if str(ln.get("msg", "")).startswith("evicting ")]
        amount = 0.0
        for ln in lines:
            m = re.search(r"= (\d+) MiB$", str(ln.get("msg", "")))
            if str(ln.get("msg", "")).startswith("MemoryEvict: pods use") and m:
                amount = float(m.group(1)) * MiB
                break
        return (wall(evicting[0]["ts"]) if evicting else None), amount
    for line in text.splitlines():
        if "memoryEvict by usedTresholdPercent start to evict" in line:
            m = re.search(r"start to evict (\d+)", line)
            return klog_wall(line), float(m.group(1)) if m else 0.0
    return None, 0.0


def choose_percent(headroom: int = HEADROOM) -> int:
    """The round's memoryEvictThresholdPercent: the node's use now, the trial's holders (550
    MiB) and ``headroom`` under it, so koordlet's node-wide quantity crosses it only once the
    leak has grown (nriplugin's pods-only quantity crosses it later, on the same pods)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(-(-(node_used() + 550 * MiB + headroom) * 100 // total))


def beside_koordlet(rounds: int) -> dict[str, Any]:
    binary = koordlet.build()
    node = HostNode(nodeslo_spec={"resourceUsedThresholdWithBE": {"enable": True}}, max_pods=30)
    out: dict[str, Any] = {"rounds": rounds, "nriplugin": [], "koordlet": [], "order": []}
    try:
        node.start()
        for r in range(rounds):
            order = ("nriplugin", "koordlet") if r % 2 == 0 else ("koordlet", "nriplugin")
            out["order"].append(order[0])
            percent = choose_percent()
            node.write_nodeslo(
                {"resourceUsedThresholdWithBE": {"enable": True, "memoryEvictThresholdPercent": percent}}
            )
            for name in order:
                t = host_trial(node, name, percent, binary)
                out[name].append(t)
                print(f"round {r + 1}/{rounds} {name}: {t}", file=sys.stderr, flush=True)
    finally:
        node.stop()
    return out


def timed(t: dict[str, Any]) -> bool:
    """Whether the trial's crossing came from the leak: the agent's quantity was under the
    threshold when the leak started (else the machine's other use had crossed it already, and
    what the agent did then is counted but not timed)."""
    before = t["pods_mib"] if t["agent"] == "nriplugin" else t["node_used_mib"]
    return bool(before < t["trigger_mib"])


def _ms(ts: list[dict[str, Any]], key: str) -> str:
    xs = [t[key] * 1e3 for t in ts if t[key] is not None and timed(t)]
    if not xs:
        return "-"
    return f"{statistics.median(xs):.0f} ({min(xs):.0f}..{max(xs):.0f})"


def write_beside_section(path: Path, r: dict[str, Any], cmd: str, head: str) -> None:
    both = [t for a in ("nriplugin", "koordlet") for t in r[a]]

    def rat(key: str) -> str:
        """koordlet / nriplugin over the rounds where both have a positive figure."""
        pairs = enumerate(zip(r["nriplugin"], r["koordlet"], strict=True))
        keep = [i for i, (t, u) in pairs if t[key] and u[key] and timed(t) and timed(u)]
        if not keep or any(r["nriplugin"][i][key] <= 0 for i in keep):
            return "-"
        x, lo, hi = ratio({a: [r[a][i] for i in keep] for a in ("nriplugin", "koordlet")}, key)
        return f"{x:.2f}x ({lo:.2f}..{hi:.2f})"

    rows = "\n".join(
        f"| {i // 2 + 1} | {t['agent']} | {t['percent']} % = {t['trigger_mib']:.0f} MiB | {t['node_used_mib']:.0f} / "
        f"{t['pods_mib']:.0f} | "
        + (f"{t['decision_s'] * 1e3:.0f}" if t["decision_s"] is not None and timed(t) else "not timed")
        + " | "
        + (f"{t['stopped_s'] * 1e3:.0f}" if t["stopped_s"] is not None and timed(t) else "not timed")
        + f" | {', '.join(t['evicted']) or '-'} | {len(t['evicted'])} / {t['fewest']} | {t['release_mib']:.0f} | "
        f"{t['peak_pods_mib']:.0f} / {t['peak_node_mib']:.0f} | {t['oom_kills']} |"
        for i, t in enumerate(t for pair in zip(r["nriplugin"], r["koordlet"], strict=True) for t in pair)
    )

    n_timed = " / ".join(str(sum(timed(t) for t in r[a])) for a in ("nriplugin", "koordlet"))

    def extra(a: str) -> int:
        return max((len(t["evicted"]) - t["fewest"] for t in r[a]), default=0)

    def ooms(a: str) -> int:
        return sum(t["oom_kills"] for t in r[a])

    def kept(a: str) -> str:
        return "yes" if all(t["ls_running"] for t in r[a]) else "NO"

    summary = "\n".join(
        f"| {label} | {ours} | {theirs} | {x} |"
        for label, ours, theirs, x in (
            (
                f"crossing -> decision, median (min..max) over the timed trials ({n_timed})",
                _ms(r["nriplugin"], "decision_s") + " ms",
                _ms(r["koordlet"], "decision_s") + " ms",
                rat("decision_s"),
            ),
            (
                "crossing -> victim stopped, median (min..max), same trials",
                _ms(r["nriplugin"], "stopped_s") + " ms",
                _ms(r["koordlet"], "stopped_s") + " ms",
                rat("stopped_s"),
            ),
            (
                "pods evicted beyond the fewest covering the agent's own release (worst trial)",
                str(extra("nriplugin")),
                str(extra("koordlet")),
                "",
            ),
            ("OOM kills in the pods root, all trials", str(ooms("nriplugin")), str(ooms("koordlet")), ""),
            ("LS pod kept running", kept("nriplugin"), kept("koordlet"), ""),
        )
    )
    section = f"""<!-- evict_koordlet:begin -->
## MemoryEvict beside koordlet, same node (`bench/evict.py --beside koordlet`)

Command: `flock -x /tmp/nriplugin-cpu.lock .venv/bin/python -m {cmd}` ({os.cpu_count()} CPUs shared
with other work, {time.strftime("%Y-%m-%d")}), commit `{head}`. The host-process node of the
footprint row (`testkit/hostnode.py`: kubelet v1.35.4, cgroupfs, cgroup v1, containerd 2.4.2;
no pods-root limit: the kubelet's allocatable is the node's {both[0]["capacity_mib"]:.0f} MiB).
{r["rounds"]} rounds; in each, nriplugin and koordlet run alone one after the other (first in
the round alternating), each on a trial of its own with the same pods created through the API
server (`restartPolicy: Never`): an LS pod holding 100 MiB, BE pods holding 200, 150 and 100 MiB,
the agent started and settled 5 s, then a BE pod growing about 30 MB/s that exits on SIGTERM,
as a real program would (nriplugin stops a victim with a 5 s grace period, koordlet with none;
in a smoke run with the section above's leak, whose shell as PID 1 ignores SIGTERM, nriplugin's
victim stopped 5.4 s after the crossing, at the end of its grace). The pods are deleted after
each trial.

One NodeSLO for both, written directly before each round:
`resourceUsedThresholdWithBE: {{enable: true, memoryEvictThresholdPercent: P}}` (the lower mark
left to both agents' default, P - 2). What each does with it: **nriplugin** (`nriplugin run`,
embedded default policy, `--cluster on`) compares the pods root's working set with P % of
min(MemTotal, the pods root's limit) (here MemTotal), woken by the kernel's usage threshold on
the pods root, releases 1.3 x (use - (P - 2) %), leaking pods first, and evicts through the API
server; **koordlet** v1.8.0 (`-feature-gates={KOORDLET_EVICT_GATES}`: its BE memory eviction,
which is what nriplugin's MemoryEvict does; its `MemoryEvict` gate takes pods by priority
class instead) compares the node's use, MemTotal - MemAvailable, with P % of the Node's
capacity every second (`-memory-evict-interval-seconds` 1, 4 s cool-down), releases
capacity x (use % - (P - 2) %), BE pods by memory used, largest first, and stops their
containers through CRI with no grace (`-only-evict-by-api` false, its default).

The same threshold on the same quantity is not possible: koordlet's quantity is node-wide
(kubelet, API server, etcd, containerd and the other workers of this machine included), and
P % of the node is the only threshold it has; nriplugin's is what the pods use. P is set each
round to the node's use then, plus the holders, plus {HEADROOM // MiB} MiB, so koordlet's crossing
comes from the leak and not from the machine's other work; nriplugin's crossing of the same P
comes later, once the pods alone reach it. Each agent is timed from its own quantity's
crossing: nriplugin's from the kernel's notification (the bench's own eventfd on the pods
root, as in the section above), koordlet's from /proc/meminfo polled every 10 ms by the bench
(nothing notifies a node-wide MemAvailable). Decision: nriplugin's `evicting` log line (ms),
koordlet's `memoryEvict by usedTresholdPercent start to evict` line (klog, µs); stopped: the
first of the trial's containers seen not running through CRI (polled every 10 ms). A trial
whose agent's quantity was over P already when the leak started (the machine's other use rose
after P was chosen) is not timed; what its agent evicted is counted all the same.

| | nriplugin | koordlet | koordlet / nriplugin |
|---|---|---|---|
{summary}

{TRIAL_HEAD}
{rows}

The ratio is koordlet / nriplugin of the medians over the rounds where both were timed, with
its 95 % bootstrap interval over those rounds (with two such rounds it spans no more than
their two ratios).
<!-- evict_koordlet:end -->
"""
    replace_section(path, "evict_koordlet", section)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--limit-mib", type=int, default=1024)
    ap.add_argument("--write", type=Path)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--beside", choices=["koordlet"], help="measure beside this peer on a host-process node")
    ap.add_argument("--rounds", type=int, default=4, help="with --beside: rounds, each agent once per round")
    args = ap.parse_args()
    if os.geteuid() != 0 or not (harness.CGROUP_FS / "memory" / "cgroup.event_control").exists():
        print("needs root and cgroup v1 (containerd, cgroups)", file=sys.stderr)
        return 2
    if args.beside == "koordlet":
        return beside_main(
            "bench.evict", lambda: beside_koordlet(args.rounds), write_beside_section, args.json, args.write
        )
    trials = []
    for _ in range(args.trials):
        rt = harness.Containerd(harness.install(), Path(tempfile.mkdtemp(prefix="nriplugin-bench-")))
        try:
            rt.start()
            rt.import_images()
            trials.append(trial(rt, args.limit_mib))
        finally:
            rt.teardown()
        print(trials[-1], flush=True)
    s = summarize(trials)
    print(s)
    if args.json:
        args.json.write_text(json.dumps({"trials": trials, "summary": s}, indent=1))
    if args.write:
        write_section(args.write, trials, s, shown_command("bench.evict", sys.argv[1:]), args.limit_mib)
    return 0


if __name__ == "__main__":
    sys.exit(main())
