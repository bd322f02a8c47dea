#!/usr/bin/env bash
# nriplugin on a kind cluster with NRI, from this checkout, on a machine with no registry:
#
#   bash kind/up.sh                # build what is missing (cached), cluster, image, agent
#   NRIPLUGIN_INSTALL=manifests bash kind/up.sh   # the plain manifests instead of the chart
#
# Builds (once; kind/build.sh) Kubernetes, kind, helm and the node image, and the agent's image
# (image/build.sh); starts a private dockerd (kind/lib.sh); creates the cluster of
# kind/cluster.yaml (a control plane and a worker) unless it exists; gives each node a bridge on
# its podCIDR; loads the agent's image into the nodes (and koord-manager's into the control
# plane, for e2e/cluster/test_koord.py); installs Koordinator's NodeSLO CRD and
# the agent with the Helm chart (charts/nriplugin, values ci/kind-values.yaml) or the manifests
# rendered from it (kind/*.yaml); waits for the DaemonSet to be Ready. Then:
#
#   export KUBECONFIG=/run/nriplugin-kind/kubeconfig   (printed at the end)
#   bash kind/down.sh              # the cluster, dockerd, its network and iptables chains: gone
#
# A failed bring-up tears down what it made (NRIPLUGIN_KIND_KEEP=1 keeps it to look at), after
# saving the nodes' logs under ~/.cache/nriplugin/kind/log/.
set -euo pipefail
t_start=$(date +%s)
source "$(dirname "$0")/lib.sh"
install_with=${NRIPLUGIN_INSTALL:-helm}
case $install_with in helm | manifests) ;; *) die "NRIPLUGIN_INSTALL=$install_with: helm or manifests" ;; esac
[ "$(id -u)" = 0 ] || die "needs root (Docker, cgroups)"
[ "$#" = 0 ] || die "usage: bash kind/up.sh   (no arguments; CLUSTER, NRIPLUGIN_INSTALL in the environment)"

failed() {
  local rc=$?
  trap - EXIT
  [ "$rc" -ne 0 ] || return 0
  say "bring-up failed (exit $rc)"
  if [ -x "$KIND_BIN" ] && docker info >/dev/null 2>&1 && "$KIND_BIN" get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
    local logs
    logs=$KIND_CACHE/log/failed-$(date +%Y%m%d-%H%M%S)
    "$KIND_BIN" export logs "$logs" --name "$CLUSTER" >/dev/null 2>&1 && say "the nodes' logs: $logs"
  fi
  if [ "${NRIPLUGIN_KIND_KEEP:-0}" = 1 ]; then
    say "kept as it is (NRIPLUGIN_KIND_KEEP=1); bash kind/down.sh removes it"
  else
    bash "$KIND_SRC/down.sh" >&2 || true
  fi
  exit "$rc"
}
trap failed EXIT

# 1. What the cluster runs on, built or found in the cache; the agent's image.
node=$(bash "$KIND_SRC/build.sh" | tail -1)
read -r NODE_TAG NODE_TAR <"$KIND_CACHE/node/current"
[ "$node" = "$NODE_TAG" ] || die "kind/build.sh made $node, but the cache names $NODE_TAG"
say "the agent's image (image/build.sh)"
archive=$(bash "$REPO/image/build.sh" | tail -1)
[ -s "$archive" ] || die "image/build.sh gave no archive"
t_built=$(date +%s)

# 2. The private dockerd and the node image in it.
docker_up
if ! docker image inspect "$NODE_TAG" >/dev/null 2>&1; then
  import_far() { echo "$(du -sm "$DOCKER_DATA" 2>/dev/null | cut -f1) MB in Docker's data root"; }
  progress "importing the node image $NODE_TAG" "$KIND_CACHE/log/docker-import.log" import_far \
    docker import --change 'ENV container=docker' \
    --change 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' "$NODE_TAR" "$NODE_TAG"
fi

# 3. The cluster.
export KUBECONFIG=$KUBECONFIG_FILE
kubectl() { "$KUBECTL" --kubeconfig "$KUBECONFIG_FILE" "$@"; }
if "$KIND_BIN" get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  say "cluster $CLUSTER exists: reusing it"
  "$KIND_BIN" get kubeconfig --name "$CLUSTER" >"$KUBECONFIG_FILE"
