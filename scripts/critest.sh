#!/usr/bin/env bash
# cri-tools' critest against the private containerd, without nriplugin and then with it
# registered on the runtime's NRI socket (its default policy); prints both results and the
# specs whose state differs (exit 1 if any). critest is built once, cached, by kind/build.sh.
#   bash scripts/critest.sh [--focus REGEX] [--out DIR]     (as root; NRIPLUGIN_RUNTIME picks the line)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bin=$(bash kind/build.sh critest | tail -1)
exec .venv/bin/python -m testkit.critest --binary "$bin" "$@"
