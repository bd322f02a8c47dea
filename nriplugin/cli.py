"""Command line: ``nriplugin run`` (the agent) and ``nriplugin install`` (pre-registered launcher).

Start-up is on the runtime's clock in pre-registered mode (containerd 1.7 gives a plugin 5 s
to register), so heavy imports (prometheus_client) happen after registration.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import stat
import sys
from collections.abc import Callable
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
        "--fail-closed", action="store_true", help="refuse containers whose hook fails or overruns (default: fail-open)"
    )
    run.add_argument("--policy", help="policy YAML (ours or a NodeSLO object); hot-reloaded; default: embedded")
    run.add_argument("--cgroup-root", default="/sys/fs/cgroup", help="cgroup mount (default %(default)s)")
    run.add_argument(
        "--resync-seconds",
        type=float,
        default=60.0,
        help="full reconciler pass every N seconds (default %(default)s; drift is repaired on inotify)",
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

    inst = sub.add_parser("install", help="install a pre-registered launcher into the runtime's plugin dir")
    inst.add_argument("--plugin-dir", default="/opt/nri/plugins", help="runtime plugin dir (default %(default)s)")
    inst.add_argument("--name", default="nriplugin")
    inst.add_argument("--idx", type=_idx, default="10")
    inst.add_argument("args", nargs=argparse.REMAINDER, help="extra arguments for `nriplugin run`")
    return p


def launcher_script(python: str, args: list[str]) -> str:
    """A launcher with absolute paths: the runtime starts plugins with no PATH at all."""
    import shlex

    quoted = " ".join(shlex.quote(a) for a in [python, "-m", "nriplugin", "run", *args])
    return f"#!/bin/sh\n# Written by `nriplugin install`; started by the container runtime.\nexec {quoted}\n"


def install(plugin_dir: str, name: str, idx: str, args: list[str]) -> Path:
    if "/" in name or not name:
        raise SystemExit(f"invalid plugin name {name!r}")
    target = Path(plugin_dir) / f"{idx}-{name}"
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(launcher_script(os.path.abspath(sys.executable), args))
    tmp.chmod(stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    tmp.replace(target)
    return target


async def run(ns: argparse.Namespace) -> int:
    from .nri.stub import BufferedObserver, HookPolicy, Plugin, Stub, StubOptions

    class Placeholder(Plugin):
        def create_container(self, pod: object, container: object) -> None:
            return None

    opts = StubOptions.from_env(
        name=ns.name,
        idx=ns.idx,
        socket_path=ns.socket,
        default_policy=HookPolicy(budget=ns.hook_budget_ms / 1000.0, fail_closed=ns.fail_closed),
    )
    # Register first with a placeholder (RegisterPlugin is what the runtime's 5 s start-up
    # timeout waits for); the real plugin (pydantic, probes) loads while Configure is on its way.
    early = BufferedObserver()
    stub = Stub(Placeholder(), opts, observer=early, placeholder=True)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stub.stop)
    runner = asyncio.ensure_future(stub.run())
    for _ in range(50):  # until the RegisterPlugin call is on the wire (or 50 ms without a runtime)
        if stub.connections:
            break
        await asyncio.sleep(0.001)
    await asyncio.sleep(0)

    from .kernel.cgroup import Cgroups
    from .node import Node
    from .plugin import QoSPlugin
    from .policy.cache import PolicyError, RuleCache

    rules = RuleCache()
    if ns.policy:
        try:
            rules.load_file(Path(ns.policy))
        except PolicyError as exc:
            # Refusing to start would stop registration (containerd 1.7 exits when a
            # pre-registered plugin fails to register): run on the embedded default, loudly.
            log.error("policy rejected, running with the embedded default: %s", exc)
    invalid: list[str] = []
    report_invalid: list[Callable[[str], None]] = [invalid.append]  # metrics load later
    node = Node.create(rules, cgroups=Cgroups(Path(ns.cgroup_root)), on_invalid=lambda r: report_invalid[0](r))
    plugin = QoSPlugin(node, push=stub.update_containers)
    from .reconciler import Reconciler

    inventory = None
    if ns.cri_socket:
        from .cri.client import AsyncCRI
        from .reconciler.cri_inventory import CriInventory

        inventory = CriInventory(
            AsyncCRI(ns.cri_socket), node.model, period=ns.resync_seconds, hooks_live=stub.ready.is_set
        )

    def on_new_dir(group: str) -> None:
        # With NRI up, the hooks tell us about every new container; without it, ask the runtime.
        if inventory is not None and not stub.ready.is_set():
            inventory.kick()

    reconciler = Reconciler(
        node.desired,
        node.writer,
        node.model,
        resync_period=ns.resync_seconds,
        roots=ns.pods_root or ["kubepods", "kubepods.slice"],
        on_new_dir=on_new_dir,
    )
    stub.replace_plugin(plugin)
    reconciler.start(loop)

    # Register first; metrics and the HTTP endpoint come up right after (or after 1 s).
    await asyncio.wait(
        [runner, asyncio.ensure_future(stub.ready.wait())], timeout=1.0, return_when=asyncio.FIRST_COMPLETED
    )
    from . import http
    from .metrics import InventoryMetrics, Metrics, ReconcilerMetrics, StubMetrics

    metrics = Metrics()
    observer = StubMetrics(metrics)
    early.replay(observer)
    stub.observer = observer
    reconciler.observer = ReconcilerMetrics(metrics)
    if inventory is not None:
        inventory.observer = InventoryMetrics(metrics)
    for reason in invalid:
        metrics.invalid_input.labels(reason).inc()
    report_invalid[0] = lambda reason: metrics.invalid_input.labels(reason).inc()
    metrics.policy_version.set(rules.current.version)
    rules.subscribe(lambda v: metrics.policy_version.set(v.version))
    watcher = None
    if ns.policy:
        from .policy.cache import PolicyWatcher

        watcher = PolicyWatcher(Path(ns.policy), rules, asyncio.get_running_loop())
        watcher.start()
    server = None
    host, port = ns.metrics_address
    if port:
        server = await http.serve(
            host,
            port,
            {
                "/metrics": lambda: (200, "text/plain; version=0.0.4", metrics.render()),
                "/healthz": lambda: (200, "text/plain", b"ok\n"),
                "/readyz": lambda: (
                    (200, "text/plain", b"ready\n")
                    if stub.ready.is_set()
                    else (503, "text/plain", b"not registered with the runtime\n")
                ),
            },
        )
        log.info("metrics on http://%s:%d/metrics", host, port, extra={"address": f"{host}:{port}"})
    # The runtime's own inventory: what existed before us when no Synchronize comes.
    inventory_task = loop.create_task(inventory.run()) if inventory is not None else None
    try:
        await runner
    finally:
        if inventory_task is not None:
            inventory_task.cancel()
        if inventory is not None:
            await inventory.client.close()
        if server is not None:
            server.close()
        if watcher is not None:
            watcher.stop()
        reconciler.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    from . import logs

    if ns.command == "install":
        logs.setup("text")
        extra = [a for a in ns.args if a != "--"]
        target = install(ns.plugin_dir, ns.name, ns.idx, extra)
        print(f"installed {target}")
        return 0
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
    try:
        return asyncio.run(run(ns))
    except ValueError as exc:
        log.error("%s", exc)
        return 2
