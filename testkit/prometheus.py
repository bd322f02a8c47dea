"""Debian's Prometheus for the tests (scripts/prometheus.sh unpacks it into the cache once):
``promtool`` for the rules' checks and unit tests, ``prometheus`` for the end-to-end test."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@functools.cache
def bin_dir() -> Path:
    r = subprocess.run(["bash", str(ROOT / "scripts" / "prometheus.sh")], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"scripts/prometheus.sh failed: {r.stderr[-2000:]}")
    return Path(r.stdout.strip().splitlines()[-1])


def promtool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(bin_dir() / "promtool"), *args], capture_output=True, text=True, cwd=cwd, timeout=120)
