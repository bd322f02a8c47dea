#!/usr/bin/env bash
# Builds an upstream containerd 2.x release (containerd, containerd-shim-runc-v2, ctr) with the
# machine's Go from the Go module proxy, without cgo (so no C headers are needed: the btrfs,
# devmapper and zfs snapshotters are left out, as the e2e config disables them anyway).
# The Go module and build caches are private to the cache folder, so a build never touches
# the user's own. Usage: testkit/build_containerd.sh VERSION OUT_ROOT   (e.g. 2.4.2 DIR);
# the binaries land in OUT_ROOT/usr/bin. Progress on stderr (testkit/progress.sh): the modules
# downloaded, then the packages compiled out of those the build needs (counted with -n first).
set -euo pipefail
source "$(dirname "$0")/progress.sh"
version=${1:?version, e.g. 2.4.2}
out=$(realpath -m "${2:?output root}")
go=${GO:-/usr/local/go/bin/go}
[ -x "$go" ] || go=$(command -v go) || { echo "no Go toolchain (set GO=...)" >&2; exit 1; }
cache=$(realpath -m "${NRIPLUGIN_CACHE:-$HOME/.cache/nriplugin}/go")
# -modcacherw: the module cache can be removed with rm -rf like the rest of the cache.
export GOMODCACHE="$cache/mod" GOCACHE="$cache/build" GOFLAGS="-buildvcs=false -modcacherw" GOTOOLCHAIN=local
export GOBIN="$out/usr/bin.partial" CGO_ENABLED=0
mod=github.com/containerd/containerd/v2
tags="no_btrfs no_devmapper no_zfs urfave_cli_no_docs"
ldflags="-s -w -X $mod/version.Version=v$version -X $mod/version.Revision=module-proxy -X $mod/version.Package=$mod"
rm -rf "$GOBIN" && mkdir -p "$GOBIN"
log=$(mktemp "${TMPDIR:-/tmp}/nriplugin-build-containerd.XXXXXX")  # go's -v and -n output
trap 'rm -f "$log"' EXIT
progress_total 3
modules() {  # how far the download is
  echo "$(find "$GOMODCACHE/cache/download" -name '*.zip' 2>/dev/null | wc -l) modules in the cache"
}
packages() {  # how far the compile is: packages compiled (go -v) out of those it needs (go -n)
  local done
  done=$(grep -cvE '^(#|go: )' "$log" || true)
  if [ "$done" -lt "$total" ]; then echo "$done/$total packages"; else echo "$done/$total packages, linking"; fi
}
go_install() {  # TAGS PACKAGE...: `go install` as the build has it, -v into the log
  local tags=$1
  shift
  nice -n 10 "$go" install -v -trimpath -tags "$tags" -ldflags "$ldflags" "$@" 2>"$log" || {
    tail -n 40 "$log" >&2
    return 1
  }
}
plan() {  # TAGS PACKAGE...: the compile actions a fresh build of PACKAGE... needs (downloads its modules)
  local tags=$1
  shift
  "$go" install -n -trimpath -tags "$tags" -ldflags "$ldflags" "$@" 2>"$log" || {
    tail -n 40 "$log" >&2
    return 1
  }
  total=$(grep -c '/compile ' "$log" || true)
}
main=("$mod/cmd/containerd@v$version" "$mod/cmd/ctr@v$version")
shim=("$mod/cmd/containerd-shim-runc-v2@v$version")
progress_step 1 "downloading containerd $version's Go modules" modules -- plan "$tags" "${main[@]}"
progress_step 2 "compiling containerd $version (containerd, ctr)" packages -- go_install "$tags" "${main[@]}"
plan "$tags no_grpc" "${shim[@]}"
progress_step 3 "compiling containerd $version's shim (containerd-shim-runc-v2)" packages -- \
  go_install "$tags no_grpc" "${shim[@]}"
rm -rf "$out/usr/bin" && mv "$GOBIN" "$out/usr/bin"
"$out/usr/bin/containerd" --version
