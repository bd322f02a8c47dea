"""What the list-watches say when the API server does not give what they ask for, against the
stand-in API server (tests/kube_standin.py): out of reach, the type not served (the NodeSLO
CRD not installed), refused by RBAC or credentials, or another error. Each is warned about
once, in words that name the fix, and its end is told by what recovered: "reachable again"
only after the server was really out of reach."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from nriplugin.cluster.client import ApiClient, connect
from nriplugin.cluster.kubeconfig import ApiConfig
from nriplugin.cluster.listwatch import NOT_SERVED, ListWatch, Refused
from nriplugin.cluster.nodeslo import RESOURCE
from nriplugin.cluster.nodeslo import watcher as nodeslo_watcher
from nriplugin.cluster.pods import watcher as pods_watcher
from nriplugin.policy.cache import RuleCache
from nriplugin.policy.model import Policy
from tests.kube_standin import KubeStandIn
from tests.test_cluster import NODE, kubeconfig, until

FAST = (0.02, 0.05)
COLLECTION = "/apis/slo.koordinator.sh/v1alpha1/nodeslos"
DEFAULT_BURST = Policy().cpuBurstStrategy.cpuBurstPercent
Body = Callable[[KubeStandIn, ListWatch, RuleCache], Awaitable[None]]


def watching(
    tmp_path: Path,
    body: Body,
    setup: Callable[[KubeStandIn], None] | None = None,
    make: Callable[[ApiClient, RuleCache], ListWatch] | None = None,
    **kw: Any,
) -> None:
    """Run ``body`` while one list-watch (the node's NodeSLO unless ``make`` says) runs."""

    async def main() -> None:
        s = KubeStandIn()
        await s.start()
        api = await connect(kubeconfig(tmp_path, s))
        if setup is not None:  # after the client took its token: a setup may change the server's
            setup(s)
        rules = RuleCache()
        watch = make(api, rules) if make else nodeslo_watcher(api, rules, NODE, backoff=FAST, **kw)[0]
        task = asyncio.get_running_loop().create_task(watch.run())
        try:
            await body(s, watch, rules)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await api.close()
            await s.stop()

    asyncio.run(main())


def said(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "nriplugin.cluster" and r.levelno == level]


@pytest.fixture
def log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG, logger="nriplugin.cluster")
    return caplog


def test_a_nodeslo_crd_not_installed_is_said_once_and_its_install_is_noticed(
    tmp_path: Path, log: pytest.LogCaptureFixture
) -> None:
    async def body(s: KubeStandIn, watch: ListWatch, rules: RuleCache) -> None:
        await until(lambda: watch.failures >= 4)
        assert not watch.synced.is_set() and rules.policy.cpuBurstStrategy.cpuBurstPercent == DEFAULT_BURST
        assert said(log, logging.WARNING) == [
            f"NodeSLO {NODE}: NodeSLO (slo.koordinator.sh/v1alpha1) is not served by the API server: "
            f"is Koordinator's NodeSLO CRD installed? (404 on list {s.url}{COLLECTION}); retrying with backoff"
        ]
        assert len([m for m in said(log, logging.DEBUG) if "is not served by the API server" in m]) >= 3
        # Installed later: noticed at the next attempt, the NodeSLO taken, the recovery named.
        s.serve_nodeslos(True)
        s.put_nodeslo(NODE, {"cpuBurstStrategy": {"cpuBurstPercent": 350}})
        await until(lambda: rules.policy.cpuBurstStrategy.cpuBurstPercent == 350)
        (line,) = [m for m in said(log, logging.INFO) if "served by the API server now" in m]
        assert line.startswith(f"NodeSLO {NODE}: NodeSLO (slo.koordinator.sh/v1alpha1) is served by the API server now")
        assert "reachable" not in log.text and watch.failures == 0 and watch.trouble is None

    watching(tmp_path, body, setup=lambda s: setattr(s, "nodeslos_served", False))


