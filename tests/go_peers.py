"""Locate or build the Go peers from ../shared/peers (the official NRI stack, v0.6.1).

Built once into ~/.cache/nriplugin/peers by shared/peers/build.sh (Debian trixie's Go
toolchain and NRI sources; no module proxy). Set NRIPLUGIN_REQUIRE_PEERS=1 (CI does) to make
a missing peer a failure instead of a skip.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("NRIPLUGIN_CACHE", Path.home() / ".cache" / "nriplugin")) / "peers"


def shared_peers() -> Path | None:
    for cand in (ROOT.parent / "shared" / "peers", ROOT.parent.parent / "shared" / "peers"):
        if (cand / "build.sh").is_file():
            return cand
    return None


def go_peer(name: str) -> Path | None:
    """Path of a built peer binary, building it if needed; None if it cannot be had."""
    out = CACHE / name
    if out.is_file():
        return out
    src = shared_peers()
    if src is None:
        return None
    CACHE.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["bash", str(src / "build.sh"), name, str(out)], capture_output=True, text=True, timeout=900)
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
