"""Network QoS figures: an LS pod's throughput and ping latency to a remote host through the
emulated node uplink, alone and next to a BE pod's bulk flow, on the private containerd 1.7 with
Debian's bridge CNI (pods with their own network namespaces, ``testkit.netlab``).

One run measures, per scenario and direction (upload = pod egress, download = pod ingress,
through the uplink's ``--rate-mbit`` token bucket and deep FIFO):
- the LS pod alone: iperf3 goodput for ``--seconds``, and ping p50/p99 to the remote
  (``--pings`` at 50 ms) with nothing else running;
- the BE pod alone: its goodput (what a per-pod or class limit on BE would cap);
- with a BE bulk flow (iperf3, the same direction, 2 s of warm-up to fill the queue): the LS
  pod's goodput next to it, and its ping with only the bulk flow running.

Scenarios: "no agent" (no rules: the baseline that stays valid whatever the agent's defaults
become); ``--agent-default``: the agent with its embedded default policy; ``--agent-policy
FILE`` (repeatable): the agent with that policy (e.g. ``examples/net-qos.yaml``: "with
rules"). Each scenario gets a fresh LS and a fresh BE pod (created after the agent is ready, so
it sees their RunPodSandbox/StartContainer), and its agent is stopped after it.
``--annotate ROLE:KEY=VALUE`` (repeatable) adds one more scenario: the agent with its embedded
default and those annotations on the LS or BE pod (e.g.
``be:kubernetes.io/egress-bandwidth=20M``: the BE-alone column shows the cap held).
Every flow uses cubic (``testkit.netlab.CC``). No figure is asserted.

Usage (root): .venv/bin/python -m bench.netqos [--agent-default] [--agent-policy FILE]...
       [--seconds 5] [--pings 100] [--rate-mbit 100] [--write BENCHMARKS.md] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.report import replace_section, shown_command
from testkit import containerd as harness
from testkit import netlab
from testkit.plugin import PluginProcess, runtime_args

LS = {"koordinator.sh/qosClass": "LS"}
HEADER = (
    "| scenario | direction | LS alone (Mbit/s) | LS with BE bulk (Mbit/s) | BE alone (Mbit/s) "
    "| LS ping idle p50 / p99 (ms) | LS ping with BE bulk p50 / p99 (ms) |"
)
BE = {"koordinator.sh/qosClass": "BE"}


@dataclass(frozen=True)
class Scenario:
    name: str
    agent: bool = False
    policy: Path | None = None  # None with agent: the embedded default
    annotations: dict[str, dict[str, str]] = field(default_factory=dict)  # "ls"/"be" -> annotations


def measure(
    up: netlab.Uplink, ls: harness.Pod, be: harness.Pod, reverse: bool, seconds: float, pings: int
) -> dict[str, Any]:
    """The figures of one direction, LS and BE pods already running."""
    ls_ns, be_ns = ls.netns or "", be.netns or ""
    out: dict[str, Any] = {}
    out["ls_alone_mbit"] = netlab.iperf(up, ls_ns, seconds, reverse).mbit
    out["ls_ping_idle"] = asdict(netlab.ping(ls_ns, up.remote_addr, pings))
    out["be_alone_mbit"] = netlab.iperf(up, be_ns, seconds, reverse).mbit
    with netlab.bulk(up, be_ns, reverse=reverse):
        out["ls_ping_with_be"] = asdict(netlab.ping(ls_ns, up.remote_addr, pings))
        out["ls_with_be_mbit"] = netlab.iperf(up, ls_ns, seconds, reverse).mbit
    return out


def scenario(
    rt: harness.Containerd, up: netlab.Uplink, sc: Scenario, seconds: float, pings: int
) -> dict[str, dict[str, Any]]:
    """The hook for the rules: ``sc.policy`` is the agent's policy file (hot-reloaded YAML)."""
    plugin = None
    if sc.agent:
        extra = ["--policy", str(sc.policy)] if sc.policy else []
        plugin = PluginProcess(rt.nri_socket, *runtime_args(rt), *extra)
    try:
        if plugin:
            plugin.wait_ready()
        ls = rt.run_pod("web", "Burstable", LS, sc.annotations.get("ls"), host_network=False)
        rt.create_container(ls, "main", cpu_shares=512)
        be = rt.run_pod("batch", "BestEffort", BE, sc.annotations.get("be"), host_network=False)
        rt.create_container(be, "main")
        time.sleep(1)  # the agent's hooks and first round
        result = {}
        for direction, reverse in (("upload", False), ("download", True)):
            result[direction] = measure(up, ls, be, reverse, seconds, pings)
            print(sc.name, direction, result[direction], flush=True)
        return result
    finally:
        rt.remove_all_pods()
        if plugin:
            plugin.stop()


