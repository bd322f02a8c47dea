"""``bench/colocation.py --beside koordlet``: the colocation headline with nriplugin and
Koordinator's koordlet v1.8.0 on the same node in the same run (issue 56).

Why a kubelet node and not the bench's own pod layout: koordlet reads its pods from a kubelet
and its NodeSLO from an API server, so both agents run on one host-process Kubernetes node
(``testkit/hostnode.py``: a real kubelet, cgroupfs driver, cgroup v1, on the private
containerd 2.4), and the workloads are kubelet pods created through the API server: the LS
server (Burstable, requesting one core, no limit, host network), the two BE workers
(BestEffort, labelled BE, their counters on a hostPath), the ``coloc`` image imported into
the node's containerd (nothing is pulled). The load generator, BE's reference, the windows
and the pooling are ``bench/colocation.py``'s, unchanged.

Configurations, each on fresh pods (deleted and made again, the kubelet's QoS groups rid of
whatever the last agent wrote there: quota, cpuset, ``cpu.idle``), alternating by round:
``alone`` (LS only), ``no-agent``, ``nriplugin`` (``nriplugin run`` with its embedded default
and its cluster side on), ``koordlet-cpuset`` (BECPUSuppress on, its default policy),
``koordlet-quota`` (the same NodeSLO with ``cpuSuppressPolicy: cfsQuota``), ``be-alone``
(BE's reference). An agent starts once the pods run (koordlet registers with NRI only once a
pod is on the node) and is measured once it has them: nriplugin when its reconciler holds
them, koordlet when the runtime has its NRI plugin connected. Each agent runs alone.
"""

from __future__ import annotations

import argparse
import functools
import json
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import colocation as co
from bench.footprint import KOORDLET_GATES, NODESLO, nriplugin_on
from bench.footprint import stop as stop_agent
from bench.report import replace_section
from bench.rounds import interval
from testkit import containerd as harness
from testkit import koordlet
from testkit.hostnode import HostNode, until
from testkit.plugin import free_port, scrape

# koordlet's own default policy is cpuset; nriplugin's (no cpuSuppressPolicy) is cfsQuota
QUOTA_NODESLO = {
    "resourceUsedThresholdWithBE": {**NODESLO["resourceUsedThresholdWithBE"], "cpuSuppressPolicy": "cfsQuota"}
}


@dataclass(frozen=True)
class Beside(co.Config):
    who: str = ""  # the agent: "nriplugin", "koordlet" or "" (none)
    nodeslo: Mapping[str, Any] = field(default_factory=lambda: NODESLO)


CONFIGS = [
    Beside("alone", be=False),
    Beside("no-agent"),
    Beside("nriplugin", agent=True, who="nriplugin"),
    Beside("koordlet-cpuset", agent=True, who="koordlet"),
    Beside("koordlet-quota", agent=True, who="koordlet", nodeslo=QUOTA_NODESLO),
    Beside("be-alone", load=False),
    # not in the default run: nriplugin with LS alone (what the agent costs LS without BE)
    Beside("nriplugin-alone", be=False, agent=True, who="nriplugin"),
]
KOORDLETS = ("koordlet-cpuset", "koordlet-quota")
QOS_GROUPS = ((), ("burstable",), ("besteffort",))  # the kubelet's, under kubepods


@dataclass
class Host:
    """The node, the bench's settings on its runtime, and the koordlet binary."""

    node: HostNode
    bench: co.Bench
    koordlet: Path


def cpus_of(text: str) -> int:
    """How many CPUs a cpuset list names (``0-1,3``)."""
    n = 0
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            n += int(hi or lo) - int(lo) + 1
    return n


def reset_qos_groups(h: Host) -> None:
    """The kubelet's QoS groups as the kubelet made them: no quota, every CPU, not idle (an
    agent's writes outlive it; a new pod under a narrowed cpuset would inherit it)."""
    root = harness.CGROUP_FS / "cpuset" / h.node.cgroup_root
    every = (root / "cpuset.cpus").read_text().strip()
    for parts in QOS_GROUPS:
        cpu = co.cpu_dir(h.bench.rt, "cpu", *parts)
        (cpu / "cpu.cfs_quota_us").write_text("-1")
        if (cpu / "cpu.idle").exists():
            (cpu / "cpu.idle").write_text("0")
        cs = co.cpu_dir(h.bench.rt, "cpuset", *parts)
        if cs.is_dir():
            (cs / "cpuset.cpus").write_text(every)


