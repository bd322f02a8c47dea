"""List, then watch from the list's resourceVersion, as client-go's reflector does.

A watch that ends (the server's timeout) is resumed from the last resourceVersion seen; a
``410 Gone`` (history compacted) means the list is stale, so everything is listed again;
any other failure is retried with capped exponential backoff from the last resourceVersion
(a too-old one then turns into a 410 and a re-list). Objects are handled as the API's JSON
(dicts). The watch's bytes are decoded by ``watchstream.WatchDecoder`` (sans-IO); this module
is the loop that drives it and the handler.

Failures are told apart because each has its own fix: the API server out of reach
(connection, TLS, timeout, 5xx), the resource type not served (a 404 on the collection: a
CRD not installed), refused (401/403: credentials or RBAC), or another error (the server's
Status message). All are retried, since a CRD or an RBAC binding may come later; each is
warned about once, then logged at debug with a rare reminder, and the line that ends it says
what recovered. Until then the handler keeps what it had: nothing is dropped for a failure.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

from nriplugin.cluster.client import ApiClient, ApiError
from nriplugin.cluster.status import BadAnswer, json_object
from nriplugin.cluster.watchstream import WatchDecoder

log = logging.getLogger("nriplugin.cluster")

# What a run of failures is, each with its own warning and its own recovery line.
UNREACHABLE = "unreachable"  # no HTTP answer, or a 5xx: the API server itself
NOT_SERVED = "not served"  # 404 on the collection: the type (a CRD, a group/version) is unknown
REFUSED = "refused"  # 401/403: credentials or RBAC
FAILED = "failed"  # any other error answer


class Handler(Protocol):
    def replace(self, items: list[dict[str, Any]]) -> None:
        """The whole current set (after a list)."""

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        """One watch event: ADDED, MODIFIED or DELETED."""


@dataclass(frozen=True)
class WatchedResource:
    """The type a ListWatch lists, so that a failure names it as RBAC and kubectl do."""

    kind: str  # "NodeSLO"
    plural: str  # "nodeslos"
    group: str  # "" for the core group
    version: str
    missing: str = ""  # what to check when the API server does not serve the type

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def collection(self) -> str:
        """The collection's path: ``/api/v1/pods``, ``/apis/GROUP/VERSION/PLURAL``."""
        if self.group:
            return f"/apis/{self.group}/{self.version}/{self.plural}"
        return f"/api/{self.version}/{self.plural}"

    @property
    def qualified(self) -> str:
        """``plural.group``, as the API server's messages and RBAC rules name it."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


class Refused(Exception):
    """An error answer to a list or watch, with what its Status body said (if it was one)."""

    def __init__(self, verb: str, status: int, reason: str, message: str, details: dict[str, Any], url: str) -> None:
        super().__init__(f"{status} {reason}: {message}" if message else f"{status} {reason}")
        self.verb = verb
        self.status = status
        self.reason = reason
        self.message = message
        self.details = details
        self.url = url


@dataclass(frozen=True)
class Trouble:
    """One failed attempt, judged: its class, what to log, and what makes a repeat the same."""

    kind: str
    text: str
    key: tuple[Any, ...] = field(default=())
    verb: str = ""  # the request refused, if it was refused


class ListWatch:
    """``resource``'s collection (or ``path``), listed and watched with ``field_selector``."""

    def __init__(
        self,
        what: str,
        api: ApiClient,
        handler: Handler,
        *,
        resource: WatchedResource,
        field_selector: str = "",
        path: str | None = None,
        list_timeout: float = 30.0,
        backoff: tuple[float, float] = (0.2, 10.0),
        watch_seconds: int = 300,
        remind: float = 600.0,
        rng: random.Random | None = None,
    ) -> None:
        self.what = what
        self.api = api
        self.handler = handler
        self.resource = resource
        self.field_selector = field_selector
        self.path = path or resource.collection
        self.list_timeout = list_timeout
        self.backoff = backoff
        self.watch_seconds = watch_seconds
        self.remind = remind  # seconds between reminders of a trouble that lasts (logged at warning)
        self.rng = rng or random.Random()
        self.synced = asyncio.Event()  # set after the first successful list
        self.resource_version: str | None = None  # of the last list or event handled (None: list next)
        self.lists = 0  # how many times everything was listed (the first one included)
        self.failures = 0  # consecutive failures (0 while connected)
        self.trouble: str | None = None  # the class of the current run of failures (None while connected)
        self._attempts = 0  # failed attempts in this class of trouble
        self._verb = "list"  # of the last refused request, for the recovery line
        self._key: tuple[Any, ...] | None = None  # the trouble last warned about
        self._warned_at = 0.0

    async def run(self) -> None:
        delay = self.backoff[0]
        while True:
            try:
                if self.resource_version is None:
                    await self._list()
                await self._watch(self.resource_version or "")
                delay = self.backoff[0]
                continue
            except Refused as exc:
                if exc.status == 410:
                    log.info("%s: watch history expired (410 Gone); listing again", self.what)
                    self.resource_version = None
                    continue
                trouble = self._judge(exc)
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                trouble = Trouble(UNREACHABLE, f"API server unreachable ({type(exc).__name__}: {exc})", (UNREACHABLE,))
            except Exception as exc:  # e.g. an answer that is not JSON: never end the loop
                trouble = Trouble(FAILED, f"unexpected {type(exc).__name__}: {exc}", (FAILED, type(exc).__name__))
            self._failed(trouble)
            await asyncio.sleep(delay * (0.8 + 0.4 * self.rng.random()))
            delay = min(self.backoff[1], delay * 2)

    def _judge(self, exc: Refused) -> Trouble:
        """What an error answer means, said so that the fix is plain."""
        r = self.resource
        said = " ".join(str(p) for p in (exc.status, exc.reason) if p) + (f": {exc.message}" if exc.message else "")
        request = f"{exc.verb} {r.qualified}"
        if exc.status >= 500:
            return Trouble(UNREACHABLE, f"API server unavailable ({said})", (UNREACHABLE,))
        # A missing object would be named; a collection 404s only when its type is unknown (with
        # a Status, or a plain "404 page not found" from a server's last handler).
        if exc.status == 404 and not exc.details.get("name"):
            hint = f": {r.missing}" if r.missing else ""
            where = f"{exc.verb} {exc.url}" if exc.url else request
            text = f"{r.kind} ({r.api_version}) is not served by the API server{hint} (404 on {where})"
            return Trouble(NOT_SERVED, text, (NOT_SERVED,))
        if exc.status == 401:
            text = (
                f"the API server does not accept this agent's credentials to {request} ({said}): "
                "check the kubeconfig's user, or the service account token"
            )
            return Trouble(REFUSED, text, (REFUSED, 401, exc.verb), exc.verb)
        if exc.status == 403:
            text = (
                f"RBAC does not allow {request} ({said}): "
                f"grant {exc.verb} on {r.qualified} to this agent's service account (kind/rbac.yaml)"
            )
            return Trouble(REFUSED, text, (REFUSED, 403, exc.verb), exc.verb)
        return Trouble(FAILED, f"the API server refused {request}: {said}", (FAILED, exc.status))

    def _failed(self, trouble: Trouble) -> None:
        """Warn once per trouble (and now and then while it lasts), not once per attempt."""
        self.failures += 1
        if trouble.kind != self.trouble:
            if self.trouble == UNREACHABLE:  # it answers now, if not yet as wanted
                log.info("%s: API server reachable again after %s", self.what, _attempts(self._attempts, "failed "))
            self.trouble = trouble.kind
            self._attempts = 0
        self._attempts += 1
        self._verb = trouble.verb or self._verb
        now = time.monotonic()
        extra = {"failures": self.failures, "trouble": trouble.kind}
        if trouble.key != self._key:
            self._key, self._warned_at = trouble.key, now
            log.warning("%s: %s; retrying with backoff", self.what, trouble.text, extra=extra)
        elif now - self._warned_at >= self.remind:
            self._warned_at = now
            log.warning(
                "%s: still, after %s: %s; retrying with backoff",
                self.what,
                _attempts(self._attempts),
                trouble.text,
                extra=extra,
            )
        else:
            log.debug("%s: %s; retrying with backoff", self.what, trouble.text, extra=extra)

    def _connected(self) -> None:
        """The API server answered as wanted: say what recovered, if anything had failed."""
        if self.trouble is None:
            return
        n, r = self._attempts, self.resource
        if self.trouble == UNREACHABLE:
            log.info("%s: API server reachable again after %s", self.what, _attempts(n, "failed "))
        elif self.trouble == NOT_SERVED:
            log.info(
                "%s: %s (%s) is served by the API server now, after %s", self.what, r.kind, r.api_version, _attempts(n)
            )
        elif self.trouble == REFUSED:
            log.info("%s: %s %s is allowed now, after %s", self.what, self._verb, r.qualified, _attempts(n, "refused "))
        else:
            log.info("%s: the API server answers again, after %s", self.what, _attempts(n, "failed "))
        self.failures = self._attempts = 0
        self.trouble = self._key = None

    def _params(self) -> dict[str, str]:
        return {"fieldSelector": self.field_selector} if self.field_selector else {}

    async def _list(self) -> None:
        try:
            raw = await self.api.call("GET", self.path, params=self._params(), timeout=self.list_timeout)
        except ApiError as exc:
            raise refused("list", exc) from None
        self._connected()
        body = json_object(raw, f"list {self.resource.qualified}")
        items = body.get("items") or []
        if not isinstance(items, list) or not all(isinstance(o, dict) for o in items):
            raise BadAnswer(f"list {self.resource.qualified}: items is not a list of objects")
        meta = body.get("metadata")
        rv = str((meta.get("resourceVersion") if isinstance(meta, dict) else None) or "")
        self.handler.replace(items)
        self.resource_version = rv
        self.lists += 1
        self.synced.set()
        log.debug("%s: listed %d, resourceVersion %s", self.what, len(items), rv)

    async def _watch(self, rv: str) -> None:
        """Watch from ``rv`` until the server ends the stream; each event handled moves
        ``resource_version`` on, so a watch that breaks resumes where it was."""
        params = {
            **self._params(),
            "watch": "true",
            "resourceVersion": rv,
            "timeoutSeconds": str(self.watch_seconds),
            "allowWatchBookmarks": "true",
        }
        decoder = WatchDecoder(rv)
        # The request's own timeout ends a silent, half-dead connection too.
        try:
            async with self.api.stream(self.path, params, timeout=self.watch_seconds + 30) as chunks:
                self._connected()
                async for chunk in chunks:
                    for ev in decoder.feed(chunk):
                        if ev.error is not None:
                            raise refused("watch", ev.error)
                        if ev.is_change:
                            self.handler.event(ev.type, ev.object)
                        self.resource_version = ev.resource_version or self.resource_version
                    if decoder.broken is not None:
                        raise decoder.broken
        except ApiError as exc:
            raise refused("watch", exc) from None
        except aiohttp.ClientPayloadError as exc:
            # The connection cut mid-stream (the server went away or restarted): the stream's
            # end, as client-go takes an unexpected EOF; the next request tells whether the
            # server is there. A short pause, so that a server cutting every watch at once is
            # not asked again in a tight loop.
            log.debug("%s: the watch was cut (%s); resuming from %s", self.what, exc, self.resource_version)
            await asyncio.sleep(self.backoff[0] * (0.8 + 0.4 * self.rng.random()))
            return
        if decoder.pending:
            log.debug("%s: the watch ended inside an event (%d bytes); resuming", self.what, decoder.pending)


def _attempts(n: int, how: str = "") -> str:
    return f"{n} {how}attempt" + ("" if n == 1 else "s")


def refused(verb: str, exc: ApiError) -> Refused:
    """The error answer as the API server meant it: its Status, or whatever the body was."""
    if exc.is_status:
        return Refused(verb, exc.status, exc.reason, exc.message, exc.details, exc.url)
    return Refused(verb, exc.status, exc.phrase, "", {}, exc.url)
