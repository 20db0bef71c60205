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
# FUSE over io_uring (Linux 6.14+) is switched on and off by a module parameter: the suite runs
# whole over the rings where root can switch them on (CI can), and again over /dev/fuse for the
# groups that touch every opcode; the transport tests check each side of the switch. The
# switch is put back as it was.
switch=/sys/module/fuse/parameters/enable_uring
if [ -w "$switch" ]; then
  was=$(cat "$switch")
  trap 'echo "$was" > "$switch"' EXIT
  echo 1 > "$switch"
  echo "== cargo test (the integration suite over FUSE over io_uring)"
  S3RDMA_IT_FUSE_TRANSPORT=uring cargo test --workspace --release --locked
  echo 0 > "$switch"
  echo "== the integration groups that touch every opcode, over /dev/fuse"
  S3RDMA_IT_FUSE_TRANSPORT=dev cargo test --release --locked -p s3rdma --test integration -- \
    read:: write:: staged:: namespace:: diskcache:: lifecycle:: faults:: transport::
else
  echo "== cargo test (over /dev/fuse: $switch is missing or not writable, so FUSE over io_uring"
  echo "   is not tested here; it needs Linux 6.14+ built with CONFIG_FUSE_IO_URING, and root)"
  S3RDMA_IT_FUSE_TRANSPORT=dev cargo test --workspace --release --locked
fi
echo "== the nvidia build against NVIDIA's real cuObject library (scripts/nvidia-test.sh)"
scripts/nvidia-test.sh
