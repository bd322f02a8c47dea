#!/usr/bin/env bash
# The end-to-end tests on one containerd line, installed (cached) by testkit/install.sh:
#   scripts/e2e.sh RUNTIME [PYTEST ARGS...]     RUNTIME: 1.7, 2.1 or 2.4
# Without pytest arguments: the NRI, hook, reconciler, QoS, eviction and born-with tests (CI on
# the older lines; the newest gets the whole suite through scripts/test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
runtime=${1:?usage: scripts/e2e.sh 1.7|2.1|2.4 [pytest args]}
shift
bash scripts/setup.sh
[ "$#" -gt 0 ] || set -- e2e/test_e2e.py e2e/test_handover.py e2e/test_qos.py e2e/test_evict.py e2e/test_be_limits.py e2e/test_new_runtime.py
export NRIPLUGIN_RUNTIME=$runtime
exec bash scripts/pytest.sh "$@"
