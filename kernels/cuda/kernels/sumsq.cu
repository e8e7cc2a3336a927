// sumsq: a gradient's statistics for the global norm and the skip-step
// check in one pass: out[0] += sum(x^2), out[1] = 1 if x holds a NaN or
// Inf. Two-phase, deterministic reduction (a fixed grid and stride, then a
// fixed-order sum of the partials).
#include "common.cuh"

// sum_squares_finite_partial_{f32,bf16,f16} writes one partial sum of
// squares per block into partial and sets flag[0] = 1 (never clears it) if
// an element is not finite. 16-byte loads (EW_LOOP: a scalar head and tail
// around whole vectors); the sum of each thread runs in a fixed order.
template <int DT> __device__ __forceinline__ void sumsq_t(float* partial, float* flag, const void* x, i64 n) {
    float s = 0.f;
    bool bad = false;
#define SQ_VEC(i)                                                          \
    {                                                                      \
        float f_[VN<DT>::n];                                               \
        ldv<DT>(x, i, f_);                                                 \
        _Pragma("unroll") for (int j = 0; j < VN<DT>::n; j++) {            \
            s += f_[j] * f_[j];                                            \
            bad |= !isfinite(f_[j]);                                       \
        }                                                                  \
    }
#define SQ_ONE(i)                    \
    {                                \
        const float f_ = ldx<DT>(x, 0, i); \
        s += f_ * f_;                \
        bad |= !isfinite(f_);        \
    }
    EW_LOOP(DT, x, n, SQ_VEC, SQ_ONE);
#undef SQ_VEC
#undef SQ_ONE
    if (__any_sync(0xffffffffu, bad) && (threadIdx.x & 31) == 0) flag[0] = 1.f;
    s = block_sum(s);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}
INSTANTIATE3(sum_squares_finite_partial, sumsq_t, (float* partial, float* flag, const void* x, i64 n), (partial, flag, x, n))

// sum_squares_final adds the g partial sums to out[0]; one block.
extern "C" __global__ void sum_squares_final(float* out, const float* partial, int g) {
    float s = 0.f;
    for (int i = threadIdx.x; i < g; i += blockDim.x) s += partial[i];
    s = block_sum(s);
    if (threadIdx.x == 0) out[0] += s;
}
