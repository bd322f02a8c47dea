"""The supervisor's decisions, with a stand-in for the agent that records how it was started."""

from __future__ import annotations

import json
import os
import socket
import stat
from pathlib import Path

from nriplugin.agent.supervise import Supervisor, how_it_ended

# Stands in for `python -m nriplugin run ...`: records argv, env and whether fd NRI_PLUGIN_SOCKET
# is open, then ends as the next line of the script file says.
FAKE = """#!/bin/sh
n=$(cat "$DIR/count" 2>/dev/null || echo 0); n=$((n + 1)); echo $n > "$DIR/count"
fd=no; [ -n "$NRI_PLUGIN_SOCKET" ] && [ -e /proc/self/fd/$NRI_PLUGIN_SOCKET ] && fd=yes
printf '{"argv": "%s", "since": "%s", "cause": "%s", "fd": "%s", "successor": "%s"}\\n' "$*" \
    "$NRIPLUGIN_GAP_SINCE" "$NRIPLUGIN_GAP_CAUSE" "$fd" "$NRIPLUGIN_SUPERVISE_SUCCESSOR" >> "$DIR/runs"
how=$(sed -n "${n}p" "$DIR/plan")
case "$how" in kill) kill -9 $$ ;; *) exit "$how" ;; esac
"""


def supervise(tmp_path: Path, plan: list[str], env: dict[str, str]) -> tuple[int, list[dict[str, str]]]:
    fake = tmp_path / "python"
    fake.write_text(FAKE)
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "plan").write_text("\n".join(plan) + "\n")
    saved = dict(os.environ)
    os.environ.update({"DIR": str(tmp_path), **env})
    try:
        rc = Supervisor(["--socket", "/run/x/nri.sock"], python=str(fake)).run()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    runs = [json.loads(ln) for ln in (tmp_path / "runs").read_text().splitlines()]
    return rc, runs


def test_crash_is_restarted_on_the_socket_and_told_when(tmp_path: Path) -> None:
    ours, theirs = socket.socketpair()
    env = {"NRI_PLUGIN_SOCKET": str(theirs.fileno()), "NRI_PLUGIN_NAME": "qos", "NRI_PLUGIN_IDX": "05"}
    os.set_inheritable(theirs.fileno(), True)
    rc, runs = supervise(tmp_path, ["kill", "0"], env)
    theirs.detach()  # the supervisor closed this fd itself
    assert rc == 0
    first, second = runs
    assert first["fd"] == "yes" and first["since"] == ""
    assert first["argv"] == "-m nriplugin run --socket /run/x/nri.sock"
    # handed to a successor supervisor (containerd 2.x kills the launched process once its
    # connection closed), which restarts the agent in socket mode, under the launcher's name,
    # not waiting behind another agent
    assert second["fd"] == "no" and second["cause"] == "crash" and float(second["since"]) > 0
    assert second["successor"] == "1"
    assert second["argv"] == "-m nriplugin supervise --socket /run/x/nri.sock --idx 05 --name qos --if-held exit"
    # the supervisor closed its copy: with the agent gone, the connection is closed
    ours.settimeout(5)
    assert ours.recv(1) == b""
    ours.close()


def test_a_successor_restarts_its_agent_itself(tmp_path: Path) -> None:
    env = {"NRIPLUGIN_SUPERVISE_SUCCESSOR": "1", "NRIPLUGIN_GAP_SINCE": "1.5", "NRIPLUGIN_GAP_CAUSE": "crash"}
    rc, runs = supervise(tmp_path, ["kill", "0"], env)
    assert rc == 0
    first, second = runs
    assert first["argv"] == second["argv"] == "-m nriplugin run --socket /run/x/nri.sock"
    assert first["since"] == "1.5" and float(second["since"]) > 1.5 and second["cause"] == "crash"


def test_runtime_gone_or_startup_error_is_not_restarted(tmp_path: Path) -> None:
    rc, runs = supervise(tmp_path, ["0"], {})
    assert (rc, len(runs)) == (0, 1)
    (tmp_path / "runs").unlink()
    (tmp_path / "count").unlink()
    rc, runs = supervise(tmp_path, ["2"], {})
    assert (rc, len(runs)) == (2, 1)


def test_how_it_ended() -> None:
    assert how_it_ended(-9) == "was killed by SIGKILL"
    assert how_it_ended(1) == "exited with status 1"
