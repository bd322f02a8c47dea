#!/usr/bin/env bash
# Installs Debian's Prometheus (prometheus and promtool, one package) into a cache folder, never
# into the system (the package would start a service): `apt-get download` + `dpkg -x`, as
# testkit/install.sh does for containerd. The rules' unit tests and the real-Prometheus end-to-end
# test use it. Usage: scripts/prometheus.sh [CACHE]   (default ~/.cache/nriplugin/prometheus);
# prints the folder holding the two binaries.
set -euo pipefail
cache=$(realpath -m "${1:-${NRIPLUGIN_CACHE:-$HOME/.cache/nriplugin}/prometheus}")
bin="$cache/root/usr/bin"
if [ -x "$bin/prometheus" ] && [ -x "$bin/promtool" ]; then
  echo "$bin"; exit 0
fi
rm -rf "$cache/debs" "$cache/root"
mkdir -p "$cache/debs" "$cache/root"
if ! (cd "$cache/debs" && apt-get download -qq -o APT::Sandbox::User=root prometheus >&2); then
  apt-get update -qq >&2  # a fresh machine has no package lists yet
  (cd "$cache/debs" && apt-get download -qq -o APT::Sandbox::User=root prometheus >&2)
fi
dpkg -x "$cache"/debs/prometheus_*.deb "$cache/root"
rm -rf "$cache/debs"
"$bin/promtool" --version >&2
echo "$bin"
