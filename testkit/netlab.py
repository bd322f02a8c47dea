"""An emulated node uplink, and traffic measured through it, for the network QoS tests and bench.

The contention point for network QoS is the node's NIC. ``Uplink`` emulates it as a veth pair
from the host to a "router" network namespace, with on both ends a token bucket at ``rate_mbit``
in front of a deep dumb FIFO (``tbf ... latency 200ms``): like a NIC with a deep buffer, a bulk
flow through it builds a standing queue, so without QoS another pod's ping latency rises. Pod
egress (upload) queues on the host end, pod ingress (download, ``reverse=True``) on the router's
end. The "remote host" (servers, ping target) is a third namespace behind the router on a plain
veth: its traffic is forwarded into the router's queue as a far host's would be (a sender on the
queue's own machine would be held back by TCP small queues and never fill it). Addresses: a /29
claimed from the test-only 198.18.1.0/24 (``testkit.subnets``), one /30 per link; routes to the pods'
198.18.0.0/24. Everything is named ``nrq<pid>u<n>`` (+``f`` for the remote host) and removed by
name.

Traffic runs in a pod's network namespace through ``nsenter --net=<its netns>`` with the host's
iperf3 (JSON output, bounded by ``-t`` and a subprocess timeout) and busybox ping (from the e2e
package root); servers run in the remote namespace, one-off, a port each. Every process is
ours and is ended by its PID.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import itertools
import json
import math
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from testkit import containerd as harness
from testkit import subnets

_seq = itertools.count()
_ports = itertools.count(5201)
TIME_RE = re.compile(r"time=([0-9.]+) ms")
# TCP congestion control of every flow: Linux's default, loss-based cubic, fills a dumb FIFO as
# bulk flows do on most nodes. (BBR keeps its own queue short, which would hide the problem that
# network QoS solves; some machines, this one included, default to it.)
CC = "cubic"


@functools.cache
def busybox() -> Path:
    return harness.install() / "bin" / "busybox"


def iperf3() -> str:
    path = shutil.which("iperf3")
    if path is None:
        raise RuntimeError("iperf3 not found: install it (scripts/setup.sh installs Debian's iperf3)")
    return path


def in_netns(netns: str, *cmd: str) -> list[str]:
    """``cmd`` run in the network namespace bound at ``netns`` (a pod's, or /run/netns/NAME)."""
    return ["nsenter", f"--net={netns}", "--", *cmd]


def stop(proc: subprocess.Popen[bytes]) -> None:
    """End our child by its PID (SIGKILL: it holds nothing worth flushing) and reap it."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def tc(*args: str) -> None:
    """``tc ARGS`` with a clear error."""
    r = subprocess.run(["tc", *args], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise RuntimeError(f"tc {' '.join(args)} failed: {r.stderr.strip()}")


@dataclass
class Uplink:
    """The emulated node NIC and the remote host behind it; a context manager."""

    rate_mbit: float = 100.0
    burst: str = "32k"
    latency_ms: int = 200
    name: str = field(default_factory=lambda: f"nrq{os.getpid()}u{next(_seq)}")
    net: ipaddress.IPv4Network | None = None

    @property
    def router(self) -> str:
        """The router's namespace name (the uplink's far end); the host's veth has this name too."""
        return self.name

    @property
    def remote(self) -> str:
        """The remote host's namespace name."""
        return self.name + "f"

    @property
    def netns(self) -> str:
        """The remote host's network namespace, for ``in_netns``."""
        return f"/run/netns/{self.remote}"

    def _addr(self, i: int) -> str:
        assert self.net is not None
        return str(self.net[i])

    @property
    def host_addr(self) -> str:
        return self._addr(1)

    @property
    def remote_addr(self) -> str:
        return self._addr(6)

    def up(self) -> Uplink:
        self.net = subnets.claim(self.name, subnets.UPLINKS, 29)
        try:
            ip = harness.ip
            link, far = list(self.net.subnets(new_prefix=30))
            r, f = self.router, self.remote
            for ns in (r, f):
                ip("netns", "add", ns)
                ip("-n", ns, "link", "set", "lo", "up")
            ip("link", "add", r, "type", "veth", "peer", "name", "up0", "netns", r)
            ip("-n", r, "link", "add", "far0", "type", "veth", "peer", "name", "eth0", "netns", f)
            for ns, dev, addr in (("", r, link[1]), (r, "up0", link[2]), (r, "far0", far[1]), (f, "eth0", far[2])):
                at = ["-n", ns] if ns else []  # "": the host
                ip(*at, "addr", "add", f"{addr}/30", "dev", dev)
                ip(*at, "link", "set", dev, "up")
            ip("route", "add", str(far), "via", str(link[2]))
            ip("-n", r, "route", "add", str(subnets.PODS), "via", str(link[1]))
            ip("-n", f, "route", "add", "default", "via", str(far[1]))
            ip("netns", "exec", r, "sysctl", "-qw", "net.ipv4.ip_forward=1")  # the router's own
            shape = ["root", "tbf", "rate", f"{self.rate_mbit}mbit", "burst", self.burst]
            shape += ["latency", f"{self.latency_ms}ms"]
            tc("qdisc", "replace", "dev", r, *shape)
            tc("-n", r, "qdisc", "replace", "dev", "up0", *shape)
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        """Delete the namespaces (their veths go with them, and so the host's end and its
        route), then anything left by name; release the claim. Safe to call more than once."""
        if self.net is None:
            return
        for ns in (self.remote, self.router):
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)
        subprocess.run(["ip", "link", "del", self.router], check=False, capture_output=True)
        subnets.release(self.name)
        self.net = None

    def __enter__(self) -> Uplink:
        return self.up()

    def __exit__(self, *_: object) -> None:
        self.down()

    def run(self, *cmd: str, timeout: float = 30) -> str:
        """``cmd`` on the remote host; its stdout."""
        r = subprocess.run(in_netns(self.netns, *cmd), capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} in {self.remote} failed: {r.stderr.strip()}")
        return r.stdout

    @contextlib.contextmanager
    def server(self) -> Iterator[int]:
        """A one-off iperf3 server in the remote namespace; yields its port once it listens."""
        port = next(_ports)
        proc = subprocess.Popen(
            in_netns(self.netns, iperf3(), "-s", "-1", "-p", str(port)),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 10
            while not self.listening(port):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"iperf3 server on port {port} did not start (exit {proc.poll()})")
                time.sleep(0.02)
            yield port
        finally:
            stop(proc)

    def listening(self, port: int) -> bool:
        """A TCP socket in LISTEN on ``port`` in the remote namespace (its /proc/net/tcp*)."""
        for table in ("tcp", "tcp6"):
            for line in self.run("cat", f"/proc/net/{table}").splitlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                    return True
        return False


