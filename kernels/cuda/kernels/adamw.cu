// adamw: fused AdamW step on f32 master weights with optional rounded copy.
#include "common.cuh"

// adam1 is the update of one element, shared by both kernels so that they
// compute the same bits: g is the scaled gradient; p, m and v are updated
// in place.
__device__ __forceinline__ void adam1(float& p, float& m, float& v, float g, float lr, float b1, float b2, float eps,
                                      float wd, float bc1, float bc2) {
    const float mi = b1 * m + (1.f - b1) * g;
    const float vi = b2 * v + (1.f - b2) * g * g;
    m = mi;
    v = vi;
    const float mhat = mi / bc1, vhat = vi / bc2;
    p -= lr * (mhat / (sqrtf(vhat) + eps) + wd * p);
}

extern "C" __global__ void adamw_update(float* param, const void* grad, int dtg, float* m, float* v,
                                        void* out, int dto, i64 n, float lr, float b1, float b2, float eps,
                                        float wd, float bc1, float bc2, float gscale) {
    GRID_STRIDE(i, n) {
        float p = param[i], mi = m[i], vi = v[i];
        adam1(p, mi, vi, ldf(grad, dtg, i) * gscale, lr, b1, b2, eps, wd, bc1, bc2);
        m[i] = mi;
        v[i] = vi;
        param[i] = p;
        if (out) stf(out, dto, i, p);
    }
}

// adamw_update4_<grad>_<out>: adamw_update with the gradient's dtype DG and
// the copy's DO (0: no copy) fixed, four elements per thread and step:
// 16-byte accesses to param, m and v (16-byte aligned), 8- or 16-byte ones
// to the gradient and the copy (aligned to four of their elements); the
// n % 4 last elements one by one. The update is bandwidth-bound: the wider
// accesses are what this variant is for.
template <int DG> __device__ __forceinline__ void ld4(const void* p, i64 i, float* f) {
    if constexpr (DG == DT_F32) {
        const float4 u = *(const float4*)((const float*)p + i);
        f[0] = u.x, f[1] = u.y, f[2] = u.z, f[3] = u.w;
    } else {
        const uint2 u = *(const uint2*)((const uint16_t*)p + i);
        const unsigned w[2] = {u.x, u.y};
#pragma unroll
        for (int k = 0; k < 2; k++) {
            if constexpr (DG == DT_BF16) {
                f[2 * k] = __uint_as_float(w[k] << 16);
                f[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
            } else {
                f[2 * k] = __half2float(__ushort_as_half((unsigned short)(w[k] & 0xffffu)));
                f[2 * k + 1] = __half2float(__ushort_as_half((unsigned short)(w[k] >> 16)));
            }
        }
    }
}

template <int DO> __device__ __forceinline__ void st4(void* p, i64 i, const float* f) {
    if constexpr (DO == DT_F32) {
        *(float4*)((float*)p + i) = make_float4(f[0], f[1], f[2], f[3]);
    } else {
        *(uint2*)((uint16_t*)p + i) = make_uint2(rnbits<DO>(f[0]) | (rnbits<DO>(f[1]) << 16), rnbits<DO>(f[2]) | (rnbits<DO>(f[3]) << 16));
    }
}

template <int DG, int DO>
__device__ __forceinline__ void adamw4_t(float* param, const void* grad, float* m, float* v, void* out, i64 n, float lr,
                                         float b1, float b2, float eps, float wd, float bc1, float bc2, float gscale) {
    const i64 nv = n / 4, id = (i64)blockIdx.x * blockDim.x + threadIdx.x, st = (i64)gridDim.x * blockDim.x;
    for (i64 k = id; k < nv; k += st) {
        const i64 i = 4 * k;
        float g[4];
        ld4<DG>(grad, i, g);
        float4 p = *(float4*)(param + i), mm = *(float4*)(m + i), vv = *(float4*)(v + i);
        adam1(p.x, mm.x, vv.x, g[0] * gscale, lr, b1, b2, eps, wd, bc1, bc2);
        adam1(p.y, mm.y, vv.y, g[1] * gscale, lr, b1, b2, eps, wd, bc1, bc2);
        adam1(p.z, mm.z, vv.z, g[2] * gscale, lr, b1, b2, eps, wd, bc1, bc2);
        adam1(p.w, mm.w, vv.w, g[3] * gscale, lr, b1, b2, eps, wd, bc1, bc2);
        *(float4*)(m + i) = mm;
        *(float4*)(v + i) = vv;
        *(float4*)(param + i) = p;
        if constexpr (DO != 0) {
            const float f[4] = {p.x, p.y, p.z, p.w};
            st4<DO>(out, i, f);
        }
    }
    for (i64 i = 4 * nv + id; i < n; i += st) {
        float p = param[i], mi = m[i], vi = v[i];
        adam1(p, mi, vi, ldx<DG>(grad, 0, i) * gscale, lr, b1, b2, eps, wd, bc1, bc2);
        m[i] = mi;
        v[i] = vi;
        param[i] = p;
        if constexpr (DO != 0) stx<DO>(out, 0, i, p);
    }
}

#define ADAMW4(NAME, DG, DO)                                                                                      \
    extern "C" __global__ void __launch_bounds__(256)                                                             \
        NAME(float* param, const void* grad, float* m, float* v, void* out, i64 n, float lr, float b1, float b2, \
             float eps, float wd, float bc1, float bc2, float gscale) {                                           \
        adamw4_t<DG, DO>(param, grad, m, v, out, n, lr, b1, b2, eps, wd, bc1, bc2, gscale);                        \
    }
ADAMW4(adamw_update4_bf16_bf16, DT_BF16, DT_BF16)
ADAMW4(adamw_update4_bf16_none, DT_BF16, 0)
ADAMW4(adamw_update4_f32_none, DT_F32, 0)
ADAMW4(adamw_update4_f32_bf16, DT_F32, DT_BF16)
ADAMW4(adamw_update4_f32_f32, DT_F32, DT_F32)
ADAMW4(adamw_update4_f16_f16, DT_F16, DT_F16)
