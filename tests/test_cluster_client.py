"""The cluster side's own API client: its sans-IO parts fed byte by byte (a watch's stream, the
API server's error answers, kubeconfig files), and the thin transport that drives them against
the stand-in API server (tests/kube_standin.py) and servers that answer badly: TLS with a
client certificate, a rotated service account token, timeouts, a watch that breaks mid-line."""

from __future__ import annotations

import argparse
import asyncio
import base64
import itertools
import json
import logging
import os
import shutil
import ssl
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from nriplugin.cluster import check
from nriplugin.cluster.client import ApiClient, ApiError, ClusterError, connect, ssl_context
from nriplugin.cluster.kubeconfig import ApiConfig, ConfigError, TokenFile, in_cluster, parse_kubeconfig
from nriplugin.cluster.listwatch import ListWatch
from nriplugin.cluster.pods import RESOURCE as PODS
from nriplugin.cluster.pods import watcher as pods_watcher
from nriplugin.cluster.status import BadAnswer, error_from, json_object
from nriplugin.cluster.watchstream import WatchDecoder
from tests.kube_standin import KubeStandIn
from tests.test_cluster import NODE, until
from tests.test_cluster_errors import RecordingHandler

# --- the watch stream, sans-IO ---------------------------------------------------------------


def pod(name: str, rv: str) -> dict[str, Any]:
    return {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": name, "namespace": "ns", "resourceVersion": rv}}


GONE = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": "too old resource version: 100 (200)",
    "reason": "Expired",
    "code": 410,
}
EVENTS = [
    {"type": "ADDED", "object": pod("a", "101")},
    {"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": "105"}}},
    {"type": "MODIFIED", "object": pod("a", "106")},
    {"type": "DELETED", "object": pod("a", "107")},
    {"type": "ERROR", "object": GONE},
]
STREAM = b"".join(json.dumps(e).encode() + b"\n" for e in EVENTS)
WANT = [("ADDED", "101"), ("BOOKMARK", "105"), ("MODIFIED", "106"), ("DELETED", "107"), ("ERROR", "107")]


def decoded(chunks: list[bytes]) -> tuple[list[tuple[str, str]], WatchDecoder]:
    d = WatchDecoder("100")
    out = [(e.type, e.resource_version) for c in chunks for e in d.feed(c)]
    return out, d


def test_the_watch_stream_byte_by_byte() -> None:
    events, d = decoded([STREAM[i : i + 1] for i in range(len(STREAM))])
    assert events == WANT and d.pending == 0 and d.broken is None and d.resource_version == "107"
    # Split once at every point: the same events, in the same order.
    for i in range(len(STREAM) + 1):
        assert decoded([STREAM[:i], STREAM[i:]])[0] == WANT, i


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_the_watch_stream_in_any_chunks(cuts: list[int]) -> None:
    points = [0, *sorted(cuts), len(STREAM)]
    assert decoded([STREAM[a:b] for a, b in itertools.pairwise(points)])[0] == WANT


def test_a_bookmark_moves_the_resume_point_and_an_error_carries_its_status() -> None:
    d = WatchDecoder("100")
    first, bookmark = d.feed(STREAM[: STREAM.index(b"MODIFIED") - 10])
    assert first.is_change and first.object["metadata"]["name"] == "a" and first.error is None
    assert not bookmark.is_change and d.resource_version == "105"
    *_, error = d.feed(STREAM[STREAM.index(b"MODIFIED") - 10 :])
    assert error.error is not None and (error.error.status, error.error.reason) == (410, "Expired")
    assert "too old resource version" in error.error.message and not error.is_change


