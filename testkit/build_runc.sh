#!/usr/bin/env bash
# Builds runc (the OCI runtime) with the machine's Go and gcc from the Go module proxy, cached
# under ~/.cache/nriplugin/runc/VERSION/runc (NRIPLUGIN_CACHE overrides). Needed for what NRI
# v0.10/v0.11 runtimes pass on and runc applies only from 1.2 on (process.scheduler,
# process.ioPriority); Debian bookworm's runc 1.1.5 ignores them. cgo is required (runc's
# nsenter is C). Built with the seccomp tag against libseccomp (pkg-config; Debian's
# libseccomp-dev): containerd 2.2+ under a kubelet gives every pod sandbox the runtime/default
# seccomp profile, and a runc without seccomp refuses each one ("seccomp: config provided but
# seccomp not supported"). A cached binary counts only if `runc --version` names its libseccomp
# (one built before, without it, is rebuilt). The Go caches are private to the cache folder.
# Usage: testkit/build_runc.sh [VERSION]   (default below); prints the binary's path.
set -euo pipefail
version=${1:-1.4.4}
go=${GO:-/usr/local/go/bin/go}
[ -x "$go" ] || go=$(command -v go) || { echo "no Go toolchain (set GO=...)" >&2; exit 1; }
command -v gcc >/dev/null || { echo "runc needs cgo: no gcc (apt-get install gcc)" >&2; exit 1; }
root=$(realpath -m "${NRIPLUGIN_CACHE:-$HOME/.cache/nriplugin}")
out="$root/runc/$version"
have=$("$out/runc" --version 2>/dev/null || true)
if grep -q "^runc version $version\$" <<<"$have" && grep -q "^libseccomp: " <<<"$have"; then
  echo "$out/runc"
  exit 0
fi
command -v pkg-config >/dev/null && pkg-config --exists libseccomp || {
  echo "runc's seccomp needs libseccomp's headers: no pkg-config libseccomp (apt-get install libseccomp-dev pkg-config)" >&2
  exit 1
}
export GOMODCACHE="$root/go/mod" GOCACHE="$root/go/build" GOFLAGS="-buildvcs=false -modcacherw" GOTOOLCHAIN=local
mkdir -p "$out"
GOBIN=$(mktemp -d "$out/bin.partial.XXXXXX")  # its own: another build of this version may run at once
export GOBIN CGO_ENABLED=1
trap 'rm -rf "$GOBIN"' EXIT
nice -n 10 "$go" install -trimpath -tags "seccomp urfave_cli_no_docs" \
  -ldflags "-s -w -X main.version=$version -X main.gitCommit=module-proxy" \
  "github.com/opencontainers/runc@v$version" >&2
mv -f "$GOBIN/runc" "$out/runc" && rmdir "$GOBIN"
have=$("$out/runc" --version)
echo "$have" >&2
grep -q "^libseccomp: " <<<"$have" || { echo "$out/runc: built, but without seccomp" >&2; exit 1; }
echo "$out/runc"
