#!/usr/bin/env bash
# Builds, once, everything a kind cluster with NRI needs on a machine with no registry to pull
# from, cached under ${NRIPLUGIN_CACHE:-~/.cache/nriplugin}/kind and keyed by version: a rerun
# with nothing changed does nothing (and says so).
#
#   bash kind/build.sh            # all of it; prints the node image's tag last
#   bash kind/build.sh helm       # only helm (the chart tests need it)
#   bash kind/build.sh critest    # only critest (the CRI validation suite; testkit/critest.py)
#   bash kind/build.sh koord      # only koord-manager and its image (e2e/cluster/test_koord.py)
#
# From the Go module proxy with the machine's Go (CGO off unless said): Kubernetes'
# commands (kind/go/k8s), etcd (kind/go/etcd), Koordinator's koord-manager and its image
# (kind/go/koord; for e2e/cluster/test_koord.py), CoreDNS, kind, helm, crictl/critest, the pause
# program (kind/node/pause), runc with seccomp (testkit/build_runc.sh) and containerd 2.4
# (testkit/install.sh). Then the control-plane images (tools/docker_archive.py, under the tags
# kubeadm asks for) and the node image: a debootstrap --variant=minbase root with systemd and
# the packages kind's own base image names, kind's base files (from the kind module), containerd
# 2.4 with NRI (kind/node/containerd.toml), runc, the CNI plugins, kubelet/kubeadm/kubectl, and
# the control-plane images already in its containerd. kind/up.sh imports it into the private
# Docker. Where the machine's capability bounding set lacks CAP_SYS_RESOURCE, also the runc
# wrapper dockerd needs (kind/node/runc-nosysres).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
what=${1:-all}
case $what in all | helm | tools | critest | koord) ;; *) die "usage: bash kind/build.sh [all|helm|tools|critest|koord]" ;; esac
[ "$(id -u)" = 0 ] || die "needs root (debootstrap, containerd, docker)"
[ -x "$GO" ] || die "no Go toolchain (set GO=...; Go >= 1.25)"
mkdir -p "$KIND_CACHE/src" "$KIND_CACHE/log"
LOG=$KIND_CACHE/log

mod_far() { echo "module cache $(du -sm "$GOMODCACHE/cache/download" 2>/dev/null | cut -f1) MB"; }
GOBUILD_TOTAL=0
build_far() { echo "$(lines_of "$1")/$GOBUILD_TOTAL packages compiled"; }

# gobuild WHAT MODULE-DIR OUT-DIR CGO LDFLAGS PKG...: go build -v with progress; OUT-DIR appears
# whole or not at all.
gobuild() {
  local what=$1 src=$2 out=$3 cgo=$4 ldflags=$5
  shift 5
  GOBUILD_TOTAL=$(cd "$src" && CGO_ENABLED=$cgo "$GO" list -deps "$@" | wc -l)
  rm -rf "$out.partial" && mkdir -p "$out.partial"
  progress "$what" "$LOG/$(basename "$(dirname "$out")").log" build_far \
    env -C "$src" CGO_ENABLED="$cgo" nice -n 10 "$GO" build -v -trimpath -ldflags "$ldflags" -o "$out.partial/" "$@"
  rm -rf "$out" && mv "$out.partial" "$out"
}

