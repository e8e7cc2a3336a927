#!/usr/bin/env bash
# ptx.sh: compile every kernels/cuda/kernels/<op>.cu to kernels/cuda/ptx/<op>.ptx
# with nvcc for virtual architecture compute_80 (Ampere and later; the driver
# JIT-compiles it for the GPU at load), files named *_sm90.cu for
# compute_90a (Hopper only: their module loads on compute capability 9.0). Run through `go generate` in
# kernels/cuda on a machine with the CUDA toolkit, then commit the PTX.
# NVCC and NVCC_FLAGS override the compiler and add flags.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
src=$root/kernels/cuda/kernels
dst=$root/kernels/cuda/ptx
nvcc=${NVCC:-nvcc}
command -v "$nvcc" >/dev/null || { echo "ptx.sh: $nvcc not found (needs the CUDA toolkit)" >&2; exit 1; }
mkdir -p "$dst"
# Each file on its own: one that fails to compile keeps its committed PTX
# (the others are still regenerated) and makes the script fail at the end.
failed=()
for f in "$src"/*.cu; do
  op=$(basename "$f" .cu)
  tmp=$(mktemp "$dst/.$op.XXXXXX")
  arch=compute_80
  case $op in *_sm90) arch=compute_90a ;; esac
  if "$nvcc" -ptx -arch=$arch -O3 -std=c++17 ${NVCC_FLAGS:-} -o "$tmp" "$f"; then
    chmod 644 "$tmp"
    mv "$tmp" "$dst/$op.ptx"
    echo "ptx.sh: $op.ptx ($(wc -c <"$dst/$op.ptx") bytes)"
  else
    rm -f "$tmp"
    failed+=("$op.cu")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "ptx.sh: failed to compile: ${failed[*]} (their committed PTX is kept)" >&2
  exit 1
fi
