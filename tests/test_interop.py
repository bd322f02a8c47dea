"""Wire compatibility with the official Go runtime library, containerd/nri's adaptation (the
code the runtime runs for NRI), at v0.6.1 (containerd 1.7) and v0.12.5 (containerd 2.3's line),
through the Go peers of testkit/peers (`nri-runtime-bench`, `nri-runtime-scale`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
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

from nriplugin.nri import api_pb2 as api
from nriplugin.nri.stub import Plugin, Stub, StubOptions
from testkit.go_peers import NRI_V012, NRI_V06, NRI_VERSIONS, require_or_skip

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


# What the agent says at Configure: the runtime's NRI as learnt, and how. The Go peers are no
# containerd, so a v0.6 runtime's version cannot be inferred and the baseline is assumed.
LEARNT = {NRI_V06: "NRI v0.6.1 (assumed)", NRI_V012: "NRI v0.12.5 (as it says)"}


@pytest.mark.parametrize("nri", NRI_VERSIONS)
def test_go_runtime_drives_nriplugin(tmp_path: Path, nri: str) -> None:
    bench = require_or_skip("nri-runtime-bench", nri)
    peer = [str(bench), "-n", "300", "-sync-pods", "300", "-wait", "20s"]
    with against(peer, tmp_path / "nri.sock", "--metrics-address", "127.0.0.1:0", "--log-format", "text") as run:
        result, err = run.result(timeout=60)
    text = run.log.read_text()
    # 300 pods at Synchronize: a ~200 KiB message, framed for the Go reader.
    assert result["nri"] == nri and result["ready"] is True and result["sync_error"] == "", (result, err, text)
    assert result["errors"] == 0, text[-3000:]
    assert result["be_adjusted"] == 150  # every BE pod got its shares, as the runtime merged them
    assert LEARNT[nri] in text, text[-3000:]
    # v0.12 calls the dedicated RPC per event; it warns (on stderr) when it falls back to StateChange.
    assert "deprecated StateChange" not in err, err[-3000:]


@pytest.mark.parametrize("nri", NRI_VERSIONS)
def test_go_runtime_synchronize_over_4mib_then_hooks(tmp_path: Path, nri: str) -> None:
    """3000 pods carrying a last-applied-configuration make a Synchronize of several MB, over
    ttrpc's 4 MiB. NRI v0.6.1 (containerd 1.7) sends it in one message: nriplugin accepts it
    (its bound is 64 MiB). v0.12 splits it (its ttrpc refuses to send over 4 MiB): nriplugin
    echoes ``more`` on every part with nothing else, and takes the node in whole at the last.
    Either way it answers within the runtime's deadline, gives the existing containers the
    updates they need (v0.12: pushed after the answer, each call within 4 MiB; v0.6.1, whose
    adaptation can deadlock on a plugin's UpdateContainers: in the answer), and then serves
    CreateContainer, RemoveContainer and RemovePodSandbox (v0.12: their dedicated RPCs)
    without errors."""
    scale = require_or_skip("nri-runtime-scale", nri)
    peer = [str(scale), "-sync-pods", "3000", "-note-bytes", "1000", "-n", "300", "-wait", "30s"]
    args = ("--metrics-address", "127.0.0.1:0", "--cri-socket", "", "--log-format", "text")
    with against(peer, tmp_path / "nri.sock", *args) as run:
        result, err = run.result(timeout=90)
    text = run.log.read_text()
    assert result["nri"] == nri and result["sync_bytes"] > 4 << 20, result  # over ttrpc's convention
    assert result["ready"] is True and result["sync_error"] == "", (result, err, text[-3000:])
    assert result["sync_ms"] < 2000  # the runtime's default request timeout
    assert result["errors"] == 0 and result["be_adjusted"] == 150, text[-3000:]
    assert "exceeds" not in text, text[-3000:]
    split = re.search(r"Synchronize came in (\d+) parts: 3000 pods, 3000 containers taken in whole", text)
    if nri == NRI_V06:
        assert split is None, text[-3000:]
        assert result["sync_updates"] > 0 and result["push_calls"] == 0, result  # in the answer, never pushed
    else:
        assert split is not None and int(split[1]) >= 2, text[-3000:]
        assert result["pushed_updates"] > 0 and result["sync_updates"] == 0, result  # pushed after the answer


def test_go_runtime_message_over_the_bound_is_refused_once(tmp_path: Path) -> None:
    """With --max-message-mib 4 the same Synchronize from NRI v0.6.1 (one message) is over the
    bound: refused (the runtime logs our error), counted, and the agent stays up serving
    reconciler-only instead of re-registering into the same message in a loop. (v0.12 never
    sends over 4 MiB: it splits, as the test above shows.)"""
    scale = require_or_skip("nri-runtime-scale", NRI_V06)
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


class PodEvents(Plugin):
    """The v0.6 hooks a QoS plugin uses plus UpdatePodSandbox (NRI v0.10+): what is subscribed
    must be what the runtime knows, or a v0.6 runtime would refuse the registration."""

    def __init__(self) -> None:
        self.pod_updates = 0

    def create_container(self, pod: api.PodSandbox, container: api.Container) -> api.ContainerAdjustment | None:
        if pod.labels.get("koordinator.sh/qosClass") != "BE":
            return None
        adj = api.ContainerAdjustment()
        adj.linux.resources.cpu.shares.value = 2
        return adj

    def remove_container(self, pod: api.PodSandbox, container: api.Container) -> None: ...

    def update_pod_sandbox(self, pod: api.PodSandbox, resources: api.LinuxResources) -> None:
        self.pod_updates += 1


@pytest.mark.parametrize(("nri", "pod_updates"), [(NRI_V06, 0), (NRI_V012, 5)])
def test_events_subscribed_are_the_ones_the_runtime_knows(tmp_path: Path, nri: str, pod_updates: int) -> None:
    """The stub in this process against the Go runtime library: v0.6.1 accepts the registration
    (UpdatePodSandbox left out of the subscription) and has no pod updates to send; v0.12.5
    accepts it with UpdatePodSandbox in, and the plugin sees every one it sends."""
    bench = require_or_skip("nri-runtime-bench", nri)
    sock = tmp_path / "nri.sock"
    cmd = [str(bench), "-socket", str(sock), "-n", "20", "-sync-pods", "10", "-wait", "10s", "-pod-updates", "5"]
    rt = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    plugin = PodEvents()
    try:
        deadline = time.monotonic() + 10
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        asyncio.run(_serve_until_exit(Stub(plugin, StubOptions(socket_path=str(sock))), rt))
        out, err = rt.communicate(timeout=10)
    finally:
        if rt.poll() is None:
            rt.kill()
            rt.wait()
    result = json.loads(out.strip().splitlines()[-1])
    assert result["ready"] is True and result["errors"] == 0 and result["be_adjusted"] == 10, (result, err)
    assert result.get("pod_updates", 0) == pod_updates and result.get("pod_update_errors", 0) == 0, result
    assert plugin.pod_updates == pod_updates


async def _serve_until_exit(stub: Stub, rt: subprocess.Popen[str]) -> None:
    task = asyncio.ensure_future(stub.run())
    try:
        deadline = time.monotonic() + 30
        while rt.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    finally:
        stub.stop()
        await asyncio.wait_for(task, 5)