def test_a_type_that_stops_being_served_keeps_the_nodeslo_in_force(
    tmp_path: Path, log: pytest.LogCaptureFixture
) -> None:
    """The CRD's version switched to ``served: false``: the open watch ends, the next one gets
    404; the NodeSLO in force stays, and the next version is taken once it is served again."""

    def setup(s: KubeStandIn) -> None:
        s.put_nodeslo(NODE, {"cpuBurstStrategy": {"cpuBurstPercent": 350}})

    async def body(s: KubeStandIn, watch: ListWatch, rules: RuleCache) -> None:
        await until(lambda: rules.policy.cpuBurstStrategy.cpuBurstPercent == 350)
        s.serve_nodeslos(False)
        await until(lambda: watch.failures >= 3)
        assert said(log, logging.WARNING) == [
            f"NodeSLO {NODE}: NodeSLO (slo.koordinator.sh/v1alpha1) is not served by the API server: "
            f"is Koordinator's NodeSLO CRD installed? (404 on watch {s.url}{COLLECTION}); retrying with backoff"
        ]
        assert rules.policy.cpuBurstStrategy.cpuBurstPercent == 350 and "NodeSLO node-1" in rules.current.source
        s.put_nodeslo(NODE, {"cpuBurstStrategy": {"cpuBurstPercent": 450}})
        s.serve_nodeslos(True)
        await until(lambda: rules.policy.cpuBurstStrategy.cpuBurstPercent == 450)
        assert any("is served by the API server now" in m for m in said(log, logging.INFO))
        assert "reachable" not in log.text

    watching(tmp_path, body, setup=setup)


@pytest.mark.parametrize("verb", ["list", "watch"])
def test_an_rbac_denial_names_the_verb_and_the_resource(
    tmp_path: Path, log: pytest.LogCaptureFixture, verb: str
) -> None:
    async def body(s: KubeStandIn, watch: ListWatch, rules: RuleCache) -> None:
        await until(lambda: watch.failures >= 3)
        assert said(log, logging.WARNING) == [
            f"NodeSLO {NODE}: RBAC does not allow {verb} nodeslos.slo.koordinator.sh (403 Forbidden: "
            f'nodeslos.slo.koordinator.sh is forbidden: User "{s.user}" cannot {verb} resource "nodeslos" '
            'in API group "slo.koordinator.sh" at the cluster scope): grant '
            f"{verb} on nodeslos.slo.koordinator.sh to this agent's service account (kind/rbac.yaml); "
            "retrying with backoff"
        ]
        s.forbidden.clear()  # the ClusterRole bound
        await until(lambda: watch.trouble is None)
        (line,) = [m for m in said(log, logging.INFO) if "allowed now" in m]
        assert line.startswith(f"NodeSLO {NODE}: {verb} nodeslos.slo.koordinator.sh is allowed now, after ")
        assert "reachable" not in log.text

    watching(tmp_path, body, setup=lambda s: s.forbidden.add((verb, "nodeslos.slo.koordinator.sh")))


def test_a_core_resource_is_named_as_rbac_names_it(tmp_path: Path, log: pytest.LogCaptureFixture) -> None:
    async def body(s: KubeStandIn, watch: ListWatch, rules: RuleCache) -> None:
        await until(lambda: watch.failures >= 2)
        (line,) = said(log, logging.WARNING)
        assert line.startswith(f"pods on {NODE}: RBAC does not allow list pods (403 Forbidden: pods is forbidden: ")
        assert 'in API group "" at the cluster scope): grant list on pods to this agent' in line

    def make(api: ApiClient, rules: RuleCache) -> ListWatch:
        return pods_watcher(api, NODE, backoff=FAST)[0]

    watching(tmp_path, body, setup=lambda s: s.forbidden.add(("list", "pods")), make=make)


