// matmul helpers around cuBLAS: bias broadcast (forward fallback) and bias gradient.
#include "common.cuh"

// matmul_forward_bias: out(BT,OC)[r,c] = bias[c], before a GEMM with beta=1
// so that the bias is added in float32 and the result rounded once.
extern "C" __global__ void matmul_forward_bias(void* out, int dto, const void* bias, int dtb, int BT, int OC) {
    i64 n = (i64)BT * OC;
    GRID_STRIDE(i, n) { stf(out, dto, i, ldf(bias, dtb, i % OC)); }
}

// The bias gradient dbias[c] += sum_r dout[r,c] takes two deterministic
// passes (biasGrad in matmul.go).
//
// matmul_backward_bias_partial: block (x, y) sums rows [y*rows, (y+1)*rows)
// of dout(BT,OC) for the 32*V columns from x*32*V, V = 16 bytes of dout
// (8 bf16/f16 or 4 f32), into part[y*OC + c] (float32). blockDim (32, 8):
// thread (tx, ty) owns columns x*32*V + tx*V + [0, V) and the slab's rows
// ty, ty+8, ... With vec (dout and OC*size 16-byte aligned) it reads its V
// columns of a row with one 16-byte load, four rows in flight.
#define BIAS_RY 8

// bias_add16 adds the V values of dtype DT packed in v to a[0..V).
template <int DT>
__device__ __forceinline__ void bias_add16(float* a, uint4 v) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        if constexpr (DT == DT_F32) {
            a[k] += __uint_as_float(w[k]);
        } else if constexpr (DT == DT_BF16) {
            a[2 * k] += __uint_as_float(w[k] << 16);
            a[2 * k + 1] += __uint_as_float(w[k] & 0xffff0000u);
        } else {
            a[2 * k] += __half2float(__ushort_as_half((unsigned short)(w[k] & 0xffffu)));
            a[2 * k + 1] += __half2float(__ushort_as_half((unsigned short)(w[k] >> 16)));
        }
    }
}

template <int DT>
__device__ __forceinline__ void bias_partial(float (*sh)[32 * 8], float* part, const void* dout, int BT, int OC, int rows,
                                             int vec) {
    constexpr int V = DT == DT_F32 ? 4 : 8, ES = 16 / V;
    const int c0 = (blockIdx.x * 32 + threadIdx.x) * V;
    const int r0 = blockIdx.y * rows, r1 = min(BT, r0 + rows);
    float a[V];
#pragma unroll
    for (int j = 0; j < V; j++) a[j] = 0.f;
    int r = r0 + threadIdx.y;
    if (vec) {
        if (c0 < OC) {  // OC is a multiple of V
            const i64 step = (i64)BIAS_RY * OC * ES;
            const char* p = (const char*)dout + ((i64)r * OC + c0) * ES;
            for (; r + 3 * BIAS_RY < r1; r += 4 * BIAS_RY, p += 4 * step) {
                const uint4 v0 = __ldg((const uint4*)p), v1 = __ldg((const uint4*)(p + step));
                const uint4 v2 = __ldg((const uint4*)(p + 2 * step)), v3 = __ldg((const uint4*)(p + 3 * step));
                bias_add16<DT>(a, v0);
                bias_add16<DT>(a, v1);
                bias_add16<DT>(a, v2);
                bias_add16<DT>(a, v3);
            }
            for (; r < r1; r += BIAS_RY, p += step) bias_add16<DT>(a, __ldg((const uint4*)p));
        }
    } else {
        for (; r < r1; r += BIAS_RY) {
#pragma unroll
            for (int j = 0; j < V; j++)
                if (c0 + j < OC) a[j] += ldf(dout, DT, (i64)r * OC + c0 + j);
        }
    }
#pragma unroll
    for (int j = 0; j < V; j++) sh[threadIdx.y][threadIdx.x * V + j] = a[j];
    __syncthreads();
    const int t = threadIdx.y * 32 + threadIdx.x, c = blockIdx.x * 32 * V + t;
    if (t < 32 * V && c < OC) {
        float s = 0.f;
#pragma unroll
        for (int y = 0; y < BIAS_RY; y++) s += sh[y][t];
        part[(i64)blockIdx.y * OC + c] = s;
    }
}

extern "C" __global__ void matmul_backward_bias_partial(float* part, const void* dout, int dt, int BT, int OC, int rows,
                                                        int vec) {
    __shared__ float sh[BIAS_RY][32 * 8];
    switch (dt) {
    case DT_BF16: bias_partial<DT_BF16>(sh, part, dout, BT, OC, rows, vec); break;
    case DT_F16: bias_partial<DT_F16>(sh, part, dout, BT, OC, rows, vec); break;
    default: bias_partial<DT_F32>(sh, part, dout, BT, OC, rows, vec);
    }
}

// matmul_backward_bias: dbias[c] += sum_s part[s*OC + c] over the slabs
// of matmul_backward_bias_partial, in a fixed order, rounded once.
// blockDim (32, 32).
extern "C" __global__ void matmul_backward_bias(void* dbias, int dtb, const float* part, int slabs, int OC) {
    __shared__ float sh[32][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    float a = 0.f;
    if (c < OC)
        for (int s = threadIdx.y; s < slabs; s += 32) a += part[(i64)s * OC + c];
    sh[threadIdx.y][threadIdx.x] = a;
    __syncthreads();
    if (threadIdx.y == 0 && c < OC) {
        float t = 0.f;
        for (int k = 0; k < 32; k++) t += sh[k][threadIdx.x];
        stf(dbias, dtb, c, ldf(dbias, dtb, c) + t);
    }
}
