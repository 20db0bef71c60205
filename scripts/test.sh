#!/usr/bin/env bash
# Every test: formatting, lints, unit tests and the integration tests that mount the real binary
# on a real S3 server (SeaweedFS on 127.0.0.1). Installs what it needs first. Needs /dev/fuse and
# root (or a user allowed to mount FUSE).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
echo "== cargo fmt --check"
cargo fmt --all -- --check
cargo fmt --manifest-path fuzz/Cargo.toml -- --check
echo "== cargo clippy -D warnings"
cargo clippy --workspace --release --all-targets --locked -- -D warnings
echo "== fuzz the parsers of outside input (scripts/fuzz: libFuzzer, 20 s per target)"
scripts/fuzz 20
echo "== build every target once (the integration tests run the binaries of two crates; one"
echo "   invocation for all targets, so that cargo test and the bench reuse it: features unify"
echo "   the same way, nothing is compiled twice)"
cargo build --workspace --release --locked --all-targets
echo "== benchmark smoke run (scripts/bench --quick: keeps the suite working; numbers not asserted)"
quick=$(mktemp -d /tmp/s3rdma-bench-quick.XXXXXX)
scripts/bench --quick --out "$quick/quick.md"
rm -rf "$quick"
echo "== cargo test"
cargo test --workspace --release --locked
echo "== the nvidia build against NVIDIA's real cuObject library (scripts/nvidia-test.sh)"
scripts/nvidia-test.sh
