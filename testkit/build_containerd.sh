#!/usr/bin/env bash
# Builds an upstream containerd 2.x release (containerd, containerd-shim-runc-v2, ctr) with the
# machine's Go from the Go module proxy, without cgo (so no C headers are needed: the btrfs,
# devmapper and zfs snapshotters are left out, as the e2e config disables them anyway).
# The Go module and build caches are private to the cache folder, so a build never touches
# the user's own. Usage: testkit/build_containerd.sh VERSION OUT_ROOT   (e.g. 2.4.2 DIR);
# the binaries land in OUT_ROOT/usr/bin.
set -euo pipefail
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
nice -n 10 "$go" install -trimpath -tags "$tags" -ldflags "$ldflags" \
  "$mod/cmd/containerd@v$version" "$mod/cmd/ctr@v$version"
nice -n 10 "$go" install -trimpath -tags "$tags no_grpc" -ldflags "$ldflags" \
  "$mod/cmd/containerd-shim-runc-v2@v$version"
rm -rf "$out/usr/bin" && mv "$GOBIN" "$out/usr/bin"
"$out/usr/bin/containerd" --version
