"""Command line: parses ``nriplugin run`` (the agent, assembled in agent/assembly.py), ``install`` (the
pre-registered launcher), ``supervise``, ``explain``, ``doctor``, ``top`` and ``slo``.

Start-up is on the runtime's clock in pre-registered mode (containerd 1.7 gives a plugin 5 s
to register), so nothing heavy is imported here.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeAlias

log = logging.getLogger("nriplugin")

Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _address(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host or "127.0.0.1", int(port)


def _idx(value: str) -> str:
    if len(value) != 2 or not (value.isascii() and value.isdigit()):
        raise argparse.ArgumentTypeError(f"plugin index must be two digits, got {value!r}")
    return value


def _between(low: float, high: float, unit: str) -> Callable[[str], float]:
    """An option's number, from ``low`` to ``high`` inclusive (in ``unit``, for the message)."""

    def parse(value: str) -> float:
        try:
            v = float(value)
        except ValueError:
            v = math.nan
        if not low <= v <= high:
            raise argparse.ArgumentTypeError(f"expected {unit} between {low:g} and {high:g}, got {value!r}")
        return v

    return parse


_interval = _between(0.05, 3600, "seconds")
_burst_poll = _between(0, 10_000, "microseconds")  # up to 10 ms


def _mib(value: str) -> int:
    if not value.isdigit() or not 4 <= int(value) <= 1024:
        raise argparse.ArgumentTypeError(f"expected MiB between 4 and 1024, got {value!r}")
    return int(value)


def build_parser() -> argparse.ArgumentParser:
    """The command line, one piece per command (the order here is the order ``--help`` lists them)."""
    p = argparse.ArgumentParser(prog="nriplugin", description="containerd NRI plugin and node QoS agent")
    sub = p.add_subparsers(dest="command", required=True)
    for add in (add_run, add_explain, add_doctor, add_top, add_slo, add_install, add_supervise):
        add(sub)
    return p


def add_run(sub: Subcommands) -> None:
    """``run``: the agent. Its options in the order ``--help`` lists them."""
    run = sub.add_parser("run", help="run the agent (connects to the runtime's NRI socket)")
    run_runtime_options(run)
    run_node_options(run)
    run_lock_and_cluster_options(run)
    run.add_argument("--log-format", choices=("json", "text"), default="json")
    run.add_argument("--log-level", default="info")


def run_runtime_options(run: argparse.ArgumentParser) -> None:
    """How the agent talks to the runtime and answers its hooks."""
    run.add_argument(
        "--socket",
        default=os.environ.get("NRI_SOCKET", "/var/run/nri/nri.sock"),
        help="runtime NRI socket (default %(default)s; ignored when started by the runtime)",
    )
    run.add_argument("--name", default="nriplugin", help="plugin name (default %(default)s)")
    run.add_argument("--idx", type=_idx, default="10", help="two-digit plugin index (default %(default)s)")
    run.add_argument(
        "--metrics-address",
        type=_address,
        default=_address("127.0.0.1:9310"),
        help="HOST:PORT for /metrics, /healthz, /readyz (default 127.0.0.1:9310; port 0 = off)",
    )
    run.add_argument("--hook-budget-ms", type=float, default=500.0, help="time budget per hook (default %(default)s)")
    run.add_argument(
        "--burst-poll-us",
        type=_burst_poll,
        default=200.0,
        help="while the runtime's requests come back to back, the loop looks for the next one for up to "
        "this long before it sleeps: a woken thread handles a hook on cold caches (default %(default)s; "
        "0 = always sleep; costs at most this much CPU per burst)",
    )
    run.add_argument(
        "--max-message-mib",
        type=_mib,
        default=64,
        help="largest NRI message accepted from the runtime, in MiB (default %(default)s; containerd 1.7 "
        "sends Synchronize whole, over ttrpc's 4 MiB with a few thousand pods); a larger one is refused "
        "and the agent serves reconciler-only for a while",
    )
    run.add_argument(
        "--fail-closed", action="store_true", help="refuse containers whose hook fails or overruns (default: fail-open)"
    )


