#!/usr/bin/env bash
# ooc_h200.sh: the out-of-core benchmarks of issue 9 in one call on the lent
# GPU machine (carry [".gpu"]; command "bash tools/bench/ooc_h200.sh"):
#
#   1. gpt2-1.3b, T 1024, 64 sequences per step (8 x 8), in VRAM and under
#      --device-memory 8GiB, side by side for 50 steps (losses compared),
#      and with --delayed-update;
#   2. gpt2-1.3b, 8 sequences per step, 8 GiB, beside PyTorch FSDP2 with
#      CPUOffloadPolicy(pin_memory=True) (tools/bench/fsdp_ref.py);
#   3. gpt2-6.7b, --device-memory 16GiB, 64 sequences per step, default
#      budgets, model TFLOP/s.
#
# Every run writes its metrics, plan and summary under $OUT; the last step
# (tools/bench/ooc_report.py) writes $OUT/ooc_h200.json with the ratios,
# the date, commit and commands; spill doctor's measured profile is in
# $OUT/doctor.json. SPILL_PROFILE=1 adds a Go CPU profile of each run
# (runs/NAME.pprof). SPILL_DEADLINE (default 560 s) bounds the
# whole script; SPILL_OOC_RUNS (default all) picks runs by name;
# SPILL_OOC_STEPS (default 50) sets the steps of the side-by-side pair.
# SPILL_OOC_FRESH=1 first runs two short out-of-core runs, before anything
# else has touched the machine's memory: their "first step" lines are the
# start-up on a fresh machine, the first with the default pinning
# (anonymous memory faulted in on all cores, then registered), the second
# with SPILL_PIN=hostalloc (cuMemHostAlloc on one thread), on memory the
# first has already touched. SPILL_OOC_THREADS="8 4" adds a short run of
# the 8 GiB plan per count with the host AdamW capped at that many threads
# (SPILL_HOST_THREADS).
set -uo pipefail
# shellcheck source=tools/bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_init ooc
deadline=${SPILL_DEADLINE:-560}
runs=${SPILL_OOC_RUNS:-all}
want() { [ "$runs" = all ] || [[ ",$runs," == *",$1,"* ]]; }

build_spill || exit 1
machine_info
if want doctor; then
  timeout 120 /tmp/spill doctor --json "$out/doctor.json" 2>&1 | tee "$out/doctor.txt"
fi

# Synthetic tokens: 2400 sequences of 1025 GPT-2 token ids.
random_tokens "$out/train.bin" 50257 $((2400 * 1025))
rm -rf /tmp/ooc-data # convert refuses a directory that is not empty (a warm machine keeps /tmp)
/tmp/spill convert --out /tmp/ooc-data --seq-len 1024 --vocab 50304 "$out/train.bin" >"$out/convert.log" 2>&1 || { cat "$out/convert.log"; exit 1; }
rm -f "$out/train.bin"

# run NAME LIMIT ARGS...: one spill train, its command recorded (when
# SPILL_OOC_RUNS names it; a name starting with "trace" always runs).
run() {
  local name=$1 limit=$2; shift 2
  [[ $name == trace* || $name == fresh* || $name == threads* ]] || want "$name" || return 0
  local args=(train --data /tmp/ooc-data --eval-every 0 --quiet --metrics "$out/runs/$name.jsonl" --plan-json "$out/runs/$name.plan.json" "$@")
  [ -z "${SPILL_PROFILE:-}" ] || args+=(--cpu-profile "$out/runs/$name.pprof")
  run_spill "$name" "$limit" 30 14 "${args[@]}"
}
steps13=${SPILL_OOC_STEPS:-50} # of the two 64-sequence runs compared side by side
m13=(--model gpt2-1.3b --seq-len 1024 --lr 1e-4 --warmup 2)
if [ -n "${SPILL_OOC_FRESH:-}" ]; then
  run fresh-ooc-1.3b-64-8g 90 "${m13[@]}" --batch 8 --accum 8 --steps 2 --device-memory 8GiB
  SPILL_PIN=hostalloc run fresh-hostalloc-ooc-1.3b-64-8g 90 "${m13[@]}" --batch 8 --accum 8 --steps 2 --device-memory 8GiB
fi
run vram-1.3b-64 110 "${m13[@]}" --batch 8 --accum 8 --steps "$steps13" --offload none
run ooc-1.3b-64-8g 170 "${m13[@]}" --batch 8 --accum 8 --steps "$steps13" --device-memory 8GiB
for n in ${SPILL_OOC_THREADS:-}; do
  SPILL_HOST_THREADS=$n run "threads$n-ooc-1.3b-64-8g" 60 "${m13[@]}" --batch 8 --accum 8 --steps 8 --device-memory 8GiB
done
# The same with whole-block recomputation only: what the selective
# checkpoints gain, side by side.
run ooc-1.3b-64-8g-full 90 "${m13[@]}" --batch 8 --accum 8 --steps 12 --device-memory 8GiB --activations recompute-full
# The ceiling of any plan that recomputes: the same selective recomputation
# with everything else on the device (no copies, no host optimizer), so
# its ratio to the in-VRAM run is what recomputation alone costs.
run ceil-1.3b-64-sel 90 "${m13[@]}" --batch 8 --accum 8 --steps 12 --device-memory 40GiB --activations recompute-selective
# Without clipping no update waits for the step's gradient norm: each host
# layer's AdamW runs in the backward, as soon as its gradients land.
run ooc-1.3b-64-8g-noclip 90 "${m13[@]}" --batch 8 --accum 8 --steps 12 --device-memory 8GiB --grad-clip 0
run ooc-1.3b-8-8g 60 "${m13[@]}" --batch 8 --accum 1 --steps 10 --device-memory 8GiB
if want fsdp-1.3b-8 && [ "$(left)" -gt 60 ]; then
  echo "== fsdp-1.3b-8"
  echo "python3 tools/bench/fsdp_ref.py 1.3b 8 5 2" >"$out/runs/fsdp-1.3b-8.cmd"
  PYTHONUNBUFFERED=1 timeout $(( $(left) < 120 ? $(left) : 120 )) python3 tools/bench/fsdp_ref.py 1.3b 8 5 2 \
    >"$out/runs/fsdp-1.3b-8.json" 2>"$out/runs/fsdp-1.3b-8.err"
  echo "== fsdp-1.3b-8: exit $?"; tail -c 600 "$out/runs/fsdp-1.3b-8.json"; tail -n 5 "$out/runs/fsdp-1.3b-8.err"
fi
run ooc-6.7b-64-16g 200 --model gpt2-6.7b --seq-len 1024 --lr 1e-4 --warmup 2 --batch 8 --accum 8 --steps 3 --device-memory 16GiB
run ooc-1.3b-64-8g-delayed 100 "${m13[@]}" --batch 8 --accum 8 --steps 4 --device-memory 8GiB --delayed-update
# Every out-of-core run times its 2nd step and every 10th after it (the
# exposed transfer share in the report); a full trace is only for a look.
if [ -n "${SPILL_OOC_TRACE:-}" ]; then
  run trace-ooc-1.3b-64-8g 100 "${m13[@]}" --batch 8 --accum 8 --steps 3 --device-memory 8GiB --trace "$out/runs/trace.json"
fi

python3 tools/bench/ooc_report.py "$out/runs" "$out/ooc_h200.json" "$(bash tools/bench/commit.sh)" \
  "$(cat "$out/nvidia-smi.txt")"
tar -C "$out" -czf "$out/runs.tgz" runs && rm -rf "$out/runs"
