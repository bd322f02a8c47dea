#!/usr/bin/env bash
# The cgroup v2 lane: builds (once, cached under ~/.cache/nriplugin/vm) a guest kit from Debian's
# packages, boots Debian's stock kernel under qemu with cgroup v2 and systemd as PID 1, and runs
# the tests marked `vm` there (e2e/vm/): every guest test on the selected containerd line
# (NRIPLUGIN_RUNTIME, default the newest), the containerd ones again on 2.1. Needs root;
# installs qemu-system-x86 and cpio when missing. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash testkit/vm/build-kit.sh >/dev/null
exec bash scripts/pytest.sh -m vm e2e/vm "$@"
