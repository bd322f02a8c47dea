"""Colocation's headline: LS tail latency, node CPU utilization and BE progress, with real
workloads on the private containerd 1.7 and the host's cgroup v1 tree, with the agent and
without it.

The workloads (``bench/colocation/main.go``, one static Go binary built with the machine's Go,
no cgo, cached under ``~/.cache/nriplugin/colocation``; put into a locally built image on top of
busybox's layer):
- LS: an HTTP server in an LS pod (Burstable, requesting one core: ``cpu.shares`` 1024, no
  limit; host network) doing a fixed amount of work per request: ``--work-us`` (1000) µs of a
  dependent chain of loads from a 1 MiB table, the iteration count calibrated once on the host
  and then fixed for every configuration, so a request needs the CPU and keeps a cache footprint;
- the load: an open-loop, constant-rate generator on the host (``coloc load``): request i is due
  at start + i/rate and sent then, whether or not earlier ones returned, and its latency is
  counted from the time it was due (no coordinated omission); a request not answered within
  5 s is an error, counted and kept in the percentiles at the time it failed. It stands in for
  a remote client, so it runs where the node's pods do not compete with it: its own cgroup
  beside ``kubepods`` (``<top>/client``) with cgroup v1's highest CPU weight. In the root
  cgroup it competed with the whole ``kubepods`` entity, and a BE group released from its
  quota at each period's start ran its slice before the woken generator: 2-4 ms of send lag
  wherever the agent held BE under a quota, counted as LS latency;
- BE: two BestEffort pods labelled BE (``cpu.shares`` 2, as kubelet gives them): a CPU-bound
  worker (2 threads of xorshift) and a memory/cache-heavy one (random cache-line
  read-modify-writes over 64 MiB), each writing its bogo-ops counter to a file the bench reads
  at the edges of the window. ``be_throughput`` is their mean ops/s as a share of what they do
  with the node to themselves (the ``be-alone`` step: the LS server up but idle, no agent).

The node is laid out as kubelet does it (its cgroupfs driver): ``kubepods`` with ``cpu.shares``
of the node's allocatable (1024 per CPU), ``kubepods/burstable`` with the LS request (1024),
``kubepods/besteffort`` with 2. Configurations, each on a fresh node (pods removed, the pods'
cgroup tree removed and laid out again, a new agent), in one run, alternating by round (the
order reversed every other round):
- ``alone``: the LS pod only;
- ``no-agent``: LS + BE, the CRI resources the pods ask for and nothing else;
- ``agent``: LS + BE with the agent started as users run it (``nriplugin run`` on the runtime's
  NRI socket, before the pods), its embedded default policy (the ``balanced`` profile);
- ``latency-first``, ``throughput-first``: the same with a policy file that only names the
  profile;
- two levers the agent's policy already has: ``agent+idle``, the default with
  ``cpuPolicy: coreSched`` (BE's cgroups get ``cpu.idle`` 1: SCHED_IDLE), and ``idle-only``,
  the same with the QoS manager off (BE as SCHED_IDLE and no quota: all the CPU LS leaves);
  and ``budget90``, the usage budget at 90 % of the node with LS's whole request reserved
  (``reserveLSRequestFrom: LOW``) and CPUEvict off;
  ``agent-cpu-only`` and ``agent-mem-only``, the default with one of the two BE workers only
  (which of them costs LS its tail);
  ``agent-noidle``, the default with BE at its lowest weight only, its tasks not SCHED_IDLE
  (``beProcess.schedIdle: false``); ``agent-quota``, the default with a quota at every level
  (``quotaFrom: LOW``; the default gives BE's idle group none below HIGH); ``seed``, the
  default before f939fa8: the level's bound reserving LS's whole request at every level
  (``reserveLSRequestFrom: LOW``) and koordlet's 65 % usage budget;
  ``idle-noquota`` (and ``-cpu``, ``-mem``: one BE worker), the default with the CPU level's
  boundaries at 97-100, so BE's group runs SCHED_IDLE and in practice never gets a quota;
  ``agent-cpuset``, the default with the cpuset suppression policy (BE on whole CPUs, no quota);
- ``be-alone``: BE's reference throughput (above), no load.
Each LS configuration is measured at two load levels, one after the other on the same pods: a
moderate one and one near the knee, by default ``--load`` 0.35 and 0.7 of the node's CPUs at
the per-request CPU cost measured at start (LS container plus load generator, LS alone), or
``--rates`` in requests per second. A level runs ``--warmup`` seconds (the agent settles) and
then the ``--seconds`` window (60) that is measured: latency percentiles of the requests due in
the window, node CPU utilization from /proc/stat (busy = user+nice+system+irq+softirq over all
but steal), BE ops/s, LS's and BE's cores (cpuacct), BE's limit (the besteffort group's quota,
sampled every 0.5 s). Rounds are pooled: percentiles over every request of every window, the
rest averaged, leaving out a window in which the host stalled the load generator (its send lag
p99 above ``--stall-lag-ms``, 3 ms: the generator has the top CPU weight on the node, so its
lateness is the host's doing, and such a window measures the host, not LS beside BE); the
table's *windows* column says how many were pooled. ``--from-json`` summarizes a run saved with
``--json`` again (the table, the plot, the JSON line) without measuring.

Prints one line per configuration and level as it goes and, last, one JSON line
``{"configs": {"alone": {...}, "no-agent": {...}, "agent": {...}, ...}, ...}``: each with
``ls_p50_ms``, ``ls_p99_ms``, ``ls_p999_ms``, ``node_cpu_util`` (0-1), ``be_throughput`` at the
moderate level, and the same under ``knee``. No figure is asserted.

``--isolate`` is for a shared machine only (development): the node under test (the pods, the
load generator and the agent, all in our top cgroup) gets cgroup v1's highest CPU weight against the
rest of the host, and node utilization is what that tree uses instead of /proc/stat. The agent
still sees the whole host (its usage budget counts the other work as the system's).

``--beside koordlet`` runs the same workloads as kubelet pods on a host-process Kubernetes node
beside Koordinator's koordlet: ``bench/colocation_beside.py``.

Usage (root, cgroup v1): .venv/bin/python -m bench.colocation [--seconds 60] [--rounds 2]
       [--rates R1,R2 | --load 0.35,0.7] [--configs alone,no-agent,...] [--isolate]
       [--plot bench/colocation.png] [--write BENCHMARKS.md]
       .venv/bin/python -m bench.colocation --beside koordlet [--rounds 3] [--seconds 30] [--write BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from bench.report import replace_section, shown_command
from testkit import containerd as harness
from testkit import images
from testkit.cri import msg
from testkit.plugin import PluginProcess, free_port, runtime_args

SOURCE = Path(__file__).resolve().parent / "colocation" / "main.go"
CACHE = Path(os.environ.get("NRIPLUGIN_CACHE", Path.home() / ".cache" / "nriplugin")) / "colocation"
IMAGE = "nriplugin.local/bench/coloc:1"
BE = {"koordinator.sh/qosClass": "BE"}
LS = {"koordinator.sh/qosClass": "LS"}
LS_SHARES = 1024  # the LS pod requests one core
TIMEOUT_S = 5.0  # the load generator's per-request timeout
MAX_SHARES = 262144  # cgroup v1's highest cpu.shares


# pure parts: the open-loop schedule, percentiles, /proc/stat, counters -------------------------------


@dataclass(frozen=True)
class Request:
    due: float  # seconds from the schedule's start: when the request was due
    sent: float  # when it left (late if the generator lagged)
    done: float  # when its answer (or error) came
    ok: bool


def parse_load(text: str) -> tuple[int, list[Request]]:
    """The load generator's output: ``start <unix ns>``, then ``due sent done ok`` (ns from start)."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith("start "):
        raise ValueError(f"load generator output does not begin with 'start': {text[:200]!r}")
    reqs = []
    for ln in lines[1:]:
        due, sent, done, ok = (int(x) for x in ln.split())
        reqs.append(Request(due / 1e9, sent / 1e9, done / 1e9, ok == 1))
    return int(lines[0].split()[1]), reqs


