"""Where the API server is and how to prove who the agent is: from a kubeconfig file (its
current context) or from the pod's service account (in the cluster). The result is an
:class:`ApiConfig`, plain data; nothing here opens a connection.

What is supported, as kubectl reads it: the cluster's ``server``, ``certificate-authority`` or
``-data``, ``insecure-skip-tls-verify`` and ``tls-server-name``; the user's
``client-certificate``/``client-key`` (or ``-data``), ``token`` and ``tokenFile``. Relative
paths are relative to the kubeconfig's folder. Anything else a context relies on to
authenticate (an ``exec`` credential plugin, an ``auth-provider``, basic auth, impersonation, a
proxy) is refused with a :class:`ConfigError` that names it, since connecting without it would
only fail later in less clear words.

In the cluster: ``https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT``, the service
account's ``ca.crt``, and its ``token``, which the kubelet rotates: the client re-reads it when
the file changes (``TokenFile``).
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from nriplugin.cluster import SERVICE_ACCOUNT

# What a kubeconfig may say that this client does not do, by where it is said.
UNSUPPORTED_USER = {
    "exec": "an exec credential plugin",
    "auth-provider": "an auth-provider",
    "username": "basic auth (username and password)",
    "password": "basic auth (username and password)",
    "as": "impersonation",
    "as-uid": "impersonation",
    "as-groups": "impersonation",
    "as-user-extra": "impersonation",
}
UNSUPPORTED_CLUSTER = {"proxy-url": "a proxy"}
FIX = "give the user a token, a tokenFile or a client certificate and key (kubectl config view shows what it has)"


class ConfigError(ValueError):
    """The configuration cannot be used: ``str()`` says what (one line), ``fix`` what to do."""

    def __init__(self, problem: str, fix: str = "") -> None:
        super().__init__(problem)
        self.fix = fix


@dataclass(frozen=True)
class ApiConfig:
    """How to reach the API server. PEM bytes (``*_data``) or file paths; ``token`` or
    ``token_file`` (re-read when it changes)."""

    server: str
    source: str  # what it came from, for messages
    ca_file: str | None = None
    ca_data: bytes | None = None
    insecure: bool = False
    tls_server_name: str | None = None
    cert_file: str | None = None
    cert_data: bytes | None = None
    key_file: str | None = None
    key_data: bytes | None = None
    token: str | None = None
    token_file: str | None = None

    @property
    def tls(self) -> bool:
        return self.server.startswith("https://")

    @property
    def client_cert(self) -> bool:
        return bool(self.cert_file or self.cert_data)


def load_kubeconfig(path: str) -> ApiConfig:
    """The current context of the kubeconfig at ``path``."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", "fix the path or the mount") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not text: {exc}", "give a kubeconfig file") from exc
    return parse_kubeconfig(text, Path(path).parent)


def parse_kubeconfig(text: str, base: Path) -> ApiConfig:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"not YAML: {' '.join(str(exc).split())}", "give a kubeconfig file") from exc
    if not isinstance(doc, dict):
        raise ConfigError("not a kubeconfig (not a mapping)", "give a kubeconfig file")
    name = doc.get("current-context")
    if not name or not isinstance(name, str):
        raise ConfigError("it has no current-context", "set one: kubectl config use-context NAME")
    context = _named(doc, "contexts", "context", name)
    cluster_name, user_name = context.get("cluster"), context.get("user")
    if not isinstance(cluster_name, str) or not cluster_name:
        raise ConfigError(f"context {name!r} names no cluster", "fix the context")
    cluster = _named(doc, "clusters", "cluster", cluster_name)
    user = _named(doc, "users", "user", user_name) if isinstance(user_name, str) and user_name else {}
    for key, what in UNSUPPORTED_CLUSTER.items():
        if cluster.get(key):
            raise ConfigError(f"cluster {cluster_name!r} uses {what} ({key}), which nriplugin does not support")
    for key, what in UNSUPPORTED_USER.items():
        if user.get(key):
            detail = _detail(key, user[key])
            raise ConfigError(f"user {user_name!r} uses {what} ({key}{detail}), which nriplugin does not support", FIX)
    server = cluster.get("server")
    if not isinstance(server, str) or not server.startswith(("https://", "http://")):
        problem = f"cluster {cluster_name!r} has no http(s) server: {server!r}"
        raise ConfigError(problem, "fix clusters[].cluster.server")

    def path(section: dict[str, Any], key: str) -> str | None:
        value = section.get(key)
        if value in (None, ""):
            return None
        if not isinstance(value, str):
            raise ConfigError(f"{key} is not a path: {value!r}", "fix the kubeconfig")
        return str(base / value)  # an absolute value stays as it is

    def data(section: dict[str, Any], key: str) -> bytes | None:
        value = section.get(key)
        if value in (None, ""):
            return None
        try:
            return base64.b64decode(str(value), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ConfigError(f"{key} is not base64: {exc}", "fix the kubeconfig") from exc

    token = user.get("token")
    return ApiConfig(
        server=server.rstrip("/"),
        source=f"context {name!r}",
        ca_file=path(cluster, "certificate-authority"),
        ca_data=data(cluster, "certificate-authority-data"),
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        tls_server_name=str(cluster["tls-server-name"]) if cluster.get("tls-server-name") else None,
        cert_file=path(user, "client-certificate"),
        cert_data=data(user, "client-certificate-data"),
        key_file=path(user, "client-key"),
        key_data=data(user, "client-key-data"),
        token=str(token) if token else None,
        token_file=path(user, "tokenFile"),
    )


def _named(doc: dict[str, Any], section: str, inner: str, name: str) -> dict[str, Any]:
    for entry in doc.get(section) or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            value = entry.get(inner)
            return value if isinstance(value, dict) else {}
    raise ConfigError(f"no {inner} named {name!r} in its {section}", "fix the kubeconfig")


def _detail(key: str, value: object) -> str:
    if key == "exec" and isinstance(value, dict) and value.get("command"):
        return f": {value['command']}"
    if key == "auth-provider" and isinstance(value, dict) and value.get("name"):
        return f": {value['name']}"
    return ""


def in_cluster(env: Mapping[str, str] = os.environ, account: Path = SERVICE_ACCOUNT) -> ApiConfig:
    """The pod's service account, as client-go's rest.InClusterConfig reads it."""
    host, port = env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise ConfigError(
            "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not both set", "run in a pod, or give --kubeconfig"
        )
    token = account / "token"
    if not token.is_file():
        raise ConfigError(f"no service account token at {token}", "mount the service account token (automount)")
    ca = account / "ca.crt"
    return ApiConfig(
        server=f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}",
        source="the in-cluster service account",
        ca_file=str(ca) if ca.is_file() else None,
        token_file=str(token),
    )


class TokenFile:
    """A bearer token read from a file, read again when the file changes (the kubelet rotates
    a projected service account token well before it expires, through a symlink swap)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.reads = 0
        self._key: tuple[int, int, int] | None = None
        self._token = ""

    def current(self) -> str:
        """The token; the last one read while the file cannot be read (it is being swapped)."""
        try:
            st = os.stat(self.path)
            key = (st.st_ino, st.st_mtime_ns, st.st_size)
            if key != self._key:
                self._token = Path(self.path).read_text().strip()
                self._key = key
                self.reads += 1
        except OSError:
            pass
        return self._token
