#!/usr/bin/env bash
# llama_h200.sh: issue 11's verification in one call on the lent GPU machine
# (carry [".gpu"]; command "bash tools/bench/llama_h200.sh"; the kit from
# tools/cuda/pack.sh provides Go; PyTorch, transformers and safetensors are
# the machine's python3; nothing is downloaded):
#
#   1. transformers builds small random-initialised models and saves them
#      with save_pretrained (tools/bench/llama_ref.py make): a
#      LlamaForCausalLM with GQA (8 heads, 2 key/value), an untied head and
#      llama3 RoPE scaling, sharded (model.safetensors.index.json), and a
#      GPT2LMHeadModel. spill loads each with --init-from and computes the
#      loss of a fixed batch of 4 x 128 tokens (spill eval, fp32); PyTorch
#      computes it on the same tokens: equal within 1e-4 relative;
#   2. spill fine-tunes each 20 steps from those weights (fp32), evaluates
#      the fixed batch at the end, exports (spill export --format hf), and
#      transformers loads the export and reproduces that loss (1e-4);
#   3. throughput: llama3.2-1b in VRAM, 4 x 2048 tokens, bf16, against
#      PyTorch eager (SDPA, bf16 autocast, fused AdamW) in the same call;
#   4. llama3.1-8b under --device-memory 24GiB, 64k tokens per step
#      (8 x 2048 x accum 4): tokens/s and model TFLOP/s. Its host state
#      (fp32 masters and Adam moments, ~130 GB) wants the 256 GiB host of
#      nvidia-h200-x2 (or a --disk-dir); SPILL_LLAMA_8B_ARGS adds flags.
#
# Parts 1-2 run on every device of SPILL_LLAMA_DEVICES (default "cpu cuda"):
# on cpu they check the loader, the exporter and the Llama kernels of the
# CPU backend today; on cuda (and parts 3-4) they need the CUDA Llama
# kernels. Each part is independent and bounded by a timeout; a failed part
# is recorded and the rest still run. Every command, its output, exit
# status and JSON go under $OUT/runs; the last step writes
# $OUT/llama_h200.json (date, commit, machine, commands, the checks with
# pass/fail). SPILL_DEADLINE (default 560 s) bounds the whole script;
# SPILL_LLAMA_PARTS (default all) picks parts: loss,finetune,tp,ooc.
set -uo pipefail
work=${SPILL_LLAMA_WORK:-/tmp/spill-llama-work}
# shellcheck source=tools/bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_init llama
runs=$out/runs
rm -rf "$work" && mkdir -p "$work"
deadline=${SPILL_DEADLINE:-560}
parts=${SPILL_LLAMA_PARTS:-all}
devices=${SPILL_LLAMA_DEVICES:-cpu cuda}
want() { [ "$parts" = all ] || [[ ",$parts," == *",$1,"* ]]; }
ref=tools/bench/llama_ref.py

# step NAME LIMIT STDOUT_FILE CMD...: one command, recorded under $runs
# (NAME.cmd, NAME.err, NAME.rc; stdout to STDOUT_FILE, or NAME.out if "-").
step() {
  local name=$1 limit=$2 sout=$3; shift 3
  [ "$sout" = - ] && sout=$runs/$name.out
  local l; l=$(left)
  if [ "$l" -lt 15 ]; then echo "== $name: skipped, ${l}s left"; echo skipped >"$runs/$name.rc"; return 1; fi
  [ "$limit" -le "$l" ] || limit=$l
  echo "$*" >"$runs/$name.cmd"
  echo "== $name (limit ${limit}s): $*"
  local t0=$SECONDS
  timeout "$limit" "$@" >"$sout" 2>"$runs/$name.err"
  local rc=$?
  echo "$rc" >"$runs/$name.rc"
  echo "== $name: exit $rc after $((SECONDS - t0))s"
  tail -n 3 "$sout"
  [ $rc -eq 0 ] || tail -n 15 "$runs/$name.err"
  return $rc
}

