// crossentropy: softmax cross-entropy over rows of logits(BT,V); one block per row.
#include "common.cuh"

extern "C" __global__ void crossentropy_forward(float* losses, const void* logits, int dtl, const int* targets, int BT, int V) {
    int row = blockIdx.x;
    int tgt = targets[row];
    if (tgt < 0) {
        if (threadIdx.x == 0) losses[row] = 0.f;
        return;
    }
    i64 base = (i64)row * V;
    float mx = -INFINITY;
    for (int v = threadIdx.x; v < V; v += blockDim.x) mx = fmaxf(mx, ldf(logits, dtl, base + v));
    mx = block_max(mx);
    float s = 0.f;
    for (int v = threadIdx.x; v < V; v += blockDim.x) s += expf(ldf(logits, dtl, base + v) - mx);
    s = block_sum(s);
    if (threadIdx.x == 0) losses[row] = tgt >= V ? NAN : logf(s) + mx - ldf(logits, dtl, base + tgt);
}

extern "C" __global__ void crossentropy_backward(void* dlogits, int dtd, const void* logits, int dtl, const int* targets,
                                                 int BT, int V, float scale) {
    int row = blockIdx.x;
    int tgt = targets[row];
    if (tgt < 0) return;
    i64 base = (i64)row * V;
    float mx = -INFINITY;
    for (int v = threadIdx.x; v < V; v += blockDim.x) mx = fmaxf(mx, ldf(logits, dtl, base + v));
    mx = block_max(mx);
    float s = 0.f;
    for (int v = threadIdx.x; v < V; v += blockDim.x) s += expf(ldf(logits, dtl, base + v) - mx);
    s = block_sum(s);
    float inv = 1.f / s;
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        float p = expf(ldf(logits, dtl, base + v) - mx) * inv;
        if (v == tgt) p -= 1.f;
        stf(dlogits, dtd, base + v, ldf(dlogits, dtd, base + v) + scale * p);
    }
}

// Typed kernels: every float operand of one dtype, logits (and dlogits)
// aligned to the element size, dlogits aligned like logits modulo 16 bytes.
// One block per row (blockDim.x a multiple of 32, up to 1024); each row is
// read as a scalar head up to the first 16-byte boundary, 16-byte vectors
// and a scalar tail. The max and the sum of exponentials are found in one
// pass (online softmax).

// ce_row_stats returns the row's max m and sum of exp(z - m), in every thread.
template <int DT> __device__ __forceinline__ void ce_row_stats(const void* z, int V, float& m, float& s) {
    constexpr int W = VN<DT>::n;
    int h = (int)ew_head<DT>(z, V), nv = (V - h) / W, t = h + nv * W;
    m = -INFINITY;
    s = 0.f;
    for (int k = threadIdx.x; k < nv; k += blockDim.x) {
        float f[W];
        ldv<DT>(z, h + (i64)k * W, f);
        float mk = f[0];
#pragma unroll
        for (int j = 1; j < W; j++) mk = fmaxf(mk, f[j]);
        float mn = fmaxf(m, mk), a = 0.f;
        if (mn != -INFINITY) {  // else every element so far is -inf (exp gives 0)
#pragma unroll
            for (int j = 0; j < W; j++) a += __expf(f[j] - mn);
        }
        s = (m == -INFINITY ? 0.f : s * __expf(m - mn)) + a;
        m = mn;
    }
    for (int e = threadIdx.x; e < h + V - t; e += blockDim.x) {
        float x = ldx<DT>(z, 0, e < h ? e : t + (e - h));
        ms_merge(m, s, x, 1.f);
    }
    block_max_sum(m, s);
}

// crossentropy_forward_{f32,bf16,f16}: crossentropy_forward, one pass over the logits.
template <int DT> __device__ __forceinline__ void ce_fwd_t(float* losses, const void* logits, const int* targets, int V) {
    int row = blockIdx.x;
    int tgt = targets[row];
    if (tgt < 0) {
        if (threadIdx.x == 0) losses[row] = 0.f;
        return;
    }
    const void* z = (const char*)logits + (i64)row * V * (DT == DT_F32 ? 4 : 2);
    float m, s;
    ce_row_stats<DT>(z, V, m, s);
    if (threadIdx.x == 0) losses[row] = tgt >= V ? NAN : logf(s) + m - ldx<DT>(z, 0, tgt);
}
INSTANTIATE3_LB(crossentropy_forward, ce_fwd_t, 1024, (float* losses, const void* logits, const int* targets, int BT, int V),
             (losses, logits, targets, V))

// crossentropy_backward_{f32,bf16,f16}: crossentropy_backward; the second
// pass over the logits mostly hits L2 (the row was read just before).
// crossentropy_backward_set_{f32,bf16,f16}: the same but overwriting
// dlogits (not read; ignored rows get zeros).
template <int DT, bool SET>
__device__ __forceinline__ void ce_bwd_k(void* dlogits, const void* logits, const int* targets, int V, float scale) {
    constexpr int W = VN<DT>::n;
    int row = blockIdx.x;
    int tgt = targets[row];
    i64 off = (i64)row * V * (DT == DT_F32 ? 4 : 2);
    const void* z = (const char*)logits + off;
    void* d = (char*)dlogits + off;
    if (tgt < 0) {
        if (SET)
            for (int v = threadIdx.x; v < V; v += blockDim.x) stx<DT>(d, 0, v, 0.f);
        return;
    }
    float m, s;
    ce_row_stats<DT>(z, V, m, s);
    float inv = 1.f / s;
    int h = (int)ew_head<DT>(z, V), nv = (V - h) / W, t = h + nv * W;
    for (int k = threadIdx.x; k < nv; k += blockDim.x) {
        int v0 = h + k * W;
        float f[W], g[W];
        ldv_cs<DT>(z, v0, f);
        if (!SET) ldv_cs<DT>(d, v0, g);
#pragma unroll
        for (int j = 0; j < W; j++) {
            float p = __expf(f[j] - m) * inv;
            if (v0 + j == tgt) p -= 1.f;
            g[j] = (SET ? 0.f : g[j]) + scale * p;
        }
        stv_cs<DT>(d, v0, g);
    }
    for (int e = threadIdx.x; e < h + V - t; e += blockDim.x) {
        int v = e < h ? e : t + (e - h);
        float p = __expf(ldx<DT>(z, 0, v) - m) * inv;
        if (v == tgt) p -= 1.f;
        stx<DT>(d, 0, v, (SET ? 0.f : ldx<DT>(d, 0, v)) + scale * p);
    }
}
template <int DT>
__device__ __forceinline__ void ce_bwd_t(void* dlogits, const void* logits, const int* targets, int V, float scale) {
    ce_bwd_k<DT, false>(dlogits, logits, targets, V, scale);
}
template <int DT>
__device__ __forceinline__ void ce_bwd_set_t(void* dlogits, const void* logits, const int* targets, int V, float scale) {
    ce_bwd_k<DT, true>(dlogits, logits, targets, V, scale);
}
INSTANTIATE3_LB(crossentropy_backward, ce_bwd_t, 1024,
             (void* dlogits, const void* logits, const int* targets, int BT, int V, float scale),
             (dlogits, logits, targets, V, scale))
INSTANTIATE3_LB(crossentropy_backward_set, ce_bwd_set_t, 1024,
             (void* dlogits, const void* logits, const int* targets, int BT, int V, float scale),
             (dlogits, logits, targets, V, scale))
