#!/usr/bin/env bash
# Builds the self-contained nriplugin executable (PyInstaller, one file: the Python runtime,
# the package and its hash-locked dependencies; no Python needed on the node) and prints its
# path as the last line. Drop it into containerd's plugin dir as a pre-registered plugin:
#   ./nriplugin install [--plugin-dir /opt/nri/plugins] [-- RUN-ARGS]   (copies itself there)
# It needs a glibc at least as new as the build machine's (Debian 12: 2.36).
#
# Usage: bash image/bundle.sh [--out FILE]   (default: build/nriplugin-VERSION-linux-x86_64)
# Cached under ${NRIPLUGIN_CACHE:-~/.cache/nriplugin}/image: the build venv (the image's locked
# wheels + PyInstaller, pinned in pyproject.toml's `bundle` extra); an unchanged tree is not
# rebuilt.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
cache=$(realpath -m "${NRIPLUGIN_CACHE:-$HOME/.cache/nriplugin}/image")
out=""
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=$(realpath -m "$2"); shift ;;
    *) echo "usage: bash image/bundle.sh [--out FILE]" >&2; exit 2 ;;
  esac
  shift
done
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -1)
pyinstaller=$(grep -oE '"pyinstaller==[^"]+"' pyproject.toml | tr -d '"')
py=${PYTHON:-}
[ -n "$py" ] || { [ -x .venv/bin/python ] && py=.venv/bin/python; } || py=python3
out=${out:-$repo/build/nriplugin-$version-linux-x86_64}
t0=$(date +%s)
say() { echo "bundle.sh: [$(($(date +%s) - t0)) s] $*" >&2; }

# The sources that go in, and how: unchanged since the last bundle -> done.
inputs=$( (cat image/bundle.sh image/requirements.lock; echo "$pyinstaller"; "$py" -c 'import sys; print(sys.version)';
  find nriplugin -name '*.py' -o -name '*.yaml' | sort | xargs sha256sum) | sha256sum | cut -d' ' -f1)
if [ -x "$out" ] && [ "$(cat "$out.inputs" 2>/dev/null)" = "$inputs" ]; then
  say "unchanged since the last bundle: $out"
  echo "$out"
  exit 0
fi

# A build venv with exactly the image's dependencies (hash-checked) and PyInstaller.
venv=$cache/bundle-venv
key=$( (cat image/requirements.lock; echo "$pyinstaller"; "$py" -c 'import sys; print(sys.version)') | sha256sum | cut -d' ' -f1)
if [ "$(cat "$venv/.key" 2>/dev/null)" != "$key" ]; then
  say "build venv: the locked wheels + $pyinstaller"
  rm -rf "$venv"
  "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --only-binary=:all: --require-hashes \
    -r image/requirements.lock >&2
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "$pyinstaller" >&2
  echo "$key" > "$venv/.key"
fi

work=$cache/bundle-work
rm -rf "$work"
mkdir -p "$work" "$(dirname "$out")"
printf 'import sys\n\nfrom nriplugin.cli.main import main\n\nsys.exit(main())\n' > "$work/entry.py"
say "PyInstaller (one file)"
# Everything in the package (its lazy imports included); none of the stdlib's GUI and test kits.
"$venv/bin/pyinstaller" --onefile --name nriplugin --paths "$repo" --collect-submodules nriplugin \
  --exclude-module tkinter --exclude-module unittest --exclude-module pydoc_data --exclude-module lib2to3 \
  --distpath "$work/dist" --workpath "$work/build" --specpath "$work" --noconfirm --log-level WARN \
  "$work/entry.py" >&2
"$work/dist/nriplugin" --help >/dev/null  # it starts
mv "$work/dist/nriplugin" "$out"
echo "$inputs" > "$out.inputs"
rm -rf "$work"
say "$out: $(($(stat -c %s "$out") / 1000000)) MB"
echo "$out"