def run_node_options(run: argparse.ArgumentParser) -> None:
    """The policy, the cgroups and network it manages, and its safety nets."""
    run.add_argument("--policy", help="policy YAML (ours or a NodeSLO object); hot-reloaded; default: embedded")
    run.add_argument("--cgroup-root", default="/sys/fs/cgroup", help="cgroup mount (default %(default)s)")
    run.add_argument("--resctrl-root", default="/sys/fs/resctrl", help="resctrl mount (default %(default)s)")
    run.add_argument(
        "--proc-root",
        default="/proc",
        help="the host's /proc, where the QoS manager reads node CPU, memory and pressure (default "
        "%(default)s; a DaemonSet without hostPID mounts the host's elsewhere, e.g. /host/proc)",
    )
    run.add_argument(
        "--net-namespace",
        default=None,
        help="network namespace whose pod veths network QoS shapes (default: the agent's own; a "
        "DaemonSet without hostNetwork passes the host's, e.g. /proc/1/ns/net with hostPID, and needs "
        "CAP_NET_ADMIN and CAP_SYS_ADMIN for setns)",
    )
    run.add_argument(
        "--resync-seconds",
        type=float,
        default=60.0,
        help="period of the two safety nets (default %(default)s): the reconciler's full pass over every "
        "managed cgroup (drift itself is repaired at once, on inotify) and the CRI inventory (pods and "
        "containers NRI did not tell about)",
    )
    run.add_argument(
        "--cri-socket",
        default="/run/containerd/containerd.sock",
        help="the runtime's CRI socket, for the inventory NRI does not give (pre-registered start, "
        "NRI down); '' = off (default %(default)s)",
    )
    run.add_argument(
        "--pods-root",
        action="append",
        help="cgroup path (relative to a hierarchy) under which kubelet puts pods; new pod and "
        "container directories there are noticed at once, and its memory limit (kubelet's node "
        "allocatable) is the memory MemoryEvict guards (repeatable; default: found in the cgroup tree: "
        "kubepods, kubepods.slice, or one level below the kubelet's cgroupRoot)",
    )
    run.add_argument(
        "--evict-dry-run",
        action="store_true",
        help="log and count the evictions CPUEvict and MemoryEvict would do, evict nothing (also "
        "policy qosManager.eviction.dryRun)",
    )


def run_lock_and_cluster_options(run: argparse.ArgumentParser) -> None:
    """Another agent on the runtime, and the cluster side."""
    run.add_argument(
        "--if-held",
        choices=("wait", "exit"),
        default="wait",
        help="when another agent holds this runtime: stand by and take over when it exits (wait, the "
        "default), or exit 0 (what the supervisor's restarts do)",
    )
    run.add_argument(
        "--cluster",
        choices=("auto", "on", "off"),
        default="auto",
        help="the cluster side (NodeSLO, the node's pods, evictions through the Eviction API): auto (the "
        "default) = on with --kubeconfig or in a pod with a service account, else off",
    )
    run.add_argument("--kubeconfig", help="kubeconfig file for the API server (default: the service account)")
    run.add_argument("--node-name", help="this node's name (default: env NODE_NAME, else the host name)")
    run.add_argument(
        "--nodeslo",
        choices=("on", "off"),
        default="on",
        help="with the cluster side on: watch this node's NodeSLO into the policy, over --policy (default %(default)s)",
    )
    run.add_argument(
        "--nodemetric",
        choices=("on", "off"),
        default="on",
        help="with the cluster side on: report this node's usage in its NodeMetric status, at the interval "
        "koord-manager sets in its spec (default %(default)s)",
    )


