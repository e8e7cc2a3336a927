// common.cuh: helpers shared by the spill CUDA kernels (one op per .cu file).
//
// Tensors arrive as untyped pointers plus a dtype code equal to
// kernels.DType (1 f32, 2 bf16, 3 f16). Loads widen to float; stores round
// once, to nearest even. The dtype switch is uniform across a launch, so it
// costs a predictable branch, not divergence.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#define DT_F32 1
#define DT_BF16 2
#define DT_F16 3

typedef long long i64;

__device__ __forceinline__ float ldf(const void* p, int dt, i64 i) {
    switch (dt) {
    case DT_BF16: return __bfloat162float(((const __nv_bfloat16*)p)[i]);
    case DT_F16: return __half2float(((const __half*)p)[i]);
    default: return ((const float*)p)[i];
    }
}

__device__ __forceinline__ void stf(void* p, int dt, i64 i, float v) {
    switch (dt) {
    case DT_BF16: ((__nv_bfloat16*)p)[i] = __float2bfloat16_rn(v); break;
    case DT_F16: ((__half*)p)[i] = __float2half_rn(v); break;
    default: ((float*)p)[i] = v;
    }
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// block_sum and block_max return the reduction to every thread of the block.
// blockDim.x must be a multiple of 32. Safe to call repeatedly.
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float sh[32];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.f;
    return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v) {
    __shared__ float sh[32];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : -INFINITY;
    return warp_max(v);
}

#define GRID_STRIDE(i, n) \
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)
