#!/usr/bin/env bash
# profile.sh: per-kernel GPU time of the GPT training steps, spill beside
# PyTorch, in one device call: builds tools/gpubench, then runs its training
# loop alone (-train-only) and tools/gpubench/torch_ref.py under Nsight
# Compute (ncu, one metric: gpu__time_duration) and writes each kernel's
# duration under $OUT (spill.ncu.log, torch.ncu.log); tools/cuda/profile.py
# splits them into steps and sums them by kernel. Without ncu it says so
# and exits 2. SPILL_BENCH_SHAPES (default 124m) picks the shape;
# SPILL_PROF_NO_TORCH=1 skips PyTorch.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
out=${OUT:-$(mktemp -d /tmp/spill-prof.XXXXXX)}
mkdir -p "$out"
if [ -f .gpu/env.sh ]; then source tools/cuda/gpuenv.sh; fi
source tools/cuda/env.sh
shape=${SPILL_BENCH_SHAPES:-124m}
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -n1)
if [ -z "$ncu" ]; then
  echo "profile.sh: no ncu on this machine" >&2
  exit 2
fi
"$ncu" --version | tail -n1
go build -tags cuda -o /tmp/gpubench ./tools/gpubench || exit 1
# Each kernel's duration, measured in place (no cache flush, clocks as
# they are), for a window of launches in the middle of the run that holds
# at least one whole training step.
skip=${SPILL_PROF_SKIP:-4000} count=${SPILL_PROF_COUNT:-2500}
prof() {
  local name=$1; shift
  local t0=$SECONDS
  timeout "${SPILL_PROF_LIMIT:-200}" "$ncu" --metrics gpu__time_duration.sum --cache-control none --clock-control none \
    --launch-skip "$skip" --launch-count "$count" --csv --page raw --log-file "$out/$name.ncu.log" "$@" >"$out/$name.out" 2>&1
  echo "== $name: exit $? after $((SECONDS - t0))s, $(grep -c '^"' "$out/$name.ncu.log") CSV lines in $name.ncu.log"
  tail -n 3 "$out/$name.out"
}
prof spill /tmp/gpubench -shapes "$shape" -train-only -out /tmp/spill_prof.json
[ -n "${SPILL_PROF_NO_TORCH:-}" ] || SPILL_TRAIN_ONLY=1 prof torch python3 tools/gpubench/torch_ref.py /tmp/torch_prof.json "$shape"
