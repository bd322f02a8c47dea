"""Command line: parses ``nriplugin run`` (the agent, assembled in agent.py), ``install`` (the
pre-registered launcher), ``supervise``, ``explain``, ``doctor`` and ``top``.

Start-up is on the runtime's clock in pre-registered mode (containerd 1.7 gives a plugin 5 s
to register), so nothing heavy is imported here.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import stat
import sys
from pathlib import Path

log = logging.getLogger("nriplugin")


def _address(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host or "127.0.0.1", int(port)


def _idx(value: str) -> str:
    if len(value) != 2 or not value.isdigit():
        raise argparse.ArgumentTypeError(f"plugin index must be two digits, got {value!r}")
    return value


def _interval(value: str) -> float:
    try:
        v = float(value)
    except ValueError:
        v = 0.0
    if not 0.05 <= v <= 3600:
        raise argparse.ArgumentTypeError(f"expected seconds between 0.05 and 3600, got {value!r}")
    return v


def _mib(value: str) -> int:
    if not value.isdigit() or not 4 <= int(value) <= 1024:
        raise argparse.ArgumentTypeError(f"expected MiB between 4 and 1024, got {value!r}")
    return int(value)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nriplugin", description="containerd NRI plugin and node QoS agent")
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the agent (connects to the runtime's NRI socket)")
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
    run.add_argument("--policy", help="policy YAML (ours or a NodeSLO object); hot-reloaded; default: embedded")
    run.add_argument("--cgroup-root", default="/sys/fs/cgroup", help="cgroup mount (default %(default)s)")
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
        "container directories there are noticed at once (repeatable; default: kubepods, kubepods.slice)",
    )
    run.add_argument(
        "--if-held",
        choices=("wait", "exit"),
        default="wait",
        help="when another agent holds this runtime: stand by and take over when it exits (wait, the "
        "default), or exit 0 (what the supervisor's restarts do)",
    )
    run.add_argument("--log-format", choices=("json", "text"), default="json")
    run.add_argument("--log-level", default="info")

    ex = sub.add_parser("explain", help="what each feature would set for a pod description (YAML/JSON) and why")
    ex.add_argument("description", help="file with {pod: {...}, containers: [...]} (see README)")
    ex.add_argument("--policy", help="policy file (default: embedded)")
    ex.add_argument("--cgroup-root", default="/sys/fs/cgroup")
    ex.add_argument("--format", choices=("yaml", "json"), default="yaml")

    doc = sub.add_parser("doctor", help="this node's capability matrix and which features can work here")
    doc.add_argument("--cgroup-root", default="/sys/fs/cgroup")
    doc.add_argument("--socket", default="/var/run/nri/nri.sock")
    doc.add_argument("--agent", default="127.0.0.1:9310", help="running agent's metrics address (default %(default)s)")
    doc.add_argument("--format", choices=("yaml", "json"), default="yaml")

    top = sub.add_parser("top", help="the QoS manager live: scores, levels, class usage, bursts, decisions")
    top.add_argument("--agent", default="127.0.0.1:9310", help="running agent's metrics address (default %(default)s)")
    top.add_argument("--interval", type=_interval, default=1.0, help="seconds between polls (default %(default)s)")
    top.add_argument("--once", action="store_true", help="print one frame and exit (for scripts)")

    inst = sub.add_parser("install", help="install a pre-registered launcher into the runtime's plugin dir")
    inst.add_argument("--plugin-dir", default="/opt/nri/plugins", help="runtime plugin dir (default %(default)s)")
    inst.add_argument("--name", default="nriplugin")
    inst.add_argument("--idx", type=_idx, default="10")
    inst.add_argument(
        "--log-file", help="where the launcher sends the agent's log (default: none; the runtime discards it)"
    )
    inst.add_argument("args", nargs=argparse.REMAINDER, help="extra arguments for `nriplugin run`")

    sup = sub.add_parser(
        "supervise", help="run the agent and restart it on the runtime's socket if it crashes (the launcher's job)"
    )
    sup.add_argument("args", nargs=argparse.REMAINDER, help="arguments for `nriplugin run`")
    return p


def launcher_script(python: str, args: list[str], log_file: str | None = None) -> str:
    """A launcher with absolute paths (the runtime starts plugins with no PATH at all) that
    runs the supervisor: it restarts the agent on the runtime's socket if the agent crashes."""
    import shlex

    quoted = " ".join(shlex.quote(a) for a in [python, "-m", "nriplugin", "supervise", *args])
    redirect = f"exec >>{shlex.quote(log_file)} 2>&1\n" if log_file else ""
    return f"#!/bin/sh\n# Written by `nriplugin install`; started by the container runtime.\n{redirect}exec {quoted}\n"


def install(plugin_dir: str, name: str, idx: str, args: list[str], log_file: str | None = None) -> Path:
    """Write the launcher after checking its arguments: a pre-registered plugin that cannot
    start makes containerd 1.7 exit, so what can be checked now is checked now."""
    if "/" in name or not name:
        raise SystemExit(f"invalid plugin name {name!r}")
    from .preflight import StartupError, check_cgroup_root, check_policy_readable

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
    target = Path(plugin_dir) / f"{idx}-{name}"
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(launcher_script(os.path.abspath(sys.executable), args, log_file))
    tmp.chmod(stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    tmp.replace(target)
    return target


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["supervise"]:
        # Everything after `supervise` belongs to `run` (argparse's REMAINDER stops at options).
        from . import supervise

        return supervise.main([a for a in args[1:] if a != "--"])
    ns = build_parser().parse_args(args)
    from . import logs

    if ns.command == "install":
        logs.setup("text")
        extra = [a for a in ns.args if a != "--"]
        target = install(ns.plugin_dir, ns.name, ns.idx, extra, ns.log_file)
        print(f"installed {target}")
        return 0
    if ns.command == "top":
        from . import top  # rich: only here, never on the agent's start-up

        return top.run(ns.agent, ns.interval, ns.once)
    if ns.command in ("explain", "doctor"):
        logs.setup("text", "warning")
        from . import explain

        try:
            if ns.command == "explain":
                from .kernel.cgroup import Cgroups

                rules = explain.load_rules(ns.policy)
                out = explain.explain(
                    explain.load_description(Path(ns.description)), rules, Cgroups(Path(ns.cgroup_root))
                )
            else:
                from .kernel.cgroup import Cgroups
                from .kernel.probe import probe

                cg = Cgroups(Path(ns.cgroup_root))
                out = explain.doctor(probe(cg.root), cg, ns.socket)
                out["agent"] = explain.agent_state(ns.agent)
        except (ValueError, OSError) as exc:
            print(f"nriplugin {ns.command}: {exc}", file=sys.stderr)
            return 2
        print(explain.render(out, ns.format), end="")
        return 0
    logs.setup(ns.log_format, ns.log_level)
    from . import agent

    try:
        return asyncio.run(agent.run(ns))
    except ValueError as exc:  # e.g. NRI_PLUGIN_SOCKET that is not a file descriptor
        log.error("%s", exc)
        return agent.EXIT_STARTUP
