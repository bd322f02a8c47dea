# Shared by kind/build.sh, kind/up.sh and kind/down.sh (sourced, not run): the versions, where
# everything is cached, progress lines, and the private Docker daemon kind runs on.
#
# Everything lives under ${NRIPLUGIN_CACHE:-~/.cache/nriplugin}/kind, keyed by version, so a
# second build is a no-op; the running cluster's state (dockerd's socket, pid, exec root) lives
# under $KIND_RUN (/run/nriplugin-kind), which kind/down.sh removes.

K8S_VERSION=1.35.4       # Kubernetes (k8s.io/kubernetes on the Go module proxy)
ETCD_VERSION=3.6.6       # what kubeadm 1.35 deploys (its constants.DefaultEtcdVersion, 3.6.6-0)
COREDNS_VERSION=1.13.1   # kubeadm 1.35's constants.CoreDNSVersion
PAUSE_VERSION=3.10.1     # kubeadm 1.35's constants.PauseVersion (a static program built here)
KIND_VERSION=0.33.0      # sigs.k8s.io/kind
HELM_VERSION=4.3.2       # helm.sh/helm/v4
CRI_TOOLS_VERSION=1.37.0 # sigs.k8s.io/cri-tools: crictl in the node, critest
RUNC_VERSION=1.4.4       # the node's runc (testkit/build_runc.sh: with seccomp)
KOORD_VERSION=1.8.0      # Koordinator's koord-manager (kind/go/koord; e2e/cluster/test_koord.py)
NODE_SUITE=bookworm      # the node image's Debian

KIND_SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$KIND_SRC")
CACHE_ROOT=$(realpath -m "${NRIPLUGIN_CACHE:-$HOME/.cache/nriplugin}")
KIND_CACHE=$CACHE_ROOT/kind
KIND_RUN=${NRIPLUGIN_KIND_RUN:-/run/nriplugin-kind}
CLUSTER=${CLUSTER:-nriplugin}
GO=${GO:-/usr/local/go/bin/go}
[ -x "$GO" ] || GO=$(command -v go 2>/dev/null || echo /usr/local/go/bin/go)

# The Go caches are the project's (testkit/build_containerd.sh uses the same), never the user's.
export GOMODCACHE="$CACHE_ROOT/go/mod" GOCACHE="$CACHE_ROOT/go/build" GOTOOLCHAIN=local
export GOFLAGS="-buildvcs=false -modcacherw"

# Where the built tools land (one folder per version: a rerun finds them).
K8S_BIN=$KIND_CACHE/k8s/v$K8S_VERSION
ETCD_BIN=$KIND_CACHE/etcd/v$ETCD_VERSION/etcd
COREDNS_BIN=$KIND_CACHE/coredns/v$COREDNS_VERSION/coredns
KIND_BIN=$KIND_CACHE/kind/v$KIND_VERSION/kind
HELM_BIN=$KIND_CACHE/helm/v$HELM_VERSION/helm
CRI_TOOLS_BIN=$KIND_CACHE/cri-tools/v$CRI_TOOLS_VERSION
PAUSE_BIN=$KIND_CACHE/pause/$PAUSE_VERSION/pause
RUNC_WRAPPER=$KIND_CACHE/runc-wrapper/runc  # only where the machine lacks CAP_SYS_RESOURCE
KOORD_BIN=$KIND_CACHE/koord/v$KOORD_VERSION/koord-manager
KOORD_IMAGE=nriplugin.local/koord-manager:v$KOORD_VERSION  # its image (kind/build.sh), loaded by kind/up.sh
KOORD_TAR=$KIND_CACHE/koord/v$KOORD_VERSION/koord-manager.tar
KUBECTL=$K8S_BIN/kubectl
KUBECONFIG_FILE=$KIND_RUN/kubeconfig

t_start=${t_start:-$(date +%s)}
say() { echo "kind: [$(elapsed $t_start)] $*" >&2; }
die() { echo "kind: error: $*" >&2; exit 1; }
elapsed() { local s=$(($(date +%s) - $1)); printf '%dm%02ds' $((s / 60)) $((s % 60)); }

