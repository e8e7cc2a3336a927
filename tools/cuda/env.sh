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
# NCCL, for several GPUs (kernels/cuda/nccl.go opens libnccl.so.2 at run
# time; neither building nor single-GPU runs need it). Unless
# SPILL_NCCL_LIBRARY is set already, point it at the NCCL that comes with
# PyTorch's wheel (nvidia/nccl/ in python3's site-packages), if there is
# one, and put that NCCL's nccl.h on the include path, against which the
# build then checks its declarations. Without either, libnccl.so.2 is
# looked up by the dynamic linker (LD_LIBRARY_PATH, the system's libnccl2).
if [ -z "${SPILL_NCCL_LIBRARY:-}" ] && command -v python3 >/dev/null 2>&1; then
  _spill_nccl=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)
  if [ -n "$_spill_nccl" ] && [ -f "$_spill_nccl/lib/libnccl.so.2" ]; then
    export SPILL_NCCL_LIBRARY="$_spill_nccl/lib/libnccl.so.2"
    if [ -f "$_spill_nccl/include/nccl.h" ]; then
      export CGO_CFLAGS="$CGO_CFLAGS -I$_spill_nccl/include"
    fi
  fi
  unset _spill_nccl
fi
