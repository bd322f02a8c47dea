#!/usr/bin/env bash
# Builds (once) the guest kit of the VM lane: Debian bookworm's stock kernel and an initramfs of
# busybox-static plus the modules that mount the host's / over 9p under an overlay. Nothing is
# installed on the host: packages are fetched with `apt-get download` through a private source
# list (the mirror this machine's apt already uses) and unpacked with `dpkg -x`. Installs
# Debian's qemu-system-x86 and cpio when missing (as root).
# Usage: testkit/vm/build-kit.sh [CACHE]   (default: ~/.cache/nriplugin/vm); prints the kit folder
# (vmlinuz, initrd.img, release).
set -euo pipefail
cache=$(realpath -m "${1:-${NRIPLUGIN_CACHE:-$HOME/.cache/nriplugin}/vm}")
here=$(cd "$(dirname "$0")" && pwd)
if ! command -v qemu-system-x86_64 >/dev/null || ! command -v cpio >/dev/null; then
  [ "$(id -u)" = 0 ] || { echo "qemu-system-x86_64 or cpio missing (and not root to install them)" >&2; exit 1; }
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends qemu-system-x86 cpio >&2
fi
# The kit is keyed by the init script's hash, so an edited init rebuilds it.
key=$(sha256sum "$here/init" "$0" | sha256sum | cut -c1-12)
kit="$cache/kit-$key"
if [ -s "$kit/vmlinuz" ] && [ -s "$kit/initrd.img" ] && [ -s "$kit/release" ]; then
  echo "$kit"; exit 0
fi
uri=$(grep -hoE '^URIs: *[^ ]+' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1 | awk '{print $2}')
[ -n "$uri" ] || uri=$(grep -hoE '^deb +[^ ]+' /etc/apt/sources.list 2>/dev/null | head -1 | awk '{print $2}')
[ -n "$uri" ] || { echo "no Debian mirror found in this machine's apt sources" >&2; exit 1; }
mkdir -p "$cache"
work=$(mktemp -d "$cache/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/debs" "$work/x" "$work/initrd/bin" "$work/initrd/modules"
echo "deb $uri bookworm main" > "$work/sources.list"
o=(-o Dir::Etc::SourceList="$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
   -o Dir::State::Lists="$work/lists" -o Dir::Cache="$work/cache" -o APT::Sandbox::User=root -qq)
apt-get "${o[@]}" update >&2
image=$(apt-cache "${o[@]}" depends linux-image-amd64 | awk '/Depends: linux-image-/ {print $2; exit}')
[ -n "$image" ] || { echo "no linux-image-*-amd64 in bookworm" >&2; exit 1; }
(cd "$work/debs" && apt-get "${o[@]}" download "$image" busybox-static >&2)
for f in "$work"/debs/*.deb; do dpkg -x "$f" "$work/x"; done
release=${image#linux-image-}
mods="$work/x/lib/modules/$release/kernel"
# The modules /init loads, after their dependencies (read from each module's .modinfo).
order=()
add() {  # NAME
  local name=$1 ko dep
  for seen in "${order[@]:-}"; do [ "$seen" = "$name" ] && return 0; done
  ko=$(find "$mods" -name "$name.ko" | head -1)
  [ -n "$ko" ] || { echo "module $name not in $image" >&2; exit 1; }
  for dep in $(tr '\0' '\n' < "$ko" | sed -n 's/^depends=//p' | head -1 | tr ',' ' '); do add "${dep//-/_}"; done
  for seen in "${order[@]:-}"; do [ "$seen" = "$name" ] && return 0; done
  order+=("$name")
  cp "$ko" "$work/initrd/modules/"
}
for m in virtio_pci 9pnet_virtio 9p overlay; do add "$m"; done
# loop: block devices in the guest for the blkio feature's device rules (where Debian builds it
# as a module; built in, it is there anyway).
if find "$mods" -name loop.ko | grep -q .; then add loop; fi
printf '%s\n' "${order[@]}" > "$work/initrd/modules/order"
cp "$work/x/bin/busybox" "$work/initrd/bin/busybox"
install -m 0755 "$here/init" "$work/initrd/init"
mkdir -p "$work/kit"
(cd "$work/initrd" && find . | cpio -o -H newc --quiet | gzip -1) > "$work/kit/initrd.img"
cp "$work/x/boot/vmlinuz-$release" "$work/kit/vmlinuz"
echo "$release" > "$work/kit/release"
rm -rf "$cache"/kit-*  # older kits (another init) go
mv "$work/kit" "$kit"
echo "$kit"
