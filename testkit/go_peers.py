"""Locate or build the Go peers of testkit/peers: the official NRI stack (containerd/nri's
runtime library ``pkg/adaptation`` and plugin stub ``pkg/stub``) at a chosen NRI version.

A peer is ``testkit/peers/NAME/main.go`` plus ``NAME/VERSION/`` (its go.mod, go.sum and a small
shim for what differs between library versions), built by ``testkit/peers/build.sh`` with the
machine's Go from the Go module proxy (the first build takes a few minutes; later ones are
quick). The binary is cached in ``~/.cache/nriplugin/peers`` (``NRIPLUGIN_CACHE`` overrides)
under a name carrying the hash of those sources, so an edited peer is rebuilt.

Set ``NRIPLUGIN_REQUIRE_PEERS=1`` (CI does) to make a peer that cannot be built a failure
instead of a skip.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PEERS = ROOT / "testkit" / "peers"
CACHE = Path(os.environ.get("NRIPLUGIN_CACHE", Path.home() / ".cache" / "nriplugin")) / "peers"
GO = Path(os.environ.get("GO", "/usr/local/go/bin/go"))

NRI_V06 = "v0.6.1"  # what containerd 1.7.16-1.7.2x vendors
NRI_V012 = "v0.12.5"  # the newest release line (containerd 2.3)
NRI_VERSIONS = (NRI_V06, NRI_V012)
DEFAULT_NRI = NRI_V06


def sources(name: str, nri: str = DEFAULT_NRI) -> list[Path]:
    """The files a peer's binary is built from (what its cache key hashes)."""
    peer = PEERS / name
    if not (peer / "main.go").is_file():
        raise ValueError(f"no Go peer named {name!r} in {PEERS}")
    if not (peer / nri / "go.mod").is_file():
        known = sorted(p.name for p in peer.iterdir() if (p / "go.mod").is_file())
        raise ValueError(f"Go peer {name} has no build for NRI {nri!r} (have: {', '.join(known)})")
    return [peer / "main.go", *sorted((peer / nri).glob("go.*")), *sorted((peer / nri).glob("*.go"))]


def cached_path(name: str, nri: str = DEFAULT_NRI) -> Path:
    h = hashlib.sha256()
    for f in sources(name, nri):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return CACHE / f"{name}-{nri}-{h.hexdigest()[:12]}"


def go_peer(name: str, nri: str = DEFAULT_NRI) -> Path | None:
    """Path of the peer binary built against containerd/nri ``nri``, building it if needed;
    None when there is no Go toolchain to build it with."""
    out = cached_path(name, nri)
    if out.is_file():
        return out
    if not GO.is_file():
        return None
    CACHE.mkdir(parents=True, exist_ok=True)
    cmd = ["bash", str(PEERS / "build.sh"), name, nri, str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env={**os.environ, "GO": str(GO)})
    if r.returncode != 0 or not out.is_file():
        raise RuntimeError(f"building Go peer {name} (NRI {nri}) failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return out


def require_or_skip(name: str, nri: str = DEFAULT_NRI) -> Path:
    """The peer for a test: skipped when it cannot be had, failed instead under CI."""
    import pytest

    path = go_peer(name, nri)
    if path is None:
        reason = f"Go peer {name} (NRI {nri}) unavailable: no Go toolchain at {GO} (set GO)"
        if os.environ.get("NRIPLUGIN_REQUIRE_PEERS") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return path
