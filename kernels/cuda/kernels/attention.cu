// attention: causal multi-head self-attention, flash style. qkv(B,T,3C) holds
// [q | k | v] per token; NH heads of hs = C/NH (hs <= 32*ATT_R). One warp per
// row: lane l holds dimensions l, l+32, ... of the row in registers. The T×T
// matrix is never stored; the forward pass saves lse(B,NH,T) only, and the
// backward pass recomputes probabilities from it.
//
// The row-wise kernels also take grouped-query attention (the gqa_*
// entry points): qkv(B,T,(NH+2·NKV)·hs) holds NH query heads, then NKV key
// heads, then NKV value heads, query head h attending with key/value head
// h/(NH/NKV); NKV = NH is the multi-head layout above.
#include "common.cuh"

#define ATT_R 8

struct Row {
    int b, h, t;
};

__device__ __forceinline__ Row att_row(i64 row, int T, int NH) {
    Row r;
    r.t = (int)(row % T);
    r.h = (int)((row / T) % NH);
    r.b = (int)(row / ((i64)T * NH));
    return r;
}

// GQA is the packed layout of NH query and NKV key/value heads of size hs:
// element offsets of a token's query head h (q), of key/value head kv (k,
// v) and of query head h in out(B,T,NH·hs).
struct GQA {
    int T, NH, NKV, hs;
    __device__ __forceinline__ i64 width() const { return (i64)(NH + 2 * NKV) * hs; }
    __device__ __forceinline__ i64 q(int b, int t, int h) const { return ((i64)b * T + t) * width() + (i64)h * hs; }
    __device__ __forceinline__ i64 k(int b, int t, int kv) const {
        return ((i64)b * T + t) * width() + (i64)(NH + kv) * hs;
    }
    __device__ __forceinline__ i64 v(int b, int t, int kv) const { return k(b, t, kv) + (i64)NKV * hs; }
    __device__ __forceinline__ i64 o(int b, int t, int h) const { return ((i64)b * T + t) * NH * hs + (i64)h * hs; }
    __device__ __forceinline__ int group(int h) const { return h / (NH / NKV); }
};

// att_forward writes out(B,T,NH·hs) and lse(B,NH,T), one warp per (b, h, t).
__device__ __forceinline__ void att_forward(void* out, int dto, float* lse, const void* qkv, int dtq, int B, GQA L) {
    int lane = threadIdx.x & 31;
    i64 row = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= (i64)B * L.NH * L.T) return;
    Row r = att_row(row, L.T, L.NH);
    int hs = L.hs, kv = L.group(r.h);
    float scale = 1.f / sqrtf((float)hs);
    i64 qoff = L.q(r.b, r.t, r.h);
    float q[ATT_R], acc[ATT_R];
#pragma unroll
    for (int k = 0; k < ATT_R; k++) {
        int d = lane + 32 * k;
        q[k] = d < hs ? ldf(qkv, dtq, qoff + d) : 0.f;
        acc[k] = 0.f;
    }
    float m = -INFINITY, l = 0.f;
    for (int j = 0; j <= r.t; j++) {
        i64 koff = L.k(r.b, j, kv), voff = L.v(r.b, j, kv);
        float s = 0.f;
#pragma unroll
        for (int k = 0; k < ATT_R; k++) {
            int d = lane + 32 * k;
            if (d < hs) s += q[k] * ldf(qkv, dtq, koff + d);
        }
        s = warp_sum(s) * scale;
        float mn = fmaxf(m, s);
        float corr = expf(m - mn), p = expf(s - mn);
        l = l * corr + p;
#pragma unroll
        for (int k = 0; k < ATT_R; k++) {
            int d = lane + 32 * k;
            if (d < hs) acc[k] = acc[k] * corr + p * ldf(qkv, dtq, voff + d);
        }
        m = mn;
    }
    i64 ooff = L.o(r.b, r.t, r.h);
    float inv = 1.f / l;
