"""The main job on a fresh machine: a private containerd 1.7 with NRI, nriplugin with the
embedded default policy, sample LS and BE pods, and what each container really got.

Runs until Ctrl-C (or --duration seconds), then tears everything down. On a real node use
``nriplugin run`` instead.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from e2e import harness

BATCH = (
    '{"containers":{"main":{"requests":{"kubernetes.io/batch-cpu":"500","kubernetes.io/batch-memory":"256Mi"},'
    '"limits":{"kubernetes.io/batch-cpu":"1k","kubernetes.io/batch-memory":"512Mi"}}}}'
)
SAMPLES: list[tuple[str, str, dict[str, str], dict[str, str], int, int, int]] = [
    # name, Kubernetes QoS (cgroup parent), labels, annotations, CRI cpu_shares, cpu_quota, memory
    ("web-ls", "Burstable", {"koordinator.sh/qosClass": "LS"}, {}, 1024, 200000, 256 << 20),
    ("cache-guaranteed", "Guaranteed", {}, {}, 2048, 200000, 512 << 20),
    ("db-lsr", "Guaranteed", {"koordinator.sh/qosClass": "LSR"}, {}, 1024, 100000, 512 << 20),
    ("batch-be", "BestEffort", {"koordinator.sh/qosClass": "BE"}, {}, 1024, 0, 0),
    (
        "spark-be-batch",
        "BestEffort",
        {"koordinator.sh/qosClass": "BE"},
        {"node.koordinator.sh/extended-resource-spec": BATCH},
        2,
        0,
        0,
    ),
    ("job-besteffort", "BestEffort", {}, {}, 2, 0, 0),
]


def fmt(v: str) -> str:
    return "-" if v in ("", "0", "-1", "9223372036854771712") else v


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--duration", type=float, default=0, help="exit after N seconds (default: until Ctrl-C)")
    ap.add_argument("--metrics-port", type=int, default=9310)
    args = ap.parse_args()
    stop = False

    def on_signal(*_: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    print("installing containerd 1.7 (cached after the first run)...", flush=True)
    pkg = harness.install()
    rt = harness.Containerd(pkg, Path(tempfile.mkdtemp(prefix="nriplugin-demo-")))
    plugin: subprocess.Popen[bytes] | None = None
    try:
        rt.start()
        rt.import_images()
        print(f"containerd {rt.base} (NRI socket {rt.nri_socket})", flush=True)
        metrics = f"http://127.0.0.1:{args.metrics_port}"
        plugin = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "nriplugin",
                "run",
                "--socket",
                rt.nri_socket,
                "--log-format",
                "text",
                "--metrics-address",
                f"127.0.0.1:{args.metrics_port}",
                "--cri-socket",
                rt.address,
                "--pods-root",
                f"{rt.cgroup_root}/kubepods",
            ],
        )
        wait_ready(metrics, plugin)
        made = []
        for name, k8s, labels, annotations, shares, quota, mem in SAMPLES:
            pod = rt.run_pod(name, k8s, labels, annotations)
            cid = rt.create_container(pod, "main", cpu_shares=shares, cpu_quota=quota, memory=mem)
            made.append((name, labels.get("koordinator.sh/qosClass", f"({k8s})"), shares, quota, mem, pod, cid))
        time.sleep(0.3)  # share-pool moves for running containers are applied right after
        head = "CRI asked: shares/quota/mem     cgroup has: shares/quota/mem/burst/cpuset"
        print(f"\n{'container':18s} {'class':13s} {head}")
        for name, cls, shares, quota, mem, pod, cid in made:
            cpu = rt.container_cgroup(pod, cid, "cpu")
            have = "/".join(
                [
                    harness.read_cgroup(cpu, "cpu.shares"),
                    fmt(harness.read_cgroup(cpu, "cpu.cfs_quota_us")),
                    fmt(harness.read_cgroup(rt.container_cgroup(pod, cid, "memory"), "memory.limit_in_bytes")),
                    fmt(harness.read_cgroup(cpu, "cpu.cfs_burst_us")) if (cpu / "cpu.cfs_burst_us").exists() else "n/a",
                    harness.read_cgroup(rt.container_cgroup(pod, cid, "cpuset"), "cpuset.cpus"),
                ]
            )
            asked = f"{shares}/{fmt(str(quota))}/{fmt(str(mem))}"
            print(f"{name:18s} {cls:13s} {asked:31s} {have}")
        print("\ncgroup files: /sys/fs/cgroup/{cpu,memory}/" + rt.cgroup_root + "/kubepods/...")
        print(f"metrics: {metrics}/metrics   health: {metrics}/healthz   ready: {metrics}/readyz")
        print("Ctrl-C to tear everything down." if not args.duration else f"stopping in {args.duration:.0f} s.")
        deadline = time.monotonic() + args.duration if args.duration else float("inf")
        while not stop and time.monotonic() < deadline and plugin.poll() is None:
            time.sleep(0.2)
        return 0 if plugin.poll() is None else 1
    finally:
        print("tearing down...", flush=True)
        if plugin is not None and plugin.poll() is None:
            plugin.terminate()
            plugin.wait(10)
        rt.teardown()
        print("done.")


def wait_ready(metrics: str, plugin: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if plugin.poll() is not None:
            raise SystemExit("nriplugin exited")
        try:
            with urllib.request.urlopen(metrics + "/readyz", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit("nriplugin did not register within 30 s")


if __name__ == "__main__":
    sys.exit(main())
