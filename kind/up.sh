#!/usr/bin/env bash
# Brings up nriplugin on a kind cluster with NRI enabled. Needs kind, Docker (or podman as kind's
# provider) and kubectl on the machine; none of them can run on this project's CI machines, so
# the tests validate these manifests against the Kubernetes schemas instead (tests/test_deploy.py).
#
#   bash kind/up.sh [IMAGE-ARCHIVE]
#
# IMAGE-ARCHIVE: the OCI archive bash image/build.sh prints as its last line; without it the
# image $IMAGE (default nriplugin:0.1.0) must be in the local Docker. The cluster is created
# only if it does not exist yet ($CLUSTER, default nriplugin). The PodMonitor and the
# PrometheusRule are applied where the Prometheus operator's CRDs are installed.
set -euo pipefail
cd "$(dirname "$0")/.."
cluster=${CLUSTER:-nriplugin}
image=${IMAGE:-nriplugin:0.1.0}
archive=${1:-}
for tool in kind kubectl; do
  command -v "$tool" >/dev/null || { echo "kind/up.sh: $tool is not installed" >&2; exit 2; }
done
if ! kind get clusters 2>/dev/null | grep -qx "$cluster"; then
  kind create cluster --name "$cluster" --config kind/cluster.yaml
fi
kubectl config use-context "kind-$cluster" >/dev/null
if [ -n "$archive" ]; then
  kind load image-archive "$archive" --name "$cluster"
else
  kind load docker-image "$image" --name "$cluster"
fi
kubectl apply -f kind/namespace.yaml
if [ -f kind/rbac.yaml ]; then kubectl apply -f kind/rbac.yaml; fi  # the ServiceAccount and its RBAC
kubectl apply -f kind/policy.yaml -f kind/daemonset.yaml
kubectl -n nriplugin-system rollout status daemonset/nriplugin --timeout=180s
if kubectl get crd podmonitors.monitoring.coreos.com prometheusrules.monitoring.coreos.com >/dev/null 2>&1; then
  kubectl apply -f kind/podmonitor.yaml -f kind/prometheusrule.yaml
else
  echo "kind/up.sh: no Prometheus operator CRDs here: skipped kind/podmonitor.yaml and kind/prometheusrule.yaml" >&2
fi
kubectl -n nriplugin-system get pods -o wide
