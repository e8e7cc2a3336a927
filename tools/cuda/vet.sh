#!/usr/bin/env bash
# vet.sh: type-check the cuda-tagged Go (kernels/cuda, tools/gpubench and
# everything else behind -tags cuda) on a machine without the CUDA toolkit,
# against a directory of CUDA headers (cuda.h, cublas_v2.h, cublasLt.h and
# what they include; CUDA 12 or 13): cgo needs only the declarations to
# vet, no library to link.
#
#   CUDA_HEADERS=/path/to/cuda/include bash tools/cuda/vet.sh [packages]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
inc=${CUDA_HEADERS:-${CUDA_HOME:-/usr/local/cuda}/include}
[ -f "$inc/cuda.h" ] || { echo "vet.sh: no cuda.h in $inc (set CUDA_HEADERS)" >&2; exit 2; }
export CGO_ENABLED=1 CGO_CFLAGS="-I$root/kernels/cuda/compat -I$inc"
if [ $# -eq 0 ]; then set -- ./...; fi
go vet -tags cuda "$@"
