#!/usr/bin/env bash
# attn_oldnew.sh: one call on the lent GPU machine for a change to the
# attention kernels, the old kernels timed beside the new in that call:
#
#   1. with SPILL_PTX=1, regenerate flashattn.ptx and flashattn_sm90.ptx
#      (packed as $OUT/ptx.tgz, to commit) and write ptxas's reports
#      (registers, spills; step.sh's flash_ptx) into $OUT/logs.tgz;
#   2. build gpubench from this tree and from the old one: SPILL_OLD_TREE,
#      a tarball of `git archive BASE` (default .gpu/old.tgz; make it with
#      `git archive -o .gpu/old.tgz BASE` before packing the call), built
#      with this tree's vendored modules, and with SPILL_MID_TREE (say
#      .gpu/mid.tgz, `git archive -o .gpu/mid.tgz $(git stash create)` of a
#      step between them, its attention PTX regenerated and kept in
#      logs.tgz's mid/ptx) a third, so that one call tells two changes apart;
#   3. with SPILL_TEST=1, `go test -tags cuda ./kernels/cuda/` and
#      `-run CUDA ./engine/` (SPILL_TEST_RUN narrows the first);
#   4. `gpubench -attn-sweep` of old, (mid,) new, old, (mid,) new (SPILL_ATTN_SWEEP,
#      default hs 64 and 128 at T 1k-8k; SPILL_ATTN_ENV, say
#      SPILL_FLASH_BWD=sm90f2w, set for both) and
#      F.scaled_dot_product_attention's fastest backend (kernels_ref.py);
#   5. with SPILL_NCU_DUR=HS:T, each attention kernel's duration under ncu
#      for each binary; with SPILL_NCU_VARIANTS set, tools/cuda/ncu_attn.sh
#      on the new tree.
#
# $OUT/attn_oldnew.json holds, per shape, the fastest of each binary's two
# runs, new (and mid) over old and torch over each, with both runs kept; $OUT/run.log
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
mid=${SPILL_MID_TREE:-}
sides="old new"
[ -n "$mid" ] && sides="old mid new"
read -r -a aenv <<<"${SPILL_ATTN_ENV:-}"
commit=$(bash tools/bench/commit.sh)
status=0
source tools/cuda/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
for side in old mid; do
  t=${!side}
  [ -n "$t" ] || continue
  mkdir -p /tmp/spill-$side && tar -xzf "$t" -C /tmp/spill-$side || { echo "attn_oldnew.sh: no $side tree at $t"; return 1; }
  ln -sfn "$root/vendor" /tmp/spill-$side/vendor
done
# The mid tree's attention PTX is always regenerated: a stash of a step
# between commits holds the PTX of the last commit, not of its .cu files.
if [ -n "$mid" ]; then
  mkdir -p "$out/mid"
  (cd /tmp/spill-mid && flash_ptx "$out/mid" && mkdir -p "$out/mid/ptx" &&
    cp kernels/cuda/ptx/flashattn.ptx kernels/cuda/ptx/flashattn_sm90.ptx "$out/mid/ptx/") >"$out/mid/flash_ptx.log" 2>&1 &
fi
if [ -n "${SPILL_PTX:-}" ]; then
  flash_ptx "$out" || { echo "attn_oldnew.sh: the PTX did not compile"; return 1; }
  tar czf "$R/ptx.tgz" kernels/cuda/ptx/flashattn.ptx kernels/cuda/ptx/flashattn_sm90.ptx
fi
wait
if [ -n "$mid" ] && ! grep -q "== ptx: exit 0" "$out/mid/flash_ptx.log"; then
  echo "attn_oldnew.sh: the mid tree's PTX did not compile"; tail -n 20 "$out/mid/flash_ptx.log"; return 1
fi
for side in old mid; do
  [ -d /tmp/spill-$side ] || continue
  (cd /tmp/spill-$side && go build -tags cuda -o /tmp/gpubench_$side ./tools/gpubench) >"$out/build_$side.log" 2>&1 &
done
step build 200 go build -tags cuda -o /tmp/gpubench_new ./tools/gpubench || return 1
wait
for side in $sides; do
  [ -x /tmp/gpubench_$side ] || { echo "attn_oldnew.sh: the $side tree did not build"; tail -n 20 "$out/build_$side.log"; return 1; }
done
if [ -n "${SPILL_TEST:-}" ]; then
  step test 240 go test -tags cuda -count=1 -v -run "${SPILL_TEST_RUN:-.}" ./kernels/cuda/
  step engine 90 go test -tags cuda -count=1 -v -run CUDA ./engine/
