"""Locate or build the Go peers from ../shared/peers (the official NRI stack, v0.6.1), and
this repository's own (testkit/peers/NAME/main.go, e.g. nri-runtime-scale), with the same
build.sh.

Built once into ~/.cache/nriplugin/peers by shared/peers/build.sh (Debian trixie's Go
toolchain and NRI sources; no module proxy); a repository peer's binary is named after its
source's hash, so an edited peer is rebuilt. Set NRIPLUGIN_REQUIRE_PEERS=1 (CI does) to make
a missing peer a failure instead of a skip.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("NRIPLUGIN_CACHE", Path.home() / ".cache" / "nriplugin")) / "peers"


def shared_peers() -> Path | None:
    for cand in (ROOT.parent / "shared" / "peers", ROOT.parent.parent / "shared" / "peers"):
        if (cand / "build.sh").is_file():
            return cand
    return None


LOCAL = ROOT / "testkit" / "peers"


def go_peer(name: str) -> Path | None:
    """Path of a built peer binary, building it if needed; None if it cannot be had."""
    local = LOCAL / name / "main.go"
    out = CACHE / name
    if local.is_file():
        out = CACHE / f"{name}-{hashlib.sha256(local.read_bytes()).hexdigest()[:12]}"
    if out.is_file():
        return out
    src = shared_peers()
    if src is None:
        return None
    CACHE.mkdir(parents=True, exist_ok=True)
    if local.is_file():
        with tempfile.TemporaryDirectory() as d:  # build.sh builds the peer next to itself
            (Path(d) / name).mkdir()
            shutil.copy(local, Path(d) / name / "main.go")
            os.symlink(src / "build.sh", Path(d) / "build.sh")
            return _build(Path(d) / "build.sh", name, out)
    return _build(src / "build.sh", name, out)


def _build(script: Path, name: str, out: Path) -> Path:
    r = subprocess.run(["bash", str(script), name, str(out)], capture_output=True, text=True, timeout=900)
    if r.returncode != 0 or not out.is_file():
        raise RuntimeError(f"building Go peer {name} failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return out


def require_or_skip(name: str) -> Path:
    import pytest

    path = go_peer(name)
    if path is None:
        if os.environ.get("NRIPLUGIN_REQUIRE_PEERS") == "1":
            pytest.fail(f"Go peer {name} unavailable (no shared/peers next to the checkout)")
        pytest.skip(f"Go peer {name} unavailable (no shared/peers next to the checkout)")
    return path
