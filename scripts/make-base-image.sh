#!/usr/bin/env bash
# Makes the base image docker/Dockerfile builds on, from Debian packages, for hosts that cannot
# pull python:3.11-slim from Docker Hub (but reach a Debian mirror and PyPI):
#
#   sudo bash scripts/make-base-image.sh [TAG]          # default tag: tandem-base:bookworm
#   docker build --network host --build-arg BASE_IMAGE=tandem-base:bookworm \
#       --build-arg TORCH_INDEX= -f docker/Dockerfile -t tandem:local .
#
# What goes in: `debootstrap --variant=minbase` of Debian bookworm (python3 3.11, venv, pip,
# ca-certificates), `python` linked to python3 (the Dockerfile calls `python` and `pip`), this
# host's CA bundle (HTTPS from a build may go through the host's own CA), and /etc/pip.conf with
# break-system-packages (Debian marks its python as externally managed), that bundle as `cert`,
# and `find-links` to a copy of this host's local wheels: where PyTorch's index is unreachable,
# the CPU torch wheel comes from there (2.13.0+cpu sorts above PyPI's CUDA 2.13.0).
#
# Environment: TANDEM_BASE_SUITE (bookworm), TANDEM_BASE_MIRROR (http://deb.debian.org/debian),
# TANDEM_BASE_WHEELS (folder of *.whl to copy; default: pip's find-links on this host, if any),
# TANDEM_BASE_CA (CA bundle; default /etc/ssl/certs/ca-certificates.crt).
# Needs root, debootstrap and a Docker engine. ~2 minutes, ~300 MB plus the wheels.
set -euo pipefail

TAG=${1:-tandem-base:bookworm}
SUITE=${TANDEM_BASE_SUITE:-bookworm}
MIRROR=${TANDEM_BASE_MIRROR:-http://deb.debian.org/debian}
CA=${TANDEM_BASE_CA:-/etc/ssl/certs/ca-certificates.crt}

die() { echo "make-base-image: $*" >&2; exit 1; }
[[ $(id -u) == 0 ]] || die "debootstrap needs root"
command -v debootstrap >/dev/null || die "debootstrap not found (Debian: apt-get install debootstrap)"
docker info >/dev/null 2>&1 || die "no Docker engine answers (docker info failed)"
[[ -f $CA ]] || die "CA bundle $CA not found"

# The wheels pip already finds on this host: its find-links, from the environment or its config.
wheels=${TANDEM_BASE_WHEELS:-${PIP_FIND_LINKS:-}}
if [[ -z $wheels ]] && command -v pip3 >/dev/null; then
    wheels=$(pip3 config get global.find-links 2>/dev/null || true)
fi
wheels=${wheels%% *}   # the first folder when several are listed

rootfs=$(mktemp -d /var/tmp/tandem-base.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT

echo "make-base-image: debootstrap $SUITE from $MIRROR into $rootfs" >&2
debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
    "$SUITE" "$rootfs" "$MIRROR" >"$rootfs.log" 2>&1 \
    || { tail -20 "$rootfs.log" >&2; die "debootstrap failed (log: $rootfs.log)"; }
rm -f "$rootfs.log"

install -m 0644 "$CA" "$rootfs/etc/ssl/certs/host-ca-bundle.crt"
ln -sf /usr/bin/python3 "$rootfs/usr/local/bin/python"
pip_conf="[global]
break-system-packages = true
cert = /etc/ssl/certs/host-ca-bundle.crt"
copied=0
if [[ -n $wheels && -d $wheels ]]; then
    mkdir -p "$rootfs/opt/wheels"
    for wheel in "$wheels"/*.whl; do
        [[ -f $wheel ]] || continue
        cp "$wheel" "$rootfs/opt/wheels/" && copied=$((copied + 1))
    done
    (( copied > 0 )) && pip_conf+=$'\nfind-links = /opt/wheels'
fi
printf '%s\n' "$pip_conf" >"$rootfs/etc/pip.conf"
# The Dockerfile runs apt-get update itself; the package cache would only add size.
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*

tar -C "$rootfs" -c . | docker import \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    --message "debootstrap $SUITE minbase + python3, pip, host CA, $copied local wheel(s)" \
    - "$TAG" >/dev/null
echo "make-base-image: $TAG ($(docker image inspect -f '{{.Size}}' "$TAG" | awk '{printf "%.0f MB", $1/1e6}'), $copied wheel(s) from ${wheels:-nowhere})" >&2
