#!/usr/bin/env bash
# Builds one Go peer of this folder against one containerd/nri version.
# Usage: build.sh PEER NRI_VERSION OUTPUT_BINARY      (e.g. build.sh nri-runtime-bench v0.12.5 /tmp/b)
# A peer is PEER/main.go (shared by every version) plus PEER/NRI_VERSION/: its go.mod, go.sum and
# any *.go shim for what differs between library versions. They are copied into a scratch module
# and built with the machine's Go (GO, default /usr/local/go/bin/go) from the Go module proxy;
# modules and build results stay in Go's own caches, so a rebuild is quick.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
peer=${1:?usage: build.sh PEER NRI_VERSION OUTPUT_BINARY}
nri=${2:?usage: build.sh PEER NRI_VERSION OUTPUT_BINARY}
out=$(realpath -m "${3:?usage: build.sh PEER NRI_VERSION OUTPUT_BINARY}")
src="$here/$peer"
[ -f "$src/main.go" ] || { echo "no peer named $peer" >&2; exit 2; }
[ -f "$src/$nri/go.mod" ] || { echo "peer $peer has no build for NRI $nri (no $peer/$nri/go.mod)" >&2; exit 2; }
go=${GO:-/usr/local/go/bin/go}
[ -x "$go" ] || { echo "no Go toolchain at $go (set GO)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$src/main.go" "$src/$nri"/go.mod "$src/$nri"/go.sum "$work/"
for f in "$src/$nri"/*.go; do [ -e "$f" ] && cp "$f" "$work/"; done
mkdir -p "$(dirname "$out")"
# -mod=readonly: go.sum is the lock; a missing entry is an error, not a silent update.
(cd "$work" && GOTOOLCHAIN=local GOFLAGS="-buildvcs=false -mod=readonly" CGO_ENABLED=0 \
  nice "$go" build -trimpath -o "$out.tmp.$$" .)
mv "$out.tmp.$$" "$out"  # whole or not at all, even with two builds at once
echo "built $out ($peer, containerd/nri $nri)"
