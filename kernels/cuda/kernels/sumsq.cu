// sumsq: out[0] += sum(x^2), deterministic two-phase reduction.
#include "common.cuh"

// sum_squares_partial writes one partial sum per block into partial.
extern "C" __global__ void sum_squares_partial(float* partial, const void* x, int dt, i64 n) {
    float s = 0.f;
    GRID_STRIDE(i, n) {
        float v = ldf(x, dt, i);
        s += v * v;
    }
    s = block_sum(s);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// sum_squares_final adds the g partial sums to out[0]; one block.
extern "C" __global__ void sum_squares_final(float* out, const float* partial, int g) {
    float s = 0.f;
    for (int i = threadIdx.x; i < g; i += blockDim.x) s += partial[i];
    s = block_sum(s);
    if (threadIdx.x == 0) out[0] += s;
}
