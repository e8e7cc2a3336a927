// add: dst(n) += src(n).
#include "common.cuh"

extern "C" __global__ void add_forward(void* dst, int dtd, const void* src, int dts, i64 n) {
    GRID_STRIDE(i, n) { stf(dst, dtd, i, ldf(dst, dtd, i) + ldf(src, dts, i)); }
}
