"""The NodeMetric reporter against the stand-in API server (tests/kube_standin.py, which
validates each status patch against Koordinator's vendored CRD as the API server does): it
waits for koord-manager's object, reports at the interval the spec asks, follows a spec change,
and takes a refusal (422, 403, the object gone, the server away) as one clear warning and a
count, and goes on."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from nriplugin.cluster.client import connect
from nriplugin.cluster.pods import watcher as pods_watcher
from nriplugin.cluster.reporter import FORBIDDEN, INVALID, MISSING, UNAVAILABLE, NodeMetricReporter
from nriplugin.cluster.run import start
from nriplugin.policy.cache import RuleCache
from nriplugin.policy.qos import QoSClass
from nriplugin.qos.collect import ContainerUsage
from nriplugin.qos.sample import ClassUsage
from nriplugin.qos.usage import UsageWindows
from tests.kube_standin import KubeStandIn
from tests.test_cluster import NODE, NODEMETRIC_PERMISSIONS, granted_permissions, kubeconfig, until, used_permissions
from tests.test_nodemetric import GIB, node_sample, sandbox, valid_status


class Counted:
    """The reporter's observer, counting."""

    def __init__(self) -> None:
        self.reports: list[tuple[int, int]] = []  # (pods, bytes)
        self.failed: list[str] = []

    def reported(self, pods: int, size: int, seconds: float) -> None:
        self.reports.append((pods, size))

    def report_failed(self, reason: str) -> None:
        self.failed.append(reason)


Body = Callable[[KubeStandIn, NodeMetricReporter, Counted], Awaitable[None]]


def run(tmp_path: Path, body: Body, min_report: float = 0.2, feed: bool = True) -> list[tuple[str, str]]:
    """``body`` with a reporter on a node where an LS pod (spec.priority 5500: koord-batch)
    uses 0.5 cores and 256 MiB and the node 2 cores, 4 GiB; rounds every 50 ms (``feed``).
    Returns the requests the session made."""

    async def main() -> list[tuple[str, str]]:
        standin = KubeStandIn()
        await standin.start()
        standin.add_pod("shop", "pod-7", NODE, priority=5500)
        api = await connect(kubeconfig(tmp_path, standin))
        pod = sandbox(7, "LS")
        pod.namespace, pod.name = "shop", "pod-7"
        windows = UsageWindows()
        pods_watch, cache = pods_watcher(api, NODE, backoff=(0.05, 0.2))
        observer = Counted()
        reporter = NodeMetricReporter(
            api, NODE, windows, cache, observer=observer, min_report=min_report, backoff=(0.05, 0.2)
        )

        async def rounds() -> None:
            while True:
                by_class = {"LS": ClassUsage(cpu_cores=0.5, memory_bytes=256 << 20)}
                containers = {"c7": ContainerUsage(QoSClass.LS, pod.id, 0.5, 256 << 20, 256 << 20)}
                windows.add(node_sample(time.monotonic(), 2.0, 4 * GIB, by_class), containers, {pod.id: pod}.get)
                await asyncio.sleep(0.05)

        tasks = [asyncio.ensure_future(t) for t in (pods_watch.run(), reporter.watch.run(), reporter.run())]
        if feed:
            tasks.append(asyncio.ensure_future(rounds()))
        try:
            await until(lambda: pods_watch.synced.is_set() and reporter.watch.synced.is_set())
            await until(lambda: len(cache) == 1)
            await body(standin, reporter, observer)
            assert not any(t.done() for t in tasks)  # nothing ended the loops
        finally:
            for t in tasks:
                t.cancel()
            _, pending = await asyncio.wait(tasks, timeout=5)  # a loop that outlives its cancel fails here
            for t in pending:
                t.print_stack()
            assert not pending, "a loop did not end when cancelled"
            await api.close()
            await standin.stop()
        return standin.requests

    return asyncio.run(main())