# wrapper NAME SRC-DIR: a copy of kind/go/NAME in the cache with its go.sum, tidied (downloading
# the modules) when the checkout has none yet; prints the copy's folder.
wrapper() {
  local name=$1 dir=$KIND_CACHE/src/$1
  rm -rf "$dir" && mkdir -p "$dir"
  cp "$KIND_SRC/go/$name"/go.mod "$KIND_SRC/go/$name"/*.go "$dir/"
  if [ -s "$KIND_SRC/go/$name/go.sum" ]; then
    cp "$KIND_SRC/go/$name/go.sum" "$dir/"
    progress "$name: modules" "$LOG/$name-mod.log" mod_far env -C "$dir" "$GO" mod download -x >&2
  else
    progress "$name: go mod tidy (modules)" "$LOG/$name-mod.log" mod_far env -C "$dir" "$GO" mod tidy -x >&2
    say "$name: no go.sum in the checkout: kind/go/$name/go.mod and go.sum as tidied are in $dir (commit them)"
  fi
  echo "$dir"
}

# module NAME PACKAGE@VERSION: a throwaway module requiring the package's module as released
# (for modules whose go.mod has no replace directive that matters); prints its folder.
module() {
  local name=$1 dir=$KIND_CACHE/src/$1
  if [ "$(cat "$dir/.ready" 2>/dev/null)" != "$2" ]; then
    rm -rf "$dir" && mkdir -p "$dir"
    (cd "$dir" && "$GO" mod init "nriplugin.local/kind/$name" >/dev/null 2>&1)
    progress "$name: modules" "$LOG/$name-mod.log" mod_far env -C "$dir" "$GO" get -x "$2"
    echo "$2" >"$dir/.ready"
  fi
  echo "$dir"
}

# The recipe's revision: part of the base's, the images' and the node's cache keys. Raise it
# when a change to this script changes what they contain (other inputs are hashed).
RECIPE=1

K8S_LDFLAGS="-s -w"
for v in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  K8S_LDFLAGS+=" -X $v.gitVersion=v$K8S_VERSION -X $v.gitMajor=${K8S_VERSION%%.*}"
  K8S_LDFLAGS+=" -X $v.gitMinor=$(cut -d. -f2 <<<"$K8S_VERSION") -X $v.gitTreeState=clean -X $v.gitCommit=module-proxy"
done
K8S_CMDS=(kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubelet kubeadm kubectl)

build_k8s() {
  if "$K8S_BIN/kubelet" --version 2>/dev/null | grep -qx "Kubernetes v$K8S_VERSION" &&
    for c in "${K8S_CMDS[@]}"; do [ -x "$K8S_BIN/$c" ] || exit 1; done; then
    say "Kubernetes v$K8S_VERSION: cached ($K8S_BIN)"
    return
  fi
  local src pkgs=()
  src=$(wrapper k8s)
  for c in "${K8S_CMDS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
  gobuild "Kubernetes v$K8S_VERSION (${K8S_CMDS[*]})" "$src" "$K8S_BIN" 0 "$K8S_LDFLAGS" "${pkgs[@]}"
  "$K8S_BIN/kubelet" --version >&2
}

build_etcd() {
  if (set +o pipefail; "$ETCD_BIN" --version 2>/dev/null | grep -q "^etcd Version: $ETCD_VERSION\$"); then  # as in simple()
    say "etcd $ETCD_VERSION: cached"
    return
  fi
  local src
  src=$(wrapper etcd)
  local out
  out=$(dirname "$ETCD_BIN")
  gobuild "etcd $ETCD_VERSION" "$src" "$out" 0 "-s -w" go.etcd.io/etcd/server/v3
  # go names the binary after the path's last element but the major version: server
  for f in "$out"/*; do [ "$f" = "$ETCD_BIN" ] || mv "$f" "$ETCD_BIN"; done
  "$ETCD_BIN" --version | head -1 >&2
}

# simple NAME MODULE VERSION BIN-PATH VERSION-CHECK LDFLAGS PKG...: a released module's commands.
simple() {
  local name=$1 mod=$2 version=$3 bin=$4 check=$5 ldflags=$6
  shift 6
  # A check is "BIN version | grep -q ...": without pipefail, as grep says; with it, a binary
  # that writes on after grep -q has its line and closed the pipe (SIGPIPE) would fail it.
  if (set +o pipefail; eval "$check") >/dev/null 2>&1; then
    say "$name $version: cached"
    return
  fi
  local src
  src=$(module "$name" "$1@v$version")
  gobuild "$name $version" "$src" "$(dirname "$bin")" 0 "$ldflags" "$@"
  (set +o pipefail; eval "$check") >/dev/null || die "$name: built, but '$check' fails"
}

# critest: cri-tools' CRI validation suite, a ginkgo test binary (`go test -c`, as its Makefile
# builds it), in a copy of the released module so that its own go.mod and go.sum pick every
# dependency. testkit/critest.py runs it against the private containerd.
build_critest() {
  local bin=$CRI_TOOLS_BIN/critest src=$KIND_CACHE/src/critest mod
  # its output whole before grep: grep -q would close the pipe early, and pipefail fail the test
  critest_says() { local out; out=$("$bin" -version 2>/dev/null) || true; grep -q "critest version: v$CRI_TOOLS_VERSION" <<<"$out"; }
  if critest_says; then
    say "critest $CRI_TOOLS_VERSION: cached"
    return
  fi
  mod=$("$GO" mod download -json "sigs.k8s.io/cri-tools@v$CRI_TOOLS_VERSION" | jq -r .Dir)
  [ -f "$mod/cmd/critest/cri_test.go" ] || die "no cmd/critest in sigs.k8s.io/cri-tools@v$CRI_TOOLS_VERSION ($mod)"
  rm -rf "$src" && mkdir -p "$(dirname "$src")" && cp -r "$mod" "$src" && chmod -R u+w "$src"
  progress "critest $CRI_TOOLS_VERSION: modules" "$LOG/critest-mod.log" mod_far env -C "$src" "$GO" mod download -x
  mkdir -p "$CRI_TOOLS_BIN"
  progress "critest $CRI_TOOLS_VERSION (go test -c)" "$LOG/critest.log" log_far \
    env -C "$src" CGO_ENABLED=0 nice -n 10 "$GO" test -c -trimpath -o "$bin.partial" \
    -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=v$CRI_TOOLS_VERSION" ./cmd/critest
  mv "$bin.partial" "$bin"
  critest_says || die "critest: built, but -version does not say v$CRI_TOOLS_VERSION"
  rm -rf "$src"
}
log_far() { echo "log $(lines_of "$1") lines"; }

build_pause() {
  if [ -x "$PAUSE_BIN" ]; then say "pause $PAUSE_VERSION: cached"; return; fi
  gobuild "pause $PAUSE_VERSION" "$KIND_SRC/node/pause" "$(dirname "$PAUSE_BIN")" 0 "-s -w" .
}

build_helm() {
  simple helm helm.sh/helm/v4 "$HELM_VERSION" "$HELM_BIN" "'$HELM_BIN' version --template '{{.Version}}' | grep -qx v$HELM_VERSION" \
    "-s -w -X helm.sh/helm/v4/internal/version.version=v$HELM_VERSION" helm.sh/helm/v4/cmd/helm
}

build_runc_wrapper() {
  if ! lacks_sys_resource; then
    say "this machine has CAP_SYS_RESOURCE: no runc wrapper needed"
    return
  fi
  if cmp -s "$KIND_SRC/node/runc-nosysres" "$RUNC_WRAPPER"; then say "runc wrapper: cached"; return; fi
  mkdir -p "$(dirname "$RUNC_WRAPPER")"
  install -m 0755 "$KIND_SRC/node/runc-nosysres" "$RUNC_WRAPPER"
  say "runc wrapper (drops CAP_SYS_RESOURCE, which this machine lacks): $RUNC_WRAPPER"
}

# koord-manager: Koordinator's control-plane manager (NodeSLO from slo-controller-config, batch
# resources from NodeMetric), for e2e/cluster/test_koord.py; from the wrapper module kind/go/koord
# (Koordinator's replace block copied), CGO off, static. Its image: the binary on a folder with
# /etc/passwd and /tmp, as the control-plane images are made; kind/up.sh loads it into the nodes.
build_koord() {
  if [ -x "$KOORD_BIN" ] && [ -s "$KOORD_TAR" ]; then
    say "koord-manager v$KOORD_VERSION: cached ($KOORD_TAR)"
    return
  fi
  local src out tmp py=python3
  out=$(dirname "$KOORD_BIN")
  if [ ! -x "$KOORD_BIN" ]; then
    src=$(wrapper koord)
    gobuild "koord-manager v$KOORD_VERSION" "$src" "$out" 0 "-s -w" github.com/koordinator-sh/koordinator/cmd/koord-manager
  fi
  [ -x "$REPO/.venv/bin/python" ] && py=$REPO/.venv/bin/python
  tmp=$(mktemp -d "$KIND_CACHE/koord/stage.XXXXXX")
  mkdir -p "$tmp/etc" "$tmp/tmp" "$tmp/usr/local/bin"
  chmod 1777 "$tmp/tmp"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n' >"$tmp/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$tmp/etc/group"
  cp "$KOORD_BIN" "$tmp/usr/local/bin/"
  (cd "$REPO" && "$py" -m tools.docker_archive "$KOORD_TAR.partial" --tag "$KOORD_IMAGE" \
    --entrypoint '["/usr/local/bin/koord-manager"]' --layer "$tmp")
  rm -rf "$tmp"
  mv "$KOORD_TAR.partial" "$KOORD_TAR"
  say "koord-manager v$KOORD_VERSION: $KOORD_BIN ($(du -sm "$KOORD_BIN" | cut -f1) MB), image $KOORD_IMAGE in $KOORD_TAR"
}

# --- images --------------------------------------------------------------------------------------
BASE_PACKAGES=systemd,conntrack,iptables,nftables,iproute2,ethtool,util-linux,mount,kmod,libseccomp2,pigz,ca-certificates,curl,jq,procps,bash
debootstrap_far() { echo "$(grep -c '^I: \(Retrieving\|Validating\|Unpacking\|Configuring\)' "$1") steps, now: $(grep '^I: ' "$1" | tail -1 | cut -c1-60)"; }

# The node's Debian root, as kind's images/base/Dockerfile prepares it (its package list but
# for NFS, iSCSI and fuse-overlayfs, which nothing here uses).
build_base() {
  local key
  key=$(echo "$NODE_SUITE $BASE_PACKAGES recipe $RECIPE" | sha256sum | cut -c1-12)
  BASE_TAR=$KIND_CACHE/base/$NODE_SUITE-$key.tar
  if [ -s "$BASE_TAR" ]; then say "node base ($NODE_SUITE): cached"; return; fi
  command -v debootstrap >/dev/null || {
    say "installing debootstrap (apt)"
    apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >&2
  }
  local mirror root=$KIND_CACHE/base/rootfs
  mirror=$(grep -hoE '^URIs: *[^ ]+' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1 | awk '{print $2}')
  [ -n "$mirror" ] || mirror=$(grep -hoE '^deb +[^ ]+' /etc/apt/sources.list 2>/dev/null | head -1 | awk '{print $2}')
  mirror=${mirror:-http://deb.debian.org/debian}
  unmount_under "$root"
  rm -rf "$root" && mkdir -p "$root"
  trap 'unmount_under "'"$root"'"' EXIT
  progress "node base: debootstrap $NODE_SUITE minbase + $(tr , "\n" <<<"$BASE_PACKAGES" | wc -l) packages" "$LOG/debootstrap.log" debootstrap_far \
    debootstrap --variant=minbase --include="$BASE_PACKAGES" "$NODE_SUITE" "$root" "$mirror"
  unmount_under "$root"
  trap - EXIT
  # kind's clean-ups: no unit wanted but those kind/up.sh's node enables, no kmsg in journald.
  find "$root/lib/systemd/system/sysinit.target.wants/" -name systemd-tmpfiles-setup.service -delete
  rm -f "$root"/lib/systemd/system/multi-user.target.wants/* "$root"/etc/systemd/system/*.wants/* \
    "$root"/lib/systemd/system/local-fs.target.wants/* "$root"/lib/systemd/system/sockets.target.wants/*udev* \
    "$root"/lib/systemd/system/sockets.target.wants/*initctl* "$root"/lib/systemd/system/basic.target.wants/*
  echo ReadKMsg=no >>"$root/etc/systemd/journald.conf"
  ln -sf /usr/lib/systemd/systemd "$root/sbin/init"
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* \
    "$root"/usr/share/man/* "$root"/usr/share/locale/* "$root"/etc/hostname "$root"/etc/resolv.conf
  tar --numeric-owner -C "$root" -cf "$BASE_TAR.partial" .
  mv "$BASE_TAR.partial" "$BASE_TAR"
  rm -rf "$root"
  say "node base: $BASE_TAR ($(du -sm "$BASE_TAR" | cut -f1) MB)"
}

unmount_under() {  # PATH: every mount under it, deepest first (debootstrap's, after a failure)
  local m
  for m in $(awk -v p="$1/" 'index($5, p) == 1 {print $5}' /proc/self/mountinfo | sort -r); do
    umount -l "$m" 2>/dev/null || true
  done
}

# The control-plane images kubeadm's manifests name (its own list, `kubeadm config images
# list`), each a static binary on a folder with /etc/passwd and /tmp; kube-proxy's on the node
# base (it runs iptables).
build_images() {
  local key dir
  key=$( (echo "$BASE_TAR recipe $RECIPE"; sha256sum "$K8S_BIN"/* "$ETCD_BIN" "$COREDNS_BIN" "$PAUSE_BIN" \
    "$REPO/tools/docker_archive.py") | sha256sum | cut -c1-12)
  dir=$KIND_CACHE/images/v$K8S_VERSION-$key
  IMAGES_DIR=$dir
  if [ -f "$dir/.done" ]; then say "control-plane images: cached ($dir)"; return; fi
  rm -rf "$dir.partial" && mkdir -p "$dir.partial"
  local want py=python3 tmp
  [ -x "$REPO/.venv/bin/python" ] && py=$REPO/.venv/bin/python
  want=$("$K8S_BIN/kubeadm" config images list --kubernetes-version "v$K8S_VERSION" 2>/dev/null)
  tmp=$(mktemp -d "$KIND_CACHE/images/stage.XXXXXX")
  mkdir -p "$tmp/root/etc" "$tmp/root/tmp" "$tmp/root/usr/local/bin"
  chmod 1777 "$tmp/root/tmp"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n' >"$tmp/root/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$tmp/root/etc/group"
  local ref name bin entry layers
  for ref in $want; do
    name=${ref%:*}; name=${name##*/}
    layers=()
    case $name in
      kube-apiserver | kube-controller-manager | kube-scheduler) bin=$K8S_BIN/$name entry="[\"/usr/local/bin/$name\"]" ;;
      kube-proxy) bin=$K8S_BIN/kube-proxy entry='["/usr/local/bin/kube-proxy"]' layers=(--layer "$BASE_TAR") ;;
      etcd) bin=$ETCD_BIN entry='["/usr/local/bin/etcd"]'
        [ "${ref##*:}" = "$ETCD_VERSION-0" ] || die "kubeadm wants $ref; kind/lib.sh builds etcd $ETCD_VERSION" ;;
      coredns) bin=$COREDNS_BIN entry='["/coredns"]'
        [ "${ref##*:}" = "v$COREDNS_VERSION" ] || die "kubeadm wants $ref; kind/lib.sh builds CoreDNS $COREDNS_VERSION" ;;
      pause) bin=$PAUSE_BIN entry='["/pause"]'
        [ "${ref##*:}" = "$PAUSE_VERSION" ] || die "kubeadm wants $ref; kind/lib.sh builds pause $PAUSE_VERSION" ;;
      *) die "kubeadm wants $ref, which kind/build.sh does not know how to make" ;;
    esac
    rm -rf "$tmp/layer" && cp -a "$tmp/root" "$tmp/layer"
    case $entry in
      '["/usr/local/bin/'*) cp "$bin" "$tmp/layer/usr/local/bin/" ;;
      *) cp "$bin" "$tmp/layer/" ;;
    esac
    (cd "$REPO" && "$py" -m tools.docker_archive "$dir.partial/$name.tar" --tag "$ref" --entrypoint "$entry" \
      "${layers[@]}" --layer "$tmp/layer")
  done
  rm -rf "$tmp"
  touch "$dir.partial/.done"
  rm -rf "$dir" && mv "$dir.partial" "$dir"
  say "control-plane images: $(echo $want | wc -w) in $dir ($(du -sm "$dir" | cut -f1) MB)"
}

