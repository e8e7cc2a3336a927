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

// ---- Kernels specialised on one dtype (template parameter DT). ----
// DT 0 means "dtype given at run time" (ldf/stf with the dt argument).
// VN<DT> elements fill 16 bytes (4 f32, 8 bf16/f16); ldv/stv move VN
// elements at element index i, which the caller keeps 16-byte aligned.

template <int DT> struct VN { static constexpr int n = DT == DT_F32 ? 4 : 8; };

template <int DT> __device__ __forceinline__ float ldx(const void* p, int dt, i64 i) {
    if constexpr (DT == DT_BF16) return __bfloat162float(((const __nv_bfloat16*)p)[i]);
    else if constexpr (DT == DT_F16) return __half2float(((const __half*)p)[i]);
    else if constexpr (DT == DT_F32) return ((const float*)p)[i];
    else return ldf(p, dt, i);
}

template <int DT> __device__ __forceinline__ void stx(void* p, int dt, i64 i, float v) {
    if constexpr (DT == DT_BF16) ((__nv_bfloat16*)p)[i] = __float2bfloat16_rn(v);
    else if constexpr (DT == DT_F16) ((__half*)p)[i] = __float2half_rn(v);
    else if constexpr (DT == DT_F32) ((float*)p)[i] = v;
    else stf(p, dt, i, v);
}

template <int DT> __device__ __forceinline__ void unpack16(uint4 u, float* f) {
    unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        if constexpr (DT == DT_F32) {
            f[k] = __uint_as_float(w[k]);
        } else if constexpr (DT == DT_BF16) {
            f[2 * k] = __uint_as_float(w[k] << 16);
            f[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
        } else {
            f[2 * k] = __half2float(__ushort_as_half((unsigned short)(w[k] & 0xffffu)));
            f[2 * k + 1] = __half2float(__ushort_as_half((unsigned short)(w[k] >> 16)));
        }
    }
}

template <int DT> __device__ __forceinline__ unsigned rnbits(float v) {
    if constexpr (DT == DT_BF16) return __bfloat16_as_ushort(__float2bfloat16_rn(v));
    else return __half_as_ushort(__float2half_rn(v));
}

template <int DT> __device__ __forceinline__ uint4 pack16(const float* f) {
    unsigned w[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        if constexpr (DT == DT_F32) w[k] = __float_as_uint(f[k]);
        else w[k] = rnbits<DT>(f[2 * k]) | (rnbits<DT>(f[2 * k + 1]) << 16);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

template <int DT> __device__ __forceinline__ const uint4* vaddr(const void* p, i64 i) {
    return (const uint4*)((const char*)p + i * (DT == DT_F32 ? 4 : 2));
}

template <int DT> __device__ __forceinline__ void ldv(const void* p, i64 i, float* f) { unpack16<DT>(*vaddr<DT>(p, i), f); }
// ldv_cs: ldv for data read for the last time (evict first from the caches).
__device__ __forceinline__ uint4 ld_cs16(const uint4* p) {
    uint4 r;
    asm volatile("ld.global.cs.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
}
__device__ __forceinline__ void st_cs16(uint4* p, uint4 v) {
    asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
template <int DT> __device__ __forceinline__ void ldv_cs(const void* p, i64 i, float* f) { unpack16<DT>(ld_cs16(vaddr<DT>(p, i)), f); }
template <int DT> __device__ __forceinline__ void stv(void* p, i64 i, const float* f) { *(uint4*)vaddr<DT>(p, i) = pack16<DT>(f); }
// stv_cs: stv of data not read again soon.
template <int DT> __device__ __forceinline__ void stv_cs(void* p, i64 i, const float* f) { st_cs16((uint4*)vaddr<DT>(p, i), pack16<DT>(f)); }

// Instantiates kernel template K for f32, bf16 and f16 as extern "C"
// kernels NAME_f32, NAME_bf16, NAME_f16 taking the parameter list PARAMS
// and passing ARGS through, for blocks of up to 256 threads.
#define INSTANTIATE3(NAME, K, PARAMS, ARGS) INSTANTIATE3_LB(NAME, K, 256, PARAMS, ARGS)
// INSTANTIATE3_LB is INSTANTIATE3 for blocks of up to LB threads.
#define INSTANTIATE3_LB(NAME, K, LB, PARAMS, ARGS)                                     \
    extern "C" __global__ void __launch_bounds__(LB) NAME##_f32 PARAMS { K<DT_F32> ARGS; }   \
    extern "C" __global__ void __launch_bounds__(LB) NAME##_bf16 PARAMS { K<DT_BF16> ARGS; } \
    extern "C" __global__ void __launch_bounds__(LB) NAME##_f16 PARAMS { K<DT_F16> ARGS; }

// online (max, sum of exp) pairs: merge (m2, s2) into (m, s); s is relative to m.
__device__ __forceinline__ void ms_merge(float& m, float& s, float m2, float s2) {
    float M = fmaxf(m, m2);
    s = (m == -INFINITY ? 0.f : s * __expf(m - M)) + (m2 == -INFINITY ? 0.f : s2 * __expf(m2 - M));
    m = M;
}

// block_max_sum merges the (m, s) pairs of the block and returns the result
// to every thread. blockDim.x must be a multiple of 32.
__device__ __forceinline__ void block_max_sum(float& m, float& s) {
    __shared__ float shm[32], shs[32];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) ms_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
    __syncthreads();
    if (lane == 0) {
        shm[w] = m;
        shs[w] = s;
    }
    __syncthreads();
    m = lane < nw ? shm[lane] : -INFINITY;
    s = lane < nw ? shs[lane] : 0.f;
    for (int o = 16; o > 0; o >>= 1) ms_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
}

// Elementwise kernels over arrays that share one alignment modulo 16 bytes
// (and are aligned to their element size): ew_head is the number of
// elements before the first 16-byte boundary, at most n. Then come whole
// VN-element vectors, then the tail.
template <int DT> __device__ __forceinline__ i64 ew_head(const void* p, i64 n) {
    i64 h = (i64)(((16u - (unsigned)((uintptr_t)p & 15u)) & 15u) / (DT == DT_F32 ? 4u : 2u));
    return h < n ? h : n;
}

// EW_LOOP runs VEC(i) for every whole vector at element index i (grid-stride)
// and ONE(i) for every element of the head and the tail, for n elements
// aligned like pointer p.
#define EW_LOOP(DT, p, n, VEC, ONE)                                                            \
    do {                                                                                      \
        constexpr int W_ = VN<DT>::n;                                                         \
        i64 h_ = ew_head<DT>(p, n), nv_ = ((n) - h_) / W_, t_ = h_ + nv_ * W_;                \
        i64 id_ = (i64)blockIdx.x * blockDim.x + threadIdx.x, st_ = (i64)gridDim.x * blockDim.x; \
        for (i64 k_ = id_; k_ < nv_; k_ += st_) { VEC(h_ + k_ * W_); }                        \
        for (i64 e_ = id_; e_ < h_ + (n) - t_; e_ += st_) { ONE(e_ < h_ ? e_ : t_ + (e_ - h_)); } \
    } while (0)
