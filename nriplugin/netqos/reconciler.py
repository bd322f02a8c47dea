"""Network QoS kept true: pods' tc rules follow the node model, off the NRI hook path.

The node model tells of pods (RunPodSandbox, Synchronize, the inventory) and their removal;
this only marks the node dirty. A round then runs in one worker thread (pyroute2 is blocking
and runs its own event loop): each pod's network namespace (NRI's ``linux.namespaces``,
type "network") is entered to find its interface (the host peer is its ``iflink``) and IPv4
address, once per pod; the desired state (``netqos/desired.py`` over the overlays) becomes
a :class:`TcPlan` that ``netqos/tc.py`` makes true. Every ``period`` seconds the same round
reads the kernel back: a deleted class, filter or redirect is restored and counted as drift
and repair (resource ``tc``), like a cgroup file. A pod that went, or whose namespace vanished,
has its rules removed; with no pod shaped, our IFBs go too.

Pods on the host network have no interface of their own: reported once as not shapeable.
A host veth that already carries another's shaping (the bandwidth CNI plugin's tbf root or
ingress qdisc) is left to it, reported once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from nriplugin.intent.core import InvalidInput
from nriplugin.netqos.desired import (
    DIRECTIONS,
    EGRESS_KEY,
    INGRESS_KEY,
    NetLevel,
    NodeNet,
    PodNet,
    class_policy,
    leaf_rates,
    node_state,
    pod_state,
)
from nriplugin.netqos.netns import link_names
from nriplugin.netqos.tc import FIRST_LEAF, LAST_LEAF, TC, PodPlan, Snapshot, TcPlan, ifb_names, missing
from nriplugin.node.model import POD_PREFIX, NodeModel
from nriplugin.node.overlays import Overlays
from nriplugin.nri import api_pb2 as api
from nriplugin.obs.unobserved import Unobserved
from nriplugin.pacing.turns import Pacer
from nriplugin.policy.cache import RuleCache
from nriplugin.policy.model import Policy
from nriplugin.policy.qos import InvalidQoSLabel, qos_class

log = logging.getLogger("nriplugin.net")

NODE_KEY = "net:node"  # the overlays' key for the node's tree (net suppress)


class NetObserver(Protocol):
    def drift(self, resource: str) -> None: ...
    def repaired(self, resource: str, seconds: float) -> None: ...


def netns_path(pod: api.PodSandbox) -> str:
    """The pod's network namespace ("" : the host's)."""
    for ns in pod.linux.namespaces:
        if ns.type == "network":
            return ns.path
    return ""


@dataclass(frozen=True, slots=True)
class Wanted:
    """What the loop hands the worker for one pod (facts copied off the node model)."""

    pod: str
    who: str
    netns: str
    net: PodNet


@dataclass
class Found:
    veth: int
    ip: str
    pod_ifindex: int


@dataclass
class Status:
    """The last round, for metrics, doctor and tests."""

    shaped: dict[str, PodPlan] = field(default_factory=dict)
    host_network: set[str] = field(default_factory=set)
    foreign: dict[str, str] = field(default_factory=dict)
    snapshot: Snapshot | None = None
    caps: dict[str, bool] = field(default_factory=dict)
    rounds: int = 0


def discover(path: str) -> Found | None:
    """The pod's interface in its namespace: a link whose peer (``IFLA_LINK``) lives in
    another namespace, eth0 first; and its first IPv4 address. Runs in the worker thread."""
    from nriplugin.netqos.netns import iproute

    ipr = iproute(path)
    try:
        links = [x for x in ipr.get_links() if x.get_attr("IFLA_LINK") and x.get_attr("IFLA_LINK_NETNSID") is not None]
        links.sort(key=lambda x: x.get_attr("IFLA_IFNAME") != "eth0")
        for link in links:
            addrs = ipr.get_addr(family=2, index=link["index"])
            if addrs:
                return Found(int(link.get_attr("IFLA_LINK")), str(addrs[0].get_attr("IFA_ADDRESS")), int(link["index"]))
    finally:
        ipr.close()
    return None


class NetQoS:
    def __init__(
        self,
        model: NodeModel,
        rules: RuleCache,
        overlays: Overlays,
        observer: NetObserver | None = None,
        on_invalid: Callable[[str], None] = lambda reason: None,
        netns: str | None = None,
        prefix: str = "nrq",
        period: float = 2.0,
        on_round: Callable[[Status], None] = lambda s: None,
        suppress: bool = True,
        pacer: Pacer | None = None,
    ) -> None:
        """``pacer``: the loop shared with the hooks (the agent's): a round gives it back
        between turns; default: turns measured in time alone."""
        self.pacer = Pacer() if pacer is None else pacer
        self.model = model
        self.rules = rules
        self.overlays = overlays
        self.observer: NetObserver = observer or Unobserved()
        self.on_invalid = on_invalid
        self.netns = netns
        self.prefix = prefix
        self.period = period
        self.on_round = on_round
        self.status = Status()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="nriplugin-tc")
        self._tc: TC | None = None
        self._found: dict[str, tuple[str, Found | None]] = {}  # pod id -> (netns path, interface)
        self._minors: dict[str, int] = {}
        self._reported: dict[str, set[str]] = {}  # pod id -> what was said of it once
        self._invalid: dict[str, str] = {}  # pod id -> the annotation problem reported
        self._applied: TcPlan | None = None
        self._kick = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._gone: list[str] = []
        # What each pod wants, kept between rounds so that a round costs what changed, not the
        # node: only pods that want shaping are held; ``_dirty`` pods are looked at next round,
        # all of them after a new policy (``_all``).
        self._wants: dict[str, Wanted] = {}
        self._dirty: set[str] = set()
        self._all = True
        self._urgent = False  # a round is due whatever the pods want (period, policy, a removal)
        self._classes_on = any(class_policy(rules.policy, lv).enable for lv in NetLevel)  # a class is shaped
        from nriplugin.netqos.suppress import NetSuppress

        self.suppress: NetSuppress | None = NetSuppress(overlays, NODE_KEY) if suppress else None
        model.subscribe(self)
        rules.subscribe(lambda _v: self._recompute_all())

    # the node model's Listener ------------------------------------------------------------------

    # Called on the hook path: each only notes the pod and wakes the round.

    def added(self, key: str) -> None:
        if not key.startswith(POD_PREFIX):
            return
        pod = self.model.pod(key[len(POD_PREFIX) :])
        if self._classes_on or (pod is not None and (INGRESS_KEY in pod.annotations or EGRESS_KEY in pod.annotations)):
            self._dirty.add(key[len(POD_PREFIX) :])
            self._kick.set()
        # else it wants nothing: with no class enabled only a pod's own caps are shaped

    def started(self, key: str, existing: bool) -> None:
        pass

    def changed(self, key: str) -> None:
        pass

    def removed(self, key: str) -> None:
        if key.startswith(POD_PREFIX):
            pod = key[len(POD_PREFIX) :]
            self._dirty.discard(pod)
            self._gone.append(pod)
            # its rules go at once; a pod that wanted nothing leaves books for the next round
            self._wake(urgent=self._wants.pop(pod, None) is not None or bool(self._found))

    def resynced(self) -> None:
        self._wake(urgent=True)

    def _recompute_all(self) -> None:
        self._classes_on = any(class_policy(self.rules.policy, lv).enable for lv in NetLevel)
        self._all = True
        self._wake(urgent=True)

    def _wake(self, urgent: bool) -> None:
        self._urgent = self._urgent or urgent
        self._kick.set()

    # running --------------------------------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._task = loop.create_task(self.run())

    def stop(self) -> None:
        """Rules stay in place: a restarted agent adopts them (as cgroup values stay written)."""
        if self._task is not None:
            self._task.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def run(self) -> None:
        """A round every ``period`` (the kernel read back), and at once when something it
        shapes changes. A new pod wakes it only to look at that pod: unless the pod wants
        shaping, no round follows (a pod burst on a node without network QoS costs no rounds)."""
        loop = asyncio.get_running_loop()
        while True:
            self._kick.clear()
            self._urgent = False
            await self.round(loop)
            timer = loop.call_later(self.period, self._wake, True)
            try:
                while not self._urgent:
                    await self._kick.wait()
                    self._kick.clear()
                    if not self._urgent and await self._refresh():
                        break
            finally:
                timer.cancel()

    async def round(self, loop: asyncio.AbstractEventLoop | None = None) -> Status:
        """One round: the wanted pods computed here (on the loop), the kernel work in the
        worker. While nothing is shaped or wanted the worker is not asked at all: a node without
        network QoS pays one dictionary lookup per new pod."""
        loop = loop or asyncio.get_running_loop()
        wanted, node = await self.wanted()
        gone, self._gone = self._gone, []
        for pod in gone:  # the loop's books (the worker is not running between rounds)
            self._invalid.pop(pod, None)
            self._reported.pop(pod, None)
        idle = not wanted and not self._found and self._applied is not None and not self._applied.pods
        try:
            if idle:
                self._applied = TcPlan(node, ())
            else:
                await loop.run_in_executor(self._pool, self._work, wanted, node, gone)
        except Exception as exc:  # a netlink failure: logged, tried again next round
            log.warning("network QoS round failed: %s", exc)
        self.status.rounds += 1
        if self.suppress is not None:
            policy = self.rules.policy
            if self.suppress.step(policy, node.total, self.status.snapshot, time.monotonic()):
                log.info(
                    "net suppress: L2 ceilings now %s", {r: v for d in self.overlays.of(NODE_KEY) for r, v in d.values}
                )
                self._wake(urgent=True)
        self.on_round(self.status)
        return self.status

    async def wanted(self) -> tuple[list[Wanted], NodeNet]:
        """The pods that want shaping and the node's tree."""
        await self._refresh()
        low = {r: int(v) for d in self.overlays.of(NODE_KEY) for r, v in d.values}
        return list(self._wants.values()), node_state(self.rules.policy, low)

    async def _refresh(self) -> bool:
        """Look at the pods that came since the last look (all of them after a new policy), a
        turn at a time; returns whether what the pods want changed."""
        policy = self.rules.policy
        if self._all:
            self._all = False
            self._dirty.clear()
            before, self._wants = self._wants, {}
            pods: Iterable[str] = [key[len(POD_PREFIX) :] for key in self.model if key.startswith(POD_PREFIX)]
        else:
            before = None
            pods, self._dirty = self._dirty, set()
        changed = False
        turn = self.pacer.turn()
        for pod_id in pods:
            if turn.over():
                await self.pacer.give_way()
                turn.restart()
            w = self._want(pod_id, policy)
            if w != self._wants.get(pod_id):
                changed = True
                if w is None:
                    del self._wants[pod_id]
                else:
                    self._wants[pod_id] = w
        return changed or (before is not None and before != self._wants)

    def _want(self, pod_id: str, policy: Policy) -> Wanted | None:
        pod = self.model.pod(pod_id)
        if pod is None:
            return None
        who = f"{pod.namespace}/{pod.name}"
        try:
            qos = qos_class(pod.labels, pod.linux.cgroup_parent)
            net = pod_state(policy, qos, pod.annotations)
        except InvalidQoSLabel:
            return None  # reported by the desired state already
        except InvalidInput as exc:
            if self._invalid.get(pod.id) != str(exc):
                self._invalid[pod.id] = str(exc)
                self.on_invalid("net_bandwidth")
                log.warning("pod %s: %s; its network is not shaped", who, exc, extra={"pod": who})
            return None
        return None if net is None else Wanted(pod.id, who, netns_path(pod), net)

    # the worker thread ---------------------------------------------------------------------------

    def _once(self, pod: str, what: str, msg: str, *args: object) -> None:
        said = self._reported.setdefault(pod, set())
        if what not in said:
            said.add(what)
            log.info(msg, *args)

    def _leftovers(self) -> bool:
        """Whether an earlier agent left our devices behind (it keeps its rules when it stops,
        for the next one to adopt): checked once, on the first round, from the namespace's
        ``/proc/net/dev`` (the worker thread steps in; no netlink)."""
        if self._applied is not None:
            return False
        try:
            names = link_names(self.netns)
        except OSError:
            return False
        return bool(names & set(ifb_names(self.prefix).values()))

    def _work(self, wanted: list[Wanted], node: NodeNet, gone: list[str]) -> None:
        """One round in the worker thread: release the pods that went or no longer want
        shaping, plan the wanted ones, make the plan true and read the kernel back."""
        idle = not wanted and (self._applied is None or not self._applied.pods) and not self._found
        if idle and not self._leftovers():
            self._applied = TcPlan(node, ())
            return  # nothing shaped, nothing to take away: no netlink at all
        tc = self._tc_ready()
        usable = not missing(self.status.caps)
        self._release(tc, gone, {w.pod for w in wanted})
        status = Status(caps=self.status.caps, rounds=self.status.rounds)
        pods = [p for w in (wanted if usable else []) if (p := self._plan_pod(tc, w, node, status)) is not None]
        plan = TcPlan(node, tuple(sorted(pods, key=lambda p: p.minor)))
        if usable:
            self._sync(tc, plan)
        self._applied = plan
        status.shaped = {p.pod: p for p in plan.pods}
        status.snapshot = tc.snapshot() if plan.pods else None
        self.status = status

    def _tc_ready(self) -> TC:
        """Netlink, opened on the first round that needs it; what the kernel lacks is said once."""
        if self._tc is None:
            self._tc = TC(self.netns, self.prefix)
            self.status.caps = self._tc.probe()
            if lacking := missing(self.status.caps):
                log.warning("network QoS unavailable: the kernel lacks %s", ", ".join(lacking))
        return self._tc

    def _release(self, tc: TC, gone: list[str], live: set[str]) -> None:
        """Take the rules off the veths of pods that went, then of those no longer wanted
        (policy, labels); their leaves' minors are free again."""
        for pod in gone:
            found = self._found.pop(pod, (None, None))[1]
            self._minors.pop(pod, None)
            if found is not None:
                tc.release(found.veth)
        for pod in [p for p in self._found if p not in live]:
            found = self._found.pop(pod)[1]
            self._minors.pop(pod, None)
            if found is not None:
                tc.release(found.veth)

    def _plan_pod(self, tc: TC, w: Wanted, node: NodeNet, status: Status) -> PodPlan | None:
        """One wanted pod's leaf; None (noted in ``status``, said once) for a pod on the host
        network, one whose interface is not found, or one whose veth another shapes."""
        if not w.netns or self._is_ours(w.netns):
            status.host_network.add(w.pod)
            self._once(w.pod, "host", "pod %s: host network, no interface of its own: not shapeable", w.who)
            return None
        found = self._locate(w)
        if found is None:
            return None
        owner = tc.veth_owner(found.veth)
        if owner not in ("", "nriplugin"):
            status.foreign[w.pod] = owner
            self._once(
                w.pod,
                "foreign",
                "pod %s: its interface carries %s (the bandwidth CNI plugin?): left to it",
                w.who,
                owner,
            )
            return None
        minor = self._minor(w.pod)
        rates = tuple((d, leaf_rates(node, w.net, d)) for d in DIRECTIONS)
        return PodPlan(w.pod, found.veth, found.ip, minor, NetLevel(w.net.level), rates)

    def _sync(self, tc: TC, plan: TcPlan) -> None:
        """Make ``plan`` true. Changes to a plan already applied were made behind our back:
        counted as drift and repair (resource ``tc.<what>``), and said as a warning."""
        started = time.monotonic()
        changes = tc.sync(plan)
        if changes and plan == self._applied:
            took = time.monotonic() - started
            for c in changes:
                resource = "tc." + c.split(" ", 1)[0]
                self.observer.drift(resource)
                self.observer.repaired(resource, took)
            log.warning("network QoS rules changed behind our back, restored: %s", "; ".join(changes))
        elif changes:
            log.info("network QoS: %s", "; ".join(changes) if len(changes) < 12 else f"{len(changes)} changes")

    def _is_ours(self, path: str) -> bool:
        """A pod "namespace" that is the one we shape in is the host network (some runtimes
        name it): its veths are other pods', never this pod's."""
        try:
            a, b = os.stat(path), os.stat(self.netns or "/proc/thread-self/ns/net")
        except OSError:
            return False
        return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)

    def _locate(self, w: Wanted) -> Found | None:
        have = self._found.get(w.pod)
        tc = self._tc
        assert tc is not None
        if have is not None and have[0] == w.netns and have[1] is not None and tc.link_exists(have[1].veth):
            return have[1]
        try:
            found = discover(w.netns)
        except OSError as exc:  # the namespace is gone: its interface and rules went with it
            self._found.pop(w.pod, None)
            self._once(w.pod, "netns", "pod %s: network namespace %s: %s", w.who, w.netns, exc)
            return None
        if found is None or not tc.link_exists(found.veth):
            self._once(w.pod, "iface", "pod %s: no interface with a peer on this host and an IPv4 address", w.who)
            found = None
        self._found[w.pod] = (w.netns, found)
        return found

    def _minor(self, pod: str) -> int:
        m = self._minors.get(pod)
        if m is None:
            used = set(self._minors.values())
            m = next(i for i in range(FIRST_LEAF, LAST_LEAF + 1) if i not in used)
            self._minors[pod] = m
        return m

    def remove_all(self) -> list[str]:
        """Take every rule of ours away (``nriplugin`` tests, an operator's clean-up)."""
        if self._tc is None:
            return []
        veths = [f.veth for _, f in self._found.values() if f is not None]
        return self._tc.remove_all(veths)


def describe(status: Status) -> dict[str, Any]:
    """A plain summary (doctor, /debug)."""
    return {
        "shaped": sorted(status.shaped),
        "host_network": sorted(status.host_network),
        "foreign": dict(status.foreign),
        "caps": dict(status.caps),
    }
