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

// Typed kernels: every float operand of one dtype (mean, rstd f32), C a
// multiple of VN (8 bf16/f16, 4 f32) and every pointer 16-byte aligned, so
// each row is read in 16-byte vectors. The row-wise kernels take one warp
// per row, 8 rows per block of 256; their second and third passes over a
// row hit L1.

// layernorm_forward_{f32,bf16,f16}: layernorm_forward.
template <int DT> __device__ __forceinline__ void ln_fwd_t(void* out, float* mean, float* rstd, const void* inp,
                                                          const void* w, const void* b, int N, int C) {
    constexpr int W = VN<DT>::n;
    int lane = threadIdx.x & 31, nv = C / W;
    i64 row = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= N) return;
    i64 base = row * C;
    float s = 0.f;
    for (int k = lane; k < nv; k += 32) {
        float x[W];
        ldv<DT>(inp, base + k * W, x);
#pragma unroll
        for (int j = 0; j < W; j++) s += x[j];
    }
    float m = warp_sum(s) / C;
    float v = 0.f;
    for (int k = lane; k < nv; k += 32) {
        float x[W];
        ldv<DT>(inp, base + k * W, x);
#pragma unroll
        for (int j = 0; j < W; j++) {
            float d = x[j] - m;
            v += d * d;
        }
    }
    v = warp_sum(v) / C;
    float r = 1.f / sqrtf(v + 1e-5f);
    for (int k = lane; k < nv; k += 32) {
        float x[W], wk[W], bk[W];
        ldv_cs<DT>(inp, base + k * W, x);
        ldv<DT>(w, k * W, wk);
        if (b) ldv<DT>(b, k * W, bk);
#pragma unroll
        for (int j = 0; j < W; j++) {
            float y = (x[j] - m) * r * wk[j];
            if (b) y += bk[j];
            x[j] = y;
        }
        stv<DT>(out, base + k * W, x);
    }
    if (lane == 0) {
        if (mean) mean[row] = m;
        if (rstd) rstd[row] = r;
    }
}
INSTANTIATE3(layernorm_forward, ln_fwd_t,
             (void* out, float* mean, float* rstd, const void* inp, const void* w, const void* b, int N, int C),
             (out, mean, rstd, inp, w, b, N, C))

// layernorm_backward_{f32,bf16,f16}: layernorm_backward (dinp only).
template <int DT> __device__ __forceinline__ void ln_bwd_t(void* dinp, const void* dout, const void* inp, const void* w,
                                                          const float* mean, const float* rstd, int N, int C) {
    constexpr int W = VN<DT>::n;
    int lane = threadIdx.x & 31, nv = C / W;
    i64 row = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= N) return;
    i64 base = row * C;
    float m = mean[row], r = rstd[row];
    float a = 0.f, bsum = 0.f;
    for (int k = lane; k < nv; k += 32) {
        float x[W], g[W], wk[W];
        ldv<DT>(inp, base + k * W, x);
        ldv<DT>(dout, base + k * W, g);
        ldv<DT>(w, k * W, wk);
#pragma unroll
        for (int j = 0; j < W; j++) {
            float norm = (x[j] - m) * r;
            float dn = g[j] * wk[j];
            a += dn;
            bsum += dn * norm;
        }
    }
    a = warp_sum(a) / C;
    bsum = warp_sum(bsum) / C;
    for (int k = lane; k < nv; k += 32) {
        float x[W], g[W], wk[W], d[W];
        ldv<DT>(inp, base + k * W, x);
        ldv<DT>(dout, base + k * W, g);
        ldv<DT>(w, k * W, wk);
        ldv_cs<DT>(dinp, base + k * W, d);
#pragma unroll
        for (int j = 0; j < W; j++) {
            float norm = (x[j] - m) * r;
            float dn = g[j] * wk[j];
            d[j] += (dn - a - norm * bsum) * r;
        }
        stv<DT>(dinp, base + k * W, d);
    }
}
INSTANTIATE3(layernorm_backward, ln_bwd_t,
             (void* dinp, const void* dout, const void* inp, const void* w, const float* mean, const float* rstd, int N,
              int C),
             (dinp, dout, inp, w, mean, rstd, N, C))

