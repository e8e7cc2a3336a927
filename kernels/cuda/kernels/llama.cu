// llama: the elementwise and row-wise kernels of the Llama layers
// (kernels.LlamaOps): RMSNorm, rotary position embeddings (RoPE) and the
// SwiGLU activation, forward and backward. Grouped-query attention is in
// attention.cu (row-wise) and flashattn.cu (tensor cores).
//
// As elsewhere, each op has a generic kernel taking a dtype code per
// operand and, where the operands allow 16-byte accesses, kernels typed on
// one dtype (NAME_f32, NAME_bf16, NAME_f16). Arithmetic is float32, with
// one rounding into each output.
#include "common.cuh"

// ---- RMSNorm: out = inp · rstd · w, rstd = 1/sqrt(mean(inp²) + eps) per row.

// rmsnorm_forward: out(N,C) and rstd(N) (float32) from inp(N,C) and w(C);
// one warp per row, 8 rows per block of 256.
extern "C" __global__ void rmsnorm_forward(void* out, int dto, float* rstd, const void* inp, int dti, const void* w,
                                           int dtw, int N, int C, float eps) {
    int lane = threadIdx.x & 31;
    i64 row = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= N) return;
    i64 base = row * C;
    float s = 0.f;
    for (int c = lane; c < C; c += 32) {
        float x = ldf(inp, dti, base + c);
        s += x * x;
    }
    float r = 1.f / sqrtf(warp_sum(s) / C + eps);
    for (int c = lane; c < C; c += 32) stf(out, dto, base + c, ldf(inp, dti, base + c) * r * ldf(w, dtw, c));
    if (lane == 0) rstd[row] = r;
}

// rmsnorm_forward_{f32,bf16,f16}: rmsnorm_forward with every float operand
// of one dtype, C a multiple of VN and the pointers 16-byte aligned.
template <int DT>
__device__ __forceinline__ void rms_fwd_t(void* out, float* rstd, const void* inp, const void* w, int N, int C, float eps) {
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
        for (int j = 0; j < W; j++) s += x[j] * x[j];
    }
    float r = 1.f / sqrtf(warp_sum(s) / C + eps);
    for (int k = lane; k < nv; k += 32) {
        float x[W], wk[W];
        ldv_cs<DT>(inp, base + k * W, x);
        ldv<DT>(w, k * W, wk);
#pragma unroll
        for (int j = 0; j < W; j++) x[j] = x[j] * r * wk[j];
        stv<DT>(out, base + k * W, x);
    }
    if (lane == 0) rstd[row] = r;
}
INSTANTIATE3(rmsnorm_forward, rms_fwd_t,
             (void* out, float* rstd, const void* inp, const void* w, int N, int C, float eps),
             (out, rstd, inp, w, N, C, eps))

// rmsnorm_backward: dinp(N,C) += (w·dout - n·mean(w·dout·n))·rstd with
// n = inp·rstd; one warp per row.
extern "C" __global__ void rmsnorm_backward(void* dinp, int dtdi, const void* dout, int dto, const void* inp, int dti,
                                            const void* w, int dtw, const float* rstd, int N, int C) {
    int lane = threadIdx.x & 31;
    i64 row = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= N) return;
    i64 base = row * C;
    float r = rstd[row], dot = 0.f;
    for (int c = lane; c < C; c += 32)
        dot += ldf(w, dtw, c) * ldf(dout, dto, base + c) * (ldf(inp, dti, base + c) * r);
    dot = warp_sum(dot) / C;
    for (int c = lane; c < C; c += 32) {
        float x = ldf(inp, dti, base + c);
        float d = (ldf(w, dtw, c) * ldf(dout, dto, base + c) - x * r * dot) * r;
        stf(dinp, dtdi, base + c, ldf(dinp, dtdi, base + c) + d);
    }
}

