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
deadline=${SPILL_DEADLINE:-300}
{
  nvcc -arch=sm_90 -cubin -O3 -std=c++17 -Xptxas -v -o /tmp/flashattn.cubin kernels/cuda/kernels/flashattn.cu >"$OUT/ptxas.log" 2>&1 &
  nvcc -arch=sm_90a -cubin -O3 -std=c++17 -Xptxas -v -o /tmp/flashattn_sm90.cubin kernels/cuda/kernels/flashattn_sm90.cu >"$OUT/ptxas_sm90.log" 2>&1 &
  if [ -n "${SPILL_PTX_ALL:-}" ]; then
    bash tools/cuda/ptx.sh >"$OUT/ptx.log" 2>&1
  else
    nvcc -ptx -arch=compute_90a -O3 -std=c++17 -o /tmp/flashattn_sm90.ptx kernels/cuda/kernels/flashattn_sm90.cu >"$OUT/ptx_sm90.log" 2>&1 &&
      chmod 644 /tmp/flashattn_sm90.ptx && cp /tmp/flashattn_sm90.ptx kernels/cuda/ptx/flashattn_sm90.ptx &&
      nvcc -ptx -arch=compute_80 -O3 -std=c++17 -o /tmp/flashattn.ptx kernels/cuda/kernels/flashattn.cu >"$OUT/ptx.log" 2>&1 &&
      chmod 644 /tmp/flashattn.ptx && cp /tmp/flashattn.ptx kernels/cuda/ptx/flashattn.ptx
  fi
  echo "== ptx: exit $? after ${SECONDS}s"
  tail -n 3 "$OUT/ptx.log" "$OUT/ptx_sm90.log" 2>/dev/null
  tar czf "$R/ptx.tgz" kernels/cuda/ptx
  left=$((deadline - SECONDS - 100))
  timeout $((left > 90 ? left : 90)) go test -tags cuda -count=1 -v -run "${SPILL_TEST_RUN:-.}" ./kernels/cuda/ >"$OUT/test.log" 2>&1
  echo "== test: exit $? after ${SECONDS}s"
  grep -E '^(--- FAIL|FAIL|ok|panic)|allocations|^    \w+_test.go' "$OUT/test.log" | head -n 40
  wait
  # Registers, spills and shared memory of the flash kernels on sm_90.
  grep -E "Compiling entry|registers|spill" "$OUT/ptxas.log" | grep -A2 "flash_" | grep -v "^--" | head -n 40
  grep -E "Compiling entry|registers|spill" "$OUT/ptxas_sm90.log" | grep -A2 "flash_fwd3\|flash_fwd4\|flash_fwd5\|flash_bwd" | grep -v "^--" | head -n 60
  SPILL_BENCH_GO=${SPILL_BENCH_GO-1} SPILL_DEADLINE=$((deadline - SECONDS - 5)) bash tools/cuda/kernels_bench.sh
} 2>&1 | tee "$R/run.log"
cp "$OUT/kernels_h200.json" "$R/" 2>/dev/null
tar czf "$R/k.tgz" -C "$R" k && rm -rf "$R/k"
