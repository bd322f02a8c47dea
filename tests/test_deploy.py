"""The kind config, the DaemonSet and the image recipe: checked by parsing, since kind and a
container engine cannot run on the CI machines."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import yaml

from nriplugin.agent_lock import lock_path
from nriplugin.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent


def docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((ROOT / "kind" / name).read_text()) if d]


def test_kind_cluster_enables_nri() -> None:
    (cluster,) = docs("cluster.yaml")
    assert cluster["kind"] == "Cluster" and cluster["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    (patch,) = cluster["containerdConfigPatches"]
    nri = tomllib.loads(patch)["plugins"]["io.containerd.nri.v1.nri"]
    assert nri["disable"] is False and nri["disable_connections"] is False
    assert nri["socket_path"] == "/var/run/nri/nri.sock"
    workers = [n for n in cluster["nodes"] if n["role"] == "worker"]
    assert workers and all(n["labels"]["nriplugin.io/colocation"] == "true" for n in workers)


def test_daemonset_matches_cli_and_cluster() -> None:
    ns, ds = docs("daemonset.yaml")
    assert ns["kind"] == "Namespace" and ds["kind"] == "DaemonSet" and ds["apiVersion"] == "apps/v1"
    assert ds["metadata"]["namespace"] == ns["metadata"]["name"]
    spec = ds["spec"]["template"]["spec"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    (ctr,) = spec["containers"]
    # The container's args must be accepted by the real CLI.
    args = build_parser().parse_args(["run", *ctr["args"]])
    (cluster,) = docs("cluster.yaml")
    nri = tomllib.loads(cluster["containerdConfigPatches"][0])["plugins"]["io.containerd.nri.v1.nri"]
    assert args.socket == nri["socket_path"]
    mounts = {m["name"]: m["mountPath"] for m in ctr["volumeMounts"]}
    vols = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"]}
    assert mounts["nri"] == vols["nri"] == str(Path(args.socket).parent)
    assert mounts["cri"] == vols["cri"] == args.cri_socket  # the inventory's CRI socket is there
    # One agent per runtime: the lock lives next to the socket, in the host directory the pod
    # mounts read-write; a surge rollout (new agent Ready while standing by, then the old one
    # stopped) needs per-pod metrics ports, so no hostNetwork.
    nri_mount = next(m for m in ctr["volumeMounts"] if m["name"] == "nri")
    assert str(lock_path(args.socket).parent) == nri_mount["mountPath"] and not nri_mount.get("readOnly")
    rolling = ds["spec"]["updateStrategy"]
    assert rolling["type"] == "RollingUpdate"
    assert rolling["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    assert not spec.get("hostNetwork") and spec["hostPID"] is True
    assert 1 <= spec["terminationGracePeriodSeconds"] <= 30
    port = args.metrics_address[1]
    assert ctr["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port}
    assert ctr["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port}
    assert spec["nodeSelector"].items() <= next(n for n in cluster["nodes"] if n["role"] == "worker")["labels"].items()


def test_containerfile_installs_the_package() -> None:
    """The recipe's shape (image/build.sh builds and e2e/test_image.py runs the real thing)."""
    text = (ROOT / "image" / "Containerfile").read_text()
    assert re.search(r"^ARG BASE=\S+$", text, re.M) and re.search(r"^FROM \$\{BASE\}", text, re.M)
    # The build context is what build.sh assembles: the lock, the dependencies' wheels, the agent's.
    copied = {p for src in re.findall(r"^COPY (?!--from)(.+) \S+$", text, re.M) for p in src.split()}
    assert copied == {"requirements.lock", "deps/", "app/"}
    assert (ROOT / "image" / "requirements.lock").is_file() and "--require-hashes" in text
    for label in ("version", "revision", "source"):
        assert f"org.opencontainers.image.{label}=" in text
    entry = re.search(r"^ENTRYPOINT (\[.*\])$", text, re.M)
    assert entry is not None and yaml.safe_load(entry.group(1)) == ["/opt/nriplugin/bin/nriplugin", "run"]
    cmd = re.search(r"^CMD (\[.*\])$", text, re.M)
    assert cmd is not None
    build_parser().parse_args(["run", *yaml.safe_load(cmd.group(1))])
