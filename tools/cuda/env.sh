# env.sh: source from the project's root before building with -tags cuda:
#
#   source tools/cuda/env.sh && go test -tags cuda ./kernels/cuda/
#
# It puts kernels/cuda/compat first on the C include path. Its cuda.h wraps
# the toolkit's: on CUDA 13 it restores the pre-13 prototypes that
# gorgonia.org/cu v0.9.6 calls (cuCtxCreate, cuMemAdvise, cuMemPrefetchAsync,
# cuGraphAddDependencies, cuGraphGetEdges); on CUDA 12 it changes nothing.
# It must be an include directory (-I): forcing the header with -include
# breaks runtime/cgo. CUDA_HOME (default /usr/local/cuda) locates the toolkit.
_spill_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export CGO_ENABLED=1
export CGO_CFLAGS="-I$_spill_root/kernels/cuda/compat -I$CUDA_HOME/include ${CGO_CFLAGS:-}"
export CGO_LDFLAGS="-L$CUDA_HOME/lib64 ${CGO_LDFLAGS:-}"
export PATH="$CUDA_HOME/bin:$PATH"
unset _spill_root
