// adamw: fused AdamW step on f32 master weights with optional rounded copy.
#include "common.cuh"

extern "C" __global__ void adamw_update(float* param, const void* grad, int dtg, float* m, float* v,
                                        void* out, int dto, i64 n, float lr, float b1, float b2, float eps,
                                        float wd, float bc1, float bc2, float gscale) {
    GRID_STRIDE(i, n) {
        float g = ldf(grad, dtg, i) * gscale;
        float mi = b1 * m[i] + (1.f - b1) * g;
        float vi = b2 * v[i] + (1.f - b2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float mhat = mi / bc1, vhat = vi / bc2;
        float p = param[i];
        p -= lr * (mhat / (sqrtf(vhat) + eps) + wd * p);
        param[i] = p;
        if (out) stf(out, dto, i, p);
    }
}
