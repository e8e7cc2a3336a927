#!/usr/bin/env bash
# fwd4_round.sh: one device call for the forward with 128-key tiles
# (flash_fwd4 kernels of flashattn_sm90.cu) and the fused Hopper backward
# (flash_bwd_fused_sm90): tools/cuda/check_and_bench.sh with fresh PTX,
# the Hopper attention tests (TestAttentionFlashSM90 runs the flash_fwd4
# kernels against the CPU and the mma.sync kernel, TestFlashBwdFused the
# sm90f mode against the CPU and the split kernels), no whole steps, and
# the attention sweep of the defaults beside cuDNN and beside
# SPILL_FLASH_FWD=sm90p4 (two warpgroups, lockstep), sm90p4x (three
# warpgroups at head size 64, ping-pong at 128) and SPILL_FLASH_BWD=sm90f,
# sm90f2 and sm90f2b. The CUDA headers come back
# too (cuda-include.tgz), for tools/cuda/vet.sh on a machine without the
# toolkit. Back under $OUT: run.log, kernels_h200.json, ptx.tgz, k.tgz,
# cuda-include.tgz.
#
#   device run, carry [".gpu"]: bash tools/cuda/fwd4_round.sh
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
R=${OUT:-$(mktemp -d /tmp/spill-fwd4.XXXXXX)}
OUT=$R SPILL_TEST_RUN=${SPILL_TEST_RUN:-'TestAttentionFlashSM90|TestSM90FwdDepths|TestAttentionKernels|TestAttentionFlash$|TestGQAttention|TestFlashBwdFused|TestFlashBwdModeOf'} \
  SPILL_BENCH_SHAPES=${SPILL_BENCH_SHAPES:-none} SPILL_BENCH_GO= \
  SPILL_ATTN_SWEEP=${SPILL_ATTN_SWEEP:-64:1024,64:2048,64:4096,64:8192,128:1024,128:2048,128:4096,128:8192} \
  SPILL_ATTN_VARIANTS=${SPILL_ATTN_VARIANTS:-'fwd4:SPILL_FLASH_FWD=sm90p4;fwd4x:SPILL_FLASH_FWD=sm90p4x;bwdf:SPILL_FLASH_BWD=sm90f;bwdf2:SPILL_FLASH_BWD=sm90f2;bwdf2b:SPILL_FLASH_BWD=sm90f2b'} \
  SPILL_DEADLINE=${SPILL_DEADLINE:-400} bash tools/cuda/check_and_bench.sh
inc=$(dirname "$(command -v nvcc)")/../include
(cd "$inc" && tar czhf "$R/cuda-include.tgz" --ignore-failed-read cuda.h cublas*.h cuComplex.h vector_types.h \
  vector_functions.h driver_types.h host_defines.h library_types.h crt cuda_runtime_api.h builtin_types.h cuda_fp16.h \
  cuda_fp16.hpp cuda_bf16.h cuda_bf16.hpp surface_types.h texture_types.h channel_descriptor.h cuda_device_runtime_api.h 2>&1 | tail -n 3)
ls -la "$R"
