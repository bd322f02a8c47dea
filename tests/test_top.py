"""`nriplugin top` and the agent's /debug/qos: the snapshot (qos/view.py) on a fake manager,
a frame rendered to text, the command against a canned server and a closed port, and the
route on a real agent against the runtime peer."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import pty
import select
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from nriplugin.cli import top
from nriplugin.policy.cache import RuleCache
from nriplugin.qos import view
from nriplugin.qos.cpu_burst import Burster
from nriplugin.qos.cpu_suppress import Limiter
from nriplugin.qos.levels import Level
from nriplugin.qos.manager import SUPPRESS, Decision, QoSManager
from nriplugin.qos.sample import ClassUsage, NodeSample
from testkit.runtime_peer import RuntimePeer, make_container, make_pod
from tests.agent_proc import agent, free_port, http_get, stopped


def _conforms(m: QoSManager) -> view.Manager:
    """mypy checks that the real manager is what view.state reads (no call needed)."""
    return m


@dataclass
class Score:
    score: float
    level: Level


@dataclass
class FakeManager:
    last: NodeSample | None = None
    cpu: Score = field(default_factory=lambda: Score(0.0, Level.LOW))
    memory: Score = field(default_factory=lambda: Score(0.0, Level.LOW))
    level: Level = Level.LOW
    ratio: float = 1.0
    limiter: Limiter = field(default_factory=Limiter)
    burster: Burster = field(default_factory=Burster)
    decisions: deque[Decision] = field(default_factory=lambda: deque(maxlen=50))
    rules: RuleCache = field(default_factory=RuleCache)


WHY = "MEDIUM: (16 total - 6.00 LS request - 0 reserved) x 0.8"  # as cpu_suppress.be_target words it


def busy_manager() -> FakeManager:
    sample = NodeSample(
        t=100.0,
        interval=1.0,
        ncpu=16,
        cpu_busy_cores=9.5,
        load1=7.25,
        mem_total=64 << 30,
        mem_available=40 << 30,
        by_class={
            "LS": ClassUsage(
                containers=3,
                cpu_cores=5.0,
                cpu_request_cores=6.0,
                cpu_limit_cores=8.0,
                throttled_ratio=0.1,
                memory_bytes=2 << 30,
            ),
            "BE": ClassUsage(containers=2, cpu_cores=4.1, cpu_request_cores=0.0, memory_bytes=512 << 20),
        },
    )
    m = FakeManager(last=sample, cpu=Score(59.04, Level.MEDIUM), memory=Score(31.0, Level.LOW))
    m.level, m.ratio = Level.MEDIUM, 0.8
    m.limiter.step(99.0, 4.2)
    m.burster.step(99.0, "ls-pod/web", wants=True, ratio=1.5)
    m.decisions.append(Decision(90.0, SUPPRESS, "kubepods/besteffort", "6.00 cores", "level LOW"))
    m.decisions.append(Decision(99.0, SUPPRESS, "kubepods/besteffort", "4.20 cores", WHY))
    return m


def test_state_reads_scores_limits_classes_bursts_and_decisions() -> None:
    s = view.state(busy_manager(), now=101.5)
    assert s["enabled"] is True and s["profile"] == "balanced" and s["sampled"] is True
    assert s["cpu"] == {"score": 59.0, "level": "MEDIUM"}
    assert s["memory"] == {"score": 31.0, "level": "LOW"}
    assert s["level"] == "MEDIUM" and s["suppressRatio"] == 0.8 and s["beLimitCores"] == 4.2
    assert s["node"]["ncpu"] == 16 and s["node"]["busyCores"] == 9.5 and s["node"]["sampleAgeSeconds"] == 1.5
    assert [c["class"] for c in s["classes"]] == ["LSE", "LSR", "LS", "BE"]
    ls, be = s["classes"][2], s["classes"][3]
    assert (ls["usageCores"], ls["requestCores"], ls["limitCores"], ls["throttledRatio"]) == (5.0, 6.0, 8.0, 0.1)
    assert ls["memoryBytes"] == 2 << 30 and ls["containers"] == 3
    assert be["limitCores"] is None and be["usageCores"] == 4.1  # the containers' own quotas: unlimited
    assert s["classes"][0]["containers"] == 0  # a class with no container is a row of zeros, not missing
    assert s["bursting"] == [{"container": "ls-pod/web", "ratio": 1.5}]
    assert [d["value"] for d in s["decisions"]] == ["4.20 cores", "6.00 cores"]  # newest first
    assert s["decisions"][0] == {
        "ageSeconds": 2.5,
        "owner": SUPPRESS,
        "target": "kubepods/besteffort",
        "value": "4.20 cores",
        "why": WHY,
    }
    json.dumps(s, allow_nan=False)


def test_state_before_the_first_round() -> None:
    s = view.state(FakeManager(), now=5.0)
    assert s["sampled"] is False and s["node"] is None and s["classes"] == []
    assert s["beLimitCores"] is None and s["bursting"] == [] and s["decisions"] == []
    assert s["cpu"] == {"score": 0.0, "level": "LOW"}
    json.dumps(s, allow_nan=False)
    assert "no sample yet" in _text(top.render(s))


def test_decisions_are_capped_newest_first_and_ages_never_negative() -> None:
    m = FakeManager()
    for i in range(40):
        m.decisions.append(Decision(float(i), SUPPRESS, "g", f"{i}", "why"))
    s = view.state(m, now=38.0, decisions=5)
    assert [d["value"] for d in s["decisions"]] == ["39", "38", "37", "36", "35"]
    assert s["decisions"][0]["ageSeconds"] == 0.0  # a t after now (another clock's read) is not negative
    assert len(view.state(m, now=50.0)["decisions"]) == view.DECISIONS
    assert view.state(m, now=50.0, decisions=0)["decisions"] == []


def test_non_finite_numbers_are_null() -> None:
    m = FakeManager(cpu=Score(float("nan"), Level.LOW))
    m.limiter.current = float("inf")
    s = view.state(m, now=0.0)
    assert s["cpu"]["score"] is None and s["beLimitCores"] is None
    json.dumps(s, allow_nan=False)
    assert "CPU score" in _text(top.render(s))


def test_route_is_json_and_503_without_a_manager() -> None:
    status, ctype, body = view.response(busy_manager())
    assert status == 200 and ctype == "application/json" and json.loads(body)["cpu"]["level"] == "MEDIUM"
    status, _, body = view.response(None)
    assert status == 503 and "not running" in json.loads(body)["error"]


def _text(renderable: Any) -> str:
    console = Console(record=True, width=120, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def _flat(text: str) -> str:
    """The frame's words in order, box drawing and wrapping gone (a reason may wrap)."""
    return " ".join(text.replace("│", " ").split())