def test_a_bad_line_breaks_the_stream_after_the_good_events() -> None:
    good = json.dumps(EVENTS[0]).encode() + b"\n"
    d = WatchDecoder("100")
    events = d.feed(good + b"\n" + b"<html>proxy error</html>\n" + good)
    assert [e.resource_version for e in events] == ["101"]  # the good one before it, the blank line skipped
    assert d.broken is not None and "not JSON" in str(d.broken) and d.resource_version == "101"
    assert d.feed(good) == []  # nothing after it is taken
    for line, why in (
        (b'{"type": "ADDED"}', "without a type and an object"),
        (b'{"type": "RENAMED", "object": {}}', "unknown type 'RENAMED'"),
        (b'{"type": "ADDED", "object": {"metadata": {"resourceVersion": 7}}}', "not a string"),
        (b"[1, 2]", "without a type and an object"),
    ):
        d = WatchDecoder()
        assert d.feed(line + b"\n") == [] and d.broken is not None and why in str(d.broken), line


def test_an_event_cut_short_is_pending_and_a_line_over_the_bound_breaks() -> None:
    d = WatchDecoder("100")
    assert d.feed(STREAM[:30]) == [] and d.pending == 30 and d.broken is None
    d = WatchDecoder(line_bound=64)
    assert d.feed(b"x" * 65) == [] and d.broken is not None and "longer than 64 bytes" in str(d.broken)


# --- error answers, sans-IO --------------------------------------------------------------------


def test_an_error_answer_carries_its_status() -> None:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "code": 429,
        "reason": "TooManyRequests",
        "message": "Cannot evict pod as it would violate the pod's disruption budget.",
        "details": {"causes": [{"reason": "DisruptionBudget", "message": "The disruption budget web needs 2"}, "x"]},
    }
    exc = error_from(429, "Too Many Requests", json.dumps(body).encode(), "https://api/x")
    assert (exc.status, exc.reason, exc.phrase, exc.is_status, exc.url) == (
        429,
        "TooManyRequests",
        "Too Many Requests",
        True,
        "https://api/x",
    )
    assert [c.reason for c in exc.causes] == ["DisruptionBudget"] and "DisruptionBudget" in exc.body
    assert str(exc) == "429 TooManyRequests: Cannot evict pod as it would violate the pod's disruption budget."
    # Not a Status (a proxy's page, a plain 404): the HTTP reason phrase, the body kept for the log.
    plain = error_from(404, "Not Found", b"404 page not found\n")
    assert (plain.reason, plain.message, plain.is_status, plain.causes) == ("Not Found", "", False, [])
    assert str(plain) == "404 Not Found" and plain.body.startswith("404 page")
    assert error_from(502, "Bad Gateway", b"").reason == "Bad Gateway"


def test_a_success_that_is_not_an_object_is_a_bad_answer() -> None:
    assert json_object(b'{"items": []}', "list pods") == {"items": []}
    for body in (b"<html>", b"[1]", b""):
        with pytest.raises(BadAnswer, match="list pods: the answer is"):
            json_object(body, "list pods")


# --- kubeconfig and in-cluster, sans-IO ------------------------------------------------------


def kubeconfig_doc(user: dict[str, Any], cluster: dict[str, Any] | None = None) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "c", "cluster": cluster or {"server": "https://10.0.0.1:6443/"}}],
            "users": [{"name": "agent", "user": user}],
            "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "agent"}}],
            "current-context": "ctx",
        }
    )


def test_a_kubeconfig_with_a_client_certificate_token_and_ca() -> None:
    pem = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    cluster = {"server": "https://api:6443/", "certificate-authority-data": base64.b64encode(pem).decode()}
    cfg = parse_kubeconfig(
        kubeconfig_doc({"client-certificate": "pki/agent.crt", "client-key": "/abs/agent.key", "token": "t"}, cluster),
        Path("/etc/kube"),
    )
    assert (cfg.server, cfg.ca_data, cfg.cert_file, cfg.key_file, cfg.token) == (
        "https://api:6443",
        pem,
        "/etc/kube/pki/agent.crt",  # relative to the kubeconfig's folder, as kubectl reads it
        "/abs/agent.key",
        "t",
    )
    assert cfg.tls and cfg.client_cert and not cfg.insecure and cfg.token_file is None
    cfg = parse_kubeconfig(
        kubeconfig_doc({"tokenFile": "tok"}, {"server": "http://x", "insecure-skip-tls-verify": True}), Path("/k")
    )
    assert cfg.token_file == "/k/tok" and cfg.insecure and not cfg.tls


