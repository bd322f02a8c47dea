"""The plugin stub: a :class:`Plugin` implements only the handlers it needs; :class:`Stub`
registers it with the runtime, derives the event subscription from those handlers (only the
events the runtime knows: see :mod:`nriplugin.nri.runtime`), dispatches requests (a dedicated
RPC per event from NRI v0.12 runtimes, ``StateChange`` from older ones), enforces each hook's
time budget and failure policy, and reconnects forever.

Handlers may be plain functions (the fast path: answered straight from the socket callback)
or coroutines (run as a task under ``asyncio.wait_for`` with the hook's budget). A plain
handler cannot be interrupted; if it overruns its budget it is counted as such and its
answer is still sent.

Sizes: the runtime accepts messages of at most ttrpc's 4 MiB, so an answer that would be
larger (updates for thousands of containers) carries what fits and the rest follows in
UpdateContainers calls right after it; the runtime may send more than 4 MiB (containerd 1.7's
Synchronize is one message; NRI v0.8 and later split it, and the parts are taken in whole
before the plugin sees any), accepted up to ``StubOptions.max_message``. A request over that
bound is refused unread and the stub then stays away from the runtime for
``refused_retry`` seconds (the agent serves reconciler-only meanwhile) rather than
re-registering into the same message again and again.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
import os
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, cast

from google.protobuf.message import DecodeError
from google.protobuf.message import Message as PbMessage

from nriplugin.nri import api_pb2 as api
from nriplugin.nri import ttrpc
from nriplugin.nri.runtime import VENDORED, RuntimeCaps, from_configure
from nriplugin.nri.transport import CallError, Trunk, TrunkTraffic, open_trunk
from nriplugin.obs.unobserved import Unobserved

log = logging.getLogger("nriplugin.nri")

DEFAULT_SOCKET = "/var/run/nri/nri.sock"
PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
REGISTRATION_TIMEOUT = 5.0  # the runtime's own registration timeout
DEADLINE_SHARE = 0.8  # of the runtime's per-request deadline that a hook may use
SEND_LIMIT = ttrpc.MAX_MESSAGE - 1024  # an answer's or a call's payload (room for the ttrpc envelope)
ENV_SOCKET, ENV_NAME, ENV_IDX = "NRI_PLUGIN_SOCKET", "NRI_PLUGIN_NAME", "NRI_PLUGIN_IDX"

# Every event of the vendored protocol, bit (event - 1) of the mask. A runtime rejects bits it
# does not know: the subscription sent is further cut to RuntimeCaps.events at Configure.
VALID_EVENTS = (1 << (api.LAST - 1)) - 1

# handler name -> event it subscribes to
HANDLER_EVENTS: dict[str, int] = {
    "run_pod_sandbox": api.RUN_POD_SANDBOX,
    "stop_pod_sandbox": api.STOP_POD_SANDBOX,
    "remove_pod_sandbox": api.REMOVE_POD_SANDBOX,
    "create_container": api.CREATE_CONTAINER,
    "post_create_container": api.POST_CREATE_CONTAINER,
    "start_container": api.START_CONTAINER,
    "post_start_container": api.POST_START_CONTAINER,
    "update_container": api.UPDATE_CONTAINER,
    "post_update_container": api.POST_UPDATE_CONTAINER,
    "stop_container": api.STOP_CONTAINER,
    "remove_container": api.REMOVE_CONTAINER,
    "update_pod_sandbox": api.UPDATE_POD_SANDBOX,
    "post_update_pod_sandbox": api.POST_UPDATE_POD_SANDBOX,
}
STATE_CHANGE_HANDLERS = {ev: name for name, ev in HANDLER_EVENTS.items()}
POD_EVENTS = frozenset(
    {api.RUN_POD_SANDBOX, api.STOP_POD_SANDBOX, api.REMOVE_POD_SANDBOX, api.POST_UPDATE_POD_SANDBOX}
)  # events about a pod alone: the handler takes (pod)
# NRI v0.12's dedicated RPCs for the events that carry nothing back (request type, handler);
# CreateContainer, UpdateContainer, StopContainer and UpdatePodSandbox are served on their own.
NOTIFY_RPCS: dict[str, tuple[type[PbMessage], str]] = {
    "RunPodSandbox": (api.RunPodSandboxRequest, "run_pod_sandbox"),
    "StopPodSandbox": (api.StopPodSandboxRequest, "stop_pod_sandbox"),
    "RemovePodSandbox": (api.RemovePodSandboxRequest, "remove_pod_sandbox"),
    "PostUpdatePodSandbox": (api.PostUpdatePodSandboxRequest, "post_update_pod_sandbox"),
    "PostCreateContainer": (api.PostCreateContainerRequest, "post_create_container"),
    "StartContainer": (api.StartContainerRequest, "start_container"),
    "PostStartContainer": (api.PostStartContainerRequest, "post_start_container"),
    "PostUpdateContainer": (api.PostUpdateContainerRequest, "post_update_container"),
    "RemoveContainer": (api.RemoveContainerRequest, "remove_container"),
}

Pod = api.PodSandbox
Container = api.Container
Updates = list[api.ContainerUpdate]


class Plugin:
    """Base class: override only the handlers you need; the rest are never subscribed.

    ``create_container`` returns a ``ContainerAdjustment``, or ``(adjustment, updates)``, or
    None; with :attr:`keeps_requests` it gets the request's wire bytes as a third argument.
    ``update_container`` and ``stop_container`` may return updates to other containers.
    ``synchronize`` may return updates for existing containers. ``update_pod_sandbox`` and
    ``post_update_pod_sandbox`` are subscribed only on runtimes that know them (NRI v0.10+).
    """

    # True: create_container(pod, container, request) also gets the CreateContainer request's
    # wire bytes. A plugin that keeps a created container for later should keep these, not
    # ``pod`` and ``container``: those hold their request's whole parse, several times larger,
    # so in a burst of creates every request would parse into memory the process has never
    # touched, and each create would pay page faults on the hook path (docs/hook-path.md;
    # tests/test_hook_work.py counts them).
    keeps_requests: ClassVar[bool] = False

    def runtime_caps(self, caps: RuntimeCaps) -> None:
        """What the runtime supports, told once per connection before :meth:`configure`."""

    def configure(self, config: str, runtime_name: str, runtime_version: str) -> Any:
        return None

    def synchronize(self, pods: list[Pod], containers: list[Container]) -> Any:
        return None

    def shutdown(self) -> Any:
        return None

    def run_pod_sandbox(self, pod: Pod) -> Any: ...
    def stop_pod_sandbox(self, pod: Pod) -> Any: ...
    def remove_pod_sandbox(self, pod: Pod) -> Any: ...
    def create_container(self, pod: Pod, container: Container) -> Any: ...
    def post_create_container(self, pod: Pod, container: Container) -> Any: ...
    def start_container(self, pod: Pod, container: Container) -> Any: ...
    def post_start_container(self, pod: Pod, container: Container) -> Any: ...
    def update_container(self, pod: Pod, container: Container, resources: api.LinuxResources) -> Any: ...
    def post_update_container(self, pod: Pod, container: Container) -> Any: ...
    def stop_container(self, pod: Pod, container: Container) -> Any: ...
    def remove_container(self, pod: Pod, container: Container) -> Any: ...
    def update_pod_sandbox(self, pod: Pod, resources: api.LinuxResources) -> Any: ...
    def post_update_pod_sandbox(self, pod: Pod) -> Any: ...


def handled_events(plugin: Plugin) -> list[str]:
    """The hooks ``plugin``'s class overrides, by the name the stub reports them under."""
    return [
        name
        for name, ev in HANDLER_EVENTS.items()
        if getattr(type(plugin), name) is not getattr(Plugin, name) and (1 << (ev - 1)) & VALID_EVENTS
    ]


