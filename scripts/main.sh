#!/usr/bin/env bash
# The main job on a fresh machine: brings up a private containerd with NRI (the newest line,
# 2.4.2, built once from the Go module proxy; NRIPLUGIN_RUNTIME=1.7|2.1 for Debian's; cached in
# ~/.cache/nriplugin), runs nriplugin against it with the embedded default policy, creates
# sample LS and BE pods, prints what each container got (real cgroup values next to what CRI
# asked for), shows the QoS manager at work (an LS spike and BE's limit, as a table and a PNG)
# and where the metrics are, and tears everything down on Ctrl-C (exit 0). Each long step
# (set-up, the first build, the act) prints its progress.
# Extra arguments go to e2e/demo.py (e.g. --duration 30). On a real node: `nriplugin run`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh demo  # the demo extra: matplotlib, for the timeline PNG
exec .venv/bin/python -m e2e.demo "$@"