else
  t0=$(date +%s)
  say "creating cluster $CLUSTER (kind $KIND_VERSION, $NODE_TAG)"
  "$KIND_BIN" create cluster --name "$CLUSTER" --image "$NODE_TAG" --config "$KIND_SRC/cluster.yaml" \
    --kubeconfig "$KUBECONFIG_FILE" >&2
  say "cluster created in $(elapsed "$t0")"
fi
docker network inspect kind --format '{{.Id}}' | cut -c1-12 >"$KIND_RUN/network.id"

# 4. Pod networking: a bridge on each node's podCIDR and a route to every other node's.
nodes=$(kubectl get nodes -o jsonpath='{range .items[*]}{.metadata.name} {.spec.podCIDR} {.status.addresses[?(@.type=="InternalIP")].address}{"\n"}{end}')
while read -r name cidr ip; do
  [ -n "$cidr" ] || die "node $name has no podCIDR yet"
  docker exec -i "$name" sh -c 'mkdir -p /etc/cni/net.d && cat >/etc/cni/net.d/10-nriplugin-bridge.conflist' <<EOF
{"cniVersion": "1.0.0", "name": "nriplugin-kind", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$cidr"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
EOF
  while read -r other ocidr oip; do
    [ "$other" = "$name" ] || docker exec "$name" ip route replace "$ocidr" via "$oip"
  done <<<"$nodes"
done <<<"$nodes"
t0=$(date +%s)
kubectl wait --for=condition=Ready nodes --all --timeout=180s >&2
say "nodes Ready in $(elapsed "$t0")"

# 5. The agent: its image into every node, then the chart (or the manifests rendered from it).
t0=$(date +%s)
"$KIND_BIN" load image-archive "$archive" --name "$CLUSTER" >&2
say "loaded $(basename "$archive") into the nodes in $(elapsed "$t0")"
# koord-manager's image (kind/build.sh), on the control-plane node: e2e/cluster/test_koord.py
# deploys it there (kind/koord/) and removes it again; nothing else runs it.
t0=$(date +%s)
cp_nodes=$(kubectl get nodes -l node-role.kubernetes.io/control-plane -o jsonpath='{.items[*].metadata.name}' | tr ' ' ,)
"$KIND_BIN" load image-archive "$KOORD_TAR" --name "$CLUSTER" --nodes "$cp_nodes" >&2
say "loaded koord-manager's image into $cp_nodes in $(elapsed "$t0")"
operator=false
kubectl get crd podmonitors.monitoring.coreos.com prometheusrules.monitoring.coreos.com >/dev/null 2>&1 && operator=true
if [ "$install_with" = helm ]; then
  "$HELM_BIN" upgrade --install nriplugin "$REPO/charts/nriplugin" --kubeconfig "$KUBECONFIG_FILE" \
    --namespace nriplugin-system --create-namespace -f "$REPO/charts/nriplugin/ci/kind-values.yaml" \
    --set namespace.create=false --set podMonitor.enabled=$operator --set prometheusRule.enabled=$operator >&2
else  # the same objects, rendered from the chart (python -m tools.render_manifests)
  (cd "$REPO" && kubectl apply -f kind/crds/slo.koordinator.sh_nodeslos.yaml -f kind/namespace.yaml \
    -f kind/rbac.yaml -f kind/policy.yaml -f kind/daemonset.yaml) >&2
  # the Prometheus operator's objects, where its CRDs are installed
  [ "$operator" = false ] || (cd "$REPO" && kubectl apply -f kind/podmonitor.yaml -f kind/prometheusrule.yaml) >&2
fi
kubectl -n nriplugin-system rollout status daemonset/nriplugin --timeout=180s >&2
kubectl -n nriplugin-system get pods -o wide >&2
trap - EXIT
say "up in $(elapsed "$t_start") ($(elapsed "$t_built") after the build); installed with $install_with"
echo "export KUBECONFIG=$KUBECONFIG_FILE"