def add_explain(sub: Subcommands) -> None:
    """``explain``: what the features would set for a pod description."""
    ex = sub.add_parser("explain", help="what each feature would set for a pod description (YAML/JSON) and why")
    ex.add_argument("description", help="file with {pod: {...}, containers: [...]} (see README)")
    ex.add_argument("--policy", help="policy file (default: embedded)")
    ex.add_argument("--cgroup-root", default="/sys/fs/cgroup")
    ex.add_argument("--format", choices=("yaml", "json"), default="yaml")
    ex.add_argument(
        "--runtime-nri",
        metavar="VERSION",
        help="the runtime's NRI version (e.g. v0.12.5; `nriplugin run` logs it at Configure) for what BE "
        "containers are born with; default: assumed v0.6.1",
    )


def add_doctor(sub: Subcommands) -> None:
    """``doctor``: the node's capabilities and the running agent's state."""
    doc = sub.add_parser("doctor", help="this node's capability matrix and which features can work here")
    doc.add_argument("--cgroup-root", default="/sys/fs/cgroup")
    doc.add_argument("--policy", help="policy file for what the features would do here (default: embedded)")
    doc.add_argument("--socket", default="/var/run/nri/nri.sock")
    doc.add_argument("--agent", default="127.0.0.1:9310", help="running agent's metrics address (default %(default)s)")
    doc.add_argument("--format", choices=("yaml", "json"), default="yaml")
    doc.add_argument(
        "--runtime-nri",
        metavar="VERSION",
        help="the runtime's NRI version (e.g. v0.12.5; `nriplugin run` logs it at Configure) for what BE "
        "containers are born with; default: assumed v0.6.1",
    )


def add_top(sub: Subcommands) -> None:
    """``top``: the QoS manager live."""
    top = sub.add_parser("top", help="the QoS manager live: scores, levels, class usage, bursts, decisions")
    top.add_argument("--agent", default="127.0.0.1:9310", help="running agent's metrics address (default %(default)s)")
    top.add_argument("--interval", type=_interval, default=1.0, help="seconds between polls (default %(default)s)")
    top.add_argument("--once", action="store_true", help="print one frame and exit (for scripts)")


def add_slo(sub: Subcommands) -> None:
    """``slo``: hook latency against the SLO."""
    slo = sub.add_parser("slo", help="hook latency against the SLO, per event, from a running agent's /metrics")
    slo.add_argument(
        "--agent", default="127.0.0.1:9310", help="agent HOST:PORT or a /metrics URL (default %(default)s)"
    )
    slo.add_argument("--event", default="create_container", help="the SLO's hook (default %(default)s)")
    slo.add_argument("--threshold-ms", type=float, default=2.0, help="answered within (default %(default)s)")
    slo.add_argument("--objective", type=float, default=99.9, help="percent of hooks within it (default %(default)s)")
    slo.add_argument("--window-days", type=int, default=30, help="the SLO's window (default %(default)s)")


def add_install(sub: Subcommands) -> None:
    """``install``: the pre-registered plugin, a launcher or the bundle."""
    inst = sub.add_parser("install", help="install a pre-registered launcher into the runtime's plugin dir")
    inst.add_argument("--plugin-dir", default="/opt/nri/plugins", help="runtime plugin dir (default %(default)s)")
    inst.add_argument("--name", default="nriplugin")
    inst.add_argument("--idx", type=_idx, default="10")
    inst.add_argument(
        "--log-file", help="where the launcher sends the agent's log (default: none; the runtime discards it)"
    )
    inst.add_argument(
        "--bundle",
        metavar="PATH",
        help="install this self-contained executable (image/bundle.sh) as the plugin instead of a launcher "
        "(the default when `install` runs from the bundle itself)",
    )
    inst.add_argument("args", nargs=argparse.REMAINDER, help="extra arguments for `nriplugin run`")


def add_supervise(sub: Subcommands) -> None:
    """``supervise``: the agent, restarted if it crashes (its arguments are ``run``'s)."""
    sup = sub.add_parser(
        "supervise", help="run the agent and restart it on the runtime's socket if it crashes (the launcher's job)"
    )
    sup.add_argument("args", nargs=argparse.REMAINDER, help="arguments for `nriplugin run`")