def event_mask(plugin: Plugin) -> int:
    """The subscription derived from the handlers ``plugin``'s class overrides."""
    mask = 0
    for name in handled_events(plugin):
        mask |= 1 << (HANDLER_EVENTS[name] - 1)
    return mask


@dataclass(frozen=True, slots=True)
class HookPolicy:
    """Time budget and failure policy of one hook.

    fail-open: on error or overrun, answer with no adjustment (the reconciler repairs later);
    fail-closed: answer with an error, so the runtime refuses the container.
    """

    budget: float = 0.5
    fail_closed: bool = False


class StubObserver(Protocol):
    """What the stub reports; metrics.py implements it. All calls must be cheap."""

    def hook_done(self, event: str, seconds: float) -> None: ...
    def hook_failed(self, event: str, reason: str, fail_closed: bool) -> None: ...
    def connection_state(self, state: str) -> None: ...
    def synchronized(self, seconds: float, pods: int, containers: int) -> None: ...
    def message_refused(self, length: int, limit: int) -> None: ...


class BufferedObserver:
    """Keeps what happens before the real observer exists (metrics load after registration,
    to keep start-up fast) and replays it into that observer once attached."""

    def __init__(self, limit: int = 10_000) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.limit = limit

    def _keep(self, name: str, *args: Any) -> None:
        if len(self.calls) < self.limit:
            self.calls.append((name, args))

    def hook_done(self, event: str, seconds: float) -> None:
        self._keep("hook_done", event, seconds)

    def hook_failed(self, event: str, reason: str, fail_closed: bool) -> None:
        self._keep("hook_failed", event, reason, fail_closed)

    def connection_state(self, state: str) -> None:
        self._keep("connection_state", state)

    def synchronized(self, seconds: float, pods: int, containers: int) -> None:
        self._keep("synchronized", seconds, pods, containers)

    def message_refused(self, length: int, limit: int) -> None:
        self._keep("message_refused", length, limit)

    def replay(self, target: StubObserver) -> None:
        for name, args in self.calls:
            getattr(target, name)(*args)
        self.calls.clear()


