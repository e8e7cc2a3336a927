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