SCHED_IDLE = 5


def sched_policy(tid: str) -> int:
    """A task's scheduling policy (/proc/<tid>/stat's 41st field); -1 once it is gone."""
    try:
        return int(Path(f"/proc/{tid}/stat").read_text().rsplit(")", 1)[1].split()[38])
    except (OSError, IndexError, ValueError):
        return -1


def pods_gone(h: Host) -> bool:
    if h.node.core().list_namespaced_pod("default").items:
        return False
    return not any(
        d.name.startswith("pod") for parts in QOS_GROUPS for d in co.cpu_dir(h.bench.rt, "cpu", *parts).iterdir()
    )


class HostPods:
    """One configuration's pods on the host node, and its agent once they run."""

    def __init__(self, h: Host, cfg: Beside) -> None:
        self.h, self.cfg, self.b = h, cfg, h.bench
        node = h.node
        reset_qos_groups(h)
        co.side_group(self.b, "client", shares=co.MAX_SHARES)
        node.write_nodeslo(cfg.nodeslo)
        self.out = Path(tempfile.mkdtemp(prefix="coloc-", dir=node.base))
        serve = ["/bin/coloc", "serve", "-addr", f"127.0.0.1:{self.b.port}", "-iters", str(self.b.iters)]
        pods = [self.manifest("web", co.LS, serve, {"requests": {"cpu": "1"}})]
        self.kinds = cfg.kinds if cfg.be else ()
        for k in self.kinds:
            argv = ["/bin/coloc", k, *co.BE_WORKERS[k], "-out", f"/out/{k}"]
            pods.append(self.manifest(f"batch-{k}", co.BE, argv, {}))
        self.names = node.create_pods(pods)
        self.koordlet: koordlet.Koordlet | None = None
        self.agent: subprocess.Popen[bytes] | None = None
        self.port = 0
        try:
            node.wait_running(self.names, 120)
            uid = {p.metadata.name: p.metadata.uid for p in node.core().list_namespaced_pod("default").items}
            self.ls_acct = co.cpu_dir(self.b.rt, "cpuacct", "burstable", f"pod{uid['web']}")
            self.be_pods = [co.cpu_dir(self.b.rt, "cpu", "besteffort", f"pod{uid[f'batch-{k}']}") for k in self.kinds]
            co.wait_http(self.b.url)
            until(lambda: all((self.out / k).exists() for k in self.kinds), 20, "the BE workers' counters")
            if cfg.who == "nriplugin":
                self.agent, self.port = nriplugin_on(node, len(self.names), self.out / "nriplugin.log")
            elif cfg.who == "koordlet":
                self.koordlet = koordlet.Koordlet(h.koordlet, node, feature_gates=KOORDLET_GATES)
                self.koordlet.start()
                self.koordlet.wait_registered(120)
        except BaseException:
            self.close()
            raise

    def manifest(self, name: str, labels: dict[str, str], argv: list[str], res: dict[str, Any]) -> dict[str, Any]:
        m = self.h.node.pod_manifest(name, labels, resources=res, command=argv)
        c = m["spec"]["containers"][0]
        c["image"] = co.IMAGE
        c["volumeMounts"] = [{"name": "out", "mountPath": "/out"}]
        m["spec"]["volumes"] = [{"name": "out", "hostPath": {"path": str(self.out), "type": "Directory"}}]
        return m

    def counters(self) -> dict[str, tuple[int, int]]:
        out = {}
        for k in self.kinds:
            ops, ns = (self.out / k).read_text().split()
            out[k] = (int(ops), int(ns))
        return out

    def snapshot(self) -> dict[str, Any]:
        be_acct = co.cpu_dir(self.b.rt, "cpuacct", "besteffort", "cpuacct.usage")
        top = harness.CGROUP_FS / "cpuacct" / self.b.rt.cgroup_root / "cpuacct.usage"
        return {
            "t": time.time(),
            "stat": Path("/proc/stat").read_text(),
            "ls_s": int((self.ls_acct / "cpuacct.usage").read_text()) / 1e9,
            "be_s": int(be_acct.read_text()) / 1e9,
            "tree_s": int(top.read_text()) / 1e9,
            "counters": self.counters(),
        }

    def be_limit(self) -> float | None:
        """BE's limit in cores: the besteffort group's quota or the CPUs its pods may run on
        (koordlet's cpuset policy narrows the pods' cpusets), the lower; None when neither."""
        d = co.cpu_dir(self.b.rt, "cpu", "besteffort")
        q = int((d / "cpu.cfs_quota_us").read_text())
        limits = [q / int((d / "cpu.cfs_period_us").read_text())] if q > 0 else []
        for pod in self.be_pods:
            cs = harness.CGROUP_FS / "cpuset" / pod.relative_to(harness.CGROUP_FS / "cpu") / "cpuset.cpus"
            if cs.exists() and (n := cpus_of(cs.read_text())) < self.b.cpus:
                limits.append(float(n))
        return min(limits) if limits else None

    def be_running(self) -> int:
        pods = self.h.node.core().list_namespaced_pod("default").items
        return sum(
            p.metadata.name.startswith("batch-") and any(c.state.running for c in p.status.container_statuses or [])
            for p in pods
        )

    def be_idle(self) -> str:
        """What the agent left on BE, read at the window's end: ``cpu.idle`` of the besteffort
        group and BE's pods, how many of BE's tasks are SCHED_IDLE, BE's containers' shares and
        CPUs, e.g. ``0/0,0 idle 6/6 shares 2,2 cpus 2,2``."""
        group = co.cpu_dir(self.b.rt, "cpu", "besteffort", "cpu.idle")
        pods = ",".join((p / "cpu.idle").read_text().strip() for p in self.be_pods if (p / "cpu.idle").exists())
        tids = [t for p in self.be_pods for f in p.rglob("tasks") for t in f.read_text().split()]
        idle = sum(sched_policy(t) == SCHED_IDLE for t in tids)
        leaves = [f.parent for p in self.be_pods for f in p.glob("*/cpu.shares")]
        shares = ",".join((d / "cpu.shares").read_text().strip() for d in leaves)
        sets = [harness.CGROUP_FS / "cpuset" / d.relative_to(harness.CGROUP_FS / "cpu") / "cpuset.cpus" for d in leaves]
        cpus = ",".join(str(cpus_of(s.read_text())) for s in sets if s.exists())
        g = group.read_text().strip() if group.exists() else "-"
        return f"{g}/{pods or '-'} idle {idle}/{len(tids)} shares {shares or '-'} cpus {cpus or '-'}"

    def evictions(self) -> float:
        return scrape(self.port, "nriplugin_qos_evictions_total") if self.agent is not None else 0.0

    def agent_lines(self, last: int = 6) -> list[str]:
        """The agent's last lines on BE's limit (why BE had what it had)."""
        marks: tuple[str, ...] = ("uppress", "evict")
        if self.agent is not None:
            log, marks = self.out / "nriplugin.log", ("BE limited to", "BE not limited", "evict")
        elif self.koordlet is not None:
            log = self.koordlet.log
        else:
            return []
        text = log.read_text(errors="replace") if log.exists() else ""
        return [ln[:400] for ln in text.splitlines() if any(m in ln for m in marks)][-last:]

    def close(self) -> None:
        """The agent stopped, the pods deleted and their cgroups gone (the kubelet's doing)."""
        try:
            if self.agent is not None:
                stop_agent(self.agent)
            if self.koordlet is not None:
                self.koordlet.stop()
        finally:
            self.h.node.kubectl("delete", "pods", "--all", "--grace-period=0", "--force", "--wait=false")
            until(lambda: pods_gone(self.h), 90, "the configuration's pods and their cgroups gone", 0.5)


