#!/usr/bin/env bash
# Removes everything kind/up.sh made, even after a failed or interrupted bring-up: the kind
# cluster, its Docker network, the private dockerd (by its pid) and its containerd, the iptables
# rules and chains dockerd added, its mounts, its cgroups, /run/nriplugin-kind; restores
# net.ipv4.ip_forward. The caches (node image, Docker's data root) stay. Then checks that nothing
# is left and says what is, with exit status 1.
#
#   bash kind/down.sh
set -uo pipefail
source "$(dirname "$0")/lib.sh"
[ "$(id -u)" = 0 ] || die "needs root"
t0=$(date +%s)
left=()

pid_of() { [ -s "$1" ] && cat "$1" 2>/dev/null; }
alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }
stop_pid() {  # PID WHAT: SIGTERM, up to 30 s, then SIGKILL
  local pid=$1
  alive "$pid" || return 0
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 60); do alive "$pid" || return 0; sleep 0.5; done
  say "$2 (pid $pid) did not stop in 30 s: SIGKILL"
  kill -KILL "$pid" 2>/dev/null
  sleep 1
}

dockerd_pid=$(pid_of "$DOCKER_PIDFILE" || pid_of "$KIND_RUN/dockerd.launched" || true)
ctrd_pid=$(pid_of "$KIND_RUN/exec/containerd/containerd.pid" || true)
if [ -S "$DOCKER_SOCK" ] && docker info >/dev/null 2>&1; then
  if [ -x "$KIND_BIN" ] && "$KIND_BIN" get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
    say "deleting cluster $CLUSTER"
    "$KIND_BIN" delete cluster --name "$CLUSTER" --kubeconfig "$KUBECONFIG_FILE" >&2 || true
  fi
  # Whatever kind left (an interrupted create): its labelled containers, then the network.
  ids=$(docker ps -aq --filter label=io.x-k8s.kind.cluster 2>/dev/null)
  [ -z "$ids" ] || docker rm -f -v $ids >/dev/null 2>&1 || true
  docker network rm kind >/dev/null 2>&1 || true
  docker volume prune -f >/dev/null 2>&1 || true
fi
if alive "$dockerd_pid"; then
  say "stopping the private dockerd (pid $dockerd_pid)"
  stop_pid "$dockerd_pid" dockerd
fi
stop_pid "$ctrd_pid" "dockerd's containerd"

# dockerd never removes its iptables chains: every rule it added (those that jump to or sit in a
# DOCKER chain, or name kind's bridge) and then the chains. Not while the machine's own Docker
# runs: those chains are its too.
net_id=$(cat "$KIND_RUN/network.id" 2>/dev/null || true)
own_docker=$(pid_of /var/run/docker.pid || true)
if alive "$own_docker"; then
  say "the machine's own dockerd runs (pid $own_docker): its DOCKER chains stay"
else
  for table in filter nat; do
    iptables -t "$table" -S 2>/dev/null | grep -E '^-A ' | grep -E -- "(-j|-A) DOCKER|br-${net_id:-none}( |\$)" |
      while read -r rule; do
        eval "iptables -t $table ${rule/-A/-D}" 2>/dev/null || true
      done
    for chain in $(iptables -t "$table" -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^DOCKER/ {print $2}'); do
      iptables -t "$table" -F "$chain" 2>/dev/null
      iptables -t "$table" -X "$chain" 2>/dev/null
    done
  done
fi
# dockerd sets the FORWARD chain's policy to DROP: back to what it was before.
if ! alive "$own_docker" && [ -s "$KIND_RUN/iptables.before" ]; then
  policy=$(awk '/^\*filter/ {f = 1} f && /^:FORWARD / {print $2; exit}' "$KIND_RUN/iptables.before")
  [ -z "$policy" ] || iptables -P FORWARD "$policy"
fi
if [ -s "$KIND_RUN/ip_forward.before" ]; then
  cat "$KIND_RUN/ip_forward.before" >/proc/sys/net/ipv4/ip_forward
fi

# Mounts of the data root or the run folder (overlays, network namespaces) that outlived dockerd.
for m in $(awk -v a="$DOCKER_DATA/" -v b="$KIND_RUN/" 'index($5, a) == 1 || index($5, b) == 1 {print $5}' /proc/self/mountinfo | sort -r); do
  umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
done
# The cgroup parent of the node containers, in every hierarchy, deepest first (empty by now).
for h in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
  [ -d "$h$DOCKER_CGROUP_PARENT" ] && find "$h$DOCKER_CGROUP_PARENT" -depth -type d -exec rmdir {} + 2>/dev/null
done
rm -rf "$KIND_RUN"

# What is left, if anything.
alive "$dockerd_pid" && left+=("dockerd pid $dockerd_pid")
alive "$ctrd_pid" && left+=("containerd pid $ctrd_pid")
for p in /proc/[0-9]*; do  # processes still rooted in our folders (kind's nodes' shims, ...)
  cmd=$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null) || continue
  [[ $cmd != *"$DOCKER_DATA/"* && $cmd != *"$KIND_RUN/"* ]] || left+=("process ${p#/proc/}: ${cmd:0:80}")
done
if ! alive "$own_docker"; then
  iptables-save 2>/dev/null | grep -qE "DOCKER|br-${net_id:-none}( |\$)" && left+=("iptables rules of Docker")
  if [ -n "${policy:-}" ] && ! iptables -S FORWARD 2>/dev/null | grep -qx -- "-P FORWARD $policy"; then
    left+=("the FORWARD policy is not $policy as before")
  fi
fi
[ -z "$net_id" ] || [ ! -e "/sys/class/net/br-$net_id" ] || left+=("bridge br-$net_id")
grep -qE " ($DOCKER_DATA|$KIND_RUN)/" /proc/self/mountinfo && left+=("mounts under $DOCKER_DATA or $KIND_RUN")
for h in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
  [ ! -d "$h$DOCKER_CGROUP_PARENT" ] || left+=("cgroup $h$DOCKER_CGROUP_PARENT")
done
if [ "${#left[@]}" -gt 0 ]; then
  printf 'kind: left behind: %s\n' "${left[@]}" >&2
  exit 1
fi
say "down in $(elapsed "$t0"): no cluster, dockerd, network, iptables rule, mount or cgroup of ours is left"
