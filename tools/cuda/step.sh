# step.sh: the deadline-bound step runner shared by the GPU scripts
# (bench.sh, kernels_bench.sh, attn_oldnew.sh) and flash_ptx, which
# regenerates the attention PTX (check_and_bench.sh, attn_oldnew.sh).
# Source it after setting out (the log directory), deadline (seconds for
# the whole script, against $SECONDS) and status (0; set to 1 when a step
# fails or is skipped).
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

# flash_ptx DIR: regenerates kernels/cuda/ptx/flashattn.ptx (compute_80)
# and flashattn_sm90.ptx (compute_90a) from their .cu files, with the
# ptxas resource reports of both (flashattn.cu for sm_90, flashattn_sm90.cu
# for sm_90a) in DIR/ptxas.log and DIR/ptxas_sm90.log and nvcc's output in
# DIR/ptx.log and DIR/ptx_sm90.log; a file is replaced only once its new
# PTX compiled. SPILL_PTX_ALL=1 regenerates every PTX file (tools/cuda/ptx.sh)
# instead. Prints the registers and spills of the flash kernels; returns
# non-zero when the PTX did not compile.
flash_ptx() {
  local d=$1 k=kernels/cuda/kernels p=kernels/cuda/ptx rc tmp
  tmp=$(mktemp -d /tmp/flash_ptx.XXXXXX)
  nvcc -arch=sm_90 -cubin -O3 -std=c++17 -Xptxas -v -o $tmp/flashattn.cubin $k/flashattn.cu >"$d/ptxas.log" 2>&1 &
  nvcc -arch=sm_90a -cubin -O3 -std=c++17 -Xptxas -v -o $tmp/flashattn_sm90.cubin $k/flashattn_sm90.cu >"$d/ptxas_sm90.log" 2>&1 &
  if [ -n "${SPILL_PTX_ALL:-}" ]; then
    bash tools/cuda/ptx.sh >"$d/ptx.log" 2>&1
  else
    nvcc -ptx -arch=compute_90a -O3 -std=c++17 -o $tmp/flashattn_sm90.ptx $k/flashattn_sm90.cu >"$d/ptx_sm90.log" 2>&1 &&
      nvcc -ptx -arch=compute_80 -O3 -std=c++17 -o $tmp/flashattn.ptx $k/flashattn.cu >"$d/ptx.log" 2>&1 &&
      chmod 644 $tmp/flashattn_sm90.ptx $tmp/flashattn.ptx && cp $tmp/flashattn_sm90.ptx $tmp/flashattn.ptx $p/
  fi
  rc=$?
  echo "== ptx: exit $rc after ${SECONDS}s"
  tail -n 3 "$d/ptx.log" "$d/ptx_sm90.log" 2>/dev/null
  wait
  rm -rf "$tmp"
  grep -E "Compiling entry|registers|spill" "$d/ptxas.log" | grep -A2 "flash_" | grep -v "^--" | head -n 40
  grep -E "Compiling entry|registers|spill" "$d/ptxas_sm90.log" | grep -A2 "flash_fwd3\|flash_fwd4\|flash_fwd5\|flash_bwd" |
    grep -v "^--" | head -n 90
  return $rc
}
