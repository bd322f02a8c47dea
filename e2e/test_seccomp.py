"""Seccomp on the runc the e2e tests build (``testkit/build_runc.sh``, the ``runc`` fixture).

Under a kubelet every pod sandbox asks for a seccomp profile (containerd 2.2+ gives it
runtime/default), and so does each container that sets one; a runc built without the seccomp
tag refuses them all (``seccomp: config provided but seccomp not supported``). Here a sandbox
with RuntimeDefault starts under a filter runc put on it, a container with RuntimeDefault runs,
and a small Localhost profile blocks the one syscall it names."""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import uuid
from pathlib import Path
from typing import Any

from nriplugin.cri import api_pb2 as cri
from testkit import containerd as harness
from testkit.cri import msg
from testkit.plugin import until

# kill(2) denied with an errno nothing else would give for signal 0 to oneself.
DENY_KILL = {
    "defaultAction": "SCMP_ACT_ALLOW",
    "syscalls": [{"names": ["kill"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS}],
}
PROBE = ["/bin/sh", "-c", "kill -0 $$"]  # the shell's kill builtin: kill(2), signal 0, on itself


def seccomp_of(pid: int) -> tuple[int, int]:
    """The task's seccomp mode (2: filter) and how many filters it has, inherited ones included."""
    fields = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(fields["Seccomp"]), int(fields["Seccomp_filters"])


def run_pod(rt: harness.Containerd, name: str, seccomp: Any) -> harness.Pod:
    """A host-network pod sandbox, as ``Containerd.run_pod`` makes it, with a seccomp profile."""
    assert rt.cri is not None
    uid = str(uuid.uuid4())
    cfg = msg("PodSandboxConfig")
    cfg.metadata.name, cfg.metadata.uid, cfg.metadata.namespace = name, uid, "default"
    cfg.log_directory = str(rt.base / "logs" / name)
    cfg.labels.update({"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": "default"})
    cfg.linux.cgroup_parent = rt.pod_parent("Burstable", uid)
    cfg.linux.security_context.namespace_options.network = harness.NODE_NETWORK
    cfg.linux.security_context.seccomp.CopyFrom(seccomp)
    return harness.Pod(rt.cri.call("RunPodSandbox", msg("RunPodSandboxRequest", config=cfg)).pod_sandbox_id, cfg)


def exit_code(rt: harness.Containerd, pod: harness.Pod, name: str, seccomp: Any) -> int:
    """Run ``PROBE`` in a container with ``seccomp`` and return its exit code."""
    assert rt.cri is not None
    c = harness.container_config(name, command=PROBE)
    c.linux.security_context.seccomp.CopyFrom(seccomp)
    req = msg("CreateContainerRequest", pod_sandbox_id=pod.id, config=c, sandbox_config=pod.config)
    cid = rt.cri.call("CreateContainer", req).container_id
    rt.cri.call("StartContainer", msg("StartContainerRequest", container_id=cid))

    def status() -> Any:
        assert rt.cri is not None
        return rt.cri.call("ContainerStatus", msg("ContainerStatusRequest", container_id=cid)).status

    until(lambda: status().state == cri.CONTAINER_EXITED, 10, f"{name}: still running after 10 s")
    return int(status().exit_code)


def test_the_built_runc_reports_libseccomp(runc: Path) -> None:
    out = subprocess.run([str(runc), "--version"], capture_output=True, text=True, timeout=30, check=True).stdout
    assert re.search(r"^libseccomp: \d+\.\d+\.\d+$", out, re.M), out


def test_seccomp_profiles_are_applied(new_runc_runtime: harness.Containerd, tmp_path: Path) -> None:
    rt = new_runc_runtime
    assert rt.cri is not None
    _, inherited = seccomp_of(os.getpid())  # what every process started from here has already

    pod = run_pod(rt, "web", msg("SecurityProfile", profile_type="RuntimeDefault"))
    st = rt.cri.call("PodSandboxStatus", msg("PodSandboxStatusRequest", pod_sandbox_id=pod.id, verbose=True))
    info = json.loads(st.info["info"])
    assert info["runtimeSpec"]["linux"]["seccomp"]["defaultAction"] == "SCMP_ACT_ERRNO"  # what runc was given
    mode, filters = seccomp_of(int(info["pid"]))
    assert (mode, filters) == (2, inherited + 1), "the sandbox's process has no filter of its own"

    assert exit_code(rt, pod, "default", msg("SecurityProfile", profile_type="RuntimeDefault")) == 0

    profile = tmp_path / "deny-kill.json"
    profile.write_text(json.dumps(DENY_KILL))
    denied = msg("SecurityProfile", profile_type="Localhost", localhost_ref=str(profile))
    assert exit_code(rt, pod, "denied", denied) != 0
    log = Path(pod.config.log_directory, "denied.log").read_text()
    assert os.strerror(errno.ENOSYS) in log, log
