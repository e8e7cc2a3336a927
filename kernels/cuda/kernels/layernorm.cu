// layernorm: one warp per row for the row-wise parts, a column reduction for
// the parameter gradients. eps = 1e-5.
#include "common.cuh"

extern "C" __global__ void layernorm_forward(void* out, int dto, float* mean, float* rstd, const void* inp, int dti,
                                             const void* w, int dtw, const void* b, int dtb, int N, int C) {
    int lane = threadIdx.x & 31;
    i64 row = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= N) return;
    i64 base = row * C;
    float s = 0.f;
    for (int c = lane; c < C; c += 32) s += ldf(inp, dti, base + c);
    float m = warp_sum(s) / C;
    float v = 0.f;
    for (int c = lane; c < C; c += 32) {
        float d = ldf(inp, dti, base + c) - m;
        v += d * d;
    }
    v = warp_sum(v) / C;
    float r = 1.f / sqrtf(v + 1e-5f);
    for (int c = lane; c < C; c += 32) {
        float y = (ldf(inp, dti, base + c) - m) * r * ldf(w, dtw, c);
        if (b) y += ldf(b, dtb, c);
        stf(out, dto, base + c, y);
    }
    if (lane == 0) {
        if (mean) mean[row] = m;
        if (rstd) rstd[row] = r;
    }
}

// layernorm_backward: dinp(N,C) += ((dnorm - mean(dnorm) - norm*mean(dnorm*norm)) * rstd, dnorm = dout*w.
extern "C" __global__ void layernorm_backward(void* dinp, int dtdi, const void* dout, int dto, const void* inp, int dti,
                                              const void* w, int dtw, const float* mean, const float* rstd, int N, int C) {
    int lane = threadIdx.x & 31;
    i64 row = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= N) return;
    i64 base = row * C;
    float m = mean[row], r = rstd[row];
    float a = 0.f, bsum = 0.f;
    for (int c = lane; c < C; c += 32) {
        float norm = (ldf(inp, dti, base + c) - m) * r;
        float dn = ldf(dout, dto, base + c) * ldf(w, dtw, c);
        a += dn;
        bsum += dn * norm;
    }
    a = warp_sum(a) / C;
    bsum = warp_sum(bsum) / C;
    for (int c = lane; c < C; c += 32) {
        float norm = (ldf(inp, dti, base + c) - m) * r;
        float dn = ldf(dout, dto, base + c) * ldf(w, dtw, c);
        stf(dinp, dtdi, base + c, ldf(dinp, dtdi, base + c) + (dn - a - norm * bsum) * r);
    }
}

// layernorm_backward_params: dweight[c] += sum_rows dout*norm, dbias[c] += sum_rows dout.
// blockDim (32,32); block x covers 32 columns.
extern "C" __global__ void layernorm_backward_params(void* dw, int dtw, void* db, int dtb, const void* dout, int dto,
                                                     const void* inp, int dti, const float* mean, const float* rstd,
                                                     int N, int C) {
    __shared__ float sw[32][33], sb[32][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    float aw = 0.f, ab = 0.f;
    if (c < C)
        for (int r = threadIdx.y; r < N; r += 32) {
            i64 o = (i64)r * C + c;
            float d = ldf(dout, dto, o);
            aw += d * (ldf(inp, dti, o) - mean[r]) * rstd[r];
            ab += d;
        }
    sw[threadIdx.y][threadIdx.x] = aw;
    sb[threadIdx.y][threadIdx.x] = ab;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float tw = 0.f, tb = 0.f;
        for (int k = 0; k < 32; k++) {
            tw += sw[k][threadIdx.x];
            tb += sb[k][threadIdx.x];
        }
        if (dw) stf(dw, dtw, c, ldf(dw, dtw, c) + tw);
        if (db) stf(db, dtb, c, ldf(db, dtb, c) + tb);
    }
}
