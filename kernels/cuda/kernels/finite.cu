// finite: flag[0] = 1 if any element of x is NaN or Inf; never cleared.
#include "common.cuh"

extern "C" __global__ void check_finite(float* flag, const void* x, int dt, i64 n) {
    bool bad = false;
    GRID_STRIDE(i, n) { bad |= !isfinite(ldf(x, dt, i)); }
    if (__any_sync(0xffffffffu, bad) && (threadIdx.x & 31) == 0) flag[0] = 1.f;
}
