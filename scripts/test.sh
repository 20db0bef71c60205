#!/usr/bin/env bash
# Every test: formatting, lints, unit tests and the integration tests that mount the real binary
# on a real S3 server (SeaweedFS on 127.0.0.1). Installs what it needs first. Needs /dev/fuse and
# root (or a user allowed to mount FUSE).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy -D warnings"
cargo clippy --workspace --release --all-targets --locked -- -D warnings
echo "== benchmark smoke run (scripts/bench-read --quick: keeps the script working; numbers not asserted)"
scripts/bench-read --quick --out "$(mktemp /tmp/s3rdma-bench-quick.XXXXXX.md)"
echo "== benchmark smoke run (scripts/bench-write --quick)"
scripts/bench-write --quick --out "$(mktemp /tmp/s3rdma-bench-write-quick.XXXXXX.md)"
echo "== cargo test"
cargo test --workspace --release --locked
