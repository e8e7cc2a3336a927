// attngemm: the kernels around cuBLAS for attention through batched GEMMs
// (see attention.go). Q, K, V, O, dO are "head-major" copies (B,NH,T,hs);
// S and dP are float32 score blocks of nz heads × Tq query rows × Tk keys,
// row-major with leading dimension Tk, for the query rows q0..q0+Tq-1 and
// the keys 0..Tk-1 (Tk = q0+Tq: later keys are masked by causality).
#include "common.cuh"

// attn_split copies qkv(B,T,3C) into Q, K, V (B,NH,T,hs), converting dtype.
extern "C" __global__ void attn_split(void* Q, void* K, void* V, int dtw, const void* qkv, int dtq, int B, int T, int C,
                                      int NH) {
    int hs = C / NH;
    i64 C3 = 3LL * C;
    GRID_STRIDE(i, (i64)B * T * C3) {
        i64 bt = i / C3;
        int c3 = (int)(i - bt * C3);
        int which = c3 / C, c = c3 - which * C;
        int h = c / hs, d = c - h * hs;
        int b = (int)(bt / T), t = (int)(bt - (i64)b * T);
        void* dst = which == 0 ? Q : (which == 1 ? K : V);
        stf(dst, dtw, (((i64)b * NH + h) * T + t) * hs + d, ldf(qkv, dtq, i));
    }
}

// attn_merge_out writes out(B,T,C) from O (B,NH,T,hs).
extern "C" __global__ void attn_merge_out(void* out, int dto, const void* O, int dtw, int B, int T, int C, int NH) {
    int hs = C / NH;
    GRID_STRIDE(i, (i64)B * T * C) {
        i64 bt = i / C;
        int c = (int)(i - bt * C);
        int h = c / hs, d = c - h * hs;
        int b = (int)(bt / T), t = (int)(bt - (i64)b * T);
        stf(out, dto, i, ldf(O, dtw, (((i64)b * NH + h) * T + t) * hs + d));
    }
}

// attn_merge_grad accumulates dqkv(B,T,3C) += [dQ | dK | dV] from float32
// head-major gradients.
extern "C" __global__ void attn_merge_grad(void* dqkv, int dtd, const float* dQ, const float* dK, const float* dV, int B,
                                           int T, int C, int NH) {
    int hs = C / NH;
    i64 C3 = 3LL * C;
    GRID_STRIDE(i, (i64)B * T * C3) {
        i64 bt = i / C3;
        int c3 = (int)(i - bt * C3);
        int which = c3 / C, c = c3 - which * C;
        int h = c / hs, d = c - h * hs;
        int b = (int)(bt / T), t = (int)(bt - (i64)b * T);
        const float* src = which == 0 ? dQ : (which == 1 ? dK : dV);
        float g = src[(((i64)b * NH + h) * T + t) * hs + d];
        stf(dqkv, dtd, i, ldf(dqkv, dtd, i) + g);
    }
}

// attn_bwd_prep copies dout(B,T,C) into dO (B,NH,T,hs) and computes
// D = rowsum(dout ∘ out) per (b,h,t). One warp per row.
extern "C" __global__ void attn_bwd_prep(void* dO, int dtw, float* D, const void* dout, int dtg, const void* out, int dto,
                                         int B, int T, int C, int NH) {
    int lane = threadIdx.x & 31;
    i64 r = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= (i64)B * NH * T) return;
    int hs = C / NH;
    i64 z = r / T;
    int t = (int)(r - z * T);
    int b = (int)(z / NH), h = (int)(z - (i64)b * NH);
    i64 src = ((i64)b * T + t) * C + (i64)h * hs;
    float acc = 0.f;
    for (int d = lane; d < hs; d += 32) {
        float g = ldf(dout, dtg, src + d);
        acc += g * ldf(out, dto, src + d);
        stf(dO, dtw, r * hs + d, g);
    }
    acc = warp_sum(acc);
    if (lane == 0) D[r] = acc;
}

// st4 stores four consecutive elements at index i (a multiple of 4) of p
// with one 8- or 16-byte store.
__device__ __forceinline__ void st4(void* p, int dt, i64 i, float a, float b, float c, float d) {
    switch (dt) {
    case DT_BF16: {
        __nv_bfloat162 lo = __floats2bfloat162_rn(a, b), hi = __floats2bfloat162_rn(c, d);
        uint2 u;
        u.x = *reinterpret_cast<unsigned*>(&lo);
        u.y = *reinterpret_cast<unsigned*>(&hi);
        reinterpret_cast<uint2*>(p)[i >> 2] = u;
        break;
    }
    case DT_F16: {
        __half2 lo = __floats2half2_rn(a, b), hi = __floats2half2_rn(c, d);
        uint2 u;
        u.x = *reinterpret_cast<unsigned*>(&lo);
        u.y = *reinterpret_cast<unsigned*>(&hi);
        reinterpret_cast<uint2*>(p)[i >> 2] = u;
        break;
    }
    default: reinterpret_cast<float4*>(p)[i >> 2] = make_float4(a, b, c, d);
    }
}

