"""What a BE container is born with through the runtime's NRI, on a real containerd and a runc
new enough to apply it (1.2+ sets ``process.scheduler`` and ``process.ioPriority``; the
harness's Debian runc 1.1.5 ignores them, so this test runs on runc built by
``testkit/build_runc.sh``).

Each runtime line is held to what its NRI carries (docs/nri-versions.md): containerd 2.4 (NRI
v0.12) gives a BE container IO priority class idle and the policy's ``oom_score_adj``; 2.1 (NRI
v0.8) the ``oom_score_adj`` only; 1.7 (NRI v0.6.1) neither. SCHED_IDLE (policy 5) a BE
container has on every line: NRI carries it on 2.4, and elsewhere the agent sets it on the
init process at StartContainer, before the workload runs. An LS container keeps what CRI asked
for on every line."""

from __future__ import annotations

import ctypes
import json
import os
import platform
import re
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import grpc
import pytest

from testkit import containerd as harness
from testkit.cri import msg
from testkit.plugin import PluginProcess, until

ROOT = Path(__file__).resolve().parent.parent
BE = {"koordinator.sh/qosClass": "BE"}
LS = {"koordinator.sh/qosClass": "LS"}
SCHED_OTHER, SCHED_IDLE = 0, 5
IOPRIO_CLASS_NONE, IOPRIO_CLASS_IDLE = 0, 3
IOPRIO_WHO_PROCESS = 1
SYS_IOPRIO_GET = {"x86_64": 252, "aarch64": 31}
# What each line's NRI carries for BE (scheduler v0.11, IO priority v0.10, oom_score_adj v0.8).
CARRIES = {(1, 7): (False, False, False), (2, 1): (False, False, True), (2, 4): (True, True, True)}


class Born(NamedTuple):
    policy: int  # sched_getscheduler
    io_class: int  # ioprio_get's class (IOPRIO_CLASS_*)
    oom_score_adj: int


def containerd_version(rt: harness.Containerd) -> tuple[str, tuple[int, int]]:
    """The runtime's version and line, as ``containerd --version`` says."""
    out = subprocess.run(
        [str(rt.pkg_root / "usr" / "bin" / "containerd"), "--version"], capture_output=True, text=True, timeout=30
    ).stdout
    m = re.search(r"\sv?((\d+)\.(\d+)\.\d+)", out)
    if m is None:
        pytest.fail(f"cannot tell containerd's version from {out!r}")
    return m[1], (int(m[2]), int(m[3]))


