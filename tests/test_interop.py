"""Wire compatibility with the official Go runtime library (containerd/nri v0.6.1 adaptation,
the code containerd 1.7 runs), through `nri-runtime-bench` from shared/peers."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.go_peers import require_or_skip

pytestmark = pytest.mark.interop


def test_go_runtime_drives_nriplugin(tmp_path: Path) -> None:
    bench = require_or_skip("nri-runtime-bench")
    sock = tmp_path / "nri.sock"
    runtime = subprocess.Popen(
        [str(bench), "-socket", str(sock), "-n", "300", "-sync-pods", "300", "-wait", "20s"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    plugin = None
    log = open(tmp_path / "plugin.log", "w")  # noqa: SIM115 - a file, not a pipe nobody drains
    try:
        deadline = time.monotonic() + 10
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        plugin = subprocess.Popen(
            [sys.executable, "-m", "nriplugin", "run", "--socket", str(sock), "--metrics-address", "127.0.0.1:0"],
            stderr=log,
        )
        out, err = runtime.communicate(timeout=60)
    finally:
        for p in (runtime, plugin):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        log.close()
    result = json.loads(out.strip().splitlines()[-1])
    # 300 pods at Synchronize: a ~200 KiB message, framed for the Go reader.
    assert result["ready"] is True and result["sync_error"] == "", (result, err, (tmp_path / "plugin.log").read_text())
    assert result["errors"] == 0, (tmp_path / "plugin.log").read_text()[-3000:]
    assert result["be_adjusted"] == 150  # every BE pod got its shares, as the runtime merged them
