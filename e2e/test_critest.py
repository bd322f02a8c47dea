"""The CRI still behaves with the agent registered: cri-tools' ``critest`` gives the same
result, spec by spec, on a private containerd with nriplugin on its NRI socket as without it
(testkit/critest.py runs both; docs/deploy.md, "The CRI with the agent: critest", lists what
runs and what is skipped, and why).

critest is built once and cached by ``bash kind/build.sh critest`` (Go and the module proxy);
without it the test is skipped, and fails under NRIPLUGIN_REQUIRE_PEERS=1 as the other built
prerequisites do. Each run leaves nothing behind: no process, cgroup, mount, network namespace,
bridge or shared memory segment, and its folder (sockets included) is gone.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from testkit import critest
from testkit.containerd import CGROUP_FS

ROOT = Path(__file__).resolve().parent.parent
# Fewer specs ran than this means the run lost what it is for (images, network, the runtime).
ENOUGH = 60


def missing(why: str) -> None:
    if os.environ.get("NRIPLUGIN_REQUIRE_PEERS") == "1":
        pytest.fail(why)
    pytest.skip(why)


@pytest.fixture(scope="session")
def critest_binary(pkg_root: Path) -> Path:
    r = subprocess.run(
        ["bash", str(ROOT / "kind" / "build.sh"), "critest"], capture_output=True, text=True, timeout=3600
    )
    if r.returncode != 0:
        missing(f"bash kind/build.sh critest failed: {r.stderr.strip()[-800:]}")
    return Path(r.stdout.strip().splitlines()[-1])


def host_state() -> dict[str, set[str]]:
    """What a run could leave on the host outside its folder: cgroups (the runtime puts the
    containers of critest's pods, which name no cgroup parent, under /k8s.io; the harness's
    own top-level group is ours by name), network namespaces, mounts of a critest folder,
    shared memory segments."""
    ours = f"nriplugin-e2e-{os.getpid()}-"
    cgroups = {
        str(d)
        for h in CGROUP_FS.iterdir()
        if h.is_dir()
        for d in [*h.glob("k8s.io"), *h.glob("k8s.io/*"), *h.glob(ours + "*")]
        if d.is_dir()
    }
    netns = {p.name for p in Path("/run/netns").iterdir()} if Path("/run/netns").is_dir() else set()
    with open("/proc/self/mountinfo") as f:
        mounts = {ln.split()[4] for ln in f if "nriplugin-critest-" in ln.split()[4]}
    shm = {ln.split()[1] for ln in Path("/proc/sysvipc/shm").read_text().splitlines()[1:]}
    return {"cgroups": cgroups, "netns": netns, "mounts": mounts, "shm": shm}


def test_critest_same_with_and_without_agent(pkg_root: Path, critest_binary: Path, tmp_path: Path) -> None:
    before = host_state()
    without, with_agent, _ = critest.compare(critest_binary, pkg_root, tmp_path)
    after = host_state()

    summary = f"without the agent: {without.summary()}; with it: {with_agent.summary()}"
    diff = critest.differences(without, with_agent)
    assert not diff, (
        f"critest differs with the agent ({summary}):\n"
        + "\n".join(diff)
        + "\n"
        + "\n".join(
            f"{n}: {m}" for n, m in {**without.failures, **with_agent.failures}.items() if any(n in d for d in diff)
        )
    )
    ran = without.ran()
    assert len(ran) >= ENOUGH, f"only {len(ran)} specs ran ({summary})"
    assert sum(s == "passed" for s in ran.values()) >= ENOUGH * 3 // 4, summary
    # The agent was in the path of every pod and container critest made, and answered.
    assert with_agent.agent is not None
    assert with_agent.agent["registrations"] >= 1
    assert with_agent.agent["run_pod_sandbox_hooks"] >= len(ran) // 2, with_agent.agent
    assert with_agent.agent["create_container_hooks"] >= len(ran) // 2, with_agent.agent
    assert with_agent.agent["hook_failures"] == 0, with_agent.agent
    # ... and managed them: each pod was placed where kubelet would put it, under its pods root.
    assert with_agent.placed >= with_agent.agent["run_pod_sandbox_hooks"] * 9 // 10, with_agent.placed
    # Nothing left behind (other work on the host may add; only what appeared is ours to judge).
    left = {k: after[k] - before[k] for k in before}
    left["shm"] = left["shm"] & (with_agent.segments | without.segments)
    assert not any(left.values()), f"left behind: {left}"
    assert not list(Path(tempfile.gettempdir()).glob("nriplugin-critest-*"))
