"""The parts of the critest comparison that decide its verdict, without a runtime: reading
ginkgo's report, telling two runs apart, and the local registry answering a pull's requests
(e2e/test_critest.py runs the whole)."""

from __future__ import annotations

import io
import json
import tarfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from testkit import critest, images
from testkit.registry import Registry, split_name


def spec(texts: list[str], leaf: str, state: str, kind: str = "It", message: str = "") -> dict[str, object]:
    return {
        "ContainerHierarchyTexts": texts,
        "LeafNodeText": leaf,
        "LeafNodeType": kind,
        "State": state,
        "Failure": {"Message": message} if message else None,
    }


def test_report_keeps_its_specs_by_full_name(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    specs = [
        spec([], "", "passed", kind="SynchronizedBeforeSuite"),
        spec(["[k8s.io] Container", "basic"], "creates", "passed"),
        spec(["[k8s.io] Container", "basic"], "stops", "failed", message="boom\nmore"),
        spec(["[k8s.io] AppArmor"], "enforces", "skipped"),
    ]
    report.write_text(json.dumps([{"SpecReports": specs}]))
    states, failures = critest.parse_report(report)
    assert states == {
        "[k8s.io] Container basic creates": "passed",
        "[k8s.io] Container basic stops": "failed",
        "[k8s.io] AppArmor enforces": "skipped",
    }
    assert failures == {"[k8s.io] Container basic stops": "boom\nmore"}
    o = critest.Outcome(states, 1.0, failures)
    assert o.ran() == {k: v for k, v in states.items() if v != "skipped"}
    assert o.summary() == "1 failed, 1 passed, 1 skipped in 1 s"


def test_differences_name_every_spec_that_changed() -> None:
    a = critest.Outcome({"x": "passed", "y": "failed", "z": "skipped"}, 1)
    assert critest.differences(a, critest.Outcome(dict(a.states), 2)) == []
    b = critest.Outcome({"x": "failed", "y": "failed", "w": "passed"}, 1)
    assert critest.differences(a, b) == ["w: absent -> passed", "x: passed -> failed", "z: skipped -> absent"]


def test_image_names_split_or_refuse() -> None:
    assert split_name("registry.k8s.io/e2e-test-images/busybox:1.29-2") == (
        "registry.k8s.io",
        "e2e-test-images/busybox",
        "1.29-2",
    )
    for bad in ("busybox:1", "registry.k8s.io/pause", "pause:3.9"):
        with pytest.raises(ValueError):
            split_name(bad)


def fetch(url: str) -> tuple[int, bytes, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read(), r.headers.get("Docker-Content-Digest", "")
    except urllib.error.HTTPError as e:
        return e.code, b"", ""


def test_registry_serves_a_pull_under_every_name_and_nothing_else(tmp_path: Path) -> None:
    layer = images.tree_layer({"bin/x": (b"x", 0o755)}, hardlinks={"bin/y": "bin/x"}, dirs=("tmp",))
    with tarfile.open(fileobj=io.BytesIO(layer)) as t:
        members = {m.name: m for m in t.getmembers()}
    assert members["bin/y"].islnk() and members["bin/y"].linkname == "bin/x"
    assert members["tmp"].isdir() and members["bin"].isdir()

    archive = images.oci_archive_layers([layer], "gcr.io/a/img:1", [], tmp_path / "a.tar", cmd=["sh"], user="1000")
    reg = Registry()
    digest = reg.add_archive(archive, "k8s.gcr.io/a/img:2")
    reg.start()
    try:
        code, body, served = fetch(f"{reg.url}/v2/a/img/manifests/1?ns=gcr.io")
        assert code == 200 and served == digest
        manifest = json.loads(body)
        code, body, _ = fetch(f"{reg.url}/v2/a/img/blobs/{manifest['config']['digest']}?ns=gcr.io")
        assert code == 200 and json.loads(body)["config"] == {
            "Cmd": ["sh"],
            "Env": ["PATH=/bin"],
            "User": "1000",
            "WorkingDir": "/",
        }
        assert fetch(f"{reg.url}/v2/a/img/manifests/2?ns=k8s.gcr.io")[2] == digest
        assert fetch(f"{reg.url}/v2/a/img/manifests/{digest}?ns=gcr.io")[0] == 200
        assert fetch(f"{reg.url}/v2/a/img/manifests/2?ns=gcr.io")[0] == 404  # that tag is another registry's
        assert fetch(f"{reg.url}/v2/a/img/manifests/{digest}?ns=docker.io")[0] == 404
        assert fetch(f"{reg.url}/v2/a/img/manifests/1")[0] == 404  # no registry named: no fall-back
        hosts = reg.write_hosts(tmp_path / "certs.d", {"gcr.io"})
        assert sorted(p.name for p in hosts.iterdir()) == ["_default", "gcr.io"]
        assert f'server = "{reg.url}"' in (hosts / "_default" / "hosts.toml").read_text()
    finally:
        reg.stop()
