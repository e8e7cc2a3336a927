#!/usr/bin/env bash
# test.sh: on a machine with an NVIDIA GPU and the CUDA toolkit, regenerate
# the PTX (go generate), vet, run the CUDA backend's tests against the CPU
# reference and the engine's CUDA tests, build spill with -tags cuda and run `spill doctor` and a short
# `spill train --device cuda`. Each step's log goes to $OUT (default
# a new /tmp/spill-cuda.* directory); the fresh PTX is also packed as $OUT/ptx.tar.
# SPILL_CUDA_BENCH=20x also runs the benchmarks with that -benchtime.
# With .gpu/env.sh present (shared/gpu/pack) it is sourced first.
# Usage: tools/cuda/test.sh [go test -run pattern]
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
out=${OUT:-$(mktemp -d /tmp/spill-cuda.XXXXXX)}
mkdir -p "$out"
if [ -f .gpu/env.sh ]; then source tools/cuda/gpuenv.sh; fi
source tools/cuda/env.sh
status=0
step() {
  local name=$1; shift
  echo "== $name: $*"
  local t0=$SECONDS
  "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc after $((SECONDS - t0))s"
  tail -n 25 "$out/$name.log"
  [ $rc -eq 0 ] || status=1
  return $rc
}
if command -v nvcc >/dev/null; then
  step ptx go generate ./kernels/cuda/
  tar -C kernels/cuda -cf "$out/ptx.tar" ptx
fi
step vet go vet -tags cuda ./kernels/cuda/ ./cmd/spill/
step test go test -tags cuda -count=1 -v -timeout 8m -run "${1:-.}" ./kernels/cuda/
# The engine on the CUDA backend against the CPU's: GPT and Llama steps,
# out of core, the fused-GELU path, data parallel of one rank over NCCL.
step engine go test -tags cuda -count=1 -v -timeout 6m -run "${SPILL_ENGINE_RUN:-CUDA}" ./engine/
if step build go build -tags cuda -o /tmp/spill-cuda ./cmd/spill; then
  step doctor /tmp/spill-cuda doctor
  step train bash -c 'set -x
    timeout 60 /tmp/spill-cuda train --device cuda --steps 60
    timeout 60 /tmp/spill-cuda train --device cuda --steps 20 --device-memory 20MiB
    for d in cuda cpu; do
      timeout 120 /tmp/spill-cuda train --device $d --model gpt2-124m --batch 8 --seq-len 64 --steps 3 --progress-every 1
    done
    timeout 120 /tmp/spill-cuda train --device cuda --model gpt2-124m --batch 64 --seq-len 64 --steps 20 --progress-every 5'
fi
if [ -n "${SPILL_CUDA_BENCH:-}" ]; then
  step bench go test -tags cuda -count=1 -run '^$' -bench . -benchtime "$SPILL_CUDA_BENCH" ./kernels/cuda/
fi
exit $status
