#!/usr/bin/env bash
# On a host with NVIDIA's cuObject SDK and an RDMA NIC: build against the real libcuobjclient
# and run the RDMA round trips (1 B .. 64 MiB, PUT then GET, compared over plain HTTP) against a
# real S3-over-RDMA endpoint.
#
#   CUDA_HOME=/usr/local/cuda CUFILE_ENV_PATH_JSON=/etc/cufile.json \
#   AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... scripts/rdma-check.sh http://10.0.0.5:9000 BUCKET
#
# Objects are written under s3rdma-check/ in BUCKET.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -ne 2 ]; then
  echo "usage: $0 ENDPOINT_URL BUCKET" >&2
  exit 2
fi
: "${AWS_ACCESS_KEY_ID:?set AWS_ACCESS_KEY_ID}" "${AWS_SECRET_ACCESS_KEY:?set AWS_SECRET_ACCESS_KEY}"
if [ -z "${CUFILE_ENV_PATH_JSON:-}" ]; then
  echo "rdma-check: CUFILE_ENV_PATH_JSON is not set; cuObject will read /etc/cufile.json (its rdma_dev_addr_list must name the NIC)" >&2
fi
export S3RDMA_CHECK_ENDPOINT=$1 S3RDMA_CHECK_BUCKET=$2
cargo build --release --locked -p s3rdma --features nvidia
target/release/s3rdma --version
cargo test --release --locked -p s3rdma --features nvidia --test integration real_endpoint_round_trips -- --ignored --nocapture
