"""On the private containerd 1.7 (e2e harness): CRI CreateContainer latency with no plugin,
the Go stub plugin and nriplugin, alternating; and "plugin process start -> registered" for
pre-registered plugins, which containerd starts itself and gives 5 s to register."""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.rounds import interval
from testkit import containerd as harness
from testkit.cri import msg

ROOT = Path(__file__).resolve().parent.parent


def _connected(rt: harness.Containerd, name: str, count: int) -> bool:
    log = (rt.base / "logs" / "containerd.log").read_text(errors="replace")
    return log.count(f'plugin \\"{name}\\" connected') >= count


def _start_plugin(kind: str, rt: harness.Containerd, goplugin: Path) -> subprocess.Popen[bytes] | None:
    if kind == "none":
        return None
    if kind == "go":
        cmd = [str(goplugin), "-socket", rt.nri_socket, "-name", "refplugin", "-idx", "10"]
    else:
        cmd = [sys.executable, "-m", "nriplugin", "run", "--socket", rt.nri_socket, "--metrics-address", "127.0.0.1:0"]
        cmd += ["--cri-socket", rt.address, "--pods-root", f"{rt.cgroup_root}/kubepods"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def cri_create_latency(goplugin: Path, rounds: int, per_round: int) -> dict[str, list[float]]:
    """CRI CreateContainer round trips (ms) per configuration, configurations alternating."""
    pkg = harness.install()
    rt = harness.Containerd(pkg, Path(tempfile.mkdtemp(prefix="nriplugin-bench-")), tmpfs=True)
    samples: dict[str, list[float]] = {"none": [], "go": [], "nriplugin": []}
    connects = {"go": 0, "nriplugin": 0}
    try:
        rt.start()
        rt.import_images()
        assert rt.cri is not None
        pod = rt.run_pod("bench-be", "BestEffort", {"koordinator.sh/qosClass": "BE"})
        kinds = list(samples)
        for r in range(rounds):
            for kind in kinds[r % 3 :] + kinds[: r % 3]:
                proc = _start_plugin(kind, rt, goplugin)
                if kind != "none":
                    connects[kind] += 1
                    name = "10-refplugin" if kind == "go" else "10-nriplugin"
                    deadline = time.monotonic() + 20
                    while not _connected(rt, name, connects[kind]):
                        if time.monotonic() > deadline:
                            raise RuntimeError(f"{kind} plugin did not connect")
                        time.sleep(0.02)
                created = []
                for i in range(per_round):
                    cfg = harness.container_config(f"c{r}-{kind}-{i}", cpu_shares=1024)
                    req = msg("CreateContainerRequest", pod_sandbox_id=pod.id, config=cfg, sandbox_config=pod.config)
                    t0 = time.perf_counter()
                    cid = rt.cri.call("CreateContainer", req).container_id
                    samples[kind].append((time.perf_counter() - t0) * 1000)
                    created.append(cid)
                for cid in created:
                    rt.cri.call("RemoveContainer", msg("RemoveContainerRequest", container_id=cid))
                if proc is not None:
                    proc.terminate()
                    proc.wait(10)
                    time.sleep(0.2)  # let the runtime notice the plugin is gone
    finally:
        rt.teardown()
    return samples


_TIME = re.compile(r'time="([^"]+)".*plugin \\"pre-connected:(\S+?)\[\d+\]\\" registered as')


def _epoch_ns(stamp: str) -> int:
    # containerd logs RFC 3339 with nanoseconds; Python's datetime keeps microseconds.
    main, frac = stamp.rstrip("Z").split(".")
    dt = datetime.fromisoformat(main + "+00:00")
    return int(dt.timestamp()) * 1_000_000_000 + int(frac.ljust(9, "0")[:9])


def preregistered_start(goplugin: Path, reps: int) -> dict[str, list[float]]:
    """ms from the launcher's first instruction to containerd logging the registration."""
    pkg = harness.install()
    out: dict[str, list[float]] = {"go": [], "nriplugin": []}
    for r in range(reps):
        for kind in ("go", "nriplugin") if r % 2 == 0 else ("nriplugin", "go"):
            rt = harness.Containerd(pkg, Path(tempfile.mkdtemp(prefix="nriplugin-bench-")))
            try:
                rt.write_config()
                stamp = rt.base / "launched"
                if kind == "go":
                    # The Go stub refuses its -name/-idx flags when the runtime's env sets them.
                    target = [
                        "/usr/bin/env",
                        "-u",
                        "NRI_PLUGIN_NAME",
                        "-u",
                        "NRI_PLUGIN_IDX",
                        str(goplugin),
                        "-name",
                        "go",
                        "-idx",
                        "10",
                    ]
                else:
                    target = [sys.executable, "-m", "nriplugin", "run", "--metrics-address", "127.0.0.1:0"]
                    target += ["--cri-socket", rt.address, "--pods-root", f"{rt.cgroup_root}/kubepods"]
                launcher = rt.plugin_dir / f"10-{kind}"
                launcher.write_text(f"#!/bin/sh\n/bin/date +%s%N > {stamp}\nexec {' '.join(target)}\n")
                launcher.chmod(0o755)
                rt.start()
                deadline = time.monotonic() + 20
                reg = None
                while reg is None and time.monotonic() < deadline:
                    log = (rt.base / "logs" / "containerd.log").read_text(errors="replace")
                    m = _TIME.search(log)
                    reg = _epoch_ns(m.group(1)) if m else None
                    time.sleep(0.02)
                if reg is None or not stamp.exists():
                    raise RuntimeError(f"pre-registered {kind} plugin did not register")
                out[kind].append((reg - int(stamp.read_text())) / 1e6)
            finally:
                rt.teardown()
    return out


def summary(values: list[float]) -> dict[str, Any]:
    s = sorted(values)

    def p(q: float) -> float:
        return s[int((len(s) - 1) * q)]

    return {"n": len(s), "p50": p(0.5), "p90": p(0.9), "p99": p(0.99), "max": s[-1]}


def diff_ci(
    a: list[float], b: list[float], q: float, per_round: int, n: int = 2000, seed: int = 1
) -> tuple[float, float]:
    """95 % bootstrap interval of quantile(a) - quantile(b): is a difference signal or noise?

    ``a`` and ``b`` hold ``per_round`` calls per round, round after round. The calls of one
    round are not independent (one plugin process, one stretch of the machine's background),
    so rounds are what is resampled, and the same rounds for both (they ran side by side):
    resampling single calls would give a narrow interval to a difference that the next run
    does not repeat."""
    rounds = len(a) // per_round
    if rounds < 2 or len(b) != len(a) or len(a) % per_round:
        raise ValueError(f"need two or more whole rounds of {per_round} calls on both sides")
    ra = [a[i * per_round : (i + 1) * per_round] for i in range(rounds)]
    rb = [b[i * per_round : (i + 1) * per_round] for i in range(rounds)]

    def quant(v: list[float]) -> float:
        s = sorted(v)
        return s[int((len(s) - 1) * q)]

    return interval(
        rounds, lambda pick: quant([x for i in pick for x in ra[i]]) - quant([x for i in pick for x in rb[i]]), n, seed
    )
