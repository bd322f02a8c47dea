"""The agent, assembled in one place from ``nriplugin run``'s options (cli/main.py only parses).

What drives what:
- the **stub** (``nri/stub.py``) talks NRI and calls the **hook adapter** (``node/hooks.py``),
  which feeds the **node model** (``node/model.py``) and answers from the **desired state**
  (``node/desired.py``: features ⊕ overlays);
- the **CRI inventory** (``inventory/cri.py``) feeds the same model when NRI does not tell (at
  start, every ``--resync-seconds``, and on new cgroup directories while NRI is down);
- the **reconciler** (``reconciler/``) follows the model, keeps every managed cgroup at its
  desired state through the one **writer** (``node/writer.py``), and runs a full pass every
  ``--resync-seconds`` and after each Synchronize;
- the **QoS manager** (``qos/``) measures the node and the classes (``qos/collect.py``), scores
  the pressure (``qos/scores.py``, ``qos/levels.py``) and suppresses BE / lets LS burst as
  overlays on the desired state (``qos/manager.py``), every ``syncPeriod`` and on a 30 ms
  fast path;
- **network QoS** (``netqos/``) keeps the pods' tc rules, off the hook path;
- the **runtime lock** (``agent/lock.py``) makes this agent the only one serving the runtime.

Order matters (README, "One agent per runtime"): start-up checks and the runtime lock come
before registering; a pre-registered agent registers within the runtime's 5 s whatever
happens (containerd 1.7 exits otherwise) and loads the rest afterwards, so heavy imports
(pydantic, prometheus_client) come after registration; an agent that finds the runtime held
stands by without writing anything; on SIGTERM the NRI connection closes first, the QoS
manager's overlays are given back (BE's quota, bursts: on the kubelet's groups), and the lock
is released last of what touches the node: once every writer has stopped
(the HTTP endpoint, the policy watcher and the cluster side close after it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib
import logging
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from nriplugin.agent.idle_gc import IdleCollector
from nriplugin.agent.lock import AgentLock, Holder
from nriplugin.agent.preflight import StartupError, bind_metrics, check_cgroup_root, check_policy_readable, check_socket
from nriplugin.agent.supervise import ENV_GAP_CAUSE, ENV_GAP_SINCE
from nriplugin.nri.stub import BufferedObserver, HookPolicy, Plugin, Stub, StubOptions, handled_events
from nriplugin.pacing.selector import PollClock
from nriplugin.pacing.traffic import HookTraffic
from nriplugin.pacing.turns import Pacer

if TYPE_CHECKING:
    from nriplugin.cluster.pods import PodCache
    from nriplugin.inventory.cri import CriInventory
    from nriplugin.kernel.cgroup import Cgroups
    from nriplugin.netqos.reconciler import NetQoS
    from nriplugin.node.assembly import Node
    from nriplugin.node.desired import DesiredState
    from nriplugin.node.hooks import QoSPlugin
    from nriplugin.obs.metrics import Metrics, StubMetrics
    from nriplugin.policy.cache import PolicyWatcher, RuleCache
    from nriplugin.qos.collect import Collector
    from nriplugin.qos.eviction.loop import Eviction
    from nriplugin.qos.manager import QoSManager
    from nriplugin.qos.usage import UsageWindows
    from nriplugin.reconciler import Reconciler

log = logging.getLogger("nriplugin")

# Exit status: 0 stopped (or nothing to do), 1 an unexpected failure (an uncaught exception:
# the supervisor restarts the agent), 2 the agent cannot run as configured (one line says why).
EXIT_STARTUP = 2
DEFAULT_PODS_ROOTS = ("kubepods", "kubepods.slice")


class Placeholder(Plugin):
    """Registers at once; the real plugin replaces it while Configure is on its way."""

    def create_container(self, pod: object, container: object) -> None:
        return None


class Inert(Plugin):
    """Registered, serving nothing: a pre-registered agent that must not serve (another agent
    holds the runtime, or a start-up error) still has to register, or containerd 1.7 exits.
    One rare event is subscribed (mask 0 would mean all) and never adjusted."""

    def post_update_container(self, pod: object, container: object) -> None:
        return None


class Invalid:
    """Counts hostile or unusable input; kept until the metrics exist (they load after
    registration), then passed straight to them."""

    def __init__(self) -> None:
        self.early: list[str] = []
        self.sink: Callable[[str], None] = self.early.append

    def __call__(self, reason: str) -> None:
        self.sink(reason)

    def attach(self, sink: Callable[[str], None]) -> None:
        for reason in self.early:
            sink(reason)
        self.early.clear()
        self.sink = sink


@dataclass(frozen=True)
class Stubs:
    """The agent's NRI connections as it starts."""

    serving: Stub  # registers with a placeholder plugin; the real one replaces it
    early: BufferedObserver  # what the serving stub saw before the metrics existed
    runner: asyncio.Future[None] | None  # the serving stub's run, when it registered at once
    standby: Stub | None  # pre-registered while another agent holds the runtime: inert
    standby_runner: asyncio.Future[None] | None