@dataclass(slots=True)
class _HandlerScope:
    active: bool = True


_in_handler: contextvars.ContextVar[_HandlerScope | None] = contextvars.ContextVar("nri_in_handler", default=None)


@dataclass(slots=True)
class _Method:
    request: type[PbMessage]
    run: Callable[..., Any]  # parsed request (and with ``raw`` its wire bytes) -> handler result
    encode: Callable[[Any], bytes]  # handler result -> response payload
    event: str  # metrics/policy key
    raw: bool = False
    # The event's HookPolicy, looked up when the table is built (None: StateChange, whose
    # event comes with each request).
    policy: HookPolicy | None = None


_SYNC_MORE = api.SynchronizeResponse(more=True).SerializeToString()

# Results that are answered synchronously, checked before the slower awaitable test.
_SYNC_RESULTS = (type(None), bytes, list, tuple, PbMessage)


def _identity(payload: Any) -> bytes:
    return payload  # type: ignore[no-any-return]


def _empty(_result: Any) -> bytes:
    return b""


def _as_updates(result: Any) -> Updates:
    return list(result) if result else []


def fit(updates: Updates, room: int) -> tuple[Updates, Updates]:
    """The leading updates whose encoding (as a repeated field) fits in ``room`` bytes, and the rest."""
    used = 0
    for i, u in enumerate(updates):
        n = u.ByteSize()
        used += n + 1 + _varint_len(n)
        if used > room:
            return updates[:i], updates[i:]
    return updates, []