def run_one(h: Host, rates: list[float]) -> Callable[[co.Config], list[dict[str, Any]]]:
    def one(cfg: co.Config) -> list[dict[str, Any]]:
        assert isinstance(cfg, Beside)
        pods = HostPods(h, cfg)
        try:
            return [co.measure(h.bench, pods, r) for r in (rates if cfg.load else [None])]
        finally:
            pods.close()

    return one


# ratios koordlet / nriplugin over rounds ----------------------------------------------------------

FIGURES = (  # key in pooled(), label, higher is better, format
    ("ls_p50_ms", "LS p50", False, "{:.2f} ms"),
    ("ls_p99_ms", "LS p99", False, "{:.2f} ms"),
    ("ls_p999_ms", "LS p99.9", False, "{:.2f} ms"),
    ("node_cpu_util", "node CPU", True, "{:.0%}"),
    ("be_throughput", "BE throughput (of BE alone)", True, "{:.0%}"),
)


def paired_ratio(
    raw: dict[str, list[list[dict[str, Any]]]], ours: str, theirs: str, level: int, key: str, stall_lag_ms: float
) -> tuple[float, float, float]:
    """``theirs / ours`` on one pooled figure at one level, over every round, and its 95 %
    interval resampling rounds (the same rounds for both: they ran side by side)."""
    ref_rounds = raw.get("be-alone", [[]])[0]
    reference = co.pooled(ref_rounds, {})["be_ops_s"] if ref_rounds else {}
    a, b = raw[ours][level], raw[theirs][level]
    n = min(len(a), len(b))

    @functools.cache
    def figure(side: str, picks: tuple[int, ...]) -> float:
        rounds = [(a if side == "a" else b)[i] for i in picks]
        v = co.pooled(rounds, reference, stall_lag_ms)[key]
        return float(v) if v is not None else float("nan")

    def stat(picks: list[int]) -> float:
        p = tuple(sorted(picks))
        return figure("b", p) / max(figure("a", p), 1e-9)

    lo, hi = interval(n, stat)
    return stat(list(range(n))), lo, hi