// rmsnorm_backward_{f32,bf16,f16}: rmsnorm_backward typed as rmsnorm_forward_*.
template <int DT>
__device__ __forceinline__ void rms_bwd_t(void* dinp, const void* dout, const void* inp, const void* w, const float* rstd,
                                          int N, int C) {
    constexpr int W = VN<DT>::n;
    int lane = threadIdx.x & 31, nv = C / W;
    i64 row = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= N) return;
    i64 base = row * C;
    float r = rstd[row], dot = 0.f;
    for (int k = lane; k < nv; k += 32) {
        float x[W], g[W], wk[W];
        ldv<DT>(inp, base + k * W, x);
        ldv<DT>(dout, base + k * W, g);
        ldv<DT>(w, k * W, wk);
#pragma unroll
        for (int j = 0; j < W; j++) dot += wk[j] * g[j] * (x[j] * r);
    }
    dot = warp_sum(dot) / C;
    for (int k = lane; k < nv; k += 32) {
        float x[W], g[W], wk[W], d[W];
        ldv<DT>(inp, base + k * W, x);
        ldv<DT>(dout, base + k * W, g);
        ldv<DT>(w, k * W, wk);
        ldv_cs<DT>(dinp, base + k * W, d);
#pragma unroll
        for (int j = 0; j < W; j++) d[j] += (wk[j] * g[j] - x[j] * r * dot) * r;
        stv<DT>(dinp, base + k * W, d);
    }
}
INSTANTIATE3(rmsnorm_backward, rms_bwd_t,
             (void* dinp, const void* dout, const void* inp, const void* w, const float* rstd, int N, int C),
             (dinp, dout, inp, w, rstd, N, C))

// rms_part: the weight gradient of a chunk of rows, the deterministic first
// half of dw += Σ_rows dout·inp·rstd: part[y·C + c] = Σ dout·inp·rstd over
// rows [y·rpc, min((y+1)·rpc, N)), y = blockIdx.y. blockDim (32, 8); block x
// covers 32 columns (DT 0: dtypes dto, dti at run time) or 32 vectors of
// VN<DT> columns (typed: C a multiple of VN, pointers 16-byte aligned);
// each warp takes every 8th row of the chunk.
template <int DT>
__device__ __forceinline__ void rms_part(float* part, const void* dout, int dto, const void* inp, int dti,
                                         const float* rstd, int N, int C, int rpc) {
    constexpr int W = DT == 0 ? 1 : VN<DT>::n;
    __shared__ float sw[8][W][33];
    int x = threadIdx.x, y = threadIdx.y;
    int cv = blockIdx.x * 32 + x;  // column (vector)
    int r0 = blockIdx.y * rpc, r1 = min(r0 + rpc, N);
    float aw[W];
#pragma unroll
    for (int j = 0; j < W; j++) aw[j] = 0.f;
    if (cv < C / W) {
        for (int r = r0 + y; r < r1; r += 8) {
            float g[W], xi[W];
            i64 o = (i64)r * C + (i64)cv * W;
            if constexpr (DT == 0) {
                g[0] = ldf(dout, dto, o);
                xi[0] = ldf(inp, dti, o);
            } else {
                ldv<DT>(dout, o, g);
                ldv<DT>(inp, o, xi);
            }
            float rs = rstd[r];
#pragma unroll
            for (int j = 0; j < W; j++) aw[j] += g[j] * (xi[j] * rs);
        }
    }
#pragma unroll
    for (int j = 0; j < W; j++) sw[y][j][x] = aw[j];
    __syncthreads();
    for (int i = y * 32 + x; i < 32 * W; i += 256) {
        int j = i / 32, xx = i % 32;
        int c = (blockIdx.x * 32 + xx) * W + j;
        if (c < C) {
            float t = 0.f;
#pragma unroll
            for (int k = 0; k < 8; k++) t += sw[k][j][xx];
            part[(i64)blockIdx.y * C + c] = t;
        }
    }
}

extern "C" __global__ void rmsnorm_dw_partial(float* part, const void* dout, int dto, const void* inp, int dti,
                                              const float* rstd, int N, int C, int rpc) {
    rms_part<0>(part, dout, dto, inp, dti, rstd, N, C, rpc);
}
template <int DT>
__device__ __forceinline__ void rms_part_t(float* part, const void* dout, const void* inp, const float* rstd, int N, int C,
                                           int rpc) {
    rms_part<DT>(part, dout, 0, inp, 0, rstd, N, C, rpc);
}
INSTANTIATE3(rmsnorm_dw_partial, rms_part_t,
             (float* part, const void* dout, const void* inp, const float* rstd, int N, int C, int rpc),
             (part, dout, inp, rstd, N, C, rpc))

