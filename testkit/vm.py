"""A real cgroup v2 kernel for the tests: Debian's stock kernel booted under qemu's software
emulation (TCG; this machine's /dev/kvm does not run a stock guest), with the host's / shared
read-only over 9p under a tmpfs overlay, so the checkout, its venv and ~/.cache/nriplugin are
at the same paths in the guest. cgroup2 is mounted at /sys/fs/cgroup with every controller
enabled for the subtree.

The guest boots once and runs many scripts (Python starts 30-50x slower under TCG): the host
drops ``req/N.sh`` into a second, writable 9p share and the guest's init (testkit/vm/init)
answers with ``out/N.out`` and ``out/N.rc``; ``Guest(systemd=True)`` boots systemd as PID 1
first (the systemd cgroup driver's tests), which runs that loop as a unit. :meth:`Guest.close` always ends the guest (a
poweroff, then SIGKILL of qemu by its PID) and removes its files. The kit (kernel, initramfs) is
built and cached by testkit/vm/build-kit.sh.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from testkit import containerd

HERE = Path(__file__).resolve().parent
BUILD_KIT = HERE / "vm" / "build-kit.sh"


SECOND_LINE = "2.1"  # Debian's containerd 2.1.x (NRI v0.8): the guest's containerd tests run on it too


def runtime_lines() -> list[str]:
    """The containerd lines the guest runs, in order: the selected one (NRIPLUGIN_RUNTIME,
    default the newest) for every guest test, then :data:`SECOND_LINE` for the containerd
    tests, in the same boot (booting and Python's start are the guest's dear parts)."""
    return list(dict.fromkeys((containerd.selected(), SECOND_LINE)))


class Unavailable(RuntimeError):
    """No VM on this machine (no qemu, no kernel package, the guest did not boot): the reason."""


@dataclass
class Result:
    rc: int
    output: str

    def check(self) -> str:
        if self.rc != 0:
            raise AssertionError(f"guest command failed (rc {self.rc}):\n{self.output[-4000:]}")
        return self.output


def cache_dir() -> Path:
    return Path(os.environ.get("NRIPLUGIN_CACHE", str(Path.home() / ".cache" / "nriplugin"))) / "vm"


def build_kit() -> Path:
    """The kit's folder (built on first use: ~25 s and ~75 MB of downloads)."""
    if shutil.which("bash") is None:
        raise Unavailable("no bash")
    r = subprocess.run(["bash", str(BUILD_KIT), str(cache_dir())], capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise Unavailable(f"building the VM kit failed: {r.stderr.strip()[-2000:]}")
    return Path(r.stdout.strip().splitlines()[-1])


class Guest:
    """One booted guest. Use as a context manager (or call :meth:`close`)."""

    def __init__(
        self, kit: Path, *, cpus: int = 2, memory_mb: int = 2048, boot_timeout: float = 600.0, systemd: bool = False
    ) -> None:
        self.kit = kit
        self.base = Path(tempfile.mkdtemp(prefix="nriplugin-vm-"))
        self.xchg = self.base / "xchg"
        self.xchg.mkdir()
        self.console = self.base / "console.log"
        self.release = ""
        self._n = 0
        self._proc: subprocess.Popen[bytes] | None = None
        try:
            self._boot(cpus, memory_mb, boot_timeout, systemd)
        except BaseException:
            self.close()
            raise

    def _boot(self, cpus: int, memory_mb: int, timeout: float, systemd: bool) -> None:
        qemu = shutil.which("qemu-system-x86_64")
        if qemu is None:
            raise Unavailable("qemu-system-x86_64 not installed (testkit/vm/build-kit.sh installs it as root)")
        share = "security_model=none,multidevs=remap"
        argv = [
            qemu,
            *("-accel", "tcg,thread=multi", "-cpu", "max", "-M", "q35", "-smp", str(cpus), "-m", str(memory_mb)),
            *("-nographic", "-nic", "none", "-no-reboot", "-serial", f"file:{self.console}", "-monitor", "none"),
            *("-kernel", str(self.kit / "vmlinuz"), "-initrd", str(self.kit / "initrd.img")),
            *("-virtfs", f"local,path=/,mount_tag=hostroot,readonly=on,{share}"),
            *("-virtfs", f"local,path={self.xchg},mount_tag=xchg,{share}"),
            "-append",
            f"console=ttyS0 panic=-1 quiet rdinit=/init cgroup_no_v1=all vm.xchg={self.xchg}"
            f" vm.systemd={int(systemd)} ",
        ]
        self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout
        ready = self.xchg / "ready"
        while not ready.exists():
            if self._proc.poll() is not None:
                err = self._proc.stderr.read().decode(errors="replace") if self._proc.stderr else ""
                raise Unavailable(
                    f"qemu exited ({self._proc.returncode}) before the guest was ready: {err[-1500:]}"
                    f"\nconsole:\n{self.console_tail()}"
                )
            if time.monotonic() > deadline:
                raise Unavailable(f"the guest did not come up in {timeout:.0f} s; console:\n{self.console_tail()}")
            time.sleep(0.1)
        self.release = ready.read_text().strip()

    def console_tail(self, n: int = 3000) -> str:
        try:
            return self.console.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def run(self, script: str, timeout: float = 300.0) -> Result:
        """Run a shell script in the guest (as root, cwd /); its output (stdout and stderr) and
        exit code. A background job must redirect its own output and detach (setsid)."""
        if self._proc is None or self._proc.poll() is not None:
            raise RuntimeError(f"the guest is not running; console:\n{self.console_tail()}")
        n = self._send(script)
        rc_file = self.xchg / "out" / f"{n}.rc"
        deadline = time.monotonic() + timeout
        while not rc_file.exists():
            if self._proc.poll() is not None:
                raise RuntimeError(f"the guest died running script {n}; console:\n{self.console_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"guest script {n} still running after {timeout:.0f} s:\n{script[:500]}")
            time.sleep(0.05)
        out = (self.xchg / "out" / f"{n}.out").read_text(errors="replace")
        return Result(int(rc_file.read_text().strip() or "255"), out)

    def _send(self, script: str) -> str:
        """Drop a script into the guest's queue (renamed into place: never read half-written)."""
        self._n += 1
        n = f"{self._n:06d}"
        tmp = self.xchg / f"{n}.sh.tmp"
        tmp.write_text(script)
        tmp.rename(self.xchg / "req" / f"{n}.sh")
        return n

    def python(self, code: str, timeout: float = 300.0, cwd: str | None = None) -> Result:
        """Run Python code in the guest with this checkout's venv and on its import path."""
        root = HERE.parent
        path = self.xchg / f"py{self._n + 1}.py"
        path.write_text(code)
        return self.run(f"cd {cwd or root} && PYTHONPATH={root} exec {root}/.venv/bin/python {path}", timeout)

    def close(self) -> None:
        """Power off (sysrq), then kill qemu by its PID if it lingers; remove the guest's files."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None and (self.xchg / "ready").exists():
                with contextlib.suppress(OSError):
                    self._send("sync; echo o > /proc/sysrq-trigger\n")
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
            if proc.stderr is not None:
                proc.stderr.close()
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> Guest:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
