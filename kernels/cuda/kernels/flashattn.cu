// flashattn: causal attention forward on the tensor cores for bf16 with
// head size 64 or 128 (see attention.go): flash-attention style, one block
// of 4 warps per 64 query rows of one (batch, head), each warp owning 16
// rows. Keys and values stream through shared memory 64 at a time; scores
// S = Q·Kᵀ and the output O += P·V are mma.sync m16n8k16 bf16 products with
// float32 accumulation, the softmax runs online in registers (base 2), and
// only out(B,T,C) and lse(B,NH,T) (natural log) are written.
//
// Fragment layouts of mma.m16n8k16 (PTX ISA), g = lane/4, c = lane%4:
//   A (16x16, row-major), 4 registers of 2 bf16: a0 (row g, cols 2c,2c+1),
//     a1 (row g+8, same cols), a2 (row g, cols 2c+8,2c+9), a3 (row g+8, cols 2c+8,2c+9);
//   B (16x8, k x n), 2 registers: b0 (k 2c,2c+1, col n=g), b1 (k 2c+8,2c+9, col g);
//   C/D (16x8 f32): d0,d1 (row g, cols 2c,2c+1), d2,d3 (row g+8, cols 2c,2c+1).
// The lower half of a register holds the element of the lower index.
#include "common.cuh"

#define FA_BQ 64  // query rows per block: 16 per warp
#define FA_BK 64  // keys per shared-memory tile
#define FA_THREADS 128
#define FA_LN2 0.6931471805599453f

// fa_pack rounds lo and hi to bf16 and packs them, lo in the lower half.
__device__ __forceinline__ uint32_t fa_pack(float lo, float hi) {
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(lo)) |
           ((uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(hi)) << 16);
}

