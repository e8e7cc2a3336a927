#!/usr/bin/env bash
# pingpong_round.sh: one device call for the ping-pong Hopper forward
# (flash_fwd3_sm90, F9_FWD3_PP64 and F9_FWD3_PP128): tools/cuda/check_and_bench.sh (fresh PTX
# with the defaults, the attention and backward tests, the GPT training
# steps at 124m, 1.3b and 2.7b beside torch.compile, the attention sweep
# beside cuDNN, and the mma.sync forward SPILL_FLASH_FWD=mma as a variant),
# then the PTX rebuilt with the lockstep forward at both head sizes
# (-DF9_FWD3_PP64=false -DF9_FWD3_D64=4 -DF9_FWD3_PP128=false
# -DF9_FWD3_D128=4), its forward tests, its attention
# sweep and its training steps, so that the two forwards sit side by side
# in one call. The default PTX comes back in $OUT/ptx.tgz (packed before
# the rebuild), the lockstep logs and JSON in $OUT/lockstep.tgz.
#
#   device run, carry [".gpu"]: bash tools/cuda/pingpong_round.sh
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
R=${OUT:-$(mktemp -d /tmp/spill-pp.XXXXXX)}
shapes=${SPILL_BENCH_SHAPES:-124m,1.3b,2.7b}
attn=${SPILL_ATTN_SWEEP:-64:1024,64:2048,64:4096,64:8192,128:1024,128:2048,128:4096,128:8192}
OUT=$R SPILL_TEST_RUN=${SPILL_TEST_RUN:-'TestFlashBwd|TestAttentionFlashSM90|TestAttentionKernels|TestAttentionFlash$|TestGQAttention|TestLlamaDeterministic'} \
  SPILL_BENCH_SHAPES=$shapes SPILL_BENCH_GO= SPILL_ATTN_SWEEP=$attn \
  SPILL_ATTN_VARIANTS=${SPILL_ATTN_VARIANTS:-'fwd_mma:SPILL_FLASH_FWD=mma'} \
  SPILL_DEADLINE=${SPILL_DEADLINE:-330} bash tools/cuda/check_and_bench.sh
tar czf "$R/ptx.tgz" kernels/cuda/ptx
source tools/cuda/gpuenv.sh 2>/dev/null; source tools/cuda/env.sh >/dev/null
L=/tmp/lockstep
mkdir -p $L
{
  nvcc -ptx -arch=compute_90a -O3 -std=c++17 -DF9_FWD3_PP64=false -DF9_FWD3_D64=4 -DF9_FWD3_PP128=false -DF9_FWD3_D128=4 \
    -o kernels/cuda/ptx/flashattn_sm90.ptx kernels/cuda/kernels/flashattn_sm90.cu &&
    go build -tags cuda -o /tmp/gpubench ./tools/gpubench
  echo "== lockstep build: exit $? after ${SECONDS}s"
  timeout 120 go test -tags cuda -count=1 -run 'TestAttentionFlashSM90|TestAttentionFlash$' ./kernels/cuda/ >$L/test.log 2>&1
  echo "== lockstep test: exit $? after ${SECONDS}s"
  grep -E "^(--- FAIL|FAIL|ok|panic)" $L/test.log | head -n 10
  timeout 90 /tmp/gpubench -attn-sweep "$attn" -out $L/spill_attn.json >$L/spill_attn.log 2>&1
  echo "== lockstep sweep: exit $? after ${SECONDS}s"
  timeout 90 /tmp/gpubench -train-only -shapes "$shapes" -out $L/gpt.json >$L/gpt.log 2>&1
  echo "== lockstep gpt: exit $? after ${SECONDS}s"
  grep -oE '"(name|tokens_per_sec|step_ms_median)": *("[^"]*"|[0-9.]+)' $L/gpt.json | paste -sd' ' | head -c 600; echo
} 2>&1 | tee $L/run.log
tar czf "$R/lockstep.tgz" -C /tmp lockstep