#define LOG2E 1.4426950408889634f

// attn_softmax_fwd turns the scaled scores S into probabilities P (dtype
// dtw, zero above the diagonal) and writes lse for each query row. One warp
// per row of the block. With Tk a multiple of 4 it moves 4 elements per
// lane and access (16-byte loads).
extern "C" __global__ void attn_softmax_fwd(const float* S, void* P, int dtw, float* lse, int nz, int Tq, int Tk, int q0,
                                            int z0, int T) {
    int lane = threadIdx.x & 31;
    i64 r = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= (i64)nz * Tq) return;
    i64 z = r / Tq;
    int i = q0 + (int)(r - z * Tq);
    const float* s = S + r * Tk;
    i64 pr = r * Tk;
    float m = -INFINITY, l = 0.f;
    if ((Tk & 3) == 0) {
        // Pass 1: running max and sum over the valid keys j <= i.
        for (int j = 4 * lane; j <= i; j += 128) {
            float4 v = *reinterpret_cast<const float4*>(s + j);
            float x[4] = {v.x, v.y, v.z, v.w};
            float mx = x[0];
#pragma unroll
            for (int u = 1; u < 4; u++)
                if (j + u <= i) mx = fmaxf(mx, x[u]);
            float mn = fmaxf(m, mx);
            float acc = l * exp2f((m - mn) * LOG2E);
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (j + u <= i) acc += exp2f((x[u] - mn) * LOG2E);
            l = acc;
            m = mn;
        }
        float M = warp_max(m);
        l = m == -INFINITY ? 0.f : l * exp2f((m - M) * LOG2E);
        float L = M + logf(warp_sum(l));
        float L2 = L * LOG2E;
        for (int j = 4 * lane; j < Tk; j += 128) {
            float p[4] = {0.f, 0.f, 0.f, 0.f};
            if (j <= i) {
                float4 v = *reinterpret_cast<const float4*>(s + j);
                float x[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                for (int u = 0; u < 4; u++) p[u] = j + u <= i ? exp2f(x[u] * LOG2E - L2) : 0.f;
            }
            st4(P, dtw, pr + j, p[0], p[1], p[2], p[3]);
        }
        if (lane == 0) lse[(z0 + z) * T + i] = L;
        return;
    }
    for (int j = lane; j <= i; j += 32) {
        float v = s[j];
        if (v > m) {
            l = l * expf(m - v) + 1.f;
            m = v;
        } else {
            l += expf(v - m);
        }
    }
    float M = warp_max(m);
    l = m == -INFINITY ? 0.f : l * expf(m - M);
    float L = M + logf(warp_sum(l));
    for (int j = lane; j < Tk; j += 32) stf(P, dtw, pr + j, j <= i ? expf(s[j] - L) : 0.f);
    if (lane == 0) lse[(z0 + z) * T + i] = L;
}

// attn_softmax_bwd recomputes P = exp(S - lse) and writes it with
// dS = scale·P∘(dP - D), both zero above the diagonal. One warp per row;
// 4 elements per lane and access when Tk is a multiple of 4.
extern "C" __global__ void attn_softmax_bwd(const float* S, const float* dP, void* P, void* dS, int dtw, const float* lse,
                                            const float* D, int nz, int Tq, int Tk, int q0, int z0, int T, float scale) {
    int lane = threadIdx.x & 31;
    i64 r = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= (i64)nz * Tq) return;
    i64 z = r / Tq;
    int i = q0 + (int)(r - z * Tq);
    i64 row = (z0 + z) * T + i;
    float L = lse[row], Di = D[row];
    i64 base = r * Tk;
    if ((Tk & 3) == 0) {
        float L2 = L * LOG2E;
        for (int j = 4 * lane; j < Tk; j += 128) {
            float p[4] = {0.f, 0.f, 0.f, 0.f}, ds[4] = {0.f, 0.f, 0.f, 0.f};
            if (j <= i) {
                float4 sv = *reinterpret_cast<const float4*>(S + base + j);
                float4 gv = *reinterpret_cast<const float4*>(dP + base + j);
                float x[4] = {sv.x, sv.y, sv.z, sv.w}, g[4] = {gv.x, gv.y, gv.z, gv.w};
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    if (j + u <= i) {
                        p[u] = exp2f(x[u] * LOG2E - L2);
                        ds[u] = scale * p[u] * (g[u] - Di);
                    }
                }
            }
            st4(P, dtw, base + j, p[0], p[1], p[2], p[3]);
            st4(dS, dtw, base + j, ds[0], ds[1], ds[2], ds[3]);
        }
        return;
    }
    for (int j = lane; j < Tk; j += 32) {
        float p = 0.f, ds = 0.f;
        if (j <= i) {
            p = expf(S[base + j] - L);
            ds = scale * p * (dP[base + j] - Di);
        }
        stf(P, dtw, base + j, p);
        stf(dS, dtw, base + j, ds);
    }
}