def test_credentials_refused(tmp_path: Path, log: pytest.LogCaptureFixture) -> None:
    async def body(s: KubeStandIn, watch: ListWatch, rules: RuleCache) -> None:
        await until(lambda: watch.failures >= 3)
        assert said(log, logging.WARNING) == [
            f"NodeSLO {NODE}: the API server does not accept this agent's credentials to list "
            "nodeslos.slo.koordinator.sh (401 Unauthorized: Unauthorized): check the kubeconfig's user, "
            "or the service account token; retrying with backoff"
        ]
        s.token = "standin-token"  # the server takes the agent's token again
        await until(lambda: watch.trouble is None)
        assert [m for m in said(log, logging.INFO) if "allowed now" in m]
        assert "reachable" not in log.text

    watching(tmp_path, body, setup=lambda s: setattr(s, "token", "rotated-token"))


def test_out_of_reach_and_back_says_reachable_again(tmp_path: Path, log: pytest.LogCaptureFixture) -> None:
    async def body(s: KubeStandIn, watch: ListWatch, rules: RuleCache) -> None:
        await until(watch.synced.is_set)
        await s.stop()
        await until(lambda: watch.failures >= 3)
        (line,) = said(log, logging.WARNING)
        assert line.startswith(f"NodeSLO {NODE}: API server unreachable (") and "Cannot connect to host" in line
        await s.start()
        await until(lambda: watch.trouble is None)
        (back,) = said(log, logging.INFO)
        assert back.startswith(f"NodeSLO {NODE}: API server reachable again after ")
        # A 503 is the API server unable to serve: out of reach too, and said so.
        s.unavailable = True  # met when the open watch ends (watch_seconds) and the next one opens
        await until(lambda: watch.failures >= 2, 5.0)
        assert said(log, logging.WARNING)[1] == (
            f"NodeSLO {NODE}: API server unavailable (503 ServiceUnavailable: "
            "the server is currently unable to handle the request); retrying with backoff"
        )
        s.unavailable = False
        await until(lambda: watch.trouble is None)
        assert said(log, logging.INFO)[-1].startswith(f"NodeSLO {NODE}: API server reachable again after ")

    watching(tmp_path, body, watch_seconds=1)


def test_back_but_the_type_gone_says_both(tmp_path: Path, log: pytest.LogCaptureFixture) -> None:
    """Out of reach, then an answer that the type is not served: reachable again (the server
    answers), and what is wrong now; its install later is not a second "reachable again"."""

    async def body(s: KubeStandIn, watch: ListWatch, rules: RuleCache) -> None:
        await until(watch.synced.is_set)
        await s.stop()
        await until(lambda: watch.failures >= 2)
        s.nodeslos_served = False
        await s.start()
        await until(lambda: watch.trouble == "not served")
        warnings, infos = said(log, logging.WARNING), said(log, logging.INFO)
        assert warnings[0].startswith(f"NodeSLO {NODE}: API server unreachable (")
        assert "is not served by the API server" in warnings[1] and len(warnings) == 2
        assert len(infos) == 1 and infos[0].startswith(f"NodeSLO {NODE}: API server reachable again after ")
        s.serve_nodeslos(True)
        await until(lambda: watch.trouble is None)
        assert "is served by the API server now" in said(log, logging.INFO)[-1]
        assert len([m for m in said(log, logging.INFO) if "reachable again" in m]) == 1

    watching(tmp_path, body)