def launcher_script(python: str, args: list[str], log_file: str | None = None) -> str:
    """A launcher with absolute paths (the runtime starts plugins with no PATH at all) that
    runs the supervisor: it restarts the agent on the runtime's socket if the agent crashes."""
    import shlex

    quoted = " ".join(shlex.quote(a) for a in [python, "-m", "nriplugin", "supervise", *args])
    redirect = f"exec >>{shlex.quote(log_file)} 2>&1\n" if log_file else ""
    return f"#!/bin/sh\n# Written by `nriplugin install`; started by the container runtime.\n{redirect}exec {quoted}\n"


OPTIONS_SUFFIX = ".options.json"


def options_path(executable: str) -> Path:
    """Where a bundled plugin finds its options: next to itself, ``IDX-NAME.options.json``.
    The runtime starts a plugin with no arguments, and skips files that are not executable."""
    return Path(executable).with_name(Path(executable).name + OPTIONS_SUFFIX)


def read_options(executable: str) -> tuple[list[str], str | None]:
    """(run's arguments, log file) for a plugin the runtime started with no arguments."""
    path = options_path(executable)
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return [], None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected an object with 'args' and 'logFile'")
    args, log_file = raw.get("args", []), raw.get("logFile")
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ValueError(f"{path}: 'args' must be a list of strings")
    if log_file is not None and not isinstance(log_file, str):
        raise ValueError(f"{path}: 'logFile' must be a string")
    return args, log_file


def frozen() -> bool:
    return bool(getattr(sys, "frozen", False))


