#!/usr/bin/env bash
# Installs what the end-to-end tests need into a cache folder (never into the system), for one
# containerd runtime line:
#   1.7  Debian trixie's containerd 1.7.24 (NRI v0.6.1)
#   2.1  Debian sid's containerd 2.1.x (NRI v0.8), which runs on bookworm's glibc
#   2.4  upstream containerd 2.4.2 (NRI v0.12), built with the machine's Go from the Go module
#        proxy by testkit/build_containerd.sh (no cgo)
# with bookworm's runc and busybox-static for every line (trixie's runc needs a newer glibc).
# Packages come from the Debian mirror this machine's apt already uses, through private source
# lists, with `apt-get download` + `dpkg -x`. Each line has its own root, cached by version.
# Usage: testkit/install.sh [RUNTIME [CACHE]]   RUNTIME defaults to $NRIPLUGIN_RUNTIME, else
# the newest (2.4); CACHE to ~/.cache/nriplugin/e2e. Prints the root last, on stdout; when the
# root is not cached yet, each step's progress on stderr (testkit/progress.sh).
set -euo pipefail
here=$(dirname "$0")
source "$here/progress.sh"
runtime=${1:-${NRIPLUGIN_RUNTIME:-2.4}}
cache=$(realpath -m "${2:-${NRIPLUGIN_CACHE:-$HOME/.cache/nriplugin}/e2e}")
upstream=2.4.2  # the newest containerd 2.x on the module proxy when this was written
case "$runtime" in
  1.7) suite=trixie ;;
  2.1) suite=sid ;;
  2.4) suite= ;;
  *) echo "unknown runtime '$runtime': one of 1.7, 2.1, 2.4" >&2; exit 2 ;;
esac
root="$cache/containerd-$runtime"
if [ -x "$root/usr/bin/containerd" ] && [ -x "$root/usr/sbin/runc" ] && [ -x "$root/bin/busybox" ] \
   && { [ -n "$suite" ] || [ "$(cat "$root/VERSION" 2>/dev/null)" = "$upstream" ]; }; then
  echo "$root"; exit 0
fi
uri=$(grep -hoE '^URIs: *[^ ]+' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1 | awk '{print $2}')
[ -n "$uri" ] || uri=$(grep -hoE '^deb +[^ ]+' /etc/apt/sources.list 2>/dev/null | head -1 | awk '{print $2}')
[ -n "$uri" ] || { echo "no Debian mirror found in this machine's apt sources" >&2; exit 1; }
debs="$cache/debs-$runtime"
fetch() {  # SUITE PACKAGE...
  local suite=$1; shift
  local d="$cache/apt-$suite"
  mkdir -p "$d/lists/partial" "$debs"
  echo "deb $uri $suite main" > "$d/sources.list"
  local o=(-o Dir::Etc::SourceList="$d/sources.list" -o Dir::Etc::SourceParts=/dev/null
           -o Dir::State::Lists="$d/lists" -o APT::Sandbox::User=root -qq)
  apt-get "${o[@]}" update >&2 && (cd "$debs" && apt-get "${o[@]}" download "$@" >&2)
}
unpack() {
  mkdir -p "$root"
  for f in "$debs"/*.deb; do dpkg -x "$f" "$root"; done
  rm -rf "$debs"
}
t0=$SECONDS
rm -rf "$debs" "$root"
if [ -n "$suite" ]; then
  progress_say "containerd $runtime: not cached yet, installing Debian $suite's into $root (2 steps)"
  progress_total 2
  progress_step 1 "fetching containerd from Debian $suite" "" -- fetch "$suite" containerd
  progress_step 2 "fetching runc and busybox-static from Debian bookworm" "" -- fetch bookworm runc busybox-static
  unpack
else
  progress_say "containerd $runtime: not cached yet, building containerd $upstream into $root" \
    "(4 steps, a few minutes; cached after that)"
  progress_total 4
  progress_step 1 "fetching runc and busybox-static from Debian bookworm" "" -- fetch bookworm runc busybox-static
  unpack
  PROGRESS_FIRST=1 PROGRESS_TOTAL=4 bash "$here/build_containerd.sh" "$upstream" "$root" >&2
  echo "$upstream" > "$root/VERSION"
fi
progress_say "containerd $runtime: installed in $(progress_time $((SECONDS - t0)))"
"$root/usr/bin/containerd" --version >&2
"$root/usr/sbin/runc" --version >&2
echo "$root"
