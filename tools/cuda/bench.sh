#!/usr/bin/env bash
# bench.sh: one call on the lent GPU machine that regenerates the PTX, vets,
# tests the CUDA backend against the CPU reference, then benchmarks GPT
# training (tools/gpubench) beside PyTorch (tools/gpubench/torch_ref.py) and
# writes $OUT/gpt_cuda_vs_torch.json. Logs and the fresh PTX (ptx.tar) go to
# $OUT too. Prepare on the development machine with tools/cuda/pack.sh, then
# run with the device tool: carry [".gpu"], command "tools/cuda/bench.sh".
# SPILL_BENCH_SHAPES (default 124m,1.3b) picks the shapes; SPILL_TEST_RUN
# (default .) the go test -run pattern. SPILL_DEADLINE (default 540) is the
# whole script's budget in seconds: each step's limit is cut to what is
# left and a step is skipped when under 15 s remain, so one device call
# (10 minutes at most) always returns with the logs written so far.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
out=${OUT:-$(mktemp -d /tmp/spill-bench.XXXXXX)}
mkdir -p "$out"
if [ -f .gpu/env.sh ]; then source tools/cuda/gpuenv.sh; fi
source tools/cuda/env.sh
shapes=${SPILL_BENCH_SHAPES:-124m,1.3b}
deadline=${SPILL_DEADLINE:-540}
status=0
source tools/cuda/step.sh
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv >"$out/nvidia-smi.txt" 2>&1
cat "$out/nvidia-smi.txt"
if command -v nvcc >/dev/null; then
  step ptx 120 go generate ./kernels/cuda/
  tar -C kernels/cuda -cf "$out/ptx.tar" ptx
fi
step test 300 go test -tags cuda -count=1 -v -timeout 280s -run "${SPILL_TEST_RUN:-.}" ./kernels/cuda/
step vet 120 go vet -tags cuda ./kernels/cuda/ ./tools/gpubench/
if step build 200 go build -tags cuda -o /tmp/gpubench ./tools/gpubench; then
  PYTHONUNBUFFERED=1 step torch 240 python3 tools/gpubench/torch_ref.py "$out/torch.json" "$shapes"
  step spill 300 /tmp/gpubench -shapes "$shapes" -torch "$out/torch.json" -out "$out/gpt_cuda_vs_torch.json"
fi
exit $status
