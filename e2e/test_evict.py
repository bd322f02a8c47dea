"""Eviction on the private containerd and this machine's real cgroup v1 tree, with the embedded
default policy and no API server (so through the runtime: CRI StopContainer/StopPodSandbox).

- Memory: the pods root (``<top>/kubepods``) gets a 1 GiB limit, as kubelet's node-allocatable
  cgroup would; a BE pod grows its anonymous memory by about 30 MB/s (busybox ``dd`` holding a
  3 MB buffer while blocked on a pipe, a new one every 0.1 s). MemoryEvict must stop it before
  the kernel has to reclaim at the limit or OOM-kill anything in the root, while an LS pod and a
  quiet BE pod keep running.
- CPU: an LS pod asking for half a core spins four threads next to a BE pod spinning two: a
  sustained EMERGENCY with LS starved. With BE's group not SCHED_IDLE, CPUEvict evicts the
  spinning BE pod and nothing else; with it idle (the default) LS waits for its own threads,
  and no pod is evicted.
- A failing evictor: the agent's CRI socket unreachable, the growing pod's eviction fails; no
  other pod is evicted in its place, and each failed attempt (one per back-off, not per pod)
  is counted and logged once.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest

from testkit.containerd import Containerd, Pod
from testkit.plugin import PluginProcess, until
from testkit.workloads import BE, GROW, LS, SPIN_FOUR, SPIN_TWO, GiB, limit_pods_root, oom_kills, running


def memory_scene(rt: Containerd) -> tuple[Path, dict[str, tuple[Pod, str]]]:
    root = limit_pods_root(rt)
    ls = rt.run_pod("web", "Burstable", LS)
    quiet = rt.run_pod("quiet", "BestEffort", BE)
    grower = rt.run_pod("leaky", "BestEffort", BE)
    pods = {
        "ls": (ls, rt.create_container(ls, "main", cpu_shares=512)),
        "quiet": (quiet, rt.create_container(quiet, "main")),
        "grower": (grower, rt.create_container(grower, "main", command=GROW)),
    }
    return root, pods


def test_a_growing_be_pod_is_evicted_before_the_pods_root_runs_out(
    runtime: Containerd, plugin_factory: Callable[..., PluginProcess]
) -> None:
    limit_pods_root(runtime)  # before the agent starts: it arms its notifications at once
    plugin = plugin_factory(runtime)
    root, pods = memory_scene(runtime)
    usage = root / "memory.usage_in_bytes"
    peak = 0

    def gone() -> bool:
        nonlocal peak
        peak = max(peak, int(usage.read_text()))
        return not running(runtime, pods["grower"][1])

    took = until(gone, 90, f"the growing pod was not evicted (usage {int(usage.read_text()) >> 20} MiB)")
    print(f"evicted after {took:.1f} s; the pods root peaked at {peak >> 20} MiB of 1024")
    assert oom_kills(root) == 0
    assert int((root / "memory.failcnt").read_text()) == 0  # never even at the limit
    assert peak < 0.9 * GiB
    time.sleep(2)  # nothing else follows
    assert running(runtime, pods["ls"][1]) and running(runtime, pods["quiet"][1])
    # over the threshold, growing into the limit within seconds, or the kernel's critical
    # pressure: which the agent sees first depends on timing; either way one MemoryEvict eviction
    counted = 'nriplugin_qos_evictions_total{{dry_run="false",reason="{}",strategy="MemoryEvict"}}'
    assert sum(plugin.metric(counted.format(r)) for r in ("threshold", "oom_risk", "pressure")) == 1
    assert plugin.metric_sum("nriplugin_qos_evictions_total") == 1
    assert "MemoryEvict" in plugin.logs() and "leaky" in plugin.logs()


def test_a_failing_runtime_eviction_evicts_no_one_else(
    runtime: Containerd, plugin_factory: Callable[..., PluginProcess], tmp_path: Path
) -> None:
    limit_pods_root(runtime)
    plugin = plugin_factory(runtime, "--cri-socket", str(tmp_path / "nobody-serves.sock"))  # the last one counts
    _, pods = memory_scene(runtime)
    failures = 'nriplugin_qos_eviction_failures_total{backend="runtime",outcome="error"}'
    until(lambda: plugin.metric(failures) >= 3, 90, "no three failed evictions counted")
    runtime.remove_pod(pods["grower"][0])  # before it reaches the limit: this test's own doing
    time.sleep(1)
    before = plugin.metric(failures)
    lines = [json.loads(ln) for ln in plugin.logs().splitlines() if "nobody else is evicted" in ln]
    after = plugin.metric(failures)
    assert before <= len(lines) <= after  # one line per failed attempt
    assert all("default/leaky" in ln["msg"] and ln["failures"] == i for i, ln in enumerate(lines, 1))
    times = [datetime.fromisoformat(ln["ts"].replace("Z", "+00:00")).timestamp() for ln in lines]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(g >= 0.9 for g in gaps), gaps  # backed off: at most one attempt a round, doubling
    assert gaps[1] >= 1.8
    assert running(runtime, pods["ls"][1]) and running(runtime, pods["quiet"][1])
    assert plugin.metric_sum("nriplugin_qos_evictions_total") == 0
    assert "evicting default/quiet" not in plugin.logs()


def test_dry_run_evicts_nothing(runtime: Containerd, plugin_factory: Callable[..., PluginProcess]) -> None:
    limit_pods_root(runtime, GiB // 4)  # reached in a few seconds
    plugin = plugin_factory(runtime, "--evict-dry-run")
    _, pods = memory_scene(runtime)
    until(lambda: plugin.metric_sum("nriplugin_qos_evictions_total") >= 1, 60, "no dry-run eviction counted")
    assert running(runtime, pods["grower"][1])
    assert 'dry_run="true"' in plugin.get("/metrics")[1]
    assert "dry run: would evict default/leaky" in plugin.logs()


def cpu_scene(rt: Containerd) -> tuple[str, str, str]:
    """LS asking for half a core and spinning four threads, a quiet BE pod, a BE pod spinning two."""
    ls = rt.run_pod("web", "Burstable", LS)
    quiet = rt.run_pod("quiet", "BestEffort", BE)
    spin = rt.run_pod("batch", "BestEffort", BE)
    return (
        rt.create_container(ls, "main", cpu_shares=512, command=SPIN_FOUR),
        rt.create_container(quiet, "main"),
        rt.create_container(spin, "main", command=SPIN_TWO),
    )


@pytest.mark.skipif(len(os.sched_getaffinity(0)) != 2, reason="the figures are for a 2-CPU node")
def test_sustained_emergency_with_ls_starved_evicts_be_work_only(
    runtime: Containerd, plugin_factory: Callable[..., PluginProcess], tmp_path: Path
) -> None:
    """BE's group not SCHED_IDLE (a kernel without cpu.idle, or ``beGroupIdle: false``): BE's
    CPU at its floor is CPU LS waits for, and CPUEvict evicts the spinning BE pod."""
    policy = tmp_path / "policy.yaml"
    policy.write_text("beProcess:\n  schedIdle: false\n")
    plugin = plugin_factory(runtime, "--policy", str(policy))
    ls_c, quiet_c, spin_c = cpu_scene(runtime)
    took = until(lambda: not running(runtime, spin_c), 60, "the spinning BE pod was not evicted", step=0.2)
    print(f"CPUEvict after {took:.1f} s")
    time.sleep(3)
    assert running(runtime, ls_c) and running(runtime, quiet_c)
    assert plugin.metric('nriplugin_qos_evictions_total{dry_run="false",reason="emergency",strategy="CPUEvict"}') == 1
    assert plugin.metric_sum("nriplugin_qos_evictions_total") == 1
    assert "Invalid argument" not in plugin.logs()  # BE cut to its floor, nothing refused


@pytest.mark.skipif(len(os.sched_getaffinity(0)) != 2, reason="the figures are for a 2-CPU node")
def test_ls_starving_itself_beside_an_idle_be_evicts_no_one(
    runtime: Containerd, plugin_factory: Callable[..., PluginProcess]
) -> None:
    """The default (BE's group SCHED_IDLE): the same scene reaches EMERGENCY with LS waiting, but
    its waits are for its own four threads on two CPUs, not BE's (an idle BE gives up the CPU
    the moment an LS task wakes), and evicting BE would not shorten them: no pod is evicted."""
    plugin = plugin_factory(runtime)
    ls_c, quiet_c, spin_c = cpu_scene(runtime)

    def emergency() -> bool:
        return any(
            ln.startswith("nriplugin_qos_pressure_level{")
            and 'resource="cpu"' in ln
            and 'level="EMERGENCY"' in ln
            and ln.endswith(" 1.0")
            for ln in plugin.get("/metrics")[1].splitlines()
        )

    until(emergency, 30, "the scene never reached EMERGENCY")
    time.sleep(8)  # CPUEvict's 2 s sustain, several times over
    assert emergency()
    assert all(running(runtime, c) for c in (ls_c, quiet_c, spin_c))
    assert plugin.metric_sum("nriplugin_qos_evictions_total") == 0
