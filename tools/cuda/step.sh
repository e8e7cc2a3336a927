# step.sh: the deadline-bound step runner shared by the GPU scripts
# (bench.sh, kernels_bench.sh). Source it after setting out (the log
# directory), deadline (seconds for the whole script, against $SECONDS) and
# status (0; set to 1 when a step fails or is skipped).
#
# step NAME LIMIT CMD...: runs CMD with at most LIMIT seconds (less when the
# deadline is nearer), its output in $out/NAME.log, and prints the log's
# test, benchmark and error lines.
step() {
  local name=$1 limit=$2; shift 2
  local left=$((deadline - SECONDS))
  if [ "$left" -lt 15 ]; then
    echo "== $name: skipped, ${left}s of SPILL_DEADLINE=${deadline}s left"
    status=1
    return 1
  fi
  [ "$limit" -le "$left" ] || limit=$left
  echo "== $name (limit ${limit}s): $*"
  local t0=$SECONDS
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc after $((SECONDS - t0))s"
  grep -E -- '^(--- FAIL|FAIL|ok|panic|==|   |Benchmark)|rror' "$out/$name.log" | tail -n 40
  [ $rc -eq 0 ] || status=1
  return $rc
}
