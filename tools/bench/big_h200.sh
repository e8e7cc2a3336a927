#!/usr/bin/env bash
# big_h200.sh: issue 12's benchmark in one call on the lent GPU machine
# (carry the kit of tools/cuda/pack.sh; command "bash tools/bench/big_h200.sh"):
# a 13B model (llama2-13b, random weights) whose bf16 weights and
# gradients with fp32 master weights and Adam moments (~16 bytes a
# parameter, ~208 GB) do not fit the H200, trained with no --device-memory
# cap and the default budgets, T 2048, 64 sequences per step (8 x 8):
# time to the first step and its phases, tokens/s, model TFLOP/s
# (6 x params x tokens/s), each tier's planned bytes, peak host RSS against
# the plan, and the share of the sampled steps' time exposed on transfers
# and the host optimizer. Then the same model and data with another split
# of the optimizer state (SPILL_BIG_CMP_ARGS, default --device-memory
# 80GiB: fewer layers' state on the device, some on disk) for its first
# SPILL_BIG_CMP_STEPS steps, whose losses must equal the first run's
# within bf16 noise. Writes $OUT/13b_h200.json (date, commit, commands).
# SPILL_DEADLINE (default 570 s) bounds the whole script; SPILL_BIG_RUNS
# (big,cmp; big; cmp) picks the runs.
set -uo pipefail
# shellcheck source=tools/bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_init big
deadline=${SPILL_DEADLINE:-570}
model=${SPILL_BIG_MODEL:-llama2-13b}
steps=${SPILL_BIG_STEPS:-10}

build_spill
[ -x /tmp/spill ] || { echo "build failed"; exit 1; }
machine_info
df -h "${HOME:-/root}" | tail -1 | tee "$out/df.txt"

# Synthetic tokens: 1000 sequences of 2049 ids below 32000.
rm -rf /tmp/big-data
random_tokens "$out/t.bin" 32000 $((1000 * 2049))
/tmp/spill convert --out /tmp/big-data --seq-len 2048 --vocab 32000 "$out/t.bin" >"$out/convert.log" 2>&1 || { cat "$out/convert.log"; exit 1; }
rm -f "$out/t.bin"

# run NAME LIMIT ARGS...: one spill train of the model on the tokens, its
# command recorded (run_spill).
run() {
  local name=$1 limit=$2; shift 2
  run_spill "$name" "$limit" 40 16 train --data /tmp/big-data --model "$model" --seq-len "${SPILL_BIG_SEQ:-2048}" --batch 8 --accum 8 \
    --lr 1e-4 --warmup 2 --precision bf16 --eval-every 0 --quiet --metrics "$out/runs/$name.jsonl" --plan-json "$out/runs/$name.plan.json" "$@"
}
# Both runs take longer than one call: SPILL_BIG_RUNS=cmp runs the second
# alone, against the losses of the first run kept in
# tools/bench/results/13b_h200.json (the same tokens and seed).
if [ "${SPILL_BIG_RUNS:-big,cmp}" != cmp ]; then
  run big "$(( $(left) - ${SPILL_BIG_CMP_TIME:-230} ))" --steps "$steps"
fi
# shellcheck disable=SC2086
[ "${SPILL_BIG_CMP_STEPS:-3}" -gt 0 ] && [ "${SPILL_BIG_RUNS:-big,cmp}" != big ] &&
  run big-cmp "$(left)" --steps "${SPILL_BIG_CMP_STEPS:-3}" ${SPILL_BIG_CMP_ARGS:---device-memory 80GiB}

python3 - "$out/runs" "$out/13b_h200.json" "$(bash tools/bench/commit.sh)" "$(cat "$out/nvidia-smi.txt")" <<'PY'
import datetime, json, sys
sys.path.insert(0, "tools/bench")
from ooc_report import load_run
d, path, commit, machine = sys.argv[1:5]
a, b = load_run(d, "big"), load_run(d, "big-cmp")
if not a.get("losses"):
    try:  # SPILL_BIG_RUNS=cmp: the first run is the one kept in the results
        kept = json.load(open("tools/bench/results/13b_h200.json"))
        a = kept["runs"]["big"]
        a["kept_from"] = "tools/bench/results/13b_h200.json"
        a.setdefault("commit", kept.get("commit"))  # the run's own, not this call's
        a.setdefault("date", kept.get("date"))
    except (OSError, KeyError, ValueError):
        pass
targets = []
if a.get("model_tflops"):
    targets.append({"what": "13B, no cap, default budgets, T 2048, 64 seq/step: model TFLOP/s", "value": a["model_tflops"],
                    "target": 350, "met": a["model_tflops"] >= 350})
la, lb = a.get("losses") or [], b.get("losses") or []
n = min(len(la), len(lb))
if n:
    dmax = max(abs(la[i] - lb[i]) / abs(la[i]) for i in range(n))
    targets.append({"what": f"first {n} losses, another split of the optimizer state vs the first run (bf16)",
                    "max_relative_difference": dmax, "target": "within bf16 noise (< 1e-2)", "met": dmax < 1e-2})
doc = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "commit": commit,
       "machine": machine, "script": "bash tools/bench/big_h200.sh", "targets": targets, "runs": {"big": a, "big-cmp": b}}
if b.get("losses"):
    b.setdefault("commit", commit)
    b.setdefault("date", doc["date"])
json.dump(doc, open(path, "w"), indent=1)
print(json.dumps(targets, indent=1))
PY
tar -C "$out" -czf "$out/runs.tgz" runs && rm -rf "$out/runs"
