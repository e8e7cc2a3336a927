#!/usr/bin/env bash
# emu.sh: check the flash-attention kernels on the host under
# AddressSanitizer and UBSan: the device code of a kernel file (between its
# "---- Device code" and "---- Entry points" markers) is extracted and
# compiled as C++20 with emulated warp primitives. Needs g++ 12 or later; no
# GPU or CUDA toolkit.
#   emu.sh         kernels/cuda/kernels/flashattn.cu with
#                  tools/cuda/emu/flashattn_emu.cpp (mma, ldmatrix, shuffles);
#   emu.sh sm90    kernels/cuda/kernels/flashattn_sm90.cu with
#                  tools/cuda/emu/flashattn_sm90_emu.cpp (wgmma through its
#                  descriptors, A from registers or shared memory, cp.async,
#                  proxy fences): the forwards and the backward
#                  (flash_bwd_kv_sm90, flash_bwd_q_sm90, and the fused
#                  flash_bwd_kv_sm90 with DQ, against float64),
#                  then the mutants: deliberately broken copies of the kernels
#                  (a descriptor, the transpose flag, a mask, a fence, a wait;
#                  in the pipelined kernels a wait_group count, a buffer, a
#                  barrier) that must fail;
#   emu.sh sm90bwd only the Hopper backward, no mutants.
#   emu.sh sm90fwd4 only the forwards with 128-key tiles (flash_fwd4), no
#                  mutants.
#   emu.sh sm90ws  only the forwards with a producer warpgroup (flash_fwd5:
#                  mbarriers, bulk tensor copies), then their mutants
#                  (also among emu.sh sm90's).
#   emu.sh sm90bwdws only the fused backward with a producer warpgroup
#                  (flash_bwd_fused1w, flash_bwd_fused2w), then their
#                  mutants (also among emu.sh sm90's).
#   emu.sh fwdmt   only the two-tile forwards at head size 128 (64 and 32
#                  keys per tile);
#   emu.sh bwdv    only the split backward's variants of flashattn.cu
#                  (flash_bwd_kv_v, flash_bwd_q_v: against float64 and bit
#                  for bit against the split kernels), then their mutants,
#                  each of which must fail.
# EMU_SANITIZE=thread builds with ThreadSanitizer instead: it reports
# shared-memory accesses of one block's threads not ordered by a barrier
# (a missing __syncthreads); slower. The cp.async copies land at once in
# the mma.sync emulator, so the pipeline's own ordering is not checked.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cxx() { ${CXX:-g++} -std=c++20 -O1 -g -fsanitize=${EMU_SANITIZE:-address,undefined} -fno-strict-aliasing -pthread "$@"; }
body() { sed -n '/^\/\/ ---- Device code/,/^\/\/ ---- Entry points/p' "$1" | sed '$d'; }
# run_mutants LABEL SRC INC CPP PATTERN CMD...: each entry of the array
# mutants ("name|sed expression") is applied to SRC's device code, written
# to $tmp/INC, and the emulator $tmp/CPP rebuilt as $tmp/mutant; CMD must
# then fail (PATTERN picks the line that says why). A mutant that changes
# nothing or passes fails the script.
run_mutants() {
  local label=$1 src=$2 inc=$3 cpp=$4 pat=$5 failed=0 m name expr
  shift 5
  for m in "${mutants[@]}"; do
    name=${m%%|*} expr=${m#*|}
    body "$src" | sed "$expr" >"$tmp/$inc"
    if cmp -s "$tmp/$inc" <(body "$src"); then
      echo "emu.sh $label: mutant '$name' changed nothing (stale sed expression)" >&2
      failed=1
      continue
    fi
    cxx -o "$tmp/mutant" "$tmp/$cpp"
    if timeout 900 "$@" >"$tmp/log" 2>&1; then
      echo "emu.sh $label: mutant '$name' PASSED the check (the emulator misses it)" >&2
      failed=1
    else
      echo "emu.sh $label: mutant '$name' fails as it must: $(grep -m1 -E "$pat" "$tmp/log" || echo "crashed or hung")"
    fi
  done
  return $failed
}
# The mutants of the forwards with a producer warpgroup (flash_fwd5: mbarriers
# and bulk tensor copies); emu.sh sm90 runs them with the others.
ws_mutants=(
  "producer warpgroup: a slot refilled without waiting for it to be emptied|s/f9_mbar_wait(\&e\[slot\], ((i \/ D) \& 1) ^ 1);//"
  "producer warpgroup: S issued without waiting for its K tile|s/if constexpr (DS) f9_mbar_wait(\&kfull\[kc % D\], (kc \/ D) \& 1);//"
  "producer warpgroup: the V tile's full barrier waited on the wrong parity|s/f9_mbar_wait(\&vfull\[vc % D\], (vc \/ D) \& 1)/f9_mbar_wait(\&vfull[vc % D], ((vc \/ D) \& 1) ^ 1)/"
  "producer warpgroup: the empty barriers expect one arrival per warpgroup|s/f9_mbar_init(\&kempty\[i\], 4 \* WG);/f9_mbar_init(\&kempty[i], WG);/"
  "producer warpgroup: V copied from K's columns|s/vcol = (NH + NKV + kv) \* HS/vcol = (NH + kv) * HS/"
  "producer warpgroup: no fence.mbarrier_init|s/^ *f9_mbar_init_fence();//"
  "producer warpgroup, turns: warpgroup 1 arrives in its last step too|s/if (!(final \&\& wgi == 1)) f9_bar_arrive_id/f9_bar_arrive_id/"
  "producer warpgroup, turns: warpgroup 0 not let go first|s/if (wgi == 1) f9_bar_arrive_id(2, 2 \* F9_THREADS);/;/"
  "producer warpgroup: K slot released before S is done|s/if (lane == 0) f9_mbar_arrive(\&kempty\[kc % D\]);/;/;s/if constexpr (DS) f9_mbar_wait(\&kfull/if constexpr (DS) { if (lane == 0) f9_mbar_arrive(\&kempty[kc % D]); } if constexpr (DS) f9_mbar_wait(\&kfull/"
)
# The mutants of the fused backward with a producer warpgroup
# (flash_bwd_fused1w, flash_bwd_fused2w); emu.sh sm90 runs them too.
bwd_ws_mutants=(
  "producer warpgroup backward: a query slot refilled without waiting for it to be emptied|s/f9_mbar_wait(\&qempty\[slot\], ((it >> 1) \& 1) ^ 1);//"
  "producer warpgroup backward: a tile's products issued without waiting for its copies|s/f9_mbar_wait(\&qfull\[buf\], (it >> 1) \& 1);  \/\/ tile it is in//"
  "producer warpgroup backward: K and V used before their copies land|s/f9_mbar_wait(kvfull, 0);//"
  "producer warpgroup backward: the full barriers expect the copies' arrival only|s/f9_mbar_init(\&qfull\[i\], 1 + F9_BK);/f9_mbar_init(\&qfull[i], 1);/"
  "producer warpgroup backward: V copied from K's columns|s/(NH + NKV + kv) \* HS + 64 \* pp/(NH + kv) * HS + 64 * pp/"
  "producer warpgroup backward: dO copied through qkv's map|s/tm + 1, h \* HS/tm, h * HS/"
  "producer warpgroup backward: a query slot released before its tile's products are done|s/if (lane == 0) f9_mbar_arrive(\&qempty\[buf\]);/;/;s/f9_mbar_wait(\&qfull\[buf\], (it >> 1) \& 1);  \/\/ tile it is in/&\nif (lane == 0) f9_mbar_arrive(\&qempty[buf]);/"
  "producer warpgroup backward: the warpgroups' barrier without the fence of their dQ stores|/^ *f9_fence_proxy();$/{N;s/^ *f9_fence_proxy();\n\( *csync();  \/\/ every product\)/\1/}"
  "dQ tiles into dqkv (flash_bwd_dqf): a row's second half from its first|s/v\[2\] \* scale, v\[3\] \* scale/v[0] * scale, v[1] * scale/"
  "dQ tiles into dqkv (flash_bwd_dqf): every tile read from the first|s/dq + tile \* per \* 4/dq/"
  "dQ tiles into dqkv (flash_bwd_dqf): column groups of the second warpgroup from the first's|s/w \* F9_THREADS + warp \* 32/warp * 32/"
)
if [ "${1:-}" = bwdv ]; then
  src=$root/kernels/cuda/kernels/flashattn.cu
  cp "$root/tools/cuda/emu/flashattn_emu.cpp" "$tmp/"
  body "$src" >"$tmp/flashattn_body.inc"
  cxx -o "$tmp/emu" "$tmp/flashattn_emu.cpp"
  EMU_BWD_VARIANTS=1 "$tmp/emu"
  echo "emu.sh bwdv: the variants passed; now the mutants, each of which must fail"
  mutants=(
    "K rows in shared memory read one row off|s/fa_ld_afrag<HS>(ka, Ksm, warp \* 16, kk)/fa_ld_afrag<HS>(ka, Ksm, warp * 16 + 1, kk)/"
    "flash_bwd_q_v's block rows as the split kernel's 64|s/const int q0 = (gridDim.x - 1 - blockIdx.x) \* BR;/const int q0 = (gridDim.x - 1 - blockIdx.x) * 64;/"
  )
  run_mutants bwdv "$src" flashattn_body.inc flashattn_emu.cpp 'differs|bad [1-9]' env EMU_BWD_VARIANTS=1 "$tmp/mutant"
  exit
fi
if [ "${1:-}" = sm90bwd ] || [ "${1:-}" = sm90fwd4 ] || [ "${1:-}" = sm90ws ] || [ "${1:-}" = sm90bwdws ]; then
  src=$root/kernels/cuda/kernels/flashattn_sm90.cu
  cp "$root/tools/cuda/emu/flashattn_sm90_emu.cpp" "$tmp/"
  body "$src" >"$tmp/flashattn_sm90_body.inc"
  cxx -o "$tmp/emu" "$tmp/flashattn_sm90_emu.cpp"
  case $1 in
  sm90bwd) "$tmp/emu" bwd ;;
  sm90fwd4) "$tmp/emu" fwd4 ;;
  sm90ws)
    "$tmp/emu" ws
    echo "emu.sh sm90ws: the kernels passed; now their mutants, each of which must fail"
    mutants=("${ws_mutants[@]}")
    run_mutants sm90ws "$src" flashattn_sm90_body.inc flashattn_sm90_emu.cpp 'emulator:|bad [1-9]|out b|lse b' "$tmp/mutant" quick
    ;;
  sm90bwdws)
    "$tmp/emu" bwdws
    echo "emu.sh sm90bwdws: the kernels passed; now their mutants, each of which must fail"
    mutants=("${bwd_ws_mutants[@]}")
    run_mutants sm90bwdws "$src" flashattn_sm90_body.inc flashattn_sm90_emu.cpp 'emulator:|bad [1-9]|d[qkv] row' "$tmp/mutant" quick
    ;;
  esac
  exit
