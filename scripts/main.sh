#!/usr/bin/env bash
# The main job on a fresh machine: brings up a private containerd 1.7 with NRI (installed into
# ~/.cache/nriplugin), runs nriplugin against it with the embedded default policy, creates
# sample LS and BE pods, prints what each container got (real cgroup values next to what CRI
# asked for), shows the QoS manager at work (an LS spike and BE's limit, as a table and a PNG)
# and where the metrics are, and tears everything down on Ctrl-C.
# Extra arguments go to e2e/demo.py (e.g. --duration 30). On a real node: `nriplugin run`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh demo  # the demo extra: matplotlib, for the timeline PNG
exec .venv/bin/python -m e2e.demo "$@"
