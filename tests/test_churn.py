"""Pod churn leaves nothing behind: every per-container (and per-pod) structure of the node
model, the desired state and its overlays, the reconciler (entries, watches, fight state), the
cgroup path caches and the QoS collector empties when its container goes.

Driven through the real components on a temp tree laid out like the kernel's cgroup v1
(inotify works there as on cgroupfs): the hook adapter's events, the reconciler with its
watches, the collector's rounds, a QoS overlay and a drift repair per container.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

from nriplugin.kernel.cgroup import Cgroups
from nriplugin.node.assembly import Node
from nriplugin.node.hooks import QoSPlugin
from nriplugin.pacing.turns import Pacer
from nriplugin.qos.collect import Collector
from nriplugin.reconciler import Reconciler
from testkit.kernel_tree import v1_group, v1_tree
from testkit.runtime_peer import make_container, make_pod

CTRLS = ("cpu", "cpuset", "memory", "blkio")
BATCH = (
    '{"containers":{"main":{"requests":{"kubernetes.io/batch-cpu":"500","kubernetes.io/batch-memory":"256Mi"},'
    '"limits":{"kubernetes.io/batch-cpu":"1k","kubernetes.io/batch-memory":"512Mi"}}}}'
)
STATS = {
    "cpu": {"cpuacct.usage": "1000000", "cpu.stat": "nr_periods 10\nnr_throttled 1\nthrottled_time 5"},
    "memory": {"memory.usage_in_bytes": "1048576", "memory.stat": "total_rss 524288\ntotal_cache 4096"},
}


class Churn:
    """A node on a temp tree, and pods that come and go through the hooks, on the running loop
    (``turn``: its turns' length, seconds)."""

    def __init__(self, root: Path, turn: float | None = None) -> None:
        self.root = v1_tree(root, ["kubepods", "kubepods/besteffort", "kubepods/burstable"])
        (root / "cpuacct").symlink_to("cpu")  # as on a host: cpu,cpuacct
        self.node = Node.create(cgroups=Cgroups(root))
        pacer = Pacer(asyncio.get_running_loop(), turn=turn)
        self.plugin = QoSPlugin(self.node, pacer=pacer)
        self.reconciler = Reconciler(
            self.node.desired, self.node.writer, self.node.model, resync_period=3600, roots=["kubepods"], pacer=pacer
        )
        self.collector = Collector(self.node.model, self.node.desired, self.node.cgroups, pacer=pacer)

    def start(self) -> None:
        self.reconciler.start(asyncio.get_running_loop())

    async def settle(self) -> None:
        for _ in range(5):
            await asyncio.sleep(0)
        if self.reconciler._inotify is not None:
            self.reconciler._on_readable()  # events of our own mkdir/rmdir/writes, now

    async def cycle(self, i: int) -> None:
        """One pod with one container: born, started, measured, overlaid, drifted, gone."""
        qos = ("BE", "LS", "LSR")[i % 3]
        sub = "besteffort" if qos == "BE" else "burstable"
        pod = make_pod(i, qos, parent=f"/kubepods/{sub}/pod{i}")
        if qos == "BE":
            pod.annotations["node.koordinator.sh/extended-resource-spec"] = BATCH
        pod.annotations["kubectl.kubernetes.io/last-applied-configuration"] = "{" + "x" * 2000 + "}"
        ctr = make_container(i, pod)
        ctr.pid = 0
        rel = ctr.linux.cgroups_path.lstrip("/")
        v1_group(self.root, pod.linux.cgroup_parent.lstrip("/"))
        self.plugin.run_pod_sandbox(pod)
        self.plugin.create_container(pod, ctr)
        v1_group(self.root, rel, STATS)
        self.plugin.start_container(pod, ctr)
        await self.settle()
        self.collector.sample()
        self.node.desired.set_overlay(ctr.id, "qos:cpuBurst", {"cpu.cfs_quota_us": 150_000}, "burst")
        await self.settle()
        (self.root / "cpu" / rel / "cpu.shares").write_text("3\n")  # someone else's write: drift
        await self.settle()
        self.plugin.remove_container(pod, ctr)
        self.plugin.remove_pod_sandbox(pod)
        for c in CTRLS:
            shutil.rmtree(self.root / c / pod.linux.cgroup_parent.lstrip("/"))
        await self.settle()
        self.collector.sample()

    def sizes(self) -> dict[str, int]:
        """Every structure that holds something per container or pod, by name."""
        node, r, c = self.node, self.reconciler, self.collector
        d: Any = node.desired
        cg: Any = node.cgroups
        out = {
            "model": len(node.model),
            "desired._cache": len(d._cache),
            "desired._gens": len(d._gens),
            "desired._baselines": len(d._baselines),
            "desired._classes": len(d._classes),
            "desired._members": sum(len(m) for m in d._members.values()),
            "desired._member_of": len(d._member_of),
            "model._of_pod": len(node.model._of_pod),
            "overlays": len(d.overlays.targets()),
            "cpus.exclusive": len(d.cpus.exclusive),
            "reconciler.entries": len(r.entries),
            "reconciler.by_dir": len(r.by_dir),
            "reconciler.files": len(r.files),
            "reconciler._to_apply": len(r._to_apply),
            "reconciler._batch": len(r._batch),
            "reconciler._events": len(r._events),
            "reconciler._watches": len(r._watches),
            "reconciler._masks": len(r._masks),
            "reconciler._new_dirs": len(r._new_dirs),
            "inotify.paths": len(r._inotify.paths) if r._inotify is not None else 0,
            "cgroups._dirs": len(cg._dirs),
            "cgroups._resolved": len(cg._resolved),
            "collector.counters": c.tracked,
            "collector.by_container": len(c.by_container),
            "collector._facts": len(c._facts),
            "collector.open_files": len(c.stats.files),
        }
        return out


def test_every_per_container_structure_empties_when_its_container_goes(tmp_path: Path) -> None:
    async def main() -> None:
        churn = Churn(tmp_path / "cg")
        churn.start()
        try:
            for i in range(3):  # one of each class: what they leave is the node's own (roots, QoS dirs)
                await churn.cycle(i)
            base = churn.sizes()
            for i in range(3, 33):
                await churn.cycle(i)
            after = churn.sizes()
            assert after == base, {k: (base[k], v) for k, v in after.items() if v != base[k]}
            assert base["model"] == 0 and base["reconciler.entries"] == 0 and base["collector.counters"] == 0
        finally:
            churn.reconciler.stop()
            churn.collector.close()

    asyncio.run(main())


def test_after_synchronize_the_reconciler_works_in_turns_between_hooks(tmp_path: Path) -> None:
    """Taking in a node of hundreds of containers (tracking, watching, applying, the first
    full pass) runs in turns: a hook that arrives right after Synchronize waits for one turn,
    not for the whole node; everything converges in the end."""

    async def main() -> None:
        churn = Churn(tmp_path / "cg", turn=0.0001)
        churn.start()
        pods, ctrs = [], []
        for i in range(160):
            pod = make_pod(i, "BE", parent=f"/kubepods/besteffort/pod{i}")
            pod.annotations["node.koordinator.sh/extended-resource-spec"] = BATCH
            ctr = make_container(i, pod)
            v1_group(churn.root, ctr.linux.cgroups_path.lstrip("/"))
            pods.append(pod)
            ctrs.append(ctr)
        seen: list[int] = []
        try:
            churn.node.model.synchronize(pods, ctrs)
            asyncio.get_running_loop().call_soon(lambda: seen.append(len(churn.reconciler.entries)))
            for _ in range(2000):
                await asyncio.sleep(0)
                if churn.reconciler.passes:
                    break
            assert seen and 0 < seen[0] < 2 * len(ctrs)  # a hook got in before the node was done
            assert churn.reconciler.passes == 1 and len(churn.reconciler.entries) == 2 * len(ctrs)
            shares = churn.root / "cpu" / ctrs[-1].linux.cgroups_path.lstrip("/") / "cpu.shares"
            assert shares.read_text().strip() == "512"  # applied
        finally:
            churn.reconciler.stop()

    asyncio.run(main())
