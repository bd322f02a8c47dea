#!/usr/bin/env bash
# Creates .venv with nriplugin and its test extra (idempotent). Needs Python >= 3.11 with venv;
# installs Debian's python3-venv if the interpreter lacks it. Arguments name more extras to
# install as well (scripts/main.sh: demo, for the QoS timeline's PNG). As root, also Debian's
# CNI plugins (bridge, host-local, loopback), iperf3 and iproute2 for the network lab
# (testkit/netlab.py), and gcc and libseccomp-dev for runc, when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" = 0 ] && { [ ! -x /usr/lib/cni/bridge ] || ! command -v iperf3 >/dev/null || ! command -v tc >/dev/null; }; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq containernetworking-plugins iperf3 iproute2 >/dev/null
fi
if ! command -v python3 >/dev/null; then
  apt-get update -qq && apt-get install -y -qq python3 python3-venv >/dev/null
fi
if [ ! -x .venv/bin/python ]; then
  if ! python3 -m venv .venv 2>/dev/null; then
    rm -rf .venv
    apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
    python3 -m venv .venv
  fi
fi
# gcc, libc headers and libseccomp's (through pkg-config): runc (testkit/build_runc.sh) has C
# parts and is built with seccomp; the newest runtime's BE scheduling tests build it.
if [ "$(id -u)" = 0 ] && { ! command -v gcc >/dev/null || [ ! -f /usr/include/stdio.h ] ||
  ! command -v pkg-config >/dev/null || ! pkg-config --exists libseccomp; }; then
  apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc libc6-dev libseccomp-dev pkg-config >/dev/null
fi
# iperf3 and ping: the network QoS tests measure real traffic between network namespaces.
if ! command -v iperf3 >/dev/null || ! command -v ping >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iperf3 iputils-ping >/dev/null
fi
extras=test
for extra in "$@"; do extras="$extras,$extra"; done
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[$extras]"