#pragma unroll
    for (int k = 0; k < ATT_R; k++) {
        int d = lane + 32 * k;
        if (d < hs) stf(out, dto, ooff + d, acc[k] * inv);
    }
    if (lane == 0) lse[row] = m + logf(l);
}

extern "C" __global__ void attention_forward(void* out, int dto, float* lse, const void* qkv, int dtq, int B, int T, int C,
                                             int NH) {
    att_forward(out, dto, lse, qkv, dtq, B, GQA{T, NH, NH, C / NH});
}

extern "C" __global__ void gqa_attention_forward(void* out, int dto, float* lse, const void* qkv, int dtq, int B, int T,
                                                 int NH, int NKV, int hs) {
    att_forward(out, dto, lse, qkv, dtq, B, GQA{T, NH, NKV, hs});
}

// att_backward (query side): dq += scale * sum_j ds_ij k_j with
// ds_ij = p_ij (dout_i·v_j - D_i), D_i = dout_i·out_i. It also saves D(B,NH,T)
// for att_backward_kv. One warp per (b, h, t).
__device__ __forceinline__ void att_backward(void* dqkv, int dtd, float* D, const void* dout, int dto, const void* qkv,
                                             int dtq, const void* out, int dtout, const float* lse, int B, GQA L) {
    int lane = threadIdx.x & 31;
    i64 row = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= (i64)B * L.NH * L.T) return;
    Row r = att_row(row, L.T, L.NH);
    int hs = L.hs, kv = L.group(r.h);
    float scale = 1.f / sqrtf((float)hs);
    i64 qoff = L.q(r.b, r.t, r.h);
    i64 ooff = L.o(r.b, r.t, r.h);
    float q[ATT_R], go[ATT_R], dq[ATT_R];
    float Di = 0.f;
#pragma unroll
    for (int k = 0; k < ATT_R; k++) {
        int d = lane + 32 * k;
        q[k] = d < hs ? ldf(qkv, dtq, qoff + d) : 0.f;
        go[k] = d < hs ? ldf(dout, dto, ooff + d) : 0.f;
        if (d < hs) Di += go[k] * ldf(out, dtout, ooff + d);
        dq[k] = 0.f;
    }
    Di = warp_sum(Di);
    float Lr = lse[row];
    for (int j = 0; j <= r.t; j++) {
        i64 koff = L.k(r.b, j, kv), voff = L.v(r.b, j, kv);
        float s = 0.f, dp = 0.f;
#pragma unroll
        for (int k = 0; k < ATT_R; k++) {
            int d = lane + 32 * k;
            if (d < hs) {
                s += q[k] * ldf(qkv, dtq, koff + d);
                dp += go[k] * ldf(qkv, dtq, voff + d);
            }
        }
        s = warp_sum(s) * scale;
        dp = warp_sum(dp);
        float ds = expf(s - Lr) * (dp - Di);
#pragma unroll
        for (int k = 0; k < ATT_R; k++) {
            int d = lane + 32 * k;
            if (d < hs) dq[k] += ds * ldf(qkv, dtq, koff + d);
        }
    }
#pragma unroll
    for (int k = 0; k < ATT_R; k++) {
        int d = lane + 32 * k;
        if (d < hs) stf(dqkv, dtd, qoff + d, ldf(dqkv, dtd, qoff + d) + scale * dq[k]);
    }
    if (lane == 0) D[row] = Di;
}

extern "C" __global__ void attention_backward(void* dqkv, int dtd, float* D, const void* dout, int dto, const void* qkv,
                                              int dtq, const void* out, int dtout, const float* lse, int B, int T, int C,
                                              int NH) {
    att_backward(dqkv, dtd, D, dout, dto, qkv, dtq, out, dtout, lse, B, GQA{T, NH, NH, C / NH});
}

