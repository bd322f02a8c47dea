#!/usr/bin/env bash
# The koordlet lane: Koordinator's koordlet v1.8.0 beside nriplugin on a host-process node
# (testkit/hostnode.py: etcd, kube-apiserver and a kubelet on the private containerd). Builds
# what it needs, cached: Kubernetes' binaries and etcd (kind/build.sh tools) and koordlet
# (testkit/peers/koordlet.sh, cgo); then `pytest -m koordlet e2e/peers`. Not in CI (.ci/run):
# see the README. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash kind/build.sh tools >/dev/null
bash testkit/peers/koordlet.sh >/dev/null
exec bash scripts/pytest.sh -m koordlet e2e/peers "$@"