def parse_annotations(specs: list[str]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for spec in specs:
        role, _, kv = spec.partition(":")
        key, eq, value = kv.partition("=")
        if role not in ("ls", "be") or not key or not eq:
            raise SystemExit(f"--annotate wants ls:KEY=VALUE or be:KEY=VALUE, got {spec!r}")
        out.setdefault(role, {})[key] = value
    return out


def ping_cell(p: dict[str, Any]) -> str:
    return f"{p['p50_ms']:.2f} / {p['p99_ms']:.2f}"


def write_section(path: Path, results: dict[str, Any], command: str, rate: float, seconds: float, pings: int) -> None:
    rows = []
    for name, dirs in results.items():
        for d, r in dirs.items():
            rows.append(
                f"| {name} | {d} | {r['ls_alone_mbit']:.1f} | {r['ls_with_be_mbit']:.1f} | {r['be_alone_mbit']:.1f} | "
                f"{ping_cell(r['ls_ping_idle'])} | {ping_cell(r['ls_ping_with_be'])} |"
            )
    table = "\n".join(rows)
    notes = []
    for name, dirs in results.items():
        for d, r in dirs.items():
            if name.startswith("agent") and r["ls_alone_mbit"] > 0:
                share = 100 * r["ls_with_be_mbit"] / r["ls_alone_mbit"]
                notes.append(
                    f"- {name}, {d}: LS with BE bulk {share:.0f} % of LS alone; "
                    f"ping p50 {r['ls_ping_idle']['p50_ms']:.2f} -> {r['ls_ping_with_be']['p50_ms']:.2f} ms"
                )
    summary = "\n".join(notes)
    section = f"""<!-- netqos:begin -->
## Network QoS: an LS pod next to a BE bulk flow through the node uplink (`bench/netqos.py`)

Command: `.venv/bin/python -m {command}` (2 CPUs shared with other work, {time.strftime("%Y-%m-%d")}), on the
private containerd 1.7.24 with Debian's bridge CNI (pods with their own network namespaces on
198.18.0.0/24). The node's uplink is emulated (`testkit/netlab.py`): a veth to a router namespace
with, on both ends, `tbf rate {rate:g}mbit burst 32k latency 200ms` (a NIC with a deep dumb FIFO),
and a remote host behind the router. Upload = pod egress, download = pod ingress. iperf3 goodput
over {seconds:g} s (TCP cubic); ping p50 / p99 over {pings} pings 50 ms apart from the LS pod to the
remote host; "with BE" = while the BE pod runs an iperf3 bulk flow in the same direction (2 s of
warm-up first). "no agent" is the baseline without rules.

{HEADER}
|---|---|---|---|---|---|---|
{table}

Reading: without rules the BE flow's standing queue in the FIFO (up to 200 ms deep) sits in front
of every LS packet, and an LS transfer started next to it gets only a few Mbit/s: it begins with a
~160 ms round trip against a BE window that already fills the FIFO, and cubic converges slowly.
With the rules of `examples/net-qos.yaml` (node bandwidth 90M, a little below the uplink: the
queue forms in the agent's per-pod leaves; LS guaranteed 50 %, BE 5 % and at most 20 %) the LS pod
keeps its throughput and its sub-millisecond ping next to the same BE flow, both ways; "LS alone"
is then the node's 90 Mbit/s. "BE alone", measured right after LS's transfer, lies between BE's
guaranteed 5 % (4.5) and its 20 % ceiling (18): the QoS manager's net suppress holds BE's
ceiling down while LS uses over 80 % of the node and lifts it after 5 s below 60 %. The
annotated scenario enables no class: its BE-alone column is the pod's own cap held (20M up,
10M down, as the bandwidth CNI plugin reads the annotations), and LS next to that capped flow
has the rest of the uplink.

{summary}
<!-- netqos:end -->
"""
    replace_section(path, "netqos", section)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--agent-default", action="store_true", help="also: the agent with its embedded default policy")
    ap.add_argument("--agent-policy", type=Path, action="append", default=[], help="also: the agent with FILE")
    ap.add_argument("--annotate", action="append", default=[], help="ROLE:KEY=VALUE on the ls or be pods")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--pings", type=int, default=100)
    ap.add_argument("--rate-mbit", type=float, default=100.0)
    ap.add_argument("--write", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root (containerd, network namespaces)", file=sys.stderr)
        return 2
    for p in args.agent_policy:
        if not p.is_file():
            print(f"no policy file {p}", file=sys.stderr)
            return 2
    ann = parse_annotations(args.annotate)
    scenarios = [Scenario("no agent")]
    if args.agent_default:
        scenarios.append(Scenario("agent, embedded default policy", agent=True))
    for p in args.agent_policy:
        scenarios.append(Scenario(f"agent, {p.name}", agent=True, policy=p.resolve()))
    if ann:
        said = ", ".join(f"{role} {k}={v}" for role, kv in ann.items() for k, v in kv.items())
        scenarios.append(Scenario(f"agent, embedded default, {said}", agent=True, annotations=ann))
    rt = harness.Containerd(harness.install(), Path(tempfile.mkdtemp(prefix="nriplugin-bench-")), cni=True)
    results: dict[str, Any] = {}
    try:
        rt.start()
        rt.import_images()
        with netlab.Uplink(rate_mbit=args.rate_mbit) as up:
            for sc in scenarios:
                results[sc.name] = scenario(rt, up, sc, args.seconds, args.pings)
    finally:
        rt.teardown()
    print(json.dumps(results, indent=1))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    if args.write:
        command = shown_command("bench.netqos", sys.argv[1:])
        write_section(args.write, results, command, args.rate_mbit, args.seconds, args.pings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
