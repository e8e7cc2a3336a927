#!/usr/bin/env bash
# nogpu.sh: check that a cuda build behaves on a machine without a GPU:
# `spill doctor` exits 1 saying why, and `spill train` (device auto) falls
# back to the CPU and trains. It builds with -tags cuda against the CUDA
# toolkit at CUDA_HOME and runs the binary on the toolkit's stub libraries
# (libcuda, libcublas, libcublasLt from lib*/stubs), whose cuInit fails as
# a driver-less machine's does. Needs only the toolkit's headers and stubs
# (e.g. Debian's nvidia-cuda-dev unpacked: CUDA_HOME=<dir>/usr).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
stubs=$(dirname "$(find "$CUDA_HOME" -path '*stubs/libcuda.so' | head -n1)")
[ -f "$stubs/libcuda.so" ] || { echo "nogpu.sh: no stubs/libcuda.so under $CUDA_HOME" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for l in libcuda.so:libcuda.so.1 libcublas.so:libcublas.so libcublasLt.so:libcublasLt.so; do
  src=$stubs/${l%%:*}
  soname=$(objdump -p "$src" | awk '/SONAME/ {print $2}')
  ln -s "$src" "$tmp/${soname:-${l##*:}}"
done
source tools/cuda/env.sh
CGO_LDFLAGS="-L$stubs $CGO_LDFLAGS" go build -tags cuda -o "$tmp/spill" ./cmd/spill
set +e
LD_LIBRARY_PATH=$tmp "$tmp/spill" doctor >"$tmp/doctor.out" 2>&1
rc=$?
set -e
cat "$tmp/doctor.out"
[ $rc -eq 1 ] && grep -q "no usable CUDA driver or device" "$tmp/doctor.out" || { echo "nogpu.sh: doctor: exit $rc" >&2; exit 1; }
LD_LIBRARY_PATH=$tmp "$tmp/spill" train --steps 2 --eval-every 0 >"$tmp/train.out" 2>&1
head -n 3 "$tmp/train.out"
grep -q "training on the CPU" "$tmp/train.out" && grep -q " on cpu " "$tmp/train.out" || { echo "nogpu.sh: train did not fall back to the CPU" >&2; exit 1; }
echo "nogpu.sh: ok"
