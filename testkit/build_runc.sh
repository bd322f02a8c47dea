#!/usr/bin/env bash
# Builds runc (the OCI runtime) with the machine's Go and gcc from the Go module proxy, cached
# under ~/.cache/nriplugin/runc/VERSION/runc (NRIPLUGIN_CACHE overrides). Needed for what NRI
# v0.10/v0.11 runtimes pass on and runc applies only from 1.2 on (process.scheduler,
# process.ioPriority); Debian bookworm's runc 1.1.5 ignores them. cgo is required (runc's
# nsenter is C); the seccomp build tag is left out, so no libseccomp headers are needed (the
# e2e containers run unconfined). The Go caches are private to the cache folder.
# Usage: testkit/build_runc.sh [VERSION]   (default below); prints the binary's path.
set -euo pipefail
version=${1:-1.4.4}
go=${GO:-/usr/local/go/bin/go}
[ -x "$go" ] || go=$(command -v go) || { echo "no Go toolchain (set GO=...)" >&2; exit 1; }
command -v gcc >/dev/null || { echo "runc needs cgo: no gcc (apt-get install gcc)" >&2; exit 1; }
root=$(realpath -m "${NRIPLUGIN_CACHE:-$HOME/.cache/nriplugin}")
out="$root/runc/$version"
if [ -x "$out/runc" ] && "$out/runc" --version | grep -q "runc version $version"; then
  echo "$out/runc"
  exit 0
fi
export GOMODCACHE="$root/go/mod" GOCACHE="$root/go/build" GOFLAGS="-buildvcs=false -modcacherw" GOTOOLCHAIN=local
export GOBIN="$out/bin.partial" CGO_ENABLED=1
rm -rf "$GOBIN" && mkdir -p "$GOBIN"
nice -n 10 "$go" install -trimpath -tags urfave_cli_no_docs \
  -ldflags "-s -w -X main.version=$version -X main.gitCommit=module-proxy" \
  "github.com/opencontainers/runc@v$version" >&2
mv -f "$GOBIN/runc" "$out/runc" && rmdir "$GOBIN"
"$out/runc" --version >&2
echo "$out/runc"