# The node image's root as a tarball (kind/up.sh imports it into Docker as $NODE_TAG).
build_node() {
  local ctrd_root runc key root kindfiles
  ctrd_root=$(bash "$REPO/testkit/install.sh" 2.4 2>>"$LOG/containerd.log" | tail -1)
  runc=$(bash "$REPO/testkit/build_runc.sh" "$RUNC_VERSION" 2>>"$LOG/runc.log" | tail -1)
  kindfiles=$GOMODCACHE/sigs.k8s.io/kind@v$KIND_VERSION/images/base/files
  [ -d "$kindfiles" ] || "$GO" mod download "sigs.k8s.io/kind@v$KIND_VERSION"
  key=$( (echo "$BASE_TAR $IMAGES_DIR $(cat "$ctrd_root/VERSION") $K8S_VERSION $KIND_VERSION $CRI_TOOLS_VERSION";
    echo "recipe $RECIPE"; find "$KIND_SRC/node" /usr/lib/cni -type f | sort | xargs sha256sum "$runc") | sha256sum | cut -c1-12)
  NODE_TAG=nriplugin-kind-node:v$K8S_VERSION-$key
  NODE_TAR=$KIND_CACHE/node/$key.tar
  if [ -s "$NODE_TAR" ]; then
    say "node image: cached ($NODE_TAG)"
    echo "$NODE_TAG $NODE_TAR" >"$KIND_CACHE/node/current"
    return
  fi
  root=$KIND_CACHE/node/rootfs
  rm -rf "$root" && mkdir -p "$root"
  say "node image: assembling $NODE_TAG"
  tar -C "$root" -xf "$BASE_TAR"
  # kind's base files (images/base/files of the kind module): scripts 0755, the rest 0644
  mkdir -p "$root/kind/bin" "$root/LICENSES" "$root/etc/containerd" "$root/etc/default" "$root/etc/sysctl.d" \
    "$root/etc/systemd/system/kubelet.service.d" "$root/etc/kubernetes/manifests" "$root/opt/cni/bin" "$root/etc/cni/net.d"
  install -m 0755 "$kindfiles"/usr/local/bin/* "$root/usr/local/bin/"
  install -m 0755 "$kindfiles"/kind/bin/* "$root/kind/bin/"
  install -m 0644 "$kindfiles"/kind/README.txt "$root/kind/"
  install -m 0644 "$kindfiles"/LICENSES/* "$root/LICENSES/"
  install -m 0644 "$kindfiles"/etc/crictl.yaml "$root/etc/"
  install -m 0644 "$kindfiles"/etc/default/* "$root/etc/default/"
  install -m 0644 "$kindfiles"/etc/sysctl.d/* "$root/etc/sysctl.d/"
  install -m 0644 "$kindfiles"/etc/systemd/system/*.service "$kindfiles"/etc/systemd/system/*.slice "$root/etc/systemd/system/"
  install -m 0644 "$kindfiles"/etc/systemd/system/kubelet.service.d/* "$root/etc/systemd/system/kubelet.service.d/"
  # containerd 2.4 (the project's build, testkit/install.sh), runc with seccomp, crictl, CNI
  install -m 0755 "$ctrd_root"/usr/bin/containerd "$ctrd_root"/usr/bin/containerd-shim-runc-v2 "$ctrd_root"/usr/bin/ctr "$root/usr/local/bin/"
  install -m 0755 "$runc" "$root/usr/local/sbin/runc"
  install -m 0755 "$CRI_TOOLS_BIN/crictl" "$root/usr/local/bin/"
  install -m 0644 "$KIND_SRC/node/containerd.toml" "$root/etc/containerd/config.toml"
  "$ctrd_root/usr/bin/ctr" oci spec |
    jq '.hooks.createContainer[.hooks.createContainer | length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' |
    jq 'del(.process.rlimits)' >"$root/etc/containerd/cri-base.json"
  for p in bridge host-local loopback portmap ptp; do install -m 0755 "/usr/lib/cni/$p" "$root/opt/cni/bin/"; done
  install -m 0755 "$K8S_BIN/kubelet" "$K8S_BIN/kubeadm" "$K8S_BIN/kubectl" "$root/usr/bin/"
  echo "v$K8S_VERSION" >"$root/kind/version"
  systemctl --root="$root" enable kubelet.service containerd.service undo-mount-hacks.service >/dev/null 2>&1
  systemctl --root="$root" mask systemd-binfmt.service >/dev/null 2>&1
  preimport "$ctrd_root" "$root"
  mkdir -p "$KIND_CACHE/node"
  tar --numeric-owner -C "$root" -cf "$NODE_TAR.partial" .
  mv "$NODE_TAR.partial" "$NODE_TAR"
  rm -rf "$root"
  echo "$NODE_TAG $NODE_TAR" >"$KIND_CACHE/node/current"
  say "node image: $NODE_TAR ($(du -sm "$NODE_TAR" | cut -f1) MB) as $NODE_TAG"
}

# The control-plane images into the node's containerd store before it ever boots (as kind's
# own node images are made): a containerd of the same version on this host, rooted in the node's
# /var/lib/containerd, imports them unpacked later, pinned; stopped by its pid.
preimport() {
  local ctrd_root=$1 root=$2 tmp pid f
  tmp=$(mktemp -d /tmp/nriplugin-kind-import.XXXXXX)
  cat >"$tmp/config.toml" <<EOF
version = 3
root = '$root/var/lib/containerd'
state = '$tmp/state'
disabled_plugins = ['io.containerd.grpc.v1.cri', 'io.containerd.cri.v1.runtime', 'io.containerd.cri.v1.images', 'io.containerd.nri.v1.nri']
[grpc]
  address = '$tmp/containerd.sock'
[ttrpc]
  address = '$tmp/containerd.sock.ttrpc'
EOF
  "$ctrd_root/usr/bin/containerd" --config "$tmp/config.toml" >"$LOG/preimport.log" 2>&1 &
  pid=$!
  for _ in $(seq 50); do "$ctrd_root/usr/bin/ctr" -a "$tmp/containerd.sock" version >/dev/null 2>&1 && break; sleep 0.2; done
  for f in "$IMAGES_DIR"/*.tar; do
    "$ctrd_root/usr/bin/ctr" -a "$tmp/containerd.sock" -n k8s.io images import --no-unpack --all-platforms \
      --digests --label io.cri-containerd.pinned=pinned "$f" >>"$LOG/preimport.log" 2>&1 ||
      { kill "$pid"; wait "$pid" || true; rm -rf "$tmp"; die "importing $f into the node image failed ($LOG/preimport.log)"; }
  done
  "$ctrd_root/usr/bin/ctr" -a "$tmp/containerd.sock" -n k8s.io images ls -q >&2
  kill "$pid"
  wait "$pid" || true
  unmount_under "$tmp"
  rm -rf "$tmp"
}

t0=$(date +%s)
if [ "$what" = helm ]; then build_helm; echo "$HELM_BIN"; exit 0; fi
if [ "$what" = critest ]; then build_critest; echo "$CRI_TOOLS_BIN/critest"; exit 0; fi
if [ "$what" = koord ]; then build_koord; echo "$KOORD_TAR"; exit 0; fi
build_k8s
build_etcd
simple coredns github.com/coredns/coredns "$COREDNS_VERSION" "$COREDNS_BIN" "'$COREDNS_BIN' -version | grep -q 'CoreDNS-$COREDNS_VERSION'" \
  "-s -w" github.com/coredns/coredns
simple kind sigs.k8s.io/kind "$KIND_VERSION" "$KIND_BIN" "'$KIND_BIN' version | grep -q 'kind v$KIND_VERSION'" "-s -w" sigs.k8s.io/kind
build_helm
simple cri-tools sigs.k8s.io/cri-tools "$CRI_TOOLS_VERSION" "$CRI_TOOLS_BIN/crictl" "'$CRI_TOOLS_BIN/crictl' --version | grep -q 'v$CRI_TOOLS_VERSION'" \
  "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=v$CRI_TOOLS_VERSION" sigs.k8s.io/cri-tools/cmd/crictl
build_pause
build_runc_wrapper
[ "$what" = tools ] && exit 0
build_koord
build_base
build_images
build_node
say "everything built or cached in $(elapsed "$t0"); cache: $(du -sm "$KIND_CACHE" | cut -f1) MB in $KIND_CACHE (+ Go's in $CACHE_ROOT/go)"
echo "$NODE_TAG"
