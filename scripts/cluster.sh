#!/usr/bin/env bash
# The cluster lane: a kind cluster with NRI (kind/up.sh, after kind/build.sh's cached build),
# the agent installed by its chart, and the cluster tests (e2e/cluster, `pytest -m cluster`)
# through the real API server and kubelet; kind/down.sh at the end, which must leave nothing.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash kind/build.sh >/dev/null
exec bash scripts/pytest.sh -m cluster e2e/cluster "$@"
