#!/usr/bin/env bash
# split_round.sh: one device call after the forward's per-head-size
# defaults (lockstep ring of 4 at head size 64, ping-pong ring of 5 at 128;
# flashattn_sm90.cu F9_FWD3_D64/PP64/D128/PP128):
# tools/cuda/check_and_bench.sh (fresh PTX, the attention tests, the GPT
# steps at 124m, 1.3b, 2.7b and the llama3.2-1b step beside torch.compile,
# the attention sweep beside cuDNN), then tools/cuda/ncu_attn.sh on the
# default Hopper kernels at SPILL_NCU_SHAPE (default 64:4096) beside cuDNN's,
# so that the next round knows what bounds the forward. Back under $OUT:
# run.log, kernels_h200.json, ptx.tgz, k.tgz and ncu.tgz.
#
#   device run, carry [".gpu"]: bash tools/cuda/split_round.sh
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
R=${OUT:-$(mktemp -d /tmp/spill-split.XXXXXX)}
OUT=$R SPILL_TEST_RUN=${SPILL_TEST_RUN:-'TestFlashBwd|TestAttentionFlashSM90|TestAttentionKernels|TestAttentionFlash$|TestGQAttention|TestLlamaDeterministic'} \
  SPILL_BENCH_SHAPES=${SPILL_BENCH_SHAPES:-124m,1.3b,2.7b,llama1b} SPILL_BENCH_GO= \
  SPILL_ATTN_SWEEP=${SPILL_ATTN_SWEEP:-64:1024,64:2048,64:4096,64:8192,128:1024,128:2048,128:4096,128:8192} \
  SPILL_DEADLINE=${SPILL_DEADLINE:-400} bash tools/cuda/check_and_bench.sh
hs=${SPILL_NCU_SHAPE:-64:4096}
hs=${hs%%:*}
mkdir -p /tmp/ncu
OUT=/tmp/ncu SPILL_NCU_SHAPE=${SPILL_NCU_SHAPE:-64:4096} SPILL_NCU_LIMIT=${SPILL_NCU_LIMIT:-60} \
  SPILL_NCU_VARIANTS="default|-|flash_fwd3_sm90_bf16_hs$hs|flash_bwd_kv_sm90_bf16_hs$hs|flash_bwd_q_sm90_bf16_hs$hs" \
  bash tools/cuda/ncu_attn.sh 2>&1 | tee /tmp/ncu/run.log | tail -n 60
tar czf "$R/ncu.tgz" -C /tmp ncu
