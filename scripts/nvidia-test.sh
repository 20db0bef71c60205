#!/usr/bin/env bash
# The `nvidia` build, compiled, linked and run against NVIDIA's real cuObject library, on a host
# without GPU or RDMA NIC: the SDK comes from CUOBJ_HOME (default: ../shared/cuobject-sdk, the
# test fixture beside the checkout). It
# checks that the binary starts with only the runtime packages (no LD_LIBRARY_PATH: an RPATH,
# not a RUNPATH), reports the library and its limit, and never hangs on the client's
# construction (cuobj-ffi's nvidia tests; tests/integration/nvidia.rs). Needs
# what scripts/setup.sh installs.
set -euo pipefail
cd "$(dirname "$0")/.."
export CUOBJ_HOME="${CUOBJ_HOME:-$(cd .. && pwd)/shared/cuobject-sdk}"
if [ ! -f "$CUOBJ_HOME/include/cuobjclient.h" ]; then
  if [ "${CI:-}" = "true" ]; then
    echo "nvidia-test: no cuObject SDK in $CUOBJ_HOME (CI expects ../shared/cuobject-sdk)" >&2
    exit 1
  fi
  echo "nvidia-test: skipped: no cuObject SDK in $CUOBJ_HOME (set CUOBJ_HOME to one)" >&2
  exit 0
fi
# The usual target directory: only cuobj-ffi and the crates above it are compiled again with
# the feature (a directory of its own compiled every dependency a second time: minutes on CI's
# two cores). target/release/s3rdma is the nvidia build afterwards, until the next cargo build.
echo "== nvidia build (CUOBJ_HOME=$CUOBJ_HOME)"
cargo build --release --locked -p s3rdma --features nvidia --bins
bin="$PWD/target/release/s3rdma"
# The library's directory is an RPATH (it also covers libcuobjclient's own libcufile.so.0).
if ! readelf -d "$bin" | grep -q '(RPATH)'; then
  echo "nvidia-test: $bin has no RPATH:" >&2
  readelf -d "$bin" | grep -E 'RPATH|RUNPATH|NEEDED' >&2
  exit 1
fi
env -i PATH="$PATH" "$bin" --version
echo "== the shim against edited headers (copies in a temporary directory, outside the repository)"
tmp=$(mktemp -d /tmp/s3rdma-nvidia-headers.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
shim() { # include-dir output: compile the shim against that include directory
  c++ -std=c++17 -c -o "$2" -DS3RDMA_CUOBJ_NVIDIA=1 '-DS3RDMA_CUOBJ_PROVIDER="nvidia"' \
    -I cuobj-ffi/csrc -I "$1" cuobj-ffi/csrc/cuobj_shim.cc
}
# A third party's edit: no limit macro, two members fewer (a 64-byte class): refused at compile time.
mkdir -p "$tmp/edited" "$tmp/nomacro"
cp "$CUOBJ_HOME"/include/*.h "$tmp/edited/"
cp "$CUOBJ_HOME"/include/*.h "$tmp/nomacro/"
sed -i '/#define CUOBJ_MAX_MEMORY_REG_SIZE/d; /bool _connected;/d; /cuObjProto_t _proto;/d' "$tmp/edited/cuobjclient.h"
if shim "$tmp/edited" "$tmp/edited.o" 2>"$tmp/edited.err"; then
  echo "nvidia-test: the shim compiled against a cuobjclient.h with a 64-byte cuObjClient" >&2
  exit 1
fi
grep -q "not the genuine 72-byte class" "$tmp/edited.err" || { cat "$tmp/edited.err" >&2; exit 1; }
# The genuine class without the limit macro: the limit is still 4 GiB - 64 KiB.
sed -i '/#define CUOBJ_MAX_MEMORY_REG_SIZE/d' "$tmp/nomacro/cuobjclient.h"
shim "$tmp/nomacro" "$tmp/nomacro.o"
cat > "$tmp/limit.cc" <<'CC'
#include <cstdio>
#include "cuobj_shim.h"
int main() { std::printf("%llu\n", (unsigned long long)s3rdma_cuobj_max_registration_size()); }
CC
rpath=$(readelf -d "$bin" | sed -n 's/.*Library rpath: \[\(.*\)\]/\1/p')
c++ -std=c++17 -I cuobj-ffi/csrc -o "$tmp/limit" "$tmp/limit.cc" "$tmp/nomacro.o" \
  -L "$rpath" -l:libcuobjclient.so.1 -Wl,--disable-new-dtags -Wl,-rpath,"$rpath"
limit=$("$tmp/limit")
if [ "$limit" != 4294901760 ]; then
  echo "nvidia-test: without CUOBJ_MAX_MEMORY_REG_SIZE the limit is $limit, not 4294901760" >&2
  exit 1
fi
echo "edited header refused; limit without the macro: $limit"

echo "== nvidia tests: the binding, then the binary on a mount"
cargo test --release --locked -p cuobj-ffi --features nvidia
cargo test --release --locked -p s3rdma --features nvidia --test integration -- nvidia::

echo "== no SDK where it is looked for: one message naming what is missing and every place looked"
mkdir -p "$tmp/none/include"
if CUOBJ_HOME="$tmp/none" CUDA_HOME= CUDA_PATH= cargo build --release --locked -p cuobj-ffi \
  --features nvidia 2>"$tmp/missing.err"; then
  echo "nvidia-test: the nvidia build succeeded without an SDK" >&2
  exit 1
fi
if ! grep -q "needs NVIDIA's cuObject SDK" "$tmp/missing.err" \
  || ! grep -q "CUOBJ_HOME=$tmp/none: missing $tmp/none/include/cuobjclient.h" "$tmp/missing.err"; then
  cat "$tmp/missing.err" >&2
  exit 1
fi
echo "a missing SDK is named: ok"
