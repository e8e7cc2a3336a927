#!/usr/bin/env bash
# kernels_bench.sh: one call on the lent GPU machine that measures spill's
# compute paths beside PyTorch and writes $OUT/kernels_h200.json
# (tools/cuda/kernels_report.py; copy it to tools/bench/results/):
#
#   - attention forward + backward at head sizes 64 and 128, T 1024 to 8192
#     (gpubench -attn-sweep) against F.scaled_dot_product_attention's
#     fastest backend (tools/cuda/kernels_ref.py);
#   - whole GPT training steps, gpt2-124m T1024, gpt2-1.3b T1024 and
#     gpt2-2.7b T2048 with head size 128 (gpubench), against torch.compile
#     of the same model (tools/gpubench/torch_ref.py, SPILL_TORCH_COMPILE=1),
#     and llama3.2-1b at T2048 (gpubench shape llama1b) against
#     transformers' model under torch.compile (tools/bench/llama_ref.py),
#     with spill's host time per step;
#   - with SPILL_BENCH_GEMM=1, the GEMMs at the 124M shapes with float32 and
#     with reduced-precision split-K reductions (SPILL_CUBLAS_REDUCED_PRECISION);
#   - with SPILL_BENCH_GO=1, the Go benchmarks of the launch path;
#   - with SPILL_BENCH_ONE_TILE=1, the head-size-64 attention again with the
#     one-tile forward kernel (SPILL_FLASH_FWD=1) beside the default two-tile one;
#   - with SPILL_ATTN_VARIANTS, opt-in attention kernels at the same shapes;
#   - with SPILL_ATTN_BASE_PTX, the Hopper attention kernels of another PTX
#     file at the same shapes (variant "base").
#
# Prepare .gpu/ with tools/cuda/pack.sh, then run with the device tool
# (carry [".gpu"]): bash tools/cuda/kernels_bench.sh. SPILL_COMMIT names the
# commit in the report (default: tools/bench/commit.sh, git's HEAD with
# "+modified" when the files differ from it).
# SPILL_ATTN_SWEEP (HS:T,...), SPILL_BENCH_SHAPES (default 124m,1.3b,2.7b,llama1b;
# "none": no whole steps)
# and SPILL_DEADLINE (default 480 s for the whole script: a step is cut to
# what is left and skipped under 15 s) adjust it; SPILL_PTX=1 regenerates
# the PTX first (needed after a .cu change; packed as $OUT/ptx.tgz).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
out=${OUT:-$(mktemp -d /tmp/spill-kbench.XXXXXX)}
mkdir -p "$out"
if [ -f .gpu/env.sh ]; then source tools/cuda/gpuenv.sh; fi
source tools/cuda/env.sh
deadline=${SPILL_DEADLINE:-480}
attn=${SPILL_ATTN_SWEEP:-64:1024,64:2048,64:4096,64:8192,128:1024,128:2048,128:4096,128:8192}
shapes=${SPILL_BENCH_SHAPES:-124m,1.3b,2.7b,llama1b}
commit=$(bash tools/bench/commit.sh)
status=0
source tools/cuda/step.sh
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv >"$out/nvidia-smi.txt" 2>&1
cat "$out/nvidia-smi.txt"
if [ -n "${SPILL_PTX:-}" ]; then
  step ptx 150 go generate ./kernels/cuda/
  tar -C kernels/cuda -czf "$out/ptx.tgz" ptx
fi
step build 200 go build -tags cuda -o /tmp/gpubench ./tools/gpubench || exit 1
if [ -n "${SPILL_BENCH_GO:-}" ]; then
  step gobench 90 go test -tags cuda -count=1 -run '^$' -bench 'Launch|StepOps|MatmulGelu' -benchtime 2000x ./kernels/cuda/
fi
[ "$shapes" = none ] && shapes=
[ -z "$shapes" ] || step spill_gpt 240 /tmp/gpubench -train-only -shapes "$shapes" -out "$out/gpt.json"
step spill_attn 120 /tmp/gpubench -attn-sweep "$attn" -out "$out/spill_attn.json"
# The one-tile forward (flash_fwd_bf16_hs64, SPILL_FLASH_FWD=1) beside the
# default two-tile one at the head-size-64 shapes.
attn64=$(echo "$attn" | tr ',' '\n' | grep '^64:' | paste -sd, -)
[ -z "$attn64" ] || [ -z "${SPILL_BENCH_ONE_TILE:-}" ] || SPILL_FLASH_FWD=1 step spill_attn1 90 /tmp/gpubench -attn-sweep "$attn64" -out "$out/spill_attn1.json"
# Opt-in attention kernels beside the defaults, at the same shapes:
# SPILL_ATTN_VARIANTS="NAME:VAR=VALUE VAR2=VALUE;NAME2:VAR=VALUE" (e.g.
# "sm90:SPILL_FLASH_FWD=sm90;gx4:SPILL_FLASH_PERSIST=1 SPILL_FLASH_GRIDX=4"):
# each variant's settings are separated by spaces.
IFS=';' read -r -a variants <<<"${SPILL_ATTN_VARIANTS:-}"
for v in "${variants[@]}"; do
  [ -n "$v" ] || continue
  read -r -a vars <<<"${v#*:}"
  step "spill_attn_v_${v%%:*}" 60 env "${vars[@]}" /tmp/gpubench -attn-sweep "$attn" -out "$out/spill_attn_v_${v%%:*}.json"