// layernorm_params_partial_{f32,bf16,f16}: the parameter gradients of a chunk
// of rows, deterministic first half of layernorm_backward_params:
// part[y*2C + c] = sum dout*norm and part[y*2C + C + c] = sum dout over rows
// [y*rpc, min((y+1)*rpc, N)) for y = blockIdx.y. blockDim (32, 8); block x
// covers 32 vectors of columns, each warp every 8th row of the chunk.
template <int DT> __device__ __forceinline__ void ln_part_t(float* part, const void* dout, const void* inp,
                                                           const float* mean, const float* rstd, int N, int C, int rpc) {
    constexpr int W = VN<DT>::n;
    __shared__ float sw[8][W][33], sb[8][W][33];
    int x = threadIdx.x, y = threadIdx.y;
    int cv = blockIdx.x * 32 + x;  // vector of columns
    int r0 = blockIdx.y * rpc, r1 = min(r0 + rpc, N);
    float aw[W], ab[W];
#pragma unroll
    for (int j = 0; j < W; j++) aw[j] = ab[j] = 0.f;
    if (cv < C / W) {
        for (int r = r0 + y; r < r1; r += 8) {
            float g[W], xi[W];
            i64 o = (i64)r * C + (i64)cv * W;
            ldv<DT>(dout, o, g);
            ldv<DT>(inp, o, xi);
            float m = mean[r], rs = rstd[r];
#pragma unroll
            for (int j = 0; j < W; j++) {
                aw[j] += g[j] * (xi[j] - m) * rs;
                ab[j] += g[j];
            }
        }
    }
#pragma unroll
    for (int j = 0; j < W; j++) {
        sw[y][j][x] = aw[j];
        sb[y][j][x] = ab[j];
    }
    __syncthreads();
    for (int i = y * 32 + x; i < 32 * W; i += 256) {
        int j = i / 32, xx = i % 32;
        int c = (blockIdx.x * 32 + xx) * W + j;
        if (c < C) {
            float tw = 0.f, tb = 0.f;
#pragma unroll
            for (int k = 0; k < 8; k++) {
                tw += sw[k][j][xx];
                tb += sb[k][j][xx];
            }
            float* p = part + (i64)blockIdx.y * 2 * C;
            p[c] = tw;
            p[C + c] = tb;
        }
    }
}
INSTANTIATE3(layernorm_params_partial, ln_part_t,
             (float* part, const void* dout, const void* inp, const float* mean, const float* rstd, int N, int C, int rpc),
             (part, dout, inp, mean, rstd, N, C, rpc))

// layernorm_params_final: dweight[c] += sum_y part[y*2C + c], dbias[c] +=
// sum_y part[y*2C + C + c] over the R chunks of layernorm_params_partial,
// in a fixed order. blockDim (32, 32); block x covers 32 columns.
extern "C" __global__ void __launch_bounds__(1024) layernorm_params_final(void* dw, int dtw, void* db, int dtb, const float* part, int R, int C) {
    __shared__ float sw[32][33], sb[32][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    float tw = 0.f, tb = 0.f;
    if (c < C)
        for (int k = threadIdx.y; k < R; k += 32) {
            tw += part[(i64)k * 2 * C + c];
            tb += part[(i64)k * 2 * C + C + c];
        }
    sw[threadIdx.y][threadIdx.x] = tw;
    sb[threadIdx.y][threadIdx.x] = tb;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        tw = tb = 0.f;
        for (int k = 0; k < 32; k++) {
            tw += sw[k][threadIdx.x];
            tb += sb[k][threadIdx.x];
        }
        if (dw) stf(dw, dtw, c, ldf(dw, dtw, c) + tw);
        if (db) stf(db, dtb, c, ldf(db, dtb, c) + tb);
    }
}