fi
for i in 1 2; do
  for side in $sides; do
    step "attn_$side$i" 90 env "${aenv[@]}" /tmp/gpubench_$side -attn-sweep "$attn" -out "$out/attn_$side$i.json"
  done
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
runs = {n: load(f"attn_{n}.json") for n in ("old1", "mid1", "new1", "old2", "mid2", "new2")}
runs = {n: r for n, r in runs.items() if r}
torch = load("torch_attn.json")
rows = []
for key in sorted(set().union(*[set(r) for r in runs.values()])):
    row = {"hs": key[0], "t": key[1]}
    for n, r in runs.items():
        if key in r:
            row[n + "_fwd_ms"], row[n + "_bwd_ms"] = r[key].get("fwd_ms"), r[key].get("bwd_ms")
            if n.endswith("1"):
                row[n[:-1] + "_kernels"] = r[key].get("kernels")
    for side in ("old", "mid", "new"):
        for p in ("fwd", "bwd"):
            v = [row.get(f"{side}{i}_{p}_ms") for i in (1, 2)]
            v = [x for x in v if x]
            if v:
                row[f"{side}_{p}_ms"] = min(v)
    for a, b in (("old", "new"), ("old", "mid"), ("mid", "new")):
        if f"{a}_bwd_ms" in row and f"{b}_bwd_ms" in row:
            row[f"bwd_{a}_over_{b}"] = row[f"{a}_bwd_ms"] / row[f"{b}_bwd_ms"]
    t = torch.get(key)
    if t and "new_bwd_ms" in row:
        row["torch_backend"] = t.get("fastest")
        tf, tb = t.get("fwd_ms"), t.get("bwd_ms")
        row["torch_fwd_ms"], row["torch_bwd_ms"] = tf, tb
        if tf and tb:
            for side in ("old", "mid", "new"):
                if f"{side}_bwd_ms" in row:
                    row[f"torch_over_{side}_fwd_bwd"] = (tf + tb) / (row[f"{side}_fwd_ms"] + row[f"{side}_bwd_ms"])
    rows.append(row)
print(json.dumps({"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  "commit": commit, "env": env,
                  "command": f"SPILL_ATTN_ENV='{env}' SPILL_ATTN_SWEEP={attn} bash tools/cuda/attn_oldnew.sh",
                  "machine": open(os.path.join(d, "gpu.txt")).read().strip(),
                  "notes": ["old and new (and mid): gpubench -attn-sweep of the old tree's build, (the mid tree's) and this "
                            "tree's, run old, (mid,) new, old, (mid,) new in one call; *_ms the faster of each binary's two runs",
                            "torch: F.scaled_dot_product_attention's fastest backend (kernels_ref.py), same call"],
                  "attention": rows}, indent=1))
EOF
python3 -c '
import json, sys
for r in json.load(open(sys.argv[1]))["attention"]:
    print(r["hs"], r["t"], "bwd old %.3f mid %.3f new %.3f (new/old %.3fx, mid/old %.3fx)" % (r.get("old_bwd_ms", 0),
          r.get("mid_bwd_ms", 0), r.get("new_bwd_ms", 0), r.get("bwd_old_over_new", 0), r.get("bwd_old_over_mid", 0)),
          "fwd old %.3f new %.3f;" % (r.get("old_fwd_ms", 0), r.get("new_fwd_ms", 0)),
          "fwd+bwd vs torch: old %.3f mid %.3f new %.3f" % (r.get("torch_over_old_fwd_bwd", 0),
          r.get("torch_over_mid_fwd_bwd", 0), r.get("torch_over_new_fwd_bwd", 0)))
' "$out/attn_oldnew.json" || status=1
# SPILL_NCU_DUR=HS:T: the duration of each attention kernel (ncu's
# gpu__time_duration of every flash_* launch, forward and backward) of
# each binary in a sweep of that shape; the last three launches of each kernel are printed
# (the self-checks at Open come first).
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -n1)
if [ -n "${SPILL_NCU_DUR:-}" ] && [ -n "$ncu" ]; then
  for bin in $sides; do
    step "dur_$bin" 90 env "${aenv[@]}" "$ncu" --metrics gpu__time_duration.sum -k "regex:^flash_" --launch-count 600 \
      /tmp/gpubench_$bin -attn-sweep "$SPILL_NCU_DUR" -out /tmp/dur.json
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
