"""The cluster side against the stand-in API server (tests/kube_standin.py; no kube-apiserver
can run here): NodeSLO into the rule cache, 410 and outages, the node's pods, and evictions
through the Eviction API under a PodDisruptionBudget, with Events."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from nriplugin.cluster import check, node_name, wanted
from nriplugin.cluster.eviction import ApiEvictionResult, ApiEvictor
from nriplugin.cluster.run import Cluster, start
from nriplugin.policy.cache import RuleCache
from nriplugin.policy.model import Policy
from tests.kube_standin import PDB, KubeStandIn

NODE = "node-1"
FAST = {"backoff": (0.05, 0.2)}
# What the NodeMetric reporter needs (tests/test_nodemetric_report.py checks its session's use)
NODEMETRIC_PERMISSIONS = {
    ("slo.koordinator.sh", "nodemetrics", "list"),
    ("slo.koordinator.sh", "nodemetrics", "watch"),
    ("slo.koordinator.sh", "nodemetrics/status", "patch"),
}


def kubeconfig(tmp_path: Path, standin: KubeStandIn) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "standin", "cluster": {"server": standin.url}}],
                "users": [{"name": "agent", "user": {"token": standin.token}}],
                "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "agent"}}],
                "current-context": "standin",
            }
        )
    )
    return str(path)


def used_permissions(requests: list[tuple[str, str]]) -> set[tuple[str, str, str]]:
    """(API group, resource, verb) of each request, as RBAC names them."""
    out = set()
    for method, path_qs in requests:
        path, _, query = path_qs.partition("?")
        parts = path.strip("/").split("/")
        group = "" if parts[0] == "api" else parts[1]
        rest = parts[2:] if parts[0] == "api" else parts[3:]
        if rest[:1] == ["namespaces"]:
            rest = rest[2:]
        resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
        watching = "watch=True" in query or "watch=true" in query
        verb = {"GET": "watch" if watching else ("get" if len(rest) > 1 else "list"), "POST": "create"}.get(
            method, method.lower()
        )
        out.add((group, resource, verb))
    return out


def granted_permissions() -> set[tuple[str, str, str]]:
    docs = list(yaml.safe_load_all((Path(__file__).resolve().parent.parent / "kind" / "rbac.yaml").read_text()))
    (role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    (binding,) = [d for d in docs if d["kind"] == "ClusterRoleBinding"]
    (account,) = [d for d in docs if d["kind"] == "ServiceAccount"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": account["metadata"]["namespace"]}
    ]
    rules = role["rules"]
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


async def until(cond: Callable[[], bool], timeout: float = 2.0) -> float:
    """Seconds until ``cond`` holds (fails after ``timeout``)."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.002)
    return time.monotonic() - t0


def run(tmp_path: Path, body: Callable[[KubeStandIn, Cluster, RuleCache], Awaitable[None]], **kw: Any) -> None:
    async def main() -> None:
        standin = KubeStandIn()
        await standin.start()
        rules = RuleCache()
        ns = argparse.Namespace(kubeconfig=kubeconfig(tmp_path, standin), node_name=NODE, nodeslo="on", cluster="auto")
        setup = kw.pop("setup", None)
        if setup is not None:
            setup(standin)
        cluster = await start(ns, rules)
        for w in cluster.watches:
            w.backoff = FAST["backoff"]
        try:
            assert await cluster.synced(2.0)
            await body(standin, cluster, rules)
        finally:
            await cluster.close()
            await standin.stop()

    asyncio.run(main())


