#!/usr/bin/env bash
# The main job: install nriplugin into .venv and run it with the embedded default policy
# against the runtime's NRI socket (default /var/run/nri/nri.sock; pass --socket PATH).
# It retries until the runtime is there; metrics on http://127.0.0.1:9310/metrics.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/nriplugin run --log-format text "$@"
