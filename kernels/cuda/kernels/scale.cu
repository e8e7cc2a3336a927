// scale: t(n) *= s.
#include "common.cuh"

extern "C" __global__ void scale_forward(void* t, int dt, float s, i64 n) {
    GRID_STRIDE(i, n) { stf(t, dt, i, ldf(t, dt, i) * s); }
}
