#!/usr/bin/env bash
# Builds the nriplugin image from this checkout with buildah (Debian's package; vfs storage,
# chroot isolation: no daemon, no registry) and writes it as an OCI archive, whose path is the
# last line printed. No registry is needed: the base is made here from Debian's packages
# (debootstrap --variant=minbase + python3) and imported as a local image; the wheels are built
# and downloaded on the host (the dependencies hash-checked against image/requirements.lock)
# and installed offline inside the build.
#
# Usage: bash image/build.sh [--context-only] [--out FILE]
#   --context-only  assemble the build context (wheels + lock) and print its folder, for
#                   `docker build -f image/Containerfile --build-arg BASE=python:3.11-slim-bookworm DIR`
#   --out FILE      where to write the archive (default: build/nriplugin-VERSION.oci.tar)
# Cached under ${NRIPLUGIN_CACHE:-~/.cache/nriplugin}/image: the base's rootfs, the wheels and
# buildah's storage (with its layers), so a second build redoes only what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
cache=$(realpath -m "${NRIPLUGIN_CACHE:-$HOME/.cache/nriplugin}/image")
context_only=0
out=""
while [ $# -gt 0 ]; do
  case $1 in
    --context-only) context_only=1 ;;
    --out) out=$(realpath -m "$2"); shift ;;
    *) echo "usage: bash image/build.sh [--context-only] [--out FILE]" >&2; exit 2 ;;
  esac
  shift
done
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -1)
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [ "$revision" != unknown ] && [ -n "$(git status --porcelain -- nriplugin pyproject.toml image 2>/dev/null)" ]; then
  revision="$revision-dirty"
fi
source_url=${NRIPLUGIN_SOURCE:-$(git config --get remote.origin.url 2>/dev/null || echo unknown)}
py=${PYTHON:-}
[ -n "$py" ] || { [ -x .venv/bin/python ] && py=.venv/bin/python; } || py=python3
out=${out:-$repo/build/nriplugin-$version.oci.tar}
image=localhost/nriplugin:$version
base_image=localhost/nriplugin-base:bookworm-python3
say() { echo "build.sh: [$(($(date +%s) - t0)) s] $*" >&2; }
t0=$(date +%s)

# 1. The build context: the dependencies' wheels (hash-checked) and this checkout's wheel.
ctx=$cache/context
rm -rf "$ctx/deps" "$ctx/app" "$cache/src"
mkdir -p "$cache/deps" "$ctx/deps" "$ctx/app" "$cache/src"
pick() {  # copy the wheels the lock names from the cache (it may hold older ones); 1 if some lack
  "$py" - "$cache/deps" "$ctx/deps" image/requirements.lock <<'EOF'
import re, shutil, sys
from pathlib import Path
src, dst, lock = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
pins = {}
for line in lock.read_text().splitlines():
    m = re.match(r"^([A-Za-z0-9._-]+)==(\S+)", line)
    if m:
        pins[m[1].lower().replace("_", "-")] = m[2]
for whl in src.glob("*.whl"):
    name, ver = whl.name.split("-")[:2]
    if pins.get(name.lower().replace("_", "-")) == ver:
        shutil.copy2(whl, dst / whl.name)
have = {w.name.split("-")[0].lower().replace("_", "-") for w in dst.glob("*.whl")}
sys.exit(1 if set(pins) - have else 0)
EOF
}
if ! pick; then  # the index is asked only for what the cache lacks, against the lock's hashes
  "$py" -m pip download -q --disable-pip-version-check --only-binary=:all: --no-deps --require-hashes \
    -r image/requirements.lock -d "$cache/deps" >&2
  pick || { echo "build.sh: wheels missing after download" >&2; exit 1; }
fi
cp image/requirements.lock "$ctx/requirements.lock"
# The package's wheel, from a clean copy of its sources (a stale build/ would leak removed
# modules); the commit's time as the files' time, so an unchanged tree gives the same bytes
# and buildah's layer cache holds.
cp -r pyproject.toml README.md nriplugin "$cache/src/"
find "$cache/src" -name __pycache__ -prune -exec rm -rf {} +
epoch=$(git log -1 --format=%ct 2>/dev/null || echo 315532800)
isolation=()  # the host's setuptools when it has one (an isolated build env takes seconds)
"$py" -c "import setuptools, wheel" 2>/dev/null && isolation=(--no-build-isolation)
SOURCE_DATE_EPOCH=$epoch "$py" -m pip wheel -q --disable-pip-version-check --no-deps "${isolation[@]}" \
  -w "$ctx/app" "$cache/src" >&2
