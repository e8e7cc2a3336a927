// mse: losses(n) = (pred-target)^2/2; backward dpred += scale*(pred-target).
#include "common.cuh"

extern "C" __global__ void mse_forward(float* losses, const void* pred, int dtp, const float* target, i64 n) {
    GRID_STRIDE(i, n) {
        float d = ldf(pred, dtp, i) - target[i];
        losses[i] = 0.5f * d * d;
    }
}

extern "C" __global__ void mse_backward(void* dpred, int dtd, const void* pred, int dtp, const float* target, i64 n, float scale) {
    GRID_STRIDE(i, n) {
        float d = ldf(pred, dtp, i) - target[i];
        stf(dpred, dtd, i, ldf(dpred, dtd, i) + scale * d);
    }
}
