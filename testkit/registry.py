"""A read-only image registry on 127.0.0.1 that serves images built here, and the containerd
hosts configuration that sends every registry's pulls to it.

CRI PullImage always asks a registry, even for an image the runtime has; a suite that pulls
(cri-tools' critest) can then run on a machine with no registry to reach: the runtime pulls
from this one under the names the suite expects, and no request leaves the host. It speaks
just enough of the OCI distribution API for a pull (the version check, manifests by tag or
digest, blobs), from the OCI layout archives :mod:`testkit.images` writes.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def split_name(name: str) -> tuple[str, str, str]:
    """``registry.k8s.io/pause:3.9`` -> (registry, repository, tag); a name must say all three."""
    host, _, rest = name.partition("/")
    repo, _, tag = rest.rpartition(":")
    if not rest or "." not in host or not repo or not tag or "/" in tag:
        raise ValueError(f"image name {name!r}: want REGISTRY/REPOSITORY:TAG")
    return host, repo, tag


class Registry:
    """Images by (registry, repository, tag) and blobs by digest, served over plain HTTP."""

    def __init__(self) -> None:
        self.tags: dict[tuple[str, str, str], str] = {}
        self.blobs: dict[str, bytes] = {}
        self.requests: list[str] = []  # what was asked, for a test to see the pulls happened
        self.server: ThreadingHTTPServer | None = None
        self.thread: threading.Thread | None = None

    def add_archive(self, archive: Path, *names: str) -> str:
        """An OCI layout tar's image, under the name it carries and any ``names`` more (the same
        image in several registries or tags); returns its manifest's digest."""
        with tarfile.open(archive) as t:
            files = {m.name: t.extractfile(m) for m in t.getmembers() if m.isfile()}
            data = {k: f.read() for k, f in files.items() if f is not None}
        index = json.loads(data["index.json"])
        desc = index["manifests"][0]
        for path, blob in data.items():
            if path.startswith("blobs/sha256/"):
                digest = "sha256:" + hashlib.sha256(blob).hexdigest()
                assert path.endswith(digest.split(":")[1]), f"{archive}: {path} is not its digest"
                self.blobs[digest] = blob
        for name in (desc["annotations"]["io.containerd.image.name"], *names):
            self.tags[split_name(name)] = desc["digest"]
        return str(desc["digest"])

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> None:
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                self.answer(body=False)

            def do_GET(self) -> None:
                self.answer(body=True)

            def answer(self, body: bool) -> None:
                url = urlsplit(self.path)
                ns = parse_qs(url.query).get("ns", [""])[0]
                registry.requests.append(f"{self.command} {ns} {url.path}")
                parts = url.path.split("/")
                blob, ctype = None, "application/octet-stream"
                if url.path in ("/v2", "/v2/"):
                    blob, ctype = b"{}", "application/json"
                elif len(parts) >= 5 and parts[1] == "v2" and parts[-2] in ("manifests", "blobs"):
                    repo, kind, ref = "/".join(parts[2:-2]), parts[-2], parts[-1]
                    digest = ref if ref.startswith("sha256:") else registry.tags.get((ns, repo, ref))
                    if kind == "manifests" and digest is not None and ref.startswith("sha256:"):
                        known = {d for (n, r, _), d in registry.tags.items() if (n, r) == (ns, repo)}
                        digest = digest if digest in known else None
                    if digest is not None and digest in registry.blobs:
                        blob = registry.blobs[digest]
                        if kind == "manifests":
                            ctype = MANIFEST
                if blob is None:
                    self.send_response(404)
                    self.send_header("Content-Type", "application/json")
                    err = b'{"errors":[{"code":"NAME_UNKNOWN","message":"not here"}]}'
                    self.send_header("Content-Length", str(len(err)))
                    self.end_headers()
                    if body:
                        self.wfile.write(err)
                    return
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(blob)))
                self.send_header("Docker-Content-Digest", "sha256:" + hashlib.sha256(blob).hexdigest())
                self.send_header("Docker-Distribution-Api-Version", "registry/2.0")
                self.end_headers()
                if body:
                    self.wfile.write(blob)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="test-registry", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
        if self.thread is not None:
            self.thread.join(10)
            self.thread = None

    def write_hosts(self, folder: Path, registries: set[str] | None = None) -> Path:
        """containerd's hosts configuration (``config_path``): each registry this one serves,
        and ``_default`` for every other, pulls from here and from nowhere else (the server is
        this registry too, so there is no fall-back to the real one)."""
        names = (registries or {host for host, _, _ in self.tags}) | {"_default"}
        for name in names:
            d = folder / name
            d.mkdir(parents=True, exist_ok=True)
            (d / "hosts.toml").write_text(
                f'server = "{self.url}"\n\n[host."{self.url}"]\n  capabilities = ["pull", "resolve"]\n'
            )
        return folder
