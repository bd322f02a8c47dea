"""The cluster suite (``pytest -m cluster``): a kind cluster with NRI brought up by kind/up.sh
(built once, cached; see kind/build.sh) for the session, and removed by kind/down.sh at its end
whatever happened, which must leave nothing behind. ``NRIPLUGIN_KIND_REUSE=1`` uses a cluster
that is already up and leaves it up (for working on the tests)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.kind import KUBECONFIG, ROOT, Cluster, until

LOG = Path(os.environ.get("NRIPLUGIN_CACHE", Path.home() / ".cache" / "nriplugin")) / "kind" / "log"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/e2e/cluster/" in str(item.fspath):
            item.add_marker(pytest.mark.cluster)


def _script(name: str, timeout: float) -> tuple[int, float, Path]:
    LOG.mkdir(parents=True, exist_ok=True)
    log = LOG / f"pytest-{name}.log"
    t0 = time.monotonic()
    with log.open("w") as f:
        r = subprocess.run(
            ["bash", str(ROOT / "kind" / f"{name}.sh")], stdout=f, stderr=subprocess.STDOUT, timeout=timeout
        )
    return r.returncode, time.monotonic() - t0, log


@pytest.fixture(scope="session")
def kind_cluster() -> Iterator[Cluster]:
    if os.geteuid() != 0:
        pytest.fail("the cluster tests need root (Docker, cgroups)")
    reuse = os.environ.get("NRIPLUGIN_KIND_REUSE") == "1" and KUBECONFIG.is_file()
    if not reuse:
        rc, took, log = _script("up", timeout=3600)
        print(f"\nkind/up.sh: exit {rc} after {took:.0f} s (log: {log})")
        if rc != 0:
            pytest.fail(f"kind/up.sh failed (exit {rc}):\n{log.read_text()[-4000:]}")
    try:
        yield Cluster()
    finally:
        if not reuse:
            rc, took, log = _script("down", timeout=600)
            print(f"\nkind/down.sh: exit {rc} after {took:.0f} s")
            assert rc == 0, f"kind/down.sh left something behind:\n{log.read_text()[-3000:]}"


@pytest.fixture
def namespace(kind_cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace of the test's own, deleted (with everything in it) afterwards."""
    from kubernetes import client

    name = "t-" + request.node.name.lower().replace("_", "-")[:50].rstrip("-")
    kind_cluster.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        # Pods are refused until the namespace's default ServiceAccount exists.
        until(
            lambda: kind_cluster.core.read_namespaced_service_account("default", name), 30, f"{name}'s ServiceAccount"
        )
        yield name
    finally:
        kind_cluster.core.delete_namespace(name, grace_period_seconds=0)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                kind_cluster.core.read_namespace(name)
            except client.ApiException as exc:
                if exc.status == 404:
                    break
            time.sleep(0.5)
