#!/usr/bin/env bash
# vet.sh: type-check the cuda-tagged Go (kernels/cuda, tools/gpubench and
# everything else behind -tags cuda) on a machine without the CUDA toolkit,
# against a directory of CUDA headers (cuda.h, cublas_v2.h, cublasLt.h and
# what they include; CUDA 12 or 13): cgo needs only the declarations to
# vet, no library to link.
#
#   CUDA_HEADERS=/path/to/cuda/include bash tools/cuda/vet.sh [packages]
#
# Without a toolkit, Debian's non-free nvidia-cuda-dev (CUDA 11.8, 774 MB)
# has the headers; it vets clean against them:
#   echo "deb http://deb.debian.org/debian bookworm non-free" >/tmp/nf.list
#   o="-oDir::Etc::SourceList=/tmp/nf.list -oDir::Etc::SourceParts=/dev/null -oDir::State::Lists=/tmp/nf"
#   mkdir -p /tmp/nf/partial && apt-get $o update && apt-get $o download nvidia-cuda-dev
#   mkdir -p /tmp/cuda && dpkg-deb --fsys-tarfile nvidia-cuda-dev_*.deb | tar -x -C /tmp/cuda --wildcards './usr/include/*'
#   CUDA_HEADERS=/tmp/cuda/usr/include bash tools/cuda/vet.sh
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
inc=${CUDA_HEADERS:-${CUDA_HOME:-/usr/local/cuda}/include}
[ -f "$inc/cuda.h" ] || { echo "vet.sh: no cuda.h in $inc (set CUDA_HEADERS)" >&2; exit 2; }
export CGO_ENABLED=1 CGO_CFLAGS="-I$root/kernels/cuda/compat -I$inc"
if [ $# -eq 0 ]; then set -- ./...; fi
go vet -tags cuda "$@"
