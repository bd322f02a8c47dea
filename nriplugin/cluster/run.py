"""The cluster side assembled: one API client, the NodeSLO and pod list-watches, the evictor,
and the NodeMetric reporter (when the agent keeps the usage it reports)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from typing import Any

from nriplugin.cluster import node_name
from nriplugin.cluster.client import ApiClient, connect
from nriplugin.cluster.events import EventRecorder
from nriplugin.cluster.eviction import ApiEvictor
from nriplugin.cluster.listwatch import ListWatch
from nriplugin.cluster.nodemetric import Measured
from nriplugin.cluster.nodeslo import NodeSLOSource
from nriplugin.cluster.nodeslo import watcher as nodeslo_watcher
from nriplugin.cluster.pods import watcher as pods_watcher
from nriplugin.cluster.reporter import NodeMetricReporter, ReportObserver
from nriplugin.policy.cache import RuleCache

log = logging.getLogger("nriplugin.cluster")


class Cluster:
    """What the rest of the agent uses: ``pods`` (PodLookup) and ``evictor`` (ApiEvictions); the
    NodeSLO feeds the rule cache by itself, and the reporter (with ``usage``: what the QoS
    manager's rounds measured) reports the NodeMetric by itself."""

    def __init__(
        self,
        api: ApiClient,
        rules: RuleCache,
        node: str,
        *,
        nodeslo: bool = True,
        dry_run: bool = False,
        usage: Measured | None = None,
        observer: ReportObserver | None = None,
        **kw: Any,
    ) -> None:
        self.api = api
        self.node = node
        self.watches: list[ListWatch] = []
        self.events = EventRecorder(api, node)
        self.nodeslo: NodeSLOSource | None = None
        if nodeslo:
            watch, self.nodeslo = nodeslo_watcher(api, rules, node, events=self.events, **kw)
            self.watches.append(watch)
        watch, self.pods = pods_watcher(api, node, **kw)
        self.pods_watch = watch
        self.watches.append(watch)
        self.evictor = ApiEvictor(api, self.events, dry_run=dry_run)
        self.reporter: NodeMetricReporter | None = None
        if usage is not None:
            self.reporter = NodeMetricReporter(api, node, usage, self.pods, observer=observer, **kw)
            self.watches.append(self.reporter.watch)
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(w.run(), name=f"nriplugin {w.what}") for w in self.watches]
        if self.reporter is not None:
            self._tasks.append(loop.create_task(self.reporter.run(), name=f"nriplugin NodeMetric {self.node} report"))

    async def synced(self, timeout: float) -> bool:
        """Whether every list came back within ``timeout`` seconds."""
        try:
            await asyncio.wait_for(asyncio.gather(*(w.synced.wait() for w in self.watches)), timeout)
        except TimeoutError:
            return False
        return True

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        await self.events.drain()
        await self.api.close()


async def start(
    ns: argparse.Namespace, rules: RuleCache, usage: Measured | None = None, observer: ReportObserver | None = None
) -> Cluster:
    """Connect as ``nriplugin run``'s options say and start watching (and reporting the
    NodeMetric from ``usage``, when given). Raises client.ClusterError."""
    node, source = node_name(getattr(ns, "node_name", None))
    api = await connect(getattr(ns, "kubeconfig", None))
    cluster = Cluster(api, rules, node, nodeslo=getattr(ns, "nodeslo", "on") == "on", usage=usage, observer=observer)
    cluster.start()
    log.info(
        "cluster: node %s (from %s), API server %s; NodeSLO %s; NodeMetric %s",
        node,
        source,
        api.host,
        "watched" if cluster.nodeslo is not None else "not used (--nodeslo off)",
        "reported" if cluster.reporter is not None else "not reported (--nodemetric off)",
        extra={"node": node},
    )
    return cluster