def ioprio_class(pid: int) -> int:
    nr = SYS_IOPRIO_GET.get(platform.machine())
    if nr is None:
        pytest.fail(f"no ioprio_get syscall number known for {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    prio = libc.syscall(nr, IOPRIO_WHO_PROCESS, pid)
    if prio < 0:
        raise OSError(ctypes.get_errno(), f"ioprio_get({pid})")
    return int(prio) >> 13  # IOPRIO_CLASS_SHIFT


def born(rt: harness.Containerd, pod: harness.Pod, cid: str) -> Born:
    """The container's first process as the kernel sees it."""
    procs = rt.container_cgroup(pod, cid, "cpu") / "cgroup.procs"
    until(lambda: procs.read_text().split(), 10, f"no process in {procs}")
    pid = int(procs.read_text().split()[0])
    return Born(os.sched_getscheduler(pid), ioprio_class(pid), int(Path(f"/proc/{pid}/oom_score_adj").read_text()))


def test_be_is_born_idle_ls_untouched(
    new_runc_runtime: harness.Containerd, plugin_factory: Callable[..., PluginProcess]
) -> None:
    rt = new_runc_runtime
    version, line = containerd_version(rt)
    if line not in CARRIES:
        pytest.fail(f"containerd {version}: no expectation for this line (add it to CARRIES)")
    _sched, io, oom = CARRIES[line]
    plugin_factory(rt)
    be = rt.run_pod("batch", "BestEffort", BE)
    ls = rt.run_pod("web", "Burstable", LS)
    be_born = born(rt, be, rt.create_container(be, "main", cpu_shares=2))
    ls_born = born(rt, ls, rt.create_container(ls, "main", cpu_shares=512))
    assert be_born == Born(
        SCHED_IDLE,  # carried by NRI where ``sched``, else set by the agent at StartContainer
        IOPRIO_CLASS_IDLE if io else IOPRIO_CLASS_NONE,
        1000 if oom else ls_born.oom_score_adj,  # the policy's default; else what CRI asked (as LS)
    ), f"containerd {version}"
    assert ls_born.policy == SCHED_OTHER and ls_born.io_class == IOPRIO_CLASS_NONE
    assert ls_born.oom_score_adj != 1000


def test_containers_get_the_policys_pids_limit(
    runtime: harness.Containerd, plugin_factory: Callable[..., PluginProcess], tmp_path: Path
) -> None:
    """Every line: the container's pids.max is the policy's value for its class — carried by
    NRI's LinuxResources.pids on 2.x (NRI v0.8+), written by the agent at StartContainer on
    1.7 (NRI v0.6.1, cgroup v1) — and the agent says which path is in force."""
    policy = tmp_path / "policy.yaml"
    policy.write_text("containerPidsLimit: {beClass: 321, lsClass: 4321}\n")
    plugin = plugin_factory(runtime, "--policy", str(policy))
    be = runtime.run_pod("batch", "BestEffort", BE)
    ls = runtime.run_pod("web", "Burstable", LS)
    for pod, cid, want in (
        (be, runtime.create_container(be, "main", cpu_shares=2), "321"),
        (ls, runtime.create_container(ls, "main", cpu_shares=512), "4321"),
    ):
        pids_max = runtime.container_cgroup(pod, cid, "pids") / "pids.max"
        assert pids_max.read_text().strip() == want  # at once: before CRI's StartContainer returned
    via_nri = runtime.runtime.major_minor >= (2, 0)
    path = "in force through NRI (LinuxResources.pids" if via_nri else "written by the agent at StartContainer"
    assert path in plugin.logs(), plugin.logs()[-2000:]


def test_required_plugins_refuse_containers_while_the_agent_is_down(
    runtime_line: harness.Runtime,
    pkg_root: Path,
    plugin_factory: Callable[..., PluginProcess],
) -> None:
    """Fail-closed deployment (docs/deploy.md): containerd 2.2+'s default NRI validator with
    ``required_plugins = ["nriplugin"]`` refuses a container while nriplugin is not
    connected, and creates it once it is. Lines before 2.2 have no validator: the container
    starts without the agent, as it always did (the only behaviour they have)."""
    validator = runtime_line.major_minor >= (2, 2)
    table = '[plugins."io.containerd.nri.v1.nri".default_validator]'
    extra = f'\n{table}\n  enable = true\n  required_plugins = ["nriplugin"]\n' if validator else ""
    rt = harness.Containerd(pkg_root, Path(tempfile.mkdtemp(prefix="nriplugin-e2e-")), extra_config=extra)
    try:
        rt.start()
        rt.import_images()
        pod = rt.run_pod("web", "Burstable", LS)
        if validator:
            with pytest.raises(Exception, match="nriplugin"):
                rt.create_container(pod, "early", cpu_shares=512)
        else:
            rt.create_container(pod, "early", cpu_shares=512)
        plugin_factory(rt)
        cid = rt.create_container(pod, "main", cpu_shares=512)
        assert (rt.container_cgroup(pod, cid) / "cpu.shares").read_text().strip() == "512"
    finally:
        rt.teardown()
    assert not harness.cgroup_dirs(rt.cgroup_root), f"cgroups left: {harness.cgroup_dirs(rt.cgroup_root)}"


def test_a_pod_level_resize_reaches_the_agent_where_the_runtime_tells_it(
    runtime: harness.Containerd, plugin_factory: Callable[..., PluginProcess]
) -> None:
    """CRI UpdatePodSandboxResources (what the kubelet calls after a pod-level in-place resize)
    on an LS pod: a runtime that implements the call passes it to the agent as UpdatePodSandbox
    and PostUpdatePodSandbox (2.4 here); one that does not answers Unimplemented and tells no
    plugin (1.7, 2.1; 2.2.10 too, under a real kubelet, though its NRI has the event). Either
    way the pod's containers keep running with their values, and the agent claims "followed"
    only once the event came."""
    plugin = plugin_factory(runtime)
    pod = runtime.run_pod("web", "Burstable", LS)
    cid = runtime.create_container(pod, "main", cpu_shares=512, cpu_quota=100000)
    assert runtime.cri is not None
    res = msg("LinuxContainerResources", cpu_shares=512, cpu_quota=50000, cpu_period=100000)
    req = msg("UpdatePodSandboxResourcesRequest", pod_sandbox_id=pod.id, resources=res)
    try:
        runtime.cri.call("UpdatePodSandboxResources", req)
        answered = True
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.UNIMPLEMENTED, exc
        answered = False
    told = answered
    assert answered == (runtime.runtime.major_minor >= (2, 4)), "the lines in CI: only 2.4 implements it"
    count = 'nriplugin_hook_duration_seconds_count{event="%s"}'
    if told:
        until(lambda: plugin.metric(count % "post_update_pod_sandbox") >= 1, 5, "PostUpdatePodSandbox not seen")
        assert plugin.metric(count % "update_pod_sandbox") >= 1
        assert "pod-level resize: followed (UpdatePodSandbox seen since" in plugin.logs(), plugin.logs()[-3000:]
    else:
        time.sleep(0.5)
        assert plugin.metric(count % "update_pod_sandbox") == 0
        assert "pod-level resize: followed" not in plugin.logs(), plugin.logs()[-3000:]
    assert (runtime.container_cgroup(pod, cid) / "cpu.shares").read_text().strip() == "512"


# An OCI runtime in front of runc that keeps the spec runc is given, minus ``linux.intelRdt``
# (this machine has no resctrl: runc would refuse the container), then runs runc.
RECORDING_RUNC = """#!/bin/sh
bundle=""
prev=""
for a in "$@"; do
  [ "$prev" = "--bundle" ] || [ "$prev" = "-b" ] && bundle=$a
  prev=$a
done
if [ -n "$bundle" ] && [ -f "$bundle/config.json" ]; then
  /usr/bin/python3 - "$bundle/config.json" "{record}" <<'PY' || exit 1
import json, os, sys
spec = json.load(open(sys.argv[1]))
with open(os.path.join(sys.argv[2], os.path.basename(os.path.dirname(sys.argv[1])) + ".json"), "w") as f:
    json.dump(spec, f)
if spec.get("linux", {{}}).pop("intelRdt", None) is not None:
    with open(sys.argv[1], "w") as f:
        json.dump(spec, f)
PY
fi
exec "{runc}" "$@"
"""


def test_the_runtime_places_a_be_container_in_its_resctrl_group_where_nri_carries_it(
    runtime_line: harness.Runtime, pkg_root: Path, plugin_factory: Callable[..., PluginProcess], tmp_path: Path
) -> None:
    """resctrl for BE on (a resctrl tree laid out like the kernel's: this machine has none).
    Where the runtime's NRI carries ``LinuxRdt`` (v0.11+: containerd 2.2.1 and later) the
    container's OCI spec names the class's CLOS with its schemata, so runc puts the task in the
    group before it runs, and the agent writes no task; on older lines the spec has no
    ``intelRdt`` and the agent joins the container's process at StartContainer."""
    from testkit.kernel_tree import resctrl_tree

    resctrl = resctrl_tree(tmp_path / "resctrl")
    group = resctrl / "koordlet-BE"
    group.mkdir()
    (group / "tasks").write_text("")  # the kernel makes it with the group
    record = tmp_path / "specs"
    record.mkdir()
    wrapper = tmp_path / "runc"
    wrapper.write_text(RECORDING_RUNC.format(record=record, runc=pkg_root / "usr" / "sbin" / "runc"))
    wrapper.chmod(0o755)
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "resourceQOSStrategy:\n  beClass:\n    resctrlQOS: {enable: true, catRangeEndPercent: 30, mbaPercent: 40}\n"
    )
    rt = harness.Containerd(pkg_root, Path(tempfile.mkdtemp(prefix="nriplugin-e2e-")), runc=wrapper)
    try:
        rt.start()
        rt.import_images()
        plugin = plugin_factory(rt, "--policy", str(policy), "--resctrl-root", str(resctrl))
        be = rt.run_pod("batch", "BestEffort", BE)
        cid = rt.create_container(be, "main", cpu_shares=2)
        procs = rt.container_cgroup(be, cid, "cpu") / "cgroup.procs"
        until(lambda: procs.read_text().split(), 10, f"no process in {procs}")
        pid = int(procs.read_text().split()[0])
        spec = json.loads((record / f"{cid}.json").read_text())
        by_runtime = runtime_line.major_minor >= (2, 3)  # NRI v0.12 here; LinuxRdt since v0.11
        if by_runtime:
            assert spec["linux"]["intelRdt"] == {"closID": "koordlet-BE", "schemata": ["L3:0=f", "MB:0=40"]}
            time.sleep(0.5)  # StartContainer's answer and the agent's turn after it are past
            assert (group / "tasks").read_text() == ""
            assert "placed by the runtime (NRI LinuxRdt" in plugin.logs()
        else:
            assert "intelRdt" not in spec.get("linux", {})
            until(lambda: (group / "tasks").read_text().split() == [str(pid)], 5, "the agent did not join it")
            assert "joined by the agent at StartContainer" in plugin.logs()
        assert (group / "schemata").read_text() == "L3:0=f\nMB:0=40\n"
    finally:
        rt.teardown()
    assert not harness.cgroup_dirs(rt.cgroup_root), f"cgroups left: {harness.cgroup_dirs(rt.cgroup_root)}"