done
# SPILL_ATTN_BASE_PTX=FILE: the attention sweep again from a gpubench
# built with FILE as kernels/cuda/ptx/flashattn_sm90.ptx (say the committed
# PTX of the commit before a kernel change, packed into .gpu/), reported as
# the variant "base": the old kernels timed beside the new in one call.
if [ -n "${SPILL_ATTN_BASE_PTX:-}" ]; then
  cur=$(mktemp)
  cp kernels/cuda/ptx/flashattn_sm90.ptx "$cur" && cp "$SPILL_ATTN_BASE_PTX" kernels/cuda/ptx/flashattn_sm90.ptx &&
    step build_base 200 go build -tags cuda -o /tmp/gpubench_base ./tools/gpubench
  cp "$cur" kernels/cuda/ptx/flashattn_sm90.ptx || status=1
  [ -x /tmp/gpubench_base ] && step spill_attn_v_base 60 /tmp/gpubench_base -attn-sweep "$attn" -out "$out/spill_attn_v_base.json"
fi
PYTHONUNBUFFERED=1 step torch_attn 120 python3 tools/cuda/kernels_ref.py "$out/torch_attn.json" "$attn"
if [ -n "${SPILL_BENCH_GEMM:-}" ]; then
  SPILL_KERNELS_ONLY=1 PYTHONUNBUFFERED=1 step torch_gemm 90 python3 tools/gpubench/torch_ref.py "$out/torch_gemm.json" 124m
  step gemm_default 90 /tmp/gpubench -kernels-only -shapes 124m -torch "$out/torch_gemm.json" -out "$out/gemm_default.json"
  SPILL_CUBLAS_REDUCED_PRECISION=1 step gemm_reduced 90 /tmp/gpubench -kernels-only -shapes 124m -torch "$out/torch_gemm.json" -out "$out/gemm_reduced.json"
fi
gpts=$(echo "$shapes" | tr ',' '\n' | grep -v '^llama' | paste -sd, -)
[ -z "$gpts" ] || SPILL_TORCH_COMPILE=1 SPILL_TRAIN_ONLY=1 PYTHONUNBUFFERED=1 step torch_gpt 300 python3 tools/gpubench/torch_ref.py "$out/torch_compile.json" "$gpts"
# The Llama preset against transformers' LlamaForCausalLM under torch.compile
# (tools/bench/llama_ref.py bench: the same B and T as gpubench's llama1b).
if echo ",$shapes," | grep -q ',llama1b,'; then
  SPILL_TORCH_COMPILE=1 step torch_llama 240 bash -c "python3 tools/bench/llama_ref.py bench 4 2048 10 >'$out/torch_llama.json'"
fi
python3 tools/cuda/kernels_report.py "$out" "$commit" "SPILL_COMMIT=$commit bash tools/cuda/kernels_bench.sh (attention $attn; shapes $shapes)" >"$out/kernels_h200.json" || status=1
python3 - "$out/kernels_h200.json" <<'EOF' || status=1
import json, sys
r = json.load(open(sys.argv[1]))
for a in r.get("attention", []):
    print(f"attn hs{a['hs']:3d} T{a['t']:5d}: spill {a['spill_fwd_bwd_ms']:.3f} ms, torch {a.get('torch_fwd_bwd_ms', float('nan')):.3f} ms "
          f"({a.get('torch_backend')}), ratio torch/spill {a.get('ratio_torch_over_spill', float('nan')):.2f}")
for g in r.get("gpt", []):
    print(f"gpt {g['name']:5s}: spill {g.get('spill_tokens_per_sec', 0):.0f} tok/s, torch.compile {g.get('torch_compile_tokens_per_sec', 0):.0f} "
          f"tok/s, ratio {g.get('ratio_spill_over_torch_compile', float('nan')):.3f}, host {g.get('host_issue_ms_per_step', float('nan')):.2f} ms/step "
          f"of {g.get('spill_step_ms_median', float('nan')):.1f}")
EOF
exit $status
