"""Pre-registered start on the private containerd 1.7.24: plugin started -> containerd logs its
registration, for the two forms `nriplugin install` can put in the plugin dir:

- launcher: the /bin/sh launcher `install` writes (this checkout's Python: `python -m nriplugin
  supervise`, which starts `python -m nriplugin run` with the connection);
- bundle: the self-contained executable from image/bundle.sh (PyInstaller, one file: it unpacks
  itself to a temporary folder at each start; the agent its supervisor starts reuses it).

Both run the supervisor and the agent, as installed. A one-line /bin/sh wrapper stamps the time
and execs the form under test, the same for both. containerd's registration timeout is 5 s.

Usage (root): .venv/bin/python -m bench.plugin_start [--reps 8] [--write BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.containerd_latency import _TIME, _epoch_ns, summary
from bench.report import replace_section
from nriplugin.cli.main import install
from testkit import containerd as harness
from testkit.plugin import runtime_args

ROOT = Path(__file__).resolve().parent.parent


def build_bundle() -> Path:
    r = subprocess.run(
        ["bash", str(ROOT / "image" / "bundle.sh")],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": sys.executable},
        check=True,
    )
    return Path(r.stdout.strip().splitlines()[-1])


def one_start(pkg: Path, form: str, bundle: Path) -> float:
    """ms from the wrapper's stamp to containerd logging the registration."""
    rt = harness.Containerd(pkg, Path(tempfile.mkdtemp(prefix="nriplugin-bench-")))
    try:
        rt.write_config()
        args = ["--metrics-address", "127.0.0.1:0", "--socket", rt.nri_socket, *runtime_args(rt)]
        real = install(
            str(rt.base / "forms"), "nriplugin", "10", args, bundle=str(bundle) if form == "bundle" else None
        )
        stamp = rt.base / "launched"
        wrapper = rt.plugin_dir / "10-nriplugin"
        wrapper.write_text(f"#!/bin/sh\n/bin/date +%s%N > {stamp}\nexec {real}\n")
        wrapper.chmod(0o755)
        rt.start()
        deadline = time.monotonic() + 30
        reg = None
        while reg is None and time.monotonic() < deadline:
            m = _TIME.search((rt.base / "logs" / "containerd.log").read_text(errors="replace"))
            reg = _epoch_ns(m.group(1)) if m else None
            time.sleep(0.02)
        if reg is None or not stamp.exists():
            raise RuntimeError(f"the {form} did not register; see {rt.base}/logs/containerd.log")
        return (reg - int(stamp.read_text())) / 1e6
    finally:
        rt.teardown()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--write", type=Path, help="update this BENCHMARKS.md section")
    ns = ap.parse_args()
    pkg = harness.install()
    bundle = build_bundle()
    out: dict[str, list[float]] = {"launcher": [], "bundle": []}
    for r in range(ns.reps):
        for form in ("launcher", "bundle") if r % 2 == 0 else ("bundle", "launcher"):
            out[form].append(one_start(pkg, form, bundle))
    load = os.getloadavg()[0]
    s = {k: summary(v) for k, v in out.items()}
    for k, v in s.items():
        print(f"{k}: p50 {v['p50']:.0f} ms, max {v['max']:.0f} ms ({v['n']} starts)")
    if ns.write:
        size = bundle.stat().st_size / 1e6
        lines = [
            "<!-- plugin_start:begin -->",
            "### Pre-registered start: launcher or bundle",
            "",
            "```sh",
            f".venv/bin/python -m bench.plugin_start --reps {ns.reps} --write BENCHMARKS.md",
            "```",
            "",
            "Plugin started by containerd 1.7.24 -> containerd logs its registration (supervisor + agent, as",
            f"`nriplugin install` puts them in the plugin dir; {ns.reps} starts each, alternating; load average",
            f"{load:.1f} on 2 cores at the end). containerd's registration timeout: 5000 ms.",
            "",
            "| form | p50 | p90 | max |",
            "|---|---|---|---|",
            *(f"| {k} | {v['p50']:.0f} ms | {v['p90']:.0f} ms | {v['max']:.0f} ms |" for k, v in s.items()),
            "",
            "launcher: `/bin/sh` + this checkout's Python. bundle: image/bundle.sh's one-file executable",
            f"({size:.0f} MB), which unpacks itself to a temporary folder at every start; the agent the",
            "supervisor starts reuses that folder.",
            "<!-- plugin_start:end -->",
        ]
        replace_section(ns.write, "plugin_start", "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
