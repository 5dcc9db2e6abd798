#!/usr/bin/env bash
# A local stand-in for python:3.11-slim-bookworm, for machines that reach no container registry
# (only Debian's apt): Debian bookworm `--variant=minbase` made with debootstrap, plus Debian's
# Python 3.11 (python3, python3-venv, python-is-python3), imported as an image. The Dockerfiles
# take it through their PYTHON_IMAGE (CUDA_IMAGE for the GPU stand-in) build argument.
#
#   deploy/docker/base_image.sh [TAG]        (root or passwordless sudo; ENGINE=podman|docker)
#
# An image already present under TAG is kept (delete it to refresh). DEBIAN_MIRROR picks the
# mirror (default http://deb.debian.org/debian).
set -euo pipefail
TAG=${1:-localhost/ocrfleet-python-base:bookworm}
ENGINE=${ENGINE:-podman}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo -n"

if $ENGINE image inspect "$TAG" >/dev/null 2>&1; then
  echo "base image $TAG: present"
  exit 0
fi

work=$(mktemp -d "${TMPDIR:-/var/tmp}/ocrfleet-base.XXXXXX")
rootfs="$work/rootfs"
cleanup() {
  # debootstrap mounts /proc (and more) inside the tree; never rm -rf through a live mount.
  for mnt in $(awk -v root="$rootfs" 'index($2, root) == 1 {print $2}' /proc/mounts | sort -r); do
    $SUDO umount -l "$mnt" || true
  done
  if awk -v root="$rootfs" 'index($2, root) == 1 {found=1} END {exit !found}' /proc/mounts; then
    echo "warning: $rootfs still has mounts; left in place" >&2
  else
    $SUDO rm -rf "$work"
  fi
}
trap cleanup EXIT

echo "debootstrap bookworm (minbase + python3) from $MIRROR"
$SUDO debootstrap --variant=minbase --include=python3,python3-venv,python-is-python3,ca-certificates \
  bookworm "$rootfs" "$MIRROR" > "$work/debootstrap.log" 2>&1 || {
  tail -20 "$work/debootstrap.log" >&2
  exit 1
}
# The sources the official image has, so `apt-get install` in a Dockerfile gets security fixes.
$SUDO tee "$rootfs/etc/apt/sources.list" >/dev/null <<EOF
deb $MIRROR bookworm main
deb $MIRROR bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
EOF
# What the slim image leaves out: downloaded .debs, package lists, docs (not the copyrights).
$SUDO rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/cache/apt/*.bin \
  "$rootfs"/var/lib/apt/lists/* "$rootfs"/usr/share/man/*
$SUDO find "$rootfs/usr/share/doc" -type f ! -name copyright -delete
$SUDO tar -C "$rootfs" --exclude='./proc/*' --exclude='./sys/*' --exclude='./dev/*' -c . \
  | $ENGINE import --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' - "$TAG" >/dev/null
echo "base image $TAG: built ($($ENGINE run --rm "$TAG" python --version))"
