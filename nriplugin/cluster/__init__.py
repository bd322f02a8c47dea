"""The cluster side: this node's ``NodeSLO`` watched into the rule cache, this node's pods
(priorities and names for the eviction ranking), evictions through the Eviction API with an
Event on the pod, and the node's NodeMetric report — all through the agent's own small API
client (``client.py`` on aiohttp), started by ``nriplugin run`` when an API server is configured
(``--cluster``). Without one the agent runs exactly as without this package.

This module is light (imported before registering, for the start-up checks); the HTTP client
loads only in ``run.py``.
"""

from __future__ import annotations

import argparse
import os
import socket
from pathlib import Path

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def in_cluster() -> bool:
    """Whether this process runs in a pod with a service account token."""
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and (SERVICE_ACCOUNT / "token").is_file()


def wanted(ns: argparse.Namespace) -> bool:
    """``--cluster on``, or ``auto`` (the default) with a kubeconfig or a service account."""
    mode = getattr(ns, "cluster", "off")
    return mode == "on" or (mode == "auto" and (bool(getattr(ns, "kubeconfig", None)) or in_cluster()))


def check(ns: argparse.Namespace) -> tuple[str, str, str, str] | None:
    """A start-up problem with the cluster options, as (option, value, problem, fix); None if fine."""
    kubeconfig = getattr(ns, "kubeconfig", None)
    if kubeconfig:
        from nriplugin.cluster.kubeconfig import ConfigError, load_kubeconfig

        try:
            load_kubeconfig(kubeconfig)  # what it needs and this client does not do: said now, in one line
        except ConfigError as exc:
            return "--kubeconfig", kubeconfig, str(exc), exc.fix or "fix the kubeconfig"
    elif getattr(ns, "cluster", "off") == "on" and not in_cluster():
        return (
            "--cluster",
            "on",
            "no --kubeconfig and no in-cluster service account (KUBERNETES_SERVICE_HOST, token)",
            "give --kubeconfig, or run in a pod with a service account, or --cluster auto",
        )
    return None


def node_name(given: str | None) -> tuple[str, str]:
    """This node's name and where it came from: ``--node-name``, else NODE_NAME (the DaemonSet
    sets it from ``spec.nodeName``), else the host name (kubelet's default node name)."""
    if given:
        return given, "--node-name"
    if os.environ.get("NODE_NAME"):
        return os.environ["NODE_NAME"], "NODE_NAME"
    return socket.gethostname().lower(), "the host name"
