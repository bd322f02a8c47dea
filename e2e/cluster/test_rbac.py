"""Least privilege under the real RBAC authorizer: a token of the agent's own ServiceAccount
(TokenRequest) may do what nriplugin/cluster/ does — list and watch NodeSLOs and pods, create
evictions and Events, patch Events — and is refused everything else tried here."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from testkit.kind import AGENT_NS, Cluster


@pytest.fixture(scope="module")
def agent_api(kind_cluster: Cluster) -> Any:
    """An API client authenticated as the agent's ServiceAccount (nothing else of the admin's)."""
    request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=600))
    token = kind_cluster.core.create_namespaced_service_account_token("nriplugin", AGENT_NS, request).status.token
    admin = kind_cluster.api.configuration
    cfg = client.Configuration()
    cfg.host, cfg.ssl_ca_cert = admin.host, admin.ssl_ca_cert
    cfg.api_key = {"authorization": f"Bearer {token}"}
    return client.ApiClient(cfg)


def status_of(call: Any) -> int:
    try:
        call()
    except client.ApiException as exc:
        return int(exc.status)
    return 200


def test_the_agents_service_account_may_do_its_job_and_nothing_else(kind_cluster: Cluster, agent_api: Any) -> None:
    core: Any = client.CoreV1Api(agent_api)
    custom: Any = client.CustomObjectsApi(agent_api)
    apps: Any = client.AppsV1Api(agent_api)
    worker = kind_cluster.worker()
    # What the agent does (nriplugin/cluster/): allowed.
    assert status_of(lambda: custom.list_cluster_custom_object("slo.koordinator.sh", "v1alpha1", "nodeslos")) == 200
    assert status_of(lambda: core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={worker}")) == 200
    event = client.CoreV1Event(
        metadata=client.V1ObjectMeta(generate_name="rbac-probe-", namespace="default"),
        involved_object=client.V1ObjectReference(kind="Node", name=worker),
        reason="RBACProbe",
        message="e2e/cluster/test_rbac.py",
        type="Normal",
    )
    created: Any = core.create_namespaced_event("default", event)
    patched = {"count": 2}
    assert status_of(lambda: core.patch_namespaced_event(created.metadata.name, "default", patched)) == 200
    eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name="no-such-pod", namespace="default"))
    assert status_of(lambda: core.create_namespaced_pod_eviction("no-such-pod", "default", eviction)) == 404  # allowed
    # What it never does: refused by the authorizer (403), not merely absent.
    refused = {
        "list secrets": lambda: core.list_secret_for_all_namespaces(),
        "delete a pod": lambda: core.delete_namespaced_pod("no-such-pod", "default"),
        "get a pod": lambda: core.read_namespaced_pod("no-such-pod", "default"),
        "list nodes": lambda: core.list_node(),
        "patch a NodeSLO": lambda: custom.patch_cluster_custom_object(
            "slo.koordinator.sh", "v1alpha1", "nodeslos", worker, {"spec": {}}
        ),
        "list DaemonSets": lambda: apps.list_daemon_set_for_all_namespaces(),
        "delete an Event": lambda: core.delete_namespaced_event(created.metadata.name, "default"),
    }
    statuses = {what: status_of(call) for what, call in refused.items()}
    assert statuses == dict.fromkeys(refused, 403)
    kind_cluster.core.delete_namespaced_event(created.metadata.name, "default")