def install(
    plugin_dir: str,
    name: str,
    idx: str,
    args: list[str],
    log_file: str | None = None,
    bundle: str | None = None,
) -> Path:
    """Write the plugin after checking its arguments: a pre-registered plugin that cannot
    start makes containerd 1.7 exit, so what can be checked now is checked now. The plugin is
    the self-contained executable (``bundle``, or this one when it is the bundle) with its
    options next to it, else a launcher that runs this Python environment's nriplugin."""
    if "/" in name or not name:
        raise SystemExit(f"invalid plugin name {name!r}")
    from nriplugin.agent.preflight import StartupError, check_cgroup_root, check_policy_readable

    try:
        ns = build_parser().parse_args(["run", *args])
    except SystemExit:
        raise SystemExit(f"invalid arguments for `nriplugin run`: {' '.join(args)}") from None
    try:
        check_cgroup_root(ns.cgroup_root)
        if ns.policy:
            check_policy_readable(ns.policy)
    except StartupError as exc:
        raise SystemExit(f"not installed: {exc}") from None
    if bundle is None and frozen():
        bundle = sys.executable
    if bundle is not None and not (os.path.isfile(bundle) and os.access(bundle, os.X_OK)):
        raise SystemExit(f"not installed: --bundle {bundle}: not an executable file")
    target = Path(plugin_dir) / f"{idx}-{name}"
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    options = options_path(str(target))
    if bundle is not None:
        if os.path.realpath(bundle) != os.path.realpath(target):
            shutil.copyfile(bundle, tmp)
        else:
            shutil.copyfile(target, tmp)  # reinstalling itself: new options only
        if args or log_file:
            opts_tmp = options.with_name(f".{options.name}.tmp")
            opts_tmp.write_text(json.dumps({"args": args, "logFile": log_file}, indent=2) + "\n")
            opts_tmp.replace(options)
        else:
            options.unlink(missing_ok=True)
    else:
        tmp.write_text(launcher_script(os.path.abspath(sys.executable), args, log_file))
        options.unlink(missing_ok=True)  # a bundle's, from an earlier install
    tmp.chmod(stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    tmp.replace(target)
    return target


def preregistered_start() -> int:
    """The runtime started this executable with no arguments (as it starts every plugin in its
    plugin dir): supervise the agent with the options installed next to it."""
    from nriplugin.agent import supervise

    try:
        args, log_file = read_options(sys.executable if frozen() else sys.argv[0])
    except ValueError as exc:
        # Still register (containerd 1.7 exits if a pre-registered plugin does not): defaults.
        print(f"nriplugin: ignoring unreadable options, running with the defaults: {exc}", file=sys.stderr)
        args, log_file = [], None
    if log_file:
        fd = os.open(log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    return supervise.main(args)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args and os.environ.get("NRI_PLUGIN_SOCKET"):
        return preregistered_start()
    if args[:1] == ["supervise"]:
        # Everything after `supervise` belongs to `run` (argparse's REMAINDER stops at options).
        return supervise_agent(args[1:])
    ns = build_parser().parse_args(args)
    return COMMANDS[ns.command](ns)


def run_agent(ns: argparse.Namespace) -> int:
    from nriplugin.obs import logs

    logs.setup(ns.log_format, ns.log_level)
    from nriplugin.agent import assembly as agent

    try:
        return agent.main(ns)
    except ValueError as exc:  # e.g. NRI_PLUGIN_SOCKET that is not a file descriptor
        log.error("%s", exc)
        return agent.EXIT_STARTUP


def supervise_agent(args: list[str]) -> int:
    from nriplugin.agent import supervise

    return supervise.main([a for a in args if a != "--"])


def install_plugin(ns: argparse.Namespace) -> int:
    from nriplugin.obs import logs

    logs.setup("text")
    extra = [a for a in ns.args if a != "--"]
    target = install(ns.plugin_dir, ns.name, ns.idx, extra, ns.log_file, ns.bundle)
    print(f"installed {target}")
    return 0


def show_top(ns: argparse.Namespace) -> int:
    from nriplugin.cli import top

    return top.run(ns.agent, ns.interval, ns.once)


def show_slo(ns: argparse.Namespace) -> int:
    from nriplugin.obs import slo

    try:
        want = slo.SLO(ns.event, ns.threshold_ms / 1e3, ns.objective / 100, ns.window_days)
    except ValueError as exc:
        print(f"nriplugin slo: {exc}", file=sys.stderr)
        return 2
    return slo.run(ns.agent, want)


def report(ns: argparse.Namespace, build: Callable[[], dict[str, Any]]) -> int:
    """``explain`` and ``doctor``: the report in ``--format`` on stdout, or why not and status 2;
    ``doctor`` with no agent answering: the report, then one line saying so and status 1."""
    from nriplugin.obs import logs

    logs.setup("text", "warning")
    from nriplugin.cli import explain

    try:
        out = build()
    except (ValueError, OSError) as exc:
        print(f"nriplugin {ns.command}: {exc}", file=sys.stderr)
        return 2
    print(explain.render(out, ns.format), end="")
    missing = explain.no_agent(out["agent"]) if "agent" in out else None
    if missing is not None:
        sys.stdout.flush()  # the report first, the line last, also on a terminal
        print(f"nriplugin {ns.command}: {missing}", file=sys.stderr)
        return 1
    return 0


def show_explain(ns: argparse.Namespace) -> int:
    def build() -> dict[str, Any]:
        from nriplugin.cli import explain
        from nriplugin.kernel.cgroup import Cgroups

        rules = explain.load_rules(ns.policy)
        return explain.explain(
            explain.load_description(Path(ns.description)), rules, Cgroups(Path(ns.cgroup_root)), ns.runtime_nri
        )

    return report(ns, build)


def show_doctor(ns: argparse.Namespace) -> int:
    def build() -> dict[str, Any]:
        from nriplugin.cli import explain
        from nriplugin.kernel.cgroup import Cgroups
        from nriplugin.kernel.probe import probe

        cg = Cgroups(Path(ns.cgroup_root))
        policy = explain.load_rules(ns.policy).policy
        out = explain.doctor(probe(cg.root), cg, ns.socket, policy=policy, runtime_nri=ns.runtime_nri)
        out["agent"] = explain.agent_state(ns.agent)
        return out

    return report(ns, build)


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": run_agent,
    "install": install_plugin,
    "supervise": lambda ns: supervise_agent(ns.args),
    "explain": show_explain,
    "doctor": show_doctor,
    "top": show_top,
    "slo": show_slo,
}