extern "C" __global__ void gqa_attention_backward(void* dqkv, int dtd, float* D, const void* dout, int dto,
                                                  const void* qkv, int dtq, const void* out, int dtout, const float* lse,
                                                  int B, int T, int NH, int NKV, int hs) {
    att_backward(dqkv, dtd, D, dout, dto, qkv, dtq, out, dtout, lse, B, GQA{T, NH, NKV, hs});
}

// att_backward_kv (key side): for key row j of key/value head kv,
// dk += scale * sum_h sum_{i>=j} ds_hij q_hi and dv += sum_h sum_{i>=j} p_hij dout_hi
// over the query heads h of its group, in order. Needs D from att_backward.
// One warp per (b, kv, j).
__device__ __forceinline__ void att_backward_kv(void* dqkv, int dtd, const float* D, const void* dout, int dto,
                                                const void* qkv, int dtq, const float* lse, int B, GQA L) {
    int lane = threadIdx.x & 31;
    i64 row = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= (i64)B * L.NKV * L.T) return;
    Row r = att_row(row, L.T, L.NKV);  // r.h is the key/value head
    int j = r.t, hs = L.hs, rep = L.NH / L.NKV;
    float scale = 1.f / sqrtf((float)hs);
    i64 koff = L.k(r.b, j, r.h), voff = L.v(r.b, j, r.h);
    float kk[ATT_R], vv[ATT_R], dk[ATT_R], dv[ATT_R];
#pragma unroll
    for (int k = 0; k < ATT_R; k++) {
        int d = lane + 32 * k;
        kk[k] = d < hs ? ldf(qkv, dtq, koff + d) : 0.f;
        vv[k] = d < hs ? ldf(qkv, dtq, voff + d) : 0.f;
        dk[k] = 0.f;
        dv[k] = 0.f;
    }
    for (int h = r.h * rep; h < (r.h + 1) * rep; h++) {
        i64 rowbase = ((i64)r.b * L.NH + h) * L.T;  // (b,h,0) in lse/D
        for (int i = j; i < L.T; i++) {
            i64 qoff = L.q(r.b, i, h);
            i64 ooff = L.o(r.b, i, h);
            float s = 0.f, dp = 0.f;
#pragma unroll
            for (int k = 0; k < ATT_R; k++) {
                int d = lane + 32 * k;
                if (d < hs) {
                    s += kk[k] * ldf(qkv, dtq, qoff + d);
                    dp += vv[k] * ldf(dout, dto, ooff + d);
                }
            }
            s = warp_sum(s) * scale;
            dp = warp_sum(dp);
            float p = expf(s - lse[rowbase + i]);
            float ds = p * (dp - D[rowbase + i]);
#pragma unroll
            for (int k = 0; k < ATT_R; k++) {
                int d = lane + 32 * k;
                if (d < hs) {
                    dk[k] += ds * ldf(qkv, dtq, qoff + d);
                    dv[k] += p * ldf(dout, dto, ooff + d);
                }
            }
        }
    }
#pragma unroll
    for (int k = 0; k < ATT_R; k++) {
        int d = lane + 32 * k;
        if (d < hs) {
            stf(dqkv, dtd, koff + d, ldf(dqkv, dtd, koff + d) + scale * dk[k]);
            stf(dqkv, dtd, voff + d, ldf(dqkv, dtd, voff + d) + dv[k]);
        }
    }
}

extern "C" __global__ void attention_backward_kv(void* dqkv, int dtd, const float* D, const void* dout, int dto,
                                                 const void* qkv, int dtq, const float* lse, int B, int T, int C, int NH) {
    att_backward_kv(dqkv, dtd, D, dout, dto, qkv, dtq, lse, B, GQA{T, NH, NH, C / NH});
}

extern "C" __global__ void gqa_attention_backward_kv(void* dqkv, int dtd, const float* D, const void* dout, int dto,
                                                     const void* qkv, int dtq, const float* lse, int B, int T, int NH,
                                                     int NKV, int hs) {
    att_backward_kv(dqkv, dtd, D, dout, dto, qkv, dtq, lse, B, GQA{T, NH, NKV, hs});
}