def test_frame_shows_score_level_be_limit_bursts_and_reasons() -> None:
    doc = view.state(busy_manager(), now=101.5)
    text = _text(top.render(doc, "127.0.0.1:9310"))
    assert "CPU score" in text and "59.0" in text and "MEDIUM" in text
    assert "4.20 cores" in text and "ratio 0.8" in text  # BE limit
    assert "9.50 / 16 cores busy" in text
    assert "ls-pod/web" in text and "1.5" in text
    assert WHY in _flat(text) and "2.5s" in text  # a long reason wraps in its column
    be_row = next(line for line in text.splitlines() if line.strip(" │").startswith("BE "))
    assert "4.10" in be_row and "4.20" in be_row  # BE's usage against the QoS group's limit
    assert "agent unreachable" in _text(top.render(doc, "x", error="connection refused"))


def test_live_view_keeps_the_last_frame_when_a_poll_fails_and_ctrl_c_exits_0(monkeypatch: pytest.MonkeyPatch) -> None:
    doc = view.state(busy_manager(), now=101.5)
    polls: list[Any] = [doc, top.Unreachable("http://x/debug/qos: refused")]

    def fetch(address: str, timeout: float = 2.0) -> dict[str, Any]:
        r = polls.pop(0)
        if isinstance(r, Exception):
            raise r
        return dict(r)

    sleeps = iter([None, KeyboardInterrupt()])

    def sleep(_: float) -> None:
        r = next(sleeps)
        if r is not None:
            raise r

    monkeypatch.setattr(top, "fetch", fetch)
    console = Console(record=True, width=120, file=io.StringIO(), force_terminal=True)
    assert top.run("x", interval=0.01, console=console, sleep=sleep) == 0
    out = console.export_text()
    assert "agent unreachable, retrying" in out and WHY in _flat(out)


@contextlib.contextmanager
def canned(status: int, body: bytes) -> Iterator[str]:
    """A real HTTP server on 127.0.0.1, port 0, in a thread, answering every GET the same."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def nriplugin(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nriplugin", *args], capture_output=True, text=True, timeout=30, env=_env()
    )


def _env() -> dict[str, str]:
    return {**os.environ, "COLUMNS": "120", "TERM": "dumb"}


def test_top_once_against_a_canned_agent() -> None:
    body = json.dumps(view.state(busy_manager(), now=101.5)).encode()
    with canned(200, body) as address:
        r = nriplugin("top", "--once", "--agent", address)
    assert r.returncode == 0, r.stderr
    assert "59.0" in r.stdout and "MEDIUM" in r.stdout and "4.20 cores" in r.stdout and WHY in _flat(r.stdout)
    assert "\x1b[" not in r.stdout  # not a terminal: plain text for scripts


def test_top_once_piped_is_not_wrapped_at_80_columns() -> None:
    """Piped with no COLUMNS (as ``nriplugin top --once > file``): no line is wrapped, whatever
    rich's 80-column default for a file; every line of the frame is as wide as the box."""
    m = busy_manager()
    long_why = "HIGH: " + " ".join(f"reason-part-{k}" for k in range(12))  # ~180 characters
    m.decisions.append(Decision(100.0, SUPPRESS, "kubepods/besteffort", "2.00 cores", long_why))
    body = json.dumps(view.state(m, now=101.5)).encode()
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    with canned(200, body) as address:
        r = subprocess.run(
            [sys.executable, "-m", "nriplugin", "top", "--once", "--agent", address],
            capture_output=True,
            text=True,
            timeout=30,
            env={**env, "TERM": "dumb"},
        )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len({len(line) for line in lines}) == 1 and len(lines[0]) > 80  # one box, wider than 80
    assert any(long_why in line for line in lines)  # the long reason on one line
    assert any(WHY in line for line in lines)
    header = next(line for line in lines if " class " in line)
    assert header.split("│")[1].split() == [
        "class",
        "ctrs",
        "usage",
        "request",
        "limit",
        "usage",
        "/",
        "limit",
        "throttled",
        "memory",
    ]


