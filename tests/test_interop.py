"""Wire compatibility with the official Go runtime library (containerd/nri v0.6.1 adaptation,
the code containerd 1.7 runs), through `nri-runtime-bench` from shared/peers."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from testkit.go_peers import require_or_skip

pytestmark = pytest.mark.interop
AGENT = [sys.executable, "-m", "nriplugin", "run"]
BOUND_4 = ["--max-message-mib", "4", "--log-format", "text"]


@dataclass
class Run:
    runtime: subprocess.Popen[str]
    plugin: subprocess.Popen[bytes]
    log: Path

    def result(self, timeout: float) -> tuple[dict[str, Any], str]:
        """Wait for the Go runtime's run; its JSON result line and its stderr."""
        out, err = self.runtime.communicate(timeout=timeout)
        return json.loads(out.strip().splitlines()[-1]), err


@contextlib.contextmanager
def against(runtime: list[str], sock: Path, *agent_args: str) -> Iterator[Run]:
    """A Go runtime peer listening on ``sock`` and `nriplugin run` connecting to it (its log to
    a file, not a pipe nobody drains); both killed and reaped whatever the test does."""
    rt = subprocess.Popen([*runtime, "-socket", str(sock)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    plugin = None
    log = sock.parent / "plugin.log"
    try:
        with log.open("w") as f:
            deadline = time.monotonic() + 10
            while not sock.exists() and time.monotonic() < deadline:
                time.sleep(0.02)
            plugin = subprocess.Popen([*AGENT, "--socket", str(sock), *agent_args], stderr=f)
            yield Run(rt, plugin, log)
    finally:
        for p in (rt, plugin):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


def test_go_runtime_drives_nriplugin(tmp_path: Path) -> None:
    bench = require_or_skip("nri-runtime-bench")
    peer = [str(bench), "-n", "300", "-sync-pods", "300", "-wait", "20s"]
    with against(peer, tmp_path / "nri.sock", "--metrics-address", "127.0.0.1:0") as run:
        result, err = run.result(timeout=60)
    # 300 pods at Synchronize: a ~200 KiB message, framed for the Go reader.
    assert result["ready"] is True and result["sync_error"] == "", (result, err, run.log.read_text())
    assert result["errors"] == 0, run.log.read_text()[-3000:]
    assert result["be_adjusted"] == 150  # every BE pod got its shares, as the runtime merged them


def test_go_runtime_synchronize_over_4mib_then_hooks(tmp_path: Path) -> None:
    """containerd 1.7 sends Synchronize in one message: with 3000 pods carrying a
    last-applied-configuration it is several MB, over ttrpc's 4 MiB. nriplugin accepts it (its
    bound is 64 MiB), answers within the runtime's deadline, pushes the updates the existing
    containers need (each call within 4 MiB), and then answers CreateContainer without errors."""
    scale = require_or_skip("nri-runtime-scale")
    peer = [str(scale), "-sync-pods", "3000", "-note-bytes", "1000", "-n", "300", "-wait", "30s"]
    with against(peer, tmp_path / "nri.sock", "--metrics-address", "127.0.0.1:0", "--cri-socket", "") as run:
        result, err = run.result(timeout=90)
    text = run.log.read_text()
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
    peer = [str(scale), "-sync-pods", "3000", "-note-bytes", "1000", "-n", "10", "-wait", "4s"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = ("--metrics-address", f"127.0.0.1:{port}", "--cri-socket", "", *BOUND_4)
    with against(peer, tmp_path / "nri.sock", *args) as run:
        result, _ = run.result(timeout=60)
        assert run.plugin.poll() is None  # still running
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    text = run.log.read_text()
    assert result["ready"] is False and "receive bound" in result["sync_error"], result
    assert "nriplugin_nri_refused_messages_total 1.0" in metrics
    assert text.count("refused") == 1 and text.count("registered with the runtime") == 1, text[-3000:]