@pytest.mark.parametrize(
    ("user", "cluster", "said"),
    [
        (
            {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "aws"}},
            None,
            "user 'agent' uses an exec credential plugin (exec: aws), which nriplugin does not support",
        ),
        ({"auth-provider": {"name": "oidc"}}, None, "uses an auth-provider (auth-provider: oidc)"),
        ({"username": "admin", "password": "x"}, None, "uses basic auth (username and password) (username)"),
        ({"token": "t", "as": "someone"}, None, "uses impersonation (as)"),
        (
            {"token": "t"},
            {"server": "https://x", "proxy-url": "http://proxy:3128"},
            "cluster 'c' uses a proxy (proxy-url)",
        ),
        ({"token": "t"}, {"server": "x:6443"}, "cluster 'c' has no http(s) server: 'x:6443'"),
        ({"client-certificate-data": "not base64!"}, None, "client-certificate-data is not base64"),
    ],
)
def test_what_a_kubeconfig_may_not_say_is_named(
    user: dict[str, Any], cluster: dict[str, Any] | None, said: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_kubeconfig(kubeconfig_doc(user, cluster), Path("/k"))
    assert said in str(info.value) and "\n" not in str(info.value)


def test_a_kubeconfig_that_is_not_one() -> None:
    for text, said in (
        ("a: [", "not YAML"),
        ("- 1", "not a mapping"),
        ("clusters: []", "no current-context"),
        ("current-context: x\ncontexts: []", "no context named 'x'"),
    ):
        with pytest.raises(ConfigError, match=said):
            parse_kubeconfig(text, Path("/k"))


def test_the_start_up_check_names_an_exec_plugin_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(kubeconfig_doc({"exec": {"command": "gke-gcloud-auth-plugin"}}))
    problem = check(argparse.Namespace(cluster="auto", kubeconfig=str(path)))
    assert problem is not None and problem[:2] == ("--kubeconfig", str(path))
    assert "exec credential plugin (exec: gke-gcloud-auth-plugin)" in problem[2] and "token" in problem[3]
    r = subprocess.run(
        [sys.executable, "-m", "nriplugin", "run", "--socket", str(tmp_path / "nri.sock"), "--kubeconfig", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "exec credential plugin" in r.stderr and "Traceback" not in r.stderr


def test_in_cluster(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("sa-token\n")
    (tmp_path / "ca.crt").write_text("ca")
    cfg = in_cluster({"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}, tmp_path)
    assert (cfg.server, cfg.ca_file, cfg.token_file) == (
        "https://[fd00::1]:443",
        str(tmp_path / "ca.crt"),
        str(tmp_path / "token"),
    )
    assert in_cluster({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}, tmp_path).server == (
        "https://10.96.0.1:443"
    )
    with pytest.raises(ConfigError, match="KUBERNETES_SERVICE_HOST"):
        in_cluster({}, tmp_path)
    with pytest.raises(ConfigError, match="no service account token"):
        in_cluster({"KUBERNETES_SERVICE_HOST": "h", "KUBERNETES_SERVICE_PORT": "1"}, tmp_path / "none")


def rotate(folder: Path, token: str) -> None:
    """The kubelet's atomic update of a projected volume: a new timestamped folder, ``..data``
    swapped to it by rename, ``token`` a symlink through ``..data``."""
    new = folder / f"..{token}"
    new.mkdir()
    (new / "token").write_text(token)
    (folder / "..data_tmp").symlink_to(new.name)
    os.replace(folder / "..data_tmp", folder / "..data")
    if not (folder / "token").is_symlink():
        (folder / "token").symlink_to("..data/token")


def test_a_rotated_token_is_read_again(tmp_path: Path) -> None:
    rotate(tmp_path, "first")
    tokens = TokenFile(str(tmp_path / "token"))
    assert tokens.current() == "first" and tokens.current() == "first" and tokens.reads == 1
    rotate(tmp_path, "second")
    assert tokens.current() == "second" and tokens.reads == 2
    shutil.rmtree(tmp_path / "..second")  # mid-swap, nothing there: the last one read
    assert tokens.current() == "second"


# --- the transport -------------------------------------------------------------------------------


def served(body: Callable[[KubeStandIn], Awaitable[None]], **kw: Any) -> None:
    async def main() -> None:
        s = KubeStandIn(**kw)
        await s.start()
        try:
            await body(s)
        finally:
            await s.stop()

    asyncio.run(main())


def test_requests_carry_the_rotated_token_and_error_answers_their_status(tmp_path: Path) -> None:
    async def body(s: KubeStandIn) -> None:
        rotate(tmp_path, "t1")
        api = ApiClient(ApiConfig(s.url, "test", token_file=str(tmp_path / "token")))
        try:
            s.add_pod("ns", "a", NODE)
            listed = await api.request("GET", "/api/v1/pods", params={"fieldSelector": f"spec.nodeName={NODE}"})
            assert [p["metadata"]["name"] for p in listed["items"]] == ["a"]
            assert s.requests[-1] == ("GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-1")
            s.token = "t2"  # the server knows the new token before the file has it
            with pytest.raises(ApiError) as info:
                await api.request("GET", "/api/v1/pods")
            assert (info.value.status, info.value.reason, info.value.url) == (
                401,
                "Unauthorized",
                f"{s.url}/api/v1/pods",
            )
            rotate(tmp_path, "t2")
            assert (await api.request("GET", "/api/v1/pods"))["kind"] == "PodList"
            s.forbidden.add(("list", "pods"))
            with pytest.raises(ApiError) as info:
                await api.request("GET", "/api/v1/pods")
            assert info.value.status == 403 and info.value.is_status and "cannot list resource" in info.value.message
        finally:
            await api.close()

    served(body, token="t1")


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def pki(folder: Path) -> None:
    """A CA, the server's certificate for 127.0.0.1, and the agent's client certificate."""
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
            "-subj", "/CN=standin-ca", cwd=folder)  # fmt: skip
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1"), ("agent", "extendedKeyUsage=clientAuth")):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                "-subj", f"/CN={name}", cwd=folder)  # fmt: skip
        (folder / f"{name}.ext").write_text(ext + "\n")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext", cwd=folder)  # fmt: skip


@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl to make certificates")
def test_tls_with_a_client_certificate_from_kubeconfig_data(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """As kind's kubeconfig has it: the CA and the client certificate and key inline; a server
    that requires the certificate. A CA that did not sign the server's: unreachable, said so."""
    pki(tmp_path)
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(tmp_path / "ca.crt"))
    server.load_cert_chain(tmp_path / "server.crt", tmp_path / "server.key")
    server.verify_mode = ssl.CERT_REQUIRED

    def data(name: str) -> str:
        return base64.b64encode((tmp_path / name).read_bytes()).decode()

    async def body(s: KubeStandIn) -> None:
        user = {"client-certificate-data": data("agent.crt"), "client-key-data": data("agent.key"), "token": s.token}
        path = tmp_path / "kubeconfig"
        path.write_text(kubeconfig_doc(user, {"server": s.url, "certificate-authority-data": data("ca.crt")}))
        s.add_pod("ns", "a", NODE)
        api = await connect(str(path))
        watch, cache = pods_watcher(api, NODE)
        task = asyncio.get_running_loop().create_task(watch.run())
        try:
            await until(lambda: cache.by_name("ns", "a") is not None, 5.0)
            s.add_pod("ns", "b", NODE)  # through the watch, over TLS
            await until(lambda: cache.by_name("ns", "b") is not None, 5.0)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await api.close()
        # Without the client certificate the server refuses the handshake; with another CA the
        # agent refuses the server: both "unreachable", with the TLS error named.
        del user["client-certificate-data"], user["client-key-data"]
        path.write_text(kubeconfig_doc(user, {"server": s.url, "certificate-authority-data": data("server.crt")}))
        api = await connect(str(path))
        watch = pods_watcher(api, NODE, backoff=(0.05, 0.1))[0]
        task = asyncio.get_running_loop().create_task(watch.run())
        try:
            await until(lambda: watch.failures >= 1, 5.0)
            assert watch.trouble == "unreachable" and "certificate verify failed" in caplog.text
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await api.close()

    served(body, tls=server)
    # The kubeconfig's CA alone is trusted (as client-go does), not the system's besides.
    ctx = ssl_context(ApiConfig("https://127.0.0.1:1", "test", ca_data=(tmp_path / "ca.crt").read_bytes()))
    assert [c["subject"] for c in ctx.get_ca_certs()] == [((("commonName", "standin-ca"),),)]
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname


def test_every_request_has_a_timeout() -> None:
    """A server that takes the connection and never answers: the request ends at its timeout."""

    async def main() -> None:
        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read(1 << 16)
            await asyncio.sleep(30)

        srv = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        api = ApiClient(ApiConfig(f"http://127.0.0.1:{port}", "test"))
        try:
            t0 = asyncio.get_running_loop().time()
            with pytest.raises(TimeoutError):
                await api.call("GET", "/api/v1/pods", timeout=0.3)
            assert asyncio.get_running_loop().time() - t0 < 2
        finally:
            await api.close()
            srv.close()

    asyncio.run(main())


def test_a_watch_that_breaks_mid_line_resumes_from_the_last_good_event(caplog: pytest.LogCaptureFixture) -> None:
    """Nothing lost on a bad answer: the events before the bad line are handled, the watch
    resumes from the last of them, and what comes after is taken from the next watch."""
    watches: list[str] = []

    async def pods(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") != "true":
            return web.json_response({"kind": "PodList", "metadata": {"resourceVersion": "10"}, "items": []})
        watches.append(request.query["resourceVersion"])
        resp = web.StreamResponse()
        await resp.prepare(request)
        if len(watches) == 1:
            line = json.dumps({"type": "ADDED", "object": pod("a", "11")}).encode() + b"\n"
            await resp.write(line[:20])
            await asyncio.sleep(0.01)
            await resp.write(line[20:] + b"garbage\n")
            await resp.write(json.dumps({"type": "ADDED", "object": pod("lost", "13")}).encode() + b"\n")
        else:
            await resp.write(json.dumps({"type": "ADDED", "object": pod("b", "12")}).encode() + b"\n")
            await asyncio.sleep(30)  # open until cancelled
        return resp

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/api/v1/pods", pods)
        runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        api = ApiClient(ApiConfig(f"http://127.0.0.1:{port}", "test"))
        handler = RecordingHandler()
        watch = ListWatch("pods", api, handler, resource=PODS, backoff=(0.02, 0.05))
        task = asyncio.get_running_loop().create_task(watch.run())
        try:
            await until(lambda: len(handler.seen) == 3, 5.0)
            names = [o["metadata"]["name"] if k != "replace" else o for k, o in handler.seen]
            assert names == [[], "a", "b"] and watches == ["10", "11"] and watch.lists == 1
            assert watch.resource_version == "12"
            (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
            assert warning.startswith("pods: unexpected BadAnswer: a watch event that is not JSON")
            assert watch.trouble is None and watch.failures == 0  # the next watch opened: recovered
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await api.close()
            await runner.cleanup()

    asyncio.run(main())


def test_the_cluster_side_loads_no_kubernetes_client() -> None:
    """The agent's cluster side is its own client: neither kubernetes_asyncio nor the official
    client (the test extra's, for e2e/cluster) is imported by it."""
    code = (
        "import sys, nriplugin.cluster.run; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('kubernetes_asyncio', 'kubernetes')); "
        "assert not bad, bad"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_an_unusable_configuration_is_a_cluster_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    path = tmp_path / "kubeconfig"
    path.write_text(kubeconfig_doc({"client-certificate-data": base64.b64encode(b"junk").decode()}))

    async def main() -> None:
        with pytest.raises(ClusterError, match=r"cannot use --kubeconfig .*: its TLS material does not load"):
            await connect(str(path))
        with pytest.raises(ClusterError, match="cannot use the in-cluster service account: KUBERNETES_SERVICE_HOST"):
            await connect(None)

    asyncio.run(main())
