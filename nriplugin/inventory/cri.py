"""Inventory from the runtime's CRI socket, as NRI messages, so the same ``intent()`` and
reconciler apply to what NRI never told us about: containerd 1.7 gives a pre-registered plugin
no Synchronize, and containers may come and go while the agent or its NRI connection is down.

Why CRI and not the cgroup tree alone: a directory says a container exists and which
Kubernetes QoS its pod has, but not its ``koordinator.sh/qosClass`` label or its batch
annotations, so values computed from the tree would be wrong for exactly the pods we manage.
The tree is the trigger (a new directory while NRI is down asks for a fresh inventory); CRI
says what it is. Pod and container details (cgroup paths, requested resources, pid) come from
the runtime's verbose status once per id and are cached: they do not change, and kubelet's
later resource updates reach us as NRI UpdateContainer events or are re-read on the next
full inventory after a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple, Protocol

import grpc

from nriplugin.cri import api_pb2 as cri
from nriplugin.cri.client import AsyncCRI
from nriplugin.node.model import POD_PREFIX
from nriplugin.nri import api_pb2 as api
from nriplugin.obs.unobserved import Unobserved
from nriplugin.pacing.turns import Pacer

log = logging.getLogger("nriplugin.inventory")

MAX_INFO = 1 << 20  # bytes of verbose status JSON we are willing to parse per object
_STATE = {
    cri.CONTAINER_CREATED: api.CONTAINER_CREATED,
    cri.CONTAINER_RUNNING: api.CONTAINER_RUNNING,
    cri.CONTAINER_EXITED: api.CONTAINER_STOPPED,
}


class BadStatus(ValueError):
    """The runtime's verbose status lacks what we need (or is not the JSON we know)."""


def _info(resp: Any) -> dict[str, Any]:
    raw = resp.info.get("info", "")
    if not raw:
        raise BadStatus("no verbose info (is this containerd?)")
    if len(raw) > MAX_INFO:
        raise BadStatus(f"verbose info larger than {MAX_INFO} bytes")
    try:
        info = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise BadStatus(f"verbose info is not JSON: {exc.msg}") from exc
    except RecursionError as exc:
        raise BadStatus("verbose info is nested too deeply") from exc
    if not isinstance(info, dict):
        raise BadStatus("verbose info is not an object")
    return info


def _get(obj: Any, *keys: str) -> Any:
    for k in keys:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(k)
    return obj


def _uint(value: Any, bits: int = 64) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < (1 << bits) else None


def _int64(value: Any) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and -(1 << 63) <= value < (1 << 63)
    return value if ok else None


def pod_from_cri(sandbox: Any, info: dict[str, Any]) -> api.PodSandbox:
    """A CRI PodSandbox (+ its verbose info) as the NRI PodSandbox the hooks would see."""
    parent = _get(info, "config", "linux", "cgroup_parent")
    if not isinstance(parent, str):
        raise BadStatus(f"pod {sandbox.id[:12]}: no cgroup parent in its status")
    pod = api.PodSandbox(
        id=sandbox.id,
        name=sandbox.metadata.name,
        uid=sandbox.metadata.uid,
        namespace=sandbox.metadata.namespace,
        labels=dict(sandbox.labels),
        annotations=dict(sandbox.annotations),
        runtime_handler=sandbox.runtime_handler,
    )
    pod.linux.cgroup_parent = parent
    path = _get(info, "runtimeSpec", "linux", "cgroupsPath")
    if isinstance(path, str):
        pod.linux.cgroups_path = path
    pid = _uint(info.get("pid"), 32)
    if pid:
        pod.pid = pid
    return pod


def container_from_cri(container: Any, info: dict[str, Any]) -> api.Container:
    """A CRI Container (+ its verbose info: the OCI spec the runtime runs it with, which has
    NRI's adjustments in it) as the NRI Container a Synchronize would carry."""
    path = _get(info, "runtimeSpec", "linux", "cgroupsPath")
    if not isinstance(path, str) or not path:
        raise BadStatus(f"container {container.id[:12]}: no cgroups path in its status")
    c = api.Container(
        id=container.id,
        pod_sandbox_id=container.pod_sandbox_id,
        name=container.metadata.name,
        state=_STATE.get(container.state, api.CONTAINER_UNKNOWN),
        labels=dict(container.labels),
        annotations=dict(container.annotations),
    )
    c.linux.cgroups_path = path
    pid = _uint(info.get("pid"), 32)
    if pid:
        c.pid = pid
    res = _get(info, "runtimeSpec", "linux", "resources")
    if isinstance(res, dict):
        cpu, mem, out = res.get("cpu") or {}, res.get("memory") or {}, c.linux.resources
        if isinstance(cpu, dict):
            if (v := _uint(cpu.get("shares"))) is not None:
                out.cpu.shares.value = v
            if (q := _int64(cpu.get("quota"))) is not None:
                out.cpu.quota.value = q
            if (v := _uint(cpu.get("period"))) is not None:
                out.cpu.period.value = v
            if isinstance(cpu.get("cpus"), str):
                out.cpu.cpus = cpu["cpus"]
            if isinstance(cpu.get("mems"), str):
                out.cpu.mems = cpu["mems"]
        if isinstance(mem, dict) and (lim := _int64(mem.get("limit"))) is not None:
            out.memory.limit.value = lim
    return c


