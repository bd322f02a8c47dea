"""`nriplugin run` and `nriplugin install` as real processes against the runtime peer."""

from __future__ import annotations

import asyncio
import contextlib
import email.message
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
from pathlib import Path

import pytest
import yaml

from nriplugin.agent.lock import AgentLock, Holder
from nriplugin.cli import explain
from nriplugin.cli.main import install, options_path, read_options
from nriplugin.kernel.probe import probe
from nriplugin.nri import api_pb2 as api
from testkit.runtime_peer import RuntimePeer, make_container, make_pod
from tests.agent_proc import agent, free_port, http_get, poll, preregistered, stopped

ROOT = Path(__file__).resolve().parent.parent


def test_install_writes_an_absolute_launcher(tmp_path: Path) -> None:
    target = install(str(tmp_path / "plugins"), "nriplugin", "07", ["--log-format", "text"])
    assert target.name == "07-nriplugin"
    text = target.read_text()
    assert text.startswith("#!/bin/sh\n")
    assert f"exec {sys.executable} -m nriplugin supervise --log-format text" in text
    assert target.stat().st_mode & 0o111
    with pytest.raises(SystemExit):
        install(str(tmp_path), "../x", "07", [])
    # What would make the pre-registered plugin fail (and containerd 1.7 exit) is refused now.
    with pytest.raises(SystemExit, match="--cgroup-root"):
        install(str(tmp_path), "nriplugin", "07", ["--cgroup-root", str(tmp_path / "none")])
    with pytest.raises(SystemExit, match="--policy"):
        install(str(tmp_path), "nriplugin", "07", ["--policy", str(tmp_path / "none.yaml")])
    with pytest.raises(SystemExit, match="invalid arguments"):
        install(str(tmp_path), "nriplugin", "07", ["--idx", "7"])
    logged = install(str(tmp_path / "plugins"), "nriplugin", "08", [], log_file=str(tmp_path / "agent log"))
    assert f"exec >>'{tmp_path}/agent log' 2>&1\n" in logged.read_text()


