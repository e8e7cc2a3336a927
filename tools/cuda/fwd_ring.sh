#!/usr/bin/env bash
# fwd_ring.sh: one device call for the Hopper forward's copy ring
# (flash_fwd3_sm90, SPILL_FLASH_FWD=sm90p) on its 128-byte swizzled tiles:
# regenerate flashattn_sm90.ptx (ptx.tgz), its ptxas report, the forward
# tests (if they fail, once more with V's LBO and SBO the other way round,
# F9_VSW_LBO/F9_VSW_SBO, reported), then the attention sweep of the default
# kernels and sm90p side by side, the same with the ring rebuilt at depth
# 2 (F9_FWD3_D64=2, F9_FWD3_D128=2), and Nsight Compute's full set for one
# launch of each forward kernel (ncu.tgz). Logs under $OUT.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
out=${OUT:-$(mktemp -d /tmp/spill-ring.XXXXXX)}
mkdir -p "$out" /tmp/ringlogs
source tools/cuda/gpuenv.sh
source tools/cuda/env.sh
ptx() { nvcc -ptx -arch=compute_90a -O3 -std=c++17 "$@" -o kernels/cuda/ptx/flashattn_sm90.ptx kernels/cuda/kernels/flashattn_sm90.cu; }
tst() { timeout 200 go test -tags cuda -count=1 -run 'TestAttentionFlashSM90|TestAttentionFlash$|TestAttentionKernelsSM90' ./kernels/cuda/ >"$1" 2>&1; }
ptx >/tmp/ringlogs/ptx.log 2>&1 || { cat /tmp/ringlogs/ptx.log; exit 1; }
nvcc -arch=sm_90a -cubin -O3 -std=c++17 -Xptxas -v -o /tmp/f9.cubin kernels/cuda/kernels/flashattn_sm90.cu >/tmp/ringlogs/ptxas_sm90.log 2>&1
grep -iE "warning" /tmp/ringlogs/ptxas_sm90.log | sort | uniq -c | head -n 12
grep -A2 "flash_fwd3" /tmp/ringlogs/ptxas_sm90.log | grep -E "Compiling|registers|spill" | head -n 12
echo "== ptx after ${SECONDS}s"
tst /tmp/ringlogs/test.log; rc=$?
echo "== test: exit $rc after ${SECONDS}s"; grep -E "^(--- FAIL|FAIL|ok|panic)|Error|error" /tmp/ringlogs/test.log | head -n 20
if [ $rc -ne 0 ]; then
  ptx -DF9_VSW_LBO=1024 '-DF9_VSW_SBO=(BK*128)' >>/tmp/ringlogs/ptx.log 2>&1
  tst /tmp/ringlogs/test_vswap.log; rc=$?
  echo "== test with V's LBO and SBO swapped: exit $rc"; grep -E "^(--- FAIL|FAIL|ok|panic)|Error|error" /tmp/ringlogs/test_vswap.log | head -n 20
  [ $rc -eq 0 ] || { tar czf "$out/logs.tgz" -C /tmp ringlogs; exit 1; }
fi
chmod 644 kernels/cuda/ptx/flashattn_sm90.ptx
tar czf "$out/ptx.tgz" kernels/cuda/ptx/flashattn_sm90.ptx
go build -tags cuda -o /tmp/gpubench ./tools/gpubench || exit 1
export S=${S:-64:1024,64:4096,128:1024,128:2048,128:4096}
OUT=$out bash tools/cuda/sweep.sh default
OUT=$out bash tools/cuda/sweep.sh sm90p SPILL_FLASH_FWD=sm90p
echo "== sweep after ${SECONDS}s"
if [ -z "${SPILL_NO_NCU:-}" ]; then
  ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu | head -n1)
  mkdir -p /tmp/ringlogs/ncu
  SPILL_FLASH_FWD=sm90p timeout 120 "$ncu" --set full -k regex:flash_fwd3_sm90_bf16_hs128 --launch-skip 24 --launch-count 1 \
    /tmp/gpubench -attn-sweep 128:2048 -out /tmp/ncu1.json >/tmp/ringlogs/ncu/sm90p.txt 2>&1
  timeout 120 "$ncu" --set full -k regex:flash_fwd2k32_bf16_hs128 --launch-skip 24 --launch-count 1 \
    /tmp/gpubench -attn-sweep 128:2048 -out /tmp/ncu2.json >/tmp/ringlogs/ncu/default.txt 2>&1
  grep -E "Duration|Compute \(SM\) Throughput|highest-utilized|excessive wavefronts|Registers Per" /tmp/ringlogs/ncu/*.txt
fi
echo "== ncu after ${SECONDS}s"
ptx -DF9_FWD3_D64=2 -DF9_FWD3_D128=2 >>/tmp/ringlogs/ptx.log 2>&1 && go build -tags cuda -o /tmp/gpubench ./tools/gpubench && OUT=$out bash tools/cuda/sweep.sh sm90p_d2 SPILL_FLASH_FWD=sm90p
tar czf "$out/logs.tgz" -C /tmp ringlogs
echo "== done after ${SECONDS}s"