class InventoryObserver(Protocol):
    def inventory_done(self, ok: bool, adopted: int, forgotten: int) -> None: ...


class Adopter(Protocol):
    """What takes the inventory (the node model)."""

    def observe(self, pods: list[api.PodSandbox], containers: list[api.Container]) -> int: ...
    def pending(self) -> int: ...
    def prune(self, live: set[str], listed_at: float) -> int: ...
    def knows(self, key: str, running: bool = False) -> bool: ...


class Listing(NamedTuple):
    """One inventory: what the adopter does not know yet (as NRI messages), and every id the
    runtime listed (``pod:<id>`` for pods: the node model's keys)."""

    pods: list[api.PodSandbox]
    containers: list[api.Container]
    listed_at: float
    live: set[str]


RETRY_MIN, RETRY_MAX = 0.5, 30.0  # seconds between attempts while the CRI socket does not answer
PENDING_RECHECK = 0.5  # seconds: first look again while adopted containers have not started
STATUS_IN_FLIGHT = 8  # verbose status calls at once (a cold start on a full node)
FIRST_WAIT = 5.0  # seconds the first inventory waits for NRI to tell what runs (Synchronize)


class CriInventory:
    """Lists the runtime's pods and containers and hands them to the adopter: at start, every
    ``period`` seconds, and soon after ``kick()`` (a new cgroup directory nobody told us about)."""

    def __init__(
        self,
        client: AsyncCRI,
        adopter: Adopter,
        period: float = 60.0,
        min_interval: float = 0.2,
        hooks_live: Callable[[], bool] = lambda: False,
        observer: InventoryObserver | None = None,
        told: Callable[[], Awaitable[object]] | None = None,
        pacer: Pacer | None = None,
    ) -> None:
        """``told``: resolves once NRI has said what runs (the stub ready: Synchronize taken in,
        or a pre-registered plugin configured); the first inventory waits for it, up to
        ``FIRST_WAIT`` seconds, so that it asks the runtime only about what NRI did not say.
        ``pacer``: the loop shared with the hooks (the agent's): a node's worth of work gives
        it back between turns; default: turns measured in time alone."""
        self.pacer = Pacer() if pacer is None else pacer
        self.client = client
        self.told = told
        self.adopter = adopter
        # With NRI up, StartContainer tells us a pending container started: no need to poll.
        self.hooks_live = hooks_live
        self.observer: InventoryObserver = observer or Unobserved()
        self.period = period
        self.min_interval = min_interval  # a burst of new directories costs one inventory
        self._pods: dict[str, api.PodSandbox] = {}
        self._containers: dict[str, tuple[int, api.Container]] = {}  # id -> (CRI state, converted)
        self._bad: set[tuple[str, int]] = set()  # (id, state) whose status we cannot use
        self._kicked = asyncio.Event()
        self._available: bool | None = None
        self.errors = 0

    def kick(self) -> None:
        self._kicked.set()

    async def snapshot(self) -> Listing:
        """The runtime's ready pods and created/running containers, and when the listing began.
        Details (verbose status) are fetched only for what the adopter does not know yet (a
        container it knows running, a pod it knows: NRI told it) and was not fetched before,
        a few at a time: an agent that synchronized a node of thousands asks for nothing."""
        listed_at = time.monotonic()
        ready = cri.PodSandboxStateValue(state=cri.SANDBOX_READY)
        sandboxes = (await self.client.call("ListPodSandbox", cri.ListPodSandboxRequest(filter={"state": ready}))).items
        containers = [
            c
            for c in (await self.client.call("ListContainers", cri.ListContainersRequest())).containers
            if c.state in (cri.CONTAINER_CREATED, cri.CONTAINER_RUNNING)
        ]
        gate = asyncio.Semaphore(STATUS_IN_FLIGHT)

        async def pod_details(sb: Any) -> None:
            async with gate:
                req = cri.PodSandboxStatusRequest(pod_sandbox_id=sb.id, verbose=True)
                try:
                    self._pods[sb.id] = pod_from_cri(sb, _info(await self.client.call("PodSandboxStatus", req)))
                except (BadStatus, grpc.RpcError) as exc:
                    self._unusable(sb.id, 0, f"pod {sb.metadata.namespace}/{sb.metadata.name}", exc)

        async def container_details(ct: Any) -> None:
            async with gate:
                req = cri.ContainerStatusRequest(container_id=ct.id, verbose=True)
                try:
                    converted = container_from_cri(ct, _info(await self.client.call("ContainerStatus", req)))
                    self._containers[ct.id] = (ct.state, converted)
                except (BadStatus, grpc.RpcError) as exc:
                    self._unusable(ct.id, ct.state, f"container {ct.id[:12]}", exc)

        known = self.adopter.knows
        asks: list[Awaitable[None]] = []
        turn = self.pacer.turn()  # a node's worth of checks, a turn at a time
        for sb in sandboxes:
            if sb.id not in self._pods and (sb.id, 0) not in self._bad and not known(POD_PREFIX + sb.id):
                asks.append(pod_details(sb))
            if turn.over():
                await self.pacer.give_way()
                turn.restart()
        for ct in containers:
            if (
                self._containers.get(ct.id, (None,))[0] != ct.state  # again once started: now it has a pid
                and (ct.id, ct.state) not in self._bad
                and not known(ct.id, running=ct.state == cri.CONTAINER_RUNNING)
            ):
                asks.append(container_details(ct))
            if turn.over():
                await self.pacer.give_way()
                turn.restart()
        await asyncio.gather(*asks)
        pods = [self._pods[sb.id] for sb in sandboxes if sb.id in self._pods]
        out = [self._containers[ct.id][1] for ct in containers if ct.id in self._containers]
        ids = {sb.id for sb in sandboxes} | {ct.id for ct in containers}
        self._pods = {k: v for k, v in self._pods.items() if k in ids}
        self._containers = {k: v for k, v in self._containers.items() if k in ids}
        self._bad = {k for k in self._bad if k[0] in ids}
        live = {POD_PREFIX + sb.id for sb in sandboxes} | {ct.id for ct in containers}
        return Listing(pods, out, listed_at, live)

    def _unusable(self, obj_id: str, state: int, what: str, exc: Exception) -> None:
        """Skipped until its state changes; said once, not on every pass."""
        if isinstance(exc, grpc.RpcError):  # gone meanwhile, or the runtime is struggling: next pass
            log.debug("inventory: no status for %s: %s", what, _brief(exc))
            return
        self._bad.add((obj_id, state))
        log.warning("inventory: skipping %s: %s", what, exc)

    async def run_once(self) -> bool:
        """One inventory; False when the runtime did not answer. Never raises: this loop is
        the safety net for everything NRI did not say."""
        try:
            return await self._run_once()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("inventory: failed; trying again later")
            self.errors += 1
            self.observer.inventory_done(False, 0, 0)
            return False

    async def _run_once(self) -> bool:
        try:
            listing = await self.snapshot()
        except grpc.RpcError as exc:
            self.errors += 1
            if self._available is not False:
                log.warning(
                    "inventory: the runtime's CRI socket %s is not answering: %s", self.client.socket_path, _brief(exc)
                )
            self._available = False
            self.observer.inventory_done(False, 0, 0)
            return False
        pods, containers = listing.pods, listing.containers
        if self._available is not True:
            log.info(
                "inventory: %d pods and containers from CRI, %d of them new to us",
                len(listing.live),
                len(pods) + len(containers),
            )
        self._available = True
        adopted = 0
        turn = self.pacer.turn()  # a node's worth of pods and containers, a turn at a time: hooks come first
        for p in pods:
            self.adopter.observe([p], [])
            if turn.over():
                await self.pacer.give_way()
                turn.restart()
        for c in containers:
            adopted += self.adopter.observe([], [c])
            if turn.over():
                await self.pacer.give_way()
                turn.restart()
        forgotten = self.adopter.prune(listing.live, listing.listed_at)
        self.observer.inventory_done(True, adopted, forgotten)
        return True

    async def run(self) -> None:
        if self.told is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.told(), FIRST_WAIT)
            await asyncio.sleep(0)  # the Synchronize take-in runs right after its answer
        retry, recheck, pending = RETRY_MIN, PENDING_RECHECK, 0
        while True:
            if await self.run_once():
                wait, retry = self.period, RETRY_MIN
                now_pending = self.adopter.pending()
                if now_pending != pending:  # new containers waiting (or fewer): look soon again
                    recheck, pending = PENDING_RECHECK, now_pending
                if pending and not self.hooks_live():
                    # a container that never starts must not make us poll forever
                    wait, recheck = min(wait, recheck), min(recheck * 2, self.period)
            else:  # the runtime is (re)starting: try again soon, then less often
                wait, retry = min(retry, self.period), min(retry * 2, RETRY_MAX)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kicked.wait(), timeout=wait)
            self._kicked.clear()
            await asyncio.sleep(self.min_interval)


def _brief(exc: grpc.RpcError) -> str:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return f"{code.name if code is not None else 'error'}: {(details or '')[:200]}"