def test_a_nodeslo_change_is_in_force_within_a_second(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    figures: list[float] = []

    def setup(s: KubeStandIn) -> None:
        s.put_nodeslo(NODE, {"cpuBurstStrategy": {"cpuBurstPercent": 300}})
        s.put_nodeslo("node-2", {"cpuBurstStrategy": {"cpuBurstPercent": 700}})  # another node's: never seen

    async def body(s: KubeStandIn, cluster: Cluster, rules: RuleCache) -> None:
        assert rules.policy.cpuBurstStrategy.cpuBurstPercent == 300 and "NodeSLO node-1" in rules.current.source
        assert ("GET", "/apis/slo.koordinator.sh/v1alpha1/nodeslos?fieldSelector=metadata.name%3Dnode-1") in [
            (m, p.split("&")[0]) for m, p in s.requests
        ]
        for value in (400, 500, 600):
            s.put_nodeslo(NODE, {"cpuBurstStrategy": {"cpuBurstPercent": value}})
            figures.append(await until(lambda v=value: rules.policy.cpuBurstStrategy.cpuBurstPercent == v, 1.0))  # type: ignore[misc]
        # Koordinator's fields that nriplugin does not implement do not make it refuse the rest.
        s.put_nodeslo(
            NODE,
            {
                "cpuBurstStrategy": {"cpuBurstPercent": 250},
                "resourceQOSStrategy": {"lsClass": {"memoryQOS": {"enable": True, "pageCacheEnable": True}}},
            },
        )
        await until(lambda: rules.policy.cpuBurstStrategy.cpuBurstPercent == 250, 1.0)
        assert "spec.resourceQOSStrategy.lsClass.memoryQOS.pageCacheEnable" in caplog.text
        # One the CRD rejects: refused with the field named, counted, the last good kept.
        version = rules.current.version
        s.put_nodeslo(NODE, {"cpuBurstStrategy": {"cpuBurstPercent": 20000}})
        await until(lambda: rules.rejected == 1, 1.0)
        assert rules.current.version == version and rules.policy.cpuBurstStrategy.cpuBurstPercent == 250
        assert "spec.cpuBurstStrategy.cpuBurstPercent: 20000 is greater than the maximum of 10000" in caplog.text
        # The stand-in does not apply the CRD: that refusal reached the agent, which says why in a
        # Warning Event on the NodeSLO, in "default" as for any cluster-scoped object.
        await cluster.events.drain()

        def events(reason: str) -> list[dict[str, Any]]:
            return [e for e in s.events.values() if e["involvedObject"]["kind"] == "NodeSLO" and e["reason"] == reason]

        (event,) = events("NodeSLORejected")
        uid = s.nodeslos[NODE]["metadata"]["uid"]
        assert event["metadata"]["namespace"] == "default" and event["type"] == "Warning"
        assert event["involvedObject"] == {
            "apiVersion": "slo.koordinator.sh/v1alpha1",
            "kind": "NodeSLO",
            "name": NODE,
            "uid": uid,
        }
        assert "cpuBurstPercent: 20000 is greater than the maximum" in event["message"] and event["count"] == 1
        assert f"policy version {version} " in event["message"]
        # A value the CRD accepts and the agent cannot use (a CAT range that ends before it
        # starts) is left out, the rest applied, and a Warning Event says so; a repeat of the
        # reason on the object raises that Event's count.
        spec = {
            "cpuBurstStrategy": {"cpuBurstPercent": 250},
            "resourceQOSStrategy": {"beClass": {"resctrlQOS": {"catRangeStartPercent": 80, "catRangeEndPercent": 20}}},
        }
        for count in (1, 2):
            s.put_nodeslo(NODE, spec)
            await until(lambda c=count: sum(e["count"] for e in events("NodeSLOValueNotUsed")) == c, 1.0)  # type: ignore[misc]
        (event,) = events("NodeSLOValueNotUsed")
        assert "catRangeStartPercent (80) must be below catRangeEndPercent (20)" in event["message"]
        assert rules.policy.resourceQOSStrategy.beClass.resctrlQOS.catRangeStartPercent == 0
        assert rules.policy.cpuBurstStrategy.cpuBurstPercent == 250 and rules.rejected == 1
        # Deleted: the policy underneath (here the embedded default) applies again.
        s.delete_nodeslo(NODE)
        await until(lambda: rules.policy.cpuBurstStrategy.cpuBurstPercent == Policy().cpuBurstStrategy.cpuBurstPercent)
        assert rules.current.source == "embedded default"

    with caplog.at_level(logging.INFO):
        run(tmp_path, body, setup=setup)
    print(f"NodeSLO change in force after {[round(f * 1000, 1) for f in figures]} ms")
    assert max(figures) < 1.0, figures


def test_the_nodeslo_is_a_layer_over_the_policy_file() -> None:
    """A reloaded policy file keeps the NodeSLO over it; a new NodeSLO keeps the file under it."""
    from nriplugin.cluster.nodeslo import NodeSLOSource

    rules = RuleCache()
    rules.set(Policy.model_validate({"beMinCPUShares": 8, "cpuBurstStrategy": {"cpuBurstPercent": 500}}), "file")
    source = NodeSLOSource(rules, NODE)
    slo = {"kind": "NodeSLO", "metadata": {"name": NODE, "resourceVersion": "5"}}
    source.event("ADDED", {**slo, "spec": {"cpuBurstStrategy": {"cpuBurstPercent": 300, "cpuBurstPercentX": 1}}})
    assert rules.rejected == 1 and rules.policy.cpuBurstStrategy.cpuBurstPercent == 500  # the CRD refuses the typo
    source.event("MODIFIED", {**slo, "spec": {"cpuBurstStrategy": {"cpuBurstPercent": 300}}})
    assert rules.policy.cpuBurstStrategy.cpuBurstPercent == 300 and rules.policy.beMinCPUShares == 8
    rules.set(Policy.model_validate({"beMinCPUShares": 16, "cpuBurstStrategy": {"cpuBurstPercent": 900}}), "file")
    assert rules.policy.cpuBurstStrategy.cpuBurstPercent == 300 and rules.policy.beMinCPUShares == 16
    assert rules.current.source == "NodeSLO node-1 (resourceVersion 5) over file"
    source.event("DELETED", {**slo, "spec": {}})
    assert rules.policy.cpuBurstStrategy.cpuBurstPercent == 900


def test_410_gone_lists_again_and_an_api_server_away_and_back_is_survived(tmp_path: Path) -> None:
    async def body(s: KubeStandIn, cluster: Cluster, rules: RuleCache) -> None:
        pods = cluster.pods
        s.add_pod("default", "a", NODE)
        await until(lambda: pods.by_name("default", "a") is not None)
        lists = cluster.pods_watch.lists
        # Away and back: the watch resumes from its resourceVersion (no re-list), and what
        # changed meanwhile arrives.
        await s.stop()
        s.add_pod("default", "b", NODE)
        s.put_nodeslo(NODE, {"cpuBurstStrategy": {"cpuBurstPercent": 350}})
        await asyncio.sleep(0.3)  # a few failed attempts, with backoff
        assert cluster.pods_watch.failures >= 1
        await s.start()
        await until(lambda: pods.by_name("default", "b") is not None, 3.0)
        await until(lambda: rules.policy.cpuBurstStrategy.cpuBurstPercent == 350, 3.0)
        assert cluster.pods_watch.lists == lists and cluster.pods_watch.failures == 0
        # History compacted while away: the resume gets 410 Gone, so everything is listed again.
        await s.stop()
        s.add_pod("default", "c", NODE)
        s.delete_pod("default", "a")
        s.compact()
        await s.start()
        await until(lambda: cluster.pods_watch.lists == lists + 1, 3.0)
        assert pods.by_name("default", "c") is not None and pods.by_name("default", "a") is None

    run(tmp_path, body)


def test_the_node_pods_by_uid_and_name(tmp_path: Path) -> None:
    def setup(s: KubeStandIn) -> None:
        s.add_pod("prod", "web", NODE, labels={"koordinator.sh/priority": "9100", "app": "web"}, priority=9000)
        s.add_pod("batch", "job", NODE, labels={"koordinator.sh/priority": "5x"}, priority=5000)
        s.add_pod("batch", "elsewhere", "node-2")

    async def body(s: KubeStandIn, cluster: Cluster, rules: RuleCache) -> None:
        pods = cluster.pods
        assert len(pods) == 2 and pods.by_name("batch", "elsewhere") is None  # only this node's
        web = pods.by_name("prod", "web")
        assert web is not None and (web.priority, web.koord_priority, web.labels["app"]) == (9000, 9100, "web")
        assert pods.by_uid(web.uid) == web
        job = pods.by_name("batch", "job")
        assert job is not None and job.priority == 5000 and job.koord_priority is None  # a malformed label: absent
        s.add_pod("batch", "late", NODE)
        await until(lambda: pods.by_name("batch", "late") is not None)
        s.delete_pod("batch", "job")
        await until(lambda: pods.by_uid(job.uid) is None)

    run(tmp_path, body, setup=setup)


def test_a_pdb_429_spares_that_pod_and_the_next_candidate_goes(tmp_path: Path) -> None:
    def setup(s: KubeStandIn) -> None:
        s.add_pod("shop", "web-1", NODE, labels={"app": "web"})
        s.add_pod("shop", "web-2", "node-2", labels={"app": "web"})
        s.add_pod("shop", "batch-1", NODE, labels={"app": "batch"})
        s.pdbs.append(PDB("shop", "web-pdb", {"app": "web"}, min_available=2))

    async def body(s: KubeStandIn, cluster: Cluster, rules: RuleCache) -> None:
        pods, evictor = cluster.pods, cluster.evictor
        message = "memory 86% of 1.0 GiB >= 70%; releasing 120 MiB; pod uses 200 MiB"
        gone: list[str] = []
        # The caller's loop: candidates in ranking order, the first that goes ends the round.
        for name in ("web-1", "batch-1"):
            pod = pods.by_name("shop", name)
            assert pod is not None
            out = await evictor.evict(pod.namespace, pod.name, pod.uid, 5, "MemoryEvict", message)
            if out.result is ApiEvictionResult.EVICTED:
                gone.append(name)
                break
            assert out.result is ApiEvictionResult.BLOCKED and out.status == 429 and "web-pdb" in out.detail
        assert gone == ["batch-1"]
        assert "deletionTimestamp" not in s.pods[("shop", "web-1")]["metadata"]  # spared
        await until(lambda: pods.by_name("shop", "batch-1") is None)  # gracefully deleted
        await cluster.events.drain()
        events = {e["involvedObject"]["name"]: e for e in s.events.values()}
        assert events["batch-1"]["reason"] == "Evicted" and "MemoryEvict" in events["batch-1"]["message"]
        assert message in events["batch-1"]["message"] and events["batch-1"]["source"]["host"] == NODE
        assert events["web-1"]["reason"] == "EvictionBlocked" and "web-pdb" in events["web-1"]["message"]
        assert events["web-1"]["involvedObject"]["uid"] == s.pods[("shop", "web-1")]["metadata"]["uid"]
        # Retried later, still blocked: the same Event counts up instead of a new one each time.
        web = pods.by_name("shop", "web-1")
        assert web is not None
        out = await evictor.evict("shop", "web-1", web.uid, 5, "MemoryEvict", message)
        await cluster.events.drain()
        assert out.result is ApiEvictionResult.BLOCKED and len(s.events) == 2
        assert s.events[("shop", events["web-1"]["metadata"]["name"])]["count"] == 2
        # Once the budget allows it, the pod goes.
        s.pdbs.clear()
        out = await evictor.evict("shop", "web-1", web.uid, 5, "MemoryEvict", message)
        assert out.result is ApiEvictionResult.EVICTED and out.status == 201
        # Gone already, or the name taken by another pod (the uid precondition): GONE, no Event.
        await until(lambda: pods.by_name("shop", "web-1") is None)
        assert (await evictor.evict("shop", "web-1", web.uid, 5, "MemoryEvict", message)).status == 404
        s.add_pod("shop", "web-1", NODE)
        out = await evictor.evict("shop", "web-1", web.uid, 5, "MemoryEvict", message)
        assert out.result is ApiEvictionResult.GONE and out.status == 409 and ("shop", "web-1") in s.pods
        await cluster.events.drain()
        assert len(s.events) == 3
        # kind/rbac.yaml grants exactly what this session needed and the NodeMetric report's
        # (which this session does not run): nothing missing, nothing spare.
        assert used_permissions(s.requests) == granted_permissions() - NODEMETRIC_PERMISSIONS

    run(tmp_path, body, setup=setup)


def test_dry_run_and_an_api_server_away(tmp_path: Path) -> None:
    def setup(s: KubeStandIn) -> None:
        s.add_pod("batch", "job", NODE)

    async def body(s: KubeStandIn, cluster: Cluster, rules: RuleCache) -> None:
        pod = cluster.pods.by_name("batch", "job")
        assert pod is not None
        dry = ApiEvictor(cluster.api, cluster.events, dry_run=True)
        out = await dry.evict("batch", "job", pod.uid, 5, "CPUEvict", "score 95")
        assert (
            out.result is ApiEvictionResult.EVICTED and "deletionTimestamp" not in s.pods[("batch", "job")]["metadata"]
        )
        assert any("dryRun=All" in p for m, p in s.requests if m == "POST") and not s.events
        await s.stop()
        out = await cluster.evictor.evict("batch", "job", pod.uid, 5, "CPUEvict", "score 95")
        assert out.result is ApiEvictionResult.ERROR and out.status == 0
        await cluster.events.drain()  # its Event could not be posted either: logged, nothing raised
        await s.start()

    run(tmp_path, body, setup=setup)


def test_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("NODE_NAME", "from-env")
    assert node_name("given") == ("given", "--node-name") and node_name(None) == ("from-env", "NODE_NAME")
    off = argparse.Namespace(cluster="auto", kubeconfig=None)
    assert not wanted(off) and check(off) is None  # no API server: the agent runs as before
    assert wanted(argparse.Namespace(cluster="auto", kubeconfig="/x")) and not wanted(
        argparse.Namespace(cluster="off", kubeconfig="/x")
    )
    problem = check(argparse.Namespace(cluster="auto", kubeconfig=str(tmp_path / "missing")))
    assert problem is not None and problem[0] == "--kubeconfig"
    problem = check(argparse.Namespace(cluster="on", kubeconfig=None))
    assert problem is not None and problem[0] == "--cluster"


def test_the_agent_takes_its_nodeslo_from_the_api_server(tmp_path: Path) -> None:
    """`nriplugin run --kubeconfig`: the NodeSLO raises the policy version without a runtime
    (the agent keeps retrying NRI meanwhile); a missing kubeconfig is one line and exit 2."""
    from tests.agent_proc import agent, free_port, poll, stopped

    async def main() -> None:
        standin = KubeStandIn()
        await standin.start()
        standin.put_nodeslo(NODE, {"resourceUsedThresholdWithBE": {"cpuSuppressThresholdPercent": 55}})
        port = free_port()
        args = ["--socket", str(tmp_path / "nri.sock"), "--metrics-address", f"127.0.0.1:{port}"]
        args += ["--log-format", "text"]
        try:
            async with agent(*args, "--kubeconfig", kubeconfig(tmp_path, standin), "--node-name", NODE) as proc:
                url = f"http://127.0.0.1:{port}/metrics"
                _, body = await poll(url, lambda _, body: "nriplugin_policy_version 2.0" in body, tries=300)
                assert "nriplugin_policy_version 2.0" in body
                standin.put_nodeslo(NODE, {"resourceUsedThresholdWithBE": {"cpuSuppressThresholdPercent": 45}})
                _, body = await poll(url, lambda _, body: "nriplugin_policy_version 3.0" in body, 100, 0.02)
                assert "nriplugin_policy_version 3.0" in body
                proc.send_signal(signal.SIGTERM)
                code, logs = await stopped(proc)
                assert code == 0
                assert "cluster: node node-1 (from --node-name)" in logs and "from NodeSLO node-1" in logs
        finally:
            await standin.stop()
        r = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "nriplugin", "run", *args, "--kubeconfig", str(tmp_path / "nope")],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert r.returncode == 2 and "--kubeconfig" in r.stderr and "Traceback" not in r.stderr

    asyncio.run(main())
