"""A one-node Kubernetes run as host processes on the private containerd: etcd, kube-apiserver
and a real kubelet (cgroupfs driver), so that node agents that need a kubelet and an API
server (koordlet reads its pods from the kubelet, its NodeSLO and NodeMetric from the API
server) run beside nriplugin on the same node, pods created through the API server.

Why host processes and not the kind cluster: they start in seconds, need no Docker, and the
agents measured see the same host, the same cgroup tree and the same containerd as every
other benchmark here; kind's lock is not taken.

What it is, and what it leaves out on purpose:

- containerd from ``testkit/containerd.py`` (its line, runc with seccomp, which containerd 2.2+
  needs under a kubelet: every sandbox gets the runtime/default profile), a bridge CNI of its
  own so that the runtime reports its network ready; the pods themselves use the host network.
- etcd and kube-apiserver on loopback, ports picked free; a static admin token (group
  ``system:masters``) is every client's credential, RBAC on; the apiserver's serving
  certificate is its own self-signed one. No controller manager and no scheduler: pods name
  their node. The ``ServiceAccount`` admission plugin is off and pods mount no token (nothing
  would publish the root CA's ConfigMap nor make the default ServiceAccount).
- Koordinator's CRDs (``kind/crds/``, not the Prometheus operator's) and, written directly here (no koord-manager), the
  node's NodeSLO and an empty NodeMetric whose status the agents report into.
- the kubelet on the node's address (webhook authentication and authorization: a client
  needs the token), ``cgroupRoot`` our own top-level group (the containerd harness's), its root
  dir, logs and certificates in our folder, images never pulled. Two paths of the kubelet's
  are fixed whatever its root dir: its device-plugin socket
  (``/var/lib/kubelet/device-plugins/kubelet.sock``) and the container-log links in
  ``/var/log/containers``. So one host node runs at a time on a machine (``LOCK``, held while
  it is up), and stop removes the socket, the links into our folder and the folders it made.

:meth:`HostNode.stop` leaves nothing: processes by PID (and whatever is left in the group
they were started in), the runtime's pods, shims, cgroups and bridge, mounts under the folder,
the kubelet's fixed paths, the folder.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testkit import containerd as harness
from testkit import images
from testkit.plugin import free_port

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("NRIPLUGIN_CACHE", Path.home() / ".cache" / "nriplugin"))
CRDS = ROOT / "kind" / "crds"
TOKEN = "nriplugin-hostnode-admin"
NODESLO = ("slo.koordinator.sh", "v1alpha1", "nodeslos")
NODEMETRIC = ("slo.koordinator.sh", "v1alpha1", "nodemetrics")
LOCK = Path("/tmp/nriplugin-hostnode.lock")
# The kubelet's paths that do not follow --root-dir (kubelet v1.35: the device manager's
# pluginapi.DevicePluginPath, kuberuntime's ContainerLogsDir), deepest first.
KUBELET_FIXED = (Path("/var/lib/kubelet/device-plugins"), Path("/var/lib/kubelet"), Path("/var/log/containers"))


def _lib_value(name: str) -> str:
    """A version from kind/lib.sh, the one home of the cluster tools' versions."""
    for line in (ROOT / "kind" / "lib.sh").read_text().splitlines():
        if line.startswith(f"{name}="):
            return line.split("=", 1)[1].split()[0]
    raise KeyError(f"{name} not in kind/lib.sh")


def k8s_bin() -> Path:
    return CACHE / "kind" / "k8s" / f"v{_lib_value('K8S_VERSION')}"


def etcd_bin() -> Path:
    return CACHE / "kind" / "etcd" / f"v{_lib_value('ETCD_VERSION')}" / "etcd"


def missing_binaries() -> list[Path]:
    """What ``bash kind/build.sh`` builds that the node needs and is not there."""
    want = [k8s_bin() / "kube-apiserver", k8s_bin() / "kubelet", k8s_bin() / "kubectl", etcd_bin()]
    return [p for p in want if not os.access(p, os.X_OK)]


def node_address() -> str:
    """The host's address on its default route: the kubelet's, as a real node's is (a
    kubelet refuses a loopback node IP)."""
    out = subprocess.run(["ip", "-j", "route", "get", "192.0.2.1"], capture_output=True, text=True, check=True)
    return str(json.loads(out.stdout)[0]["prefsrc"])


