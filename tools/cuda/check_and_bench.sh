#!/usr/bin/env bash
# check_and_bench.sh: one call on the lent GPU machine for the CUDA
# backend's compute work (issue 14): regenerate the PTX (all of it with
# SPILL_PTX_ALL=1, else flashattn.ptx and flashattn_sm90.ptx) and the ptxas
# resource report of flashattn.cu for sm_90 and of flashattn_sm90.cu for
# sm_90a, run the CUDA tests against the CPU reference (those
# SPILL_TEST_RUN names, a go test -run pattern; default all),
# then tools/cuda/kernels_bench.sh with the Go benchmarks, all within
# SPILL_DEADLINE seconds (default 300). What comes back under $OUT stays
# within the device tool's 8 files: run.log (everything printed),
# kernels_h200.json, ptx.tgz (the fresh PTX to commit) and k.tgz (every log
# and JSON file). SPILL_BENCH_SHAPES and SPILL_ATTN_SWEEP pass through.
#
#   device run, carry [".gpu"]: bash tools/cuda/check_and_bench.sh
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
R=${OUT:-$(mktemp -d /tmp/spill-check.XXXXXX)}
export OUT=$R/k
mkdir -p "$OUT"
if [ -f .gpu/env.sh ]; then source tools/cuda/gpuenv.sh; fi
source tools/cuda/env.sh
source tools/cuda/step.sh
deadline=${SPILL_DEADLINE:-300}
{
  flash_ptx "$OUT"
  tar czf "$R/ptx.tgz" kernels/cuda/ptx
  left=$((deadline - SECONDS - 100))
  timeout $((left > 90 ? left : 90)) go test -tags cuda -count=1 -v -run "${SPILL_TEST_RUN:-.}" ./kernels/cuda/ >"$OUT/test.log" 2>&1
  echo "== test: exit $? after ${SECONDS}s"
  grep -E '^(--- FAIL|FAIL|ok|panic)|allocations|^    \w+_test.go' "$OUT/test.log" | head -n 40
  SPILL_BENCH_GO=${SPILL_BENCH_GO-1} SPILL_DEADLINE=$((deadline - SECONDS - 5)) bash tools/cuda/kernels_bench.sh
} 2>&1 | tee "$R/run.log"
cp "$OUT/kernels_h200.json" "$R/" 2>/dev/null
tar czf "$R/k.tgz" -C "$R" k && rm -rf "$R/k"