# progress WHAT LOG HOW-FAR-FUNCTION COMMAND...: runs COMMAND with its output in LOG and prints a
# line every 15 s: what it is doing, how far (the function's answer, given LOG), and the time.
# On failure the log's tail is shown and the status returned.
progress() {
  local what=$1 log=$2 far=$3 t0 pid rc
  shift 3
  t0=$(date +%s)
  mkdir -p "$(dirname "$log")"
  say "$what ..."
  "$@" >"$log" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    for _ in $(seq 15); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -0 "$pid" 2>/dev/null && say "  $what: $($far "$log"), $(elapsed "$t0")"
  done
  wait "$pid" && rc=0 || rc=$?
  if [ "$rc" -ne 0 ]; then
    tail -25 "$log" >&2
    say "$what: failed (exit $rc) after $(elapsed "$t0"); the whole log: $log"
    return "$rc"
  fi
  say "$what: done in $(elapsed "$t0")"
}
lines_of() { wc -l <"$1" | tr -d ' '; }

# Whether this machine's capability bounding set lacks CAP_SYS_RESOURCE (bit 24): then
# `docker run --privileged` fails ("unable to apply caps") unless a runc wrapper drops it.
lacks_sys_resource() {
  local bnd
  bnd=$(awk '/^CapBnd:/ {print $2}' /proc/self/status)
  [ $(((16#$bnd >> 24) & 1)) -eq 0 ]
}

# --- the private Docker daemon -------------------------------------------------------------------
# kind's node containers run on a dockerd of our own (Debian's docker.io): its data root in the
# cache (the node image stays between runs), its socket, pid and exec root under $KIND_RUN, its
# containers under one cgroup parent, no default bridge. The machine's own Docker, if any, is
# never touched.
DOCKER_DATA=$KIND_CACHE/docker
DOCKER_SOCK=$KIND_RUN/docker.sock
DOCKER_PIDFILE=$KIND_RUN/dockerd.pid
DOCKER_CGROUP_PARENT=nriplugin-kind
export DOCKER_HOST=unix://$DOCKER_SOCK
# kind calls `docker` from PATH: Debian's client first (the machine may have another).
export PATH="$KIND_CACHE/bin:$PATH"

need_docker_packages() {
  if [ ! -x /usr/sbin/dockerd ] || [ ! -x /usr/bin/docker ]; then
    say "installing Debian's docker.io (apt; its own service is not started)"
    apt-get update -qq >&2
    # No daemon of the package's own: a policy-rc.d refusing every start while it installs.
    local had_policy=0
    [ ! -e /usr/sbin/policy-rc.d ] || had_policy=1
    [ "$had_policy" = 1 ] || printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker.io >&2 || {
      [ "$had_policy" = 1 ] || rm -f /usr/sbin/policy-rc.d
      die "apt-get install docker.io failed"
    }
    [ "$had_policy" = 1 ] || rm -f /usr/sbin/policy-rc.d
  fi
  mkdir -p "$KIND_CACHE/bin"
  ln -sfn /usr/bin/docker "$KIND_CACHE/bin/docker"
}

docker_up() {  # start our dockerd unless it answers already
  need_docker_packages
  if docker info >/dev/null 2>&1; then return 0; fi
  local runtime_args=()
  if lacks_sys_resource; then
    [ -x "$RUNC_WRAPPER" ] || die "no runc wrapper at $RUNC_WRAPPER: run bash kind/build.sh first"
    runtime_args=(--add-runtime "nosysres=$RUNC_WRAPPER" --default-runtime nosysres)
  fi
  mkdir -p "$DOCKER_DATA" "$KIND_RUN"
  [ -f "$KIND_RUN/ip_forward.before" ] || cat /proc/sys/net/ipv4/ip_forward >"$KIND_RUN/ip_forward.before"
  [ -f "$KIND_RUN/iptables.before" ] || iptables-save >"$KIND_RUN/iptables.before" 2>/dev/null || true
  say "starting a private dockerd (data root $DOCKER_DATA, log $KIND_RUN/dockerd.log)"
  /usr/sbin/dockerd --host "$DOCKER_HOST" --pidfile "$DOCKER_PIDFILE" --data-root "$DOCKER_DATA" \
    --exec-root "$KIND_RUN/exec" --bridge none --cgroup-parent "$DOCKER_CGROUP_PARENT" \
    --exec-opt native.cgroupdriver=cgroupfs --log-level warn "${runtime_args[@]}" \
    >"$KIND_RUN/dockerd.log" 2>&1 </dev/null &
  echo $! >"$KIND_RUN/dockerd.launched"
  for _ in $(seq 60); do
    docker info >/dev/null 2>&1 && return 0
    kill -0 "$(cat "$KIND_RUN/dockerd.launched")" 2>/dev/null || break
    sleep 0.5
  done
  tail -20 "$KIND_RUN/dockerd.log" >&2
  die "dockerd did not come up"
}
