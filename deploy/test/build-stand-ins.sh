#!/usr/bin/env bash
# Test fixture: stand-ins for the official base images, for machines that run dockerd but cannot reach an image
# registry. They carry the official tags (python:3.11-slim-bookworm, postgres:16-bookworm) so deploy/Dockerfile
# and docker-compose.yml build and start unchanged; the product never refers to anything here.
#
# Built from Debian packages: a debootstrapped bookworm root file system, Python as a virtualenv at /usr/local
# (the official image's paths), PostgreSQL 15 behind an entrypoint that honours POSTGRES_USER / PASSWORD / DB.
# When the machine trusts an extra CA for its egress (STAND_IN_CA_BUNDLE, default: the system bundle), the
# Python stand-in trusts it too, so pip inside a build reaches the package index as it does on this machine.
# Existing images with those tags are kept (pass --force to rebuild).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
ca_bundle="${STAND_IN_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
force=0
[[ "${1:-}" == "--force" ]] && force=1

have() { [[ $force == 0 ]] && docker image inspect "$1" >/dev/null 2>&1; }

base=merge-service-test/bookworm-rootfs:latest
if ! have "$base"; then
  command -v debootstrap >/dev/null || { echo "debootstrap is needed (apt-get install debootstrap)" >&2; exit 1; }
  rootfs="$(mktemp -d /tmp/merge-service-rootfs.XXXXXX)"
  trap 'rm -rf "$rootfs"' EXIT
  nice -n 10 debootstrap --variant=minbase --include=ca-certificates bookworm "$rootfs" "$mirror"
  cat > "$rootfs/etc/apt/sources.list" <<SOURCES
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
SOURCES
  # As the official slim images: no documentation, no apt caches.
  cp "$here/stand-ins/dpkg-nodoc" "$rootfs/etc/dpkg/dpkg.cfg.d/docker-nodoc"
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb
  tar -C "$rootfs" -c . | docker import --change 'CMD ["bash"]' --change 'ENV LANG=C.UTF-8' - "$base"
  rm -rf "$rootfs"
  trap - EXIT
fi

if ! have python:3.11-slim-bookworm; then
  context="$(mktemp -d)"
  cp "$here/stand-ins/python.Dockerfile" "$context/Dockerfile"
  if [[ -f "$ca_bundle" ]]; then cp "$ca_bundle" "$context/extra-ca.crt"; else : > "$context/extra-ca.crt"; fi
  nice -n 10 docker build -t python:3.11-slim-bookworm "$context"
  rm -rf "$context"
fi

if ! have postgres:16-bookworm; then
  nice -n 10 docker build -t postgres:16-bookworm -f "$here/stand-ins/postgres.Dockerfile" "$here/stand-ins"
fi
