// cast: dst(n) = src(n) converted between float dtypes (round to nearest even).
#include "common.cuh"

extern "C" __global__ void cast_forward(void* dst, int dtd, const void* src, int dts, i64 n) {
    GRID_STRIDE(i, n) { stf(dst, dtd, i, ldf(src, dts, i)); }
}
