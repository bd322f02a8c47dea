"""Command line: ``nriplugin run`` (the agent) and ``nriplugin install`` (pre-registered launcher).

Start-up is on the runtime's clock in pre-registered mode (containerd 1.7 gives a plugin 5 s
to register), so heavy imports (prometheus_client) happen after registration.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


# Exit status: 0 stopped (or nothing to do), 1 an unexpected failure (an uncaught exception:
# the supervisor restarts the agent), 2 the agent cannot run as configured (one line says why).
EXIT_STARTUP = 2


async def run(ns: argparse.Namespace) -> int:
    """Assemble and run the agent.

    Order matters (see README, "One agent per runtime"): start-up checks and the runtime lock
    come before registering; a pre-registered agent registers within the runtime's 5 s
    whatever happens (containerd 1.7 exits otherwise) and loads the rest afterwards; an agent
    that finds the runtime held stands by without writing anything; on SIGTERM the NRI
    connection closes first, nothing is reset, and the lock is released last.
    """
    from dataclasses import replace

    from .agent_lock import AgentLock, Holder
    from .nri.stub import BufferedObserver, HookPolicy, Plugin, Stub, StubOptions
    from .preflight import StartupError, bind_metrics, check_cgroup_root, check_policy_readable, check_socket
    from .supervise import ENV_GAP_CAUSE, ENV_GAP_SINCE  # set when the supervisor restarts a crashed agent

    class Placeholder(Plugin):
        def create_container(self, pod: object, container: object) -> None:
            return None

    class Inert(Plugin):
        """Registered, serving nothing: a pre-registered agent that must not serve (another
        agent holds the runtime, or a start-up error) still has to register, or containerd
        1.7 exits. One rare event is subscribed (mask 0 would mean all) and never adjusted."""

        def post_update_container(self, pod: object, container: object) -> None:
            return None

    opts = StubOptions.from_env(
        name=ns.name,
        idx=ns.idx,
        socket_path=ns.socket,
        default_policy=HookPolicy(budget=ns.hook_budget_ms / 1000.0, fail_closed=ns.fail_closed),
    )
    prereg = opts.fd is not None
    gap_since = os.environ.pop(ENV_GAP_SINCE, "")
    gap_cause = os.environ.pop(ENV_GAP_CAUSE, "crash")
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    active: list[Stub] = []  # stubs to close first on SIGTERM
    closed_at: list[float] = []

    def on_signal() -> None:
        if not closed_at:
            closed_at.append(time.time())
        stopping.set()
        for s in active:
            s.stop()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)

    async def inert_until_closed(reason: str) -> int:
        """Pre-registered and unable to serve: register inert, exit when the runtime lets go."""
        stub = Stub(Inert(), opts)
        active.append(stub)
        log.error("pre-registered: registering inert (containerd 1.7 exits otherwise); not serving: %s", reason)
        await stub.run()
        return EXIT_STARTUP

    lock = AgentLock(ns.socket)
    if prereg:
        # containerd starts pre-registered plugins before it creates the socket's directory
        # (on a fresh boot it is not there yet); the lock lives in it, so make it as containerd would.
        with contextlib.suppress(OSError):
            os.makedirs(os.path.dirname(os.path.abspath(ns.socket)), 0o700, exist_ok=True)
    try:
        check_socket(ns.socket)
        check_cgroup_root(ns.cgroup_root)
        try:
            lock.open()
        except OSError as exc:
            raise StartupError(
                "--socket",
                ns.socket,
                f"cannot open the agent lock {lock.path}: {exc.strerror}",
                "the socket's directory must be writable (mount it read-write)",
            ) from exc
        if ns.policy and not prereg:
            check_policy_readable(ns.policy)
        got = lock.try_acquire()
        previous = lock.holder()
        if not got and ns.if_held == "exit" and not prereg:
            who = previous.describe() if previous else "holder unknown"
            log.info("another nriplugin (%s) serves the runtime at %s; nothing to do", who, ns.socket)
            return 0
        try:
            metrics_sock = bind_metrics(*ns.metrics_address)
        except StartupError as exc:
            if got or previous is None:
                raise
            raise StartupError(
                "--metrics-address",
                "{}:{}".format(*ns.metrics_address),
                f"{exc.problem}; the agent that holds the runtime ({previous.describe()}) may be the one",
                "give this one another --metrics-address, or port 0, to stand by next to it",
            ) from exc
    except StartupError as exc:
        lock.close()  # never hold the runtime while not serving it
        log.error("%s", exc, extra={"option": exc.option})
        return await inert_until_closed(str(exc)) if prereg else EXIT_STARTUP

    standby: Stub | None = None
    standby_runner: asyncio.Future[None] | None = None
    if prereg and not got:
        standby = Stub(Inert(), opts)
        active.append(standby)
        standby_runner = asyncio.ensure_future(standby.run())
    # The serving stub: registers at once when pre-registered (RegisterPlugin is what the
    # runtime's 5 s start-up timeout waits for; the real plugin loads while Configure is on
    # its way), otherwise after the checks below and once the runtime lock is ours.
    early = BufferedObserver()
    stub = Stub(Placeholder(), opts if got else replace(opts, fd=None), observer=early, placeholder=True)
    runner: asyncio.Future[None] | None = None
    if prereg and got:
        active.append(stub)
        runner = asyncio.ensure_future(stub.run())
        for _ in range(50):  # until the RegisterPlugin call is on the wire (or 50 ms without a runtime)
            if stub.connections:
                break
            await asyncio.sleep(0.001)
        await asyncio.sleep(0)
    standby_reason = ""
    if not got:
        standby_reason = (
            f"another nriplugin ({previous.describe() if previous else 'holder unknown'}) holds the runtime at "
            f"{ns.socket} (lock {lock.path}); standing by to take over when it exits"
        )
        log.warning("%s", standby_reason, extra={"socket": ns.socket, "holder_pid": previous.pid if previous else 0})

    from .kernel.cgroup import Cgroups
    from .node import Node
    from .plugin import QoSPlugin
    from .policy.cache import PolicyError, RuleCache

    rules = RuleCache()
    if ns.policy:
        try:
            rules.load_file(Path(ns.policy))
        except PolicyError as exc:
            if not prereg:
                log.error("--policy: %s; fix the file, or leave --policy out for the embedded default", exc)
                if metrics_sock is not None:
                    metrics_sock.close()
                return EXIT_STARTUP
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

    if runner is not None:
        # Register first; metrics and the HTTP endpoint come up right after (or after 1 s).
        first: list[asyncio.Future[Any]] = [runner, asyncio.ensure_future(stub.ready.wait())]
        await asyncio.wait(first, timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
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

    def readyz() -> tuple[int, str, bytes]:
        if stub.ready.is_set():
            return 200, "text/plain", b"ready\n"
        if standby_reason:
            # Ready: standing by is this agent's intended state (a surge rollout waits for it).
            return 200, "text/plain", f"standby: {standby_reason}\n".encode()
        return 503, "text/plain", b"not registered with the runtime\n"

    def healthz() -> tuple[int, str, bytes]:
        return 200, "text/plain", (f"ok (standby: {standby_reason})\n" if standby_reason else "ok\n").encode()

    server = None
    if metrics_sock is not None:
        server = await http.serve(
            metrics_sock,
            {
                "/metrics": lambda: (200, "text/plain; version=0.0.4", metrics.render()),
                "/healthz": healthz,
                "/readyz": readyz,
            },
        )
        host, port = ns.metrics_address
        log.info("metrics on http://%s:%d/metrics", host, port, extra={"address": f"{host}:{port}"})

    def shut_http() -> None:
        if server is not None:
            server.close()
        elif metrics_sock is not None:
            metrics_sock.close()

    gap: tuple[float, str] | None = None  # when the runtime last had an agent, and why it went
    if gap_since:
        gap = (float(gap_since), gap_cause)
    elif previous is not None and previous.released and got:
        gap = (previous.released, "handover")
    elif previous is not None and got and previous.pid != os.getpid():
        log.warning("the previous agent (%s) ended without handing over", previous.describe())
    if not got:
        observer.connection_state("standby")
        waiter = asyncio.ensure_future(lock.wait())
        stop_waiter = asyncio.ensure_future(stopping.wait())
        waits: set[asyncio.Future[Any]] = {waiter, stop_waiter}
        if standby_runner is not None:
            waits.add(standby_runner)  # ends when the runtime closes the pre-registered connection
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        stop_waiter.cancel()
        if not waiter.done():
            waiter.cancel()
            if standby is not None:
                standby.stop()
            if standby_runner is not None:
                await standby_runner
            if inventory is not None:
                await inventory.client.close()
            shut_http()
            return 0
        # A clean handover says when it stopped serving; a holder that died did not, but we
        # were blocked on the lock until the moment it died.
        last = lock.holder()
        gap = (last.released, "handover") if last is not None and last.released else (time.time(), "crash")
        standby_reason = ""
        if standby is not None:
            # Pre-registered standby: leave the inert connection and serve on the socket, which
            # brings Synchronize (a pre-registered plugin gets none on containerd 1.7).
            active.remove(standby)
            standby.stop()
            if standby_runner is not None:
                await standby_runner
        observer.connection_state("disconnected")
        log.info("the runtime at %s is ours now; registering", ns.socket)
    me = Holder.me("pre-registered" if runner is not None else "socket", ns.socket)
    if gap_since:
        me = replace(me, mode="supervised restart")
    lock.announce(me)
    if runner is None:
        active.append(stub)
        runner = asyncio.ensure_future(stub.run())
        if stopping.is_set():
            stub.stop()
    reconciler.start(loop)
    watcher = None
    if ns.policy:
        from .policy.cache import PolicyWatcher

        watcher = PolicyWatcher(Path(ns.policy), rules, loop)
        watcher.start()

    async def report_gap(since: float, cause: str) -> None:
        await stub.ready.wait()
        seconds = max(0.0, time.time() - since)
        metrics.agent_gap.labels(cause).observe(seconds)
        log.warning(
            "no agent answered the runtime's hooks for %.3f s (%s)",
            seconds,
            cause,
            extra={"gap_seconds": round(seconds, 6), "cause": cause},
        )

    gap_task = loop.create_task(report_gap(*gap)) if gap is not None else None
    # The runtime's own inventory: what existed before us when no Synchronize comes.
    inventory_task = loop.create_task(inventory.run()) if inventory is not None else None
    try:
        await runner
    finally:
        # The NRI connection is closed by now (SIGTERM closes it first, or the runtime did):
        # stop writing, hand the runtime over, then the rest. No value is reset on the way out.
        if inventory_task is not None:
            inventory_task.cancel()
        reconciler.stop()
        lock.release(me, closed_at[0] if closed_at else time.time())
        if gap_task is not None:
            gap_task.cancel()
        if inventory is not None:
            await inventory.client.close()
        shut_http()
        if watcher is not None:
            watcher.stop()
    return 0


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
    except ValueError as exc:  # e.g. NRI_PLUGIN_SOCKET that is not a file descriptor
        log.error("%s", exc)
        return EXIT_STARTUP
