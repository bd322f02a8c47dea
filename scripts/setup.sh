#!/usr/bin/env bash
# Creates .venv with nriplugin and its test extra (idempotent). Needs Python >= 3.11 with venv;
# installs Debian's python3-venv if the interpreter lacks it. Arguments name more extras to
# install as well (scripts/main.sh: demo, for the QoS timeline's PNG). As root, also Debian's
# CNI plugins (bridge, host-local, loopback), iperf3 and iproute2 for the network lab
# (testkit/netlab.py), and gcc and libseccomp-dev for runc, when missing.
# Each step that can take a while says what it does and how long it has taken (progress.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
source testkit/progress.sh
apt_install() {  # PACKAGE...
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}
debian() {  # PACKAGE...: apt_install with progress lines
  progress_step "" "set-up: installing Debian's $*" "" -- apt_install "$@"
}
if [ "$(id -u)" = 0 ] && { [ ! -x /usr/lib/cni/bridge ] || ! command -v iperf3 >/dev/null || ! command -v tc >/dev/null; }; then
  debian containernetworking-plugins iperf3 iproute2
fi
if ! command -v python3 >/dev/null; then
  debian python3 python3-venv
fi
if [ ! -x .venv/bin/python ]; then
  if ! python3 -m venv .venv 2>/dev/null; then
    rm -rf .venv
    debian python3-venv
    python3 -m venv .venv
  fi
fi
# gcc, libc headers and libseccomp's (through pkg-config): runc (testkit/build_runc.sh) has C
# parts and is built with seccomp; the newest runtime's BE scheduling tests build it.
if [ "$(id -u)" = 0 ] && { ! command -v gcc >/dev/null || [ ! -f /usr/include/stdio.h ] ||
  ! command -v pkg-config >/dev/null || ! pkg-config --exists libseccomp; }; then
  debian gcc libc6-dev libseccomp-dev pkg-config
fi
# iperf3 and ping: the network QoS tests measure real traffic between network namespaces.
if ! command -v iperf3 >/dev/null || ! command -v ping >/dev/null; then
  debian iperf3 iputils-ping
fi
extras=test
for extra in "$@"; do extras="$extras,$extra"; done
installed() {  # how far pip is: the distributions in the venv so far
  echo "$(find .venv/lib -maxdepth 3 -name '*.dist-info' 2>/dev/null | wc -l) packages in .venv"
}
progress_step "" "set-up: nriplugin and its Python packages ($extras) into .venv" installed -- \
  .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[$extras]"
