#!/usr/bin/env bash
# Builds Koordinator's node agent koordlet (v1.8.0) for the benchmarks that run it beside
# nriplugin: a benchmark peer like the Go stub, never part of the product or its image.
# Usage: bash testkit/peers/koordlet.sh            builds if needed; prints the binary's path
#        bash testkit/peers/koordlet.sh --cached   prints it if cached, else fails (no build)
#
# From the wrapper module kind/go/koord (Koordinator's replace block copied; koord-manager is
# built from it too) with the machine's Go and the project's Go caches. koordlet needs cgo:
# its perf counters (pkg/koordlet/util/perf_group) include <perfmon/pfmlib.h> and link -lpfm,
# with no build tag to drop them, so Debian's libpfm4-dev is installed with apt if missing.
# Cached under ${NRIPLUGIN_CACHE:-~/.cache/nriplugin}/peers/koordlet-vVERSION-HASH/ (HASH: the
# wrapper's go.mod, go.sum and tools.go), whole or not at all: a rerun with nothing changed
# does nothing. Progress every 15 s: what, how far, how long so far.
set -euo pipefail
source "$(dirname "$0")/../../kind/lib.sh"
say() { echo "koordlet: [$(elapsed "$t_start")] $*" >&2; }
die() { echo "koordlet: error: $*" >&2; exit 1; }

[ -x "$GO" ] || die "no Go toolchain (set GO=...; Go >= 1.25)"
key=$(cat "$KIND_SRC/go/koord"/go.mod "$KIND_SRC/go/koord"/go.sum "$KIND_SRC/go/koord"/tools.go | sha256sum | cut -c1-12)
out=$CACHE_ROOT/peers/koordlet-v$KOORD_VERSION-$key
bin=$out/koordlet
if [ -x "$bin" ]; then
  say "v$KOORD_VERSION: cached ($bin)"
  echo "$bin"
  exit 0
fi
[ "${1:-}" != --cached ] || die "v$KOORD_VERSION not built for this wrapper module ($bin): bash testkit/peers/koordlet.sh"

if [ ! -f /usr/include/perfmon/pfmlib.h ]; then
  [ "$(id -u)" = 0 ] || die "needs Debian's libpfm4-dev (apt-get install libpfm4-dev) and root to install it"
  say "installing Debian's libpfm4-dev (apt): koordlet's perf counters are cgo against libpfm"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libpfm4-dev >&2 ||
    { apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libpfm4-dev >&2; } ||
    die "apt-get install libpfm4-dev failed"
fi
command -v gcc >/dev/null || die "koordlet needs cgo: no gcc (apt-get install gcc)"

LOG=$CACHE_ROOT/peers/log
mkdir -p "$LOG"
src=$(mktemp -d "$CACHE_ROOT/peers/koordlet-src.XXXXXX")
trap 'rm -rf "$src" "$out.partial.$$"' EXIT
cp "$KIND_SRC/go/koord"/go.mod "$KIND_SRC/go/koord"/go.sum "$KIND_SRC/go/koord"/*.go "$src/"
mod_far() { echo "module cache $(du -sm "$GOMODCACHE/cache/download" 2>/dev/null | cut -f1) MB"; }
progress "modules (kind/go/koord)" "$LOG/koordlet-mod.log" mod_far env -C "$src" "$GO" mod download -x

pkg=github.com/koordinator-sh/koordinator/cmd/koordlet
total=$(cd "$src" && CGO_ENABLED=1 GOFLAGS="$GOFLAGS -mod=readonly" "$GO" list -deps "$pkg" | wc -l)
build_far() { echo "$(lines_of "$1")/$total packages compiled"; }
mkdir -p "$out.partial.$$"
# -mod=readonly: the committed go.sum is the lock; a missing entry fails instead of updating it.
progress "koordlet v$KOORD_VERSION (CGO_ENABLED=1)" "$LOG/koordlet.log" build_far \
  env -C "$src" CGO_ENABLED=1 GOFLAGS="$GOFLAGS -mod=readonly" nice -n 10 "$GO" build -v -trimpath -ldflags "-s -w" \
  -o "$out.partial.$$/koordlet" "$pkg"
rm -rf "$out" && mv "$out.partial.$$" "$out"
say "v$KOORD_VERSION: $bin ($(du -sm "$bin" | cut -f1) MB)"
echo "$bin"