// Tiled variants for head sizes up to ATT_HMAX: a block takes a few rows of
// one (b, h) and walks the other side in tiles of ATT_TK rows staged in
// shared memory (as float), so that each K/V (or Q/dO) row is read from
// global memory once per block instead of once per row. Inside a tile a
// lane owns one key (or query) for the dot products and one slice of the
// head dimension for the accumulations. grid = (row tiles, B*NH), 256 threads.
#define ATT_TK 32
#define ATT_HMAX 128
#define ATT_HR (ATT_HMAX / 32)

// attention_forward_tiled: 16 query rows per block, 2 per warp.
extern "C" __global__ void attention_forward_tiled(void* out, int dto, float* lse, const void* qkv, int dtq, int B, int T,
                                                   int C, int NH) {
    __shared__ float qs[16][ATT_HMAX];
    __shared__ float ks[ATT_TK][ATT_HMAX + 1];
    __shared__ float vs[ATT_TK][ATT_HMAX + 1];
    int b = blockIdx.y / NH, h = blockIdx.y % NH;
    int t0 = blockIdx.x * 16;
    int hs = C / NH;
    float scale = 1.f / sqrtf((float)hs);
    i64 C3 = 3LL * C;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    i64 base = (i64)b * T * C3 + (i64)h * hs;
    for (int e = threadIdx.x; e < 16 * hs; e += blockDim.x) {
        int r = e / hs, d = e - r * hs, t = t0 + r;
        qs[r][d] = t < T ? ldf(qkv, dtq, base + (i64)t * C3 + d) : 0.f;
    }
    float m[2], l[2], acc[2][ATT_HR];
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        m[rr] = -INFINITY;
        l[rr] = 0.f;
#pragma unroll
        for (int k = 0; k < ATT_HR; k++) acc[rr][k] = 0.f;
    }
    int tlast = min(t0 + 15, T - 1);
    for (int j0 = 0; j0 <= tlast; j0 += ATT_TK) {
        __syncthreads();
        for (int e = threadIdx.x; e < ATT_TK * hs; e += blockDim.x) {
            int r = e / hs, d = e - r * hs, j = j0 + r;
            float kv = 0.f, vv = 0.f;
            if (j < T) {
                i64 o = base + (i64)j * C3 + C + d;
                kv = ldf(qkv, dtq, o);
                vv = ldf(qkv, dtq, o + C);
            }
            ks[r][d] = kv;
            vs[r][d] = vv;
        }
        __syncthreads();
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            int r = warp * 2 + rr, t = t0 + r;
            if (t >= T || t < j0) continue;  // uniform across the warp
            int j = j0 + lane;
            float s = -INFINITY;
            if (j <= t) {
                float a = 0.f;
                for (int d = 0; d < hs; d++) a += qs[r][d] * ks[lane][d];
                s = a * scale;
            }
            float mn = fmaxf(m[rr], warp_max(s));
            float p = expf(s - mn), corr = expf(m[rr] - mn);
            l[rr] = l[rr] * corr + warp_sum(p);
            int nk = min(ATT_TK, t - j0 + 1);
#pragma unroll
            for (int k = 0; k < ATT_HR; k++) acc[rr][k] *= corr;
            for (int jj = 0; jj < nk; jj++) {
                float pj = __shfl_sync(0xffffffffu, p, jj);
#pragma unroll
                for (int k = 0; k < ATT_HR; k++) {
                    int d = lane + 32 * k;
                    if (d < hs) acc[rr][k] += pj * vs[jj][d];
                }
            }
            m[rr] = mn;
        }
    }
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        int t = t0 + warp * 2 + rr;
        if (t >= T) continue;
        i64 ooff = ((i64)b * T + t) * C + (i64)h * hs;
        float inv = 1.f / l[rr];
#pragma unroll
        for (int k = 0; k < ATT_HR; k++) {
            int d = lane + 32 * k;
            if (d < hs) stf(out, dto, ooff + d, acc[rr][k] * inv);
        }
        if (lane == 0) lse[((i64)b * NH + h) * T + t] = m[rr] + logf(l[rr]);
    }
}

