// matmul helpers around cuBLAS: bias broadcast (forward) and bias gradient.
#include "common.cuh"

// matmul_forward_bias: out(BT,OC)[r,c] = bias[c], before a GEMM with beta=1
// so that the bias is added in float32 and the result rounded once.
extern "C" __global__ void matmul_forward_bias(void* out, int dto, const void* bias, int dtb, int BT, int OC) {
    i64 n = (i64)BT * OC;
    GRID_STRIDE(i, n) { stf(out, dto, i, ldf(bias, dtb, i % OC)); }
}

// matmul_backward_bias: dbias[c] += sum_r dout[r,c]; blockDim (32,32).
extern "C" __global__ void matmul_backward_bias(void* dbias, int dtb, const void* dout, int dto, int BT, int OC) {
    __shared__ float sh[32][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    float a = 0.f;
    if (c < OC)
        for (int r = threadIdx.y; r < BT; r += 32) a += ldf(dout, dto, (i64)r * OC + c);
    sh[threadIdx.y][threadIdx.x] = a;
    __syncthreads();
    if (threadIdx.y == 0 && c < OC) {
        float t = 0.f;
        for (int k = 0; k < 32; k++) t += sh[k][threadIdx.x];
        stf(dbias, dtb, c, ldf(dbias, dtb, c) + t);
    }
}
