#!/usr/bin/env bash
# Installs what the end-to-end tests need into a cache folder (never into the system):
# Debian trixie's containerd 1.7.24 (NRI v0.6.1), and bookworm's runc and busybox-static
# (trixie's runc needs a newer glibc). Packages come from the Debian mirror this machine's apt
# already uses, through private source lists, with `apt-get download` + `dpkg -x`.
# Usage: testkit/install.sh [CACHE]   (default: ~/.cache/nriplugin/e2e); prints the bin folder.
set -euo pipefail
cache=$(realpath -m "${1:-${NRIPLUGIN_CACHE:-$HOME/.cache/nriplugin}/e2e}")
root="$cache/root"
if [ -x "$root/usr/bin/containerd" ] && [ -x "$root/usr/sbin/runc" ] && [ -x "$root/bin/busybox" ]; then
  echo "$root"; exit 0
fi
uri=$(grep -hoE '^URIs: *[^ ]+' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1 | awk '{print $2}')
[ -n "$uri" ] || uri=$(grep -hoE '^deb +[^ ]+' /etc/apt/sources.list 2>/dev/null | head -1 | awk '{print $2}')
[ -n "$uri" ] || { echo "no Debian mirror found in this machine's apt sources" >&2; exit 1; }
fetch() {  # SUITE PACKAGE...
  local suite=$1; shift
  local d="$cache/apt-$suite"
  mkdir -p "$d/lists/partial" "$cache/debs"
  echo "deb $uri $suite main" > "$d/sources.list"
  local o=(-o Dir::Etc::SourceList="$d/sources.list" -o Dir::Etc::SourceParts=/dev/null
           -o Dir::State::Lists="$d/lists" -o APT::Sandbox::User=root -qq)
  apt-get "${o[@]}" update >&2
  (cd "$cache/debs" && apt-get "${o[@]}" download "$@" >&2)
}
rm -rf "$cache/debs" "$root"
fetch trixie containerd
fetch bookworm runc busybox-static
mkdir -p "$root"
for f in "$cache"/debs/*.deb; do dpkg -x "$f" "$root"; done
"$root/usr/bin/containerd" --version >&2
"$root/usr/sbin/runc" --version >&2
echo "$root"