def test_it_waits_for_koord_managers_object_then_reports_at_the_specs_interval(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def body(s: KubeStandIn, reporter: NodeMetricReporter, observer: Counted) -> None:
        sent: list[float] = []  # when each report left (the stand-in sees the first one late: a new connection)
        send = reporter.send

        async def timed(report: dict[str, Any]) -> bool:
            sent.append(time.monotonic())
            return await send(report)

        reporter.send = timed  # type: ignore[method-assign]
        await asyncio.sleep(0.4)
        assert s.status_patches == [] and not reporter.spec.present  # no object: nothing to report to
        assert caplog.text.count("NodeMetric node-1 does not exist (yet)") == 1
        s.put_nodemetric(NODE, {"metricCollectPolicy": {"reportIntervalSeconds": 1}})
        await until(lambda: len(s.status_patches) == 1, 2.0)  # as soon as it exists
        await until(lambda: len(s.status_patches) == 2, 2.0)
        s.put_nodemetric(NODE, {"metricCollectPolicy": {"reportIntervalSeconds": 2, "aggregateDurationSeconds": 60}})
        await until(lambda: len(s.status_patches) == 3, 3.0)
        gaps = [round(b - a, 2) for a, b in itertools.pairwise(sent)]
        print(f"report gaps {gaps} s (spec: 1 s, then 2 s)")
        assert 0.95 <= gaps[0] < 1.4 and 1.95 <= gaps[1] < 2.4
        for _, report in s.status_patches:
            valid_status(report)  # strict: every field is one the CRD names
            assert report["nodeMetric"]["nodeUsage"] == {"resources": {"cpu": "2", "memory": "4Gi"}}
            assert report["nodeMetric"]["systemUsage"] == {"resources": {"cpu": "1500m", "memory": "3840Mi"}}
            (pod,) = report["podsMetric"]
            assert pod == {
                "name": "pod-7",
                "namespace": "shop",
                "podUsage": {"resources": {"cpu": "500m", "memory": "256Mi"}},
                "priority": "koord-batch",  # spec.priority from the API server's pod
                "qos": "LS",
            }
        assert s.nodemetrics[NODE]["spec"]["metricCollectPolicy"]["reportIntervalSeconds"] == 2  # spec untouched
        await until(lambda: len(observer.reports) == 3)  # the answer to the last one is in
        assert [p for p, _ in observer.reports] == [1, 1, 1] and observer.failed == []
        # Deleted (the node going away): said once, nothing sent; back: reports resume at once.
        s.delete_nodemetric(NODE)
        await until(lambda: not reporter.spec.present)
        assert "NodeMetric node-1 does not exist any more" in caplog.text
        s.put_nodemetric(NODE, {"metricCollectPolicy": {"reportIntervalSeconds": 1}})
        await until(lambda: len(s.status_patches) == 4, 2.0)

    with caplog.at_level(logging.INFO, logger="nriplugin.cluster"):
        requests = run(tmp_path, body)
    assert "NodeMetric node-1 found: reporting every 1s" in caplog.text and "first report (1 pods" in caplog.text
    # what the reporter asked of the API server is exactly what kind/rbac.yaml grants it
    used = {p for p in used_permissions(requests) if p[0] == "slo.koordinator.sh"}
    assert used == NODEMETRIC_PERMISSIONS and used <= granted_permissions()


def test_a_refused_report_is_a_warning_and_a_count_and_the_loop_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def body(s: KubeStandIn, reporter: NodeMetricReporter, observer: Counted) -> None:
        s.refuse_status = (422, "Invalid", 'NodeMetric.slo.koordinator.sh "node-1" is invalid: status: Invalid value')
        s.put_nodemetric(NODE, {"metricCollectPolicy": {"reportIntervalSeconds": 0}})  # koordlet's floor: here 0.2 s
        await until(lambda: observer.failed.count(INVALID) == 3, 3.0)
        assert caplog.text.count("report not taken: the API server refused it as invalid (422 Invalid") == 1
        assert "status: Invalid value" in caplog.text and "the next in 200ms" in caplog.text
        s.refuse_status = None
        await until(lambda: len(observer.reports) == 1, 2.0)
        assert "NodeMetric node-1: reported again, after 3 refused" in caplog.text
        # RBAC: the fix is named
        s.forbidden.add(("patch", "nodemetrics/status.slo.koordinator.sh"))
        await until(lambda: FORBIDDEN in observer.failed, 2.0)
        assert "RBAC does not allow patch nodemetrics.slo.koordinator.sh/status" in caplog.text
        assert "grant patch on nodemetrics/status" in caplog.text
        s.forbidden.clear()
        # the API server away: unavailable, then back
        s.unavailable = True
        await until(lambda: UNAVAILABLE in observer.failed, 2.0)
        s.unavailable = False
        taken = len(observer.reports)
        await until(lambda: len(observer.reports) > taken, 3.0)
        # the object gone between the watch and the patch: missing
        del s.nodemetrics[NODE]  # (no watch event: the reporter still thinks it is there)
        await until(lambda: MISSING in observer.failed, 2.0)
        assert "NodeMetric node-1 is gone (404" in caplog.text
        # the stand-in judges by the CRD: a status it does not take is refused with the field named
        s.put_nodemetric(NODE, {})
        bad = {"updateTime": "2026-12-06T00:00:00Z", "nodeMetric": {"nodeUsage": {"resources": {"cpu": "lots"}}}}
        assert not await reporter.send(bad)
        assert "nodeMetric.nodeUsage.resources.cpu" in caplog.text
        assert all(r["nodeMetric"]["nodeUsage"]["resources"]["cpu"] == "2" for _, r in s.status_patches)

    with caplog.at_level(logging.INFO, logger="nriplugin.cluster"):
        run(tmp_path, body)


def test_nothing_measured_is_no_report(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Rounds that never come (the QoS manager not running): no report, said once after an
    interval, never a status without nodeMetric."""

    async def body(s: KubeStandIn, reporter: NodeMetricReporter, observer: Counted) -> None:
        s.put_nodemetric(NODE, {"metricCollectPolicy": {"reportIntervalSeconds": 1}})
        await until(lambda: "nothing measured for" in caplog.text, 4.0)
        assert s.status_patches == [] and observer.reports == []

    with caplog.at_level(logging.INFO, logger="nriplugin.cluster"):
        run(tmp_path, body, min_report=1, feed=False)


def test_the_cluster_side_reports_with_usage_and_not_without(tmp_path: Path) -> None:
    """``start`` (what the agent calls): a reporter when given the usage, none without (the
    NodeSLO-only cluster side makes no NodeMetric request)."""

    async def main() -> None:
        standin = KubeStandIn()
        await standin.start()
        standin.put_nodemetric(NODE, {})
        ns = argparse.Namespace(kubeconfig=kubeconfig(tmp_path, standin), node_name=NODE, nodeslo="on", cluster="auto")
        windows = UsageWindows()
        cluster = await start(ns, RuleCache(), windows, Counted())
        try:
            assert cluster.reporter is not None and await cluster.synced(2.0)
            windows.add(node_sample(time.monotonic(), 1.0, GIB), {}, lambda _: None)  # keep() was asked first
            await until(lambda: len(standin.status_patches) == 1, 3.0)
            valid_status(standin.status_patches[0][1])
        finally:
            await cluster.close()
        standin.requests.clear()
        plain = await start(ns, RuleCache())
        try:
            assert plain.reporter is None and await plain.synced(2.0)
            assert not any("nodemetrics" in p for _, p in standin.requests)
        finally:
            await plain.close()
            await standin.stop()

    asyncio.run(main())


def test_the_agent_reports_its_nodes_usage(tmp_path: Path) -> None:
    """`nriplugin run --kubeconfig`: without a runtime the QoS manager's rounds still measure the
    node, and the first report goes once two rounds have; its metrics count it."""
    from tests.agent_proc import agent, free_port, poll, stopped

    async def main() -> None:
        standin = KubeStandIn()
        await standin.start()
        standin.put_nodemetric(NODE, {"metricCollectPolicy": {"reportIntervalSeconds": 60}})
        port = free_port()
        args = ["--socket", str(tmp_path / "nri.sock"), "--metrics-address", f"127.0.0.1:{port}"]
        args += ["--log-format", "text", "--kubeconfig", kubeconfig(tmp_path, standin), "--node-name", NODE]
        try:
            async with agent(*args) as proc:
                url = f"http://127.0.0.1:{port}/metrics"
                _, text = await poll(url, lambda _, body: "nriplugin_nodemetric_reports_total 1.0" in body, tries=300)
                assert "nriplugin_nodemetric_reports_total 1.0" in text
                assert "nriplugin_nodemetric_report_pods 0.0" in text
                ((_, report),) = standin.status_patches
                valid_status(report)
                proc.send_signal(signal.SIGTERM)
                code, logs = await stopped(proc)
                assert code == 0 and "NodeMetric reported" in logs and "NodeMetric node-1: first report" in logs
        finally:
            await standin.stop()

    asyncio.run(main())
