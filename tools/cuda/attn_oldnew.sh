#!/usr/bin/env bash
# attn_oldnew.sh: one call on the lent GPU machine for a change to the
# attention kernels, the old kernels timed beside the new in that call:
#
#   1. with SPILL_PTX=1, regenerate flashattn.ptx and flashattn_sm90.ptx
#      (packed as $OUT/ptx.tgz, to commit) and write ptxas's report of the
#      Hopper file (registers, spills) to $OUT/ptxas_sm90.log;
#   2. build gpubench from this tree and from the old one: SPILL_OLD_TREE,
#      a tarball of `git archive BASE` (default .gpu/old.tgz; make it with
#      `git archive -o .gpu/old.tgz BASE` before packing the call), built
#      with this tree's vendored modules;
#   3. with SPILL_TEST=1, `go test -tags cuda ./kernels/cuda/` and
#      `-run CUDA ./engine/` (SPILL_TEST_RUN narrows the first);
#   4. `gpubench -attn-sweep` of old, new, old, new (SPILL_ATTN_SWEEP,
#      default hs 64 and 128 at T 1k-8k; SPILL_ATTN_ENV, say
#      SPILL_FLASH_BWD=sm90f2w, set for both) and
#      F.scaled_dot_product_attention's fastest backend (kernels_ref.py);
#   5. with SPILL_NCU_DUR=HS:T, each backward kernel's duration under ncu
#      for both binaries; with SPILL_NCU_VARIANTS set, tools/cuda/ncu_attn.sh
#      on the new tree.
#
# $OUT/attn_oldnew.json holds, per shape, the fastest of each binary's two
# runs, new over old and torch over new, with both runs kept; $OUT/run.log
# what the call printed, $OUT/ptx.tgz the fresh PTX and $OUT/logs.tgz every
# step's log and JSON (the device tool brings back at most 8 files).
# SPILL_DEADLINE (default 540 s) bounds the whole call.
#
#   device run, carry [".gpu"]: SPILL_PTX=1 SPILL_TEST=1 bash tools/cuda/attn_oldnew.sh
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
R=${OUT:-$(mktemp -d /tmp/spill-oldnew.XXXXXX)}
out=$R/logs
mkdir -p "$out"
main() {
if [ -f .gpu/env.sh ]; then source tools/cuda/gpuenv.sh; fi
source tools/cuda/env.sh
deadline=${SPILL_DEADLINE:-540}
attn=${SPILL_ATTN_SWEEP:-64:1024,64:2048,64:4096,64:8192,128:1024,128:2048,128:4096,128:8192}
old=${SPILL_OLD_TREE:-.gpu/old.tgz}
read -r -a aenv <<<"${SPILL_ATTN_ENV:-}"
commit=$(bash tools/bench/commit.sh)
status=0
source tools/cuda/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
if [ -n "${SPILL_PTX:-}" ]; then
  k=kernels/cuda/kernels p=kernels/cuda/ptx
  nvcc -arch=sm_90a -cubin -O3 -std=c++17 -Xptxas -v -o /tmp/flashattn_sm90.cubin $k/flashattn_sm90.cu >"$out/ptxas_sm90.log" 2>&1 &
  step ptx_sm90 200 nvcc -ptx -arch=compute_90a -O3 -std=c++17 -o /tmp/flashattn_sm90.ptx $k/flashattn_sm90.cu &&
    step ptx 200 nvcc -ptx -arch=compute_80 -O3 -std=c++17 -o /tmp/flashattn.ptx $k/flashattn.cu &&
    chmod 644 /tmp/flashattn_sm90.ptx /tmp/flashattn.ptx &&
    cp /tmp/flashattn_sm90.ptx /tmp/flashattn.ptx $p/ || { echo "attn_oldnew.sh: the PTX did not compile"; return 1; }
  tar czf "$R/ptx.tgz" $p/flashattn.ptx $p/flashattn_sm90.ptx
  wait
  grep -E "Compiling entry|registers|spill" "$out/ptxas_sm90.log" | grep -A2 "flash_bwd" | grep -v "^--" | head -n 90
fi
mkdir -p /tmp/spill-old && tar -xzf "$old" -C /tmp/spill-old || { echo "attn_oldnew.sh: no old tree at $old"; return 1; }
ln -sfn "$root/vendor" /tmp/spill-old/vendor
(cd /tmp/spill-old && go build -tags cuda -o /tmp/gpubench_old ./tools/gpubench) >"$out/build_old.log" 2>&1 &
step build 200 go build -tags cuda -o /tmp/gpubench ./tools/gpubench || return 1
wait
[ -x /tmp/gpubench_old ] || { echo "attn_oldnew.sh: the old tree did not build"; tail -n 20 "$out/build_old.log"; return 1; }
if [ -n "${SPILL_TEST:-}" ]; then
  step test 240 go test -tags cuda -count=1 -v -run "${SPILL_TEST_RUN:-.}" ./kernels/cuda/
  step engine 90 go test -tags cuda -count=1 -v -run CUDA ./engine/
fi
for r in old1 new1 old2 new2; do
  bin=/tmp/gpubench
  [ "${r#old}" != "$r" ] && bin=/tmp/gpubench_old
  step "attn_$r" 90 env "${aenv[@]}" "$bin" -attn-sweep "$attn" -out "$out/attn_$r.json"
done
PYTHONUNBUFFERED=1 step torch_attn 120 python3 tools/cuda/kernels_ref.py "$out/torch_attn.json" "$attn"
python3 - "$out" "$commit" "$attn" "${SPILL_ATTN_ENV:-}" >"$out/attn_oldnew.json" <<'EOF' || status=1
import datetime, json, os, sys
d, commit, attn, env = sys.argv[1:5]
def load(n):
    try:
        return {(r["hs"], r["t"]): r for r in json.load(open(os.path.join(d, n))).get("attention", [])}
    except (OSError, ValueError):
        return {}
runs = {n: load(f"attn_{n}.json") for n in ("old1", "new1", "old2", "new2")}
torch = load("torch_attn.json")
rows = []
for key in sorted(set().union(*[set(r) for r in runs.values()])):
    row = {"hs": key[0], "t": key[1]}
    for n, r in runs.items():
        if key in r:
            row[n + "_fwd_ms"], row[n + "_bwd_ms"] = r[key].get("fwd_ms"), r[key].get("bwd_ms")
            if n.endswith("1"):
                row[n[:-1] + "_kernels"] = r[key].get("kernels")
    for side in ("old", "new"):
        for p in ("fwd", "bwd"):
            v = [row.get(f"{side}{i}_{p}_ms") for i in (1, 2)]
            v = [x for x in v if x]
            if v:
                row[f"{side}_{p}_ms"] = min(v)
    if "old_bwd_ms" in row and "new_bwd_ms" in row:
        row["bwd_old_over_new"] = row["old_bwd_ms"] / row["new_bwd_ms"]
    t = torch.get(key)
    if t and "new_bwd_ms" in row:
        row["torch_backend"] = t.get("fastest")
        tf, tb = t.get("fwd_ms"), t.get("bwd_ms")
        row["torch_fwd_ms"], row["torch_bwd_ms"] = tf, tb
        if tf and tb:
            row["torch_over_new_fwd_bwd"] = (tf + tb) / (row["new_fwd_ms"] + row["new_bwd_ms"])
            row["torch_over_old_fwd_bwd"] = (tf + tb) / (row["old_fwd_ms"] + row["old_bwd_ms"])
    rows.append(row)
print(json.dumps({"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  "commit": commit, "env": env,
                  "command": f"SPILL_ATTN_ENV='{env}' SPILL_ATTN_SWEEP={attn} bash tools/cuda/attn_oldnew.sh",
                  "machine": open(os.path.join(d, "gpu.txt")).read().strip(),
                  "notes": ["old and new: gpubench -attn-sweep of the old tree's build and this tree's, run old, new, "
                            "old, new in one call; *_ms the faster of each binary's two runs",
                            "torch: F.scaled_dot_product_attention's fastest backend (kernels_ref.py), same call"],
                  "attention": rows}, indent=1))
EOF
python3 -c '
import json, sys
for r in json.load(open(sys.argv[1]))["attention"]:
    print(r["hs"], r["t"], "bwd old %.3f new %.3f (%.3fx)" % (r.get("old_bwd_ms", 0), r.get("new_bwd_ms", 0), r.get("bwd_old_over_new", 0)),
          "fwd+bwd vs torch: old %.3f new %.3f" % (r.get("torch_over_old_fwd_bwd", 0), r.get("torch_over_new_fwd_bwd", 0)))
' "$out/attn_oldnew.json" || status=1
# SPILL_NCU_DUR=HS:T: the duration of each backward kernel (ncu's
# gpu__time_duration of every flash_bwd* launch) of both binaries in a
# sweep of that shape; the last three launches of each kernel are printed
# (the self-checks at Open come first).
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -n1)
if [ -n "${SPILL_NCU_DUR:-}" ] && [ -n "$ncu" ]; then
  for bin in old new; do
    b=/tmp/gpubench; [ $bin = old ] && b=/tmp/gpubench_old
    step "dur_$bin" 90 env "${aenv[@]}" "$ncu" --metrics gpu__time_duration.sum -k "regex:^flash_bwd" --launch-count 600 \
      "$b" -attn-sweep "$SPILL_NCU_DUR" -out /tmp/dur.json
    python3 - "$out/dur_$bin.log" <<'PY'