// rmsnorm_dw_final: dw[c] += Σ_y part[y·C + c] over the R chunks of
// rmsnorm_dw_partial, in a fixed order. blockDim (32, 32); block x covers
// 32 columns.
extern "C" __global__ void __launch_bounds__(1024)
    rmsnorm_dw_final(void* dw, int dtw, const float* part, int R, int C) {
    __shared__ float sw[32][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    float t = 0.f;
    if (c < C)
        for (int k = threadIdx.y; k < R; k += 32) t += part[(i64)k * C + c];
    sw[threadIdx.y][threadIdx.x] = t;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        t = 0.f;
        for (int k = 0; k < 32; k++) t += sw[k][threadIdx.x];
        stf(dw, dtw, c, ldf(dw, dtw, c) + t);
    }
}

// ---- RoPE over qkv(B,T,(NH+2·NKV)·hs): the first nrot = NH+NKV heads of a
// token (queries, keys) rotate by its position t = row mod T, element i of
// a head pairing with i+hs/2 (rotate_half); the value heads pass through.
// table(T,hs) float32: row t is cos then sin of the hs/2 angles.
//
// mode 0: out = R·inp; 1: out = Rᵀ·inp; 2: out += Rᵀ·inp. A thread owns a
// pair (i, i+hs/2) of one head of one token, reading both before writing,
// so out may be inp (modes 0 and 1). Heads at and past nh of a row are left
// alone (nh = nrot skips the value heads when out is inp, nh = NH+2·NKV
// otherwise).
template <int DT>
__device__ __forceinline__ void rope_k(void* out, int dto, const void* inp, int dti, const float* tab, int B, int T,
                                       int NH, int NKV, int hs, int nh, int mode) {
    const int half = hs / 2, nrot = NH + NKV;
    const i64 W = (i64)(NH + 2 * NKV) * hs, n = (i64)B * T * nh * half;
    GRID_STRIDE(i, n) {
        const i64 rh = i / half, row = rh / nh;
        const int j = (int)(i - rh * half), hd = (int)(rh - row * nh), t = (int)(row % T);
        const i64 e = row * W + (i64)hd * hs + j;
        float a = ldx<DT>(inp, dti, e), b = ldx<DT>(inp, dti, e + half);
        if (hd < nrot) {
            const float c = tab[(i64)t * hs + j];
            const float s = mode == 0 ? tab[(i64)t * hs + half + j] : -tab[(i64)t * hs + half + j];
            const float ra = a * c - b * s, rb = b * c + a * s;
            a = ra;
            b = rb;
        }
        if (mode == 2) {
            a += ldx<DT>(out, dto, e);
            b += ldx<DT>(out, dto, e + half);
        }
        stx<DT>(out, dto, e, a);
        stx<DT>(out, dto, e + half, b);
    }
}

extern "C" __global__ void rope_forward(void* out, int dto, const void* inp, int dti, const float* tab, int B, int T, int NH,
                                        int NKV, int hs, int nh, int mode) {
    rope_k<0>(out, dto, inp, dti, tab, B, T, NH, NKV, hs, nh, mode);
}
// rope_forward_{f32,bf16,f16}: rope_forward with out and inp of one dtype.
template <int DT>
__device__ __forceinline__ void rope_t(void* out, const void* inp, const float* tab, int B, int T, int NH, int NKV, int hs,
                                       int nh, int mode) {
    rope_k<DT>(out, 0, inp, 0, tab, B, T, NH, NKV, hs, nh, mode);
}
INSTANTIATE3(rope_forward, rope_t,
             (void* out, const void* inp, const float* tab, int B, int T, int NH, int NKV, int hs, int nh, int mode),
             (out, inp, tab, B, T, NH, NKV, hs, nh, mode))

// ---- SwiGLU: out = silu(gate)·up, silu(g) = g·σ(g).

// swiglu_sig is σ(g) = 1/(1+e^-g) (0 for g below about -88, where e^-g is inf).
__device__ __forceinline__ float swiglu_sig(float g) { return 1.f / (1.f + expf(-g)); }

extern "C" __global__ void swiglu_forward(void* out, int dto, const void* gate, int dtg, const void* up, int dtu, i64 n) {
    GRID_STRIDE(i, n) {
        float g = ldf(gate, dtg, i);
        stf(out, dto, i, g * swiglu_sig(g) * ldf(up, dtu, i));
    }
}