build_spill
[ -x /tmp/spill ] || { echo "build failed"; exit 1; }
spill=/tmp/spill
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "no GPU"; } | tee "$out/nvidia-smi.txt"
free -g | tee "$out/free.txt"
python3 -c 'import torch, transformers, safetensors; print("torch", torch.__version__, "transformers", transformers.__version__, "safetensors", safetensors.__version__)' \
  | tee "$out/python.txt"

# Models and tokens (part of 1 and 2).
m=$work/models
mkdir -p "$m"
if want loss || want finetune; then
  step make 120 "$runs/make.json" python3 "$ref" make "$m"
  step convert-fixed 60 - "$spill" convert --out "$work/fixed" --seq-len 128 --vocab 512 "$m/fixed.bin"
  step convert-train 60 - "$spill" convert --out "$work/train" --seq-len 128 --vocab 512 "$m/train.bin"
fi

for fam in llama gpt2; do
  [ -d "$m/$fam" ] || continue
  if want loss; then
    step "ref-loss-$fam" 90 "$runs/ref-loss-$fam.json" python3 "$ref" loss "$m/$fam" "$m/fixed.bin" 4 128
  fi
  for dev in $devices; do
    if want loss; then
      step "eval-$fam-$dev" 90 - "$spill" eval --init-from "$m/$fam" --data "$work/fixed" --batch 4 --eval-batches 1 \
        --precision fp32 --device "$dev" --json "$runs/eval-$fam-$dev.json"
    fi
    if want finetune; then
      ck=$work/ck-$fam-$dev exp=$work/export-$fam-$dev
      step "ft-$fam-$dev" 150 - "$spill" train --init-from "$m/$fam" --data "$work/train" --eval-data "$work/fixed" \
        --eval-every 20 --eval-batches 1 --batch 4 --seq-len 128 --steps 20 --lr 1e-3 --warmup 2 --precision fp32 \
        --device "$dev" --checkpoint-dir "$ck" --checkpoint-every 20 --metrics "$runs/ft-$fam-$dev.jsonl" --quiet &&
      step "export-$fam-$dev" 60 - "$spill" export --from "$ck" --out "$exp" --format hf &&
      step "ref-export-$fam-$dev" 90 "$runs/ref-export-$fam-$dev.json" python3 "$ref" loss "$exp" "$m/fixed.bin" 4 128
      [ -d "$exp" ] && step "eval-export-$fam-$dev" 90 - "$spill" eval --init-from "$exp" --data "$work/fixed" --batch 4 \
        --eval-batches 1 --precision fp32 --device "$dev" --json "$runs/eval-export-$fam-$dev.json"
    fi
  done
done

# Tokens of 2048 positions for parts 3 and 4 (ids below 50000: uint16).
if want tp || want ooc; then
  random_tokens "$work/t2048.bin" 50000 $((160 * 2048 + 1))
  step convert-2048 60 - "$spill" convert --out "$work/t2048" --seq-len 2048 --vocab 128256 "$work/t2048.bin"
fi
if want tp; then
  step tp-1b 150 - "$spill" train --model llama3.2-1b --data "$work/t2048" --batch 4 --seq-len 2048 --steps 8 --lr 1e-4 \
    --warmup 2 --precision bf16 --device cuda --offload none --eval-every 0 --metrics "$runs/tp-1b.jsonl" --quiet
  step torch-1b 150 "$runs/torch-1b.json" python3 "$ref" bench 4 2048 6
fi
if want ooc; then
  # shellcheck disable=SC2086
  step ooc-8b 240 - "$spill" train --model llama3.1-8b --data "$work/t2048" --batch 8 --accum 4 --seq-len 2048 --steps "${SPILL_LLAMA_8B_STEPS:-6}" \
    --lr 1e-5 --warmup 1 --precision bf16 --device cuda --device-memory 24GiB --eval-every 0 \
    --metrics "$runs/ooc-8b.jsonl" --plan-json "$runs/ooc-8b.plan.json" --memory-report ${SPILL_LLAMA_8B_ARGS:-}
fi

python3 "$ref" report "$runs" "$out/llama_h200.json" "$(bash tools/bench/commit.sh)" \
  "$(cat "$out/nvidia-smi.txt")"
rm -rf "$work"
