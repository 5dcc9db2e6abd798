#!/usr/bin/env bash
# The Debian packages `make images`, `make image-test` and `make kube-play` use, installed only
# where missing (`make install` / `make test` never need them):
#   podman      builds and runs the images, plays the manifests (`podman kube play`)
#   runc        the OCI runtime podman is configured with (deploy/podman/containers.conf)
#   debootstrap makes the Debian bookworm base image when no registry can be reached
#   containernetworking-plugins  the bridge network of the played pods
#   iptables    used by those plugins for the pods' network
#   catatonit   the init of the pods' infra container (podman builds its pause image with it)
# A machine whose working `docker` daemon answers is left alone (the scripts use docker there).
# Without apt (or root/sudo) it says what is missing and exits 1: nothing below works without.
set -u
if ! command -v podman >/dev/null 2>&1 && command -v docker >/dev/null 2>&1 \
    && docker info >/dev/null 2>&1; then
  exit 0
fi
need=()
command -v podman >/dev/null 2>&1 || need+=(podman)
command -v runc >/dev/null 2>&1 || need+=(runc)
command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ] || need+=(debootstrap)
[ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
command -v iptables >/dev/null 2>&1 || [ -x /usr/sbin/iptables ] || need+=(iptables)
command -v catatonit >/dev/null 2>&1 || [ -x /usr/libexec/podman/catatonit ] || need+=(catatonit)
[ ${#need[@]} -eq 0 ] && exit 0

source "$(dirname "$0")/apt_install.sh"
apt_install error "${need[@]}"
