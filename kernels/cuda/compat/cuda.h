/*
 * compat/cuda.h: the CUDA driver header as gorgonia.org/cu v0.9.6 expects it.
 *
 * CUDA 13's cuda.h maps cuCtxCreate to cuCtxCreate_v4 and cuMemAdvise,
 * cuMemPrefetchAsync, cuGraphAddDependencies and cuGraphGetEdges to _v2
 * entry points that take extra parameters, so gorgonia.org/cu's calls no
 * longer compile. The driver still exports the pre-13 entry points, so this
 * wrapper includes the real header and then restores the old prototypes.
 * It is put first on the include path with CGO_CFLAGS=-I<this directory>
 * (tools/cuda/env.sh does that); forcing it with -include breaks runtime/cgo.
 * On CUDA 12 and older it only includes the real header (and the cuInit
 * wrapper below, on every version).
 */
#ifndef SPILL_CUDA_COMPAT_H
#define SPILL_CUDA_COMPAT_H

#include_next <cuda.h>

/*
 * gorgonia.org/cu calls cuInit from its package init and exits the process
 * when it fails, so a cuda build would die at start-up on a machine without
 * a GPU (or with only the driver's stub library) before spill could say
 * anything or fall back to the CPU. Its cuInit is routed to this wrapper,
 * which calls the real one and reports success; kernels/cuda's Open calls
 * the real cuInit again (it is idempotent) and returns its error.
 */
static inline CUresult spill_cuInit(unsigned int flags) {
    (void)cuInit(flags);
    return CUDA_SUCCESS;
}
#define cuInit spill_cuInit

#if defined(CUDA_VERSION) && CUDA_VERSION >= 13000
#ifdef __cplusplus
extern "C" {
#endif

#undef cuCtxCreate
CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
#define cuCtxCreate cuCtxCreate_v2

#undef cuMemAdvise
CUresult CUDAAPI cuMemAdvise(CUdeviceptr devPtr, size_t count, CUmem_advise advice, CUdevice device);

#undef cuMemPrefetchAsync
CUresult CUDAAPI cuMemPrefetchAsync(CUdeviceptr devPtr, size_t count, CUdevice dstDevice, CUstream hStream);

#undef cuGraphAddDependencies
CUresult CUDAAPI cuGraphAddDependencies(CUgraph hGraph, const CUgraphNode *from, const CUgraphNode *to,
                                        size_t numDependencies);

#undef cuGraphGetEdges
CUresult CUDAAPI cuGraphGetEdges(CUgraph hGraph, CUgraphNode *from, CUgraphNode *to, size_t *numEdges);

#ifdef __cplusplus
}
#endif
#endif /* CUDA_VERSION >= 13000 */

#endif /* SPILL_CUDA_COMPAT_H */