// attention_backward_tiled (query side): 8 query rows per block, one per
// warp; saves D(B,NH,T) for attention_backward_kv_tiled.
extern "C" __global__ void attention_backward_tiled(void* dqkv, int dtd, float* D, const void* dout, int dto,
                                                    const void* qkv, int dtq, const void* out, int dtout, const float* lse,
                                                    int B, int T, int C, int NH) {
    __shared__ float qs[8][ATT_HMAX], gs[8][ATT_HMAX];
    __shared__ float ks[ATT_TK][ATT_HMAX + 1];
    __shared__ float vs[ATT_TK][ATT_HMAX + 1];
    int b = blockIdx.y / NH, h = blockIdx.y % NH;
    int t0 = blockIdx.x * 8;
    int hs = C / NH;
    float scale = 1.f / sqrtf((float)hs);
    i64 C3 = 3LL * C;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    i64 base = (i64)b * T * C3 + (i64)h * hs;
    i64 obase = (i64)b * T * C + (i64)h * hs;
    for (int e = threadIdx.x; e < 8 * hs; e += blockDim.x) {
        int r = e / hs, d = e - r * hs, t = t0 + r;
        qs[r][d] = t < T ? ldf(qkv, dtq, base + (i64)t * C3 + d) : 0.f;
        gs[r][d] = t < T ? ldf(dout, dto, obase + (i64)t * C + d) : 0.f;
    }
    __syncthreads();
    int r = warp, t = t0 + warp;
    float Di = 0.f, L = 0.f;
    if (t < T) {
        for (int d = lane; d < hs; d += 32) Di += gs[r][d] * ldf(out, dtout, obase + (i64)t * C + d);
        L = lse[((i64)b * NH + h) * T + t];
    }
    Di = warp_sum(Di);
    float dq[ATT_HR];
#pragma unroll
    for (int k = 0; k < ATT_HR; k++) dq[k] = 0.f;
    int tlast = min(t0 + 7, T - 1);
    for (int j0 = 0; j0 <= tlast; j0 += ATT_TK) {
        __syncthreads();
        for (int e = threadIdx.x; e < ATT_TK * hs; e += blockDim.x) {
            int rr = e / hs, d = e - rr * hs, j = j0 + rr;
            float kv = 0.f, vv = 0.f;
            if (j < T) {
                i64 o = base + (i64)j * C3 + C + d;
                kv = ldf(qkv, dtq, o);
                vv = ldf(qkv, dtq, o + C);
            }
            ks[rr][d] = kv;
            vs[rr][d] = vv;
        }
        __syncthreads();
        if (t >= T || t < j0) continue;  // uniform across the warp
        int j = j0 + lane;
        float ds = 0.f;
        if (j <= t) {
            float a = 0.f, dp = 0.f;
            for (int d = 0; d < hs; d++) {
                a += qs[r][d] * ks[lane][d];
                dp += gs[r][d] * vs[lane][d];
            }
            ds = expf(a * scale - L) * (dp - Di);
        }
        int nk = min(ATT_TK, t - j0 + 1);
        for (int jj = 0; jj < nk; jj++) {
            float dsj = __shfl_sync(0xffffffffu, ds, jj);
#pragma unroll
            for (int k = 0; k < ATT_HR; k++) {
                int d = lane + 32 * k;
                if (d < hs) dq[k] += dsj * ks[jj][d];
            }
        }
    }
    if (t >= T) return;
#pragma unroll
    for (int k = 0; k < ATT_HR; k++) {
        int d = lane + 32 * k;
        i64 o = base + (i64)t * C3 + d;
        if (d < hs) stf(dqkv, dtd, o, ldf(dqkv, dtd, o) + scale * dq[k]);
    }
    if (lane == 0) D[((i64)b * NH + h) * T + t] = Di;
}

