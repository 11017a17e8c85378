#!/usr/bin/env bash
# Build the CPU image (docker/Dockerfile) without pulling any image, then run
# `cosmo-dask demo` in it with no network:
#   1. a Debian root filesystem made here with debootstrap (from Debian's package
#      mirror), imported as the base image cosmo-dask-base:<suite>;
#   2. cosmo_dask and every dependency as wheels downloaded by this host's pip
#      (the host's Python must have the same minor version as the suite's python3)
#      into docker/wheels/;
#   3. docker build --network none with BASE=cosmo-dask-base:<suite> and
#      PIP_INSTALL_FLAGS="--no-index --find-links /tmp/wheels";
#   4. docker run --network none cosmo-dask:cpu-offline demo.
# Needs root, a running Docker engine (dockerd; see docker/README.md) and network
# access to a Debian mirror and a Python package index for steps 1-2. Not run in CI.
#
#   bash docker/build-offline.sh [WORKDIR]        # default /tmp/cosmo-dask-offline
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-/tmp/cosmo-dask-offline}
suite=${SUITE:-bookworm}
mirror=${MIRROR:-http://deb.debian.org/debian}
base=cosmo-dask-base:$suite
image=${IMAGE:-cosmo-dask:cpu-offline}
say() { echo "build-offline: $*" >&2; }
t_start=$(date +%s)
mkdir -p "$work"
# the classic builder when the buildx plugin is missing (it honours --network none)
docker buildx version >/dev/null 2>&1 || export DOCKER_BUILDKIT=0

if docker image inspect "$base" >/dev/null 2>&1; then
  say "base image $base exists"
else
  command -v debootstrap >/dev/null || apt-get install -y -q --no-install-recommends debootstrap
  say "debootstrap $suite into $work/rootfs"
  rm -rf "$work/rootfs"
  debootstrap --variant=minbase --include=python3,python3-venv "$suite" "$work/rootfs" "$mirror"
  tar -C "$work/rootfs" -c . | docker import - "$base"
fi

image_py=$(docker run --rm --network none "$base" python3 -c \
  'import sys; print("%d.%d" % sys.version_info[:2])')
host_py=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ "$image_py" != "$host_py" ]; then
  say "the base image has Python $image_py, this host $host_py: wheels would not match" \
      "(use a host Python $image_py, or SUITE= a Debian release with Python $host_py)"
  exit 1
fi

say "wheels for Python $host_py into docker/wheels/"
find "$repo/docker/wheels" -name '*.whl' -delete
python3 -m pip wheel -q --wheel-dir "$repo/docker/wheels" "$repo" "bokeh>=3.1"
# the build backend too: the image builds cosmo_dask from its sources with no index
python3 -m pip download -q --only-binary=:all: --dest "$repo/docker/wheels" "setuptools>=77"

say "docker build --network none"
docker build --network none -f "$repo/docker/Dockerfile" -t "$image" \
  --build-arg BASE="$base" \
  --build-arg PIP_INSTALL_FLAGS="--no-index --find-links /tmp/wheels" "$repo"

say "cosmo-dask demo in the image, --network none"
t0=$(date +%s)
docker run --rm --network none "$image" demo --dir /home/cosmo/demo
say "demo passed in $(( $(date +%s) - t0 )) s; all done in $(( $(date +%s) - t_start )) s"
find "$repo/docker/wheels" -name '*.whl' -delete