def test_top_in_a_terminal_refreshes_and_ctrl_c_exits_cleanly() -> None:
    """The live view in a real pseudo-terminal: the alternate screen, frames, then SIGINT."""
    body = json.dumps(view.state(busy_manager(), now=101.5)).encode()
    with canned(200, body) as address:
        master, slave = pty.openpty()
        proc = subprocess.Popen(
            [sys.executable, "-m", "nriplugin", "top", "--interval", "0.1", "--agent", address],
            stdin=slave,
            stdout=slave,
            stderr=subprocess.PIPE,
            env={**_env(), "TERM": "xterm-256color"},
        )
        os.close(slave)
        readable = select.poll()  # poll, not select: in the whole suite the descriptor can be above 1023
        readable.register(master, select.POLLIN)
        out = b""
        try:
            deadline = time.monotonic() + 20
            while out.count(b"CPU score") < 2 and time.monotonic() < deadline:  # two frames: it refreshes
                if readable.poll(500):
                    out += os.read(master, 65536)
            proc.send_signal(signal.SIGINT)
            assert proc.wait(10) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
            with contextlib.suppress(OSError):  # EIO once the child has closed the terminal
                while readable.poll(500) and (chunk := os.read(master, 65536)):
                    out += chunk
            os.close(master)
    assert proc.stderr is not None
    assert b"Traceback" not in proc.stderr.read()
    assert out.count(b"CPU score") >= 2
    assert b"\x1b[?1049h" in out and b"\x1b[?1049l" in out  # the alternate screen, left on exit


def test_top_against_a_closed_port_is_one_line_and_exit_2() -> None:
    r = nriplugin("top", "--once", "--agent", f"127.0.0.1:{free_port()}")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("nriplugin top: http://127.0.0.1:")
    assert "refused" in r.stderr and "Traceback" not in r.stderr


def test_top_against_something_else_says_so() -> None:
    with canned(404, b"not found\n") as address:
        r = nriplugin("top", "--once", "--agent", address)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "HTTP 404" in r.stderr and "older agent" in r.stderr
    with canned(200, b"<html>") as address:
        r = nriplugin("top", "--once", "--agent", address)
    assert r.returncode == 2 and "not JSON" in r.stderr


def test_bad_interval_is_refused() -> None:
    r = nriplugin("top", "--interval", "0")
    assert r.returncode == 2 and "--interval" in r.stderr


def test_the_agent_does_not_import_rich() -> None:
    """top's library stays out of the agent's start-up (the runtime's 5 s register budget)."""
    code = (
        "import sys, nriplugin.cli.main, nriplugin.agent.assembly, nriplugin.obs.http, nriplugin.obs.metrics, "
        "nriplugin.node.assembly, nriplugin.qos.manager, nriplugin.qos.collect, nriplugin.qos.view; "
        "assert not [m for m in sys.modules if m == 'rich' or m.startswith('rich.')], 'rich imported'"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr


def test_running_agent_serves_debug_qos_and_top_reads_it(tmp_path: Path) -> None:
    async def main() -> None:
        sock = str(tmp_path / "nri.sock")
        port = free_port()
        peer = RuntimePeer()
        try:
            async with agent("--socket", sock, "--metrics-address", f"127.0.0.1:{port}") as proc:
                await peer.listen(sock)
                s = await peer.next_session(timeout=15)
                pod = make_pod(0, "BE")
                await s.create_container(pod, make_container(0, pod))
                doc: dict[str, Any] = {}
                for _ in range(100):  # the first full round runs once the runtime is ours
                    code, body = await asyncio.to_thread(http_get, f"http://127.0.0.1:{port}/debug/qos")
                    if code == 200:
                        doc = json.loads(body)
                        if doc["sampled"]:
                            break
                    await asyncio.sleep(0.1)
                assert doc.get("sampled"), doc
                assert isinstance(doc["cpu"]["score"], float) and doc["cpu"]["level"] in Level.__members__
                assert doc["enabled"] is True and doc["profile"] == "balanced" and doc["node"]["ncpu"] >= 1
                r = await asyncio.to_thread(nriplugin, "top", "--once", "--agent", f"127.0.0.1:{port}")
                assert r.returncode == 0, r.stderr
                assert "CPU score" in r.stdout and "profile balanced" in r.stdout
                proc.send_signal(signal.SIGTERM)
                assert (await stopped(proc))[0] == 0
        finally:
            await peer.close()

    asyncio.run(main())
