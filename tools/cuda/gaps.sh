#!/usr/bin/env bash
# gaps.sh: on the GPU machine, trace spill's training steps at one shape
# with Nsight Systems (CUDA trace only) and print where the GPU idles
# (tools/cuda/gaps.py). SPILL_BENCH_SHAPES (default 124m) picks the shape.
# Needs nsys; the trace stays under $OUT.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
out=${OUT:-$(mktemp -d /tmp/spill-gaps.XXXXXX)}
mkdir -p "$out"
if [ -f .gpu/env.sh ]; then source .gpu/env.sh; fi
source tools/cuda/env.sh
nsys=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys /usr/local/cuda/nsight-systems*/bin/nsys 2>/dev/null | head -n1)
[ -n "$nsys" ] || { echo "gaps.sh: no nsys on this machine" >&2; exit 2; }
shape=${SPILL_BENCH_SHAPES:-124m}
[ -x /tmp/gpubench ] || go build -tags cuda -o /tmp/gpubench ./tools/gpubench || exit 1
"$nsys" profile -t cuda --force-overwrite true -o /tmp/spill-gaps /tmp/gpubench -shapes "$shape" -train-only -out /tmp/spill-gaps.json >"$out/nsys.log" 2>&1
tail -n 3 "$out/nsys.log"
"$nsys" stats -q -r cuda_gpu_trace -f csv -o /tmp/spill-gaps /tmp/spill-gaps.nsys-rep >/dev/null 2>&1
csv=$(ls /tmp/spill-gaps*cuda_gpu_trace*.csv | head -n1)
python3 tools/cuda/gaps.py "$csv" | tee "$out/gaps.txt"