@dataclass(frozen=True)
class Loaded:
    """The policy and the node model, with the plugin that feeds it and what counts invalid
    input until the metrics exist."""

    rules: RuleCache
    node: Node
    plugin: QoSPlugin
    invalid: Invalid


@dataclass(frozen=True)
class Parts:
    """What serves once the runtime is ours: built before, started after."""

    metrics: Metrics
    observer: StubMetrics
    reconciler: Reconciler
    inventory: CriInventory | None
    qos: QoSManager
    net: NetQoS
    server: asyncio.Server | None
    usage: UsageWindows | None  # what the QoS manager's rounds keep for the NodeMetric report (None: no report)


class Taken(NamedTuple):
    """The runtime, ours: this agent as announced in the lock, when the runtime last had an
    agent and why it went (None: not known), and the serving stub's run."""

    me: Holder
    gap: tuple[float, str] | None
    runner: asyncio.Future[None]


class Agent:
    def __init__(self, ns: argparse.Namespace, clock: PollClock | None = None) -> None:
        """``clock``: the loop's selector (:func:`agent_loop`), when a request's bytes could
        first be read: a hook's time starts there, and it stays awake through a burst of hooks.

        The agent creates the hook path's scheduling here and hands it to whoever shares the
        loop: the hooks' traffic (the stub's trunks tell it of every socket and answer) and
        the pacer built on it (the hook adapter, the reconciler, the QoS manager, the
        inventory and network QoS do their long work in its turns; a burst's take-in of
        created containers waits until the burst is over)."""
        self.ns = ns
        self.loop = asyncio.get_running_loop()
        self._pods_roots: list[str] | None = None
        self.traffic = HookTraffic(clock)
        self.pacer = Pacer(self.loop, self.traffic, wait_out_bursts=True)
        self.opts = StubOptions.from_env(
            name=ns.name,
            idx=ns.idx,
            socket_path=ns.socket,
            default_policy=HookPolicy(budget=ns.hook_budget_ms / 1000.0, fail_closed=ns.fail_closed),
            max_message=ns.max_message_mib << 20,
            traffic=self.traffic,
        )
        self.prereg = self.opts.fd is not None
        self.gap_since = os.environ.pop(ENV_GAP_SINCE, "")
        self.gap_cause = os.environ.pop(ENV_GAP_CAUSE, "crash")
        self.lock = AgentLock(ns.socket)
        self.stopping = asyncio.Event()
        self.active: list[Stub] = []  # stubs to close first on SIGTERM
        self.closed_at: float | None = None
        self.got = False  # the runtime lock is ours
        self.previous: Holder | None = None
        self.metrics_sock: socket.socket | None = None
        self.standby_reason = ""
        self.cluster: Any = None  # cluster.run.Cluster while the cluster side runs: .pods, .evictor
        self.node: Node | None = None  # once the policy is loaded

    # start-up ---------------------------------------------------------------------------------

    def on_signal(self) -> None:
        if self.closed_at is None:
            self.closed_at = time.time()
        self.stopping.set()
        for s in self.active:
            s.stop()

    async def inert_until_closed(self, reason: str) -> int:
        """Pre-registered and unable to serve: register inert, exit when the runtime lets go."""
        stub = Stub(Inert(), self.opts)
        self.active.append(stub)
        log.error("pre-registered: registering inert (containerd 1.7 exits otherwise); not serving: %s", reason)
        await stub.run()
        return EXIT_STARTUP

    def preflight(self) -> int | None:
        """Checks and the runtime lock, before anything registers. Returns an exit status
        when the agent has nothing to do here (another serves and ``--if-held exit``)."""
        ns, lock = self.ns, self.lock
        if self.prereg:
            # containerd starts pre-registered plugins before it creates the socket's directory
            # (on a fresh boot it is not there yet); the lock lives in it, so make it as containerd would.
            with contextlib.suppress(OSError):
                os.makedirs(os.path.dirname(os.path.abspath(ns.socket)), 0o700, exist_ok=True)
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
        if ns.policy and not self.prereg:
            check_policy_readable(ns.policy)
        from nriplugin import cluster

        problem = cluster.check(ns)
        if problem is not None:
            raise StartupError(*problem)
        self.got = lock.try_acquire()
        self.previous = previous = lock.holder()
        if not self.got and ns.if_held == "exit" and not self.prereg:
            who = previous.describe() if previous else "holder unknown"
            log.info("another nriplugin (%s) serves the runtime at %s; nothing to do", who, ns.socket)
            return 0
        try:
            self.metrics_sock = bind_metrics(*ns.metrics_address)
        except StartupError as exc:
            if self.got or previous is None:
                raise
            raise StartupError(
                "--metrics-address",
                "{}:{}".format(*ns.metrics_address),
                f"{exc.problem}; the agent that holds the runtime ({previous.describe()}) may be the one",
                "give this one another --metrics-address, or port 0, to stand by next to it",
            ) from exc
        return None

    def load_policy(self) -> RuleCache | None:
        """The policy. A socket-mode agent with a bad one stops (None); a pre-registered one
        cannot (containerd 1.7 exits when a pre-registered plugin fails to register), so it
        runs on the embedded default, loudly."""
        from nriplugin.policy.cache import PolicyError, RuleCache

        rules = RuleCache()
        if self.ns.policy:
            try:
                rules.load_file(Path(self.ns.policy))
            except PolicyError as exc:
                if not self.prereg:
                    log.error("--policy: %s; fix the file, or leave --policy out for the embedded default", exc)
                    return None
                log.error("policy rejected, running with the embedded default: %s", exc)
        return rules

    # the whole run ------------------------------------------------------------------------------

    async def run(self) -> int:
        """The agent's life, phase by phase, in the order the module docstring gives; a phase
        that ends it returns the exit status."""
        done = await self.check_and_lock()
        if done is not None:
            return done
        stubs = await self.register_early()
        loaded = await self.load_node(stubs)
        if loaded is None:
            return EXIT_STARTUP
        parts = await self.build_parts(stubs, loaded)
        taken = await self.take_runtime(stubs, parts)
        if taken is None:
            return 0
        return await self.serve(stubs.serving, loaded.rules, parts, taken)

    async def check_and_lock(self) -> int | None:
        """Signals, start-up checks and the runtime lock, before anything registers. An exit
        status when the agent ends here: a start-up error (a pre-registered agent still
        registers, inert, and ends when the runtime lets go), or nothing to do."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            self.loop.add_signal_handler(sig, self.on_signal)
        try:
            return self.preflight()
        except StartupError as exc:
            self.lock.close()  # never hold the runtime while not serving it
            log.error("%s", exc, extra={"option": exc.option})
            return await self.inert_until_closed(str(exc)) if self.prereg else EXIT_STARTUP

    async def register_early(self) -> Stubs:
        """The stubs, before anything heavy loads. The serving stub registers at once when
        pre-registered and the runtime is ours (RegisterPlugin is what the runtime's 5 s
        start-up timeout waits for; the real plugin loads while Configure is on its way),
        otherwise once the runtime lock is ours. A pre-registered agent that does not hold
        the runtime registers an inert stub meanwhile (containerd 1.7 exits otherwise)."""
        standby: Stub | None = None
        standby_runner: asyncio.Future[None] | None = None
        if self.prereg and not self.got:
            standby = Stub(Inert(), self.opts)
            self.active.append(standby)
            standby_runner = asyncio.ensure_future(standby.run())
        early = BufferedObserver()
        stub = Stub(
            Placeholder(), self.opts if self.got else replace(self.opts, fd=None), observer=early, placeholder=True
        )
        runner: asyncio.Future[None] | None = None
        if self.prereg and self.got:
            self.active.append(stub)
            runner = asyncio.ensure_future(stub.run())
            for _ in range(50):  # until the RegisterPlugin call is on the wire (or 50 ms without a runtime)
                if stub.connections:
                    break
                await asyncio.sleep(0.001)
            await asyncio.sleep(0)
        if not self.got:
            previous = self.previous
            self.standby_reason = (
                f"another nriplugin ({previous.describe() if previous else 'holder unknown'}) holds the runtime at "
                f"{self.ns.socket} (lock {self.lock.path}); standing by to take over when it exits"
            )
            log.warning(
                "%s",
                self.standby_reason,
                extra={"socket": self.ns.socket, "holder_pid": previous.pid if previous else 0},
            )
        return Stubs(stub, early, runner, standby, standby_runner)

    async def load_node(self, stubs: Stubs) -> Loaded | None:
        """The policy and the node model, and the real plugin in the serving stub; a registered
        stub then gets its answer out (or 1 s passes) before the rest loads. None: the policy
        stops the agent (see :meth:`load_policy`)."""
        rules = self.load_policy()
        if rules is None:
            if self.metrics_sock is not None:
                self.metrics_sock.close()
            return None
        from nriplugin.kernel.cgroup import Cgroups
        from nriplugin.node.assembly import Node
        from nriplugin.node.hooks import QoSPlugin

        invalid = Invalid()
        self.node = node = Node.create(
            rules,
            cgroups=Cgroups(Path(self.ns.cgroup_root)),
            resctrl_root=Path(self.ns.resctrl_root),
            on_invalid=invalid,
        )
        self.learn_limits(node)
        plugin = QoSPlugin(node, push=stubs.serving.update_containers, pacer=self.pacer)
        stubs.serving.replace_plugin(plugin)
        if stubs.runner is not None:
            # Registered first; metrics and the HTTP endpoint come up right after (or after 1 s).
            first: list[asyncio.Future[Any]] = [stubs.runner, asyncio.ensure_future(stubs.serving.ready.wait())]
            await asyncio.wait(first, timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
        return Loaded(rules, node, plugin, invalid)

    def pods_roots(self, cgroups: Cgroups) -> list[str]:
        """``--pods-root`` as given; else the kubelet's pods groups found in the tree (a
        ``cgroupRoot`` moves them, as kind's does), said once; else the usual two."""
        if self.ns.pods_root:
            return list(self.ns.pods_root)
        if self._pods_roots is None:
            found = cgroups.pods_roots()
            self._pods_roots = found or list(DEFAULT_PODS_ROOTS)
            if found:
                log.info("pods root: %s (found in the cgroup tree)", ", ".join(found))
            else:
                log.info("pods root: none in the cgroup tree yet; using %s", ", ".join(DEFAULT_PODS_ROOTS))
        return self._pods_roots

    def learn_limits(self, node: Node) -> None:
        """What the kernel holds on BE's groups, before the real plugin answers its first
        hook, on every start: a previous agent's cut stays written (``serve``), and a BE
        container answered above it would fail to start (runc's write of its quota is refused)."""
        from nriplugin.policy.qos import QoSClass
        from nriplugin.qos.cpu_suppress import be_groups

        held = node.desired.learn_held(QoSClass.BE, be_groups(self.pods_roots(node.cgroups)))
        for group, cores in held.items():
            log.info(
                "BE's group %s holds %.2f cores (left by the previous agent): BE pods are capped at it until "
                "the QoS manager decides",
                group,
                cores,
                extra={"group": group, "be_limit_cores": round(cores, 3)},
            )

    async def build_parts(self, stubs: Stubs, loaded: Loaded) -> Parts:
        """The metrics (taking over what the stub and the node saw before they existed), and
        the parts that serve once the runtime is ours: the reconciler, the CRI inventory, the
        QoS manager, network QoS; the HTTP endpoint serves from now on."""
        from nriplugin.obs.metrics import Metrics, QoSMetrics, StubMetrics

        rules, node, stub = loaded.rules, loaded.node, stubs.serving
        metrics = Metrics()
        observer = StubMetrics(metrics)
        stubs.early.replay(observer)
        observer.expect(handled_events(loaded.plugin))
        stub.observer = observer
        loaded.invalid.attach(lambda reason: metrics.invalid_input.labels(reason).inc())
        metrics.policy_version.set(rules.current.version)
        rules.subscribe(lambda v: metrics.policy_version.set(v.version))
        self.follow_unused(metrics, rules)
        reconciler, inventory = self.build_loops(node, metrics, stub)
        from nriplugin.kernel.tick import Tick
        from nriplugin.qos.collect import Collector
        from nriplugin.qos.manager import QoSManager

        proc = Path(self.ns.proc_root)
        tick = Tick.probe()
        if tick is None:
            log.info("no scheduler tick found (no coarse clock that moves): fast samples are timed by the clock alone")
        collector = Collector(node.model, node.desired, node.cgroups, proc_root=proc, pacer=self.pacer, tick=tick)
        usage = self.build_usage()
        qos = QoSManager(
            node.model,
            node.desired,
            reconciler,
            collector,
            rules,
            observer=QoSMetrics(metrics),
            eviction=self.build_eviction(node, rules, metrics, collector),
            psi_path=str(proc / "pressure" / "cpu"),
            pacer=self.pacer,
            usage=usage,
        )
        net = self.build_net(node, rules, metrics, loaded.invalid)
        server = await self.serve_http(metrics, stub, qos)
        return Parts(metrics, observer, reconciler, inventory, qos, net, server, usage)

    async def take_runtime(self, stubs: Stubs, parts: Parts) -> Taken | None:
        """Stand by until the runtime lock is ours (when another held it), announce this agent
        in the lock, and start the serving stub if it has not registered yet. None: stopped
        while standing by (what was opened is closed)."""
        gap = self.gap_before()
        if not self.got:
            parts.observer.connection_state("standby")
            if not await self.stand_by(stubs.standby, stubs.standby_runner):
                if parts.inventory is not None:
                    await parts.inventory.client.close()
                self.close_http(parts.server)
                return None
            # A clean handover says when it stopped serving; a holder that died did not, but we
            # were blocked on the lock until the moment it died.
            last = self.lock.holder()
            gap = (last.released, "handover") if last is not None and last.released else (time.time(), "crash")
            parts.observer.connection_state("disconnected")
            log.info("the runtime at %s is ours now; registering", self.ns.socket)
        me = Holder.me("pre-registered" if stubs.runner is not None else "socket", self.ns.socket)
        if self.gap_since:
            me = replace(me, mode="supervised restart")
        self.lock.announce(me)
        gc.collect()  # start-up's garbage, before serving (what is left is frozen once serving)
        runner = stubs.runner
        if runner is None:
            self.active.append(stubs.serving)
            runner = asyncio.ensure_future(stubs.serving.run())
            if self.stopping.is_set():
                stubs.serving.stop()
        return Taken(me, gap, runner)

    async def serve(self, stub: Stub, rules: RuleCache, parts: Parts, taken: Taken) -> int:
        """The loops run until the NRI connection closes (SIGTERM closes it first, or the
        runtime did); then the QoS overlays are given back (written at once), writing stops,
        the runtime is handed over, and the rest closes. The features' values stay: they are
        each container's own."""
        parts.reconciler.start(self.loop)
        parts.qos.start(self.loop)
        parts.net.start(self.loop)
        cluster_task = self.loop.create_task(self.start_cluster(rules, parts))
        watcher = self.watch_policy(rules)
        gap = taken.gap
        gap_task = self.loop.create_task(self.report_gap(parts.metrics, stub, *gap)) if gap is not None else None
        freeze_task = self.loop.create_task(self.freeze_start_up(stub))
        # The runtime's own inventory: what existed before us when no Synchronize comes.
        inventory = parts.inventory
        inventory_task = self.loop.create_task(inventory.run()) if inventory is not None else None
        try:
            await taken.runner
        finally:
            if inventory_task is not None:
                inventory_task.cancel()
            # give back what was changed on groups the kubelet owns (BE's quota, bursts), written
            # now: a kubelet that restarts after the agent must find its groups as it left them
            parts.qos.give_back("the agent is stopping")
            parts.reconciler.flush()
            parts.qos.stop()
            parts.net.stop()  # tc rules stay too; the next agent adopts them
            parts.reconciler.stop()
            self.lock.release(taken.me, self.closed_at if self.closed_at is not None else time.time())
            if gap_task is not None:
                gap_task.cancel()
            freeze_task.cancel()
            if inventory is not None:
                await inventory.client.close()
            self.close_http(parts.server)
            if watcher is not None:
                watcher.stop()
            cluster_task.cancel()
            if self.cluster is not None:
                await self.cluster.close()
        return 0

    # parts ------------------------------------------------------------------------------------

    def build_loops(self, node: Node, metrics: Metrics, stub: Stub) -> tuple[Reconciler, CriInventory | None]:
        """The reconciler and the CRI inventory: built now, started once the runtime is ours."""
        from nriplugin.obs.metrics import InventoryMetrics, ReconcilerMetrics
        from nriplugin.reconciler import Reconciler

        inventory = None
        if self.ns.cri_socket:
            from nriplugin.cri.client import AsyncCRI
            from nriplugin.inventory.cri import CriInventory

            inventory = CriInventory(
                AsyncCRI(self.ns.cri_socket),
                node.model,
                period=self.ns.resync_seconds,
                hooks_live=stub.ready.is_set,
                observer=InventoryMetrics(metrics),
                told=stub.ready.wait,
                pacer=self.pacer,
            )

        def on_new_dir(group: str) -> None:
            # With NRI up, the hooks tell us about every new container; without it, ask the runtime.
            if inventory is not None and not stub.ready.is_set():
                inventory.kick()

        reconciler = Reconciler(
            node.desired,
            node.writer,
            node.model,
            observer=ReconcilerMetrics(metrics),
            resync_period=self.ns.resync_seconds,
            roots=self.pods_roots(node.cgroups),
            on_new_dir=on_new_dir,
            pacer=self.pacer,
        )
        return reconciler, inventory

    def build_net(self, node: Node, rules: RuleCache, metrics: Metrics, invalid: Invalid) -> NetQoS:
        """Network QoS (``netqos/reconciler.py``): tc rules for the pods, kept true, off the hook path."""
        from nriplugin.netqos.reconciler import NetQoS
        from nriplugin.obs.metrics import NetMetrics, ReconcilerMetrics

        return NetQoS(
            node.model,
            rules,
            node.desired.overlays,
            observer=ReconcilerMetrics(metrics),
            on_invalid=invalid,
            on_round=NetMetrics(metrics).round,
            netns=getattr(self.ns, "net_namespace", None),
            pacer=self.pacer,
        )

    def build_usage(self) -> UsageWindows | None:
        """Where the QoS manager's rounds keep what they measured for the NodeMetric report:
        only when it is reported (the cluster side on, ``--nodemetric on``)."""
        from nriplugin import cluster

        if not cluster.wanted(self.ns) or getattr(self.ns, "nodemetric", "on") != "on":
            return None
        from nriplugin.qos.usage import UsageWindows

        return UsageWindows()

    def build_eviction(self, node: Node, rules: RuleCache, metrics: Metrics, collector: Collector) -> Eviction:
        """CPUEvict and MemoryEvict with their evictor: through the cluster's Eviction API while
        the cluster side runs (``self.cluster``), else, and when memory runs out within seconds,
        through the runtime's CRI socket (see ``qos/eviction/evictor.py``); priorities from the cluster's
        pods where it knows them."""
        from nriplugin.cri.client import AsyncCRI
        from nriplugin.obs.metrics import EvictionMetrics
        from nriplugin.qos.eviction.evictor import Evictor, RuntimeBackend
        from nriplugin.qos.eviction.loop import ClusterPriorities, Eviction

        runtime = RuntimeBackend(AsyncCRI(self.ns.cri_socket)) if self.ns.cri_socket else None
        evictor = Evictor(
            runtime=runtime,
            cluster_of=lambda: getattr(self.cluster, "evictor", None),
            observer=EvictionMetrics(metrics),
        )
        return Eviction(
            node.model,
            node.desired,
            node.cgroups,
            collector.stats,
            rules,
            evictor,
            self.pods_roots(node.cgroups),
            priorities=ClusterPriorities(lambda: getattr(self.cluster, "pods", None)),
            usage=lambda: collector.by_container,
            force_dry_run=bool(getattr(self.ns, "evict_dry_run", False)),
        )

    async def serve_http(self, metrics: Metrics, stub: Stub, qos: Any = None) -> asyncio.Server | None:
        from nriplugin.obs import http
        from nriplugin.qos import view

        def readyz() -> tuple[int, str, bytes]:
            if stub.ready.is_set():
                return 200, "text/plain", b"ready\n"
            if self.standby_reason:
                # Ready: standing by is this agent's intended state (a surge rollout waits for it).
                return 200, "text/plain", f"standby: {self.standby_reason}\n".encode()
            return 503, "text/plain", b"not registered with the runtime\n"

        def healthz() -> tuple[int, str, bytes]:
            why = self.standby_reason
            return 200, "text/plain", (f"ok (standby: {why})\n" if why else "ok\n").encode()

        if self.metrics_sock is None:
            return None
        server = await http.serve(
            self.metrics_sock,
            {
                "/metrics": lambda: (200, "text/plain; version=0.0.4", metrics.render()),
                "/healthz": healthz,
                "/readyz": readyz,
                "/debug/qos": lambda: view.response(qos),  # `nriplugin top` reads it
            },
        )
        host, port = self.ns.metrics_address
        log.info("metrics on http://%s:%d/metrics", host, port, extra={"address": f"{host}:{port}"})
        return server

    def close_http(self, server: asyncio.Server | None) -> None:
        """The HTTP endpoint, or its bound socket when it never served."""
        if server is not None:
            server.close()
        elif self.metrics_sock is not None:
            self.metrics_sock.close()

    def watch_policy(self, rules: RuleCache) -> PolicyWatcher | None:
        """``--policy`` hot-reloaded into ``rules`` while serving."""
        if not self.ns.policy:
            return None
        from nriplugin.policy.cache import PolicyWatcher

        watcher = PolicyWatcher(Path(self.ns.policy), rules, self.loop)
        watcher.start()
        return watcher

    async def start_cluster(self, rules: RuleCache, parts: Parts) -> None:
        """The cluster side (``--cluster``) as ``self.cluster``: the NodeSLO into ``rules``, the
        node's pods, the Eviction API, the NodeMetric report from what the QoS manager's rounds
        keep (``parts.usage``). Without an API server the agent runs as it always has."""
        from nriplugin import cluster

        if not cluster.wanted(self.ns):
            return
        # The HTTP client (aiohttp) takes a while to import: not on the loop that answers hooks.
        run = await asyncio.to_thread(importlib.import_module, "nriplugin.cluster.run")
        from nriplugin.cluster.client import ClusterError
        from nriplugin.obs.metrics import NodeMetricMetrics

        try:
            self.cluster = await run.start(self.ns, rules, parts.usage, NodeMetricMetrics(parts.metrics))
        except ClusterError as exc:
            log.error("cluster side not started: %s", exc, extra={"option": "--kubeconfig"})
            return
        self.use_pod_specs(parts.qos.desired, self.cluster.pods)

    @staticmethod
    def follow_unused(metrics: Metrics, rules: RuleCache) -> None:
        """``nriplugin_policy_unused_field{field}``: what the policy in force has that nriplugin
        does not implement, for doctor (its log said it once)."""
        from nriplugin.policy.nodeslo import unused_fields

        def shown(notes: tuple[str, ...]) -> None:
            metrics.policy_unused.clear()
            for field in unused_fields(notes):
                metrics.policy_unused.labels(field).set(1)

        shown(rules.notes)
        rules.subscribe_notes(shown)

    @staticmethod
    def use_pod_specs(desired: DesiredState, pods: PodCache) -> None:
        """BE pods' batch resources from the API server's specs where the webhook did not
        annotate them (features/batch.py): in the answers from now on, and for the pods already
        listed, worked out again and applied."""
        pods.on_spec = desired.spec_changed
        desired.use_specs(pods)
        for pod in pods.pods():
            if pod.extended_spec is not None:
                desired.spec_changed(pod.uid)

    def gap_before(self) -> tuple[float, str] | None:
        """When the runtime last had an agent, and why it went (None: not known)."""
        previous = self.previous
        if self.gap_since:
            return float(self.gap_since), self.gap_cause
        if previous is not None and previous.released and self.got:
            return previous.released, "handover"
        if previous is not None and self.got and previous.pid != os.getpid():
            log.warning("the previous agent (%s) ended without handing over", previous.describe())
        return None

    async def stand_by(self, standby: Stub | None, standby_runner: asyncio.Future[None] | None) -> bool:
        """Wait for the runtime lock; False when stopped (SIGTERM, or the runtime closed the
        pre-registered connection) before it came."""
        waiter = asyncio.ensure_future(self.lock.wait())
        stop_waiter = asyncio.ensure_future(self.stopping.wait())
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
            return False
        self.standby_reason = ""
        if standby is not None:
            # Pre-registered standby: leave the inert connection and serve on the socket, which
            # brings Synchronize (a pre-registered plugin gets none on containerd 1.7).
            self.active.remove(standby)
            standby.stop()
            if standby_runner is not None:
                await standby_runner
        return True

    @staticmethod
    async def freeze_start_up(stub: Stub) -> None:
        """Once serving (registered, the runtime's containers taken in), what start-up made —
        modules, the policy, the node the agent found — is moved out of the cyclic garbage
        collector's way (``gc.freeze``): a full collection, which holds the loop and every
        hook waiting on it, then walks only what came later, so its pause does not follow
        the size of the node the agent started on. (Frozen objects are still freed when
        their last reference goes; start-up's garbage was collected before serving, so
        little is frozen that a collection would have freed.)"""
        await stub.ready.wait()
        await asyncio.sleep(0)  # the Synchronize take-in runs right after its answer
        gc.freeze()

    async def report_gap(self, metrics: Metrics, stub: Stub, since: float, cause: str) -> None:
        await stub.ready.wait()
        seconds = max(0.0, time.time() - since)
        metrics.agent_gap.labels(cause).observe(seconds)
        log.warning(
            "no agent answered the runtime's hooks for %.3f s (%s)",
            seconds,
            cause,
            extra={"gap_seconds": round(seconds, 6), "cause": cause},
        )


@contextlib.contextmanager
def agent_loop(ns: argparse.Namespace) -> Iterator[PollClock]:
    """The selector ``nriplugin run`` runs its loop on: it times each request from the moment
    its bytes could be read (so the hook-latency histogram sees a request that waited behind
    other work), stays awake through a burst of hooks, and collects garbage when the loop is
    idle rather than in a hook (:mod:`nriplugin.agent.idle_gc`)."""
    collector = IdleCollector()
    collector.install()
    try:
        yield PollClock(burst_poll=ns.burst_poll_us / 1e6, idle=collector.idle)
    finally:
        collector.uninstall()


def main(ns: argparse.Namespace) -> int:
    """``nriplugin run``: the agent on :func:`agent_loop`'s event loop."""
    with agent_loop(ns) as poll, asyncio.Runner(loop_factory=poll.loop) as runner:

        async def serve() -> int:  # the Agent is made on the running loop
            return await Agent(ns, poll).run()

        return runner.run(serve())
