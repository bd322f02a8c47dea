"""The image from ``image/build.sh``, imported into the private containerd and run through CRI
the way the DaemonSet runs it: host network and host PID, the NRI socket's directory, the
cgroup tree and the CRI socket mounted from the host. Not privileged, every capability
dropped: root in the host's PID namespace with those mounts is all the agent needs for what it
does here (see README, "Deploy"). Host network only so that the test reaches /metrics on
127.0.0.1; the agent itself talks over unix sockets.

The image is built once per test session (build.sh's own cache makes an unchanged tree a few
seconds; a change rebuilds only the layers it touches).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from testkit.containerd import Containerd, read_cgroup
from testkit.cri import msg
from testkit.plugin import build_script, free_port, until

ROOT = Path(__file__).resolve().parent.parent
IMAGE = "docker.io/library/nriplugin:0.1.0"
BE = {"koordinator.sh/qosClass": "BE"}
NODE = 2  # CRI NamespaceMode NODE: the host's namespace


@pytest.fixture(scope="session")
def image_archive(pkg_root: Path) -> Path:
    """Build the image once per session (needs root: buildah, debootstrap)."""
    archive = build_script("build.sh")
    assert archive.is_file(), archive
    return archive


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return 0, ""


def sample(body: str, name: str) -> float:
    for line in body.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def run_agent_container(rt: Containerd, port: int) -> tuple[str, Path]:
    """The DaemonSet's pod, through CRI: returns the container id and its log file."""
    assert rt.cri is not None
    logs = rt.base / "logs" / "nriplugin"
    cfg = msg("PodSandboxConfig")
    cfg.metadata.name, cfg.metadata.uid, cfg.metadata.namespace = "nriplugin", str(uuid.uuid4()), "nriplugin-system"
    cfg.log_directory = str(logs)
    cfg.labels.update({"koordinator.sh/qosClass": "SYSTEM"})  # the agent leaves itself alone
    cfg.linux.cgroup_parent = f"/{rt.cgroup_root}/system/nriplugin"
    ns = cfg.linux.security_context.namespace_options
    ns.network, ns.pid = NODE, NODE  # hostNetwork, hostPID
    pod_id = rt.cri.call("RunPodSandbox", msg("RunPodSandboxRequest", config=cfg)).pod_sandbox_id

    c = msg("ContainerConfig")
    c.metadata.name = "nriplugin"
    c.image.image = IMAGE
    c.args.extend(
        [
            "--socket=/var/run/nri/nri.sock",
            "--cri-socket=/run/containerd/containerd.sock",
            f"--metrics-address=127.0.0.1:{port}",
            f"--pods-root={rt.cgroup_root}/kubepods",
            "--log-format=text",
        ]
    )
    c.log_path = "nriplugin.log"
    for container_path, host_path in (
        ("/var/run/nri", str(rt.base / "nri")),  # the NRI socket and the runtime lock next to it
        ("/sys/fs/cgroup", "/sys/fs/cgroup"),
        ("/run/containerd/containerd.sock", rt.address),
    ):
        c.mounts.append(msg("Mount", container_path=container_path, host_path=host_path))
    sc = c.linux.security_context
    sc.namespace_options.network, sc.namespace_options.pid = NODE, NODE
    sc.capabilities.drop_capabilities.append("ALL")  # root in the host's PID namespace, no capability
    req = msg("CreateContainerRequest", pod_sandbox_id=pod_id, config=c, sandbox_config=cfg)
    cid: str = rt.cri.call("CreateContainer", req).container_id
    rt.cri.call("StartContainer", msg("StartContainerRequest", container_id=cid))
    return cid, logs / "nriplugin.log"


def image_labels(archive: Path) -> dict[str, Any]:
    import tarfile

    with tarfile.open(archive) as t:

        def blob(digest: str) -> Any:
            f = t.extractfile("blobs/sha256/" + digest.split(":", 1)[1])
            assert f is not None
            return json.load(f)

        index = json.load(t.extractfile("index.json"))  # type: ignore[arg-type]
        manifest = blob(index["manifests"][0]["digest"])
        config = blob(manifest["config"]["digest"])
    labels: dict[str, Any] = config["config"]["Labels"]
    assert config["config"]["Entrypoint"] == ["/opt/nriplugin/bin/nriplugin", "run"]
    return labels


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
def test_image_on_containerd(image_archive: Path, runtime: Containerd) -> None:
    labels = image_labels(image_archive)
    assert labels["org.opencontainers.image.version"] == "0.1.0"
    assert labels["org.opencontainers.image.revision"] not in ("", "unknown")
    assert "org.opencontainers.image.source" in labels

    runtime.ctr("images", "import", str(image_archive))
    assert IMAGE in runtime.ctr("images", "ls", "-q").split()
    port = free_port()
    cid, log = run_agent_container(runtime, port)

    def logs() -> str:
        return log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"

    def registered() -> bool:
        code, body = get(port, "/readyz")
        ready = code == 200 and body.startswith("ready")
        return ready and sample(get(port, "/metrics")[1], "nriplugin_registrations_total") >= 1

    until(registered, 60, lambda: f"the agent in the image did not register:\n{logs()}")
    # Really in the container: its process runs the image's Python from /opt/nriplugin.
    assert runtime.cri is not None
    status = runtime.cri.call("ContainerStatus", msg("ContainerStatusRequest", container_id=cid, verbose=True))
    pid = json.loads(status.info["info"])["pid"]
    assert "/opt/nriplugin" in Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    status_lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    assert "CapEff:\t0000000000000000" in status_lines  # no capability at all

    # A new BE pod is adjusted at birth.
    be = runtime.run_pod("be", "BestEffort", BE)
    be_c = runtime.create_container(be, "main", cpu_shares=1024)
    cpu = runtime.container_cgroup(be, be_c)
    assert read_cgroup(cpu, "cpu.shares") == "2"

    # Drift on the host's cgroup files is repaired by the agent in the container.
    (cpu / "cpu.shares").write_text("1024")
    until(lambda: read_cgroup(cpu, "cpu.shares") == "2", 10, lambda: f"drift not repaired:\n{logs()}")

    code, body = get(port, "/metrics")
    assert code == 200
    assert sample(body, 'nriplugin_hook_duration_seconds_count{event="create_container"}') >= 1
    assert sample(body, 'nriplugin_repaired_total{resource="cpu.shares"}') >= 1
    assert sample(body, 'nriplugin_connection_state{state="registered"}') == 1
