"""Wire compatibility with the official Go runtime library (containerd/nri v0.6.1 adaptation,
the code containerd 1.7 runs), through `nri-runtime-bench` from shared/peers."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.go_peers import require_or_skip

pytestmark = pytest.mark.interop
AGENT = [sys.executable, "-m", "nriplugin", "run"]
BOUND_4 = ["--max-message-mib", "4", "--log-format", "text"]


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


def test_go_runtime_synchronize_over_4mib_then_hooks(tmp_path: Path) -> None:
    """containerd 1.7 sends Synchronize in one message: with 3000 pods carrying a
    last-applied-configuration it is several MB, over ttrpc's 4 MiB. nriplugin accepts it (its
    bound is 64 MiB), answers within the runtime's deadline, pushes the updates the existing
    containers need (each call within 4 MiB), and then answers CreateContainer without errors."""
    scale = require_or_skip("nri-runtime-scale")
    sock = tmp_path / "nri.sock"
    runtime = subprocess.Popen(
        [str(scale), "-socket", str(sock), "-sync-pods", "3000", "-note-bytes", "1000", "-n", "300", "-wait", "30s"],
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
            [*AGENT, "--socket", str(sock), "--metrics-address", "127.0.0.1:0", "--cri-socket", ""],
            stderr=log,
        )
        out, err = runtime.communicate(timeout=90)
    finally:
        for p in (runtime, plugin):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        log.close()
    result = json.loads(out.strip().splitlines()[-1])
    text = (tmp_path / "plugin.log").read_text()
    assert result["sync_bytes"] > 4 << 20, result  # one message over ttrpc's convention
    assert result["ready"] is True and result["sync_error"] == "", (result, err, text[-3000:])
    assert result["sync_ms"] < 2000  # the runtime's default request timeout
    assert result["errors"] == 0 and result["be_adjusted"] == 150, text[-3000:]
    assert result["pushed_updates"] > 0 and "exceeds" not in text  # pushed after the answer


def test_go_runtime_message_over_the_bound_is_refused_once(tmp_path: Path) -> None:
    """With --max-message-mib 4 the same Synchronize is over the bound: refused (the runtime
    logs our error), counted, and the agent stays up serving reconciler-only instead of
    re-registering into the same message in a loop."""
    scale = require_or_skip("nri-runtime-scale")
    sock = tmp_path / "nri.sock"
    runtime = subprocess.Popen(
        [str(scale), "-socket", str(sock), "-sync-pods", "3000", "-note-bytes", "1000", "-n", "10", "-wait", "4s"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    plugin = None
    log = open(tmp_path / "plugin.log", "w")  # noqa: SIM115 - a file, not a pipe nobody drains
    try:
        deadline = time.monotonic() + 10
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        plugin = subprocess.Popen(
            [*AGENT, "--socket", str(sock), "--metrics-address", f"127.0.0.1:{port}", "--cri-socket", "", *BOUND_4],
            stderr=log,
        )
        out, _ = runtime.communicate(timeout=60)
        assert plugin.poll() is None  # still running
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        for p in (runtime, plugin):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        log.close()
    result = json.loads(out.strip().splitlines()[-1])
    text = (tmp_path / "plugin.log").read_text()
    assert result["ready"] is False and "receive bound" in result["sync_error"], result
    assert "nriplugin_nri_refused_messages_total 1.0" in metrics
    assert text.count("refused") == 1 and text.count("registered with the runtime") == 1, text[-3000:]
