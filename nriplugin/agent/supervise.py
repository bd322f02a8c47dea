"""``nriplugin supervise RUN-ARGS``: what the pre-registered launcher runs.

containerd 1.7 starts a pre-registered plugin once and never again: if the agent crashed, new
containers would get the runtime's defaults until containerd restarts. The supervisor starts
the agent with the inherited connection (fd ``NRI_PLUGIN_SOCKET``) and closes its own copy, so
a dead agent's connection really closes and the runtime drops it at once. Then, by how the
agent ended:

- exit 0 (the runtime closed the connection: it is going away and will start a fresh
  launcher; or SIGTERM): the supervisor exits too, so supervisors never pile up;
- exit 2 (a start-up error, said in one line): restarting cannot help; it exits 2;
- anything else (a signal, an unexpected exit 1): a crash. It restarts the agent on the
  runtime's socket (``--socket``) with ``--if-held exit`` (if another agent took the runtime
  meanwhile, there is nothing to do), after a short backoff when crashes repeat, and tells
  the new agent when the old one died so it can log and count the time without an agent.

containerd 2.x (NRI >= v0.7) SIGKILLs a plugin process it launched once that plugin's
connection has closed, i.e. this supervisor, right after its agent crashed. So the launched
supervisor does not restart the agent itself: it hands supervision to a successor
(``nriplugin supervise`` as its child, marked by ``NRIPLUGIN_SUPERVISE_SUCCESSOR``) and waits
for it. The runtime's kill then ends only the waiter; the successor and its agent go on,
and the successor restarts the agent again if it crashes again. containerd 1.7 leaves the
waiter alone, and it ends when the successor does.

Deliberately small and free of the agent's imports: it must start fast (the runtime's 5 s
registration clock runs while it does) and must not crash itself.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from types import FrameType

log = logging.getLogger("nriplugin.agent.supervise")

ENV_SOCKET, ENV_NAME, ENV_IDX = "NRI_PLUGIN_SOCKET", "NRI_PLUGIN_NAME", "NRI_PLUGIN_IDX"
ENV_GAP_SINCE, ENV_GAP_CAUSE = "NRIPLUGIN_GAP_SINCE", "NRIPLUGIN_GAP_CAUSE"  # read by cli.run
ENV_SUCCESSOR = "NRIPLUGIN_SUPERVISE_SUCCESSOR"  # set for a supervisor the runtime did not launch
BACKOFF_FIRST, BACKOFF_MAX = 0.5, 10.0
STABLE_AFTER = 30.0  # an agent that ran this long crashed "once": restart it at once


def agent_command(python: str = sys.executable) -> list[str]:
    """How to start ``nriplugin``: the bundled executable itself (PyInstaller sets
    ``sys.frozen``; its ``sys.executable`` is the bundle), else ``python -m nriplugin``."""
    if getattr(sys, "frozen", False):
        return [sys.executable]
    return [python, "-m", "nriplugin"]


def how_it_ended(rc: int) -> str:
    if rc < 0:
        try:
            return f"was killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"was killed by signal {-rc}"
    return f"exited with status {rc}"


class Supervisor:
    def __init__(self, args: list[str], python: str = sys.executable) -> None:
        self.args = args
        self.python = python
        self.child: subprocess.Popen[bytes] | None = None
        self.stopping = False
        self.restarts = 0

    def _forward(self, signum: int, _frame: FrameType | None) -> None:
        self.stopping = True
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)

    def _start(self, env: dict[str, str], extra: list[str], pass_fds: tuple[int, ...] = ()) -> None:
        cmd = [*agent_command(self.python), "run", *self.args, *extra]
        self.child = subprocess.Popen(cmd, env=env, pass_fds=pass_fds)

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._forward)
        env = dict(os.environ)
        raw = env.get(ENV_SOCKET, "")
        fds = (int(raw),) if raw.isascii() and raw.isdigit() else ()
        successor = env.get(ENV_SUCCESSOR) == "1"
        self.restarts = 1 if successor else 0  # a successor starts after a crash: keep backing off
        self._start(env, [], fds)
        for fd in fds:
            os.close(fd)  # the agent holds the only copy: its death closes the connection
        # Restarts serve on the socket under the launcher's own name and index (a successor
        # has them in its arguments already).
        again = [] if successor else ["--if-held", "exit"]
        again = (["--name", env[ENV_NAME]] if env.get(ENV_NAME) else []) + again
        again = (["--idx", env[ENV_IDX]] if env.get(ENV_IDX) else []) + again
        restart_env = {k: v for k, v in env.items() if k not in (ENV_SOCKET, ENV_NAME, ENV_IDX)}
        delay = 0.0
        while True:
            assert self.child is not None
            started = time.monotonic()
            pid = self.child.pid
            rc = self.child.wait()
            died = time.time()
            if self.stopping or rc == 0:
                return 0 if rc == 0 or self.stopping else rc
            if rc == 2:
                log.error("agent pid %d exited with a start-up error (see its message); not restarting", pid)
                return 2
            ran = time.monotonic() - started
            delay = 0.0 if ran >= STABLE_AFTER else max(BACKOFF_FIRST, min(delay * 2, BACKOFF_MAX))
            if self.restarts == 0:
                delay = 0.0  # the first crash: no reason to wait
            log.warning(
                "agent pid %d %s after %.1f s; restarting it on the runtime's socket in %.1f s",
                pid,
                how_it_ended(rc),
                ran,
                delay,
                extra={"pid": pid, "returncode": rc},
            )
            deadline = time.monotonic() + delay
            while time.monotonic() < deadline and not self.stopping:
                time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
            if self.stopping:
                return 0
            self.restarts += 1
            gap_env = {**restart_env, ENV_GAP_SINCE: repr(died), ENV_GAP_CAUSE: "crash"}
            if successor:
                self._start(gap_env, again)
                continue
            return self._hand_over(gap_env, again)

    def _hand_over(self, env: dict[str, str], extra: list[str]) -> int:
        """Start the successor supervisor (which starts the agent at once) and wait for it."""
        cmd = [*agent_command(self.python), "supervise", *self.args, *extra]
        self.child = subprocess.Popen(cmd, env={**env, ENV_SUCCESSOR: "1"})
        rc = self.child.wait()
        return 0 if self.stopping else rc


def log_format(args: list[str]) -> str:
    for i, a in enumerate(args):
        if a == "--log-format" and i + 1 < len(args):
            return args[i + 1]
        if a.startswith("--log-format="):
            return a.split("=", 1)[1]
    return "json"


def main(args: list[str]) -> int:
    from nriplugin.obs import logs

    logs.setup(log_format(args) if log_format(args) in ("json", "text") else "json")
    return Supervisor(args).run()
