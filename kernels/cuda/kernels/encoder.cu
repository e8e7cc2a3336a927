// encoder: token + position embeddings, forward and backward (accumulating).
#include "common.cuh"

// encoder_forward: out(B,T,C) = wte[tokens[b,t]] + wpe[t]. A token outside
// [0,V) yields NaN so that the mistake shows.
extern "C" __global__ void encoder_forward(void* out, int dto, const int* tokens, const void* wte, int dtw,
                                           const void* wpe, int dtp, int B, int T, int C, int V) {
    i64 n = (i64)B * T * C;
    GRID_STRIDE(i, n) {
        i64 bt = i / C;
        int c = (int)(i - bt * C);
        int t = (int)(bt % T);
        int tok = tokens[bt];
        float v = (tok < 0 || tok >= V) ? NAN : ldf(wte, dtw, (i64)tok * C + c) + ldf(wpe, dtp, (i64)t * C + c);
        stf(out, dto, i, v);
    }
}

// encoder_backward_wpe: dwpe[t,c] += sum_b dout[b,t,c]; one thread per (t,c).
extern "C" __global__ void encoder_backward_wpe(void* dwpe, int dtp, const void* dout, int dto, int B, int T, int C) {
    i64 n = (i64)T * C;
    GRID_STRIDE(i, n) {
        float s = 0.f;
        for (int b = 0; b < B; b++) s += ldf(dout, dto, (i64)b * T * C + i);
        stf(dwpe, dtp, i, ldf(dwpe, dtp, i) + s);
    }
}

// encoder_backward: dwte[tok] += sum of dout over the positions holding tok.
// One block per position; only the block of a token's first occurrence does
// the work, summing the matching rows in position order (deterministic, no
// atomics, one rounding per element). blockDim.x is a multiple of 32.
#define ENC_LIST 1024
extern "C" __global__ void encoder_backward(void* dwte, int dtw, const void* dout, int dto, const int* tokens,
                                            int BT, int C, int V) {
    __shared__ int list[ENC_LIST];
    __shared__ int cnt, nextj;
    int i = blockIdx.x;
    int tok = tokens[i];
    if (tok < 0 || tok >= V) return;
    int found = 0;
    for (int j = threadIdx.x; j < i; j += blockDim.x)
        if (tokens[j] == tok) { found = 1; break; }
    if (__syncthreads_or(found)) return;
    for (int c0 = 0; c0 < C; c0 += blockDim.x) {
        int c = c0 + threadIdx.x;
        float acc = 0.f;
        int j0 = i;
        while (j0 < BT) {
            if (threadIdx.x < 32) {
                int lane = threadIdx.x, n = 0, j = j0;
                for (; j < BT && n <= ENC_LIST - 32; j += 32) {
                    int jj = j + lane;
                    bool m = jj < BT && tokens[jj] == tok;
                    unsigned bal = __ballot_sync(0xffffffffu, m);
                    if (m) list[n + __popc(bal & ((1u << lane) - 1u))] = jj;
                    n += __popc(bal);
                }
                if (lane == 0) { cnt = n; nextj = j; }
            }
            __syncthreads();
            if (c < C)
                for (int k = 0; k < cnt; k++) acc += ldf(dout, dto, (i64)list[k] * C + c);
            j0 = nextj;
            __syncthreads();
        }
        if (c < C) {
            i64 o = (i64)tok * C + c;
            stf(dwte, dtw, o, ldf(dwte, dtw, o) + acc);
        }
    }
}

// ---- Typed and bucketed kernels ----

// encoder_forward_{f32,bf16,f16}: encoder_forward with out, wte, wpe of one
// dtype, C a multiple of VN and the three 16-byte aligned; one 16-byte
// vector per thread and step, grid-stride.
template <int DT> __device__ __forceinline__ void enc_fwd_t(void* out, const int* tokens, const void* wte, const void* wpe,
                                                           int B, int T, int C, int V) {
    constexpr int W = VN<DT>::n;
    int nv = C / W;
    i64 n = (i64)B * T * nv;
    GRID_STRIDE(i, n) {
        i64 bt = i / nv;
        int k = (int)(i - bt * nv);
        int t = (int)(bt % T);
        int tok = tokens[bt];
        float o[W];
        if (tok < 0 || tok >= V) {
#pragma unroll
            for (int j = 0; j < W; j++) o[j] = NAN;
        } else {
            float p[W];
            ldv<DT>(wte, (i64)tok * C + k * W, o);
            ldv<DT>(wpe, (i64)t * C + k * W, p);
#pragma unroll
            for (int j = 0; j < W; j++) o[j] += p[j];
        }
        stv<DT>(out, bt * C + k * W, o);
    }
}
INSTANTIATE3(encoder_forward, enc_fwd_t,
             (void* out, const int* tokens, const void* wte, const void* wpe, int B, int T, int C, int V),
             (out, tokens, wte, wpe, B, T, C, V))