// fa_ld32 loads the bf16 pair at p (4-byte aligned).
__device__ __forceinline__ uint32_t fa_ld32(const uint16_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

// fa_mma: d(16x8) += a(16x16)·b(16x8).
__device__ __forceinline__ void fa_mma(float* d, const uint32_t* a, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// flash_fwd computes the block's 64 query rows. Ks is the key tile,
// row-major with row stride HS+8; Vt the value tile transposed (head dim
// major) with row stride FA_BK+8, so that both B operands are pairs of
// consecutive elements (the padding spreads the rows over the banks).
// qkv must be 16-byte aligned and out 4-byte aligned (checked by the host).
// Elements are handled as their bf16 bit patterns (uint16_t).
template <int HS>
__device__ __forceinline__ void flash_fwd(uint16_t* __restrict__ out, float* __restrict__ lse,
                                          const uint16_t* __restrict__ qkv, int T, int C, int NH, float scale_log2,
                                          uint16_t* Ks, uint16_t* Vt) {
    constexpr int KS = HS + 8, VS = FA_BK + 8, KD = HS / 16, ND = HS / 8, NK = FA_BK / 8;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    const int z = blockIdx.y, b = z / NH, h = z - b * NH;
    // The last query blocks have the most keys: start them first.
    const int q0 = (gridDim.x - 1 - blockIdx.x) * FA_BQ;
    const i64 C3 = 3LL * C;
    const uint16_t* base = qkv + (i64)b * T * C3 + (i64)h * HS;  // q of token 0 of this head
    const int w0 = q0 + warp * 16;                                       // first row of this warp
    const int r0 = w0 + g, r1 = r0 + 8;

    uint32_t qf[KD][4];
#pragma unroll
    for (int kk = 0; kk < KD; kk++) {
        const int d = kk * 16 + 2 * c;
        qf[kk][0] = r0 < T ? fa_ld32(base + (i64)r0 * C3 + d) : 0u;
        qf[kk][1] = r1 < T ? fa_ld32(base + (i64)r1 * C3 + d) : 0u;
        qf[kk][2] = r0 < T ? fa_ld32(base + (i64)r0 * C3 + d + 8) : 0u;
        qf[kk][3] = r1 < T ? fa_ld32(base + (i64)r1 * C3 + d + 8) : 0u;
    }
    float o[ND][4];
#pragma unroll
    for (int j = 0; j < ND; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    const int qlast = min(q0 + FA_BQ, T) - 1;  // the block's last valid row
    const bool active = w0 < T;                // the warp has a valid row

    for (int k0 = 0; k0 <= qlast; k0 += FA_BK) {
        __syncthreads();  // every warp is done with the previous tile
        // Keys past T are zero: masked, and never NaN times 0. Each thread
        // moves 8 consecutive elements of one key; for K the head dimension
        // varies fastest across threads (coalesced loads, 16-byte stores),
        // for V the key (the transposed 2-byte stores of a warp then fall on
        // consecutive addresses instead of one bank).
        for (int i = tid; i < FA_BK * (HS / 8); i += FA_THREADS) {
            const int kr = i / (HS / 8), d = (i - kr * (HS / 8)) * 8, key = k0 + kr;
            uint4 kv = make_uint4(0u, 0u, 0u, 0u);
            if (key < T) kv = *reinterpret_cast<const uint4*>(base + (i64)key * C3 + C + d);
            *reinterpret_cast<uint4*>(Ks + kr * KS + d) = kv;
        }
        for (int i = tid; i < FA_BK * (HS / 8); i += FA_THREADS) {
            const int kr = i % FA_BK, d = (i / FA_BK) * 8, key = k0 + kr;
            uint4 vv = make_uint4(0u, 0u, 0u, 0u);
            if (key < T) vv = *reinterpret_cast<const uint4*>(base + (i64)key * C3 + 2 * C + d);
            const uint32_t vw[4] = {vv.x, vv.y, vv.z, vv.w};  // element u is half u%2 of word u/2
#pragma unroll
            for (int u = 0; u < 8; u++) Vt[(d + u) * VS + kr] = (uint16_t)(vw[u >> 1] >> (16 * (u & 1)));
        }
        __syncthreads();
        if (!active || k0 > w0 + 15) continue;  // no row of this warp sees these keys

        // S (16 rows x 64 keys) in base-2 units, causally masked.
        float s[NK][4];
#pragma unroll
        for (int j = 0; j < NK; j++) {
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
            const uint16_t* kp = Ks + (j * 8 + g) * KS + 2 * c;
#pragma unroll
            for (int kk = 0; kk < KD; kk++) fa_mma(s[j], qf[kk], fa_ld32(kp + kk * 16), fa_ld32(kp + kk * 16 + 8));
        }
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int j = 0; j < NK; j++) {
            const int key = k0 + j * 8 + 2 * c;
            s[j][0] = key <= r0 ? s[j][0] * scale_log2 : -INFINITY;
            s[j][1] = key + 1 <= r0 ? s[j][1] * scale_log2 : -INFINITY;
            s[j][2] = key <= r1 ? s[j][2] * scale_log2 : -INFINITY;
            s[j][3] = key + 1 <= r1 ? s[j][3] * scale_log2 : -INFINITY;
            mx0 = fmaxf(mx0, fmaxf(s[j][0], s[j][1]));
            mx1 = fmaxf(mx1, fmaxf(s[j][2], s[j][3]));
        }
        // The four lanes of a quad hold one row between them.
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
        // Key 0 is in the first tile and visible to every row, so n0 and n1
        // are finite from then on; the guards only keep -inf - -inf out.
        const float b0 = n0 == -INFINITY ? 0.f : n0, b1 = n1 == -INFINITY ? 0.f : n1;
        const float f0 = exp2f(m0 - b0), f1 = exp2f(m1 - b1);  // 0 while m is -inf
        m0 = n0;
        m1 = n1;
        float ps0 = 0.f, ps1 = 0.f;
#pragma unroll
        for (int j = 0; j < NK; j++) {
            s[j][0] = exp2f(s[j][0] - b0);
            s[j][1] = exp2f(s[j][1] - b0);
            s[j][2] = exp2f(s[j][2] - b1);
            s[j][3] = exp2f(s[j][3] - b1);
            ps0 += s[j][0] + s[j][1];
            ps1 += s[j][2] + s[j][3];
        }
        l0 = l0 * f0 + ps0;
        l1 = l1 * f1 + ps1;
#pragma unroll
        for (int j = 0; j < ND; j++) {
            o[j][0] *= f0;
            o[j][1] *= f0;
            o[j][2] *= f1;
            o[j][3] *= f1;
        }
        // O += P·V: P's accumulator layout is the A layout of the next product.
#pragma unroll
        for (int kk = 0; kk < FA_BK / 16; kk++) {
            uint32_t pa[4];
            pa[0] = fa_pack(s[2 * kk][0], s[2 * kk][1]);
            pa[1] = fa_pack(s[2 * kk][2], s[2 * kk][3]);
            pa[2] = fa_pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            pa[3] = fa_pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
            const uint16_t* vp = Vt + g * VS + kk * 16 + 2 * c;
#pragma unroll
            for (int j = 0; j < ND; j++) fa_mma(o[j], pa, fa_ld32(vp + j * 8 * VS), fa_ld32(vp + j * 8 * VS + 8));
        }
    }
    if (!active) return;
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    uint16_t* ob = out + (i64)b * T * C + (i64)h * HS + 2 * c;
    if (r0 < T) {
        const float inv = 1.f / l0;
#pragma unroll
        for (int j = 0; j < ND; j++)
            *reinterpret_cast<uint32_t*>(ob + (i64)r0 * C + j * 8) = fa_pack(o[j][0] * inv, o[j][1] * inv);
        if (c == 0) lse[(i64)z * T + r0] = (m0 + log2f(l0)) * FA_LN2;
    }
    if (r1 < T) {
        const float inv = 1.f / l1;
#pragma unroll
        for (int j = 0; j < ND; j++)
            *reinterpret_cast<uint32_t*>(ob + (i64)r1 * C + j * 8) = fa_pack(o[j][2] * inv, o[j][3] * inv);
        if (c == 0) lse[(i64)z * T + r1] = (m1 + log2f(l1)) * FA_LN2;
    }
}

// flash_fwd_bf16_hs64 and _hs128: out(B,T,C) and lse(B,NH,T) from
// qkv(B,T,3C), all bf16 but lse, C = NH·hs. Grid (ceil(T/64), B·NH),
// 128 threads. scale_log2 is log2(e)/sqrt(hs).
extern "C" __global__ void __launch_bounds__(FA_THREADS)
    flash_fwd_bf16_hs64(void* out, float* lse, const void* qkv, int T, int C, int NH, float scale_log2) {
    __shared__ __align__(16) uint16_t Ks[FA_BK * (64 + 8)];
    __shared__ __align__(16) uint16_t Vt[64 * (FA_BK + 8)];
    flash_fwd<64>((uint16_t*)out, lse, (const uint16_t*)qkv, T, C, NH, scale_log2, Ks, Vt);
}

extern "C" __global__ void __launch_bounds__(FA_THREADS)
    flash_fwd_bf16_hs128(void* out, float* lse, const void* qkv, int T, int C, int NH, float scale_log2) {
    __shared__ __align__(16) uint16_t Ks[FA_BK * (128 + 8)];
    __shared__ __align__(16) uint16_t Vt[128 * (FA_BK + 8)];
    flash_fwd<128>((uint16_t*)out, lse, (const uint16_t*)qkv, T, C, NH, scale_log2, Ks, Vt);
}