def ratios(raw: dict[str, list[list[dict[str, Any]]]], stall_lag_ms: float) -> dict[str, Any]:
    """ratios[koordlet config][level][key] = (ratio, low, high), koordlet / nriplugin."""
    if "nriplugin" not in raw:
        return {}  # a --configs subset without it: nothing to compare
    levels = len(raw["nriplugin"])
    return {
        k: [
            {key: paired_ratio(raw, "nriplugin", k, lv, key, stall_lag_ms) for key, *_ in FIGURES}
            for lv in range(levels)
        ]
        for k in KOORDLETS
        if k in raw
    }


# the section and the summary table's rows ------------------------------------------------------------

ANCHOR = "colocation-beside-koordlet-same-node-benchcolocationpy---beside-koordlet"
ROW = "| LS p50 / p99 / p99.9, node CPU, BE throughput"  # the summary table's placeholder row


def fmt(key: str, v: float | None) -> str:
    if v is None:
        return "-"
    return next(f for k, _, _, f in FIGURES if k == key).format(v)


def summary_rows(s: dict[str, Any], cmd: str, head: str) -> list[str]:
    """The 'Beside koordlet' table's rows: each figure at each level, nriplugin beside koordlet's
    two policies, with the ratio and its interval."""
    rows = []
    short = cmd.replace("python -m bench.colocation", "colocation.py").split(" --write")[0]
    for lv, level in enumerate(("moderate", "knee")):
        cf = {n: (c if lv == 0 else c.get("knee")) for n, c in s["configs"].items()}
        if cf.get("nriplugin") is None:
            continue
        for i, (key, label, higher, _) in enumerate(FIGURES):
            name = f"{label}, {level} load ({cf['nriplugin']['rate_rps']:.0f}/s)"
            name += " (higher is better: below 1, nriplugin ahead)" if higher else ""
            first = lv == 0 and i == 0
            row = f"[{name}](#{ANCHOR})" if first else name
            theirs = "; ".join(f"{k.split('-')[1]} {fmt(key, cf[k][key])}" for k in KOORDLETS if cf.get(k))
            r = "; ".join(
                f"{k.split('-')[1]} {x:.2f}x ({lo:.2f}..{hi:.2f})"
                for k in KOORDLETS
                if k in s["ratios"]
                for x, lo, hi in [s["ratios"][k][lv][key]]
            )
            bench = f"`bench/{short}`" if first else "same"
            rows.append(f"| {row} | {bench} | {fmt(key, cf['nriplugin'][key])} | {theirs} | {r} | `{head}` |")
    return rows


