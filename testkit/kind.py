"""The kind cluster of kind/up.sh, for the cluster tests (e2e/cluster/): the real API server
through the official ``kubernetes`` client, and each node's cgroup tree and processes read from
this host (a kind node is a container of the private dockerd kind/lib.sh starts; its cgroups
are the host's, under the node container's own group).
"""

from __future__ import annotations

import math
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client, config

ROOT = Path(__file__).resolve().parent.parent
RUN = Path(os.environ.get("NRIPLUGIN_KIND_RUN", "/run/nriplugin-kind"))
KUBECONFIG = RUN / "kubeconfig"
DOCKER_ENV = {**os.environ, "DOCKER_HOST": f"unix://{RUN / 'docker.sock'}"}
AGENT_NS, AGENT_LABEL = "nriplugin-system", "app.kubernetes.io/name=nriplugin"
PODS_ROOT = "kubelet.slice/kubelet-kubepods.slice"  # kind's kubelet: cgroupRoot /kubelet, systemd driver


def until(fn: Callable[[], Any], timeout: float, what: str, step: float = 0.2) -> Any:
    """``fn()``'s first true value within ``timeout`` seconds; AssertionError naming ``what``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = fn()
        except (OSError, client.ApiException, KeyError, ValueError, IndexError) as exc:
            last = exc
        if last and not isinstance(last, Exception):
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} (after {timeout:g} s; last: {last!r})")
        time.sleep(step)


def docker(*args: str, timeout: float = 60) -> str:
    r = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, env=DOCKER_ENV)
    if r.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args)}: exit {r.returncode}: {r.stderr.strip()[-500:]}")
    return r.stdout


@dataclass
class Node:
    """A kind node: its name, and where its cgroup hierarchies are on this host."""

    name: str
    pid: int  # the node container's init, in this host's PID namespace
    roots: dict[str, Path] = field(default_factory=dict)  # controller -> the node's cgroup on the host

    @classmethod
    def find(cls, name: str) -> Node:
        pid_s, cid = docker("inspect", "-f", "{{.State.Pid}} {{.Id}}", name).split()
        pid = int(pid_s)
        roots = {}
        # The node's cgroup namespace is rooted at the container's group (its systemd then sits
        # in init.scope below it): the path up to the container's id.
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if cid not in path:
                continue
            root = path[: path.index(cid) + len(cid)]
            for c in controllers.split(","):
                if c and not c.startswith("name="):
                    roots[c] = Path("/sys/fs/cgroup", controllers, root.lstrip("/"))
        return cls(name, pid, roots)

    def exec(self, *cmd: str, timeout: float = 60) -> str:
        return docker("exec", self.name, *cmd, timeout=timeout)

    def container_cgroup(self, container_id: str, controller: str = "cpu") -> Path:
        """A container's cgroup (the kubelet's systemd layout: ``cri-containerd-<id>.scope``)."""
        base = self.roots[controller] / PODS_ROOT
        found = list(base.glob(f"*/*/cri-containerd-{container_id}.scope")) + list(
            base.glob(f"*/cri-containerd-{container_id}.scope")
        )
        if not found:
            raise FileNotFoundError(f"no cgroup of container {container_id[:12]} under {base}")
        return found[0]

    def read(self, path: Path, name: str) -> str:
        return (path / name).read_text().strip()

    def pids(self, cgroup: Path) -> list[int]:
        return [int(p) for p in (cgroup / "cgroup.procs").read_text().split()]


class Cluster:
    """The API server (official client) and the nodes."""

    def __init__(self, kubeconfig: Path = KUBECONFIG) -> None:
        # Any: the client's models type every field Optional; the tests read what the server set.
        self.api: Any = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        self.core: Any = client.CoreV1Api(self.api)
        self.apps: Any = client.AppsV1Api(self.api)
        self.batch: Any = client.BatchV1Api(self.api)
        self.policy: Any = client.PolicyV1Api(self.api)
        self.custom: Any = client.CustomObjectsApi(self.api)
        self.rbac: Any = client.RbacAuthorizationV1Api(self.api)
        self.kubeconfig = kubeconfig
        self._nodes: dict[str, Node] = {}

    def node(self, name: str) -> Node:
        if name not in self._nodes:
            self._nodes[name] = Node.find(name)
        return self._nodes[name]

    def worker(self) -> str:
        """The node the agent runs on (labelled for colocation)."""
        nodes = self.core.list_node(label_selector="nriplugin.io/colocation=true").items
        assert nodes, "no node labelled nriplugin.io/colocation=true"
        return str(nodes[0].metadata.name)

    def agent_pod(self, node: str) -> Any:
        pods = self.core.list_namespaced_pod(
            AGENT_NS, label_selector=AGENT_LABEL, field_selector=f"spec.nodeName={node}"
        ).items
        ready = [p for p in pods if p.metadata.deletion_timestamp is None and _ready(p)]
        assert ready, f"no Ready agent pod on {node}: {[p.metadata.name for p in pods]}"
        return ready[0]

    def agent_ready(self, node: str) -> bool:
        try:
            self.agent_pod(node)
        except AssertionError:
            return False
        return True

    def metrics(self, node: str) -> dict[str, float]:
        """The agent's /metrics on ``node``, through the API server's pod proxy."""
        pod = self.agent_pod(node)
        text = self.core.connect_get_namespaced_pod_proxy_with_path(f"{pod.metadata.name}:9310", AGENT_NS, "metrics")
        return parse_metrics(str(text))

    def wait_be_unquoted(self, node: str, calm_for: float = 5.0, timeout: float = 180.0) -> None:
        """Until the QoS manager has left BE without a CPU quota for ``calm_for`` seconds. A kind
        node sees the whole machine's CPU: while the cluster is still busy starting, the
        manager squeezes BE (rightly), and a test of birth values would read the squeeze."""
        deadline = time.monotonic() + timeout
        since: float | None = None
        last = None
        while time.monotonic() < deadline:
            last = self.metrics(node).get("nriplugin_qos_be_cpu_limit_cores")
            if last == math.inf:
                since = since or time.monotonic()
                if time.monotonic() - since >= calm_for:
                    return
            else:
                since = None
            time.sleep(0.5)
        raise AssertionError(f"BE still under a CPU quota on {node} after {timeout:g} s (limit {last} cores)")

    def container_ids(self, pod: Any) -> dict[str, str]:
        """Container name -> id, of a pod's running containers."""
        out = {}
        for st in pod.status.container_statuses or []:
            if st.container_id:
                out[st.name] = st.container_id.split("://", 1)[1]
        return out

    def wait_pods(self, ns: str, selector: str, count: int, timeout: float = 120) -> list[Any]:
        def running() -> list[Any] | None:
            pods = self.core.list_namespaced_pod(ns, label_selector=selector).items
            up = [p for p in pods if p.status.phase == "Running" and p.metadata.deletion_timestamp is None]
            up = [p for p in up if all(s.ready for s in p.status.container_statuses or [])]
            return up if len(up) >= count else None

        found: list[Any] = until(running, timeout, f"{count} Running pod(s) {selector} in {ns}")
        return found

    def why_failed(self, ns: str, selector: str) -> str:
        """What a failed pod's containers and Events say, for an assertion's message."""
        lines = []
        for pod in self.core.list_namespaced_pod(ns, label_selector=selector).items:
            if pod.status.phase != "Failed":
                continue
            for st in pod.status.container_statuses or []:
                term = st.state.terminated if st.state else None
                if term is not None:
                    lines.append(f"{pod.metadata.name}/{st.name}: {term.reason} exit {term.exit_code}: {term.message}")
            for ev in self.events(ns, pod.metadata.name):
                if ev.type == "Warning":
                    lines.append(f"{pod.metadata.name}: {ev.reason}: {ev.message}")
        return "\n".join(lines[:40]) or "(no failed pod left to read)"

    def events(self, ns: str, name: str) -> list[Any]:
        return list(self.core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items)

    def kubectl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        kubectl = kubectl_binary()
        return subprocess.run(
            [str(kubectl), "--kubeconfig", str(self.kubeconfig), *args], capture_output=True, text=True, timeout=timeout
        )


def _ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def kubectl_binary() -> Path:
    version = _lib_value("K8S_VERSION")
    cache = Path(os.environ.get("NRIPLUGIN_CACHE", Path.home() / ".cache" / "nriplugin"))
    return cache / "kind" / "k8s" / f"v{version}" / "kubectl"


def _lib_value(name: str) -> str:
    for line in (ROOT / "kind" / "lib.sh").read_text().splitlines():
        if line.startswith(f"{name}="):
            return line.split("=", 1)[1].split()[0]
    raise LookupError(f"kind/lib.sh sets no {name}")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text format -> {'name{labels}': value} (labels as written)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        try:
            out[key] = float(value)
        except ValueError:
            continue
    return out


def metric_sum(metrics: dict[str, float], name: str, **labels: str) -> float:
    """The sum over a metric's series whose labels include ``labels``."""
    total = 0.0
    for key, value in metrics.items():
        base, _, rest = key.partition("{")
        if base != name:
            continue
        if all(f'{k}="{v}"' in rest for k, v in labels.items()):
            total += value
    return total
