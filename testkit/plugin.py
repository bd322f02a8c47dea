"""nriplugin as a real process under the private containerd (pre-registered or on the NRI
socket), always killed and reaped; with the small helpers its tests and the benchmarks poll
it with (metrics, readiness, children)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from testkit import containerd as harness

T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent


def each(items: list[T], fn: Callable[[T], object]) -> None:
    """Call ``fn`` on every item even if some fail (teardown must not leave the rest behind);
    then raise the first failure."""
    errors = []
    for item in items:
        try:
            fn(item)
        except Exception as exc:
            errors.append(exc)
    if errors:
        raise errors[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int, name: str) -> float:
    """One sample (``name`` or ``name{labels}``) from an agent's /metrics; 0 if absent."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            body = r.read().decode()
    except OSError:
        return 0.0
    for line in body.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def until(cond: Callable[[], object], timeout: float, what: str | Callable[[], str], step: float = 0.05) -> float:
    """Wait for ``cond`` (polled every ``step`` s) and return the seconds it took; after
    ``timeout`` fail with ``what`` (a text, or a function that describes the state then)."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 >= timeout:
            raise AssertionError(what() if callable(what) else what)
        time.sleep(step)
    return time.monotonic() - t0


def runtime_args(rt: harness.Containerd) -> list[str]:
    """Where nriplugin finds this runtime's CRI socket and pod cgroups (the systemd driver's
    pods root is systemd's ``kubepods.slice``)."""
    root = "kubepods.slice" if rt.systemd else f"{rt.cgroup_root}/kubepods"
    return ["--cri-socket", rt.address, "--pods-root", root]


def children(pid: int, marker: str = "nriplugin") -> list[int]:
    """Child processes of ``pid`` whose command line has ``marker`` (a runtime's plugins)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for c in (task / "children").read_text().split():
            try:
                cmd = Path(f"/proc/{c}/cmdline").read_bytes().decode(errors="replace")
            except FileNotFoundError:
                continue
            if marker in cmd:
                out.append(int(c))
    return out


def build_script(name: str) -> Path:
    """Run ``image/NAME`` (cached between runs by the script itself) with this interpreter and
    return the path it prints last: the image archive, the bundle."""
    env = {**os.environ, "PYTHON": sys.executable}
    script = ROOT / "image" / name
    r = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"image/{name} failed:\n{r.stderr[-4000:]}")
    return Path(r.stdout.strip().splitlines()[-1])


def terminate(proc: subprocess.Popen[bytes], timeout: float = 10) -> None:
    """SIGTERM our child, SIGKILL it if it has not exited within ``timeout``; reaped either way."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


class PluginProcess:
    def __init__(self, nri_socket: str, *extra: str) -> None:
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="nriplugin-", suffix=".log", delete=False)  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "nriplugin",
                "run",
                "--socket",
                nri_socket,
                "--metrics-address",
                f"127.0.0.1:{self.port}",
                *extra,
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
        except OSError:
            return 0, ""

    def wait_ready(self, timeout: float = 20.0, registrations: int = 1) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nriplugin exited: {self.logs()}")
            code, _ = self.get("/readyz")
            if code == 200 and self.metric("nriplugin_registrations_total") >= registrations:
                return
            time.sleep(0.05)
        raise TimeoutError(f"nriplugin not ready: {self.logs()[-3000:]}")

    def metric(self, name: str) -> float:
        return scrape(self.port, name)

    def metric_sum(self, family: str) -> float:
        """All samples of a metric family, whatever their labels."""
        _, body = self.get("/metrics")
        return sum(
            float(ln.rsplit(" ", 1)[1])
            for ln in body.splitlines()
            if ln.startswith(family + "{") or ln.startswith(family + " ")
        )

    def logs(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def stop(self) -> None:
        terminate(self.proc)
        self.log.close()
        if os.path.exists(self.log.name):
            os.unlink(self.log.name)