// encoder_backward_wpe_{f32,bf16,f16}: encoder_backward_wpe with dwpe, dout
// of one dtype, T*C a multiple of VN and both 16-byte aligned; one vector
// per thread and step, grid-stride.
template <int DT> __device__ __forceinline__ void enc_wpe_t(void* dwpe, const void* dout, int B, int T, int C) {
    constexpr int W = VN<DT>::n;
    i64 tc = (i64)T * C, n = tc / W;
    GRID_STRIDE(k, n) {
        float s[W], d[W];
#pragma unroll
        for (int j = 0; j < W; j++) s[j] = 0.f;
        for (int b = 0; b < B; b++) {
            float f[W];
            ldv_cs<DT>(dout, b * tc + k * W, f);
#pragma unroll
            for (int j = 0; j < W; j++) s[j] += f[j];
        }
        ldv<DT>(dwpe, k * W, d);
#pragma unroll
        for (int j = 0; j < W; j++) d[j] += s[j];
        stv<DT>(dwpe, k * W, d);
    }
}
INSTANTIATE3(encoder_backward_wpe, enc_wpe_t, (void* dwpe, const void* dout, int B, int T, int C), (dwpe, dout, B, T, C))

// dwte by buckets, in four launches over int scratch cnt(V), off(V),
// fill(V), pos(BT), with cnt zeroed and pos set to -1 beforehand:
//   encoder_bwd_count   cnt[tok] = occurrences of tok (grid-stride over BT)
//   encoder_bwd_scan    off = fill = exclusive prefix sum of cnt (one block of 1024)
//   encoder_bwd_place   pos[off[tok] ..) = the positions holding tok, in any order
//   encoder_bwd_sum*    one block per slot of pos; the block at the first slot
//                       of a bucket sorts the bucket's positions and adds their
//                       dout rows, in position order, to dwte[tok] (one
//                       rounding per element; deterministic, no float atomics).
// Tokens outside [0,V) are skipped.

extern "C" __global__ void encoder_bwd_count(int* cnt, const int* tokens, int BT, int V) {
    GRID_STRIDE(i, BT) {
        int tok = tokens[i];
        if (tok >= 0 && tok < V) atomicAdd(&cnt[tok], 1);
    }
}

extern "C" __global__ void __launch_bounds__(1024) encoder_bwd_scan(int* off, int* fill, const int* cnt, int V) {
    __shared__ int sh[1024];
    int per = (V + blockDim.x - 1) / blockDim.x;
    int lo = min((int)threadIdx.x * per, V), hi = min(lo + per, V);
    int s = 0;
    for (int v = lo; v < hi; v++) s += cnt[v];
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int o = 1; o < blockDim.x; o <<= 1) {
        int t = threadIdx.x >= o ? sh[threadIdx.x - o] : 0;
        __syncthreads();
        sh[threadIdx.x] += t;
        __syncthreads();
    }
    int run = sh[threadIdx.x] - s;
    for (int v = lo; v < hi; v++) {
        int c = cnt[v];
        off[v] = run;
        fill[v] = run;
        run += c;
    }
}

extern "C" __global__ void encoder_bwd_place(int* pos, int* fill, const int* tokens, int BT, int V) {
    GRID_STRIDE(i, BT) {
        int tok = tokens[i];
        if (tok >= 0 && tok < V) pos[atomicAdd(&fill[tok], 1)] = (int)i;
    }
}

// W consecutive elements at element index i: scalar (W 1, dtype DT or, for
// DT 0, dt) or one 16-byte vector.
template <int DT, int W> __device__ __forceinline__ void enc_ld(const void* p, int dt, i64 i, float* f) {
    if constexpr (W == 1) f[0] = ldx<DT>(p, dt, i);
    else ldv<DT>(p, i, f);
}
template <int DT, int W> __device__ __forceinline__ void enc_st(void* p, int dt, i64 i, const float* f) {
    if constexpr (W == 1) stx<DT>(p, dt, i, f[0]);
    else stv<DT>(p, i, f);
}

