// add: dst(n) += src(n).
#include "common.cuh"

extern "C" __global__ void add_forward(void* dst, int dtd, const void* src, int dts, i64 n) {
    GRID_STRIDE(i, n) { stf(dst, dtd, i, ldf(dst, dtd, i) + ldf(src, dts, i)); }
}

// add_forward_{f32,bf16,f16}: add_forward with both operands of one dtype
// and equally aligned modulo 16 bytes; 16-byte accesses, grid-stride.
template <int DT> __device__ __forceinline__ void add_t(void* dst, const void* src, i64 n) {
#define AD_VEC(i)                                                                    \
    {                                                                                \
        float a_[VN<DT>::n], b_[VN<DT>::n];                                          \
        ldv<DT>(dst, i, a_);                                                         \
        ldv_cs<DT>(src, i, b_);                                                      \
        _Pragma("unroll") for (int j = 0; j < VN<DT>::n; j++) a_[j] += b_[j];        \
        stv<DT>(dst, i, a_);                                                         \
    }
#define AD_ONE(i) stx<DT>(dst, 0, i, ldx<DT>(dst, 0, i) + ldx<DT>(src, 0, i))
    EW_LOOP(DT, dst, n, AD_VEC, AD_ONE);
#undef AD_VEC
#undef AD_ONE
}
INSTANTIATE3(add_forward, add_t, (void* dst, const void* src, i64 n), (dst, src, n))