fi
if [ "${1:-}" != sm90 ]; then
  body "$root/kernels/cuda/kernels/flashattn.cu" >"$tmp/flashattn_body.inc"
  cp "$root/tools/cuda/emu/flashattn_emu.cpp" "$tmp/"
  cxx -o "$tmp/emu" "$tmp/flashattn_emu.cpp"
  if [ "${1:-}" = fwdmt ]; then EMU_FWD_MT=1 "$tmp/emu"; else "$tmp/emu"; fi
  exit
fi
src=$root/kernels/cuda/kernels/flashattn_sm90.cu
cp "$root/tools/cuda/emu/flashattn_sm90_emu.cpp" "$tmp/"
body "$src" >"$tmp/flashattn_sm90_body.inc"
cxx -o "$tmp/emu" "$tmp/flashattn_sm90_emu.cpp"
"$tmp/emu"
echo "emu.sh sm90: the kernel passed; now the mutants, each of which must fail"
# Each mutant: a name and a sed expression applied to the extracted device code.
mutants=(
  "K descriptor LBO and SBO swapped|s/F9_BK \* 16, 128)/128, F9_BK * 16)/"
  "V descriptor LBO and SBO swapped|s/f9_desc(vs + kk \* 256, 128, F9_BK \* 16)/f9_desc(vs + kk * 256, F9_BK * 16, 128)/"
  "V read K-major (imm-trans-b 0)|s/f9_wgmma_n\([0-9]*\)<1>/f9_wgmma_n\1<0>/g"
  "K step of 1024 bytes instead of 2048|s/ks + kk \* 2 \* (F9_BK \* 16)/ks + kk * (F9_BK * 16)/"
  "causal mask off by one|s/if (key > r0) s/if (key > r0 + 1) s/"
  "no fence.proxy.async|s/^ *f9_fence_proxy();//"
  "no wgmma.wait before reading S|0,/f9_wg_wait();/s/f9_wg_wait();//"
  "a row tile skips its diagonal key tile|s/k0 <= qw + F9_BQ \* t + F9_BQ - 1/k0 < qw + F9_BQ * t/"
  "warp index not taken within the warpgroup (two warpgroups)|s/warp = (tid >> 5) \& 3/warp = tid >> 5/"
  "no barrier after the V tile lands|0,/__syncthreads();  \/\/ V(k0)/{/__syncthreads();  \/\/ V(k0)/s/__syncthreads();//}"
  "pipelined: S read before its wgmma is done (no wait_group 1)|s/^ *f9_wg_wait1();.*//"
  "pipelined: O rescaled while P·V runs (wait_group 1 for 0)|s/f9_wg_wait();  \/\/ P(j-1)/f9_wg_wait1();  \/\/ P(j-1)/"
  "pipelined: V(j+D-2) loaded over V(j-1) in flight|s/Vs + ((lG - 1) % D) \* TILE/Vs + (lG % D) * TILE/"
  "pipelined: P·V reads V(j), not V(j-1)|s/f9_smem(Vs + ((G + D - 1) % D) \* TILE)/f9_smem(Vs + (G % D) * TILE)/"
  "pipelined: the peeled last step (the last P·V) left out|s/step(n, f9_bool<false>{}, f9_bool<true>{});/;/"
  "persistent: the next item's Q fragments not loaded|s/if (qn >= 0) load_q(qn);/;/"
  "persistent: the V slot taken from the item's step, not the block's|s/f9_smem(Vs + ((G + D - 1) % D) \* TILE)/f9_smem(Vs + ((j + D - 1) % D) * TILE)/"
  "persistent: the next item's copies from its first tile again|s/lg = 0;/lg = 1;/"
  "pipelined: the peeled first step's S read after wait_group 1|s/f9_wg_wait();  \/\/ the first step/f9_wg_wait1();  \/\/ the first step/"
  "pipelined: tiles written without the swizzle|s/(((c \& 7) ^ (t \& 7)) << 3)/((c \& 7) << 3)/"
  "swizzled tiles read N-major without the swizzle mode|s/return f9_desc_sw(a + kk \* 2048/return f9_desc(a + kk * 2048/"
  "swizzled tiles read K-major without the swizzle mode|s/return f9_desc_sw(a + (kk >> 2)/return f9_desc(a + (kk >> 2)/"
  "pipelined: K's k16 step within the row at 16 bytes|s/(kk \& 3) \* 32/(kk \& 3) * 16/"
  "pipelined: V's 64-dim blocks LBO and SBO swapped|s/#define F9_VSW_LBO (BK \* 128)/#define F9_VSW_LBO 1024/;s/#define F9_VSW_SBO 1024/#define F9_VSW_SBO (BK * 128)/"
  "pipelined: the ring's wait one group short (wait_group A)|s/fa_cp_wait_n<A - 1>();/fa_cp_wait_n<A>();/g"
  "pipelined: barrier after the loads land removed|s/^ *f9_bar<WG \* F9_THREADS>();  \/\/ K(j+1) and V(j) are in.*//"
  "ping-pong: copies D-1 ahead, over the V tile warpgroup 1 may still read|s/constexpr int A = PP ? D - 2 : D - 1;/constexpr int A = D - 1;/"
  "ping-pong: warpgroup 1 meets the barrier without landing its copies|s/fa_cp_wait_n<A - 1>();  \/\/ group G+1, as below/fa_cp_wait_n<A>();/"
  "backward: the diagonal query tile unmasked|s/const bool diag = q0 < kw + F9_BK;/const bool diag = false;/"
  "backward: dQ's causal mask off by one|s/if (key > r0) s\[4 \* jj\] = 0.f;/if (key > r0 + 1) s[4 * jj] = 0.f;/"
  "backward: K as the A operand without the swizzle mode|0,/f9_wgmma_ss_n64<0>(s, f9_kdesc(ks, kk)/s/f9_wgmma_ss_n64<0>(s, f9_kdesc(ks, kk)/f9_wgmma_ss_n64<0>(s, f9_desc(ks + kk * 32, 16, 1024)/"
  "backward: the fixed tiles not aligned to 1024 bytes|/void flash_bwd_kv_sm90/,/uint16_t\* Ks = smem;/s/smem += ((1024u - (f9_smem(smem) \& 1023u)) \& 1023u) \/ 2;/smem += 64;/"
  "backward: lse taken in base e|s/lse\[r\] \* F9_LOG2E/lse[r]/"
  "backward: the next query tile loaded into the buffer in use|s/ld_q(it + 1, buf ^ 1);/ld_q(it + 1, buf);/"
  "backward: dP read before its wgmma is done|/^ *f9_wg_wait();$/{N;s/^ *f9_wg_wait();\n\( *f9_regs<NS>(dp);\)/\1/}"
  "pipelined backward: the last tile's dV left out|s/dv_issue(f9_smem(Gb + lb \* TILE));//"
  "pipelined backward: the previous tile's dV and dK read the current buffers|s/dv_issue(f9_smem(Gb + (buf ^ 1) \* TILE));/dv_issue(f9_smem(Gb + buf * TILE));/;s/dk_issue(f9_smem(Qb + (buf ^ 1) \* TILE));/dk_issue(f9_smem(Qb + buf * TILE));/"
  "pipelined backward: the previous tile's dQ reads the current K tile|s/dq_issue(f9_smem(Kb + (buf ^ 1) \* TILE));/dq_issue(f9_smem(Kb + buf * TILE));/"
  "pipelined backward: the last tile's dQ left out|s/dq_issue(f9_smem(Kb + ((n - 1) \& 1) \* TILE));.*//"
  "fused backward: dS read K-major for dQ (imm-trans-a 0)|s/<1, 1>(dqa/<1, 0>(dqa/g"
  "fused backward: no barrier after the dS tile is stored|s/csync();  \/\/ St is whole//"
  "fused backward: dS stored without the swizzle|s/((j ^ (t0 \& 7)) << 3)/(j << 3)/;s/((j ^ (t1 \& 7)) << 3)/(j << 3)/"
  "fused backward: dQ rows one off|s/qr0 = q0 + warp \* 16 + g, qr1/qr0 = q0 + warp * 16 + g + 1, qr1/"
  "fused backward, two warpgroups: dQ's second 32 dims not offset (head size 64)|s/: wg \* 64;/: 0;/"
  "fused backward, two warpgroups: dQ reads one warpgroup's dS twice|s/f9_ndesc(st + (kk >> 2) \* (F9_BK \* F9_BK \* 2), kk \& 3)/f9_ndesc(st, kk \& 3)/"
  "fused backward, bulk dQ: no wait for the reduction's reads|s/if (tid == 0) f9_bulk_wait_read();/;/"
  "fused backward, bulk dQ: no barrier before the last reduction|s/csync();  \/\/ Dq holds the last tile's//"
  "fused backward, bulk dQ: a thread's floats stored in its neighbour's place|s/f9_dqf_at<NT>(tid, j)/f9_dqf_at<NT>(tid ^ 1, j)/"
  "fused backward, bulk dQ: every block's tiles reduced into the first blocks' ones|s/qt = k0 \/ F9_BK + it % nt/qt = it % nt/"
  "fused backward, bulk dQ: the reduction one tile late|s/if (tid == 0 \&\& it > 0) dq_reduce(it - 1);/if (tid == 0 \&\& it > 1) dq_reduce(it - 2);/"
)
mutants+=("${ws_mutants[@]}" "${bwd_ws_mutants[@]}")
run_mutants sm90 "$src" flashattn_sm90_body.inc flashattn_sm90_emu.cpp 'emulator:|bad [1-9]|out b|lse b' "$tmp/mutant" quick
