"""The main job (``e2e/demo.py``, what ``scripts/main.sh`` runs) stopped as a terminal stops it:
Ctrl-C is SIGINT to the foreground process group, the demo's. Once the demo runs, and in the
middle of its QoS act, that ends it with status 0 (every time: the agent runs in a session of
its own and is stopped by the demo, not raced by the terminal's signal), and leaves nothing
behind: no process (the demo's session, the agent and containerd by their pids, anything
naming the demo's folder), no cgroup, no mount, no folder or socket, the metrics port closed.
A second Ctrl-C during the teardown changes none of that.

A test that fails still leaves nothing: what the demo left is removed by pid, by its cgroups
and mounts, and its folder."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from testkit import containerd as harness
from tests.agent_proc import free_port

ROOT = Path(__file__).resolve().parent.parent
RUNNING = "Ctrl-C to tear everything down."
IN_THE_ACT = "LS busy: one thread spinning"


@dataclass
class Demo:
    """``python -m e2e.demo`` as a shell runs a foreground job: the leader of its own process
    group (here in a session of its own, so the signal goes to it and nothing else)."""

    proc: subprocess.Popen[str]
    port: int
    lines: list[str] = field(default_factory=list)
    reader: threading.Thread | None = None

    @classmethod
    def start(cls, *args: str) -> Demo:
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "e2e.demo", "--metrics-port", str(port), *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        demo = cls(proc, port)
        demo.reader = threading.Thread(target=demo.read, daemon=True)
        demo.reader.start()
        return demo

    def read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"the demo exited ({self.proc.returncode}) before {text!r}:\n{self.output[-4000:]}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"no {text!r} within {timeout:.0f} s:\n{self.output[-4000:]}")
            time.sleep(0.05)

    def ctrl_c(self) -> None:
        """What a terminal does on Ctrl-C: SIGINT to every process of the foreground group."""
        os.killpg(self.proc.pid, signal.SIGINT)

    def said(self, pattern: str) -> str:
        m = next((m for line in self.lines if (m := re.search(pattern, line))), None)
        assert m is not None, f"no line matching {pattern!r}:\n{self.output[-4000:]}"
        return m.group(1)

    @property
    def base(self) -> Path:
        return Path(self.said(r"^containerd \S+ up \(pid \d+\): (\S+) "))

    @property
    def cgroup_prefix(self) -> str:
        return f"nriplugin-e2e-{self.proc.pid}-"  # the harness names the runtime's cgroups by the demo's pid


def processes() -> Iterator[tuple[int, int, int, str]]:
    """(pid, process group, session, command line) of every process now."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmdline = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after the command's name, which may hold spaces
        if fields[0] != "Z":  # a zombie runs nothing; its parent reaps it
            yield int(d.name), int(fields[2]), int(fields[3]), cmdline


def our_cgroups(prefix: str) -> list[Path]:
    return [d for h in harness.CGROUP_FS.iterdir() if h.is_dir() for d in h.glob(prefix + "*") if d.is_dir()]


def left_behind(demo: Demo, base: Path, pids: list[int]) -> list[str]:
    """Everything of the demo's that still exists, in words; empty when nothing does."""
    left = [
        f"process {pid} ({cmd.strip()[:120]})"
        for pid, pgid, sid, cmd in processes()
        if demo.proc.pid in (pgid, sid) or str(base) in cmd or pid in pids
    ]
    left += [f"cgroup {d}" for d in our_cgroups(demo.cgroup_prefix)]
    with open("/proc/self/mountinfo") as f:
        left += [f"mount {line.split()[4]}" for line in f if line.split()[4].startswith(str(base))]
    if base.exists():
        left.append(f"folder {base}: {sorted(p.name for p in base.iterdir())}")
    with socket.socket() as s, contextlib.suppress(OSError):
        s.settimeout(1)
        s.connect(("127.0.0.1", demo.port))
        left.append(f"something still listens on the metrics port {demo.port}")
    return left


def clean_up(demo: Demo) -> None:
    """After a failed test: stop the demo, then remove what it left (by pid, cgroup, mount)."""
    if demo.proc.poll() is None:
        os.killpg(demo.proc.pid, signal.SIGTERM)
        try:
            demo.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(demo.proc.pid, signal.SIGKILL)
            demo.proc.wait()
    try:
        base: Path | None = demo.base
    except AssertionError:
        base = None
    for _ in range(100):
        pids = [
            pid for pid, _, sid, cmd in processes() if sid == demo.proc.pid or (base is not None and str(base) in cmd)
        ]
        for d in our_cgroups(demo.cgroup_prefix):
            for procs in d.rglob("cgroup.procs"):
                with contextlib.suppress(OSError, ValueError):
                    pids += [int(p) for p in procs.read_text().split()]
        if not pids:
            break
        for pid in set(pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    if base is not None:
        harness.unmount_under(base)
        subprocess.run(["rm", "-rf", "--one-file-system", str(base)], check=False)
    for top in {d.name for d in our_cgroups(demo.cgroup_prefix)}:
        harness.remove_cgroups(top)


@contextlib.contextmanager
def demo_running(*args: str) -> Iterator[Demo]:
    demo = Demo.start(*args)
    try:
        yield demo
    finally:
        clean_up(demo)  # nothing to do when the test passed
        if demo.reader is not None:
            demo.reader.join(10)


def stopped(demo: Demo, *, twice: bool = False) -> int:
    """Ctrl-C (and with ``twice`` another one once the teardown has begun); the exit status."""
    demo.ctrl_c()
    if twice:
        demo.wait_for("tearing down (SIGINT)", 30)
        demo.ctrl_c()
    return demo.proc.wait(90)


@pytest.mark.parametrize("twice", [False, True], ids=["ctrl-c", "ctrl-c-twice"])
def test_ctrl_c_once_running_exits_0_and_leaves_nothing(pkg_root: Path, twice: bool) -> None:
    with demo_running("--no-qos") as demo:
        demo.wait_for(RUNNING, 180)
        base = demo.base
        pids = [int(demo.said(r"^containerd \S+ up \(pid (\d+)\)")), int(demo.said(r"^nriplugin \(pid (\d+)\)"))]
        assert base.is_dir() and (base / "nri" / "nri.sock").exists() and our_cgroups(demo.cgroup_prefix)
        code = stopped(demo, twice=twice)
        out = demo.output
        assert code == 0, out[-4000:]
        assert "tearing down (SIGINT)" in out and "Traceback" not in out, out[-4000:]
        assert re.search(r"^done in \d+\.\d s\.$", out, re.M), out[-4000:]
        assert left_behind(demo, base, pids) == []


def test_ctrl_c_in_the_qos_act_exits_0_and_leaves_nothing(pkg_root: Path) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("the QoS act needs at least 2 CPUs (the demo skips it on fewer)")
    with demo_running() as demo:
        demo.wait_for(IN_THE_ACT, 240)
        base = demo.base
        pids = [int(demo.said(r"^containerd \S+ up \(pid (\d+)\)")), int(demo.said(r"^nriplugin \(pid (\d+)\)"))]
        code = stopped(demo)
        out = demo.output
        assert code == 0, out[-4000:]
        assert "QoS act stopped" in out and "Traceback" not in out, out[-4000:]
        assert left_behind(demo, base, pids) == []
