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