def _varint_len(n: int) -> int:
    return max(1, (n.bit_length() + 6) // 7)


def chunks(updates: Updates, room: int = SEND_LIMIT) -> list[Updates]:
    """``updates`` in consecutive pieces that each fit in ``room`` bytes (one at least each)."""
    out = []
    while updates:
        head, updates = fit(updates, room)
        if not head:  # one update larger than a message: sent alone, the runtime will say
            head, updates = updates[:1], updates[1:]
        out.append(head)
    return out


def _reply(cls: Callable[..., PbMessage], updates: Updates, later: Callable[[Updates], None], **fields: Any) -> bytes:
    """A response carrying ``updates``: all of them when it fits in a message the runtime
    accepts, otherwise what fits, and ``later`` gets the rest (pushed after the answer)."""
    msg = cls(update=updates, **fields)
    if msg.ByteSize() <= SEND_LIMIT:
        return msg.SerializeToString()
    head, rest = fit(updates, SEND_LIMIT - cls(**fields).ByteSize())
    later(rest)
    return cls(update=head, **fields).SerializeToString()


def create_response(result: Any, later: Callable[[Updates], None]) -> bytes:
    """CreateContainer's answer to the runtime. The usual one, an adjustment alone, is its
    field 1 framed by hand: building the response message would copy the adjustment into it."""
    if result is None:
        return b""
    if isinstance(result, api.ContainerAdjustment):
        body = result.SerializeToString()
        return b"\x0a" + ttrpc.varint(len(body)) + body
    adjust, updates = result if isinstance(result, tuple) else (result, None)
    return _reply(api.CreateContainerResponse, _as_updates(updates), later, adjust=adjust)


class UnsafeOnRuntime(RuntimeError):
    """The call is not safe on the connected runtime's NRI (see :mod:`nriplugin.nri.runtime`)."""


@dataclass
class StubOptions:
    name: str = "nriplugin"
    idx: str = "10"
    socket_path: str = DEFAULT_SOCKET
    fd: int | None = None  # inherited connection (pre-registered mode)
    policies: dict[str, HookPolicy] = field(default_factory=dict)  # by event name
    default_policy: HookPolicy = field(default_factory=HookPolicy)
    backoff_initial: float = 0.1
    backoff_max: float = 10.0
    call_timeout: float = 2.0
    max_message: int = ttrpc.RECEIVE_BOUND  # the largest message accepted from the runtime
    refused_retry: float = 600.0  # seconds without NRI after refusing a message over max_message
    # The loop's clock of arrivals, told of every trunk and answer (the agent's HookTraffic): a
    # hook's time, and its budget, start when its bytes could first have been read. None: when
    # the request is handled.
    traffic: TrunkTraffic | None = None

    @classmethod
    def from_env(cls, **kw: Any) -> StubOptions:
        """Options for a plugin the runtime started itself (name, index and fd in the env)."""
        opts = cls(**kw)
        if os.environ.get(ENV_SOCKET):
            raw = os.environ[ENV_SOCKET]
            if not (raw.isascii() and raw.isdigit()):
                raise ValueError(f"invalid {ENV_SOCKET}={raw!r}: expected a file descriptor number")
            opts.fd = int(raw)
            opts.name = os.environ.get(ENV_NAME) or opts.name
            opts.idx = os.environ.get(ENV_IDX) or opts.idx
        return opts


def check_identity(name: str, idx: str) -> None:
    if not name:
        raise ValueError("plugin name must not be empty")
    if len(idx) != 2 or not (idx.isascii() and idx.isdigit()):
        raise ValueError(f"plugin index must be two digits, got {idx!r}")


class Stub:
    def __init__(
        self,
        plugin: Plugin,
        options: StubOptions | None = None,
        observer: StubObserver | None = None,
        *,
        placeholder: bool = False,
    ) -> None:
        self.plugin = plugin
        self.opts = options or StubOptions()
        check_identity(self.opts.name, self.opts.idx)
        self.events = event_mask(plugin)
        if not self.events:
            # A zero mask means "everything" to the runtime: refuse rather than surprise.
            raise ValueError(f"{type(plugin).__name__} implements no event handler")
        self.observer: StubObserver = observer or Unobserved()
        self.trunk: Trunk | None = None
        self.ready = asyncio.Event()  # configured (and synchronized when the runtime does that)
        self.runtime: tuple[str, str] = ("", "")
        self.connections = 0
        self._stopping = False
        self._stopped = asyncio.Event()  # wakes run() from a wait between connections
        self._tasks: set[asyncio.Future[None]] = set()  # hooks in flight (kept referenced)
        self.caps = RuntimeCaps()  # what the runtime supports: learnt at Configure
        self._sync_pods: list[Pod] = []
        self._sync_ctrs: list[Container] = []
        self._sync_parts = 0
        self._refused = False  # this connection brought a message over the bound
        self._overflow: set[asyncio.Future[None]] = set()  # pushes of what did not fit in an answer
        self._methods = self._build_methods()
        # With a placeholder plugin, requests wait here until replace_plugin() brings the real one.
        self._held: list[ttrpc.RequestReceived] | None = [] if placeholder else None

    # dispatch table -----------------------------------------------------------------------

    def replace_plugin(self, plugin: Plugin) -> None:
        """Swap in the real plugin after registering with a light placeholder (start-up is on
        the runtime's clock). Requests that arrived meanwhile are answered now, in order."""
        mask = event_mask(plugin)
        if not mask:
            raise ValueError(f"{type(plugin).__name__} implements no event handler")
        self.plugin, self.events = plugin, mask
        self._methods = self._build_methods()
        held, self._held = self._held or [], None
        for ev in held:
            self._on_request(ev)

    def _build_methods(self) -> dict[str, _Method]:
        p = self.plugin

        def create_reply(result: Any) -> bytes:
            return create_response(result, self._push_after)

        keeping = cast(Callable[[Pod, Container, bytes], Any], p.create_container)  # keeps_requests

        methods = {
            "Configure": _Method(api.ConfigureRequest, self._configure, _identity, "configure"),
            "Synchronize": _Method(api.SynchronizeRequest, self._synchronize, _identity, "synchronize"),
            "Shutdown": _Method(api.Empty, lambda r: p.shutdown(), _empty, "shutdown"),
            "CreateContainer": _Method(
                api.CreateContainerRequest,
                (lambda r, raw: keeping(r.pod, r.container, raw))
                if p.keeps_requests
                else lambda r: p.create_container(r.pod, r.container),
                create_reply,
                "create_container",
                raw=p.keeps_requests,
            ),
            "UpdateContainer": _Method(
                api.UpdateContainerRequest,
                lambda r: p.update_container(r.pod, r.container, r.linux_resources),
                lambda res: _reply(api.UpdateContainerResponse, _as_updates(res), self._push_after),
                "update_container",
            ),
            "StopContainer": _Method(
                api.StopContainerRequest,
                lambda r: p.stop_container(r.pod, r.container),
                lambda res: _reply(api.StopContainerResponse, _as_updates(res), self._push_after),
                "stop_container",
            ),
        }
        methods |= self._event_methods()
        for m in methods.values():
            if m.request is not api.StateChangeEvent:
                m.policy = self.policy(m.event)
        return methods

    def _event_methods(self) -> dict[str, _Method]:
        """The events that carry nothing back: over StateChange (every runtime before NRI v0.12,
        and v0.12's fallback) and over v0.12's dedicated RPCs, to the same handlers. A handler
        runs only for a subscribed event (the base class's would do nothing anyway)."""
        p = self.plugin

        def state_change(req: api.StateChangeEvent) -> Any:
            name = STATE_CHANGE_HANDLERS.get(req.event)
            if name is None or not self.events & (1 << (req.event - 1)):
                return None
            handler = getattr(p, name)
            if req.event == api.UPDATE_POD_SANDBOX:
                return handler(req.pod, api.LinuxResources())  # StateChange carries no resources
            if req.event in POD_EVENTS:
                return handler(req.pod)
            return handler(req.pod, req.container)

        def dedicated(event: int, handler: Callable[..., Any]) -> Callable[[Any], Any]:
            bit = 1 << (event - 1)
            if event in POD_EVENTS:
                return lambda r: handler(r.pod) if self.events & bit else None
            return lambda r: handler(r.pod, r.container) if self.events & bit else None

        def update_pod(r: api.UpdatePodSandboxRequest) -> Any:
            if self.events & (1 << (api.UPDATE_POD_SANDBOX - 1)):
                return p.update_pod_sandbox(r.pod, r.linux_resources)
            return None

        methods = {
            "StateChange": _Method(api.StateChangeEvent, state_change, _empty, "state_change"),
            "UpdatePodSandbox": _Method(api.UpdatePodSandboxRequest, update_pod, _empty, "update_pod_sandbox"),
        }
        for rpc, (request, name) in NOTIFY_RPCS.items():
            methods[rpc] = _Method(request, dedicated(HANDLER_EVENTS[name], getattr(p, name)), _empty, name)
        return methods

    def _configure(self, req: api.ConfigureRequest) -> Any:
        self.runtime = (req.runtime_name, req.runtime_version)
        self.caps = caps = from_configure(req)
        events = self.events & caps.events
        if not events:  # zero would mean "every event" to the runtime
            raise ValueError(f"{caps.describe()} knows none of the events {type(self.plugin).__name__} handles")
        log.info(
            "configured by %s; subscribed to %s",
            caps.describe(),
            ", ".join(n for n, ev in HANDLER_EVENTS.items() if events & (1 << (ev - 1))),
            extra={"nri_version": caps.nri_version, "nri_version_source": caps.source, "events": events},
        )
        self.plugin.runtime_caps(caps)
        result = self.plugin.configure(req.config, req.runtime_name, req.runtime_version)

        def finish(_res: Any) -> bytes:
            if self.opts.fd is not None:
                self.ready.set()  # pre-registered plugins get no Synchronize on containerd 1.7
            return api.ConfigureResponse(events=events).SerializeToString()

        if inspect.isawaitable(result):
            return _then(result, finish)
        return finish(result)

    def _synchronize(self, req: api.SynchronizeRequest) -> Any:
        """Collect a split Synchronize (NRI v0.8+ sets ``more`` on all parts but the last):
        each part is answered with ``more`` echoed and nothing else, as the runtime requires;
        the plugin is called once, with the whole node, at the last part."""
        self._sync_pods.extend(req.pods)
        self._sync_ctrs.extend(req.containers)
        self._sync_parts += 1
        if req.more:
            return _SYNC_MORE
        pods, ctrs, parts = self._sync_pods, self._sync_ctrs, self._sync_parts
        self._sync_pods, self._sync_ctrs, self._sync_parts = [], [], 0
        if parts > 1:
            log.info("Synchronize came in %d parts: %d pods, %d containers taken in whole", parts, len(pods), len(ctrs))
        t0 = time.perf_counter()
        result = self.plugin.synchronize(pods, ctrs)

        def finish(res: Any) -> bytes:
            self.observer.synchronized(time.perf_counter() - t0, len(pods), len(ctrs))
            self.ready.set()
            return _reply(api.SynchronizeResponse, _as_updates(res), self._push_after)

        if inspect.isawaitable(result):
            return _then(result, finish)
        return finish(result)

    def policy(self, event: str) -> HookPolicy:
        return self.opts.policies.get(event, self.opts.default_policy)

    def _on_request(self, ev: ttrpc.RequestReceived) -> None:
        if self._held is not None:
            self._held.append(ev)
            return
        trunk = self.trunk
        assert trunk is not None
        t0 = trunk.arrived or time.perf_counter()
        r = ev.request
        if r.service != PLUGIN_SERVICE:
            trunk.respond(ev.stream_id, code=ttrpc.Code.UNIMPLEMENTED, message=f"service {r.service}")
            return
        method = self._methods.get(r.method)
        if method is None:
            trunk.respond(ev.stream_id, code=ttrpc.Code.UNIMPLEMENTED, message=f"method {r.method}")
            return
        try:
            req = method.request.FromString(r.payload)
        except DecodeError as exc:
            trunk.respond(ev.stream_id, code=ttrpc.Code.INVALID_ARGUMENT, message=f"cannot decode {r.method}: {exc}")
            return
        event, policy = method.event, method.policy
        if policy is None:  # StateChange: the event it carries
            event = STATE_CHANGE_HANDLERS.get(cast(api.StateChangeEvent, req).event, "unknown")
            policy = self.policy(event)
        budget = policy.budget
        if r.timeout_nano > 0:
            # Answer (even if only with the failure policy) before the runtime gives up.
            budget = min(budget, r.timeout_nano / 1e9 * DEADLINE_SHARE)
        try:
            result = method.run(req, r.payload) if method.raw else method.run(req)
        except Exception as exc:
            self._failed(trunk, ev.stream_id, event, policy, "error", exc)
            return
        if not isinstance(result, _SYNC_RESULTS) and inspect.isawaitable(result):
            task = asyncio.ensure_future(
                self._finish_async(trunk, ev.stream_id, method, event, policy, budget, result, t0)
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        try:
            payload = result if isinstance(result, bytes) else method.encode(result)
        except Exception as exc:
            self._failed(trunk, ev.stream_id, event, policy, "error", exc)
            return
        trunk.respond(ev.stream_id, payload)
        elapsed = time.perf_counter() - t0
        self.observer.hook_done(event, elapsed)
        if elapsed > budget:
            self.observer.hook_failed(event, "over_budget", policy.fail_closed)

    async def _finish_async(
        self,
        trunk: Trunk,
        sid: int,
        method: _Method,
        event: str,
        policy: HookPolicy,
        budget: float,
        aw: Awaitable[Any],
        t0: float,
    ) -> None:
        # Marks this task (and tasks it spawns) as inside a handler until it has answered.
        scope = _HandlerScope()
        token = _in_handler.set(scope)
        try:
            result = await asyncio.wait_for(_await(aw), max(0.0, budget - (time.perf_counter() - t0)))
            payload = result if isinstance(result, bytes) else method.encode(result)
        except TimeoutError as exc:
            self._failed(trunk, sid, event, policy, "timeout", exc)
            return
        except Exception as exc:
            self._failed(trunk, sid, event, policy, "error", exc)
            return
        finally:
            scope.active = False
            _in_handler.reset(token)
        trunk.respond(sid, payload)
        self.observer.hook_done(event, time.perf_counter() - t0)

    def _failed(self, trunk: Trunk, sid: int, event: str, policy: HookPolicy, reason: str, exc: BaseException) -> None:
        self.observer.hook_failed(event, reason, policy.fail_closed)
        detail = str(exc) or type(exc).__name__
        mode = "fail-closed" if policy.fail_closed else "fail-open"
        log.warning(
            "hook %s %s (%s): %s",
            event,
            reason,
            mode,
            detail,
            extra={"event": event, "reason": reason, "policy": mode},
        )
        # Configure and Synchronize are not hooks: an error there is always reported, and the
        # runtime then ignores this connection, so drop it and register afresh after backoff.
        if event in ("configure", "synchronize"):
            trunk.respond(
                sid, code=ttrpc.Code.UNKNOWN, message=f"nriplugin {event} {reason}: {str(exc) or type(exc).__name__}"
            )
            asyncio.get_running_loop().call_soon(trunk.close)
            return
        if policy.fail_closed:
            code = ttrpc.Code.DEADLINE_EXCEEDED if reason == "timeout" else ttrpc.Code.UNKNOWN
            trunk.respond(sid, code=code, message=f"nriplugin {event} {reason}: {detail}")
        else:
            trunk.respond(sid, b"")  # the empty response: no adjustment, no updates

    def _push_after(self, updates: Updates) -> None:
        """What did not fit in an answer: pushed right after it (this callback writes it first)."""
        if not updates:
            return
        if not self.caps.supports("plugin_updates"):
            log.warning(
                "answer too large for one message: %d updates left out (%s: UpdateContainers is not safe there); "
                "the agent writes their files itself",
                len(updates),
                self.caps.describe(),
            )
            return
        log.info("answer too large for one message: %d updates follow in UpdateContainers", len(updates))
        task = asyncio.ensure_future(self._push_rest(updates))
        self._overflow.add(task)
        task.add_done_callback(self._overflow.discard)

    async def _push_rest(self, updates: Updates) -> None:
        _in_handler.set(None)  # a task of its own: the answer has gone by the time this runs
        try:
            failed = await self.update_containers(updates)
        except Exception as exc:  # the reconciler still converges the files
            log.warning("UpdateContainers of %d containers failed: %s", len(updates), exc)
            return
        if failed:
            log.info("the runtime could not update %d of %d containers", len(failed), len(updates))

    def _on_refused(self, ev: ttrpc.RequestTooLarge) -> None:
        """The runtime sent more than we accept (the trunk answered it with an error): leave
        the connection, which the runtime would otherwise keep with no events for us, and stay
        away for ``refused_retry`` s instead of re-registering into the same message."""
        self.observer.message_refused(ev.length, ev.limit)
        log.error(
            "the runtime sent a %d-byte message, over the %d-byte bound (run --max-message-mib): refused; "
            "serving without NRI hooks (the reconciler keeps the cgroups) and trying again in %.0f s",
            ev.length,
            ev.limit,
            self.opts.refused_retry,
            extra={"length": ev.length, "limit": ev.limit},
        )
        self._refused = True
        trunk = self.trunk
        if trunk is not None:
            asyncio.get_running_loop().call_soon(trunk.close)

    # outside event handlers ---------------------------------------------------------------

    async def update_containers(
        self, updates: Iterable[api.ContainerUpdate], evictions: Iterable[api.ContainerEviction] = ()
    ) -> Updates:
        """Push updates to running containers; returns the updates the runtime failed.

        Must not be called from inside an event handler: the runtime holds its lock while it
        waits for the handler's answer, so this call would dead-lock until both time out. Nor
        at all on a runtime whose NRI is older than v0.12.1 (``RuntimeCaps.supports
        ("plugin_updates")``): there it can deadlock the runtime for good against any container
        event (containerd#13733), so it raises :class:`UnsafeOnRuntime` and sends nothing.
        """
        scope = _in_handler.get()
        if scope is not None and scope.active:
            raise RuntimeError("update_containers() called from inside an NRI event handler")
        trunk = self.trunk
        if trunk is None or not self.ready.is_set():
            raise ConnectionError("not connected to the runtime")
        if not self.caps.supports("plugin_updates"):
            raise UnsafeOnRuntime(
                f"{self.caps.describe()}: a plugin's UpdateContainers can deadlock this runtime against a container "
                "event (containerd#13733, fixed in NRI v0.12.1); not sent"
            )
        evict = list(evictions)
        failed: Updates = []
        for part in chunks(list(updates), SEND_LIMIT - api.UpdateContainersRequest(evict=evict).ByteSize()) or [[]]:
            req = api.UpdateContainersRequest(update=part, evict=evict)
            evict = []  # evictions go with the first call
            payload = await trunk.call(
                RUNTIME_SERVICE, "UpdateContainers", req.SerializeToString(), self.opts.call_timeout
            )
            failed += api.UpdateContainersResponse.FromString(payload).failed
        return failed

    # connection lifecycle -----------------------------------------------------------------

    async def connect_once(self) -> Trunk:
        """Connect and register; returns the trunk once the runtime accepted us."""
        self.ready.clear()
        self._sync_pods, self._sync_ctrs, self._sync_parts = [], [], 0
        self.caps = RuntimeCaps()
        if self._held is not None:
            self._held.clear()  # requests of a previous connection must not be answered here
        self.observer.connection_state("connecting")
        self._refused = False
        trunk = await open_trunk(
            self._on_request,
            path=self.opts.socket_path if self.opts.fd is None else None,
            fd=self.opts.fd,
            max_message=self.opts.max_message,
            on_refused=self._on_refused,
            traffic=self.opts.traffic,
        )
        self.trunk = trunk
        self.connections += 1
        req = api.RegisterPluginRequest(plugin_name=self.opts.name, plugin_idx=self.opts.idx, NRI_version=VENDORED)
        try:
            await trunk.call(RUNTIME_SERVICE, "RegisterPlugin", req.SerializeToString(), REGISTRATION_TIMEOUT)
        except BaseException:
            trunk.close()
            raise
        self.observer.connection_state("registered")
        log.info(
            "registered with the runtime as %s-%s",
            self.opts.idx,
            self.opts.name,
            extra={"plugin": f"{self.opts.idx}-{self.opts.name}"},
        )
        return trunk

    async def run(self) -> None:
        """Serve until :meth:`stop`; reconnect with capped exponential backoff.

        In pre-registered mode (inherited fd) there is nothing to reconnect to: the runtime
        starts a new instance, so this returns when the connection ends.
        """
        delay = self.opts.backoff_initial
        while not self._stopping:
            trunk: Trunk | None = None
            try:
                trunk = await self.connect_once()
                exc = await trunk.closed
                if exc is not None:
                    log.warning("NRI connection lost: %s", exc)
                elif self._stopping:
                    log.info("NRI connection closed: stopping")
                elif self._refused:
                    pass  # said when refusing
                else:
                    log.info("NRI connection closed by the runtime")
                delay = self.opts.backoff_initial
            except (OSError, CallError, TimeoutError, ValueError) as exc:
                log.warning(
                    "cannot register with the runtime at %s: %s",
                    self.opts.socket_path,
                    exc,
                    extra={"socket": self.opts.socket_path},
                )
            finally:
                if trunk is not None:
                    trunk.close()
                self.trunk = None
                self.ready.clear()
                self.observer.connection_state("disconnected")
            if self.opts.fd is not None or self._stopping:
                return
            if self._refused:  # not a loop into the same refused message
                await self._pause(self.opts.refused_retry)
                continue
            await self._pause(delay * random.uniform(0.8, 1.2))
            delay = min(delay * 2, self.opts.backoff_max)

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopped.wait(), seconds)

    def stop(self) -> None:
        self._stopping = True
        self._stopped.set()
        if self.trunk is not None:
            self.trunk.close()


async def _await(aw: Awaitable[Any]) -> Any:
    return await aw


async def _then(aw: Awaitable[Any], fn: Callable[[Any], bytes]) -> bytes:
    return fn(await aw)
