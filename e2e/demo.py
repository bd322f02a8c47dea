"""The main job on a fresh machine: a private containerd with NRI (the newest line by default:
containerd 2.4.2, built once from the Go module proxy; ``NRIPLUGIN_RUNTIME=1.7|2.1`` for Debian's
1.7 or 2.1; cached under ~/.cache/nriplugin), nriplugin with the embedded default policy, sample
LS and BE pods, and what each container really got. A step that takes more than a few seconds
(the first install, waiting for the agent, the act) says what it does and how far it is.

Then the QoS manager act (~20 s, up to ~40 s on a busy machine; needs at least 2 CPUs; --no-qos
skips it): the sample pods make way for an idle LS pod that requests one core and a BE pod that
spins on every CPU; once BE has the idle CPU (3-15 s) one thread spins inside the LS container
for ~6 s, then LS is idle for 8-16 s (until BE's limit has come back). Every ~0.2 s the demo
samples the CPU pressure score and level (from /metrics), BE's limit (the besteffort group's
CFS quota) and what BE and LS use (cpuacct), prints the timeline with a reading of it and
writes it as a PNG (--timeline-png). If the act cannot run, it says so in one line and the job
goes on. The sample pods are then back.

Runs until Ctrl-C (or SIGTERM, SIGHUP, or --duration seconds after the act), then tears
everything down (nriplugin, which runs in a session of its own so that the terminal's Ctrl-C
reaches the demo alone; the pods, containerd, cgroups, mounts, its folder) and exits 0; 1 if
nriplugin exits by itself or something could not be removed; 130 if stopped while containerd
is still being installed. On a real node use ``nriplugin run`` instead.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testkit import containerd as harness

# A 1-core batch-cpu limit: while the QoS manager limits BE's group below it, the container is
# born with that limit as its quota instead (cgroup v1 refuses a child's quota above its parent's).
BATCH = (
    '{"containers":{"main":{"requests":{"kubernetes.io/batch-cpu":"500","kubernetes.io/batch-memory":"256Mi"},'
    '"limits":{"kubernetes.io/batch-cpu":"1k","kubernetes.io/batch-memory":"512Mi"}}}}'
)
SAMPLES: list[tuple[str, str, dict[str, str], dict[str, str], int, int, int]] = [
    # name, Kubernetes QoS (cgroup parent), labels, annotations, CRI cpu_shares, cpu_quota, memory
    ("web-ls", "Burstable", {"koordinator.sh/qosClass": "LS"}, {}, 1024, 200000, 256 << 20),
    ("cache-guaranteed", "Guaranteed", {}, {}, 2048, 200000, 512 << 20),
    ("db-lsr", "Guaranteed", {"koordinator.sh/qosClass": "LSR"}, {}, 1024, 100000, 512 << 20),
    ("batch-be", "BestEffort", {"koordinator.sh/qosClass": "BE"}, {}, 1024, 0, 0),
    (
        "spark-be-batch",
        "BestEffort",
        {"koordinator.sh/qosClass": "BE"},
        {"node.koordinator.sh/extended-resource-spec": BATCH},
        2,
        0,
        0,
    ),
    ("job-besteffort", "BestEffort", {}, {}, 2, 0, 0),
]

# the QoS act
SETTLE, BUSY, IDLE = 3.0, 6.0, 8.0  # seconds: before the LS spike, the spike, LS idle after it
IDLE_MAX = 16.0  # LS idle goes on (up to this) until BE's limit has come back, and 1.5 s more
SETTLE_MAX = 15.0  # the spike waits (up to this) until BE has the idle CPU (GIVEN) for STABLE s
GIVEN = 0.5  # cores
STABLE = 1.0
STEP = 0.2  # seconds between samples
POLL = 0.02  # BE's quota file is polled this often between samples, to time its changes
NOTE = 5.0  # seconds between the act's progress lines (and one at each change of stage)
DEFAULT_PNG = Path(tempfile.gettempdir()) / "nriplugin-qos-timeline.png"
ACT_SECONDS = SETTLE + BUSY + IDLE + 3  # with the pods' start; printed in --help


def fmt(v: str) -> str:
    return "-" if v in ("", "0", "-1", "9223372036854771712") else v


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--duration",
        type=float,
        default=0,
        help=f"exit N seconds after the QoS act (~{ACT_SECONDS:.0f}-40 s; default: until Ctrl-C)",
    )
    ap.add_argument("--metrics-port", type=int, default=9310)
    ap.add_argument("--no-qos", action="store_true", help="skip the QoS manager act")
    ap.add_argument(
        "--timeline-png", type=Path, default=DEFAULT_PNG, help=f"where the QoS act's PNG goes (default {DEFAULT_PNG})"
    )
    args = ap.parse_args()
    stop = Stop()
    for sig in STOP_SIGNALS:
        signal.signal(sig, stop)
    line = harness.selected()
    cache = os.environ.get("NRIPLUGIN_CACHE", "~/.cache/nriplugin")
    say(
        f"containerd {line} (NRIPLUGIN_RUNTIME=1.7|2.1|2.4 picks the line): from {cache}, or on the first run "
        "installed there (2.4 is built from source: a few minutes, with its progress)..."
    )
    try:
        pkg = harness.install(line, progress=sys.stdout)
    except RuntimeError as exc:
        if stop:
            say(
                f"stopped ({stop.by}) while installing containerd: nothing runs yet; "
                "the next run goes on from the cache."
            )
            return 130
        say(f"could not install containerd {line}: {exc}")
        return 1
    rt = harness.Containerd(pkg, Path(tempfile.mkdtemp(prefix="nriplugin-demo-")))
    agent = Agent()
    code = 1
    try:
        code = run(rt, agent, args, stop)
    except AgentFailed as exc:
        say(exc)
    except Exception as exc:
        if not stop:
            raise
        say(f"stopped ({stop.by}); the step under way gave up ({type(exc).__name__}: {exc})")
        code = 0
    finally:
        torn_down = teardown(rt, agent, stop)
    return code if torn_down else 1


class Stop:
    """A signal handler and its flag: set by Ctrl-C (SIGINT), SIGTERM or SIGHUP. The demo
    then tears everything down and exits 0: stopping it is how it ends."""

    def __init__(self) -> None:
        self.by: str | None = None

    def __call__(self, signum: int, _frame: object) -> None:
        if self.by is None:
            self.by = signal.Signals(signum).name

    def __bool__(self) -> bool:
        return self.by is not None


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def say(*words: object) -> None:
    """print, flushed (a pipe reads the lines as they come), quiet once the terminal is gone
    (SIGHUP): the teardown goes on without anyone to read it."""
    with contextlib.suppress(OSError):
        print(*words, flush=True)


class Agent:
    """nriplugin, run by the demo in a session of its own: a Ctrl-C in the terminal reaches
    the demo alone, and the demo stops the agent (SIGTERM) before the runtime goes."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, argv: list[str]) -> subprocess.Popen[bytes]:
        self.proc = subprocess.Popen([sys.executable, "-m", "nriplugin", *argv], start_new_session=True)
        return self.proc

    def exited(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    def stop(self) -> int | None:
        """SIGTERM and its exit status (SIGKILL after 10 s: then -9); None if it had already
        exited (that was said when it happened) or never started."""
        if self.proc is None or self.proc.poll() is not None:
            return None
        self.proc.terminate()
        try:
            return self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def run(rt: harness.Containerd, agent: Agent, args: argparse.Namespace, stop: Stop) -> int:
    """Everything up to Ctrl-C (or --duration): 0 when stopped, 1 if nriplugin exits first."""
    rt.start()
    rt.import_images()
    assert rt.proc is not None
    say(f"containerd {rt.runtime.version} up (pid {rt.proc.pid}): {rt.base} (NRI socket {rt.nri_socket})")
    if stop:
        return 0
    metrics = f"http://127.0.0.1:{args.metrics_port}"
    agent.start(
        [
            "run",
            "--socket",
            rt.nri_socket,
            "--log-format",
            "text",
            "--metrics-address",
            f"127.0.0.1:{args.metrics_port}",
            "--cri-socket",
            rt.address,
            "--pods-root",
            f"{rt.cgroup_root}/kubepods",
        ]
    )
    wait_ready(metrics, agent, stop)
    if stop:
        return 0
    say(f"creating {len(SAMPLES)} sample pods through CRI...")
    made = create_samples(rt, stop)
    time.sleep(0.3)  # share-pool moves for running containers are applied right after
    head = "CRI asked: shares/quota/mem     cgroup has: shares/quota/mem/burst/cpuset"
    print(f"\n{'container':18s} {'class':13s} {head}")
    for name, cls, shares, quota, mem, pod, cid in made:
        cpu = rt.container_cgroup(pod, cid, "cpu")
        have = "/".join(
            [
                harness.read_cgroup(cpu, "cpu.shares"),
                fmt(harness.read_cgroup(cpu, "cpu.cfs_quota_us")),
                fmt(harness.read_cgroup(rt.container_cgroup(pod, cid, "memory"), "memory.limit_in_bytes")),
                fmt(harness.read_cgroup(cpu, "cpu.cfs_burst_us")) if (cpu / "cpu.cfs_burst_us").exists() else "n/a",
                harness.read_cgroup(rt.container_cgroup(pod, cid, "cpuset"), "cpuset.cpus"),
            ]
        )
        asked = f"{shares}/{fmt(str(quota))}/{fmt(str(mem))}"
        print(f"{name:18s} {cls:13s} {asked:31s} {have}")
    if not args.no_qos and not stop:
        qos_act(rt, metrics, args.timeline_png, lambda: bool(stop) or agent.exited())
    if stop:
        return 0
    print("\ncgroup files: /sys/fs/cgroup/{cpu,memory}/" + rt.cgroup_root + "/kubepods/...")
    print(f"metrics: {metrics}/metrics   health: {metrics}/healthz   ready: {metrics}/readyz")
    say("Ctrl-C to tear everything down." if not args.duration else f"stopping in {args.duration:.0f} s.")
    deadline = time.monotonic() + args.duration if args.duration else float("inf")
    while not stop and time.monotonic() < deadline and not agent.exited():
        time.sleep(0.2)
    if agent.exited() and not stop:
        assert agent.proc is not None
        say(f"nriplugin exited by itself (status {agent.proc.returncode}): see its log above.")
        return 1
    return 0


def teardown(rt: harness.Containerd, agent: Agent, stop: Stop) -> bool:
    """Stop nriplugin, then remove everything the runtime made (pods, containerd, its shims,
    cgroups, mounts, its folder). Signals are ignored from here on, by the demo and by the
    commands the teardown runs (an ignored signal stays ignored across exec): a second
    Ctrl-C cannot cut it short. True when all went and nriplugin stopped cleanly."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    why = f" ({stop.by})" if stop else ""
    say(f"tearing down{why}: nriplugin, the pods, containerd, cgroups, mounts, {rt.base} ...")
    t0 = time.monotonic()
    ok = True
    status = agent.stop()
    if status not in (None, 0):
        say(f"nriplugin exited with status {status} on SIGTERM (0 expected): see its log above.")
        ok = False
    try:
        rt.teardown()
    except Exception as exc:
        say(f"teardown failed ({type(exc).__name__}: {exc}); left: {rt.base}, cgroup {rt.cgroup_root}")
        return False
    say(f"done in {time.monotonic() - t0:.1f} s." if ok else "torn down.")
    return ok


def create_samples(
    rt: harness.Containerd, stop: Stop | None = None
) -> list[tuple[str, str, int, int, int, harness.Pod, str]]:
    made = []
    for name, k8s, labels, annots, shares, quota, mem in SAMPLES:
        if stop:
            break
        pod = rt.run_pod(name, k8s, labels, annots)
        cid = rt.create_container(pod, "main", cpu_shares=shares, cpu_quota=quota, memory=mem)
        made.append((name, labels.get("koordinator.sh/qosClass", f"({k8s})"), shares, quota, mem, pod, cid))
    return made


class AgentFailed(Exception):
    """nriplugin did not come up: the message is the one line to print."""


def wait_ready(metrics: str, agent: Agent, stop: Stop, timeout: float = 30) -> None:
    """Until the agent's /readyz answers 200 (registered with the runtime), or a stop."""
    t0 = time.monotonic()
    said = t0
    while not stop:
        if agent.exited():
            assert agent.proc is not None
            raise AgentFailed(f"nriplugin exited with status {agent.proc.returncode} before it registered")
        try:
            with urllib.request.urlopen(metrics + "/readyz", timeout=2) as r:
                if r.status == 200:
                    assert agent.proc is not None
                    say(f"nriplugin (pid {agent.proc.pid}) registered with containerd ({time.monotonic() - t0:.1f} s)")
                    return
        except OSError:
            pass
        now = time.monotonic()
        if now - t0 > timeout:
            raise AgentFailed(f"nriplugin did not register within {timeout:.0f} s (its log is above)")
        if now - said >= 5:
            say(f"still waiting for nriplugin to register: {now - t0:.0f} s (up to {timeout:.0f} s)")
            said = now
        time.sleep(0.1)


# The QoS manager act ---------------------------------------------------------------------------


class ActAborted(Exception):
    pass


@dataclass(frozen=True, slots=True)
class Point:
    """One sample of the timeline; usage as cumulative CPU seconds (rates come from deltas)."""

    t: float  # seconds since the act's timeline began
    score: float | None  # CPU pressure score (0-100)
    level: str  # CPU pressure level
    be_limit: float | None  # cores; None: no limit
    be_cpu: float  # CPU seconds used by the BE container so far
    ls_cpu: float
    node_cpu: float = 0.0  # by the whole node (/proc/stat), so "other" = node - BE - LS


def qos_act(rt: harness.Containerd, metrics: str, png: Path, aborted: Callable[[], bool]) -> None:
    """The act, start to end; any failure is one line and the job goes on. The sample pods
    make way (their LS requests would leave BE only its floor on a small node) and are back
    afterwards."""
    ncpu = len(os.sched_getaffinity(0))
    print(f"\nQoS manager act (~{ACT_SECONDS:.0f}-40 s): LS idle -> one thread busy in LS -> LS idle", flush=True)
    if ncpu < 2:
        print(f"QoS act skipped: it needs at least 2 CPUs, this machine has {ncpu}.")
        return
    try:
        rt.remove_all_pods()
        points, changes, spike, idle = run_act(rt, metrics, ncpu, aborted)
        print(timeline_table(points, spike, idle))
        print(reading(points, changes, spike, idle))
        try:
            plot_timeline(png, points, spike, idle, ncpu)
            print(f"timeline PNG: {png}")
        except ImportError:
            print("timeline PNG skipped: matplotlib is not installed (pip install -e '.[demo]')")
    except ActAborted as e:
        print(f"QoS act stopped: {e}")
    except Exception as e:  # the act is a show: the job goes on without it
        print(f"QoS act failed ({type(e).__name__}: {e}); going on without it.")
    finally:
        if not aborted():
            try:
                rt.remove_all_pods()
                create_samples(rt)
                print("the sample pods are back.")
            except Exception as e:
                print(f"could not bring the sample pods back ({type(e).__name__}: {e}).")


def run_act(
    rt: harness.Containerd, metrics: str, ncpu: int, aborted: Callable[[], bool]
) -> tuple[list[Point], list[tuple[float, float | None]], float, float]:
    """Create the act's pods, spike LS, sample; return the points, BE limit changes (t, cores),
    and when the spike began and ended."""
    ls = rt.run_pod("web-ls", "Burstable", {"koordinator.sh/qosClass": "LS"})
    ls_c = rt.create_container(ls, "main", cpu_shares=1024)  # requests one core
    be = rt.run_pod("batch-be", "BestEffort", {"koordinator.sh/qosClass": "BE"})
    spin = ["/bin/sh", "-c", " & ".join(["yes >/dev/null"] * ncpu)]
    be_c = rt.create_container(be, "main", cpu_shares=2, command=spin)
    be_acct, ls_acct = rt.container_cgroup(be, be_c, "cpuacct"), rt.container_cgroup(ls, ls_c, "cpuacct")
    be_parent = harness.CGROUP_FS / "cpu" / rt.cgroup_root / "kubepods" / "besteffort"
    print(f"pods: web-ls (LS, requests 1 core, idle), batch-be (BE, {ncpu} threads spinning)", flush=True)
    points: list[Point] = []
    changes: list[tuple[float, float | None]] = []
    t0 = time.monotonic()
    spinner: subprocess.Popen[bytes] | None = None
    spike = idle = -1.0
    next_sample = t0
    stage, said, last_note = f"settling: until BE holds the idle CPU ({SETTLE:.0f}-{SETTLE_MAX:.0f} s)", "", t0

    def sample_until(end: float) -> None:
        nonlocal next_sample, said, last_note
        while True:
            now = time.monotonic()
            if aborted():
                raise ActAborted("asked to stop")
            lim = quota_cores(be_parent)
            if not changes or changes[-1][1] != lim:
                changes.append((now - t0, lim))
            if now >= next_sample:
                score, level = scrape(metrics)
                points.append(
                    Point(now - t0, score, level, lim, cpu_seconds(be_acct), cpu_seconds(ls_acct), node_seconds())
                )
                next_sample += STEP
                if stage != said or now - last_note >= NOTE:  # progress: where the act is
                    shown = "-" if score is None else f"{score:.0f}"
                    print(f"  {now - t0:5.1f} s  {stage}; BE limit {limit(lim)}, CPU score {shown} {level}", flush=True)
                    said, last_note = stage, now
            if now >= end:
                return
            time.sleep(POLL)

    try:
        sample_until(t0 + SETTLE)
        while time.monotonic() - t0 < SETTLE_MAX and not settled(changes, time.monotonic() - t0):
            sample_until(time.monotonic() + STEP)
        spinner = subprocess.Popen(["yes"], stdout=subprocess.DEVNULL)
        for ctrl in ("cpu", "cpuacct"):  # one thread spinning inside the LS container
            (rt.container_cgroup(ls, ls_c, ctrl) / "cgroup.procs").write_text(str(spinner.pid))
        spike = time.monotonic() - t0
        stage = f"LS busy: one thread spinning in web-ls ({BUSY:.0f} s)"
        sample_until(time.monotonic() + BUSY)
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    idle = time.monotonic() - t0
    stage = f"LS idle: until BE's limit has come back ({IDLE:.0f}-{IDLE_MAX:.0f} s)"
    sample_until(t0 + idle + IDLE)
    while time.monotonic() - t0 < idle + IDLE_MAX and not came_back(changes, idle, time.monotonic() - t0):
        sample_until(time.monotonic() + STEP)
    return points, changes, spike, idle


def settled(changes: list[tuple[float, float | None]], now: float) -> bool:
    """BE has the idle CPU: no quota, or one of at least GIVEN cores, unchanged for STABLE seconds."""
    if not changes:
        return False
    t, lim = changes[-1]
    return (lim is None or lim >= GIVEN) and now - t >= STABLE


def came_back(changes: list[tuple[float, float | None]], idle: float, now: float) -> bool:
    """BE's limit rose after LS went idle, at least 1.5 s ago (to show BE using it); with no
    quota when LS went idle there is nothing to give back: 1.5 s of LS idle is enough."""
    at_idle = next((v for t, v in reversed(changes) if t <= idle), None)
    if at_idle is None:
        return now - idle >= 1.5
    return any(t > idle and (v is None or v > at_idle + 0.05) and now - t >= 1.5 for t, v in changes)


def node_seconds() -> float:
    """CPU seconds the node has been busy (/proc/stat: all but idle and iowait)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(acct: Path) -> float:
    return int((acct / "cpuacct.usage").read_text()) / 1e9


def quota_cores(group: Path) -> float | None:
    """The group's CFS quota in cores; None when it has none (or the group is not there yet)."""
    try:
        q = int((group / "cpu.cfs_quota_us").read_text())
        period = int((group / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if q < 0 else q / period


def scrape(metrics: str) -> tuple[float | None, str]:
    try:
        with urllib.request.urlopen(metrics + "/metrics", timeout=1) as r:
            return parse_metrics(r.read().decode())
    except OSError:
        return None, "?"


_LABEL = re.compile(r'(\w+)="([^"]*)"')


def parse_metrics(text: str) -> tuple[float | None, str]:
    """The CPU pressure score and level from the agent's Prometheus text."""
    score, level = None, "?"
    for line in text.splitlines():
        if line.startswith("nriplugin_qos_cpu_pressure_score "):
            score = float(line.split()[1])
        elif line.startswith("nriplugin_qos_pressure_level{"):
            labels, _, value = line.rpartition(" ")
            lv = dict(_LABEL.findall(labels))
            if lv.get("resource") == "cpu" and float(value) == 1:
                level = lv.get("level", "?")
    return score, level


def rate(a: Point, b: Point, attr: str) -> float:
    """Cores used between two points; ``other``: the node but BE and LS (never below 0)."""
    if b.t <= a.t:
        return 0.0
    if attr == "other":
        return max(0.0, rate(a, b, "node_cpu") - rate(a, b, "be_cpu") - rate(a, b, "ls_cpu"))
    return float(getattr(b, attr) - getattr(a, attr)) / (b.t - a.t)


def cores(v: float | None) -> str:
    return "none" if v is None else f"{v:.2f}"


def limit(v: float | None) -> str:
    """A limit in words: no quota (BE's idle group below quotaFrom) or so many cores."""
    return "no quota" if v is None else f"{v:.2f} cores"


def span(a: float | None, b: float | None) -> str:
    """``0.10 to 1.00 cores``, or with words where either is no quota."""
    return f"{a:.2f} to {b:.2f} cores" if a is not None and b is not None else f"{limit(a)} to {limit(b)}"


def phase(t: float, spike: float, idle: float) -> str:
    return "settle" if t < spike else "LS busy" if t < idle else "LS idle"


def timeline_table(points: list[Point], spike: float, idle: float, every: float = 1.0) -> str:
    """One row about every ``every`` seconds; usage averaged since the previous row."""
    rows = [
        f"{'t (s)':>6s}  {'phase':8s} {'score':>5s} {'level':9s} {'BE limit':>8s} {'BE used':>7s} {'LS used':>7s}"
        f" {'other':>6s}"
    ]
    prev = points[0] if points else None
    for p in points[1:]:
        assert prev is not None
        crossed = (prev.t < spike <= p.t) or (prev.t < idle <= p.t)
        if p.t - prev.t < every - STEP / 2 and not crossed and p is not points[-1]:
            continue
        score = "-" if p.score is None else f"{p.score:.0f}"
        rows.append(
            f"{p.t:6.1f}  {phase(p.t - 1e-9, spike, idle):8s} {score:>5s} {p.level:9s} {cores(p.be_limit):>8s} "
            f"{rate(prev, p, 'be_cpu'):7.2f} {rate(prev, p, 'ls_cpu'):7.2f} {rate(prev, p, 'other'):6.2f}"
        )
        prev = p
    return "\n".join(rows)


def reading(points: list[Point], changes: list[tuple[float, float | None]], spike: float, idle: float) -> str:
    """A paragraph about what the timeline shows, all from the data: BE's limit before the
    spike, the cut after it (how fast, to what, and whether a pressure level had moved yet),
    the way back after LS goes idle, and what BE and LS used meanwhile."""

    def limit_at(t: float) -> float | None:
        v: float | None = None
        for ct, lim in changes:
            if ct > t:
                break
            v = lim
        return v

    def level_at(t: float) -> str:
        return next((p.level for p in reversed(points) if p.t <= t), "?")

    def avg(attr: str, t0: float, t1: float) -> float:
        win = [p for p in points if t0 <= p.t <= t1]
        return rate(win[0], win[-1], attr) if len(win) >= 2 else 0.0

    def tighter(a: float | None, b: float | None) -> bool:  # None: no limit
        return a is not None and (b is None or a < b - 0.05)

    end = points[-1].t if points else idle
    start, before = limit_at(0.0), limit_at(spike)
    out = []
    if tighter(start, before):
        given = next(t for t, v in changes if t <= spike and v == before)
        out.append(f"Settling: BE's limit went from {span(start, before)} at t={given:.1f} s.")
    held = "without a quota" if before is None else f"limited to {limit(before)}"
    out.append(
        f"LS idle until t={spike:.1f} s: BE {held}, using "
        f"{avg('be_cpu', max(0.0, spike - 1.5), spike):.2f}; the rest of the node (not BE, not LS) used "
        f"{avg('other', 0.0, spike):.2f}."
    )
    cut = next(((t, v) for t, v in changes if spike <= t < idle and tighter(v, before)), None)
    if cut is None:
        out.append(
            f"LS spike at t={spike:.1f} s: BE's limit did not move ({limit(before)}); while LS was busy it "
            f"used {avg('ls_cpu', spike + 0.5, idle):.2f} cores and BE {avg('be_cpu', spike + 0.5, idle):.2f}."
        )
    else:
        low = min((v for t, v in changes if spike <= t < idle and v is not None), default=cut[1])
        lv0, lv1 = level_at(spike), level_at(cut[0])
        why = (
            f" while the CPU level was still {lv0} (the usage budget, not a level change)"
            if lv0 == lv1
            else f" as the CPU level went {lv0} -> {lv1}"
        )
        out.append(
            f"LS spike at t={spike:.1f} s: BE cut from {span(before, cut[1])} within "
            f"{(cut[0] - spike) * 1000:.0f} ms{why}"
            + (f", later down to {cores(low)}" if tighter(low, cut[1]) else "")
            + f"; while LS was busy it used {avg('ls_cpu', cut[0] + 0.5, idle):.2f} cores and BE "
            f"{avg('be_cpu', cut[0] + 0.5, idle):.2f}."
        )
    during = limit_at(idle)
    back = next(((t, v) for t, v in changes if t >= idle and tighter(during, v)), None)
    if back is None and during is None:
        out.append(
            f"LS idle at t={idle:.1f} s: BE, still without a quota, used {avg('be_cpu', idle + 0.5, end):.2f} cores."
        )
    elif back is None:
        out.append(
            f"LS idle at t={idle:.1f} s: BE still at {limit(during)} at t={end:.1f} s, with the CPU level "
            f"at {level_at(end)} and the rest of the node using {avg('other', idle, end):.2f} cores (a raise "
            "waits for raiseDelay and the level, at most maxWritesPerMinute a minute)."
        )
    else:
        out.append(
            f"LS idle at t={idle:.1f} s: BE back to {limit(back[1])} at t={back[0]:.1f} s "
            f"({back[0] - idle:.1f} s later), then using {avg('be_cpu', back[0] + 0.5, end):.2f}."
        )
    scores = [p.score for p in points if p.score is not None]
    levels = [p.level for p in points if p.level != "?"]
    seq = [lv for k, lv in enumerate(levels) if k == 0 or levels[k - 1] != lv]
    if scores:
        out.append(f"CPU pressure score {min(scores):.0f}-{max(scores):.0f}, levels {' -> '.join(seq)}.")
    return " ".join(out)


@dataclass(frozen=True, slots=True)
class Series:
    """What the timeline's upper plot draws, one value per interval between two points (at its
    end). BE's limit is drawn in two styles: a number of cores (``limit``) and, in a band of
    its own above every CPU (``no_limit_y``), no limit at all (``no_limit``); NaN where the
    other style holds, and ``limit_path`` joins them (the jumps between the two)."""

    t: list[float]
    be: list[float]  # cores used
    ls: list[float]
    other: list[float]  # the rest of the node
    limit: list[float]  # BE's limit in cores; NaN where it has none
    no_limit: list[float]  # no_limit_y where BE has no limit; NaN where it has one
    limit_path: list[float]  # limit or no_limit_y: the line's path through both
    no_limit_y: float  # the "no limit" band, above every CPU
    top: float  # the upper plot's y range is 0 to this


def timeline_series(points: list[Point], ncpu: int) -> Series:
    nan = float("nan")
    pairs = list(itertools.pairwise(points))
    no_limit_y = ncpu + 0.5
    lims = [b.be_limit for _, b in pairs]
    return Series(
        t=[b.t for _, b in pairs],
        be=[rate(a, b, "be_cpu") for a, b in pairs],
        ls=[rate(a, b, "ls_cpu") for a, b in pairs],
        other=[rate(a, b, "other") for a, b in pairs],
        limit=[nan if v is None else v for v in lims],
        no_limit=[no_limit_y if v is None else nan for v in lims],
        limit_path=[no_limit_y if v is None else v for v in lims],
        no_limit_y=no_limit_y,
        top=ncpu + 0.8,
    )


LEGEND_ANCHOR = (1.01, 1.0)  # the legend's top left corner, just right of the upper plot


def timeline_figure(points: list[Point], spike: float, idle: float, ncpu: int) -> Any:
    """The timeline as a matplotlib Figure: cores over time above (BE's limit, what BE, LS and
    the rest of the node used; "no limit" in its own band at the top), the CPU pressure score
    below. The legend stands right of the plots, clear of the data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = timeline_series(points, ncpu)
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(12, 6.5), sharex=True, height_ratios=[3, 1.3], layout="constrained")
    for a in (ax, ax2):
        a.axvspan(spike, idle, color="tab:red", alpha=0.08, label="LS busy (one thread)" if a is ax else None)
    ax.axhspan(ncpu + 0.25, s.top, color="0.93", lw=0)  # the "no limit" band, above every CPU
    ax.step(s.t, s.limit_path, where="post", color="black", lw=0.8)  # joins the two styles
    ax.step(s.t, s.limit, where="post", color="black", lw=2, label="BE limit (besteffort cfs_quota)")
    ax.step(s.t, s.no_limit, where="post", color="black", lw=2, ls="--", label="BE: no limit (no quota)")
    ax.plot(s.t, s.be, color="tab:orange", label="BE used")
    ax.plot(s.t, s.ls, color="tab:blue", label="LS used")
    ax.plot(s.t, s.other, color="tab:gray", lw=0.8, label="rest of the node (not BE, not LS)")
    ax.set_ylabel("cores")
    ax.set_ylim(0, s.top)
    ax.set_yticks([*range(ncpu + 1), s.no_limit_y], [*map(str, range(ncpu + 1)), "no limit"])
    ax.legend(loc="upper left", bbox_to_anchor=LEGEND_ANCHOR, borderaxespad=0, fontsize=8)
    ax.set_title(f"nriplugin QoS manager, embedded default policy, {ncpu} CPUs: BE spins, one LS thread busy (shaded)")
    ax2.plot([p.t for p in points], [float("nan") if p.score is None else p.score for p in points], color="tab:purple")
    for p, q in itertools.pairwise(points):
        if p.level != q.level:
            ax2.annotate(q.level, (q.t, q.score or 0), fontsize=8)
    if points:
        ax2.annotate(points[0].level, (points[0].t, points[0].score or 0), fontsize=8)
    ax2.set_ylabel("CPU pressure\nscore")
    ax2.set_ylim(0, 100)
    ax2.set_xlabel("seconds")
    return fig


def plot_timeline(path: Path, points: list[Point], spike: float, idle: float, ncpu: int) -> None:
    fig = timeline_figure(points, spike, idle, ncpu)  # ImportError first without matplotlib
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
