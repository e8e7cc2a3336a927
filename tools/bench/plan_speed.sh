#!/usr/bin/env bash
# plan_speed.sh: how long spill plan takes to plan gpt2-1.3b and gpt2-6.7b
# out of core and to refuse gpt2-70b (issue 9: a refused plan fails within
# 2 s whatever the model size), with the whole binary, on this machine.
# Writes tools/bench/results/plan_speed.json (or $1).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
out=${1:-tools/bench/results/plan_speed.json}
go build -o /tmp/spill-plan ./cmd/spill
disk=$(mktemp -d)
common=(--disk-dir "$disk" --disk-memory 60GiB --seq-len 1024 --batch 8 --accum 8)
time_it() { # name expect-exit args...
  local name=$1 want=$2; shift 2
  local best=999
  for _ in 1 2 3; do
    local t0 t1 rc=0
    t0=$(date +%s.%N)
    /tmp/spill-plan plan "$@" >/dev/null 2>&1 || rc=$?
    t1=$(date +%s.%N)
    [ "$rc" = "$want" ] || { echo "$name: exit $rc, want $want" >&2; exit 1; }
    best=$(python3 -c "print(min($best, $t1 - $t0))")
  done
  printf '{"name": "%s", "command": "spill plan %s", "best_of_3_s": %s}' "$name" "$*" "$best"
}
r1=$(time_it gpt2-1.3b-8g 0 --model gpt2-1.3b "${common[@]}" --device-memory 8GiB --host-memory 110GiB)
r2=$(time_it gpt2-6.7b-16g 0 --model gpt2-6.7b "${common[@]}" --device-memory 16GiB --host-memory 112GiB)
r3=$(time_it gpt2-70b-refused 1 --model gpt2-70b "${common[@]}" --device-memory 16GiB --host-memory 112GiB)
rm -rf "$disk"
cat >"$out" <<JSON
{
 "date": "$(date -u +%FT%TZ)",
 "commit": "$(git rev-parse HEAD)",
 "machine": "$(nproc) cores, $(grep MemTotal /proc/meminfo | awk '{print int($2/1048576)}') GiB (development machine; the planner needs no GPU)",
 "script": "bash tools/bench/plan_speed.sh",
 "target": "a refused plan fails within 2 s whatever the model size",
 "runs": [$r1, $r2, $r3]
}
JSON
cat "$out"
