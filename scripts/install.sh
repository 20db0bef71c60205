#!/usr/bin/env bash
# Install s3rdma so that `mount -t fuse.s3rdma`, /etc/fstab and systemd mount units work, or
# remove it again:
#
#   scripts/install.sh [--prefix DIR] [--bin-dir DIR]
#       build (release) and install DIR/bin/s3rdma, DIR/bin/s3rdma-endpoint and the examples
#       DIR/share/doc/s3rdma/examples/{mnt-ckpt.mount,fstab.example,s3rdma-dashboard.json,
#       prometheus-scrape.yml} (default DIR: /usr/local);
#       --bin-dir: install the binaries found there instead of building
#   scripts/install.sh --uninstall [--prefix DIR]
#       remove all of them
#
# mount(8) runs mount.fuse3 (package fuse3), which starts `s3rdma` found on the system PATH:
# DIR/bin must be on it (/usr/local/bin is). Needs root for the default prefix.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=/usr/local
uninstall=0
bin_dir=
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix=${2:?--prefix needs a directory}; shift 2 ;;
    --bin-dir) bin_dir=${2:?--bin-dir needs a directory}; shift 2 ;;
    --uninstall) uninstall=1; shift ;;
    *) echo "install.sh: unknown argument $1 (see the header of this script)" >&2; exit 2 ;;
  esac
done
bin=$prefix/bin
examples=$prefix/share/doc/s3rdma/examples
if [ "$uninstall" = 1 ]; then
  rm -f "$bin/s3rdma" "$bin/s3rdma-endpoint" "$examples/mnt-ckpt.mount" "$examples/fstab.example" \
    "$examples/s3rdma-dashboard.json" "$examples/prometheus-scrape.yml"
  rmdir "$examples" "$prefix/share/doc/s3rdma" 2>/dev/null || true
  echo "install.sh: removed s3rdma, s3rdma-endpoint and the examples from $prefix"
  exit 0
fi
command -v mount.fuse3 >/dev/null || { echo "install.sh: mount.fuse3 not found: apt-get install fuse3" >&2; exit 1; }
if [ -z "$bin_dir" ]; then
  cargo build --release --locked --bins
  bin_dir=target/release
fi
for f in s3rdma s3rdma-endpoint; do
  [ -x "$bin_dir/$f" ] || { echo "install.sh: $bin_dir/$f not found (build with cargo build --release)" >&2; exit 1; }
done
mkdir -p "$bin" "$examples"
install -m 0755 "$bin_dir/s3rdma" "$bin/s3rdma"
install -m 0755 "$bin_dir/s3rdma-endpoint" "$bin/s3rdma-endpoint"
install -m 0644 scripts/systemd/mnt-ckpt.mount scripts/systemd/fstab.example "$examples/"
# A Grafana dashboard and a Prometheus scrape job for --metrics-addr (README, "Metrics").
install -m 0644 scripts/monitoring/s3rdma-dashboard.json scripts/monitoring/prometheus-scrape.yml "$examples/"
echo "install.sh: installed $bin/s3rdma, $bin/s3rdma-endpoint and examples in $examples"
case ":$PATH:" in *":$bin:"*) ;; *) echo "install.sh: note: $bin is not on PATH; mount -t fuse.s3rdma needs it there" >&2 ;; esac