def replace_rows(path: Path, rows: list[str]) -> None:
    """Put ``rows`` where the placeholder row or the last run's rows are in the summary table."""
    lines = path.read_text().splitlines()
    at = [i for i, ln in enumerate(lines) if ln.startswith(ROW) or (ln.startswith("| [LS p50, ") and ANCHOR in ln)]
    if not at:
        raise ValueError(f"{path}: no '{ROW}' row nor this section's rows in the summary table")
    i = j = at[0]
    j += 1
    while j < len(lines) and lines[j].split(" | ")[1:2] == ["same"]:
        j += 1  # the last run's rows after the first
    path.write_text("\n".join([*lines[:i], *rows, *lines[j:]]) + "\n")


def write_section(path: Path, s: dict[str, Any]) -> None:
    cfgs = s["configs"]
    knee = cfgs["nriplugin"]["knee"]["rate_rps"] if "knee" in cfgs["nriplugin"] else 0
    ref = ", ".join(f"{k} {v:.0f}" for k, v in s["be_alone"]["be_ops_s"].items())
    slo = json.dumps(NODESLO["resourceUsedThresholdWithBE"]).replace('"', "")
    rat = []
    for lv, level in enumerate(("moderate", "knee")):
        for k in s["ratios"]:
            parts = [f"{x:.2f}x ({lo:.2f}..{hi:.2f})" for key, *_ in FIGURES for x, lo, hi in [s["ratios"][k][lv][key]]]
            rat.append(f"| {k} / nriplugin, {level} | " + " | ".join(parts) + " |")
    pooled = (
        f" but those in which the host stalled the generator (send lag p99 above {s['stall_lag_ms']:g} ms)"
        if s["stall_lag_ms"]
        else " (none left out: an agent's own work may delay the generator too, so its lateness counts as LS"
        " latency and shows as send lag)"
    )
    head = "| | " + " | ".join(label for _, label, *_ in FIGURES) + " |"
    section = f"""<!-- colocation_koordlet:begin -->
## Colocation beside koordlet, same node (`bench/colocation.py --beside koordlet`)

Command: `flock -x /tmp/nriplugin-cpu.lock .venv/bin/{s["command"]}` ({s["cpus"]} CPUs,
{s["date"]}), commit `{s["commit"]}`; {s["minutes"]:.0f} minutes measured. One host-process
Kubernetes node (`testkit/hostnode.py`: kubelet v1.35.4, cgroupfs driver, cgroup v1, on the
private containerd 2.4 with NRI; etcd and kube-apiserver on loopback); the workloads of
`bench/colocation.py` as kubelet pods created through the API server, the `coloc` image
imported into the node's containerd: LS, an HTTP server (Burstable, requesting one core, no
limit, host network) doing {s["work_us"]} µs of table-walking work per request, driven open-loop at
a constant rate by the generator on the host (its own cgroup beside `kubepods`, top CPU weight);
BE, a CPU-bound pod (2 threads) and a cache-thrashing pod (64 MiB), BestEffort, labelled
`koordinator.sh/qosClass: BE`. Per request the node spends {s["cost_ms"]:.2f} ms of CPU (LS alone),
so the levels are {s["rates"][0]:.0f} and {knee:.0f} requests/s ({" and ".join(f"{x:g}" for x in s["load"])}
of the node's CPUs unless `--rates`). {s["rounds"]} rounds, configurations alternating (order
reversed every other round), each on fresh pods (deleted and created again; the kubelet's QoS
groups rid of any quota, cpuset or `cpu.idle` an agent left); an agent started once the pods run
and measured once it has them (nriplugin: its reconciler holds them; koordlet: the runtime has its
NRI plugin connected), each agent alone on the node. Per level {s["warmup"]:g} s of warm-up
then a {s["seconds"]:g} s window; percentiles over every request of every window{pooled}; node CPU from
/proc/stat (the whole host: the control plane and the agent included); BE throughput is the
workers' ops/s as a share of BE alone on the node ({ref}).

Both agents read the same NodeSLO, written directly (no koord-manager):
`resourceUsedThresholdWithBE: {slo}`, koordlet's default threshold. What each does with it:
- **nriplugin** (`nriplugin run` as `bench/footprint.py --beside koordlet` starts it: embedded
  default policy, `--cluster on`, NodeSLO watched): the NodeSLO is a layer over its default; with
  `enable` its QoS manager takes the lower of two BE budgets, its own pressure levels' and the
  NodeSLO's `65 % of the node - non-BE usage`, applied with its default policy, cfsQuota on the
  besteffort group (no `cpuSuppressPolicy` in the NodeSLO), checked every 1 s and on its 50 ms
  fast path; BE's tasks SCHED_IDLE and its groups at the lowest weight (its default
  `resourceQOSStrategy`); its own default threshold is 90 %, the NodeSLO's 65 wins.
- **koordlet v1.8.0** (`testkit/koordlet.py`: host mode, `-feature-gates={KOORDLET_GATES}` over
  its defaults, NRI plugin registered): every 1 s, BE's budget `65 % of the node - non-BE usage`;
  `koordlet-cpuset`: the NodeSLO above, its default policy cpuset (BE's pods and containers
  narrowed to that many whole CPUs); `koordlet-quota`: the same NodeSLO with
  `cpuSuppressPolicy: cfsQuota` (the besteffort group's quota).

Moderate load, {cfgs["alone"]["rate_rps"]:.0f} requests/s:

{co.table(cfgs, knee=False)}

Near the knee, {knee:.0f} requests/s:

{co.table(cfgs, knee=True)}

koordlet / nriplugin, pooled figures over the rounds, 95 % interval resampling rounds (above 1 on
latency and below 1 on node CPU and BE throughput: nriplugin ahead):

{head}
|---|{"---|" * len(FIGURES)}
{chr(10).join(rat)}
<!-- colocation_koordlet:end -->
"""
    replace_section(path, "colocation_koordlet", section)