# buildah's layer cache keys a COPY on its files' times too: fixed times, so unchanged bytes hit.
find "$ctx" -exec touch -h -d "@$epoch" {} +
if [ "$context_only" = 1 ]; then
  echo "$ctx"
  exit 0
fi

# Nothing changed since the archive was written (same Containerfile, wheels and labels): done.
inputs=$( (cat image/Containerfile image/build.sh; cd "$ctx" && find . -type f | sort | xargs sha256sum;
  echo "$version $revision $source_url") | sha256sum | cut -d' ' -f1)
if [ -s "$out" ] && [ "$(cat "$out.inputs" 2>/dev/null)" = "$inputs" ]; then
  say "unchanged since the last build: $out"
  echo "$out"
  exit 0
fi
rm -f "$out.inputs"

# 2. buildah and debootstrap (Debian's packages), installed if missing.
if ! command -v buildah >/dev/null || ! command -v debootstrap >/dev/null; then
  say "installing buildah and debootstrap (apt)"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends buildah debootstrap >&2
fi
bh() { buildah --root "$cache/storage" --runroot "$cache/run" --storage-driver vfs "$@"; }

# 3. The base: Debian 12 minbase + python3, made once and imported as a local image.
if ! bh inspect --type image "$base_image" >/dev/null 2>&1; then
  tarball=$cache/base-bookworm-python3.tar
  if [ ! -s "$tarball" ]; then
    mirror=$(grep -hoE '^URIs: *[^ ]+' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1 | awk '{print $2}')
    [ -n "$mirror" ] || mirror=$(grep -hoE '^deb +[^ ]+' /etc/apt/sources.list 2>/dev/null | head -1 | awk '{print $2}')
    mirror=${mirror:-http://deb.debian.org/debian}
    rootfs=$cache/rootfs
    rm -rf "$rootfs"
    say "debootstrap bookworm (minbase + python3) from $mirror"
    debootstrap --variant=minbase --include=python3 bookworm "$rootfs" "$mirror" >"$cache/debootstrap.log" 2>&1 \
      || { tail -20 "$cache/debootstrap.log" >&2; exit 1; }
    # What a container does not need: package caches and lists, docs, the host's identity.
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/usr/share/doc/* \
      "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/usr/share/locale/* \
      "$rootfs"/var/log/* "$rootfs"/dev/* "$rootfs"/etc/hostname "$rootfs"/etc/resolv.conf
    tar --numeric-owner -C "$rootfs" -cf "$tarball.tmp" .
    mv "$tarball.tmp" "$tarball"
    rm -rf "$rootfs"
  fi
  say "importing the base as $base_image"
  c=$(bh from --quiet scratch)
  bh add --quiet "$c" "$tarball" / >&2
  bh config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd python3 \
    --label org.opencontainers.image.description="Debian 12 minbase + python3 (debootstrap)" "$c" >&2
  bh commit --quiet --rm "$c" "$base_image" >&2
fi

# 4. The image, then the archive. The layers of earlier builds are buildah's cache; past 6 GB
# (vfs keeps a full copy per layer) the unnamed ones go.
if [ "$(du -sm "$cache/storage" | cut -f1)" -gt 6000 ]; then bh rmi --prune >/dev/null 2>&1 || true; fi
say "building $image (revision $revision)"
bh build --quiet --layers --isolation chroot --format oci -f image/Containerfile \
  --build-arg BASE="$base_image" --build-arg VERSION="$version" --build-arg REVISION="$revision" \
  --build-arg SOURCE="$source_url" -t "$image" "$ctx" >&2
say "writing $out"
mkdir -p "$(dirname "$out")"
rm -f "$out"
bh push --quiet "$image" "oci-archive:$out:docker.io/library/nriplugin:$version" >&2
echo "$inputs" > "$out.inputs"
size=$(bh images --noheading --format '{{.Size}}' "$image" | head -1)
say "image $image: $size unpacked; archive $(($(stat -c %s "$out") / 1000000)) MB; $(($(date +%s) - t0)) s"
echo "$out"
