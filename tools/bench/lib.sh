# shellcheck shell=bash
# lib.sh: what the benchmark scripts of tools/bench for the lent GPU
# machine share. Source it from such a script, set deadline (the seconds
# the whole script may take) and call bench_init:
#
#   source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#   bench_init NAME
#   deadline=${SPILL_DEADLINE:-560}

# bench_init NAME: goes to the repository's root ($root); $out is $OUT,
# else a new /tmp/spill-NAME.XXXXXX, and $out/runs is made; then the
# carried kit's environment (tools/cuda/gpuenv.sh) and the CUDA build's
# (tools/cuda/env.sh) are sourced where they are.
bench_init() {
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  cd "$root"
  out=${OUT:-$(mktemp -d "/tmp/spill-$1.XXXXXX")}
  mkdir -p "$out/runs"
  if [ -f tools/cuda/gpuenv.sh ]; then source tools/cuda/gpuenv.sh; fi
  [ -f tools/cuda/env.sh ] && source tools/cuda/env.sh
}

# left: the seconds left before the deadline.
left() { echo $((deadline - SECONDS)); }

# build_spill: builds /tmp/spill with the tags SPILL_BUILD_TAGS (default
# cuda), showing the last 20 lines of its output; the status is the
# build's.
build_spill() {
  echo "== build $(date -u +%FT%TZ)"
  go build -tags "${SPILL_BUILD_TAGS-cuda}" -o /tmp/spill ./cmd/spill 2>&1 | tail -20
}

# machine_info: shows the GPU (name, driver, memory) and the host's memory
# and keeps them in $out/nvidia-smi.txt and $out/free.txt.
machine_info() {
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/nvidia-smi.txt"
  free -g | tee "$out/free.txt"
}

# random_tokens FILE BELOW COUNT: writes COUNT random token ids below BELOW
# (uint16, seeded: the same ids each time) to FILE.
random_tokens() {
  python3 - "$@" <<'PY'
import array, random, sys
r = random.Random(0)
open(sys.argv[1], "wb").write(array.array("H", (r.randrange(int(sys.argv[2])) for _ in range(int(sys.argv[3])))).tobytes())
PY
}

# run_spill NAME LIMIT MIN TAIL ARGS...: one /tmp/spill ARGS under a
# timeout of LIMIT seconds (at most those left), its command line, output,
# errors and exit status kept in $out/runs/NAME.cmd, .out, .err and .rc;
# shows the command, the status and the last TAIL lines of the output
# (with the last 20 of the errors on failure). With fewer than MIN seconds
# left it is skipped, with status 1.
run_spill() {
  local name=$1 limit=$2 min=$3 lines=$4; shift 4
  local l; l=$(left)
  if [ "$l" -lt "$min" ]; then echo "== $name: skipped, ${l}s left"; return 1; fi
  [ "$limit" -le "$l" ] || limit=$l
  echo "spill $*" >"$out/runs/$name.cmd"
  echo "== $name (limit ${limit}s): spill $*"
  local t0=$SECONDS
  timeout "$limit" /tmp/spill "$@" >"$out/runs/$name.out" 2>"$out/runs/$name.err"
  local rc=$?
  echo "$rc" >"$out/runs/$name.rc"
  echo "== $name: exit $rc after $((SECONDS - t0))s"
  tail -n "$lines" "$out/runs/$name.out"
  [ $rc -eq 0 ] || tail -n 20 "$out/runs/$name.err"
}
