#!/usr/bin/env bash
# swizzle_round.sh: one device call for the 128-byte swizzled Hopper
# kernels (flashattn_sm90.cu): tools/cuda/check_and_bench.sh (fresh PTX,
# the attention and backward tests, the GPT training steps at 124m, 1.3b
# and 2.7b beside torch.compile, the attention sweep beside cuDNN, and the
# variants: the split-smem backward and the pipelined Hopper backward
# sm90p, and the mma.sync forward SPILL_FLASH_FWD=mma, the defaults before
# the swizzle), then the same training steps with SPILL_FLASH_BWD=split-smem
# and with SPILL_FLASH_FWD=mma, so that each variant's step time sits
# beside the default's in one call. The regenerated PTX comes back in
# $OUT/ptx.tgz.
#
#   device run, carry [".gpu"]: bash tools/cuda/swizzle_round.sh
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
R=${OUT:-$(mktemp -d /tmp/spill-swz.XXXXXX)}
shapes=${SPILL_BENCH_SHAPES:-124m,1.3b,2.7b}
OUT=$R SPILL_TEST_RUN=${SPILL_TEST_RUN:-'TestFlashBwd|TestAttentionFlashSM90|TestAttentionKernels|TestAttentionFlash$|TestGQAttention|TestLlamaDeterministic'} \
  SPILL_BENCH_SHAPES=$shapes SPILL_BENCH_GO= \
  SPILL_ATTN_VARIANTS=${SPILL_ATTN_VARIANTS:-'bwd_split_smem:SPILL_FLASH_BWD=split-smem;bwd_sm90p:SPILL_FLASH_BWD=sm90p;fwd_mma:SPILL_FLASH_FWD=mma'} \
  SPILL_DEADLINE=${SPILL_DEADLINE:-400} bash tools/cuda/check_and_bench.sh
source tools/cuda/gpuenv.sh 2>/dev/null; source tools/cuda/env.sh >/dev/null
mkdir -p /tmp/swz
for v in bwd_split_smem:SPILL_FLASH_BWD=split-smem fwd_mma:SPILL_FLASH_FWD=mma; do
  env "${v#*:}" timeout 75 /tmp/gpubench -train-only -shapes "$shapes" -out "/tmp/swz/gpt_${v%%:*}.json" >"/tmp/swz/gpt_${v%%:*}.log" 2>&1
  echo "== gpt ${v%%:*}: exit $?"
  grep -oE '"(name|tokens_per_sec|step_ms_median)": *("[^"]*"|[0-9.]+)' "/tmp/swz/gpt_${v%%:*}.json" | paste -sd' ' | head -c 600; echo
done
tar czf "$R/gpt_variants.tgz" -C /tmp swz
tar czf "$R/ptx.tgz" kernels/cuda/ptx
