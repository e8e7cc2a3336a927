#!/usr/bin/env bash
# ncu_attn.sh: where the attention kernels' time goes, in one device call.
# It writes the ptxas report (registers, spills, warnings such as C7515,
# wgmma serialized) of flashattn.cu for sm_90 and flashattn_sm90.cu for
# sm_90a, then runs `gpubench -attn-sweep` under Nsight Compute (ncu) for
# each variant in SPILL_NCU_VARIANTS ("name|ENV=VAL|kernel regex;...", "-"
# for no environment; SPILL_NCU_SKIP launches of those kernels skipped
# first, past Open's self-checks) and F.scaled_dot_product_attention
# (cuDNN) likewise (SPILL_NCU_TORCH_RE, _SKIP, _COUNT pick its kernels), with the
# sections that say what bounds a kernel: speed of light, compute
# workload (pipe utilisation), warp state (stall reasons), launch and
# occupancy, shared-memory bank conflicts (SPILL_NCU_SECTIONS replaces them,
# e.g. with InstructionStats and --metrics sass__inst_executed_per_opcode). Output under $OUT: ptxas*.log,
# ncu_<name>.txt, one per variant, and ncu_torch.txt.
#
#   device run, carry [".gpu"]: bash tools/cuda/ncu_attn.sh
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
out=${OUT:-$(mktemp -d /tmp/spill-ncu.XXXXXX)}
mkdir -p "$out"
if [ -f .gpu/env.sh ]; then source tools/cuda/gpuenv.sh; fi
source tools/cuda/env.sh
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -n1)
shape=${SPILL_NCU_SHAPE:-128:2048}
nvcc -arch=sm_90 -cubin -O3 -std=c++17 -Xptxas -v -o /tmp/flashattn.cubin kernels/cuda/kernels/flashattn.cu >"$out/ptxas.log" 2>&1 &
nvcc -arch=sm_90a -cubin -O3 -std=c++17 -Xptxas -v -o /tmp/flashattn_sm90.cubin kernels/cuda/kernels/flashattn_sm90.cu >"$out/ptxas_sm90.log" 2>&1 &
go build -tags cuda -o /tmp/gpubench ./tools/gpubench || exit 1
wait
grep -ciE "warning" "$out/ptxas_sm90.log" | sed 's/^/ptxas_sm90 warnings: /'
[ -n "$ncu" ] || { echo "ncu_attn.sh: no ncu on this machine" >&2; exit 2; }
"$ncu" --version | tail -n1
sections=${SPILL_NCU_SECTIONS:-"--section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis_Tables --section SchedulerStats"}
IFS=';' read -ra vs <<<"${SPILL_NCU_VARIANTS:-default|-|flash_fwd2k32_bf16_hs128|flash_bwd_kv_sm_bf16_hs128|flash_bwd_q_sm_bf16_hs128;sm90p|SPILL_FLASH_FWD=sm90p|flash_fwd3_sm90_bf16_hs128}"
for v in "${vs[@]}"; do
  IFS='|' read -r name envs re <<<"$v"
  [ "$envs" = - ] && envs=
  t0=$SECONDS
  # The sweep times each kernel many times: profile a few launches after
  # the first ones (self-checks at Open and warm-up).
  env $envs timeout "${SPILL_NCU_LIMIT:-150}" "$ncu" $sections -k "regex:${re:-flash_}" --launch-skip "${SPILL_NCU_SKIP:-24}" \
    --launch-count "${SPILL_NCU_COUNT:-4}" \
    /tmp/gpubench -attn-sweep "$shape" -out /tmp/ncu_$name.json >"$out/ncu_$name.txt" 2>&1
  echo "== $name ($envs): exit $? after $((SECONDS - t0))s"
  grep -E '^  [a-z_0-9]+\(|flash_[a-z0-9_]+|Duration|Compute \(SM\) Throughput|Registers Per|Block Size|Issue Slots Busy|Achieved Occupancy' "$out/ncu_$name.txt" | head -n 60
done
cat >/tmp/ncu_sdpa.py <<'EOF'
import sys, torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
hs, T = (int(x) for x in sys.argv[1].split(":"))
B, NH = max(1, 16384 // T), 16
q, k, v = (torch.randn(B, NH, T, hs, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    for _ in range(4):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.autograd.grad(o, (q, k, v), torch.randn_like(o))
torch.cuda.synchronize()
EOF
t0=$SECONDS
timeout "${SPILL_NCU_LIMIT:-150}" "$ncu" $sections ${SPILL_NCU_TORCH_RE:+-k "regex:$SPILL_NCU_TORCH_RE"} --launch-skip "${SPILL_NCU_TORCH_SKIP:-8}" --launch-count "${SPILL_NCU_TORCH_COUNT:-8}" python3 /tmp/ncu_sdpa.py "$shape" >"$out/ncu_torch.txt" 2>&1
echo "== torch: exit $? after $((SECONDS - t0))s"
grep -E '^  [a-zA-Z_0-9:<>]+.*\(|Duration|Registers Per|Block Size|Dynamic Shared|Grid Size' "$out/ncu_torch.txt" | head -n 80