def in_window(reqs: list[Request], start: float, end: float) -> list[Request]:
    """The requests due in [start, end): the window is the schedule's, not the answers'."""
    return [r for r in reqs if start <= r.due < end]


def latencies_ms(reqs: list[Request]) -> list[float]:
    """Each request's latency from the time it was due (open loop: a late send counts too)."""
    return [(r.done - r.due) * 1e3 for r in reqs]


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0-1): the smallest value with at least q of them at or below."""
    if not values:
        return None
    s = sorted(values)
    k = math.ceil(round(q * len(s), 9)) - 1  # rounded: 0.999 * 1000 is 999.0000000000001
    return s[max(0, min(len(s) - 1, k))]


def cpu_jiffies(stat: str) -> tuple[int, int]:
    """(busy, available) jiffies of all CPUs from /proc/stat's ``cpu`` line. Busy: user, nice,
    system, irq, softirq (guest time is already inside user and nice); available: everything
    but steal (time the hypervisor gave to someone else was never the node's)."""
    line = next(ln for ln in stat.splitlines() if ln.startswith("cpu "))
    f = [int(x) for x in line.split()[1:]] + [0] * 10
    user, nice, system, idle, iowait, irq, softirq = f[:7]
    busy = user + nice + system + irq + softirq
    return busy, busy + idle + iowait


def cpu_util(stat0: str, stat1: str) -> float:
    """Node CPU utilization (0-1) between two readings of /proc/stat."""
    b0, a0 = cpu_jiffies(stat0)
    b1, a1 = cpu_jiffies(stat1)
    if a1 <= a0:
        raise ValueError("the second /proc/stat reading is not later than the first")
    return (b1 - b0) / (a1 - a0)


def counter_rate(c0: tuple[int, int], c1: tuple[int, int]) -> float:
    """Ops per second between two ``(ops, unix ns)`` readings of a worker's counter; 0 when the
    counter was not written between them (the worker stopped, e.g. evicted)."""
    if c1 == c0:
        return 0.0
    if c1[1] <= c0[1] or c1[0] < c0[0]:
        raise ValueError(f"counter readings out of order: {c0} {c1}")
    return (c1[0] - c0[0]) / ((c1[1] - c0[1]) / 1e9)


# the workloads' binary and image ----------------------------------------------------------------------


def go_binary() -> Path:
    """The static ``coloc`` binary, built once per source version (named after its hash)."""
    out = CACHE / f"coloc-{hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]}"
    if out.is_file():
        return out
    go = shutil.which("go") or "/usr/local/go/bin/go"
    if not Path(go).is_file():
        raise RuntimeError("no Go toolchain (go on PATH or /usr/local/go/bin/go) to build bench/colocation")
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".tmp{os.getpid()}")
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-buildvcs=false", "GO111MODULE": "off"}
    r = subprocess.run(
        [go, "build", "-trimpath", "-ldflags=-s -w", "-o", str(tmp), str(SOURCE)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    if r.returncode != 0:
        raise RuntimeError(f"building bench/colocation failed:\n{r.stderr[-3000:]}")
    tmp.rename(out)
    return out


def import_image(rt: harness.Containerd, binary: Path) -> None:
    busybox = images.busybox_layer(rt.pkg_root / "bin" / "busybox")
    layers = [busybox, images.files_layer({"bin/coloc": binary})]
    archive = images.oci_archive_layers(layers, IMAGE, ["/bin/coloc"], rt.base / "coloc.tar")
    rt.ctr("images", "import", str(archive))


def calibrate(binary: Path, work_us: int) -> int:
    r = subprocess.run([str(binary), "calibrate", "-us", str(work_us)], capture_output=True, text=True, timeout=60)
    return int(r.stdout.strip())


# the node: kubelet's QoS groups, the agent, the pods -------------------------------------------------


@dataclass(frozen=True)
class Config:
    name: str
    be: bool = True  # the BE pods run
    agent: bool = False  # the agent runs (started before the pods)
    policy: str = ""  # a policy file's text (merged onto the embedded default); "": none
    load: bool = True  # the LS service gets requests
    kinds: tuple[str, ...] = ("cpu", "mem")  # which BE workers run (when ``be``)


IDLE = "resourceQOSStrategy:\n  policies:\n    cpuPolicy: coreSched\n"  # BE's cgroups get cpu.idle = 1

# the usage budget at 90 % with the seed's level bound (LS's whole request reserved) and no
# CPUEvict: what ef2b8e2 measured, before 90 % became the default
BUDGET90 = (
    "resourceUsedThresholdWithBE:\n  cpuSuppressThresholdPercent: 90\n"
    "qosManager:\n  cpuEvict:\n    enabled: false\n  cpuSuppress:\n    reserveLSRequestFrom: LOW\n"
)

# the default with BE's tasks not SCHED_IDLE: BE at the kubelet's lowest weight only
NOIDLE = "beProcess:\n  schedIdle: false\n"

# the default with a quota at every level (quotaFrom LOW): the default until BE's idle group went
# without a quota below HIGH
QUOTA_ALWAYS = "qosManager:\n  cpuSuppress:\n    quotaFrom: LOW\n"

# the default until f939fa8: the level's bound reserves LS's whole request at every level (the
# seed's formula) and the usage budget is koordlet's 65 %
SEED = (
    "qosManager:\n  cpuSuppress:\n    reserveLSRequestFrom: LOW\n"
    "resourceUsedThresholdWithBE:\n  cpuSuppressThresholdPercent: 65\n"
)

# the default with the level's boundaries out of reach below a score of 97: BE's QoS-level group
# SCHED_IDLE and, in practice, never a quota (the knee's question: does the quota help LS there?)
NO_QUOTA = "qosManager:\n  cpuPressure:\n    low: 97\n    medium: 98\n    high: 99\n    critical: 100\n"

BE_WORKERS = {"cpu": ["-threads", "2"], "mem": ["-mib", "64"]}  # name: the coloc worker's arguments

CONFIGS = [
    Config("alone", be=False),
    Config("no-agent"),
    Config("agent", agent=True),
    Config("agent-noidle", agent=True, policy=NOIDLE),
    Config("agent-quota", agent=True, policy=QUOTA_ALWAYS),
    Config("seed", agent=True, policy=SEED),
    Config("latency-first", agent=True, policy="qosManager:\n  profile: latency-first\n"),
    Config("throughput-first", agent=True, policy="qosManager:\n  profile: throughput-first\n"),
    # levers (the agent's own policy knobs): BE as SCHED_IDLE with the default suppression, and alone
    Config("agent+idle", agent=True, policy=IDLE),
    Config("idle-only", agent=True, policy=IDLE + "qosManager:\n  enable: false\n"),
    Config("budget90", agent=True, policy=BUDGET90),
    Config("idle-noquota", agent=True, policy=NO_QUOTA),
    Config("idle-noquota-cpu", agent=True, policy=NO_QUOTA, kinds=("cpu",)),
    Config("idle-noquota-mem", agent=True, policy=NO_QUOTA, kinds=("mem",)),
    Config("agent-cpuset", agent=True, policy="qosManager:\n  cpuSuppress:\n    policy: cpuset\n"),
    # which BE worker costs LS its tail: the default with one of them only
    Config("agent-cpu-only", agent=True, kinds=("cpu",)),
    Config("agent-mem-only", agent=True, kinds=("mem",)),
    Config("be-alone", load=False),
]


@dataclass
class Bench:
    rt: harness.Containerd
    binary: Path  # the load generator runs it on the host
    iters: int  # LS work per request
    port: int  # the LS service's, on the host network
    warmup: float
    window: float
    isolate: bool = False  # see isolate()
    cpus: int = field(default_factory=lambda: len(os.sched_getaffinity(0)))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"


def cpu_dir(rt: harness.Containerd, controller: str, *parts: str) -> Path:
    return harness.CGROUP_FS / controller / rt.cgroup_root / "kubepods" / Path(*parts)


def pods_cgroups(rt: harness.Containerd) -> list[Path]:
    """What is left under our top-level cgroup but the runtime's own process group (containerd
    runs in it for the whole bench)."""
    own = rt.process_cgroup()
    return [
        p
        for top in harness.cgroup_dirs(rt.cgroup_root)
        for p in (top, *top.iterdir())
        if p.is_dir() and p not in (own, own.parent)
    ]


def fresh_node(b: Bench) -> None:
    """No pods, no cgroup left from the previous configuration (whatever an agent wrote there),
    and kubelet's QoS groups with kubelet's shares."""
    b.rt.remove_all_pods()
    deadline = time.monotonic() + 20
    while left := pods_cgroups(b.rt):
        harness.remove_cgroups(b.rt.cgroup_root)  # fails while a killed container's tasks exit
        if time.monotonic() > deadline:
            raise RuntimeError(f"cgroups of {b.rt.cgroup_root} still there: {left}")
        time.sleep(0.1)
    for parts, shares in (((), 1024 * b.cpus), (("burstable",), LS_SHARES), (("besteffort",), 2)):
        d = cpu_dir(b.rt, "cpu", *parts)
        d.mkdir(parents=True, exist_ok=True)
        (d / "cpu.shares").write_text(str(shares))
    side_group(b, "client", shares=MAX_SHARES)
    if b.isolate:
        (harness.CGROUP_FS / "cpu" / b.rt.cgroup_root / "cpu.shares").write_text(str(MAX_SHARES))
        side_group(b, "bench")


def side_group(b: Bench, name: str, shares: int | None = None) -> None:
    """``<top>/NAME`` beside ``kubepods``, in the cpu and cpuacct hierarchies (with ``shares``)."""
    for c in ("cpu", "cpuacct"):
        (harness.CGROUP_FS / c / b.rt.cgroup_root / name).mkdir(parents=True, exist_ok=True)
    if shares is not None:
        (harness.CGROUP_FS / "cpu" / b.rt.cgroup_root / name / "cpu.shares").write_text(str(shares))


def join(b: Bench, name: str, pid: int) -> None:
    """Process ``pid`` joins ``<top>/NAME`` in both hierarchies."""
    for c in ("cpu", "cpuacct"):
        (harness.CGROUP_FS / c / b.rt.cgroup_root / name / "cgroup.procs").write_text(str(pid))


def as_client(b: Bench, pid: int) -> None:
    """The load generator joins ``<top>/client``: the top CPU weight beside ``kubepods``, as a
    remote client's CPU would not be the node's."""
    join(b, "client", pid)


def isolate(b: Bench, pid: int) -> None:
    """With ``--isolate`` (for a shared machine): the node under test is our top cgroup, with
    the highest weight against everything else on the host; the agent joins it
    (``<top>/bench``, next to ``kubepods``), and node utilization is what that tree uses."""
    if b.isolate:
        join(b, "bench", pid)


def start_container(
    rt: harness.Containerd, pod: harness.Pod, command: list[str], shares: int, mounts: dict[Path, str]
) -> str:
    assert rt.cri is not None
    c = harness.container_config("main", shares, 0, 0, command)
    c.image.image = IMAGE
    for host, inside in mounts.items():
        c.mounts.add(container_path=inside, host_path=str(host))
    req = msg("CreateContainerRequest", pod_sandbox_id=pod.id, config=c, sandbox_config=pod.config)
    cid: str = rt.cri.call("CreateContainer", req).container_id
    rt.cri.call("StartContainer", msg("StartContainerRequest", container_id=cid))
    return cid


def wait_http(url: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


class Node:
    """One configuration on a fresh node: the agent (if any) first, then the LS pod serving,
    then the BE pods working."""

    def __init__(self, b: Bench, cfg: Config) -> None:
        self.b, self.cfg = b, cfg
        fresh_node(b)
        self.out = Path(tempfile.mkdtemp(prefix="coloc-", dir=b.rt.base))
        self.plugin: PluginProcess | None = None
        if cfg.agent:
            extra = []
            if cfg.policy:
                policy = self.out / "policy.yaml"
                policy.write_text(cfg.policy)
                extra = ["--policy", str(policy)]
            self.plugin = PluginProcess(b.rt.nri_socket, *runtime_args(b.rt), *extra)
            isolate(b, self.plugin.proc.pid)
            self.plugin.wait_ready()
        ls = b.rt.run_pod("web", "Burstable", LS)
        serve = ["/bin/coloc", "serve", "-addr", f"127.0.0.1:{b.port}", "-iters", str(b.iters)]
        start_container(b.rt, ls, serve, LS_SHARES, {})
        self.ls_acct = harness.CGROUP_FS / "cpuacct" / ls.config.linux.cgroup_parent.lstrip("/")
        wait_http(b.url)
        self.be_ids: list[str] = []
        self.be_pods: list[Path] = []  # their pod cgroups (cpu)
        if cfg.be:
            for name, cmd in ((n, c) for n, c in BE_WORKERS.items() if n in cfg.kinds):
                pod = b.rt.run_pod(f"batch-{name}", "BestEffort", BE)
                argv = ["/bin/coloc", name, *cmd, "-out", f"/out/{name}"]
                self.be_ids.append(start_container(b.rt, pod, argv, 2, {self.out: "/out"}))
                self.be_pods.append(harness.CGROUP_FS / "cpu" / pod.config.linux.cgroup_parent.lstrip("/"))
            deadline = time.monotonic() + 20
            while not all((self.out / n).exists() for n in cfg.kinds):
                if time.monotonic() > deadline:
                    raise RuntimeError("the BE workers never wrote their counters")
                time.sleep(0.1)

    def counters(self) -> dict[str, tuple[int, int]]:
        out = {}
        for n in self.cfg.kinds if self.cfg.be else ():
            ops, ns = (self.out / n).read_text().split()
            out[n] = (int(ops), int(ns))
        return out

    def be_limit(self) -> float | None:
        """BE's limit in cores (the besteffort group's quota); None when unlimited."""
        d = cpu_dir(self.b.rt, "cpu", "besteffort")
        q = int((d / "cpu.cfs_quota_us").read_text())
        return None if q < 0 else q / int((d / "cpu.cfs_period_us").read_text())

    def snapshot(self) -> dict[str, Any]:
        be_acct = cpu_dir(self.b.rt, "cpuacct", "besteffort", "cpuacct.usage")
        return {
            "t": time.time(),
            "stat": Path("/proc/stat").read_text(),
            "ls_s": int((self.ls_acct / "cpuacct.usage").read_text()) / 1e9,
            "be_s": int(be_acct.read_text()) / 1e9 if be_acct.exists() else 0.0,
            "tree_s": int((harness.CGROUP_FS / "cpuacct" / self.b.rt.cgroup_root / "cpuacct.usage").read_text()) / 1e9,
            "counters": self.counters(),
        }

    def be_idle(self) -> str:
        """``cpu.idle`` of the besteffort group and of BE's pod cgroups, e.g. ``0/1,1``: where
        SCHED_IDLE applies (the kernel compares idleness between siblings)."""
        group = cpu_dir(self.b.rt, "cpu", "besteffort", "cpu.idle")
        pods = ",".join((p / "cpu.idle").read_text().strip() for p in self.be_pods if (p / "cpu.idle").exists())
        return f"{group.read_text().strip() if group.exists() else '-'}/{pods or '-'}"

    def be_running(self) -> int:
        assert self.b.rt.cri is not None
        n = 0
        for cid in self.be_ids:
            with contextlib.suppress(Exception):
                st = self.b.rt.cri.call("ContainerStatus", msg("ContainerStatusRequest", container_id=cid))
                n += st.status.state == 1  # CONTAINER_RUNNING
        return n

    def evictions(self) -> float:
        return self.plugin.metric_sum("nriplugin_qos_evictions_total") if self.plugin is not None else 0.0

    def agent_lines(self) -> list[str]:
        return agent_log(self.plugin) if self.plugin is not None else []

    def close(self) -> None:
        try:
            if self.plugin is not None:
                self.plugin.stop()
        finally:
            self.b.rt.remove_all_pods()


class Measured(Protocol):
    """What a window reads from a configuration's node: :class:`Node` here, the host-process
    node's pods with ``--beside`` (``bench/colocation_beside.py``)."""

    b: Bench

    def snapshot(self) -> dict[str, Any]: ...
    def be_limit(self) -> float | None: ...
    def be_running(self) -> int: ...
    def be_idle(self) -> str: ...
    def evictions(self) -> float: ...
    def agent_lines(self) -> list[str]: ...
    def close(self) -> None: ...


# one load level -----------------------------------------------------------------------------------------


def sleep_until(t: float) -> None:
    time.sleep(max(0.0, t - time.time()))


def limits_until(node: Measured, end: float) -> list[float | None]:
    """BE's limit every 0.5 s until ``end`` (unix time)."""
    out = []
    while time.time() < end:
        out.append(node.be_limit())
        time.sleep(min(0.5, max(0.0, end - time.time())))
    return out


def figures(node: Measured, s0: dict[str, Any], s1: dict[str, Any], limits: list[float | None]) -> dict[str, Any]:
    """What a window shows besides LS latency: the node's CPU, LS's and BE's cores, BE's ops/s
    and limit, the agent's evictions, BE containers still running."""
    dt = s1["t"] - s0["t"]
    c0, c1 = s0["counters"], s1["counters"]
    known = [x for x in limits if x is not None]
    host = cpu_util(s0["stat"], s1["stat"])
    return {
        "node_cpu_util": (s1["tree_s"] - s0["tree_s"]) / dt / node.b.cpus if node.b.isolate else host,
        "host_cpu_util": host,
        "ls_cores": (s1["ls_s"] - s0["ls_s"]) / dt,
        "be_cores": (s1["be_s"] - s0["be_s"]) / dt,
        "be_ops_s": {n: counter_rate(c0[n], c1[n]) for n in c1},
        "be_limit_cores": statistics.fmean(known) if known else None,
        "be_limit_unlimited_share": (len(limits) - len(known)) / len(limits) if limits else None,
        "evictions": node.evictions(),
        "be_running": node.be_running(),
        "be_cpu_idle": node.be_idle(),
        "agent_log": node.agent_lines(),
    }


def agent_log(plugin: PluginProcess, last: int = 6) -> list[str]:
    """The agent's last BE-limit and eviction lines: why BE had what it had."""
    marks = ("BE limited to", "BE not limited")
    keep = [ln[:400] for ln in plugin.logs().splitlines() if any(m in ln for m in marks) or "evict" in ln.lower()]
    return keep[-last:]


def measure(b: Bench, node: Measured, rate: float | None) -> dict[str, Any]:
    """``--warmup`` then the window at ``rate`` requests/s (None: no load, BE's reference)."""
    if rate is None:
        t0 = time.time()
        sleep_until(t0 + b.warmup)
        s0 = node.snapshot()
        limits = limits_until(node, t0 + b.warmup + b.window)
        return {"rate_rps": None, **figures(node, s0, node.snapshot(), limits)}
    cmd = [str(b.binary), "load", "-url", b.url, "-rate", f"{rate:g}", "-seconds", f"{b.warmup + b.window:g}"]
    proc = subprocess.Popen([*cmd, "-timeout", f"{TIMEOUT_S:g}s"], stdout=subprocess.PIPE, text=True)
    try:
        as_client(b, proc.pid)
        assert proc.stdout is not None
        first = proc.stdout.readline()
        t0 = int(first.split()[1]) / 1e9
        sleep_until(t0 + b.warmup)
        s0 = node.snapshot()
        limits = limits_until(node, t0 + b.warmup + b.window)
        s1 = node.snapshot()
        rest, _ = proc.communicate(timeout=TIMEOUT_S + 30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    _, reqs = parse_load(first + rest)
    win = in_window(reqs, b.warmup, b.warmup + b.window)
    return {
        "rate_rps": rate,
        "requests": len(win),
        "errors": sum(not r.ok for r in win),
        "lat_ms": latencies_ms(win),
        "send_lag_p99_ms": percentile([(r.sent - r.due) * 1e3 for r in win], 0.99),
        **figures(node, s0, s1, limits),
    }


def calibrate_rates(
    b: Bench, fractions: list[float], alone: Callable[[], Measured] | None = None
) -> tuple[list[float], float]:
    """Rates at ``fractions`` of the node's CPUs, from the CPU one request costs (the LS
    container's and the load generator's), measured with LS alone (``alone()``'s node, by
    default this runtime's) at 200 requests/s for 5 s."""
    import resource

    node = alone() if alone is not None else Node(b, Config("calibrate", be=False))
    try:
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        ls0 = node.snapshot()["ls_s"]
        cmd = [str(b.binary), "load", "-url", b.url, "-rate", "200", "-seconds", "5"]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        as_client(b, proc.pid)
        out, _ = proc.communicate(timeout=60)
        _, reqs = parse_load(out)
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        ls1 = node.snapshot()["ls_s"]
    finally:
        node.close()
    gen = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
    cost = ((ls1 - ls0) + gen) / len(reqs)
    return [round(f * b.cpus / cost) for f in fractions], cost


# the run: rounds of configurations, pooled ----------------------------------------------------------------


def run_config(b: Bench, cfg: Config, rates: list[float]) -> list[dict[str, Any]]:
    node = Node(b, cfg)
    try:
        if not cfg.load:
            return [measure(b, node, None)]
        return [measure(b, node, r) for r in rates]
    finally:
        node.close()


def line(cfg: str, m: dict[str, Any]) -> str:
    lat = m.get("lat_ms") or []
    p = [percentile(lat, q) for q in (0.5, 0.99, 0.999)]
    ps = " / ".join("-" if x is None else f"{x:.2f}" for x in p)
    ops = ", ".join(f"{k} {v:.0f}" for k, v in m["be_ops_s"].items())
    lim = "-" if m["be_limit_cores"] is None else f"{m['be_limit_cores']:.2f}"
    return (
        f"{cfg:>16} @ {m['rate_rps'] or 0:>5.0f}/s: p50/p99/p99.9 {ps} ms, errors {m.get('errors', 0)}, "
        f"util {m['node_cpu_util']:.2f}, LS {m['ls_cores']:.2f} BE {m['be_cores']:.2f} cores (limit {lim}), "
        f"BE ops/s {ops or '-'}, lag p99 {m.get('send_lag_p99_ms') or 0:.2f} ms, evictions {m['evictions']:.0f}, "
        f"BE running {m['be_running']}, cpu.idle BE group/pods {m['be_cpu_idle']}"
    )


def run(
    b: Bench,
    configs: list[Config],
    rates: list[float],
    rounds: int,
    run_one: Callable[[Config], list[dict[str, Any]]] | None = None,
) -> dict[str, list[list[dict[str, Any]]]]:
    """raw[config][level] = one measurement per round (``run_one(cfg)``: every level of one
    configuration on a fresh node; by default on this runtime)."""
    raw: dict[str, list[list[dict[str, Any]]]] = {c.name: [] for c in configs}
    for r in range(rounds):
        for cfg in configs if r % 2 == 0 else configs[::-1]:
            ms = run_one(cfg) if run_one is not None else run_config(b, cfg, rates)
            for i, m in enumerate(ms):
                if len(raw[cfg.name]) <= i:
                    raw[cfg.name].append([])
                raw[cfg.name][i].append(m)
                print(f"round {r + 1}/{rounds} {line(cfg.name, m)}", flush=True)
                for ln in m["agent_log"] if i == len(ms) - 1 else ():
                    print(f"    agent: {ln}", flush=True)
    return raw


def mean(rounds: list[dict[str, Any]], key: str) -> float | None:
    vals = [m[key] for m in rounds if m.get(key) is not None]
    return statistics.fmean(vals) if vals else None


STALL_LAG_MS = 3.0  # a window whose generator sent later than this (its p99) ran on a stalled host


def stalled(m: dict[str, Any], stall_lag_ms: float) -> bool:
    """The host stalled the generator in this window (``stall_lag_ms`` 0: never said)."""
    return stall_lag_ms > 0 and (m.get("send_lag_p99_ms") or 0.0) > stall_lag_ms


def steady(rounds: list[dict[str, Any]], stall_lag_ms: float) -> list[dict[str, Any]]:
    """The windows in which the load generator kept its schedule (send lag p99 at most
    ``stall_lag_ms``; 0: every window). The generator has the top CPU weight on the node, so
    when it sends late the host stalled it (other tenants, the hypervisor), not the pods, and
    that window measures the host, not LS beside BE. Every window when none kept it."""
    return [m for m in rounds if not stalled(m, stall_lag_ms)] or rounds


def pooled(rounds: list[dict[str, Any]], reference: dict[str, float], stall_lag_ms: float = 0.0) -> dict[str, Any]:
    """One level of one configuration over its steady windows (:func:`steady`): percentiles
    over all their requests, the rest averaged; ``be_throughput`` is BE's mean ops/s per worker
    as a share of ``reference`` (BE alone on the node), averaged over the workers (0 without
    BE). ``windows`` counts every window, ``stalled`` those left out (or, when none was
    steady, those kept anyway: ``stalled_kept``)."""
    every = rounds
    rounds = steady(every, stall_lag_ms)
    late = sum(stalled(m, stall_lag_ms) for m in every)
    lat = [x for m in rounds for x in m.get("lat_ms", [])]
    ops = {n: statistics.fmean(m["be_ops_s"][n] for m in rounds) for n in rounds[0]["be_ops_s"]}
    shares = [ops[n] / reference[n] for n in ops if reference.get(n)]

    def pct(q: float) -> float | None:
        return percentile(lat, q)

    return {
        "rate_rps": rounds[0]["rate_rps"],
        "ls_p50_ms": pct(0.5),
        "ls_p99_ms": pct(0.99),
        "ls_p999_ms": pct(0.999),
        "ls_max_ms": max(lat, default=None),
        "ls_p99_ms_by_round": [percentile(m.get("lat_ms", []), 0.99) for m in every],
        "send_lag_p99_ms_by_round": [m.get("send_lag_p99_ms") for m in every],
        "windows": len(every),
        "stalled": late,
        "stalled_kept": late > 0 and len(rounds) == len(every),
        "requests": sum(m.get("requests", 0) for m in rounds),
        "errors": sum(m.get("errors", 0) for m in rounds),
        "node_cpu_util": mean(rounds, "node_cpu_util"),
        "host_cpu_util": mean(rounds, "host_cpu_util"),
        "be_throughput": statistics.fmean(shares) if shares else 0.0,
        "be_ops_s": ops,
        "ls_cores": mean(rounds, "ls_cores"),
        "be_cores": mean(rounds, "be_cores"),
        "be_limit_cores": mean(rounds, "be_limit_cores"),
        "send_lag_p99_ms": mean(rounds, "send_lag_p99_ms"),
        "evictions": sum(m["evictions"] for m in rounds),
        "be_running_min": min(m["be_running"] for m in rounds),
        "be_cpu_idle": rounds[-1].get("be_cpu_idle"),
    }


def summarize(raw: dict[str, list[list[dict[str, Any]]]], stall_lag_ms: float = STALL_LAG_MS) -> dict[str, Any]:
    """The JSON the issue asks for: each LS configuration at the moderate level, with the knee
    level under ``knee``; BE's reference under ``be_alone``. Host-stalled windows left out
    (:func:`steady`)."""
    ref_rounds = raw.get("be-alone", [[]])[0]
    reference = pooled(ref_rounds, {})["be_ops_s"] if ref_rounds else {}
    out: dict[str, Any] = {"configs": {}, "be_alone": {"be_ops_s": reference}}
    if ref_rounds:
        out["be_alone"]["node_cpu_util"] = mean(ref_rounds, "node_cpu_util")
    for name, levels in raw.items():
        if name == "be-alone":
            continue
        first, *rest = (pooled(rounds, reference, stall_lag_ms) for rounds in levels)
        out["configs"][name] = {**first, **({"knee": rest[0]} if rest else {})}
    out["stall_lag_ms"] = stall_lag_ms
    return out


def draw(raw: dict[str, list[list[dict[str, Any]]]], summary: dict[str, Any], path: Path) -> None:
    """Per load level, the latency tail (share of requests slower than x, log-log) of each
    configuration; and node utilization against LS p99 for every configuration and level."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary["configs"])
    levels = max(len(raw[n]) for n in names)
    fig, axes = plt.subplots(1, levels + 1, figsize=(5.2 * (levels + 1), 4.4))
    colors = {n: f"C{i}" for i, n in enumerate(names)}
    for lv in range(levels):
        ax = axes[lv]
        for n in names:
            if lv >= len(raw[n]):
                continue
            lat = sorted(x for m in steady(raw[n][lv], summary.get("stall_lag_ms", 0.0)) for x in m["lat_ms"])
            if not lat:
                continue
            tail = [1 - i / len(lat) for i in range(len(lat))]
            ax.plot(lat, tail, label=n, color=colors[n], lw=1.2)
        rate = raw[names[0]][lv][0]["rate_rps"]
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="LS latency, ms (from the scheduled send)",
            ylabel="share of requests slower",
            title=f"{rate:.0f} requests/s",
        )
        ax.axhline(0.01, color="grey", lw=0.5, ls=":")
        ax.axhline(0.001, color="grey", lw=0.5, ls=":")
        ax.legend(fontsize=8)
    ax = axes[-1]
    for n in names:
        for lv, (marker, m) in enumerate(
            zip("os", [summary["configs"][n], summary["configs"][n].get("knee")], strict=True)
        ):
            if m and m["ls_p99_ms"] is not None:
                ax.scatter(
                    m["node_cpu_util"], m["ls_p99_ms"], color=colors[n], marker=marker, label=n if lv == 0 else None
                )
    ax.set(
        xlabel="node CPU utilization",
        ylabel="LS p99, ms",
        yscale="log",
        title="utilization vs LS p99 (o moderate, s knee)",
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or not b else f"{a / b:.2f}x"


def ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def windows(m: dict[str, Any]) -> str:
    """How many windows the row pools: "3", "2 of 3" (one host-stalled, left out), or "3
    (3 stalled)" when none was steady and all were kept."""
    n, k = m.get("windows", 0), m.get("stalled", 0)
    if not k:
        return str(n)
    return f"{n} ({k} stalled)" if m.get("stalled_kept") else f"{n - k} of {n}"


def table(configs: dict[str, Any], knee: bool) -> str:
    rows = [
        "| configuration | windows | LS p50 / p99 / p99.9, ms | p99 vs alone | errors | node CPU | LS / BE cores | "
        "BE limit, cores | BE throughput (of BE alone) | evictions | send lag p99, ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    alone = configs["alone"].get("knee") if knee else configs["alone"]
    for name, c in configs.items():
        m = c.get("knee") if knee else c
        if m is None:
            continue
        lim = "none" if m["be_limit_cores"] is None else f"{m['be_limit_cores']:.2f}"
        rows.append(
            f"| {name} | {windows(m)} | {ms(m['ls_p50_ms'])} / {ms(m['ls_p99_ms'])} / {ms(m['ls_p999_ms'])} | "
            f"{ratio(m['ls_p99_ms'], alone['ls_p99_ms'] if alone else None)} | {m['errors']} of {m['requests']} | "
            f"{m['node_cpu_util'] * 100:.0f} % | {m['ls_cores']:.2f} / {m['be_cores']:.2f} | "
            f"{lim if name not in ('alone',) else '-'} | {m['be_throughput'] * 100:.0f} % | {m['evictions']:.0f} | "
            f"{ms(m['send_lag_p99_ms'])} |"
        )
    return "\n".join(rows)


def missed_by(x: float) -> str:
    """A miss too small for two decimals still reads as a miss."""
    return f"missed by {x:.2f}x" if x >= 0.005 else "missed by less than 0.01x"


def targets(configs: dict[str, Any]) -> str:
    """The issue's targets for the agent's default, met or missed by how much, per level."""
    out = []
    for label, key in (("moderate", None), ("knee", "knee")):
        # a --configs subset may lack agent or no-agent: then there is no target to judge
        a, alone, none = (
            (configs.get(n) or {}).get(key) if key else configs.get(n) for n in ("agent", "alone", "no-agent")
        )
        if not (a and alone and none) or None in (a["ls_p99_ms"], alone["ls_p99_ms"], none["ls_p99_ms"]):
            continue
        if alone["errors"]:
            out.append(
                f"- {label} load ({a['rate_rps']:.0f} requests/s): not judged: LS alone failed {alone['errors']} of "
                f"{alone['requests']} requests, the level is beyond what the node serves"
            )
            continue
        r, util = a["ls_p99_ms"] / alone["ls_p99_ms"], a["node_cpu_util"] * 100
        out.append(
            f"- {label} load ({a['rate_rps']:.0f} requests/s): agent p99 {r:.2f}x LS alone (target <= 1.1x: "
            f"{'met' if r <= 1.1 else missed_by(r - 1.1)}); node CPU {util:.0f} % "
            f"(target >= 80 %: {'met' if util >= 80 else f'missed by {80 - util:.0f} points'}); "
            f"agent p99 vs no agent {a['ls_p99_ms'] / none['ls_p99_ms']:.2f}x (target < 1: "
            f"{'met' if a['ls_p99_ms'] < none['ls_p99_ms'] else 'missed'})"
        )
    return "\n".join(out)


def write_section(path: Path, s: dict[str, Any], plot: Path | None) -> None:
    """The section from the summary alone: a saved run without its command, commit or date
    (``--from-json`` of a run saved before they were kept) says so rather than today's."""
    cfgs = s["configs"]
    knee = next((c["knee"]["rate_rps"] for c in cfgs.values() if "knee" in c), None)
    ref = ", ".join(f"{k} {v:.0f}" for k, v in s["be_alone"]["be_ops_s"].items())
    iso = (
        "\nRun with `--isolate`: the node under test (pods, load generator, agent) had the top CPU weight "
        "against the rest of the host, and node CPU is what its cgroup tree used."
        if s.get("isolate")
        else ""
    )
    png = f"\n![LS latency tails and utilization]({plot})\n" if plot is not None else ""
    again = " (summarized again from its `--json` with `--from-json`)" if s.get("resummarized") else ""
    when = s.get("date", "date not recorded")
    stall = s.get("stall_lag_ms", 0)
    cmd, at = s.get("command", "python -m bench.colocation (command not recorded)"), s.get("commit", "not recorded")
    section = f"""<!-- colocation:begin -->
## Colocation: LS tail latency, node utilization, BE progress (`bench/colocation.py`)

Command: `.venv/bin/{cmd}` ({s["cpus"]} CPUs, {when}), commit `{at}`{again}; the
private containerd 1.7 and the host's cgroup v1 tree laid out as kubelet does. LS: an HTTP server
(LS pod requesting one core, no limit) doing {s["work_us"]} µs of table-walking work per request,
driven open-loop at a constant rate from the host (latency from each request's scheduled send),
the generator in its own cgroup beside `kubepods` with the top CPU weight (a remote client's stand-in).
BE: a CPU-bound pod (2 threads) and a cache-thrashing pod (64 MiB), BestEffort, labelled BE.
Per request the node spends {s["cost_ms"]:.2f} ms of CPU (LS and the load generator, measured
alone). {s["rounds"]} round(s), configurations alternating, each on a fresh node; per level
{s["warmup"]:g} s of warm-up then a {s["seconds"]:g} s window; percentiles over every request of
every window but those in which the host stalled the generator (send lag p99 above
{stall:g} ms; *windows* says how many were pooled). BE throughput is the workers' mean ops/s
as a share of BE alone on the node ({ref}).
Send lag is how late the generator itself sent (its p99, averaged over the pooled windows).{iso}

Moderate load, {cfgs["alone"]["rate_rps"]:.0f} requests/s:

{table(cfgs, knee=False)}

Near the knee, {knee or 0:.0f} requests/s:

{table(cfgs, knee=True)}

Targets for the agent's default:
{targets(cfgs)}
{png}<!-- colocation:end -->
"""
    replace_section(path, "colocation", section)


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60.0, help="measured window per configuration and level")
    ap.add_argument("--warmup", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rates", type=floats, help="LS requests/s per level, e.g. 300,600 (default: from --load)")
    ap.add_argument("--load", type=floats, default=[0.35, 0.7], help="levels as fractions of the node's CPUs")
    ap.add_argument("--work-us", type=int, default=1000, help="LS work per request, µs on this host")
    ap.add_argument(
        "--isolate",
        action="store_true",
        help="shared machine: the node under test gets the top CPU weight, utilization from its own cgroup tree",
    )
    ap.add_argument("--configs", help="comma-separated subset of " + ",".join(c.name for c in CONFIGS))
    ap.add_argument("--plot", type=Path)
    ap.add_argument("--write", type=Path)
    ap.add_argument("--json", type=Path, help="also save the raw results (every latency) here")
    ap.add_argument(
        "--stall-lag-ms",
        type=float,
        default=STALL_LAG_MS,
        help="leave out windows whose generator sent later than this at p99 (a stalled host); 0: keep every window",
    )
    ap.add_argument("--from-json", type=Path, help="summarize a run saved with --json again, without measuring")
    ap.add_argument(
        "--beside",
        choices=["koordlet"],
        help="nriplugin beside this peer on a host-process Kubernetes node (bench/colocation_beside.py)",
    )
    return ap.parse_args()


def resummarize(args: argparse.Namespace) -> int:
    """``--from-json``: the table, plot and JSON line of a saved run, by the current method."""
    try:
        saved = json.loads(args.from_json.read_text())
        raw, before = saved["raw"], saved["summary"]
    except (OSError, ValueError, KeyError) as exc:
        raise SystemExit(f"--from-json {args.from_json}: not a run saved with --json ({exc})") from exc
    s = summarize(raw, args.stall_lag_ms)
    s.update({k: v for k, v in before.items() if k not in s and k != "configs"}, resummarized=True)
    return report(args, raw, s)


def report(args: argparse.Namespace, raw: dict[str, list[list[dict[str, Any]]]], s: dict[str, Any]) -> int:
    """The plot, the BENCHMARKS section and, last, the JSON line: of a run or of a saved one."""
    if args.plot:
        draw(raw, s, args.plot)
    if args.write:
        write_section(args.write, s, args.plot)
    print(json.dumps(s))
    return 0


def run_summary(
    args: argparse.Namespace,
    raw: dict[str, list[list[dict[str, Any]]]],
    b: Bench,
    iters: int,
    cost: float,
    rates: list[float],
) -> dict[str, Any]:
    """The summary of a run and what it ran: the command, commit, date and settings."""
    from bench.hook_latency import commit

    s = summarize(raw, args.stall_lag_ms)
    s.update(
        command=shown_command("python -m bench.colocation", sys.argv[1:]),
        commit=commit(),
        date=time.strftime("%Y-%m-%d"),
        cpus=b.cpus,
        work_us=args.work_us,
        iters=iters,
        cost_ms=cost * 1e3,
        rounds=args.rounds,
        warmup=args.warmup,
        seconds=args.seconds,
        rates=rates,
    )
    return s


def stop(signum: int, _frame: object) -> None:
    """SIGTERM (or SIGINT, which a shell's background job ignores) unwinds through the
    ``finally`` that stops the agent, the pods and containerd and removes their cgroups."""
    raise SystemExit(128 + signum)


def main() -> int:
    args = parse_args()
    if args.beside:
        from bench import colocation_beside

        return colocation_beside.main(args)
    if args.from_json:
        return resummarize(args)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if os.geteuid() != 0 or not (harness.CGROUP_FS / "cpu" / "cpu.cfs_quota_us").exists():
        print("needs root and cgroup v1 (containerd, cgroups)", file=sys.stderr)
        return 2
    configs = CONFIGS
    if args.configs:
        configs = [c for c in CONFIGS if c.name in args.configs.split(",")]
        if not any(c.name == "alone" for c in configs):
            raise SystemExit("--configs must include alone (the reference)")
    binary = go_binary()
    iters = calibrate(binary, args.work_us)
    rt = harness.Containerd(harness.install(), Path(tempfile.mkdtemp(prefix="nriplugin-bench-")))
    try:
        rt.start()
        rt.import_images()
        import_image(rt, binary)
        b = Bench(rt, binary, iters, free_port(), args.warmup, args.seconds, args.isolate)
        rates, cost = calibrate_rates(b, args.load)
        rates = args.rates or rates
        print(f"LS work {iters} iterations ({args.work_us} µs), {cost * 1e3:.2f} ms CPU per request; rates {rates}")
        raw = run(b, configs, rates, args.rounds)
    finally:
        rt.teardown()
    s = run_summary(args, raw, b, iters, cost, rates)
    if args.json:
        args.json.write_text(json.dumps({"summary": s, "raw": raw}))
    return report(args, raw, s)


if __name__ == "__main__":
    sys.exit(main())
