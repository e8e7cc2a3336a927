// gelu: tanh approximation, forward and backward (accumulating).
#include "common.cuh"

#define GELU_S 0.7978845608028654f  // sqrt(2/pi)

extern "C" __global__ void gelu_forward(void* out, int dto, const void* inp, int dti, i64 n) {
    GRID_STRIDE(i, n) {
        float x = ldf(inp, dti, i);
        float u = GELU_S * (x + 0.044715f * x * x * x);
        stf(out, dto, i, 0.5f * x * (1.f + tanhf(u)));
    }
}

extern "C" __global__ void gelu_backward(void* dinp, int dtd, const void* inp, int dti, const void* dout, int dto, i64 n) {
    GRID_STRIDE(i, n) {
        float x = ldf(inp, dti, i);
        float u = GELU_S * (x + 0.044715f * x * x * x);
        float th = tanhf(u);
        float sech2 = 1.f - th * th;
        float g = 0.5f * (1.f + th) + 0.5f * x * sech2 * GELU_S * (1.f + 3.f * 0.044715f * x * x);
        stf(dinp, dtd, i, ldf(dinp, dtd, i) + g * ldf(dout, dto, i));
    }
}

// The same arithmetic as gelu_forward and gelu_backward, for the typed kernels.
__device__ __forceinline__ float gelu_f(float x) {
    float u = GELU_S * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.f + tanhf(u));
}

__device__ __forceinline__ float gelu_grad(float x) {
    float u = GELU_S * (x + 0.044715f * x * x * x);
    float th = tanhf(u);
    float sech2 = 1.f - th * th;
    return 0.5f * (1.f + th) + 0.5f * x * sech2 * GELU_S * (1.f + 3.f * 0.044715f * x * x);
}

// gelu_forward_{f32,bf16,f16}: gelu_forward with every operand of one dtype
// and out, inp equally aligned modulo 16 bytes; 16-byte accesses, grid-stride.
template <int DT> __device__ __forceinline__ void gelu_fwd_t(void* out, const void* inp, i64 n) {
#define GF_VEC(i)                                          \
    {                                                      \
        float x_[VN<DT>::n];                               \
        ldv_cs<DT>(inp, i, x_);                            \
        _Pragma("unroll") for (int j = 0; j < VN<DT>::n; j++) x_[j] = gelu_f(x_[j]); \
        stv<DT>(out, i, x_);                               \
    }
#define GF_ONE(i) stx<DT>(out, 0, i, gelu_f(ldx<DT>(inp, 0, i)))
    EW_LOOP(DT, inp, n, GF_VEC, GF_ONE);
#undef GF_VEC
#undef GF_ONE
}
INSTANTIATE3(gelu_forward, gelu_fwd_t, (void* out, const void* inp, i64 n), (out, inp, n))

// gelu_backward_{f32,bf16,f16}: gelu_backward likewise.
// gelu_backward_set_{f32,bf16,f16}: the same but overwriting: dinp = gelu'(inp)·dout
// (dinp is not read).
template <int DT, bool ACC> __device__ __forceinline__ void gelu_bwd_t(void* dinp, const void* inp, const void* dout, i64 n) {
#define GB_VEC(i)                                                        \
    {                                                                    \
        float x_[VN<DT>::n], g_[VN<DT>::n], d_[VN<DT>::n];               \
        ldv_cs<DT>(inp, i, x_);                                          \
        ldv_cs<DT>(dout, i, g_);                                         \
        if (ACC) ldv_cs<DT>(dinp, i, d_);                                \
        _Pragma("unroll") for (int j = 0; j < VN<DT>::n; j++) d_[j] = (ACC ? d_[j] : 0.f) + gelu_grad(x_[j]) * g_[j]; \
        stv<DT>(dinp, i, d_);                                            \
    }
#define GB_ONE(i) stx<DT>(dinp, 0, i, (ACC ? ldx<DT>(dinp, 0, i) : 0.f) + gelu_grad(ldx<DT>(inp, 0, i)) * ldx<DT>(dout, 0, i))
    EW_LOOP(DT, inp, n, GB_VEC, GB_ONE);
#undef GB_VEC
#undef GB_ONE
}
template <int DT> __device__ __forceinline__ void gelu_bwd_acc(void* dinp, const void* inp, const void* dout, i64 n) {
    gelu_bwd_t<DT, true>(dinp, inp, dout, n);
}
template <int DT> __device__ __forceinline__ void gelu_bwd_set(void* dinp, const void* inp, const void* dout, i64 n) {
    gelu_bwd_t<DT, false>(dinp, inp, dout, n);
}
INSTANTIATE3(gelu_backward, gelu_bwd_acc, (void* dinp, const void* inp, const void* dout, i64 n), (dinp, inp, dout, n))
INSTANTIATE3(gelu_backward_set, gelu_bwd_set, (void* dinp, const void* inp, const void* dout, i64 n), (dinp, inp, dout, n))
