"""Start-up checks, run before the agent registers, so the runtime never sees a plugin that is
about to die. Each problem is one :class:`StartupError` line naming the option, what is wrong
and what to do. The checks are cheap (a few syscalls): in pre-registered mode they run on
the runtime's 5 s registration clock.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
from pathlib import Path


class StartupError(Exception):
    """The agent cannot run as configured (exit status 2)."""

    def __init__(self, option: str, value: object, problem: str, fix: str) -> None:
        super().__init__(f"{option} {value}: {problem}; {fix}")
        self.option = option
        self.problem = problem


def check_socket(path: str) -> None:
    """The socket itself may be absent (the runtime is not up yet: the agent keeps retrying),
    but its directory must exist (it also holds the agent lock) and the path, if present,
    must be a socket."""
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise StartupError(
            "--socket",
            path,
            f"directory {parent} does not exist",
            'pass the runtime\'s NRI socket (containerd: [plugins."io.containerd.nri.v1.nri"] socket_path)',
        )
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StartupError("--socket", path, f"cannot stat: {exc.strerror}", "check the path") from exc
    if not stat.S_ISSOCK(st.st_mode):
        raise StartupError(
            "--socket", path, "exists but is not a socket", "pass the runtime's NRI socket, not another file"
        )


def check_cgroup_root(path: str) -> None:
    """A cgroup v2 mount has cgroup.controllers at its root; a v1 root holds one hierarchy
    per controller, each with cgroup.procs."""
    root = Path(path)
    fix = "pass the cgroup mount point (normally /sys/fs/cgroup; in a container, mount the host's)"
    if not root.is_dir():
        raise StartupError("--cgroup-root", path, "does not exist or is not a directory", fix)
    if (root / "cgroup.controllers").is_file():
        return
    try:
        if any((d / "cgroup.procs").is_file() for d in root.iterdir() if d.is_dir()):
            return
    except OSError as exc:
        raise StartupError("--cgroup-root", path, f"cannot list: {exc.strerror}", fix) from exc
    raise StartupError("--cgroup-root", path, "is not a cgroup mount (no cgroup.controllers, no hierarchies)", fix)


def check_policy_readable(path: str) -> None:
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError as exc:
        fix = "fix the path or the mount, or leave --policy out for the embedded default"
        raise StartupError("--policy", path, f"cannot read: {exc.strerror}", fix) from exc


def bind_metrics(host: str, port: int) -> socket.socket | None:
    """Bind and listen now (the HTTP server adopts the socket), so "address in use" is known
    before registering and nothing can take the port in between. Port 0 = no endpoint."""
    if not port:
        return None
    value = f"{host}:{port}"
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    except socket.gaierror as exc:
        problem = f"cannot resolve {host}: {exc.strerror}"
        raise StartupError("--metrics-address", value, problem, "use an IP address") from exc
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            problem = "address already in use (another agent, or another program, listens there)"
        elif exc.errno == errno.EADDRNOTAVAIL:
            problem = "not an address of this host"
        else:
            problem = f"cannot listen: {exc.strerror}"
        raise StartupError(
            "--metrics-address", value, problem, "pick a free HOST:PORT, or port 0 to turn the endpoint off"
        ) from exc
    return sock