def test_install_bundle_copies_it_with_its_options(tmp_path: Path) -> None:
    exe = tmp_path / "nriplugin-bundle"
    exe.write_bytes(b"#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    plugins = tmp_path / "plugins"
    target = install(str(plugins), "nriplugin", "10", ["--log-format", "text"], str(tmp_path / "a.log"), str(exe))
    assert target.read_bytes() == exe.read_bytes() and target.stat().st_mode & 0o111
    opts = plugins / "10-nriplugin.options.json"
    assert not opts.stat().st_mode & 0o111  # the runtime skips non-executable files in its plugin dir
    assert read_options(str(target)) == (["--log-format", "text"], str(tmp_path / "a.log"))
    install(str(plugins), "nriplugin", "10", [], bundle=str(exe))  # no options: none left behind
    assert not opts.exists() and read_options(str(target)) == ([], None)
    install(str(plugins), "nriplugin", "10", ["--log-format", "text"], bundle=str(exe))
    install(str(plugins), "nriplugin", "10", [])  # back to the launcher: the bundle's options go
    assert not opts.exists() and target.read_text().startswith("#!/bin/sh")
    with pytest.raises(SystemExit, match="not an executable"):
        install(str(plugins), "nriplugin", "10", [], bundle=str(tmp_path / "missing"))
    for bad in ("{", "[1]", '{"args": "--x"}', '{"args": [], "logFile": 3}'):
        opts.write_text(bad)
        with pytest.raises(ValueError, match=r"options\.json"):
            read_options(str(target))


def test_runtime_start_without_arguments_reads_the_options(tmp_path: Path) -> None:
    """What containerd does with a bundle in its plugin dir (no arguments, the connection as fd
    NRI_PLUGIN_SOCKET), here with `python -m nriplugin`: options come from the file next to
    argv[0] and reach the agent (a bad --idx in them: the agent's start-up error, exit 2)."""
    (tmp_path / "__main__.py").write_text("import runpy\nrunpy.run_module('nriplugin', run_name='__main__')\n")
    options_path(str(tmp_path / "__main__.py")).write_text(json.dumps({"args": ["--idx", "7"]}))
    ours, theirs = socket.socketpair()
    with ours, theirs:
        env = {**os.environ, "NRI_PLUGIN_SOCKET": str(theirs.fileno()), "PYTHONPATH": str(ROOT)}
        r = subprocess.run(
            [sys.executable, str(tmp_path / "__main__.py")],
            env=env,
            pass_fds=(theirs.fileno(),),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert r.returncode == 2 and "two digits" in r.stderr


def test_bad_arguments_are_refused_clearly() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "nriplugin", "run", "--idx", "1"], capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 2 and "two digits" in r.stderr


def test_preregistered_launcher_runs_with_no_path(tmp_path: Path) -> None:
    """The runtime starts `IDX-NAME` with an empty environment but NRI_PLUGIN_* and fd 3."""

    async def main() -> None:
        args = ["--metrics-address", "127.0.0.1:0", "--socket", str(tmp_path / "nri" / "nri.sock")]
        launcher = install(str(tmp_path / "plugins"), "nriplugin", "11", args)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        peer = RuntimePeer(synchronize=False)
        await peer.adopt(ours)
        # containerd passes fd 3; any inherited number exercises the same path.
        env = {"NRI_PLUGIN_NAME": "nriplugin", "NRI_PLUGIN_IDX": "11", "NRI_PLUGIN_SOCKET": str(theirs.fileno())}
        # Its own process group: if the agent crashes, the launcher hands over to a successor
        # supervisor, which the finally below must end too (it holds the stderr pipe).
        proc = await asyncio.create_subprocess_exec(
            str(launcher), env=env, pass_fds=(theirs.fileno(),), stderr=subprocess.PIPE, start_new_session=True
        )
        theirs.close()
        try:
            s = await peer.next_session(timeout=10)
            assert (s.name, s.idx) == ("nriplugin", "11")
            pod = make_pod(1, "BE")
            rsp = await s.create_container(pod, make_container(1, pod))
            assert rsp.adjust.linux.resources.cpu.shares.value == 2
            s.close()  # the runtime goes away: a pre-registered plugin exits
            assert await asyncio.wait_for(proc.wait(), 10) == 0
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await asyncio.wait_for(proc.wait(), 10)
            await peer.close()

    asyncio.run(main())


def test_run_serves_metrics_health_and_stops_on_sigterm(tmp_path: Path) -> None:
    async def main() -> None:
        sock = str(tmp_path / "nri.sock")
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        peer = RuntimePeer()
        try:
            async with agent("--socket", sock, "--metrics-address", f"127.0.0.1:{port}") as proc:
                # No runtime yet: the agent keeps retrying and serves metrics after at most 1 s.
                code, _ = await poll(f"{url}/readyz")
                assert code == 503
                await peer.listen(sock)
                s = await peer.next_session(timeout=15)
                for i in range(5):
                    pod = make_pod(i, "BE")
                    await s.create_container(pod, make_container(i, pod))
                code, _ = await asyncio.to_thread(http_get, f"{url}/readyz")
                assert code == 200
                code, body = await asyncio.to_thread(http_get, f"{url}/metrics")
                assert code == 200
                assert 'nriplugin_hook_duration_seconds_count{event="create_container"} 5.0' in body
                assert 'nriplugin_hook_duration_seconds_bucket{event="create_container",le="5e-05"}' in body
                assert 'nriplugin_connection_state{state="registered"} 1.0' in body
                assert "nriplugin_synchronize_duration_seconds_count 1.0" in body
                assert (await asyncio.to_thread(http_get, f"{url}/nope"))[0] == 404
                doc = await asyncio.to_thread(
                    subprocess.run,
                    [sys.executable, "-m", "nriplugin", "doctor", "--format", "json", "--agent", f"127.0.0.1:{port}"],
                    capture_output=True,
                    text=True,
                    timeout=30,
                )
                info = json.loads(doc.stdout)["agent"]
                assert info["reachable"] and info["connection"] == "registered" and info["policyVersion"] == 1
                assert info["reconcilerPasses"] >= 1  # the pass right after Synchronize
                proc.send_signal(signal.SIGTERM)
                code, logs = await stopped(proc)
                assert code == 0
                assert '"msg": "registered with the runtime as 10-nriplugin"' in logs
        finally:
            await peer.close()

    asyncio.run(main())


def test_explain_and_doctor(tmp_path: Path) -> None:
    desc = tmp_path / "pod.yaml"
    desc.write_text(
        "pod:\n  labels: {koordinator.sh/qosClass: LS}\n  cgroupParent: /kubepods/burstable/pod1\n"
        "containers:\n  - name: main\n    resources: {cpuShares: 512, cpuQuota: 30000}\n"
    )
    r = subprocess.run(
        [sys.executable, "-m", "nriplugin", "explain", str(desc), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["qosClass"] == "LS" and out["policyVersion"] == 1
    burst = out["containers"]["main"].get("cpu.cfs_burst_us")
    if probe(core_sched=False).files["cpu.cfs_burst_us"]:  # this machine's kernel decides
        assert burst["value"] == 30000 and "capped at the quota" in burst["why"]
    else:
        assert burst is None
    desc.write_text("pod: {labels: {koordinator.sh/qosClass: '../x'}}\ncontainers: [{name: a}]\n")
    r = subprocess.run(
        [sys.executable, "-m", "nriplugin", "explain", str(desc), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0 and "invalid label" in json.loads(r.stdout)["qosClass"]
    desc.write_text("pod: {labels: []}\n")
    r = subprocess.run(
        [sys.executable, "-m", "nriplugin", "explain", str(desc)], capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 2 and "pod.labels" in r.stderr
    policy = tmp_path / "policy.yaml"
    policy.write_text("beMinCPUShares: 0\n")
    r = subprocess.run(
        [sys.executable, "-m", "nriplugin", "explain", str(desc), "--policy", str(policy)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2 and "beMinCPUShares" in r.stderr and "(got 0)" in r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "nriplugin", "doctor", "--format", "json", "--agent", f"127.0.0.1:{free_port()}"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 1, r.stderr  # no agent there: the node's report all the same
    doc = json.loads(r.stdout)
    assert doc["cgroup"]["version"] in (1, 2) and "cpuBurst" in doc["features"]
    assert doc["cpu"]["online"]
    assert all("not available" in line for line in doc["nri"]["bornWith"].values())  # v0.6.1 assumed


def test_doctor_says_what_be_is_born_with_on_the_runtime_named() -> None:
    """``--runtime-nri``: what BE containers get on that runtime; a wrong version is one line."""

    def doctor(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "nriplugin", "doctor", "--format", "json", "--agent", "127.0.0.1:1", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30)

    r = doctor("--runtime-nri", "v0.12.5")
    assert r.returncode == 1 and "no agent answering at http://127.0.0.1:1 " in r.stderr, r.stderr
    born = json.loads(r.stdout)["nri"]["bornWith"]
    assert len(born) == 3 and all(line.startswith("in force") for line in born.values()), born
    r = doctor("--runtime-nri", "v0.10.0")
    born = json.loads(r.stdout)["nri"]["bornWith"]
    assert {k: v.startswith("in force") for k, v in born.items()} == {
        "SCHED_IDLE for BE": False,  # NRI v0.11
        "IO priority idle for BE": True,
        "oom_score_adj 1000 for BE": True,
    }, born
    r = doctor("--runtime-nri", "junk")
    assert r.returncode == 2 and "not an NRI version" in r.stderr and "Traceback" not in r.stderr


def test_doctor_without_an_agent_says_so_in_one_line_and_exits_1() -> None:
    """No agent at ``--agent``: the node's report on stdout as ever (its agent section says
    why), then one line on stderr, no traceback, no urllib repr; status 1."""
    port = free_port()
    r = subprocess.run(
        [sys.executable, "-m", "nriplugin", "doctor", "--agent", f"127.0.0.1:{port}"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 1
    assert r.stderr == (
        f"nriplugin doctor: no agent answering at http://127.0.0.1:{port} (connection refused) — is nriplugin "
        "running? (--agent HOST:PORT if elsewhere)\n"
    )
    agent = yaml.safe_load(r.stdout)["agent"]
    assert agent == {"reachable": False, "address": f"127.0.0.1:{port}", "error": "connection refused"}
    assert "urlopen" not in r.stdout and "Errno" not in r.stdout


def test_why_unreachable_in_a_few_words() -> None:
    refused = urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))
    assert explain.why_unreachable(refused) == "connection refused"
    assert explain.why_unreachable(urllib.error.URLError(TimeoutError("timed out"))) == "timed out"
    assert explain.why_unreachable(TimeoutError("timed out")) == "timed out"  # a read that timed out
    unknown = urllib.error.URLError(socket.gaierror(-2, "Name or service not known"))
    assert explain.why_unreachable(unknown) == "name or service not known"
    assert explain.why_unreachable(ValueError("unknown url type: 'http://:x'")) == "unknown url type: 'http://:x'"
    not_found = urllib.error.HTTPError("http://x/metrics", 404, "Not Found", email.message.Message(), None)
    assert explain.why_unreachable(not_found) == "HTTP 404"
    assert explain.no_agent({"reachable": True, "address": "x"}) is None


def test_bad_policy_by_hand_is_a_startup_error(tmp_path: Path) -> None:
    """Started by hand or by the DaemonSet, a bad policy stops the agent before it registers
    (a surge rollout then keeps the old agent and its policy); one line, no traceback."""
    policy = tmp_path / "policy.yaml"
    policy.write_text("cpuBurstStrategy: {policy: sometimes}\n")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "nriplugin",
            "run",
            "--socket",
            str(tmp_path / "none.sock"),
            "--policy",
            str(policy),
            "--metrics-address",
            "127.0.0.1:0",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2
    (line,) = r.stderr.splitlines()
    assert "--policy" in line and "cpuBurstStrategy.policy" in line and "Traceback" not in r.stderr


def test_bad_policy_preregistered_runs_on_the_default(tmp_path: Path) -> None:
    """A pre-registered plugin that refused to start would make containerd 1.7 exit: it runs
    on the embedded default instead, and says so."""
    policy = tmp_path / "policy.yaml"
    policy.write_text("cpuBurstStrategy: {policy: sometimes}\n")

    async def main() -> None:
        peer = RuntimePeer(synchronize=False)
        args = ["--socket", str(tmp_path / "nri.sock"), "--policy", str(policy), "--metrics-address", "127.0.0.1:0"]
        try:
            async with preregistered(peer, *args) as proc:
                s = await peer.next_session(timeout=10)
                pod = make_pod(1, "BE")
                rsp = await s.create_container(pod, make_container(1, pod))
                assert rsp.adjust.linux.resources.cpu.shares.value == 2
                s.close()
                code, logs = await stopped(proc)
                assert code == 0
                assert (
                    "policy rejected, running with the embedded default" in logs and "cpuBurstStrategy.policy" in logs
                )
        finally:
            await peer.close()

    asyncio.run(main())


def test_examples_in_the_readme_work() -> None:
    root = Path(__file__).resolve().parent.parent
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "nriplugin",
            "explain",
            str(root / "examples" / "pod-be.yaml"),
            "--policy",
            str(root / "examples" / "policy.yaml"),
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    main = out["containers"]["main"]
    assert out["policyVersion"] == 2 and main["cpu.shares"]["value"] == 512
    assert main["cpu.cfs_quota_us"]["value"] == 200000 and main["memory.limit_in_bytes"]["value"] == 2 << 30


def test_second_agent_on_a_taken_metrics_address_says_who_holds_the_runtime(tmp_path: Path) -> None:
    """A copy run by hand next to a running agent, both on the default metrics address."""
    sock = str(tmp_path / "nri.sock")
    holder = AgentLock(sock)
    assert holder.try_acquire()
    holder.announce(Holder.me("socket", sock))
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    try:
        argv = ["run", "--socket", sock, "--metrics-address", f"127.0.0.1:{busy.getsockname()[1]}"]
        r = subprocess.run([sys.executable, "-m", "nriplugin", *argv], capture_output=True, text=True, timeout=30)
        assert r.returncode == 2
        (line,) = r.stderr.splitlines()
        assert "--metrics-address" in line and "address already in use" in line
        assert f"pid {os.getpid()}" in line and "stand by next to it" in line
        # With --if-held exit (the supervisor's restarts) there is nothing to do: exit 0, no error.
        r = subprocess.run(
            [sys.executable, "-m", "nriplugin", *argv, "--if-held", "exit"], capture_output=True, text=True, timeout=30
        )
        assert r.returncode == 0 and "nothing to do" in r.stderr
    finally:
        busy.close()
        holder.release(Holder.me("socket", sock))


INERT = 1 << (api.POST_UPDATE_CONTAINER - 1)


def test_preregistered_startup_error_registers_inert(tmp_path: Path) -> None:
    """containerd 1.7 exits if a pre-registered plugin does not register: it registers, adjusts
    nothing, says why once, and exits 2 when the runtime lets go."""

    async def main() -> None:
        peer = RuntimePeer(synchronize=False)
        args = ["--socket", str(tmp_path / "nri.sock"), "--cgroup-root", str(tmp_path / "none")]
        try:
            async with preregistered(peer, *args, "--metrics-address", "127.0.0.1:0") as proc:
                s = await peer.next_session(timeout=10)
                assert s.events == INERT
                s.close()
                code, logs = await stopped(proc)
                assert code == 2
                assert "--cgroup-root" in logs and "registering inert" in logs and "Traceback" not in logs
        finally:
            await peer.close()

    asyncio.run(main())


def test_preregistered_standby_takes_over_on_the_socket(tmp_path: Path) -> None:
    """Another agent holds the runtime: the pre-registered one registers inert; once the lock is
    free it leaves that connection and serves on --socket (which brings Synchronize)."""

    async def main() -> None:
        sock = str(tmp_path / "nri.sock")
        holder = AgentLock(sock)
        assert holder.try_acquire()
        me = Holder.me("socket", sock)
        holder.announce(me)
        fd_peer, sock_peer = RuntimePeer(synchronize=False), RuntimePeer()
        await sock_peer.listen(sock)
        port = free_port()
        try:
            async with preregistered(fd_peer, "--socket", sock, "--metrics-address", f"127.0.0.1:{port}") as proc:
                inert = await fd_peer.next_session(timeout=10)
                assert inert.events == INERT
                code, body = await poll(f"http://127.0.0.1:{port}/readyz")
                assert code == 200 and body.startswith("standby:") and f"pid {os.getpid()}" in body
                holder.release(me)
                s = await sock_peer.next_session(timeout=10)
                assert (s.name, s.idx) == ("nriplugin", "11") and s.subscribed(api.CREATE_CONTAINER)
                await asyncio.wait_for(inert.closed.wait(), 10)
                pod = make_pod(1, "BE")
                rsp = await s.create_container(pod, make_container(1, pod))
                assert rsp.adjust.linux.resources.cpu.shares.value == 2
                code, body = await asyncio.to_thread(http_get, f"http://127.0.0.1:{port}/metrics")
                assert 'nriplugin_agent_gap_seconds_count{cause="handover"} 1.0' in body
                proc.send_signal(signal.SIGTERM)
                assert (await stopped(proc))[0] == 0
        finally:
            await fd_peer.close()
            await sock_peer.close()

    asyncio.run(main())


def test_numbers_on_the_command_line_are_ascii_digits() -> None:
    """A digit only to Unicode ("¹") is refused with argparse's message, not int()'s traceback."""
    from nriplugin.cli.main import build_parser

    for bad in (["--idx", "\u00b9\u00b2"], ["--metrics-address", ":\u00b9"], ["--metrics-address", ":70000"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["run", *bad])
    ns = build_parser().parse_args(["run", "--idx", "07", "--metrics-address", ":9101"])
    assert (ns.idx, ns.metrics_address) == ("07", ("127.0.0.1", 9101))
