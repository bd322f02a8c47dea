"""The kind config, the manifests and the image recipe: checked by parsing and against the
schemas (kind and a container engine cannot run on the CI machines): every YAML under kind/ is
validated, Kubernetes objects by kubernetes-validate, the operator's PodMonitor and
PrometheusRule against their vendored CRDs, the kind config against kind's own types."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from nriplugin.agent.lock import lock_path
from nriplugin.cli.main import build_parser
from nriplugin.policy.cache import parse

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
    (ns,) = docs("namespace.yaml")
    (ds,) = docs("daemonset.yaml")
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
    vols = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
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


# kind's Cluster config (v1alpha4), written from kind's Go types
# (sigs.k8s.io/kind/pkg/apis/config/v1alpha4/types.go): unknown fields are refused, as kind's
# strict decoding refuses them.
_STRINGS = {"type": "array", "items": {"type": "string"}}
_PATCHES = {
    "type": "array",
    "items": {
        "type": "object",
        "additionalProperties": False,
        "required": ["group", "version", "kind", "patch"],
        "properties": {k: {"type": "string"} for k in ("group", "version", "kind", "patch")},
    },
}
KIND_CLUSTER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["kind", "apiVersion"],
    "properties": {
        "kind": {"const": "Cluster"},
        "apiVersion": {"const": "kind.x-k8s.io/v1alpha4"},
        "name": {"type": "string"},
        "nodes": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "role": {"enum": ["control-plane", "worker"]},
                    "image": {"type": "string"},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                    "extraMounts": {"type": "array", "items": {"type": "object"}},
                    "extraPortMappings": {"type": "array", "items": {"type": "object"}},
                    "gpus": {"type": "string"},
                    "kubeadmConfigPatches": _STRINGS,
                    "kubeadmConfigPatchesJSON6902": _PATCHES,
                },
            },
        },
        "networking": {"type": "object"},
        "featureGates": {"type": "object", "additionalProperties": {"type": "boolean"}},
        "runtimeConfig": {"type": "object", "additionalProperties": {"type": "string"}},
        "kubeadmConfigPatches": _STRINGS,
        "kubeadmConfigPatchesJSON6902": _PATCHES,
        "containerdConfigPatches": _STRINGS,
        "containerdConfigPatchesJSON6902": _STRINGS,
    },
}
# The oldest Kubernetes whose kind node images carry containerd 1.7, and the newest schemas
# kubernetes-validate has.
K8S_VERSIONS = ("1.29", kubernetes_validate.latest_version())


def all_manifests() -> list[tuple[Path, dict[str, Any]]]:
    out = []
    for path in sorted((ROOT / "kind").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                out.append((path, doc))
    return out


def crd_schema(kind: str) -> dict[str, Any]:
    """The openAPIV3Schema of the vendored CRD that defines ``kind`` (kind/crds/)."""
    for path in sorted((ROOT / "kind" / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["names"]["kind"] == kind:
            (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
            schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
            return schema
    raise LookupError(f"no vendored CRD defines {kind}")


def validate(path: Path, doc: dict[str, Any]) -> None:
    if doc.get("apiVersion") == "kind.x-k8s.io/v1alpha4":
        jsonschema.validate(doc, KIND_CLUSTER_SCHEMA)
    elif str(doc.get("apiVersion", "")).startswith("monitoring.coreos.com/"):
        # Not jsonschema.validate: it checks the schema itself first, and the CRD's patterns
        # are Go's (RE2: `^(?i)...`), which Python's re refuses; no field here uses them.
        jsonschema.Draft7Validator(crd_schema(doc["kind"])).validate(doc)
    else:
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)


def test_every_manifest_validates() -> None:
    """Every YAML under kind/ (a new file too: rbac.yaml, the vendored CRDs) against its schema."""
    seen = {(p.name, d["kind"]) for p, d in all_manifests()}
    for want in (
        ("cluster.yaml", "Cluster"),
        ("namespace.yaml", "Namespace"),
        ("daemonset.yaml", "DaemonSet"),
        ("policy.yaml", "ConfigMap"),
        ("podmonitor.yaml", "PodMonitor"),
        ("prometheusrule.yaml", "PrometheusRule"),
    ):
        assert want in seen
    for path, doc in all_manifests():
        try:
            validate(path, doc)
        except (jsonschema.ValidationError, kubernetes_validate.ValidationError) as exc:
            raise AssertionError(f"{path.relative_to(ROOT)} ({doc.get('kind')}): {exc}") from None


def test_validation_catches_mistakes() -> None:
    """The checks above can fail: a misspelt field in each kind of manifest is refused."""
    (ds,) = docs("daemonset.yaml")
    ds["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(Path("daemonset.yaml"), ds)
    (pm,) = docs("podmonitor.yaml")
    pm["spec"]["podMetricsEndpoints"][0]["interval"] = "15 seconds"  # not a Prometheus duration
    with pytest.raises(jsonschema.ValidationError):
        validate(Path("podmonitor.yaml"), pm)
    (cluster,) = docs("cluster.yaml")
    cluster["nodes"][0]["lables"] = {}
    with pytest.raises(jsonschema.ValidationError):
        validate(Path("cluster.yaml"), cluster)


def test_manifests_fit_together() -> None:
    """Namespaces, the ServiceAccount's name, the policy ConfigMap mounted the way hot reload
    needs (a whole volume, not subPath), the PodMonitor on the agent's port and labels."""
    (ns,) = docs("namespace.yaml")
    name = ns["metadata"]["name"]
    for path, doc in all_manifests():
        if doc["kind"] not in ("Namespace", "Cluster", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"):
            assert doc["metadata"]["namespace"] == name, path
    (ds,) = docs("daemonset.yaml")
    spec = ds["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "nriplugin"
    (ctr,) = spec["containers"]
    args = build_parser().parse_args(["run", *ctr["args"]])
    mount = next(m for m in ctr["volumeMounts"] if m["name"] == "policy")
    assert "subPath" not in mount and Path(args.policy).parent == Path(mount["mountPath"])
    vol = next(v for v in spec["volumes"] if v["name"] == "policy")
    (cm,) = docs("policy.yaml")
    assert vol["configMap"]["name"] == cm["metadata"]["name"]
    policy, notes = parse(cm["data"][Path(args.policy).name], "kind/policy.yaml")  # a valid policy
    assert not notes and policy.beMinCPUShares == 2
    (pm,) = docs("podmonitor.yaml")
    assert pm["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    port = next(p for p in ctr["ports"] if p["name"] == endpoint["port"])
    assert port["containerPort"] == args.metrics_address[1] and endpoint["path"] == "/metrics"
    ann = ds["spec"]["template"]["metadata"]["annotations"]
    assert ann["prometheus.io/port"] == str(args.metrics_address[1])


def test_up_script_applies_every_manifest() -> None:
    text = (ROOT / "kind" / "up.sh").read_text()
    for path in sorted((ROOT / "kind").glob("*.yaml")):
        assert f"kind/{path.name}" in text, f"kind/up.sh does not apply {path.name}"
    r = subprocess.run(["bash", "-n", str(ROOT / "kind" / "up.sh")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
