"""OCI images built locally from Debian's busybox-static (nothing is pulled from a registry).

``oci_archive`` writes an OCI image layout as a tar that ``ctr images import`` accepts; the
layer holds /bin/busybox and the applet links the tests use.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

WORKLOAD = "nriplugin.local/e2e/busybox:1"
PAUSE = "nriplugin.local/e2e/pause:1"
APPLETS = ("sh", "sleep", "cat", "true", "echo", "yes", "ls", "dd")


def _tar_bytes(add: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for info, data in add:
            info.mtime = 0
            info.uid = info.gid = 0
            t.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _dir(name: str) -> tuple[tarfile.TarInfo, None]:
    i = tarfile.TarInfo(name)
    i.type, i.mode = tarfile.DIRTYPE, 0o755
    return i, None


def busybox_layer(busybox: Path) -> bytes:
    data = busybox.read_bytes()
    f = tarfile.TarInfo("bin/busybox")
    f.size, f.mode = len(data), 0o755
    entries: list[tuple[tarfile.TarInfo, bytes | None]] = [_dir("bin"), (f, data)]
    for a in APPLETS:
        link = tarfile.TarInfo(f"bin/{a}")
        link.type, link.linkname, link.mode = tarfile.SYMTYPE, "busybox", 0o777
        entries.append((link, None))
    for d in ("dev", "proc", "sys", "etc", "tmp", "var", "run"):
        entries.append(_dir(d))
    return _tar_bytes(entries)


def oci_archive(busybox: Path, name: str, entrypoint: list[str], out: Path) -> Path:
    """An image of busybox alone, as an OCI layout tar for ``ctr images import``."""
    return oci_archive_layers([busybox_layer(busybox)], name, entrypoint, out)


def files_layer(files: dict[str, Path]) -> bytes:
    """A layer holding host files at the given paths in the image (executable, e.g. static
    binaries built for a benchmark), with their parent folders."""
    entries: list[tuple[tarfile.TarInfo, bytes | None]] = []
    folders: set[str] = set()
    for dest, src in sorted(files.items()):
        parts = dest.strip("/").split("/")
        for k in range(1, len(parts)):
            d = "/".join(parts[:k])
            if d not in folders:
                folders.add(d)
                entries.append(_dir(d))
        data = src.read_bytes()
        f = tarfile.TarInfo("/".join(parts))
        f.size, f.mode = len(data), 0o755
        entries.append((f, data))
    return _tar_bytes(entries)


def tree_layer(
    files: dict[str, tuple[bytes, int]],
    symlinks: dict[str, str] | None = None,
    dirs: tuple[str, ...] = (),
    hardlinks: dict[str, str] | None = None,
) -> bytes:
    """A layer written from memory: ``files`` (path -> content and mode, e.g. 0o4755 for a
    set-uid program), ``symlinks`` (path -> target), ``hardlinks`` (path -> a file's path in
    the layer: busybox's applets, so that masking one does not mask busybox) and empty
    ``dirs``; every parent folder is made. For test images that must look like a published one
    (its users, its tools)."""
    entries: list[tuple[tarfile.TarInfo, bytes | None]] = []
    folders: set[str] = set()

    def folder(path: str) -> None:  # the folder and its parents, once each
        parts = [p for p in path.split("/") if p]
        for k in range(1, len(parts) + 1):
            d = "/".join(parts[:k])
            if d not in folders:
                folders.add(d)
                entries.append(_dir(d))

    for d in dirs:
        folder(d)
    for path, (data, mode) in sorted(files.items()):
        folder(path.strip("/").rpartition("/")[0])
        f = tarfile.TarInfo(path.strip("/"))
        f.size, f.mode = len(data), mode
        entries.append((f, data))
    for path, target in sorted((symlinks or {}).items()):
        folder(path.strip("/").rpartition("/")[0])
        link = tarfile.TarInfo(path.strip("/"))
        link.type, link.linkname, link.mode = tarfile.SYMTYPE, target, 0o777
        entries.append((link, None))
    for path, target in sorted((hardlinks or {}).items()):
        folder(path.strip("/").rpartition("/")[0])
        link = tarfile.TarInfo(path.strip("/"))
        link.type, link.linkname = tarfile.LNKTYPE, target.strip("/")
        link.mode = files[target][1]
        entries.append((link, None))
    return _tar_bytes(entries)


def oci_archive_layers(
    layers: list[bytes],
    name: str,
    entrypoint: list[str],
    out: Path,
    cmd: list[str] | None = None,
    path: str = "/bin",
    user: str = "",
) -> Path:
    """An image of any layers (lowest first): e.g. busybox's and a :func:`files_layer` on top,
    as an OCI layout tar for ``ctr images import``. An empty ``entrypoint`` is left out of the
    config (the image runs ``cmd``, or what the container's command says); ``user`` is the
    image's default user."""
    diff_ids = ["sha256:" + hashlib.sha256(layer).hexdigest() for layer in layers]
    image_config: dict[str, object] = {"Env": [f"PATH={path}"], "WorkingDir": "/"}
    if entrypoint:
        image_config["Entrypoint"] = entrypoint
    if cmd:
        image_config["Cmd"] = cmd
    if user:
        image_config["User"] = user
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": image_config,
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        },
        sort_keys=True,
    ).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": "sha256:" + hashlib.sha256(config).hexdigest(),
                "size": len(config),
            },
            "layers": [
                {"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": d, "size": len(layer)}
                for d, layer in zip(diff_ids, layers, strict=True)
            ],
        },
        sort_keys=True,
    ).encode()
    index = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": "sha256:" + hashlib.sha256(manifest).hexdigest(),
                    "size": len(manifest),
                    "platform": {"architecture": "amd64", "os": "linux"},
                    "annotations": {
                        "io.containerd.image.name": name,
                        "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1],
                    },
                }
            ],
        },
        sort_keys=True,
    ).encode()
    entries: list[tuple[tarfile.TarInfo, bytes | None]] = [_dir("blobs"), _dir("blobs/sha256")]
    for blob in dict.fromkeys([*layers, config, manifest]):  # a blob once, however often it is used
        i = tarfile.TarInfo("blobs/sha256/" + hashlib.sha256(blob).hexdigest())
        i.size, i.mode = len(blob), 0o644
        entries.append((i, blob))
    for fname, content in (("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'), ("index.json", index)):
        i = tarfile.TarInfo(fname)
        i.size, i.mode = len(content), 0o644
        entries.append((i, content))
    out.write_bytes(_tar_bytes(entries))
    return out
