"""Connecting to the API server through kubernetes_asyncio: the pod's service account when
running in the cluster, or a kubeconfig file."""

from __future__ import annotations

from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.config import ConfigException, load_incluster_config, load_kube_config


class ClusterError(RuntimeError):
    """The cluster cannot be reached as configured; the message says which option."""


async def connect(kubeconfig: str | None) -> ApiClient:
    """An API client from ``kubeconfig``, or from the pod's service account when None."""
    cfg = Configuration()
    try:
        if kubeconfig:
            await load_kube_config(config_file=kubeconfig, client_configuration=cfg, persist_config=False)
        else:
            load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    except (ConfigException, OSError, ValueError, TypeError) as exc:
        where = f"--kubeconfig {kubeconfig}" if kubeconfig else "the in-cluster service account"
        raise ClusterError(f"cannot use {where}: {exc}") from exc
    return ApiClient(configuration=cfg)
