#!/usr/bin/env bash
# pytest with the project's venv, its arguments passed on; "no tests collected" (exit 5) is a
# failure: a selection that matches nothing must not pass in CI.
set -uo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
exit "$rc"
