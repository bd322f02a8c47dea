"""A private containerd with NRI, brought up and torn down by tests and the demo.

One switch picks the runtime line for everything that uses this harness: ``NRIPLUGIN_RUNTIME``
(or the e2e suite's ``--runtime``) = ``1.7`` (Debian's containerd 1.7.24, NRI v0.6.1), ``2.1``
(Debian's 2.1.x, NRI v0.8) or ``2.4`` (upstream 2.4.2 built from the Go module proxy, NRI
v0.12), the newest by default. :class:`Runtime` is the one place the harness asks the runtime
what it is (``containerd --version``) and what follows from that for tests.

Everything lives under one base folder (root, state, sockets, NRI plugin dir, runc root, logs)
and one top-level cgroup per controller (``/nriplugin-e2e-<pid>-<n>``), so teardown removes
exactly what was created: our pods through CRI, our shims by their pid files, our mounts under
the base folder, our cgroups, the folder itself. Nothing is killed by name.

With ``cni=True`` pods may have their own network namespace (``run_pod(host_network=False)``):
the runtime gets Debian's CNI plugins (bridge, host-local, loopback) and a bridge of its own
(``nrq<pid>b<n>``) on a /27 claimed from the test-only 198.18.0.0/24 (``testkit.subnets``), with
host-local's state under the base folder. Teardown also deletes the bridge, the pods' network
namespaces if containerd could not, libcni's cached results for our network, and puts
ip_forward back as it was (the bridge plugin turns it on) once no other claim needs it.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import itertools
import json
import os
import re
import selectors
import signal
import subprocess
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from testkit import images, subnets
from testkit.cri import CRI, msg
from testkit.kubelet import Kubelet, Resources, container_resources, qos_class

ROOT = Path(__file__).resolve().parent.parent
CGROUP_FS = Path("/sys/fs/cgroup")
_seq = itertools.count()
CNI_PLUGINS = Path("/usr/lib/cni")  # Debian's containernetworking-plugins
CNI_CACHE = Path("/var/lib/cni/results")  # libcni's default cache (containerd 1.7 sets none)
POD_NETWORK, NODE_NETWORK = 0, 2  # runtime.v1.NamespaceMode


RUNTIMES = ("1.7", "2.1", "2.4")
NEWEST = RUNTIMES[-1]


def selected() -> str:
    """The runtime line chosen by ``NRIPLUGIN_RUNTIME`` (default: the newest)."""
    line = os.environ.get("NRIPLUGIN_RUNTIME", "") or NEWEST
    if line not in RUNTIMES:
        raise ValueError(f"NRIPLUGIN_RUNTIME={line!r}: expected one of {', '.join(RUNTIMES)}")
    return line


def install(line: str | None = None, progress: TextIO | None = None, timeout: float = 3600) -> Path:
    """Run testkit/install.sh for ``line`` (default: :func:`selected`; cached) and return the
    unpacked package root. ``progress``: where the script's progress lines go as they come (the
    demo: its terminal); the end of them is in the error either way."""
    line = line or selected()
    proc = subprocess.Popen(
        ["bash", str(ROOT / "testkit" / "install.sh"), line], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    out, err = bytearray(), bytearray()
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ, out)
        sel.register(proc.stderr, selectors.EVENT_READ, err)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                proc.kill()
                proc.wait()
                raise RuntimeError(f"testkit/install.sh {line}: no end after {timeout:.0f} s:\n{err[-3000:].decode()}")
            for key, _ in sel.select(left):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                key.data.extend(chunk)
                if key.data is err and progress is not None:
                    progress.write(chunk.decode(errors="replace"))
                    progress.flush()
    proc.stdout.close()
    proc.stderr.close()
    if proc.wait() != 0:
        raise RuntimeError(f"testkit/install.sh {line} failed:\n{err[-3000:].decode(errors='replace')}")
    return Path(out.decode().strip().splitlines()[-1])


@dataclass(frozen=True)
class Runtime:
    """What an installed containerd is, asked once (``containerd --version``), and the
    behaviour of its line that tests assert (documented by containerd/nri per version)."""

    version: str  # e.g. "1.7.24", "2.1.9", "2.4.2"

    @classmethod
    def of(cls, pkg_root: Path) -> Runtime:
        out = subprocess.run(
            [str(pkg_root / "usr" / "bin" / "containerd"), "--version"], capture_output=True, text=True, timeout=30
        ).stdout
        m = re.search(r"\sv?(\d+\.\d+\.\d+)", out)
        if m is None:
            raise RuntimeError(f"cannot tell containerd's version from {out!r}")
        return cls(m.group(1))

    @property
    def major_minor(self) -> tuple[int, int]:
        major, minor = self.version.split(".")[:2]
        return int(major), int(minor)

    @property
    def line(self) -> str:
        return "{}.{}".format(*self.major_minor)

    @property
    def syncs_preregistered(self) -> bool:
        """containerd 1.7 (NRI v0.6) sends a pre-registered plugin no Synchronize; 2.x does."""
        return self.major_minor >= (2, 0)

    @property
    def kills_closed_plugins(self) -> bool:
        """NRI >= v0.7 (containerd 2.x) kills a plugin it launched once its connection closes;
        1.7 leaves the process alone."""
        return self.major_minor >= (2, 0)

    @property
    def safe_plugin_updates(self) -> bool:
        """containerd 2.4 (NRI v0.12.3) takes a plugin's UpdateContainers without its adaptation
        lock; 1.7 (v0.6.1) and 2.1 (v0.8.0) hold it while taking the runtime's, the reverse of
        every container event, and can deadlock (containerd#13733, fixed in NRI v0.12.1)."""
        return self.major_minor >= (2, 4)

    @property
    def config_version(self) -> int:
        return 3 if self.major_minor >= (2, 0) else 2


# What every line's config says alike: the sockets, the opt folder and NRI.
_SERVICES = """\
[grpc]
  address = "{base}/containerd.sock"

[ttrpc]
  address = "{base}/containerd.sock.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{base}/opt"

[plugins."io.containerd.nri.v1.nri"]
  disable = {nri_disable}
  disable_connections = false
  plugin_config_path = "{base}/nri/conf.d"
  plugin_path = "{base}/nri/plugins"
  plugin_registration_timeout = "5s"
  plugin_request_timeout = "2s"
  socket_path = "{base}/nri/nri.sock"
"""

CONFIG = (
    """\
version = 2
root = "{base}/root"
state = "{base}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
                    "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

"""
    + _SERVICES
    + """
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{base}/cni/bin"
    conf_dir = "{base}/cni/conf"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        Root = "{base}/runc"
        SystemdCgroup = {systemd}
"""
)


# containerd 2.x reads version 2 by migrating it (and logs that it did); it gets its own
# version 3 layout: the CRI plugin split into images, runtime and the gRPC server.
CONFIG_V3 = (
    """\
version = 3
root = "{base}/root"
state = "{base}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
                    "io.containerd.snapshotter.v1.erofs", "io.containerd.differ.v1.erofs",
                    "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

"""
    + _SERVICES
    + """
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{pause}"

[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{base}/cni/bin"]
    conf_dir = "{base}/cni/conf"
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        Root = "{base}/runc"
        SystemdCgroup = {systemd}

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""
)


@dataclass
class Containerd:
    pkg_root: Path
    base: Path
    nri: bool = True
    tmpfs: bool = False  # root on a tmpfs: takes disk fsync noise out of latency benchmarks
    cni: bool = False  # a bridge network: pods may have their own network namespace
    cgroup_root: str = field(default_factory=lambda: f"nriplugin-e2e-{os.getpid()}-{next(_seq)}")
    net_name: str = field(default_factory=lambda: f"nrq{os.getpid()}b{next(_seq)}")  # bridge + CNI network
    subnet: ipaddress.IPv4Network | None = None  # claimed when the runtime is configured
    netns_paths: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    cri: CRI | None = None
    runc: Path | None = None  # the OCI runtime binary; default: the installed line's (bookworm's 1.1.5)
    extra_config: str = ""  # TOML tables appended to the config (e.g. NRI's default validator)
    # runc's systemd cgroup driver (needs systemd as PID 1: the VM lane's systemd guest); pods
    # get kubelet's slice names, under kubepods.slice (systemd's, not under cgroup_root)
    systemd: bool = False
    # a test-side kubelet (testkit/kubelet.py) on cgroup_root: when set, every pod's group is
    # made and removed by it (with kubelet's pod-level values) and it counts the pod in the
    # QoS-class groups it rewrites
    kubelet: Kubelet | None = None

    @property
    def runtime(self) -> Runtime:
        """What this containerd is (asked once per package root)."""
        return runtime_of(self.pkg_root)

    @property
    def address(self) -> str:
        return str(self.base / "containerd.sock")

    @property
    def nri_socket(self) -> str:
        return str(self.base / "nri" / "nri.sock")

    @property
    def plugin_dir(self) -> Path:
        return self.base / "nri" / "plugins"

    @property
    def bin_dir(self) -> Path:
        return self.pkg_root / "usr" / "bin"

    def env(self) -> dict[str, str]:
        path = f"{self.bin_dir}:{self.pkg_root / 'usr' / 'sbin'}:/usr/sbin:/usr/bin:/sbin:/bin"
        return {"PATH": path, "HOME": os.environ.get("HOME", "/root")}

    def write_config(self) -> Path:
        if self.tmpfs and not os.path.ismount(self.base / "root"):
            (self.base / "root").mkdir(parents=True, exist_ok=True)
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", "size=4g,mode=0700", "nriplugin-bench", str(self.base / "root")],
                check=True,
            )
        for d in ("root", "state", "opt", "nri/conf.d", "nri/plugins", "cni/bin", "cni/conf", "runc", "logs"):
            (self.base / d).mkdir(parents=True, exist_ok=True)
        if self.cni:
            self.setup_cni()
        cfg = self.base / "config.toml"
        template = CONFIG_V3 if self.runtime.config_version == 3 else CONFIG
        cfg.write_text(
            template.format(
                base=self.base,
                nri_disable=str(not self.nri).lower(),
                pause=images.PAUSE,
                runc=self.runc or self.pkg_root / "usr" / "sbin" / "runc",
                systemd=str(self.systemd).lower(),
            )
            + self.extra_config
        )
        return cfg

    def setup_cni(self) -> None:
        """Link the CNI plugins, claim a subnet, make our bridge with its gateway address (so
        the slot shows in the kernel's routes at once) and write the conflist."""
        if self.subnet is not None:
            return
        missing = [p for p in ("bridge", "host-local", "loopback") if not (CNI_PLUGINS / p).is_file()]
        if missing:
            raise RuntimeError(f"CNI plugins {missing} not in {CNI_PLUGINS}: install containernetworking-plugins")
        for p in ("bridge", "host-local", "loopback"):
            link = self.base / "cni" / "bin" / p
            if not link.exists():
                link.symlink_to(CNI_PLUGINS / p)
        self.subnet = subnets.claim(self.net_name, subnets.PODS, 27)
        gw = f"{self.subnet[1]}/{self.subnet.prefixlen}"
        ip("link", "add", "name", self.net_name, "type", "bridge")
        ip("addr", "add", gw, "dev", self.net_name)
        ip("link", "set", self.net_name, "up")
        conf = {
            "cniVersion": "1.0.0",
            "name": self.net_name,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.net_name,
                    "isGateway": True,
                    "ipMasq": False,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": str(self.subnet), "gateway": str(self.subnet[1])}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.base / "cni" / "ipam"),
                    },
                }
            ],
        }
        (self.base / "cni" / "conf" / "10-nriplugin-e2e.conflist").write_text(json.dumps(conf, indent=1))

    def teardown_cni(self) -> None:
        """Remove what CNI left if containerd could not (it was killed): pod network
        namespaces (their veths go with them), our bridge, libcni's cache; release the claim."""
        if self.subnet is None:
            return
        for path in self.netns_paths:
            if os.path.exists(path):
                subprocess.run(["umount", path], check=False, capture_output=True)
                with contextlib.suppress(OSError):
                    os.unlink(path)
        subprocess.run(["ip", "link", "del", self.net_name], check=False, capture_output=True)
        for cached in CNI_CACHE.glob(f"{self.net_name}-*"):
            cached.unlink(missing_ok=True)
        subnets.release(self.net_name)
        self.subnet = None

    def start(self, timeout: float = 60.0) -> None:
        cfg = self.write_config()
        log = open(self.base / "logs" / "containerd.log", "ab")  # noqa: SIM115 - lives as long as the process
        procs = self.process_cgroup() / "cgroup.procs"
        # containerd joins its own cgroup before it starts: whatever it launches (plugins, the
        # supervisors' successors, shims) stays in there whoever its parent is later.
        join = 'echo $$ > "$0" && exec "$@"'
        self.proc = subprocess.Popen(
            ["sh", "-c", join, str(procs), str(self.bin_dir / "containerd"), "--config", str(cfg)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env(),
            start_new_session=True,
        )
        log.close()
        self.cri = CRI(self.address)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                tail = (self.base / "logs" / "containerd.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"containerd exited with {self.proc.returncode}; its log ends:\n{tail}")
            try:
                answer = self.cri.call("Version", msg("VersionRequest"), timeout=2).runtime_version
                # CRI answers Version before the image service is ready; wait for that too.
                self.cri.call("ListImages", msg("ListImagesRequest"), timeout=2)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        if self.runtime.version not in answer:  # what runs is what the tests think runs
            raise RuntimeError(f"CRI says containerd {answer}, `containerd --version` {self.runtime.version}")

    def process_cgroup(self) -> Path:
        """This runtime's process cgroup: in the v1 pids hierarchy (no limit is set) or the v2
        tree, under our top-level cgroup; made if needed."""
        for tree in (CGROUP_FS / "pids", CGROUP_FS / "unified", CGROUP_FS):
            if (tree / "cgroup.procs").exists():
                d = tree / self.cgroup_root / "runtime"
                d.mkdir(parents=True, exist_ok=True)
                return d
        raise RuntimeError(f"no pids or cgroup v2 hierarchy under {CGROUP_FS}")

    def processes(self) -> list[int]:
        """Every process the runtime started and still running (containerd, its plugins and
        what they started, shims), by their cgroup."""
        for tree in (CGROUP_FS / "pids", CGROUP_FS / "unified", CGROUP_FS):
            procs = tree / self.cgroup_root / "runtime" / "cgroup.procs"
            if procs.exists():
                return [int(p) for p in procs.read_text().split()]
        return []

    def kill_processes(self, timeout: float = 10.0) -> None:
        """SIGKILL, by pid, every process left in the runtime's cgroup, until none is left."""
        deadline = time.monotonic() + timeout
        while pids := self.processes():
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                raise RuntimeError(f"processes left in {self.cgroup_root}/runtime: {pids}")
            time.sleep(0.05)

    def ctr(self, *args: str) -> str:
        r = subprocess.run(
            [str(self.bin_dir / "ctr"), "--address", self.address, "--namespace", "k8s.io", *args],
            capture_output=True,
            text=True,
            env=self.env(),
            timeout=120,
        )
        if r.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args)} failed: {r.stderr}")
        return r.stdout

    def import_images(self) -> None:
        have = self.ctr("images", "ls", "-q")
        busybox = self.pkg_root / "bin" / "busybox"
        for name, entry in (
            (images.PAUSE, ["/bin/sleep", "2147483647"]),
            (images.WORKLOAD, ["/bin/sleep", "2147483647"]),
        ):
            if name in have.split():
                continue
            archive = images.oci_archive(busybox, name, entry, self.base / f"{name.rsplit('/', 1)[1]}.tar")
            self.ctr("images", "import", str(archive))

    def stop(self, timeout: float = 20.0, kill: bool = False) -> None:
        """Stop containerd only (containers keep running in their shims, as in production);
        ``kill``: SIGKILL, as a crash or the OOM killer would."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.cri is not None:
            self.cri.close()
            self.cri = None
        self.proc = None

    def remove_pod(self, pod: Pod) -> None:
        """StopPodSandbox and RemovePodSandbox, then the pod's own cgroup, as kubelet does when
        a pod goes."""
        assert self.cri is not None
        self.cri.call("StopPodSandbox", msg("StopPodSandboxRequest", pod_sandbox_id=pod.id))
        self.cri.call("RemovePodSandbox", msg("RemovePodSandboxRequest", pod_sandbox_id=pod.id))
        if self.kubelet is not None:
            self.kubelet.remove_pod(pod.uid)
        if not self.systemd:
            for hierarchy in CGROUP_FS.iterdir():
                with contextlib.suppress(OSError):
                    (hierarchy / pod.config.linux.cgroup_parent.lstrip("/")).rmdir()

    def remove_all_pods(self) -> None:
        assert self.cri is not None
        pods = self.cri.call("ListPodSandbox", msg("ListPodSandboxRequest")).items
        for p in pods:
            with contextlib.suppress(Exception):
                self.cri.call("StopPodSandbox", msg("StopPodSandboxRequest", pod_sandbox_id=p.id))
            with contextlib.suppress(Exception):
                self.cri.call("RemovePodSandbox", msg("RemovePodSandboxRequest", pod_sandbox_id=p.id))
        self.remove_pod_cgroups()

    def remove_pod_cgroups(self) -> None:
        """kubelet's part after the pods' sandboxes are gone (the runtime leaves each pod's own
        group): every empty ``pod<uid>`` group under our kubepods (cgroupfs driver) is removed.
        A left group kept its CFS quota, which a later cut of BE's group below it would be
        refused for (cgroup v1)."""
        if self.systemd or not self.cgroup_root:
            return
        for top in cgroup_dirs(self.cgroup_root):
            for qos in ("kubepods/besteffort", "kubepods/burstable", "kubepods"):
                for d in (top / qos).glob("pod*"):
                    with contextlib.suppress(OSError):
                        d.rmdir()  # only an empty group goes: one with a container or a task stays

    def teardown(self) -> None:
        """Remove everything this runtime created; safe to call more than once."""
        if self.kubelet is not None:
            self.kubelet.stop()  # no rewrite of a group while it is removed below
        if self.proc is not None and self.proc.poll() is None and self.cri is not None:
            with contextlib.suppress(Exception):
                self.remove_all_pods()
        self.stop()
        for pidfile in (self.base / "state").glob("io.containerd.runtime.v2.task/*/*/shim.pid"):
            with contextlib.suppress(ValueError, OSError):
                os.kill(int(pidfile.read_text().strip()), signal.SIGKILL)
        for pidfile in (self.base / "state").glob("io.containerd.runtime.v2.task/*/*/init.pid"):
            with contextlib.suppress(ValueError, OSError):
                os.kill(int(pidfile.read_text().strip()), signal.SIGKILL)
        time.sleep(0.2)
        self.kill_processes()
        unmount_under(self.base)
        self.teardown_cni()
        remove_cgroups(self.cgroup_root)
        subprocess.run(["rm", "-rf", "--one-file-system", str(self.base)], check=False)

    # CRI helpers -----------------------------------------------------------------------------

    def pod_parent(self, qos: str, uid: str) -> str:
        """kubelet's cgroup parent for a pod: ``/<cgroup_root>/kubepods/besteffort/pod<uid>``
        (cgroupfs driver), ``kubepods-besteffort-pod<uid_>.slice`` (systemd driver)."""
        if self.systemd:
            sub = {"BestEffort": "besteffort-", "Burstable": "burstable-", "Guaranteed": ""}[qos]
            return f"kubepods-{sub}pod{uid.replace('-', '_')}.slice"
        sub = {"BestEffort": "besteffort/", "Burstable": "burstable/", "Guaranteed": ""}[qos]
        return f"/{self.cgroup_root}/kubepods/{sub}pod{uid}"

    def run_pod(
        self,
        name: str,
        k8s_qos: str | None = None,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
        host_network: bool = True,
        containers: Mapping[str, Resources] | None = None,
    ) -> Pod:
        """A pod sandbox; ``host_network=False`` (needs ``cni=True``) gives it its own network
        namespace, whose path and address are in the returned ``Pod``.

        ``containers`` (name -> requests and limits) is the pod's spec, as kubelet knows it: the
        QoS class follows from it (``k8s_qos``, if given, must agree), its containers get
        kubelet's values (:meth:`create_container`), and with :attr:`kubelet` set the pod's
        group is made first with kubelet's pod-level values. Without it: ``k8s_qos`` (Burstable
        by default) and the values each container is given."""
        assert self.cri is not None
        if not host_network and not self.cni:
            raise ValueError("a pod network namespace needs Containerd(cni=True)")
        qos = k8s_qos or "Burstable"
        if containers is not None:
            qos = qos_class(containers.values())
            if k8s_qos is not None and k8s_qos != qos:
                raise ValueError(f"pod {name}: its containers make it {qos}, not {k8s_qos}")
        uid = str(uuid.uuid4())
        cfg = msg("PodSandboxConfig")
        cfg.metadata.name, cfg.metadata.uid, cfg.metadata.namespace = name, uid, "default"
        cfg.log_directory = str(self.base / "logs" / name)
        cfg.labels.update({"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": "default", **(labels or {})})
        cfg.annotations.update(annotations or {})
        cfg.linux.cgroup_parent = self.pod_parent(qos, uid)
        cfg.linux.security_context.namespace_options.network = NODE_NETWORK if host_network else POD_NETWORK
        spec = dict(containers) if containers is not None else None
        if self.kubelet is not None:
            if self.systemd:
                raise ValueError("the test kubelet lays pods out for the cgroupfs driver only")
            self.kubelet.add_pod(uid, qos, spec)
        try:
            pod_id = self.cri.call("RunPodSandbox", msg("RunPodSandboxRequest", config=cfg)).pod_sandbox_id
        except BaseException:
            if self.kubelet is not None:
                self.kubelet.remove_pod(uid)
            raise
        if host_network:
            return Pod(pod_id, cfg, containers=spec)
        st = self.cri.call("PodSandboxStatus", msg("PodSandboxStatusRequest", pod_sandbox_id=pod_id, verbose=True))
        spec_json = json.loads(st.info["info"])["runtimeSpec"]
        netns = next(n["path"] for n in spec_json["linux"]["namespaces"] if n["type"] == "network")
        self.netns_paths.append(netns)
        return Pod(pod_id, cfg, netns=netns, ip=st.status.network.ip, containers=spec)

    def create_container(
        self,
        pod: Pod,
        name: str,
        cpu_shares: int = 0,
        cpu_quota: int = 0,
        memory: int = 0,
        start: bool = True,
        command: list[str] | None = None,
        resources: Resources | None = None,
    ) -> str:
        """A container in ``pod``. Its CPU and memory values are kubelet's for ``resources``, or
        for the pod's spec of a container of this name (``run_pod(containers=...)``), else the
        raw ``cpu_shares``/``cpu_quota``/``memory`` given."""
        assert self.cri is not None
        if resources is None and pod.containers is not None:
            if name not in pod.containers:
                raise ValueError(f"pod {pod.config.metadata.name} has no container {name!r} in its spec")
            resources = pod.containers[name]
        period = 0
        if resources is not None:
            if cpu_shares or cpu_quota or memory:
                raise ValueError("give a container its resources or raw values, not both")
            cpu_shares, cpu_quota, period, memory = container_resources(resources)
        c = container_config(name, cpu_shares, cpu_quota, memory, command, period)
        c.linux.security_context.namespace_options.network = pod.config.linux.security_context.namespace_options.network
        req = msg("CreateContainerRequest", pod_sandbox_id=pod.id, config=c, sandbox_config=pod.config)
        cid: str = self.cri.call("CreateContainer", req).container_id
        if start:
            self.cri.call("StartContainer", msg("StartContainerRequest", container_id=cid))
        return cid

    def container_cgroup(self, pod: Pod, cid: str, controller: str = "cpu") -> Path:
        parent: str = pod.config.linux.cgroup_parent
        return CGROUP_FS / controller / parent.lstrip("/") / cid


@functools.cache
def runtime_of(pkg_root: Path) -> Runtime:
    return Runtime.of(pkg_root)


@dataclass
class Pod:
    id: str
    config: Any
    netns: str | None = None  # its network namespace (bind mount), None on the host network
    ip: str | None = None
    containers: dict[str, Resources] | None = None  # its spec's requests and limits, if given

    @property
    def uid(self) -> str:
        return str(self.config.metadata.uid)


def ip(*args: str) -> None:
    """``ip ARGS`` with a clear error."""
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {r.stderr.strip()}")


def container_config(
    name: str,
    cpu_shares: int = 0,
    cpu_quota: int = 0,
    memory: int = 0,
    command: list[str] | None = None,
    cpu_period: int = 0,
) -> Any:
    c = msg("ContainerConfig")
    c.metadata.name = name
    c.image.image = images.WORKLOAD
    c.command.extend(command or ["/bin/sleep", "2147483647"])
    c.log_path = f"{name}.log"
    r = c.linux.resources
    r.cpu_shares, r.cpu_quota, r.memory_limit_in_bytes = cpu_shares, cpu_quota, memory
    if cpu_period or cpu_quota:
        r.cpu_period = cpu_period or 100000  # kubelet gives every container the period
    c.linux.security_context.namespace_options.network = 2
    return c


def read_cgroup(path: Path, name: str) -> str:
    return (path / name).read_text().strip()


def unmount_under(base: Path) -> None:
    prefix = str(base.resolve()) + "/"
    mounts = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4].replace("\\040", " ")
            if mp.startswith(prefix):
                mounts.append(mp)
    for mp in sorted(mounts, key=len, reverse=True):
        subprocess.run(["umount", "-l", mp], check=False, capture_output=True)


def cgroup_dirs(top: str) -> list[Path]:
    """Our top-level cgroup in every mounted hierarchy (v1 controllers and the v2 one)."""
    if not top or "/" in top or top in (".", ".."):
        raise ValueError(f"refusing cgroup name {top!r}")
    return [h / top for h in CGROUP_FS.iterdir() if (h / top).is_dir()]


def remove_cgroups(top: str) -> None:
    """rmdir our cgroup subtree in every hierarchy, deepest first."""
    for root in cgroup_dirs(top):
        dirs = sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
        for d in [*dirs, root]:
            with contextlib.suppress(OSError):
                d.rmdir()
