"""Write a container image as a ``docker save`` archive from folders and tarballs, with no
registry, daemon or builder: what kind/build.sh makes the control-plane images of a kind node
from (the static binaries kubeadm's manifests run, under the tags kubeadm asks for).

    python -m tools.docker_archive OUT.tar --tag registry.k8s.io/etcd:3.6.6-0 \\
        --entrypoint '["etcd"]' --layer DIR [--layer ROOTFS.tar ...] [--env K=V ...]

A folder layer is packed with root's ownership and a fixed time (the same folder gives the same
bytes, so the same image id); a tarball layer is taken as it is. Layers stack in the order given.
``containerd``'s ``ctr images import`` and ``docker load`` both read the result.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

EPOCH = 315532800  # 1980-01-01: a fixed time for every packed file
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class ArchiveError(ValueError):
    """An input cannot become a layer; the message names it."""


def pack_folder(folder: Path, out: Path) -> None:
    """``folder``'s tree as an uncompressed tar, owned by root, at a fixed time, sorted."""
    if not folder.is_dir():
        raise ArchiveError(f"layer {folder}: not a folder")

    def clean(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = EPOCH
        return info

    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(folder):
            dirnames.sort()
            base = Path(dirpath)
            for name in sorted(dirnames) + sorted(filenames):
                path = base / name
                tar.add(path, arcname=str(path.relative_to(folder)), recursive=False, filter=clean)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def write_archive(out: Path, tag: str, entrypoint: list[str], layers: list[Path], env: list[str]) -> str:
    """Write the archive; return the image's config digest (its id)."""
    if ":" not in tag.rpartition("/")[2]:
        raise ArchiveError(f"--tag {tag!r}: needs NAME:TAG")
    for e in env:
        if "=" not in e:
            raise ArchiveError(f"--env {e!r}: needs KEY=VALUE")
    if not layers:
        raise ArchiveError("no --layer given")
    with tempfile.TemporaryDirectory(prefix="docker-archive-", dir=out.parent) as tmp:
        work = Path(tmp)
        diff_ids, names = [], []
        for i, layer in enumerate(layers):
            staged = work / f"layer{i}.tar"
            if layer.is_dir():
                pack_folder(layer, staged)
            elif layer.is_file() and tarfile.is_tarfile(layer):
                shutil.copyfile(layer, staged)
            else:
                raise ArchiveError(f"layer {layer}: neither a folder nor a tarball")
            digest = sha256_file(staged)
            (work / digest).mkdir(exist_ok=True)
            staged.rename(work / digest / "layer.tar")
            diff_ids.append(f"sha256:{digest}")
            names.append(f"{digest}/layer.tar")
        if not any(e.startswith("PATH=") for e in env):
            env = [f"PATH={DEFAULT_PATH}", *env]
        config = {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": entrypoint, "Env": env, "WorkingDir": "/"},
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
            "history": [{"created_by": "tools/docker_archive.py"} for _ in layers],
        }
        raw = json.dumps(config, sort_keys=True).encode()
        image_id = hashlib.sha256(raw).hexdigest()
        (work / f"{image_id}.json").write_bytes(raw)
        manifest = [{"Config": f"{image_id}.json", "RepoTags": [tag], "Layers": names}]
        (work / "manifest.json").write_text(json.dumps(manifest))
        partial = out.with_name(out.name + ".partial")
        with tarfile.open(partial, "w") as tar:
            for entry in sorted(work.iterdir()):
                tar.add(entry, arcname=entry.name)
        partial.rename(out)
    return image_id


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.docker_archive", description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="the archive to write")
    ap.add_argument("--tag", required=True, help="NAME:TAG the image is known by once imported")
    ap.add_argument("--entrypoint", required=True, help='JSON list, e.g. ["etcd"]')
    ap.add_argument("--layer", type=Path, action="append", default=[], help="a folder or tarball (repeatable)")
    ap.add_argument("--env", action="append", default=[], help="KEY=VALUE (repeatable; PATH has a default)")
    ns = ap.parse_args(argv)
    try:
        entrypoint = json.loads(ns.entrypoint)
        if not isinstance(entrypoint, list) or not all(isinstance(a, str) for a in entrypoint):
            raise ArchiveError(f"--entrypoint {ns.entrypoint!r}: a JSON list of strings")
        image_id = write_archive(ns.out.resolve(), ns.tag, entrypoint, ns.layer, ns.env)
    except json.JSONDecodeError as exc:
        print(f"docker_archive: --entrypoint {ns.entrypoint!r} is not JSON: {exc}", file=sys.stderr)
        return 2
    except (ArchiveError, OSError) as exc:
        print(f"docker_archive: {exc}", file=sys.stderr)
        return 2
    print(f"{ns.out}: {ns.tag} (sha256:{image_id[:12]})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
