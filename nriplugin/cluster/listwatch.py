"""List, then watch from the list's resourceVersion, as client-go's reflector does.

A watch that ends (the server's timeout) is resumed from the last resourceVersion seen; a
``410 Gone`` (history compacted) means the list is stale, so everything is listed again;
any other failure (the API server away, a refused request) is retried with capped
exponential backoff from the last resourceVersion (a too-old one then turns into a 410 and a
re-list). Objects are handled as the API's JSON (dicts): nothing here needs the generated
models, and a node's pods are listed faster without them.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.watch import Watch

log = logging.getLogger("nriplugin.cluster")


class Handler(Protocol):
    def replace(self, items: list[dict[str, Any]]) -> None:
        """The whole current set (after a list)."""

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        """One watch event: ADDED, MODIFIED or DELETED."""


ListCall = Callable[..., Awaitable[Any]]


class ListWatch:
    def __init__(
        self,
        what: str,
        call: ListCall,
        handler: Handler,
        *,
        backoff: tuple[float, float] = (0.2, 10.0),
        watch_seconds: int = 300,
        rng: random.Random | None = None,
    ) -> None:
        self.what = what
        self.call = call
        self.handler = handler
        self.backoff = backoff
        self.watch_seconds = watch_seconds
        self.rng = rng or random.Random()
        self.synced = asyncio.Event()  # set after the first successful list
        self.lists = 0  # how many times everything was listed (the first one included)
        self.failures = 0  # consecutive failures (0 while connected)

    async def run(self) -> None:
        rv: str | None = None
        delay = self.backoff[0]
        while True:
            try:
                if rv is None:
                    rv = await self._list()
                rv = await self._watch(rv)
                delay = self.backoff[0]
            except ApiException as exc:
                if exc.status == 410:
                    log.info("%s: watch history expired (410 Gone); listing again", self.what)
                    rv = None
                    continue
                if exc.status in (401, 403):  # new credentials or RBAC take a while; keep trying
                    self._failed(f"refused ({exc.status} {exc.reason})")
                else:
                    self._failed(f"{exc.status} {exc.reason}")
            except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
                self._failed(f"{type(exc).__name__}: {exc}")
            except Exception as exc:  # e.g. the client library's "Malformed JSON response": never end the loop
                self._failed(f"unexpected {type(exc).__name__}: {exc}")
            else:
                continue
            await asyncio.sleep(delay * (0.8 + 0.4 * self.rng.random()))
            delay = min(self.backoff[1], delay * 2)

    def _failed(self, why: str) -> None:
        self.failures += 1
        level = logging.WARNING if self.failures == 1 else logging.DEBUG  # once per outage, not a storm
        log.log(level, "%s: API server: %s; retrying with backoff", self.what, why, extra={"failures": self.failures})

    def _connected(self) -> None:
        if self.failures:
            log.info("%s: API server reachable again after %d failed attempts", self.what, self.failures)
        self.failures = 0

    async def _list(self) -> str:
        resp = await self.call(_preload_content=False, _request_timeout=30)
        try:
            if not 200 <= resp.status <= 299:
                raise ApiException(status=resp.status, reason=await _reason(resp))
            body = await resp.json(content_type=None)
        finally:
            resp.release()
        self._connected()
        items = list(body.get("items") or [])
        self.handler.replace(items)
        self.lists += 1
        self.synced.set()
        rv = str((body.get("metadata") or {}).get("resourceVersion") or "")
        log.debug("%s: listed %d, resourceVersion %s", self.what, len(items), rv)
        return rv

    async def _watch(self, rv: str) -> str:
        """Watch from ``rv`` until the server ends the stream; returns the last resourceVersion."""
        async with Watch(return_type="object") as watch:
            stream = watch.stream(
                self.call,
                resource_version=rv,
                timeout_seconds=self.watch_seconds,
                allow_watch_bookmarks=True,
                _request_timeout=self.watch_seconds + 30,  # a silent, half-dead connection ends too
            )
            async for ev in stream:
                self._connected()
                kind = ev["type"]
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self.handler.event(kind, ev["raw_object"])
                rv = str(watch.resource_version or rv)
        return rv


async def _reason(resp: Any) -> str:
    try:
        body = await resp.json(content_type=None)
        return str(body.get("message") or body.get("reason") or resp.reason)
    except (ValueError, aiohttp.ClientError):
        return str(resp.reason)
