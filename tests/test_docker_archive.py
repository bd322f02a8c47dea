"""tools/docker_archive.py: the control-plane images of the kind node as docker-save archives."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

from tools.docker_archive import main


def _layer(tmp: Path, name: str, files: dict[str, str]) -> Path:
    root = tmp / name
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_an_archive_of_two_layers_is_what_docker_load_reads(tmp_path: Path) -> None:
    base = _layer(tmp_path, "base", {"etc/passwd": "root:x:0:0::/:/bin/sh\n"})
    top = _layer(tmp_path, "top", {"usr/local/bin/etcd": "#!/bin/sh\n"})
    out = tmp_path / "etcd.tar"
    args = [str(out), "--tag", "registry.k8s.io/etcd:3.6.6-0", "--entrypoint", '["etcd"]', "--env", "A=b"]
    assert main([*args, "--layer", str(base), "--layer", str(top)]) == 0
    with tarfile.open(out) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
        (image,) = manifest
        assert image["RepoTags"] == ["registry.k8s.io/etcd:3.6.6-0"] and len(image["Layers"]) == 2
        config = json.load(tar.extractfile(image["Config"]))  # type: ignore[arg-type]
        assert config["config"]["Entrypoint"] == ["etcd"] and "A=b" in config["config"]["Env"]
        assert any(e.startswith("PATH=") for e in config["config"]["Env"])
        with tarfile.open(fileobj=tar.extractfile(image["Layers"][1])) as layer:
            (member,) = [m for m in layer.getmembers() if m.isfile()]
            assert member.name == "usr/local/bin/etcd" and member.uid == 0 and member.mtime == 315532800
    # The same folders give the same image (the same id: a rebuild changes nothing).
    again = tmp_path / "again.tar"
    assert main([str(again), *args[1:], "--layer", str(base), "--layer", str(top)]) == 0
    with tarfile.open(out) as a, tarfile.open(again) as b:
        assert sorted(a.getnames()) == sorted(b.getnames())


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: object) -> None:
    layer = _layer(tmp_path, "l", {"x": "y"})
    out = str(tmp_path / "o.tar")
    assert main([out, "--tag", "no-tag", "--entrypoint", '["x"]', "--layer", str(layer)]) == 2
    assert main([out, "--tag", "a:b", "--entrypoint", "x", "--layer", str(layer)]) == 2
    assert main([out, "--tag", "a:b", "--entrypoint", '["x"]', "--layer", str(tmp_path / "missing")]) == 2
    assert main([out, "--tag", "a:b", "--entrypoint", '["x"]']) == 2
    assert not Path(out).exists()