// attention_backward_kv_tiled (key side): 8 key rows per block, one per
// warp, walking the query rows i >= the block's first key in tiles.
extern "C" __global__ void attention_backward_kv_tiled(void* dqkv, int dtd, const float* D, const void* dout, int dto,
                                                       const void* qkv, int dtq, const float* lse, int B, int T, int C,
                                                       int NH) {
    __shared__ float kr[8][ATT_HMAX], vr[8][ATT_HMAX];
    __shared__ float qs[ATT_TK][ATT_HMAX + 1];
    __shared__ float gs[ATT_TK][ATT_HMAX + 1];
    __shared__ float Ls[ATT_TK], Ds[ATT_TK];
    int b = blockIdx.y / NH, h = blockIdx.y % NH;
    int s0 = blockIdx.x * 8;
    int hs = C / NH;
    float scale = 1.f / sqrtf((float)hs);
    i64 C3 = 3LL * C;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    i64 base = (i64)b * T * C3 + (i64)h * hs;
    i64 obase = (i64)b * T * C + (i64)h * hs;
    i64 lbase = ((i64)b * NH + h) * T;
    for (int e = threadIdx.x; e < 8 * hs; e += blockDim.x) {
        int r = e / hs, d = e - r * hs, j = s0 + r;
        i64 o = base + (i64)j * C3 + C + d;
        kr[r][d] = j < T ? ldf(qkv, dtq, o) : 0.f;
        vr[r][d] = j < T ? ldf(qkv, dtq, o + C) : 0.f;
    }
    int r = warp, j = s0 + warp;
    float dk[ATT_HR], dv[ATT_HR];
#pragma unroll
    for (int k = 0; k < ATT_HR; k++) dk[k] = dv[k] = 0.f;
    for (int i0 = s0; i0 < T; i0 += ATT_TK) {
        __syncthreads();
        for (int e = threadIdx.x; e < ATT_TK * hs; e += blockDim.x) {
            int rr = e / hs, d = e - rr * hs, i = i0 + rr;
            qs[rr][d] = i < T ? ldf(qkv, dtq, base + (i64)i * C3 + d) : 0.f;
            gs[rr][d] = i < T ? ldf(dout, dto, obase + (i64)i * C + d) : 0.f;
        }
        if (threadIdx.x < ATT_TK) {
            int i = i0 + threadIdx.x;
            Ls[threadIdx.x] = i < T ? lse[lbase + i] : 0.f;
            Ds[threadIdx.x] = i < T ? D[lbase + i] : 0.f;
        }
        __syncthreads();
        if (j >= T) continue;  // uniform across the warp
        int i = i0 + lane;
        float p = 0.f, ds = 0.f;
        if (i < T && i >= j) {
            float a = 0.f, dp = 0.f;
            for (int d = 0; d < hs; d++) {
                a += kr[r][d] * qs[lane][d];
                dp += vr[r][d] * gs[lane][d];
            }
            p = expf(a * scale - Ls[lane]);
            ds = p * (dp - Ds[lane]);
        }
        int nq = min(ATT_TK, T - i0);
        for (int ii = 0; ii < nq; ii++) {
            float pi = __shfl_sync(0xffffffffu, p, ii), dsi = __shfl_sync(0xffffffffu, ds, ii);
#pragma unroll
            for (int k = 0; k < ATT_HR; k++) {
                int d = lane + 32 * k;
                if (d < hs) {
                    dv[k] += pi * gs[ii][d];
                    dk[k] += dsi * qs[ii][d];
                }
            }
        }
    }
    if (j >= T) return;
#pragma unroll
    for (int k = 0; k < ATT_HR; k++) {
        int d = lane + 32 * k;
        if (d < hs) {
            i64 o = base + (i64)j * C3 + C + d;
            stf(dqkv, dtd, o, ldf(dqkv, dtd, o) + scale * dk[k]);
            stf(dqkv, dtd, o + C, ldf(dqkv, dtd, o + C) + dv[k]);
        }
    }
}
