#!/usr/bin/env bash
# Install s3rdma so that `mount -t fuse.s3rdma`, /etc/fstab and systemd mount units work, or
# remove it again:
#
#   scripts/install.sh [--prefix DIR]             build (release) and install DIR/bin/s3rdma,
#                                                 DIR/bin/s3rdma-endpoint (default DIR: /usr/local)
#   scripts/install.sh --uninstall [--prefix DIR] remove them
#
# mount(8) runs mount.fuse3 (package fuse3), which starts `s3rdma` found on the system PATH:
# DIR/bin must be on it (/usr/local/bin is). Needs root for the default prefix.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=/usr/local
uninstall=0
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix=${2:?--prefix needs a directory}; shift 2 ;;
    --uninstall) uninstall=1; shift ;;
    *) echo "install.sh: unknown argument $1 (see the header of this script)" >&2; exit 2 ;;
  esac
done
bin=$prefix/bin
if [ "$uninstall" = 1 ]; then
  rm -f "$bin/s3rdma" "$bin/s3rdma-endpoint"
  echo "install.sh: removed s3rdma and s3rdma-endpoint from $bin"
  exit 0
fi
command -v mount.fuse3 >/dev/null || { echo "install.sh: mount.fuse3 not found: apt-get install fuse3" >&2; exit 1; }
cargo build --release --locked --bins
mkdir -p "$bin"
install -m 0755 target/release/s3rdma "$bin/s3rdma"
install -m 0755 target/release/s3rdma-endpoint "$bin/s3rdma-endpoint"
echo "install.sh: installed $bin/s3rdma and $bin/s3rdma-endpoint"
case ":$PATH:" in *":$bin:"*) ;; *) echo "install.sh: note: $bin is not on PATH; mount -t fuse.s3rdma needs it there" >&2 ;; esac