@dataclass(frozen=True)
class Throughput:
    mbit: float  # received goodput
    retransmits: int


def iperf(
    uplink: Uplink, netns: str, seconds: float = 5, reverse: bool = False, cc: str = CC, omit: int = 0
) -> Throughput:
    """A TCP transfer between a pod (its netns) and the remote for ``seconds``: upload (pod
    egress), or download (pod ingress) with ``reverse``. The first ``omit`` seconds (TCP's ramp
    up through the shaper) are sent but left out of the figure."""
    with uplink.server() as port:
        cmd = [iperf3(), "-c", uplink.remote_addr, "-p", str(port), "-t", str(seconds), "-C", cc, "-J"]
        if omit:
            cmd += ["-O", str(omit)]
        if reverse:
            cmd.append("-R")
        r = subprocess.run(in_netns(netns, *cmd), capture_output=True, text=True, timeout=seconds + omit + 20)
    try:
        out = json.loads(r.stdout)
    except ValueError:
        raise RuntimeError(f"iperf3 gave no JSON (exit {r.returncode}): {r.stderr.strip()[-500:]}") from None
    if "error" in out:
        raise RuntimeError(f"iperf3 failed: {out['error']}")
    end = out["end"]
    return Throughput(end["sum_received"]["bits_per_second"] / 1e6, int(end["sum_sent"].get("retransmits", 0)))


@contextlib.contextmanager
def bulk(
    uplink: Uplink, netns: str, reverse: bool = False, warmup: float = 2.0, limit: float = 300, cc: str = CC
) -> Iterator[None]:
    """A background bulk TCP flow between a pod and the remote (upload, or download with
    ``reverse``), given ``warmup`` seconds to fill the uplink's queue; ended by PID on exit
    (and by iperf3 itself after ``limit`` seconds at most)."""
    with uplink.server() as port:
        cmd = [iperf3(), "-c", uplink.remote_addr, "-p", str(port), "-t", str(limit), "-C", cc]
        if reverse:
            cmd.append("-R")
        proc = subprocess.Popen(in_netns(netns, *cmd), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            time.sleep(warmup)
            if proc.poll() is not None:
                err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                raise RuntimeError(f"bulk iperf3 exited with {proc.returncode}: {err.strip()[-500:]}")
            yield
        finally:
            stop(proc)
            if proc.stderr:
                proc.stderr.close()


@dataclass(frozen=True)
class Latency:
    p50_ms: float
    p99_ms: float
    sent: int
    received: int


def percentile(samples: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of a non-empty sample."""
    s = sorted(samples)
    return s[max(0, min(len(s), math.ceil(q / 100 * len(s))) - 1)]


def parse_ping(out: str, sent: int) -> Latency:
    """Busybox/iputils ping output: one ``time=X ms`` per reply."""
    times = [float(m) for m in TIME_RE.findall(out)]
    if not times:
        raise RuntimeError(f"no ping replies in:\n{out[-500:]}")
    return Latency(percentile(times, 50), percentile(times, 99), sent, len(times))


def ping(netns: str, dst: str, count: int = 100, interval: float = 0.05) -> Latency:
    """``count`` pings from a pod to ``dst``, ``interval`` seconds apart."""
    cmd = [str(busybox()), "ping", "-c", str(count), "-i", str(interval), "-W", "2", dst]
    r = subprocess.run(in_netns(netns, *cmd), capture_output=True, text=True, timeout=count * interval + 15)
    return parse_ping(r.stdout, count)
