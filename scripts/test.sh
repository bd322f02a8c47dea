#!/usr/bin/env bash
# The test command: lint, type-check and the whole test suite (unit, interop with the official
# Go NRI runtime library at v0.6.1 and v0.12, built from testkit/peers with the machine's Go;
# e2e on a private containerd: the newest line, or NRIPLUGIN_RUNTIME=1.7|2.1|2.4; the cgroup v2
# VM lane, e2e/vm). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy nriplugin tests tools bench e2e testkit
exec bash scripts/pytest.sh "$@"
