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
