"""The plain manifests under kind/, rendered from the Helm chart (charts/nriplugin, the one
source of truth) with the kind cluster's values (charts/nriplugin/ci/kind-values.yaml).

    python -m tools.render_manifests           # write kind/*.yaml and kind/crds/ from the chart
    python -m tools.render_manifests --check   # exit 1, naming the files, if they differ

Each template becomes kind/<its name>; the chart's vendored CRD is copied to kind/crds/. helm
(``helm.sh/helm/v4``, built once by ``kind/build.sh helm`` from the Go module proxy) does the
rendering; ``NRIPLUGIN_HELM`` names another binary.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "nriplugin"
VALUES = CHART / "ci" / "kind-values.yaml"
OUT = ROOT / "kind"
RELEASE, NAMESPACE = "nriplugin", "nriplugin-system"
COPIED = {  # chart file -> kind/ file, byte for byte
    "crds/slo.koordinator.sh_nodeslos.yaml": "crds/slo.koordinator.sh_nodeslos.yaml",
    "crds/LICENSE": "crds/LICENSE.koordinator",
}
HEADER = (
    "# Rendered from charts/nriplugin ({template}, values: charts/nriplugin/ci/kind-values.yaml) by\n"
    "# `python -m tools.render_manifests`: edit the chart, then render again.\n"
)
OWN = {"cluster.yaml"}  # kind/'s files that are not the chart's
SOURCE = re.compile(r"^# Source: [^/]+/templates/(\S+)$", re.M)


class RenderError(RuntimeError):
    """helm is missing or refused the chart; the message says what to do."""


def helm_binary() -> Path:
    """``NRIPLUGIN_HELM``, else the cached build (built now if missing: a few minutes once)."""
    given = os.environ.get("NRIPLUGIN_HELM")
    if given:
        if not os.access(given, os.X_OK):
            raise RenderError(f"NRIPLUGIN_HELM={given}: not an executable")
        return Path(given)
    r = subprocess.run(["bash", str(ROOT / "kind" / "build.sh"), "helm"], capture_output=True, text=True)
    if r.returncode != 0:
        raise RenderError(f"bash kind/build.sh helm failed (exit {r.returncode}):\n{r.stderr[-2000:]}")
    return Path(r.stdout.strip().splitlines()[-1])


def render(helm: Path) -> dict[str, bytes]:
    """kind/-relative path -> the bytes it should hold."""
    cmd = [str(helm), "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "-f", str(VALUES)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RenderError(f"helm template failed (exit {r.returncode}): {r.stderr.strip()}")
    files: dict[str, list[str]] = {}
    for doc in r.stdout.split("\n---\n"):
        m = SOURCE.search(doc)
        if m is None:
            if doc.strip() and doc.strip() != "---":
                raise RenderError(f"helm template gave a document with no '# Source:' line: {doc[:200]!r}")
            continue
        body = doc[m.end() :].strip("\n")
        files.setdefault(m.group(1), []).append(body)
    out = {
        name: (HEADER.format(template=f"templates/{name}") + "\n---\n".join(bodies) + "\n").encode()
        for name, bodies in files.items()
    }
    for src, dst in COPIED.items():
        out[dst] = (CHART / src).read_bytes()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.render_manifests", description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare, write nothing; exit 1 if any file differs")
    ns = ap.parse_args(argv)
    try:
        want = render(helm_binary())
    except RenderError as exc:
        print(f"render_manifests: {exc}", file=sys.stderr)
        return 2
    stale = [
        name for name, data in sorted(want.items()) if not (OUT / name).is_file() or (OUT / name).read_bytes() != data
    ]
    # kind's own config is not a Kubernetes object; anything else under kind/ comes from the chart.
    extra = sorted(p.name for p in OUT.glob("*.yaml") if p.name not in want and p.name not in OWN)
    if ns.check:
        for name in stale:
            print(f"kind/{name} differs from the chart: run python -m tools.render_manifests", file=sys.stderr)
        for name in extra:
            print(f"kind/{name} is not rendered from the chart: move it into charts/nriplugin", file=sys.stderr)
        return 1 if stale or extra else 0
    for name in extra:
        print(f"kind/{name} is not rendered from the chart: move it into charts/nriplugin", file=sys.stderr)
    for name in stale:
        (OUT / name).parent.mkdir(parents=True, exist_ok=True)
        (OUT / name).write_bytes(want[name])
        print(f"wrote kind/{name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