def test_another_error_carries_the_status_message(tmp_path: Path, log: pytest.LogCaptureFixture) -> None:
    """A 404 naming an object is not "the type is not served"; a 400 says what the server said."""

    async def body(s: KubeStandIn, watch: ListWatch, rules: RuleCache) -> None:
        await until(lambda: watch.failures >= 3)
        assert said(log, logging.WARNING) == [
            f"NodeSLO {NODE}: the API server refused list nodeslos.slo.koordinator.sh: 400 BadRequest: "
            "unsupported field selector 'metadata.name!=x'; retrying with backoff"
        ]
        watch.field_selector = f"metadata.name={NODE}"
        await until(lambda: watch.trouble is None)
        assert said(log, logging.INFO)[-1].startswith(f"NodeSLO {NODE}: the API server answers again, after ")
        assert "reachable" not in log.text

    def make(api: ApiClient, rules: RuleCache) -> ListWatch:
        handler = RecordingHandler()
        return ListWatch(
            f"NodeSLO {NODE}", api, handler, resource=RESOURCE, field_selector="metadata.name!=x", backoff=FAST
        )

    watching(tmp_path, body, make=make)


def test_a_missing_object_is_not_a_type_not_served(tmp_path: Path, log: pytest.LogCaptureFixture) -> None:
    async def body(s: KubeStandIn, watch: ListWatch, rules: RuleCache) -> None:
        await until(lambda: watch.failures >= 2)
        assert said(log, logging.WARNING) == [
            f"NodeSLO {NODE}: the API server refused list nodeslos.slo.koordinator.sh: 404 NotFound: "
            'nodeslos.slo.koordinator.sh "node-9" not found; retrying with backoff'
        ]

    def make(api: ApiClient, rules: RuleCache) -> ListWatch:
        path = f"{RESOURCE.collection}/node-9"  # a single object: its 404 names it
        return ListWatch(f"NodeSLO {NODE}", api, RecordingHandler(), resource=RESOURCE, path=path, backoff=FAST)

    watching(tmp_path, body, make=make)


def test_a_trouble_that_lasts_is_recalled_now_and_then(tmp_path: Path, log: pytest.LogCaptureFixture) -> None:
    async def body(s: KubeStandIn, watch: ListWatch, rules: RuleCache) -> None:
        await until(lambda: watch.failures >= 6)
        warnings = said(log, logging.WARNING)
        assert len(warnings) < watch.failures and "not served" in warnings[0]
        assert any(m.startswith(f"NodeSLO {NODE}: still, after ") and "not served" in m for m in warnings[1:])

    watching(tmp_path, body, setup=lambda s: setattr(s, "nodeslos_served", False), remind=0.1)


def test_a_wrong_server_url_is_said_for_the_pods(tmp_path: Path, log: pytest.LogCaptureFixture) -> None:
    """A server URL with a path that is not the API server's: the pods "not served" either."""

    async def body(s: KubeStandIn, watch: ListWatch, rules: RuleCache) -> None:
        await until(lambda: watch.failures >= 2)
        assert said(log, logging.WARNING) == [
            f"pods on {NODE}: Pod (v1) is not served by the API server: is the configured server a Kubernetes "
            f"API server? (404 on list {s.url}/not-the-api/api/v1/pods); retrying with backoff"
        ]

    def make(api: ApiClient, rules: RuleCache) -> ListWatch:
        api.host += "/not-the-api"
        return pods_watcher(api, NODE, backoff=FAST)[0]

    watching(tmp_path, body, make=make)


def test_a_plain_404_is_a_type_not_served_too() -> None:
    """Some API servers answer an unknown group with a plain "404 page not found", no Status."""

    watch = ListWatch(
        f"NodeSLO {NODE}", ApiClient(ApiConfig("https://api:6443", "test")), RecordingHandler(), resource=RESOURCE
    )
    url = "https://api:6443/apis/slo.koordinator.sh/v1alpha1/nodeslos"
    trouble = watch._judge(Refused("list", 404, "Not Found", "", {}, url))
    assert trouble.kind == NOT_SERVED and f"(404 on list {url})" in trouble.text


class RecordingHandler:
    def __init__(self) -> None:
        self.seen: list[tuple[str, Any]] = []

    def replace(self, items: list[dict[str, Any]]) -> None:
        self.seen.append(("replace", items))

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        self.seen.append((kind, obj))