import re, sys
seen, name = {}, None
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"^  ([A-Za-z_0-9]+) \((\d+, \d+, \d+)\)x\((\d+, \d+, \d+)\)", line)
    if m:
        name = f"{m.group(1)} grid ({m.group(2)}) block ({m.group(3)})"
    m = re.search(r"gpu__time_duration.sum\s+(\S+)\s+([\d.,]+)", line)
    if m and name:
        v = float(m.group(2).replace(",", "")) * {"ns": 1e-3, "us": 1, "usecond": 1, "ms": 1e3, "msecond": 1e3}.get(m.group(1), 1)
        seen.setdefault(name, []).append(v)
for n, v in seen.items():
    if len(v) >= 3:
        print("  %-90s last three %s us" % (n, " ".join("%.1f" % x for x in v[-3:])))
PY
  done
fi
if [ -n "${SPILL_NCU_VARIANTS:-}" ] && [ $((deadline - SECONDS)) -gt 60 ]; then
  OUT=$out/ncu SPILL_NCU_LIMIT=$(((deadline - SECONDS - 20) / 2)) step ncu $((deadline - SECONDS - 5)) bash tools/cuda/ncu_attn.sh
fi
return $status
}
main 2>&1 | tee "$R/run.log"
rc=${PIPESTATUS[0]}
cp "$out/attn_oldnew.json" "$R/" 2>/dev/null
tar czf "$R/logs.tgz" -C "$R" logs && rm -rf "$out"
exit "$rc"
