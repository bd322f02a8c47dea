"""Koordinator's koordlet (v1.8.0) run as a host process on a :class:`~testkit.hostnode.HostNode`:
a benchmark peer, built by ``testkit/peers/koordlet.sh`` (cached), never part of the product.

How it is run, and why:

- ``agent_mode=hostMode`` with ``NODE_NAME`` and ``KUBECONFIG`` (outside a pod); every path it
  owns (TSDB, checkpoints, audit log, hook-server config, its sockets) is in its own folder.
- Its pods come from the kubelet (``/pods`` over HTTPS with the kubeconfig's token; the
  kubelet's serving certificate is self-signed, which koordlet does not verify), its NodeSLO
  and NodeMetric from the API server.
- Its NRI socket flag is joined onto ``-var-run-root-dir``: the runtime socket's folder is that
  root and the socket's name the flag. It connects to NRI only once its pod informer has
  synced, which needs at least one pod on the node.
- koordlet finds pods at ``<cgroup-root-dir>/<controller>/kubepods/`` with no flag for a
  kubelet ``cgroupRoot``: its cgroup root is a folder of ours whose entries link each
  hierarchy's copy of the node's top-level group (``cpu -> /sys/fs/cgroup/cpu/<root>``), so
  it sees the kubelet's tree as a node whose ``cgroupRoot`` is ``/`` would show it. Paths it
  builds from a runtime's absolute cgroup parent (NRI's ``CgroupParent``) do not resolve
  through that folder.

Stopped by its PID (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from testkit import containerd as harness
from testkit.hostnode import HostNode, until
from testkit.plugin import free_port

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "testkit" / "peers" / "koordlet.sh"
PLUGIN = "koordlet_nri"  # -runtime-hooks-nri-plugin-name's default; its index is 00
# What a containerd with NRI logs when a plugin has registered (2.x: "plugin ... connected
# and synchronized"; 1.7: "plugin ... registered as ...").
REGISTERED = re.compile(
    r"(?:connected and synchronized|registered as).*"
    + PLUGIN
    + r"|"
    + PLUGIN
    + r".*(?:connected and synchronized|registered as)"
)


def build(timeout: float = 1800) -> Path:
    """The koordlet binary, built if not cached (minutes the first time)."""
    r = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"testkit/peers/koordlet.sh failed:\n{r.stderr[-3000:]}")
    return Path(r.stdout.split()[-1])


def cached() -> Path | None:
    """The cached binary for the checked-in wrapper module, or None (no build attempted)."""
    r = subprocess.run(["bash", str(BUILD), "--cached"], capture_output=True, text=True, timeout=60)
    return Path(r.stdout.split()[-1]) if r.returncode == 0 and r.stdout.split() else None


@dataclass
class Koordlet:
    """One koordlet process on ``node``, serving the NRI socket ``nri_socket`` (default: the
    node's runtime's)."""

    binary: Path
    node: HostNode
    nri_socket: str = ""
    feature_gates: str = "BECPUSuppress=true"
    verbosity: int = 2
    extra_args: tuple[str, ...] = ()  # e.g. ("-enable-pprof",) to profile it
    proc: subprocess.Popen[bytes] | None = None
    ports: dict[str, int] = field(default_factory=dict)
    started: float = 0.0
    log_from: int = 0  # the runtime log's size at start: a registration before it was another koordlet's

    @property
    def base(self) -> Path:
        return self.node.base / "koordlet"

    @property
    def log(self) -> Path:
        return self.base / "koordlet.log"

    def _cgroup_view(self) -> Path:
        """koordlet's cgroup root: each hierarchy's entry linked to the node's group in it."""
        view = self.base / "cgroup"
        view.mkdir(parents=True, exist_ok=True)
        for h in harness.CGROUP_FS.iterdir():
            target = h / self.node.cgroup_root
            link = view / h.name
            if target.is_dir() and not link.is_symlink():
                link.symlink_to(target)
        return view

    def start(self) -> None:
        assert self.node.runtime is not None
        sock = Path(self.nri_socket or self.node.runtime.nri_socket)
        for d in ("tsdb", "checkpoint", "audit", "hookserver.d", "run", "xpu"):
            (self.base / d).mkdir(parents=True, exist_ok=True)
        self.ports = {"metrics": free_port(), "pprof": free_port()}
        hooks = self.base / "run" / "koordlet.sock"
        argv = [
            str(self.binary),
            f"-cgroup-root-dir={self._cgroup_view()}/",
            "-proc-root-dir=/proc/",
            "-sys-root-dir=/sys/",
            "-sys-fs-root-dir=/sys/fs/",
            f"-var-run-root-dir={sock.parent}/",
            f"-run-root-dir={self.base / 'run'}/",
            f"-var-lib-kubelet-dir={self.node.kubelet_dir}/",
            f"-containerd-endpoint={self.node.runtime.address}",
            "-runtime-hooks-network=unix",
            f"-runtime-hooks-addr={hooks}",
            f"-runtime-hooks-host-endpoint={hooks}",
            f"-runtime-hooks-config-path={self.base / 'hookserver.d'}",
            f"-runtime-hooks-nri-socket-path={sock.name}",
            f"-tsdb-path={self.base / 'tsdb'}",
            f"-prediction-checkpoint-filepath={self.base / 'checkpoint'}",
            f"-audit-log-dir={self.base / 'audit'}",
            f"-pod-resources-proxy-path={self.base / 'run' / 'pod-resources'}",
            f"-xpu-device-infos-dir={self.base / 'xpu'}/",
            f"-addr=127.0.0.1:{self.ports['metrics']}",
            f"-pprof-addr=127.0.0.1:{self.ports['pprof']}",
            "-logtostderr=true",
            f"-v={self.verbosity}",
        ]
        if self.feature_gates:  # over its defaults; empty: its defaults alone
            argv.append(f"-feature-gates={self.feature_gates}")
        argv += self.extra_args
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", "/root"),
            "NODE_NAME": self.node.name,
            "agent_mode": "hostMode",
            "KUBECONFIG": str(self.node.kubeconfig),
        }
        log = open(self.log, "ab")  # noqa: SIM115 - lives as long as the process
        self.log_from = self._runtime_log().stat().st_size if self._runtime_log().exists() else 0
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=self.base,
            start_new_session=True,
        )
        log.close()

    def registered(self) -> bool:
        """Whether the runtime says this koordlet's NRI plugin is connected (its log since the
        start, read now)."""
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"koordlet exited with {self.proc.returncode}; its log ends:\n{self.tail()}")
        with self._runtime_log().open("rb") as f:
            f.seek(self.log_from)
            return bool(REGISTERED.search(f.read().decode(errors="replace")))

    def _runtime_log(self) -> Path:
        assert self.node.runtime is not None
        return self.node.runtime.base / "logs" / "containerd.log"

    def wait_registered(self, timeout: float = 120.0) -> float:
        """Seconds from start until the runtime had koordlet's plugin registered."""
        until(self.registered, timeout, "koordlet registered with NRI (the runtime's log)", 0.25)
        return time.monotonic() - self.started

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, timeout: float = 15.0) -> None:
        """Stop it by its PID; its folder stays with the node's (removed by the node's stop)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
