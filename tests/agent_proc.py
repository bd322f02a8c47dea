"""`nriplugin run` as a real process for tests: started by socket or as the runtime starts a
pre-registered plugin (the connection as an inherited fd), always killed and reaped, whatever
the test does; plus the small HTTP helpers those tests poll the agent with."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from testkit.runtime_peer import RuntimePeer

Process = asyncio.subprocess.Process


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str) -> tuple[int, str]:
    """(status, body); (0, "") while nothing listens yet."""
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except urllib.error.URLError:
        return 0, ""


async def poll(
    url: str, done: Callable[[int, str], bool] = lambda code, _: code != 0, tries: int = 200, pause: float = 0.05
) -> tuple[int, str]:
    """GET ``url`` until ``done(status, body)`` (by default: anything answers); the last answer."""
    code, body = 0, ""
    for _ in range(tries):
        code, body = await asyncio.to_thread(http_get, url)
        if done(code, body):
            break
        await asyncio.sleep(pause)
    return code, body


@contextlib.asynccontextmanager
async def agent(
    *args: str, env: dict[str, str] | None = None, pass_fds: Sequence[int] = (), stderr: Any = subprocess.PIPE
) -> AsyncIterator[Process]:
    """``nriplugin run ARGS``, its log piped (read it after it exited, :func:`stopped`) or to
    ``stderr`` (a file to read while it runs)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "nriplugin", "run", *args, env=env, pass_fds=pass_fds, stderr=stderr
    )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@contextlib.asynccontextmanager
async def preregistered(peer: RuntimePeer, *args: str) -> AsyncIterator[Process]:
    """``nriplugin run ARGS`` as the runtime starts a pre-registered plugin: ``peer`` holds the
    other end of the connection, handed over as fd ``NRI_PLUGIN_SOCKET``."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    await peer.adopt(ours)
    env = {
        **os.environ,
        "NRI_PLUGIN_NAME": "nriplugin",
        "NRI_PLUGIN_IDX": "11",
        "NRI_PLUGIN_SOCKET": str(theirs.fileno()),
    }
    try:
        async with agent(*args, env=env, pass_fds=(theirs.fileno(),)) as proc:
            theirs.close()
            yield proc
    finally:
        theirs.close()


async def stopped(proc: Process, timeout: float = 10) -> tuple[int, str]:
    """Wait for the agent to exit: its exit code and its log."""
    code = await asyncio.wait_for(proc.wait(), timeout)
    assert proc.stderr is not None
    return code, (await proc.stderr.read()).decode()
