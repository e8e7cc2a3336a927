#!/usr/bin/env bash
# emu.sh: check the flash-attention kernels (kernels/cuda/kernels/flashattn.cu)
# on the host with tools/cuda/emu/flashattn_emu.cpp, under AddressSanitizer
# and UBSan: the device code (between its "---- Device code" and "---- Entry
# points" markers) is extracted and compiled as C++20 with emulated warp
# primitives (mma, ldmatrix, shuffles). Needs g++ 12 or later; no GPU or CUDA toolkit.
# EMU_SANITIZE=thread builds with ThreadSanitizer instead: it reports
# shared-memory accesses of one block's threads not ordered by a barrier
# (a missing __syncthreads); slower. The cp.async copies land at once
# here, so the pipeline's own ordering is not checked either way.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
src=$root/kernels/cuda/kernels/flashattn.cu
sed -n '/^\/\/ ---- Device code/,/^\/\/ ---- Entry points/p' "$src" | sed '$d' >"$tmp/flashattn_body.inc"
cp "$root/tools/cuda/emu/flashattn_emu.cpp" "$tmp/"
${CXX:-g++} -std=c++20 -O1 -g -fsanitize=${EMU_SANITIZE:-address,undefined} -fno-strict-aliasing -pthread \
  -o "$tmp/emu" "$tmp/flashattn_emu.cpp"
"$tmp/emu"