def report(args: argparse.Namespace, raw: dict[str, list[list[dict[str, Any]]]], s: dict[str, Any]) -> int:
    s["ratios"] = ratios(raw, s["stall_lag_ms"])
    if args.write:
        write_section(args.write, s)
        replace_rows(args.write, summary_rows(s, s["command"], s["commit"]))
    print(json.dumps({k: v for k, v in s.items() if k != "configs"} | {"configs": s["configs"]}))
    return 0


def main(args: argparse.Namespace) -> int:
    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        raw = saved["raw"]
        s = co.summarize(raw, args.stall_lag_ms)
        s.update({k: v for k, v in saved["summary"].items() if k not in s and k != "ratios"}, resummarized=True)
        return report(args, raw, s)
    signal.signal(signal.SIGTERM, co.stop)
    signal.signal(signal.SIGINT, co.stop)
    configs: list[co.Config] = [c for c in CONFIGS if c.name != "nriplugin-alone"]
    if args.configs:
        configs = [c for c in CONFIGS if c.name in args.configs.split(",")]
    binary = co.go_binary()
    iters = co.calibrate(binary, args.work_us)
    peer = koordlet.build()
    node = HostNode(nodeslo_spec=NODESLO, max_pods=20)
    t0 = time.monotonic()
    try:
        node.start()
        assert node.runtime is not None
        co.import_image(node.runtime, binary)
        h = Host(node, co.Bench(node.runtime, binary, iters, free_port(), args.warmup, args.seconds), peer)
        rates, cost = co.calibrate_rates(h.bench, args.load, lambda: HostPods(h, Beside("calibrate", be=False)))
        rates = args.rates or rates
        print(f"LS work {iters} iterations ({args.work_us} µs), {cost * 1e3:.2f} ms CPU per request; rates {rates}")
        t0 = time.monotonic()
        raw = co.run(h.bench, configs, rates, args.rounds, run_one(h, rates))
        minutes = (time.monotonic() - t0) / 60
    finally:
        node.stop()
    s = co.run_summary(args, raw, h.bench, iters, cost, rates)
    s.update(load=args.load, minutes=minutes, stall_lag_ms=args.stall_lag_ms, koordlet_gates=KOORDLET_GATES)
    if args.json:
        args.json.write_text(json.dumps({"summary": s, "raw": raw}))
    return report(args, raw, s)
