"""The Helm chart (charts/nriplugin) is the one source of the agent's Kubernetes objects: the
plain manifests under kind/ are rendered from it (tools/render_manifests.py) and must agree
with a fresh rendering; the chart lints and renders valid objects with its defaults too; its
vendored NodeSLO CRD is Koordinator v1.8.0's, byte for byte. helm is helm.sh/helm/v4 built by
kind/build.sh (cached; the first build takes a few minutes)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tools import render_manifests

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "nriplugin"
CRD_SHA256 = "c89e8792b8f7ca25564e3507740bb077cea4ac7ea8a492e464ead4430506c8b3"  # v1.8.0's file
LICENSE_SHA256 = "c71d239df91726fc519c6eb72d318ec65820627232b2f796219e87dcf35d0ab4"


@pytest.fixture(scope="module")
def helm() -> Path:
    try:
        return render_manifests.helm_binary()
    except render_manifests.RenderError as exc:
        if (
            os.environ.get("NRIPLUGIN_REQUIRE_PEERS") == "1"
            or Path(os.environ.get("GO", "/usr/local/go/bin/go")).exists()
        ):
            raise
        pytest.skip(f"no helm and no Go toolchain to build it: {exc}")


def test_the_vendored_nodeslo_crd_is_koordinators_v1_8_0() -> None:
    crd = CHART / "crds" / "slo.koordinator.sh_nodeslos.yaml"
    assert hashlib.sha256(crd.read_bytes()).hexdigest() == CRD_SHA256
    assert hashlib.sha256((CHART / "crds" / "LICENSE").read_bytes()).hexdigest() == LICENSE_SHA256
    assert (ROOT / "kind" / "crds" / crd.name).read_bytes() == crd.read_bytes()
    doc = yaml.safe_load(crd.read_text())
    assert doc["spec"]["names"]["kind"] == "NodeSLO" and doc["spec"]["scope"] == "Cluster"


def test_the_manifests_under_kind_are_the_charts_rendering(helm: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "tools.render_manifests", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NRIPLUGIN_HELM": str(helm)},
    )
    assert r.returncode == 0, r.stderr


def test_a_changed_chart_is_caught(helm: Path) -> None:
    """The check can fail: a rendering from other values differs from kind/."""
    want = render_manifests.render(helm)
    daemonset = want["daemonset.yaml"].decode()
    assert "--pods-root" not in daemonset  # kind's values let the agent find kind's pods root
    assert (ROOT / "kind" / "daemonset.yaml").read_text() == daemonset
    assert daemonset.replace("containerd.sock", "other.sock") != (ROOT / "kind" / "daemonset.yaml").read_text()


def test_the_chart_lints_and_renders_valid_objects_with_its_defaults(helm: Path) -> None:
    lint = subprocess.run([str(helm), "lint", str(CHART)], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    r = subprocess.run(
        [str(helm), "template", "nriplugin", str(CHART), "--namespace", "colo"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    docs: list[dict[str, Any]] = [d for d in yaml.safe_load_all(r.stdout) if d]
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == ["ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet", "ServiceAccount"]
    for doc in docs:
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)
        if doc["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert doc["metadata"]["namespace"] == "colo"
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    args = ds["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not any(a.startswith("--pods-root") for a in args)  # the agent's own default