#define ENC_SORT 1024
template <int DT, int W>
__device__ __forceinline__ void enc_sum_t(void* dwte, int dtw, const void* dout, int dto, const int* tokens, const int* pos,
                                          const int* off, const int* cnt, int BT, int C) {
    __shared__ int sp[ENC_SORT], ss[ENC_SORT];
    __shared__ int nlist, nextj;
    int i = blockIdx.x;
    int p = pos[i];
    if (p < 0) return;
    int tok = tokens[p];
    if (off[tok] != i) return;  // not the first slot of its bucket
    int k = cnt[tok], nv = C / W;
    i64 orow = (i64)tok * C;
    if (k <= ENC_SORT) {
        for (int e = threadIdx.x; e < k; e += blockDim.x) sp[e] = pos[i + e];
        __syncthreads();
        for (int e = threadIdx.x; e < k; e += blockDim.x) {
            int me = sp[e], r = 0;
            for (int f = 0; f < k; f++) r += sp[f] < me;
            ss[r] = me;
        }
        __syncthreads();
        for (int cv = threadIdx.x; cv < nv; cv += blockDim.x) {
            float acc[W], d[W];
#pragma unroll
            for (int j = 0; j < W; j++) acc[j] = 0.f;
            for (int q = 0; q < k; q++) {
                float f[W];
                enc_ld<DT, W>(dout, dto, (i64)ss[q] * C + (i64)cv * W, f);
#pragma unroll
                for (int j = 0; j < W; j++) acc[j] += f[j];
            }
            enc_ld<DT, W>(dwte, dtw, orow + (i64)cv * W, d);
#pragma unroll
            for (int j = 0; j < W; j++) d[j] += acc[j];
            enc_st<DT, W>(dwte, dtw, orow + (i64)cv * W, d);
        }
        return;
    }
    // A bucket too large to sort: collect its positions in order by scanning
    // all tokens (warp 0, ENC_SORT at a time), for each chunk of columns.
    for (int c0 = 0; c0 < nv; c0 += blockDim.x) {
        int cv = c0 + threadIdx.x;
        float acc[W];
#pragma unroll
        for (int j = 0; j < W; j++) acc[j] = 0.f;
        int j0 = 0;
        while (j0 < BT) {
            if (threadIdx.x < 32) {
                int lane = threadIdx.x, n = 0, j = j0;
                for (; j < BT && n <= ENC_SORT - 32; j += 32) {
                    int jj = j + lane;
                    bool m = jj < BT && tokens[jj] == tok;
                    unsigned bal = __ballot_sync(0xffffffffu, m);
                    if (m) ss[n + __popc(bal & ((1u << lane) - 1u))] = jj;
                    n += __popc(bal);
                }
                if (lane == 0) {
                    nlist = n;
                    nextj = j;
                }
            }
            __syncthreads();
            if (cv < nv)
                for (int q = 0; q < nlist; q++) {
                    float f[W];
                    enc_ld<DT, W>(dout, dto, (i64)ss[q] * C + (i64)cv * W, f);
#pragma unroll
                    for (int j = 0; j < W; j++) acc[j] += f[j];
                }
            j0 = nextj;
            __syncthreads();
        }
        if (cv < nv) {
            float d[W];
            enc_ld<DT, W>(dwte, dtw, orow + (i64)cv * W, d);
#pragma unroll
            for (int j = 0; j < W; j++) d[j] += acc[j];
            enc_st<DT, W>(dwte, dtw, orow + (i64)cv * W, d);
        }
    }
}

// encoder_bwd_sum: any dtypes and C, scalar accesses. encoder_bwd_sum_{f32,bf16,f16}:
// dwte and dout of one dtype, C a multiple of VN, both 16-byte aligned. Grid BT,
// blockDim a multiple of 32 (128).
extern "C" __global__ void encoder_bwd_sum(void* dwte, int dtw, const void* dout, int dto, const int* tokens, const int* pos,
                                           const int* off, const int* cnt, int BT, int C) {
    enc_sum_t<0, 1>(dwte, dtw, dout, dto, tokens, pos, off, cnt, BT, C);
}
template <int DT> __device__ __forceinline__ void enc_sum_v(void* dwte, const void* dout, const int* tokens, const int* pos,
                                                           const int* off, const int* cnt, int BT, int C) {
    enc_sum_t<DT, VN<DT>::n>(dwte, 0, dout, 0, tokens, pos, off, cnt, BT, C);
}
INSTANTIATE3(encoder_bwd_sum, enc_sum_v,
             (void* dwte, const void* dout, const int* tokens, const int* pos, const int* off, const int* cnt, int BT, int C),
             (dwte, dout, tokens, pos, off, cnt, BT, C))