// swiglu_backward: dgate += dout·up·σ(g)·(1 + g·(1-σ(g))), dup += dout·silu(g).
extern "C" __global__ void swiglu_backward(void* dgate, int dtdg, void* dup, int dtdu, const void* dout, int dto,
                                           const void* gate, int dtg, const void* up, int dtu, i64 n) {
    GRID_STRIDE(i, n) {
        float g = ldf(gate, dtg, i), u = ldf(up, dtu, i), dy = ldf(dout, dto, i);
        float s = swiglu_sig(g);
        stf(dgate, dtdg, i, ldf(dgate, dtdg, i) + dy * u * (s * (1.f + g * (1.f - s))));
        stf(dup, dtdu, i, ldf(dup, dtdu, i) + dy * (g * s));
    }
}

// swiglu_forward_{f32,bf16,f16} and swiglu_backward_{f32,bf16,f16}: the
// same with every operand of one dtype and all equally aligned modulo 16
// bytes; 16-byte accesses, grid-stride.
template <int DT> __device__ __forceinline__ void swiglu_fwd_t(void* out, const void* gate, const void* up, i64 n) {
#define SF_VEC(i)                                                                                \
    {                                                                                            \
        float g_[VN<DT>::n], u_[VN<DT>::n];                                                      \
        ldv_cs<DT>(gate, i, g_);                                                                 \
        ldv_cs<DT>(up, i, u_);                                                                   \
        _Pragma("unroll") for (int j = 0; j < VN<DT>::n; j++) g_[j] = g_[j] * swiglu_sig(g_[j]) * u_[j]; \
        stv<DT>(out, i, g_);                                                                     \
    }
#define SF_ONE(i)                                                   \
    {                                                               \
        float g_ = ldx<DT>(gate, 0, i);                             \
        stx<DT>(out, 0, i, g_ * swiglu_sig(g_) * ldx<DT>(up, 0, i)); \
    }
    EW_LOOP(DT, gate, n, SF_VEC, SF_ONE);
#undef SF_VEC
#undef SF_ONE
}
INSTANTIATE3(swiglu_forward, swiglu_fwd_t, (void* out, const void* gate, const void* up, i64 n), (out, gate, up, n))

__device__ __forceinline__ void swiglu_grad(float g, float u, float dy, float& dg, float& du) {
    float s = swiglu_sig(g);
    dg += dy * u * (s * (1.f + g * (1.f - s)));
    du += dy * (g * s);
}

template <int DT>
__device__ __forceinline__ void swiglu_bwd_t(void* dgate, void* dup, const void* dout, const void* gate, const void* up,
                                             i64 n) {
#define SB_VEC(i)                                                                                        \
    {                                                                                                    \
        float g_[VN<DT>::n], u_[VN<DT>::n], y_[VN<DT>::n], dg_[VN<DT>::n], du_[VN<DT>::n];               \
        ldv_cs<DT>(gate, i, g_);                                                                         \
        ldv_cs<DT>(up, i, u_);                                                                           \
        ldv_cs<DT>(dout, i, y_);                                                                         \
        ldv_cs<DT>(dgate, i, dg_);                                                                       \
        ldv_cs<DT>(dup, i, du_);                                                                         \
        _Pragma("unroll") for (int j = 0; j < VN<DT>::n; j++) swiglu_grad(g_[j], u_[j], y_[j], dg_[j], du_[j]); \
        stv<DT>(dgate, i, dg_);                                                                          \
        stv<DT>(dup, i, du_);                                                                            \
    }
#define SB_ONE(i)                                                                                  \
    {                                                                                              \
        float dg_ = ldx<DT>(dgate, 0, i), du_ = ldx<DT>(dup, 0, i);                                \
        swiglu_grad(ldx<DT>(gate, 0, i), ldx<DT>(up, 0, i), ldx<DT>(dout, 0, i), dg_, du_);        \
        stx<DT>(dgate, 0, i, dg_);                                                                 \
        stx<DT>(dup, 0, i, du_);                                                                   \
    }
    EW_LOOP(DT, gate, n, SB_VEC, SB_ONE);
#undef SB_VEC
#undef SB_ONE
}
INSTANTIATE3(swiglu_backward, swiglu_bwd_t,
             (void* dgate, void* dup, const void* dout, const void* gate, const void* up, i64 n),
             (dgate, dup, dout, gate, up, n))