def until(fn: Callable[[], Any], timeout: float, what: str, step: float = 0.2) -> Any:
    """``fn()``'s first true value within ``timeout`` seconds; TimeoutError naming ``what``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = fn()
        except Exception as exc:
            last = exc
        if last and not isinstance(last, Exception):
            return last
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} (after {timeout:g} s; last: {last!r})")
        time.sleep(step)


@dataclass
class HostNode:
    """One node: the runtime, the control plane and the kubelet, all under ``base``."""

    base: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="nriplugin-hostnode-")))
    line: str = "2.4"
    name: str = field(default_factory=lambda: f"nriplugin-host-{os.getpid()}")
    max_pods: int = 250
    nodeslo_spec: Mapping[str, Any] = field(default_factory=dict)
    runtime: harness.Containerd | None = None
    address: str = ""
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    _api: Any = None
    _lock: Any = None
    _made: list[Path] = field(default_factory=list)  # the kubelet's fixed folders that were not there

    # -- where things are ---------------------------------------------------------------------

    @property
    def kubeconfig(self) -> Path:
        return self.base / "kubeconfig"

    @property
    def kubelet_dir(self) -> Path:
        return self.base / "kubelet"

    @property
    def cgroup_root(self) -> str:
        """Our top-level cgroup (the runtime's and the kubelet's ``cgroupRoot``)."""
        assert self.runtime is not None
        return self.runtime.cgroup_root

    @property
    def pods_root(self) -> str:
        """Where the kubelet puts pods, relative to a hierarchy."""
        return f"{self.cgroup_root}/kubepods"

    def log(self, name: str) -> Path:
        return self.base / "logs" / f"{name}.log"

    # -- up -----------------------------------------------------------------------------------

    def start(self, timeout: float = 90.0) -> None:
        """Bring the node up: Ready, its NodeSLO and NodeMetric written. On failure what was
        started is stopped again."""
        if missing := missing_binaries():
            raise FileNotFoundError(f"not built: {', '.join(map(str, missing))} (run bash kind/build.sh)")
        self._lock = open(LOCK, "a")  # noqa: SIM115 - held until stop
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            self._lock = None
            raise RuntimeError(f"another host node is up on this machine ({LOCK} is held)") from None
        self._made = [p for p in KUBELET_FIXED if not p.exists()]
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise

    def _start(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        (self.base / "logs").mkdir(parents=True, exist_ok=True)
        self.address = node_address()
        runc = subprocess.run(
            ["bash", str(ROOT / "testkit" / "build_runc.sh")], capture_output=True, text=True, check=True
        ).stdout.split()[-1]
        self.runtime = harness.Containerd(
            harness.install(self.line), self.base / "containerd", cni=True, runc=Path(runc)
        )
        self.runtime.start()
        self.runtime.import_images()
        self._pki()
        self._etcd()
        self._apiserver(deadline)
        crd_files = [p for p in sorted(CRDS.glob("*.yaml")) if not p.name.startswith("monitoring.coreos.com_")]
        self.kubectl("apply", "--server-side", *[a for p in crd_files for a in ("-f", str(p))])
        crds = ("crd/nodeslos.slo.koordinator.sh", "crd/nodemetrics.slo.koordinator.sh")
        # kubectl wait errs while a new CRD has no conditions yet: asked again until Established
        established = ("wait", "--for=condition=Established", "--timeout=5s", *crds)
        until(lambda: self.kubectl(*established, check=False).returncode == 0, 60, "Koordinator's CRDs established")
        self.write_nodeslo(self.nodeslo_spec)
        self.custom(NODEMETRIC).create_cluster_custom_object(
            *NODEMETRIC,
            {
                "apiVersion": "slo.koordinator.sh/v1alpha1",
                "kind": "NodeMetric",
                "metadata": {"name": self.name},
                "spec": {"metricCollectPolicy": {"aggregateDurationSeconds": 60, "reportIntervalSeconds": 20}},
            },
        )
        self._kubelet()
        until(self._node_ready, max(deadline - time.monotonic(), 1.0), f"node {self.name} Ready", 0.5)

    def _pki(self) -> None:
        pki = self.base / "pki"
        pki.mkdir(exist_ok=True)
        key = pki / "sa.key"
        subprocess.run(["openssl", "genrsa", "-out", str(key), "2048"], capture_output=True, check=True)
        subprocess.run(
            ["openssl", "rsa", "-in", str(key), "-pubout", "-out", str(pki / "sa.pub")], capture_output=True, check=True
        )
        (pki / "tokens.csv").write_text(f'{TOKEN},admin,admin,"system:masters"\n')

    def _spawn(self, name: str, argv: list[str], env: Mapping[str, str] | None = None) -> None:
        """Start one process in the node's own process group (pids hierarchy): what it
        starts stays countable there, whoever becomes its parent."""
        procs = self.process_cgroup() / "cgroup.procs"
        log = open(self.log(name), "ab")  # noqa: SIM115 - lives as long as the process
        join = 'echo $$ > "$0" && exec "$@"'
        self.procs[name] = subprocess.Popen(
            ["sh", "-c", join, str(procs), *argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            start_new_session=True,
            cwd=self.base,
        )
        log.close()

    def process_cgroup(self) -> Path:
        for tree in (harness.CGROUP_FS / "pids", harness.CGROUP_FS / "unified", harness.CGROUP_FS):
            if (tree / "cgroup.procs").exists():
                d = tree / self.cgroup_root / "control"
                d.mkdir(parents=True, exist_ok=True)
                return d
        raise RuntimeError(f"no pids or cgroup v2 hierarchy under {harness.CGROUP_FS}")

    def _etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.ports["etcd"] = client
        self._spawn(
            "etcd",
            [
                str(etcd_bin()),
                "--name=node",
                f"--data-dir={self.base / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{client}",
                f"--advertise-client-urls=http://127.0.0.1:{client}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=node=http://127.0.0.1:{peer}",
                "--listen-metrics-urls=",
                "--unsafe-no-fsync",  # a throwaway store: no disk flushes in the measured machine's noise
                "--log-level=warn",
            ],
        )

    def _apiserver(self, deadline: float) -> None:
        port = free_port()
        self.ports["apiserver"] = port
        pki = self.base / "pki"
        self._spawn(
            "kube-apiserver",
            [
                str(k8s_bin() / "kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}",
                "--bind-address=127.0.0.1",
                f"--advertise-address={self.address}",
                f"--secure-port={port}",
                f"--cert-dir={pki / 'apiserver'}",
                f"--token-auth-file={pki / 'tokens.csv'}",
                "--authorization-mode=RBAC",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--disable-admission-plugins=ServiceAccount",
                "--allow-privileged=true",
                "--profiling=false",
                "--kubelet-preferred-address-types=InternalIP",
            ],
        )
        self.kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {
                            "name": "node",
                            "cluster": {"server": f"https://127.0.0.1:{port}", "insecure-skip-tls-verify": True},
                        }
                    ],
                    "users": [{"name": "admin", "user": {"token": TOKEN}}],
                    "contexts": [{"name": "node", "context": {"cluster": "node", "user": "admin"}}],
                    "current-context": "node",
                },
                indent=1,
            )
        )

        def ready() -> bool:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}; its log ends:\n{self.tail(name)}")
            return self.kubectl("get", "--raw", "/readyz", check=False).returncode == 0

        until(ready, max(deadline - time.monotonic(), 1.0), "kube-apiserver ready", 0.3)

    def _kubelet(self) -> None:
        assert self.runtime is not None
        # the kubelet refuses a cgroupRoot missing from any hierarchy (it makes only below it)
        for hierarchy in harness.CGROUP_FS.iterdir():
            if (hierarchy / "cgroup.procs").exists():
                (hierarchy / self.cgroup_root).mkdir(exist_ok=True)
        port, healthz = free_port(), free_port()
        self.ports["kubelet"] = port
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": False,
            "failSwapOn": False,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": f"/{self.cgroup_root}",
            "containerRuntimeEndpoint": f"unix://{self.runtime.address}",
            "address": self.address,
            "port": port,
            "readOnlyPort": 0,
            "healthzPort": healthz,
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True}},
            "authorization": {"mode": "Webhook"},
            "maxPods": self.max_pods,
            "podLogsDir": str(self.base / "pod-logs"),
            "serializeImagePulls": False,
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "resolvConf": "",
            "registerNode": True,
            "nodeStatusReportFrequency": "1m",
        }
        cfg = self.base / "kubelet-config.json"
        cfg.write_text(json.dumps(config, indent=1))
        self._spawn(
            "kubelet",
            [
                str(k8s_bin() / "kubelet"),
                f"--config={cfg}",
                f"--kubeconfig={self.kubeconfig}",
                f"--root-dir={self.kubelet_dir}",
                f"--cert-dir={self.base / 'pki' / 'kubelet'}",
                f"--hostname-override={self.name}",
                f"--node-ip={self.address}",
                "--v=1",
            ],
            env={"PATH": self.runtime.env()["PATH"]},
        )

    def _node_ready(self) -> bool:
        proc = self.procs.get("kubelet")
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"kubelet exited with {proc.returncode}; its log ends:\n{self.tail('kubelet')}")
        node = self.core().read_node(self.name)
        return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])

    # -- clients --------------------------------------------------------------------------------

    def api(self) -> Any:
        """The official ``kubernetes`` client on this node's API server (one per node)."""
        if self._api is None:
            import urllib3
            from kubernetes import config

            urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)  # its own self-signed certificate
            self._api = config.new_client_from_config(config_file=str(self.kubeconfig))  # type: ignore[no-untyped-call]
        return self._api

    def core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.api())

    def custom(self, _: tuple[str, str, str] | None = None) -> Any:
        from kubernetes import client

        return client.CustomObjectsApi(self.api())

    def kubectl(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(
            [str(k8s_bin() / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and r.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed: {r.stderr.strip()}")
        return r

    def tail(self, name: str, chars: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return self.log(name).read_text(errors="replace")[-chars:]
        return ""

    # -- objects --------------------------------------------------------------------------------

    def write_nodeslo(self, spec: Mapping[str, Any]) -> None:
        """The node's NodeSLO, written directly (what koord-manager would render from its
        ``slo-controller-config``); replaced if there is one."""
        body: dict[str, Any] = {
            "apiVersion": "slo.koordinator.sh/v1alpha1",
            "kind": "NodeSLO",
            "metadata": {"name": self.name},
            "spec": dict(spec),
        }
        api = self.custom()
        try:
            old = api.get_cluster_custom_object(*NODESLO, self.name)
        except Exception:
            api.create_cluster_custom_object(*NODESLO, body)
            return
        body["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        api.replace_cluster_custom_object(*NODESLO, self.name, body)

    def nodemetric(self) -> dict[str, Any]:
        got: dict[str, Any] = self.custom().get_cluster_custom_object(*NODEMETRIC, self.name)
        return got

    def pod_manifest(
        self,
        name: str,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        resources: Mapping[str, Any] | None = None,
        command: list[str] | None = None,
    ) -> dict[str, Any]:
        """A pod on this node (named, so no scheduler is needed): one container of the local
        busybox image, host network, no service-account token."""
        container: dict[str, Any] = {
            "name": "main",
            "image": images.WORKLOAD,
            "imagePullPolicy": "Never",
            "resources": dict(resources or {}),
        }
        if command is not None:
            container["command"] = command
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": "default",
                "labels": dict(labels or {}),
                "annotations": dict(annotations or {}),
            },
            "spec": {
                "nodeName": self.name,
                "hostNetwork": True,
                "automountServiceAccountToken": False,
                "enableServiceLinks": False,
                "terminationGracePeriodSeconds": 0,
                "containers": [container],
            },
        }

    def create_pods(self, manifests: Iterable[Mapping[str, Any]]) -> list[str]:
        """Create pods through the API server (one ``kubectl create`` of a List); their names."""
        items = list(manifests)
        doc = self.base / f"pods-{time.monotonic_ns()}.json"
        doc.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
        self.kubectl("create", "-f", str(doc), timeout=300)
        doc.unlink()
        return [str(m["metadata"]["name"]) for m in items]

    def running(self, names: Iterable[str]) -> bool:
        """Whether every named pod in ``default`` runs with its container ready."""
        want = set(names)
        pods = self.core().list_namespaced_pod("default").items
        up = {
            p.metadata.name
            for p in pods
            if p.status.phase == "Running" and all(c.ready for c in p.status.container_statuses or [])
        }
        return want <= up

    def wait_running(self, names: Iterable[str], timeout: float = 300) -> None:
        want = list(names)
        until(lambda: self.running(want), timeout, f"{len(want)} pods Running on {self.name}", 1.0)

    # -- down -----------------------------------------------------------------------------------

    def stop(self) -> None:
        """Everything gone; safe after a failed or partial start and more than once."""
        for name in ("kubelet", "kube-apiserver", "etcd"):
            proc = self.procs.pop(name, None)
            if proc is not None:
                _stop(proc)
        self._api = None
        if self.runtime is not None:
            self._kill_control()
            self.runtime.teardown()  # pods, shims, mounts, cgroups (the kubelet's too), bridge
            self.runtime = None
        harness.unmount_under(self.base)
        self._kubelet_fixed_paths()
        subprocess.run(["rm", "-rf", "--one-file-system", str(self.base)], check=False)
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def _kubelet_fixed_paths(self) -> None:
        """The kubelet's own files outside its root dir: its device-plugin socket, the log
        links pointing into our folder, and the folders that were not there before."""
        if self._lock is None:
            return  # never started: nothing of ours there (another node's, perhaps)
        (KUBELET_FIXED[0] / "kubelet.sock").unlink(missing_ok=True)
        logs = KUBELET_FIXED[2]
        if logs.is_dir():
            for link in logs.iterdir():
                if link.is_symlink() and os.readlink(link).startswith(f"{self.base}/"):
                    link.unlink()
        for d in self._made:
            with contextlib.suppress(OSError):
                d.rmdir()  # only if empty: what another user put there stays

    def _kill_control(self, timeout: float = 10.0) -> None:
        """SIGKILL, by pid, whatever is left in the node's process group."""
        deadline = time.monotonic() + timeout
        for tree in (harness.CGROUP_FS / "pids", harness.CGROUP_FS / "unified", harness.CGROUP_FS):
            procs = tree / self.cgroup_root / "control" / "cgroup.procs"
            if not procs.exists():
                continue
            while pids := [int(p) for p in procs.read_text().split()]:
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                if time.monotonic() > deadline:
                    raise RuntimeError(f"processes left in {procs.parent}: {pids}")
                time.sleep(0.05)
            return


def _stop(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
