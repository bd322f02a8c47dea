"""The API server over HTTP: a thin aiohttp shell around the sans-IO parts (``kubeconfig.py``
says where and as whom, ``status.py`` what an error answer means, ``watchstream.py`` what a
watch's bytes are). Objects are the API's JSON as dicts; no generated models are loaded.

Every request has a timeout. An error answer raises :class:`ApiError` with its Status's reason
and message; no answer raises what aiohttp or the socket raised (``aiohttp.ClientError``,
``TimeoutError``, ``OSError``: the API server out of reach); a success whose body is not a JSON
object raises :class:`BadAnswer` when the body was asked for.
"""

from __future__ import annotations

import contextlib
import json
import os
import ssl
import tempfile
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp
from yarl import URL

from nriplugin.cluster.kubeconfig import ApiConfig, ConfigError, TokenFile, in_cluster, load_kubeconfig
from nriplugin.cluster.status import ApiError, BadAnswer, error_from, json_object

REQUEST_TIMEOUT = 10.0  # seconds for a request without its own
CONNECT_TIMEOUT = 10.0  # seconds to connect (and the TLS handshake), whatever the request's timeout
USER_AGENT = "nriplugin"
JSON = "application/json"
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"

# What no answer (or no usable one) is, for callers that take every such failure alike.
UNANSWERED = (aiohttp.ClientError, TimeoutError, OSError, BadAnswer)

__all__ = ["UNANSWERED", "ApiClient", "ApiError", "BadAnswer", "ClusterError", "connect", "path_of"]


class ClusterError(RuntimeError):
    """The cluster cannot be reached as configured; the message says which option."""


def path_of(*parts: str) -> str:
    """``/a/b/c`` with each part escaped as a path segment (names are DNS labels, but still)."""
    return "/" + "/".join(quote(p, safe="") for p in parts)


class ApiClient:
    """One API server, one connection pool. ``host`` is the server's URL (a path prefix kept)."""

    def __init__(self, config: ApiConfig, *, connect_timeout: float = CONNECT_TIMEOUT) -> None:
        self.config = config
        self.host = config.server
        self.connect_timeout = connect_timeout
        self._token_file = TokenFile(config.token_file) if config.token_file else None
        self._ssl = ssl_context(config) if config.tls else None
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        """Made on first use (it belongs to the running loop)."""
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(ssl=self._ssl if self._ssl is not None else False)
            self._session = aiohttp.ClientSession(connector=connector, headers={"User-Agent": USER_AGENT})
        return self._session

    def headers(self, content_type: str | None = None) -> dict[str, str]:
        out = {"Accept": JSON}
        token = self._token_file.current() if self._token_file is not None else self.config.token
        if token:
            out["Authorization"] = f"Bearer {token}"
        if content_type:
            out["Content-Type"] = content_type
        return out

    def url(self, path: str, params: Mapping[str, str] | None = None) -> URL:
        query = f"?{urlencode(dict(params))}" if params else ""
        return URL(self.host + path + query, encoded=True)

    def _timeout(self, total: float) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(total=total, connect=min(total, self.connect_timeout))

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = JSON,
        timeout: float = REQUEST_TIMEOUT,
    ) -> dict[str, Any]:
        """The answer's JSON object; ApiError for an error answer, BadAnswer for a success
        that is not a JSON object."""
        raw = await self.call(method, path, params=params, body=body, content_type=content_type, timeout=timeout)
        return json_object(raw, f"{method} {path}")

    async def call(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = JSON,
        timeout: float = REQUEST_TIMEOUT,
    ) -> bytes:
        """The answer's body, read whole; ApiError for an error answer."""
        url = self.url(path, params)
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        async with self.session.request(
            method,
            url,
            data=data,
            headers=self.headers(content_type if data is not None else None),
            timeout=self._timeout(timeout),
            server_hostname=self.config.tls_server_name,
        ) as resp:
            raw = await resp.read()
            if not 200 <= resp.status <= 299:
                raise error_from(resp.status, resp.reason or "", raw, str(url.with_query(None)))
            return raw

    @contextlib.asynccontextmanager
    async def stream(
        self, path: str, params: Mapping[str, str], *, timeout: float
    ) -> AsyncIterator[AsyncIterator[bytes]]:
        """A GET whose body is read as it comes (a watch): the chunks, within ``timeout`` in all."""
        url = self.url(path, params)
        async with self.session.get(
            url,
            headers=self.headers(),
            timeout=self._timeout(timeout),
            server_hostname=self.config.tls_server_name,
        ) as resp:
            if not 200 <= resp.status <= 299:
                raise error_from(resp.status, resp.reason or "", await resp.read(), str(url.with_query(None)))
            yield resp.content.iter_any()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def ssl_context(config: ApiConfig) -> ssl.SSLContext:
    """The TLS context for ``config``: its CA alone when it names one (as client-go trusts it),
    else the system's; its client certificate."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the certificate and the host name
    if config.ca_file:
        ctx.load_verify_locations(cafile=config.ca_file)
    if config.ca_data:
        ctx.load_verify_locations(cadata=config.ca_data.decode("ascii", "replace"))
    if not config.ca_file and not config.ca_data:
        ctx.load_default_certs()
    if config.insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if config.client_cert:
        if config.cert_data or config.key_data:
            # The ssl module loads a certificate chain from files only: a private folder, gone at once.
            with tempfile.TemporaryDirectory(prefix="nriplugin-tls-") as tmp:
                cert = _file(tmp, "cert.pem", config.cert_data) or config.cert_file
                key = _file(tmp, "key.pem", config.key_data) or config.key_file
                ctx.load_cert_chain(str(cert), key)
        else:
            ctx.load_cert_chain(str(config.cert_file), config.key_file)
    return ctx


def _file(folder: str, name: str, data: bytes | None) -> str | None:
    if data is None:
        return None
    path = os.path.join(folder, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


async def connect(kubeconfig: str | None) -> ApiClient:
    """An API client from ``kubeconfig``, or from the pod's service account when None."""
    where = f"--kubeconfig {kubeconfig}" if kubeconfig else "the in-cluster service account"
    try:
        config = load_kubeconfig(kubeconfig) if kubeconfig else in_cluster()
        return ApiClient(config)
    except ConfigError as exc:
        fix = f"; {exc.fix}" if exc.fix else ""
        raise ClusterError(f"cannot use {where}: {exc}{fix}") from exc
    except (ssl.SSLError, OSError, ValueError) as exc:  # a CA or a key that does not load
        raise ClusterError(f"cannot use {where}: its TLS material does not load: {exc}") from exc
