// flashattn: causal attention forward and backward on the tensor cores for
// bf16 with head size 64, 80, 96 or 128 (see flash.go; the two-tile forward
// and the fused backward at 64 and 128 only). Forward: flash-attention style, one block
// of 4 warps per 64 query rows of one (batch, head), each warp owning 16
// rows. Keys and values stream through shared memory 64 at a time; scores
// S = Q·Kᵀ and the output O += P·V are mma.sync m16n8k16 bf16 products with
// float32 accumulation, the softmax runs online in registers (base 2), and
// only out(B,T,C) and lse(B,NH,T) (natural log) are written. Grouped-query
// attention: qkv holds NH query heads, then NKV key and NKV value heads per
// token, query head h reading key/value head h/(NH/NKV) (NKV = NH is
// ordinary multi-head attention).
//
// Fragment layouts of mma.m16n8k16 (PTX ISA), g = lane/4, c = lane%4:
//   A (16x16, row-major), 4 registers of 2 bf16: a0 (row g, cols 2c,2c+1),
//     a1 (row g+8, same cols), a2 (row g, cols 2c+8,2c+9), a3 (row g+8, cols 2c+8,2c+9);
//   B (16x8, k x n), 2 registers: b0 (k 2c,2c+1, col n=g), b1 (k 2c+8,2c+9, col g);
//   C/D (16x8 f32): d0,d1 (row g, cols 2c,2c+1), d2,d3 (row g+8, cols 2c,2c+1).
// The lower half of a register holds the element of the lower index.
#include "flash_common.cuh"

#define FA_BQ 64  // query rows per block: 16 per warp
#define FA_BK 64  // keys per shared-memory tile
#define FA_THREADS 128
#define FA_LN2 0.6931471805599453f
#define FA_LOG2E 1.4426950408889634f
#ifndef FA_FWD_MINB
#define FA_FWD_MINB 2  // blocks per SM the head-size-64 forward is compiled for (4 spills; 2 ran fastest of 2, 3, 4 on the H200)
#endif

// fa_mma: d(16x8) += a(16x16)·b(16x8).
__device__ __forceinline__ void fa_mma(float* d, const uint32_t* a, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// fa_ldsm4 loads four 8x8 b16 matrices from shared memory: lanes 8i..8i+7
// give the row addresses of matrix i (16-byte aligned), register i gets
// matrix i in the mma fragment layout (row lane/4, cols 2(lane%4), +1).
__device__ __forceinline__ void fa_ldsm4(uint32_t* r, const uint16_t* p) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

// fa_ldsm4t is fa_ldsm4 transposed: register i holds, of matrix i, rows
// 2(lane%4) and 2(lane%4)+1 of column lane/4.
__device__ __forceinline__ void fa_ldsm4t(uint32_t* r, const uint16_t* p) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

// fa_ldsm2 is fa_ldsm4 for two matrices: lanes 0..15 give the row
// addresses (lanes 8i..8i+7 those of matrix i), r[0] and r[1] get them.
__device__ __forceinline__ void fa_ldsm2(uint32_t* r, const uint16_t* p) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
}

// fa_cp_rows starts cp.async copies that fill a shared tile of `rows` rows
// (row stride HS+8) from global rows r0.. of stride `stride` elements,
// zero past T (a source size of 0 writes zeros; the row-0 address stands in
// for the source), by a block of NT threads. fa_cp_commit closes the group; fa_cp_wait waits for all
// of this thread's groups, and a __syncthreads after it publishes the tile.
template <int HS, int NT = FA_THREADS>
__device__ __forceinline__ void fa_cp_rows(uint16_t* s, const uint16_t* g, i64 stride, int r0, int rows, int T) {
    for (int i = threadIdx.x; i < rows * (HS / 8); i += NT) {
        const int r = i / (HS / 8), d = (i - r * (HS / 8)) * 8, t = r0 + r;
        const uint32_t dst = (uint32_t)__cvta_generic_to_shared(s + r * (HS + 8) + d);
        const uint16_t* src = t < T ? g + (i64)t * stride + d : g + d;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(t < T ? 16 : 0));
    }
}


// ---- Device code: tools/cuda/emu.sh runs everything from here to the
// entry points on the host (with its own fa_pack, fa_ld32, fa_mma and
// ldmatrix), so it must stay plain C++ apart from those.

// fa_mma_k2 adds to d (16x8) the products over the columns 16kk..16kk+31
// of a head: a[kk]·B(kk) + a[kk+1]·B(kk+1), the B fragments by one
// ldmatrix from p (lanes 8i..8i+7 giving the rows of matrix i, as
// fa_ldsm4). For the last kk of an odd KD (head size 80) only a[kk]·B(kk),
// by fa_ldsm2: at an even KD that branch is never taken.
template <int KD>
__device__ __forceinline__ void fa_mma_k2(float* d, const uint32_t (*a)[4], const uint16_t* p, int kk) {
    uint32_t bk[4];
    if (kk + 1 < KD) {
        fa_ldsm4(bk, p);
        fa_mma(d, a[kk], bk[0], bk[1]);
        fa_mma(d, a[kk + 1], bk[2], bk[3]);
    } else {
        fa_ldsm2(bk, p);
        fa_mma(d, a[kk], bk[0], bk[1]);
    }
}

// fa_ld_rows fills a shared tile of `rows` rows (row stride HS+8) from
// global rows r0.. of stride `stride` elements, zero past T.
template <int HS>
__device__ __forceinline__ void fa_ld_rows(uint16_t* s, const uint16_t* g, i64 stride, int r0, int rows, int T) {
    for (int i = threadIdx.x; i < rows * (HS / 8); i += FA_THREADS) {
        const int r = i / (HS / 8), d = (i - r * (HS / 8)) * 8, t = r0 + r;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (t < T) v = *reinterpret_cast<const uint4*>(g + (i64)t * stride + d);
        *reinterpret_cast<uint4*>(s + r * (HS + 8) + d) = v;
    }
}

// fa_ld_frag loads rows r0, r0+8 (zero past T) of a (T, HS) slice with row
// stride `stride` as KD A fragments.
template <int HS>
__device__ __forceinline__ void fa_ld_frag(uint32_t (*f)[4], const uint16_t* g, i64 stride, int r0, int T) {
    const int c = threadIdx.x & 3, r1 = r0 + 8;
#pragma unroll
    for (int kk = 0; kk < HS / 16; kk++) {
        const int d = kk * 16 + 2 * c;
        f[kk][0] = r0 < T ? fa_ld32(g + (i64)r0 * stride + d) : 0u;
        f[kk][1] = r1 < T ? fa_ld32(g + (i64)r1 * stride + d) : 0u;
        f[kk][2] = r0 < T ? fa_ld32(g + (i64)r0 * stride + d + 8) : 0u;
        f[kk][3] = r1 < T ? fa_ld32(g + (i64)r1 * stride + d + 8) : 0u;
    }
}

// flash_fwd computes the block's 64 query rows. Ks and Vs are the key and
// value tiles, row-major with row stride HS+8 (the padding spreads the rows
// over the banks); the B operands come from them through ldmatrix, V's
// transposed.
// qkv must be 16-byte aligned and out 4-byte aligned (checked by the host).
// Elements are handled as their bf16 bit patterns (uint16_t).
template <int HS>
__device__ __forceinline__ void flash_fwd(uint16_t* __restrict__ out, float* __restrict__ lse,
                                          const uint16_t* __restrict__ qkv, int T, int NH, int NKV, float scale_log2,
                                          uint16_t* Ks, uint16_t* Vs) {
    constexpr int KS = HS + 8, KD = HS / 16, ND = HS / 8, NK = FA_BK / 8;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    const int C = NH * HS, z = blockIdx.y, b = z / NH, h = z - b * NH, kv = h / (NH / NKV);
    // The last query blocks have the most keys: start them first.
    const int q0 = (gridDim.x - 1 - blockIdx.x) * FA_BQ;
    const i64 W = (i64)(NH + 2 * NKV) * HS;                              // row stride of qkv
    const uint16_t* base = qkv + (i64)b * T * W + (i64)h * HS;            // q of token 0 of this head
    const uint16_t* kbase = qkv + (i64)b * T * W + (i64)(NH + kv) * HS;  // k of token 0 of its key head
    const uint16_t* vbase = kbase + (i64)NKV * HS;                        // v of token 0 of its value head
    const int w0 = q0 + warp * 16;                                       // first row of this warp
    const int r0 = w0 + g, r1 = r0 + 8;

    uint32_t qf[KD][4];
#pragma unroll
    for (int kk = 0; kk < KD; kk++) {
        const int d = kk * 16 + 2 * c;
        qf[kk][0] = r0 < T ? fa_ld32(base + (i64)r0 * W + d) : 0u;
        qf[kk][1] = r1 < T ? fa_ld32(base + (i64)r1 * W + d) : 0u;
        qf[kk][2] = r0 < T ? fa_ld32(base + (i64)r0 * W + d + 8) : 0u;
        qf[kk][3] = r1 < T ? fa_ld32(base + (i64)r1 * W + d + 8) : 0u;
    }
    float o[ND][4];
#pragma unroll
    for (int j = 0; j < ND; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    const int qlast = min(q0 + FA_BQ, T) - 1;  // the block's last valid row
    const bool active = w0 < T;                // the warp has a valid row

    // Software pipeline: K of the next tile loads during this tile's P·V,
    // V during its S = Q·Kᵀ and softmax. Keys past T are zero: masked, and
    // never NaN times 0.
    fa_cp_rows<HS>(Ks, kbase, W, 0, FA_BK, T);
    fa_cp_commit();
    for (int k0 = 0; k0 <= qlast; k0 += FA_BK) {
        fa_cp_wait();
        __syncthreads();  // K(k0) is in; every warp is done with V of the previous tile
        fa_cp_rows<HS>(Vs, vbase, W, k0, FA_BK, T);
        fa_cp_commit();
        const bool work = active && k0 <= w0 + 15;  // some row of this warp sees these keys

        // S (16 rows x 64 keys), causally masked, then the online softmax.
        float s[NK][4];
        if (work) {
#pragma unroll
            for (int j = 0; j < NK; j++) {
                s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
                const uint16_t* kp = Ks + (8 * j + (lane & 7)) * KS + 8 * (lane >> 3);
#pragma unroll
                for (int kk = 0; kk < KD; kk += 2) fa_mma_k2<KD>(s[j], qf, kp + 16 * kk, kk);
            }
            // Raw scores (scale > 0 commutes with max); keys after a row, and
            // so keys past T, are masked on the tiles that reach past w0.
            if (k0 + FA_BK - 1 > w0) {
#pragma unroll
                for (int j = 0; j < NK; j++) {
                    const int key = k0 + j * 8 + 2 * c;
                    if (key > r0) s[j][0] = -INFINITY;
                    if (key + 1 > r0) s[j][1] = -INFINITY;
                    if (key > r1) s[j][2] = -INFINITY;
                    if (key + 1 > r1) s[j][3] = -INFINITY;
                }
            }
            float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
            for (int j = 0; j < NK; j++) {
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
            const float b0 = n0 == -INFINITY ? 0.f : n0 * scale_log2, b1 = n1 == -INFINITY ? 0.f : n1 * scale_log2;
            const float f0 = fa_exp2(m0 * scale_log2 - b0), f1 = fa_exp2(m1 * scale_log2 - b1);  // 0 while m is -inf
            m0 = n0;
            m1 = n1;
            float ps0 = 0.f, ps1 = 0.f;
#pragma unroll
            for (int j = 0; j < NK; j++) {
                s[j][0] = fa_exp2(s[j][0] * scale_log2 - b0);
                s[j][1] = fa_exp2(s[j][1] * scale_log2 - b0);
                s[j][2] = fa_exp2(s[j][2] * scale_log2 - b1);
                s[j][3] = fa_exp2(s[j][3] * scale_log2 - b1);
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
        }
        fa_cp_wait();
        __syncthreads();  // V(k0) is in; every warp is done with K(k0)
        if (k0 + FA_BK <= qlast) {
            fa_cp_rows<HS>(Ks, kbase, W, k0 + FA_BK, FA_BK, T);
            fa_cp_commit();
        }
        if (!work) continue;
        // O += P·V: P's accumulator layout is the A layout of the next product.
#pragma unroll
        for (int kk = 0; kk < FA_BK / 16; kk++) {
            uint32_t pa[4];
            pa[0] = fa_pack(s[2 * kk][0], s[2 * kk][1]);
            pa[1] = fa_pack(s[2 * kk][2], s[2 * kk][3]);
            pa[2] = fa_pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            pa[3] = fa_pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
            const uint16_t* vp = Vs + (16 * kk + (lane & 15)) * KS + 8 * (lane >> 4);
#pragma unroll
            for (int j = 0; j < ND; j += 2) {
                uint32_t bv[4];
                fa_ldsm4t(bv, vp + 8 * j);
                fa_mma(o[j], pa, bv[0], bv[1]);
                fa_mma(o[j + 1], pa, bv[2], bv[3]);
            }
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
        if (c == 0) lse[(i64)z * T + r0] = (m0 * scale_log2 + log2f(l0)) * FA_LN2;
    }
    if (r1 < T) {
        const float inv = 1.f / l1;
#pragma unroll
        for (int j = 0; j < ND; j++)
            *reinterpret_cast<uint32_t*>(ob + (i64)r1 * C + j * 8) = fa_pack(o[j][2] * inv, o[j][3] * inv);
        if (c == 0) lse[(i64)z * T + r1] = (m1 * scale_log2 + log2f(l1)) * FA_LN2;
    }
}

// flash_fwd_mt is flash_fwd with MT 16-row tiles per warp (BQ = 64·MT query
// rows per block): each K and V fragment loaded by ldmatrix feeds MT
// products instead of one, and the address arithmetic of a key tile is
// shared by MT row tiles. MT 1 computes what flash_fwd does.
template <int HS, int MT, int BK = FA_BK>
__device__ __forceinline__ void flash_fwd_mt(uint16_t* __restrict__ out, float* __restrict__ lse,
                                             const uint16_t* __restrict__ qkv, int T, int NH, int NKV, float scale_log2,
                                             uint16_t* Ks, uint16_t* Vs) {
    constexpr int KS = HS + 8, KD = HS / 16, ND = HS / 8, NK = BK / 8, BQ = 64 * MT;
    static_assert(BK % 16 == 0 && BK <= FA_BK, "key tiles of 16 to 64 rows");
    static_assert(HS % 32 == 0, "flash_fwd_mt pairs the 16-column slices of a head");
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    const int C = NH * HS, z = blockIdx.y, b = z / NH, h = z - b * NH, kv = h / (NH / NKV);
    // The last query blocks have the most keys: start them first.
    const int q0 = (gridDim.x - 1 - blockIdx.x) * BQ;
    const i64 W = (i64)(NH + 2 * NKV) * HS;                              // row stride of qkv
    const uint16_t* base = qkv + (i64)b * T * W + (i64)h * HS;            // q of token 0 of this head
    const uint16_t* kbase = qkv + (i64)b * T * W + (i64)(NH + kv) * HS;  // k of token 0 of its key head
    const uint16_t* vbase = kbase + (i64)NKV * HS;                        // v of token 0 of its value head
    const int w0 = q0 + warp * 16 * MT;                                  // first row of this warp

    uint32_t qf[MT][KD][4];
#pragma unroll
    for (int t = 0; t < MT; t++) fa_ld_frag<HS>(qf[t], base, W, w0 + 16 * t + g, T);
    float o[MT][ND][4];
    float m[MT][2], l[MT][2];
#pragma unroll
    for (int t = 0; t < MT; t++) {
#pragma unroll
        for (int j = 0; j < ND; j++) o[t][j][0] = o[t][j][1] = o[t][j][2] = o[t][j][3] = 0.f;
        m[t][0] = m[t][1] = -INFINITY;
        l[t][0] = l[t][1] = 0.f;
    }
    const int qlast = min(q0 + BQ, T) - 1;  // the block's last valid row
    const bool active = w0 < T;             // the warp has a valid row

    fa_cp_rows<HS>(Ks, kbase, W, 0, BK, T);
    fa_cp_commit();
    for (int k0 = 0; k0 <= qlast; k0 += BK) {
        fa_cp_wait();
        __syncthreads();  // K(k0) is in; every warp is done with V of the previous tile
        fa_cp_rows<HS>(Vs, vbase, W, k0, BK, T);
        fa_cp_commit();
        const bool work = active && k0 <= w0 + 16 * MT - 1;  // some row of this warp sees these keys

        float s[MT][NK][4];
        if (work) {
#pragma unroll
            for (int j = 0; j < NK; j++) {
#pragma unroll
                for (int t = 0; t < MT; t++) s[t][j][0] = s[t][j][1] = s[t][j][2] = s[t][j][3] = 0.f;
                const uint16_t* kp = Ks + (8 * j + (lane & 7)) * KS + 8 * (lane >> 3);
#pragma unroll
                for (int kk = 0; kk < KD; kk += 2) {
                    uint32_t bk[4];
                    fa_ldsm4(bk, kp + 16 * kk);
#pragma unroll
                    for (int t = 0; t < MT; t++) {
                        fa_mma(s[t][j], qf[t][kk], bk[0], bk[1]);
                        fa_mma(s[t][j], qf[t][kk + 1], bk[2], bk[3]);
                    }
                }
            }
#pragma unroll
            for (int t = 0; t < MT; t++) {
                const int r0 = w0 + 16 * t + g, r1 = r0 + 8;
                // Keys after a row (and so keys past T) are masked on the
                // tiles that reach past the row tile's first row.
                if (k0 + BK - 1 > w0 + 16 * t) {
#pragma unroll
                    for (int j = 0; j < NK; j++) {
                        const int key = k0 + j * 8 + 2 * c;
                        if (key > r0) s[t][j][0] = -INFINITY;
                        if (key + 1 > r0) s[t][j][1] = -INFINITY;
                        if (key > r1) s[t][j][2] = -INFINITY;
                        if (key + 1 > r1) s[t][j][3] = -INFINITY;
                    }
                }
                float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
                for (int j = 0; j < NK; j++) {
                    mx0 = fmaxf(mx0, fmaxf(s[t][j][0], s[t][j][1]));
                    mx1 = fmaxf(mx1, fmaxf(s[t][j][2], s[t][j][3]));
                }
                mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
                mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
                mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
                mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
                const float n0 = fmaxf(m[t][0], mx0), n1 = fmaxf(m[t][1], mx1);
                // A row tile entirely before k0 has every score masked: its
                // maximum stays, f is 1 and p is 0. -inf - -inf never occurs
                // (key 0 is in the first tile and visible to every row).
                const float b0 = n0 == -INFINITY ? 0.f : n0 * scale_log2, b1 = n1 == -INFINITY ? 0.f : n1 * scale_log2;
                const float f0 = fa_exp2(m[t][0] * scale_log2 - b0), f1 = fa_exp2(m[t][1] * scale_log2 - b1);
                m[t][0] = n0;
                m[t][1] = n1;
                float ps0 = 0.f, ps1 = 0.f;
#pragma unroll
                for (int j = 0; j < NK; j++) {
                    s[t][j][0] = fa_exp2(s[t][j][0] * scale_log2 - b0);
                    s[t][j][1] = fa_exp2(s[t][j][1] * scale_log2 - b0);
                    s[t][j][2] = fa_exp2(s[t][j][2] * scale_log2 - b1);
                    s[t][j][3] = fa_exp2(s[t][j][3] * scale_log2 - b1);
                    ps0 += s[t][j][0] + s[t][j][1];
                    ps1 += s[t][j][2] + s[t][j][3];
                }
                l[t][0] = l[t][0] * f0 + ps0;
                l[t][1] = l[t][1] * f1 + ps1;
#pragma unroll
                for (int j = 0; j < ND; j++) {
                    o[t][j][0] *= f0;
                    o[t][j][1] *= f0;
                    o[t][j][2] *= f1;
                    o[t][j][3] *= f1;
                }
            }
        }
        fa_cp_wait();
        __syncthreads();  // V(k0) is in; every warp is done with K(k0)
        if (k0 + BK <= qlast) {
            fa_cp_rows<HS>(Ks, kbase, W, k0 + BK, BK, T);
            fa_cp_commit();
        }
        if (!work) continue;
        // O += P·V: P's accumulator layout is the A layout of the next product.
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) {
            uint32_t pa[MT][4];
#pragma unroll
            for (int t = 0; t < MT; t++) {
                pa[t][0] = fa_pack(s[t][2 * kk][0], s[t][2 * kk][1]);
                pa[t][1] = fa_pack(s[t][2 * kk][2], s[t][2 * kk][3]);
                pa[t][2] = fa_pack(s[t][2 * kk + 1][0], s[t][2 * kk + 1][1]);
                pa[t][3] = fa_pack(s[t][2 * kk + 1][2], s[t][2 * kk + 1][3]);
            }
            const uint16_t* vp = Vs + (16 * kk + (lane & 15)) * KS + 8 * (lane >> 4);
#pragma unroll
            for (int j = 0; j < ND; j += 2) {
                uint32_t bv[4];
                fa_ldsm4t(bv, vp + 8 * j);
#pragma unroll
                for (int t = 0; t < MT; t++) {
                    fa_mma(o[t][j], pa[t], bv[0], bv[1]);
                    fa_mma(o[t][j + 1], pa[t], bv[2], bv[3]);
                }
            }
        }
    }
    if (!active) return;
    uint16_t* ob = out + (i64)b * T * C + (i64)h * HS + 2 * c;
#pragma unroll
    for (int t = 0; t < MT; t++) {
        const int r0 = w0 + 16 * t + g, r1 = r0 + 8;
        float l0 = l[t][0], l1 = l[t][1];
        l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
        l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
        if (r0 < T) {
            const float inv = 1.f / l0;
#pragma unroll
            for (int j = 0; j < ND; j++)
                *reinterpret_cast<uint32_t*>(ob + (i64)r0 * C + j * 8) = fa_pack(o[t][j][0] * inv, o[t][j][1] * inv);
            if (c == 0) lse[(i64)z * T + r0] = (m[t][0] * scale_log2 + log2f(l0)) * FA_LN2;
        }
        if (r1 < T) {
            const float inv = 1.f / l1;
#pragma unroll
            for (int j = 0; j < ND; j++)
                *reinterpret_cast<uint32_t*>(ob + (i64)r1 * C + j * 8) = fa_pack(o[t][j][2] * inv, o[t][j][3] * inv);
            if (c == 0) lse[(i64)z * T + r1] = (m[t][1] * scale_log2 + log2f(l1)) * FA_LN2;
        }
    }
}

// Backward pass, two ways. flash_bwd_fused (below flash_bwd_q) does it in one
// pass over the key blocks, dQ through a float32 accumulator with atomic
// adds (not bitwise reproducible); the split kernels are the deterministic
// way. Split: two kernels, no atomics (deterministic), both accumulating into dqkv:
// flash_bwd_kv gives dK and dV, one block per 64 keys of one (batch,
// key/value head), each warp owning 16 keys and walking the query tiles from
// its diagonal to T, for each query head of the group in turn (so the
// group's sum stays in registers, in a fixed order); flash_bwd_q gives dQ, one block per 64 query rows, each warp owning 16
// rows and walking the key tiles up to its diagonal. Both recompute
// P = exp(scale·QKᵀ - lse) from the forward's lse and take
// D = rowsum(dO∘O) from flash_bwd_prep; dS = P∘(dP - D), dQ = scale·dS·K,
// dK = scale·dSᵀ·Q, dV = Pᵀ·dO. The operands a warp keeps (its keys, or its
// queries and their dO) sit in registers in the A layout; the streamed tiles
// sit row-major in shared memory and reach the B operand through ldmatrix,
// transposed where the product runs along the tile's rows.


// flash_bwd_kv: dK and dV of the block's 64 keys (summed over the query
// heads of their group); queries stream through
// shared memory BQ at a time (Qb: two tiles of Q rows, Gs: one of dO rows;
// Lb, Db: two tiles of lse in base 2, +inf past T so that P is 0 there, and
// of D). dqkv 4-byte aligned, qkv and
// dout 16-byte aligned (checked by the host).
template <int HS, int BQ>
__device__ __forceinline__ void flash_bwd_kv(uint16_t* __restrict__ dqkv, const uint16_t* __restrict__ dout,
                                             const uint16_t* __restrict__ qkv, const float* __restrict__ lse,
                                             const float* __restrict__ Dd, int T, int NH, int NKV, float scale_log2,
                                             float scale, bool set, uint16_t* Qb, uint16_t* Gs, float* Lb, float* Db) {
    constexpr int QS = HS + 8, KD = HS / 16, ND = HS / 8, NQ = BQ / 8;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    const int C = NH * HS, rep = NH / NKV;
    const int z = blockIdx.y, b = z / NKV, kv = z - b * NKV;  // one key/value head
    const int k0 = blockIdx.x * FA_BK;
    const i64 W = (i64)(NH + 2 * NKV) * HS;                                // row stride of qkv
    const uint16_t* kbase = qkv + (i64)b * T * W + (i64)(NH + kv) * HS;    // k of token 0 of this head
    const uint16_t* vbase = kbase + (i64)NKV * HS;                          // v of token 0
    const int kw0 = k0 + warp * 16, kr0 = kw0 + g, kr1 = kr0 + 8;
    const bool active = kw0 < T;
    uint32_t kf[KD][4], vf[KD][4];
    fa_ld_frag<HS>(kf, kbase, W, kr0, T);
    fa_ld_frag<HS>(vf, vbase, W, kr0, T);
    float dk[ND][4], dv[ND][4];
#pragma unroll
    for (int j = 0; j < ND; j++) dk[j][0] = dk[j][1] = dk[j][2] = dk[j][3] = dv[j][0] = dv[j][1] = dv[j][2] = dv[j][3] = 0.f;
    // The block's query tiles: those from k0 to T of each query head of the
    // group (heads kv·rep .. kv·rep+rep-1) in turn, nt per head; dK and dV
    // sum over all of them in this fixed order (no atomics).
    const int nt = (T - k0 + BQ - 1) / BQ, nit = rep * nt;
    auto qhead = [&](int it) { return kv * rep + it / nt; };
    auto qstart = [&](int it) { return k0 + (it % nt) * BQ; };

    // Software pipeline: Q (with lse and D) is double-buffered (Qb, Lb, Db:
    // two tiles each); the next Q loads during this tile's dP, dV and dK,
    // dO during its Sᵀ and P.
    auto ld_q = [&](int it, int buf) {  // Q, lse (base 2, +inf past T) and D
        const int h = qhead(it), q0 = qstart(it);
        fa_cp_rows<HS>(Qb + buf * BQ * QS, qkv + (i64)b * T * W + (i64)h * HS, W, q0, BQ, T);
        fa_cp_commit();
        const float* lz = lse + ((i64)b * NH + h) * T;
        const float* dz = Dd + ((i64)b * NH + h) * T;
        for (int i = tid; i < BQ; i += FA_THREADS) {
            const int q = q0 + i;
            Lb[buf * BQ + i] = q < T ? lz[q] * FA_LOG2E : INFINITY;
            Db[buf * BQ + i] = q < T ? dz[q] : 0.f;
        }
    };
    ld_q(0, 0);
    for (int it = 0; it < nit; it++) {
        const int q0 = qstart(it);
        const uint16_t* Qs = Qb + (it & 1) * BQ * QS;
        const float* Ls = Lb + (it & 1) * BQ;
        const float* Ds = Db + (it & 1) * BQ;
        fa_cp_wait();
        __syncthreads();  // Q(q0) is in; every warp is done with the previous tile
        fa_cp_rows<HS>(Gs, dout + (i64)b * T * C + (i64)qhead(it) * HS, C, q0, BQ, T);
        fa_cp_commit();
        const bool work = active && q0 + BQ > kw0;  // some query of the tile sees the warp's keys

        // Pᵀ = exp(scale·K·Qᵀ - lse), 16 keys x BQ queries; queries before
        // a key, or past T, give 0.
        float s[NQ][4];
        const bool mask = q0 < kw0 + 16;
        if (work) {
#pragma unroll
            for (int j = 0; j < NQ; j++) {
                s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
                const int off = (8 * j + (lane & 7)) * QS + 8 * (lane >> 3);
#pragma unroll
                for (int kk = 0; kk < KD; kk += 2) fa_mma_k2<KD>(s[j], kf, Qs + off + 16 * kk, kk);
                const int qi = 8 * j + 2 * c, q = q0 + qi;
                const float l0 = Ls[qi], l1 = Ls[qi + 1];
                s[j][0] = fa_exp2(s[j][0] * scale_log2 - l0);
                s[j][1] = fa_exp2(s[j][1] * scale_log2 - l1);
                s[j][2] = fa_exp2(s[j][2] * scale_log2 - l0);
                s[j][3] = fa_exp2(s[j][3] * scale_log2 - l1);
                if (mask) {
                    if (q < kr0) s[j][0] = 0.f;
                    if (q + 1 < kr0) s[j][1] = 0.f;
                    if (q < kr1) s[j][2] = 0.f;
                    if (q + 1 < kr1) s[j][3] = 0.f;
                }
            }
        }
        fa_cp_wait();
        __syncthreads();  // dO(q0) is in
        if (it + 1 < nit) ld_q(it + 1, (it + 1) & 1);  // into the buffers the previous tile used
        if (!work) continue;

        // dPᵀ = V·dOᵀ, then dSᵀ = Pᵀ∘(dPᵀ - D) in place.
        float dp[NQ][4];
#pragma unroll
        for (int j = 0; j < NQ; j++) {
            dp[j][0] = dp[j][1] = dp[j][2] = dp[j][3] = 0.f;
            const int off = (8 * j + (lane & 7)) * QS + 8 * (lane >> 3);
#pragma unroll
            for (int kk = 0; kk < KD; kk += 2) fa_mma_k2<KD>(dp[j], vf, Gs + off + 16 * kk, kk);
            const int qi = 8 * j + 2 * c;
            const float d0 = Ds[qi], d1 = Ds[qi + 1];
            dp[j][0] = s[j][0] * (dp[j][0] - d0);
            dp[j][1] = s[j][1] * (dp[j][1] - d1);
            dp[j][2] = s[j][2] * (dp[j][2] - d0);
            dp[j][3] = s[j][3] * (dp[j][3] - d1);
        }
        // dV += Pᵀ·dO and dK += dSᵀ·Q: the accumulators are the A operands
        // (k = queries), dO and Q rows the transposed B operands.
#pragma unroll
        for (int kk = 0; kk < BQ / 16; kk++) {
            uint32_t pa[4], da[4];
            pa[0] = fa_pack(s[2 * kk][0], s[2 * kk][1]);
            pa[1] = fa_pack(s[2 * kk][2], s[2 * kk][3]);
            pa[2] = fa_pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            pa[3] = fa_pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
            da[0] = fa_pack(dp[2 * kk][0], dp[2 * kk][1]);
            da[1] = fa_pack(dp[2 * kk][2], dp[2 * kk][3]);
            da[2] = fa_pack(dp[2 * kk + 1][0], dp[2 * kk + 1][1]);
            da[3] = fa_pack(dp[2 * kk + 1][2], dp[2 * kk + 1][3]);
            const int off = (16 * kk + (lane & 15)) * QS + 8 * (lane >> 4);
#pragma unroll
            for (int j = 0; j < ND; j += 2) {
                uint32_t bg[4], bq[4];
                fa_ldsm4t(bg, Gs + off + 8 * j);
                fa_mma(dv[j], pa, bg[0], bg[1]);
                fa_mma(dv[j + 1], pa, bg[2], bg[3]);
                fa_ldsm4t(bq, Qs + off + 8 * j);
                fa_mma(dk[j], da, bq[0], bq[1]);
                fa_mma(dk[j + 1], da, bq[2], bq[3]);
            }
        }
    }
    if (!active) return;
    uint16_t* dkb = dqkv + (i64)b * T * W + (i64)(NH + kv) * HS + 2 * c;
    uint16_t* dvb = dkb + (i64)NKV * HS;
    if (kr0 < T) {
#pragma unroll
        for (int j = 0; j < ND; j++) {
            fa_acc2(dkb + (i64)kr0 * W + j * 8, dk[j][0] * scale, dk[j][1] * scale, set);
            fa_acc2(dvb + (i64)kr0 * W + j * 8, dv[j][0], dv[j][1], set);
        }
    }
    if (kr1 < T) {
#pragma unroll
        for (int j = 0; j < ND; j++) {
            fa_acc2(dkb + (i64)kr1 * W + j * 8, dk[j][2] * scale, dk[j][3] * scale, set);
            fa_acc2(dvb + (i64)kr1 * W + j * 8, dv[j][2], dv[j][3], set);
        }
    }
}

// flash_bwd_q: dQ of the block's 64 query rows; keys and values stream
// through shared memory BK at a time (Kb: two key tiles, Vs: one value
// tile, row-major).
template <int HS, int BK>
__device__ __forceinline__ void flash_bwd_q(uint16_t* __restrict__ dqkv, const uint16_t* __restrict__ dout,
                                            const uint16_t* __restrict__ qkv, const float* __restrict__ lse,
                                            const float* __restrict__ Dd, int T, int NH, int NKV, float scale_log2,
                                            float scale, bool set, uint16_t* Kb, uint16_t* Vs) {
    constexpr int KS = HS + 8, KD = HS / 16, ND = HS / 8, NK = BK / 8;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    const int C = NH * HS, z = blockIdx.y, b = z / NH, h = z - b * NH, kv = h / (NH / NKV);
    const int q0 = (gridDim.x - 1 - blockIdx.x) * FA_BQ;  // the most keys first
    const i64 W = (i64)(NH + 2 * NKV) * HS;  // row stride of qkv
    const uint16_t* base = qkv + (i64)b * T * W + (i64)h * HS;
    const uint16_t* kbase = qkv + (i64)b * T * W + (i64)(NH + kv) * HS;
    const uint16_t* vbase = kbase + (i64)NKV * HS;
    const uint16_t* gbase = dout + (i64)b * T * C + (i64)h * HS;
    const int w0 = q0 + warp * 16, r0 = w0 + g, r1 = r0 + 8;
    const bool active = w0 < T;
    uint32_t qf[KD][4], gf[KD][4];
    fa_ld_frag<HS>(qf, base, W, r0, T);
    fa_ld_frag<HS>(gf, gbase, C, r0, T);
    const float l0 = r0 < T ? lse[(i64)z * T + r0] * FA_LOG2E : INFINITY;
    const float l1 = r1 < T ? lse[(i64)z * T + r1] * FA_LOG2E : INFINITY;
    const float d0 = r0 < T ? Dd[(i64)z * T + r0] : 0.f;
    const float d1 = r1 < T ? Dd[(i64)z * T + r1] : 0.f;
    float dq[ND][4];
#pragma unroll
    for (int j = 0; j < ND; j++) dq[j][0] = dq[j][1] = dq[j][2] = dq[j][3] = 0.f;
    const int qlast = min(q0 + FA_BQ, T) - 1;

    // Software pipeline: K is double-buffered (Kb: two tiles); the next K
    // loads during this tile's dP, dS and dQ, V during its S and P.
    fa_cp_rows<HS>(Kb, kbase, W, 0, BK, T);
    fa_cp_commit();
    for (int k0 = 0, it = 0; k0 <= qlast; k0 += BK, it++) {
        const uint16_t* Ks = Kb + (it & 1) * BK * KS;
        fa_cp_wait();
        __syncthreads();  // K(k0) is in; every warp is done with V and K of the previous tile
        fa_cp_rows<HS>(Vs, vbase, W, k0, BK, T);
        fa_cp_commit();
        const bool work = active && k0 <= w0 + 15;  // some row of this warp sees these keys

        // P = exp(scale·Q·Kᵀ - lse), 16 rows x BK keys; keys after a row
        // (and so keys past T) give 0.
        float s[NK][4];
        if (work) {
            const bool mask = k0 + BK - 1 > w0;
#pragma unroll
            for (int j = 0; j < NK; j++) {
                s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
                const int off = (8 * j + (lane & 7)) * KS + 8 * (lane >> 3);
#pragma unroll
                for (int kk = 0; kk < KD; kk += 2) fa_mma_k2<KD>(s[j], qf, Ks + off + 16 * kk, kk);
                const int key = k0 + 8 * j + 2 * c;
                s[j][0] = fa_exp2(s[j][0] * scale_log2 - l0);
                s[j][1] = fa_exp2(s[j][1] * scale_log2 - l0);
                s[j][2] = fa_exp2(s[j][2] * scale_log2 - l1);
                s[j][3] = fa_exp2(s[j][3] * scale_log2 - l1);
                if (mask) {
                    if (key > r0) s[j][0] = 0.f;
                    if (key + 1 > r0) s[j][1] = 0.f;
                    if (key > r1) s[j][2] = 0.f;
                    if (key + 1 > r1) s[j][3] = 0.f;
                }
            }
        }
        fa_cp_wait();
        __syncthreads();  // V(k0) is in
        if (k0 + BK <= qlast) {  // into the buffer the previous tile used
            fa_cp_rows<HS>(Kb + ((it + 1) & 1) * BK * KS, kbase, W, k0 + BK, BK, T);
            fa_cp_commit();
        }
        if (!work) continue;

        // dP = dO·Vᵀ, then dS = P∘(dP - D) in place.
        float dp[NK][4];
#pragma unroll
        for (int j = 0; j < NK; j++) {
            dp[j][0] = dp[j][1] = dp[j][2] = dp[j][3] = 0.f;
            const int off = (8 * j + (lane & 7)) * KS + 8 * (lane >> 3);
#pragma unroll
            for (int kk = 0; kk < KD; kk += 2) fa_mma_k2<KD>(dp[j], gf, Vs + off + 16 * kk, kk);
            dp[j][0] = s[j][0] * (dp[j][0] - d0);
            dp[j][1] = s[j][1] * (dp[j][1] - d0);
            dp[j][2] = s[j][2] * (dp[j][2] - d1);
            dp[j][3] = s[j][3] * (dp[j][3] - d1);
        }
        // dQ += dS·K: K rows are the transposed B operand (k = keys).
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) {
            uint32_t da[4];
            da[0] = fa_pack(dp[2 * kk][0], dp[2 * kk][1]);
            da[1] = fa_pack(dp[2 * kk][2], dp[2 * kk][3]);
            da[2] = fa_pack(dp[2 * kk + 1][0], dp[2 * kk + 1][1]);
            da[3] = fa_pack(dp[2 * kk + 1][2], dp[2 * kk + 1][3]);
            const int off = (16 * kk + (lane & 15)) * KS + 8 * (lane >> 4);
#pragma unroll
            for (int j = 0; j < ND; j += 2) {
                uint32_t bk[4];
                fa_ldsm4t(bk, Ks + off + 8 * j);
                fa_mma(dq[j], da, bk[0], bk[1]);
                fa_mma(dq[j + 1], da, bk[2], bk[3]);
            }
        }
    }
    if (!active) return;
    uint16_t* dqb = dqkv + (i64)b * T * W + (i64)h * HS + 2 * c;
    if (r0 < T) {
#pragma unroll
        for (int j = 0; j < ND; j++) fa_acc2(dqb + (i64)r0 * W + j * 8, dq[j][0] * scale, dq[j][1] * scale, set);
    }
    if (r1 < T) {
#pragma unroll
        for (int j = 0; j < ND; j++) fa_acc2(dqb + (i64)r1 * W + j * 8, dq[j][2] * scale, dq[j][3] * scale, set);
    }
}

// flash_bwd_fused: the backward of flash_bwd_kv and flash_bwd_q in one
// pass, five products per query tile instead of seven. One block of NW
// warps per BKV = 16·NW keys of one (batch, key/value head); as in
// flash_bwd_kv each warp owns 16 keys, walks the query tiles (BQ rows) of
// the group's query heads from the block's diagonal to T, recomputes Pᵀ and
// dSᵀ once, and keeps dK and dV in registers. The tile's share of dQ,
// dS·K over the block's keys, is added to the float32 accumulator
// dq(B, NH, T, HS) (zero on entry; unscaled, flash_bwd_dq_store applies
// scale) with atomic adds: each warp stores its 16 rows of dSᵀ in St (bf16,
// the rounding the dK product uses), and after a barrier the warps split
// the BQ x HS tile of dQ (WR groups of row tiles x WC groups of columns)
// so that a block adds each element once per query tile. The order of
// those float32 additions across blocks is the scheduler's: dQ is not
// bitwise reproducible (dK and dV are). Ks holds the block's key rows
// (zero past T), the B operand of dS·K; Qb, Gs, Lb, Db as in flash_bwd_kv;
// St BKV rows of BQ+8. dqkv 4-byte aligned, qkv and dout 16-byte aligned,
// dq 8-byte aligned. KREG keeps the warp's K rows in registers as A
// fragments for S (as flash_bwd_kv does); without it they come from Ks
// through ldmatrix each tile, 4·HS/16 registers fewer.
template <int HS, int BQ, int NW, bool KREG>
__device__ __forceinline__ void flash_bwd_fused(uint16_t* __restrict__ dqkv, float* __restrict__ dq,
                                                const uint16_t* __restrict__ dout, const uint16_t* __restrict__ qkv,
                                                const float* __restrict__ lse, const float* __restrict__ Dd, int T, int NH,
                                                int NKV, float scale_log2, float scale, bool set, uint16_t* Ks,
                                                uint16_t* Qb, uint16_t* Gs, uint16_t* St, float* Lb, float* Db) {
    static_assert(HS % 32 == 0, "flash_bwd_fused pairs the 16-column slices of a head");
    constexpr int NT = 32 * NW, BKV = 16 * NW;
    constexpr int KS = HS + 8, QS = HS + 8, SS = BQ + 8, KD = HS / 16, ND = HS / 8, NQ = BQ / 8;
    // dQ's split: WR groups of 16-row tiles times WC groups of HS/WC columns.
    constexpr int QR = BQ / 16, WR = NW < QR ? NW : QR, WC = NW / WR, DC = HS / WC;
    static_assert(NW % WR == 0 && QR % WR == 0 && DC % 16 == 0, "dQ split");
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    const int C = NH * HS, rep = NH / NKV;
    const int z = blockIdx.y, b = z / NKV, kv = z - b * NKV;
    const int k0 = blockIdx.x * BKV;
    const i64 W = (i64)(NH + 2 * NKV) * HS;
    const uint16_t* kbase = qkv + (i64)b * T * W + (i64)(NH + kv) * HS;
    const uint16_t* vbase = kbase + (i64)NKV * HS;
    const int kw0 = k0 + warp * 16, kr0 = kw0 + g, kr1 = kr0 + 8;
    const bool active = kw0 < T;
    uint32_t kf[KREG ? KD : 1][4], vf[KD][4];
    if constexpr (KREG) fa_ld_frag<HS>(kf, kbase, W, kr0, T);
    fa_ld_frag<HS>(vf, vbase, W, kr0, T);
    float dk[ND][4], dv[ND][4];
#pragma unroll
    for (int j = 0; j < ND; j++) dk[j][0] = dk[j][1] = dk[j][2] = dk[j][3] = dv[j][0] = dv[j][1] = dv[j][2] = dv[j][3] = 0.f;
    const int nt = (T - k0 + BQ - 1) / BQ, nit = rep * nt;
    auto qhead = [&](int it) { return kv * rep + it / nt; };
    auto qstart = [&](int it) { return k0 + (it % nt) * BQ; };
    auto ld_q = [&](int it, int buf) {
        const int h = qhead(it), q0 = qstart(it);
        fa_cp_rows<HS, NT>(Qb + buf * BQ * QS, qkv + (i64)b * T * W + (i64)h * HS, W, q0, BQ, T);
        fa_cp_commit();
        const float* lz = lse + ((i64)b * NH + h) * T;
        const float* dz = Dd + ((i64)b * NH + h) * T;
        for (int i = tid; i < BQ; i += NT) {
            const int q = q0 + i;
            Lb[buf * BQ + i] = q < T ? lz[q] * FA_LOG2E : INFINITY;
            Db[buf * BQ + i] = q < T ? dz[q] : 0.f;
        }
    };
    fa_cp_rows<HS, NT>(Ks, kbase, W, k0, BKV, T);  // committed with the first Q tile
    ld_q(0, 0);
    for (int it = 0; it < nit; it++) {
        const int h = qhead(it), q0 = qstart(it);
        const uint16_t* Qs = Qb + (it & 1) * BQ * QS;
        const float* Ls = Lb + (it & 1) * BQ;
        const float* Ds = Db + (it & 1) * BQ;
        fa_cp_wait();
        __syncthreads();  // Q(q0) is in; every warp is done with St, Gs and the previous Q
        fa_cp_rows<HS, NT>(Gs, dout + (i64)b * T * C + (i64)h * HS, C, q0, BQ, T);
        fa_cp_commit();
        const bool work = active && q0 + BQ > kw0;  // some query of the tile sees the warp's keys

        // Pᵀ, 16 keys x BQ queries, as in flash_bwd_kv.
        float s[NQ][4];
        const bool mask = q0 < kw0 + 16;
#pragma unroll
        for (int j = 0; j < NQ; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
        if (work) {
            if constexpr (KREG) {
#pragma unroll
                for (int j = 0; j < NQ; j++) {
                    const int off = (8 * j + (lane & 7)) * QS + 8 * (lane >> 3);
#pragma unroll
                    for (int kk = 0; kk < KD; kk += 2) {
                        uint32_t bq[4];
                        fa_ldsm4(bq, Qs + off + 16 * kk);
                        fa_mma(s[j], kf[kk], bq[0], bq[1]);
                        fa_mma(s[j], kf[kk + 1], bq[2], bq[3]);
                    }
                }
            } else {
                // The warp's K rows from Ks, two 16-column steps at a time.
                const uint16_t* kp = Ks + (16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1)) * KS + 8 * (lane >> 4);
#pragma unroll
                for (int kk = 0; kk < KD; kk += 2) {
                    uint32_t ka[2][4];
                    fa_ldsm4(ka[0], kp + 16 * kk);
                    fa_ldsm4(ka[1], kp + 16 * kk + 16);
#pragma unroll
                    for (int j = 0; j < NQ; j++) {
                        uint32_t bq[4];
                        fa_ldsm4(bq, Qs + (8 * j + (lane & 7)) * QS + 8 * (lane >> 3) + 16 * kk);
                        fa_mma(s[j], ka[0], bq[0], bq[1]);
                        fa_mma(s[j], ka[1], bq[2], bq[3]);
                    }
                }
            }
#pragma unroll
            for (int j = 0; j < NQ; j++) {
                const int qi = 8 * j + 2 * c, q = q0 + qi;
                const float l0 = Ls[qi], l1 = Ls[qi + 1];
                s[j][0] = fa_exp2(s[j][0] * scale_log2 - l0);
                s[j][1] = fa_exp2(s[j][1] * scale_log2 - l1);
                s[j][2] = fa_exp2(s[j][2] * scale_log2 - l0);
                s[j][3] = fa_exp2(s[j][3] * scale_log2 - l1);
                if (mask) {
                    if (q < kr0) s[j][0] = 0.f;
                    if (q + 1 < kr0) s[j][1] = 0.f;
                    if (q < kr1) s[j][2] = 0.f;
                    if (q + 1 < kr1) s[j][3] = 0.f;
                }
            }
        }
        fa_cp_wait();
        __syncthreads();  // dO(q0) is in
        if (it + 1 < nit) ld_q(it + 1, (it + 1) & 1);

        // dSᵀ = Pᵀ∘(dPᵀ - D), dPᵀ = V·dOᵀ; a warp without work stores zeros
        // in its rows of St (the dQ product reads every row).
        float dp[NQ][4];
#pragma unroll
        for (int j = 0; j < NQ; j++) dp[j][0] = dp[j][1] = dp[j][2] = dp[j][3] = 0.f;
        if (work) {
#pragma unroll
            for (int j = 0; j < NQ; j++) {
                const int off = (8 * j + (lane & 7)) * QS + 8 * (lane >> 3);
#pragma unroll
                for (int kk = 0; kk < KD; kk += 2) {
                    uint32_t bg[4];
                    fa_ldsm4(bg, Gs + off + 16 * kk);
                    fa_mma(dp[j], vf[kk], bg[0], bg[1]);
                    fa_mma(dp[j], vf[kk + 1], bg[2], bg[3]);
                }
                const int qi = 8 * j + 2 * c;
                const float d0 = Ds[qi], d1 = Ds[qi + 1];
                dp[j][0] = s[j][0] * (dp[j][0] - d0);
                dp[j][1] = s[j][1] * (dp[j][1] - d1);
                dp[j][2] = s[j][2] * (dp[j][2] - d0);
                dp[j][3] = s[j][3] * (dp[j][3] - d1);
            }
        }
        uint16_t* sw = St + (16 * warp + g) * SS + 2 * c;
#pragma unroll
        for (int j = 0; j < NQ; j++) {
            *reinterpret_cast<uint32_t*>(sw + 8 * j) = fa_pack(dp[j][0], dp[j][1]);
            *reinterpret_cast<uint32_t*>(sw + 8 * SS + 8 * j) = fa_pack(dp[j][2], dp[j][3]);
        }
        // dV += Pᵀ·dO and dK += dSᵀ·Q, as in flash_bwd_kv.
        if (work) {
#pragma unroll
            for (int kk = 0; kk < BQ / 16; kk++) {
                uint32_t pa[4], da[4];
                pa[0] = fa_pack(s[2 * kk][0], s[2 * kk][1]);
                pa[1] = fa_pack(s[2 * kk][2], s[2 * kk][3]);
                pa[2] = fa_pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
                pa[3] = fa_pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
                da[0] = fa_pack(dp[2 * kk][0], dp[2 * kk][1]);
                da[1] = fa_pack(dp[2 * kk][2], dp[2 * kk][3]);
                da[2] = fa_pack(dp[2 * kk + 1][0], dp[2 * kk + 1][1]);
                da[3] = fa_pack(dp[2 * kk + 1][2], dp[2 * kk + 1][3]);
                const int off = (16 * kk + (lane & 15)) * QS + 8 * (lane >> 4);
#pragma unroll
                for (int j = 0; j < ND; j += 2) {
                    uint32_t bg[4], bq[4];
                    fa_ldsm4t(bg, Gs + off + 8 * j);
                    fa_mma(dv[j], pa, bg[0], bg[1]);
                    fa_mma(dv[j + 1], pa, bg[2], bg[3]);
                    fa_ldsm4t(bq, Qs + off + 8 * j);
                    fa_mma(dk[j], da, bq[0], bq[1]);
                    fa_mma(dk[j + 1], da, bq[2], bq[3]);
                }
            }
        }
        __syncthreads();  // St holds the tile's dSᵀ

        // dQ(q0 + 16·rt.., cols) += dS·K, dS read transposed from St (A
        // operand: ldmatrix.trans of dSᵀ rows = keys); only the key steps at
        // or before the row tile's last query can be nonzero.
        float* dqz = dq + ((i64)b * NH + h) * T * HS;
#pragma unroll
        for (int ri = 0; ri < QR / WR; ri++) {
            const int rt = warp % WR + ri * WR, qr = q0 + 16 * rt;
            if (qr >= T) continue;
            const int nk = min(BKV / 16, (qr + 15 - k0) / 16 + 1);
            uint32_t af[BKV / 16][4];
#pragma unroll
            for (int kk = 0; kk < BKV / 16; kk++)
                if (kk < nk)
                    fa_ldsm4t(af[kk], St + (16 * kk + (lane & 7) + 8 * (lane >> 4)) * SS + 16 * rt + 8 * ((lane >> 3) & 1));
            const int r0 = qr + g, r1 = r0 + 8;
#pragma unroll
            for (int j = 0; j < DC / 8; j += 2) {
                const int col = (warp / WR) * DC + 8 * j;
                float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
                for (int kk = 0; kk < BKV / 16; kk++) {
                    if (kk < nk) {
                        uint32_t bk[4];
                        fa_ldsm4t(bk, Ks + (16 * kk + (lane & 15)) * KS + 8 * (lane >> 4) + col);
                        fa_mma(acc[0], af[kk], bk[0], bk[1]);
                        fa_mma(acc[1], af[kk], bk[2], bk[3]);
                    }
                }
#pragma unroll
                for (int u = 0; u < 2; u++) {
                    float* p = dqz + col + 8 * u + 2 * c;
                    if (r0 < T) {
                        atomicAdd(p + (i64)r0 * HS, acc[u][0]);
                        atomicAdd(p + (i64)r0 * HS + 1, acc[u][1]);
                    }
                    if (r1 < T) {
                        atomicAdd(p + (i64)r1 * HS, acc[u][2]);
                        atomicAdd(p + (i64)r1 * HS + 1, acc[u][3]);
                    }
                }
            }
        }
    }
    if (!active) return;
    uint16_t* dkb = dqkv + (i64)b * T * W + (i64)(NH + kv) * HS + 2 * c;
    uint16_t* dvb = dkb + (i64)NKV * HS;
    if (kr0 < T) {
#pragma unroll
        for (int j = 0; j < ND; j++) {
            fa_acc2(dkb + (i64)kr0 * W + j * 8, dk[j][0] * scale, dk[j][1] * scale, set);
            fa_acc2(dvb + (i64)kr0 * W + j * 8, dv[j][0], dv[j][1], set);
        }
    }
    if (kr1 < T) {
#pragma unroll
        for (int j = 0; j < ND; j++) {
            fa_acc2(dkb + (i64)kr1 * W + j * 8, dk[j][2] * scale, dk[j][3] * scale, set);
            fa_acc2(dvb + (i64)kr1 * W + j * 8, dv[j][2], dv[j][3], set);
        }
    }
}

// flash_bwd_dq_store writes the bf16 pair i of dQ (pairs in the order of
// dq(B, NH, T, HS), float32, from flash_bwd_fused) into the query columns
// of dqkv: scale·dq added to dqkv, rounded once, or with set written over it.
__device__ __forceinline__ void flash_bwd_dq_store(uint16_t* __restrict__ dqkv, const float* __restrict__ dq, i64 i, int T,
                                                   int NH, int NKV, int HS, float scale, bool set) {
    const i64 e = 2 * i, row = e / HS;  // row = (b·NH + h)·T + t
    const int d = (int)(e - row * HS), t = (int)(row % T);
    const i64 bh = row / T;
    const int h = (int)(bh % NH);
    const i64 b = bh / NH;
    const float2 v = *reinterpret_cast<const float2*>(dq + e);
    fa_acc2(dqkv + (b * T + t) * (i64)(NH + 2 * NKV) * HS + (i64)h * HS + d, v.x * scale, v.y * scale, set);
}

// The split backward's variant (SPILL_FLASH_BWD=split-smem, the default;
// flash.go): flash_bwd_kv_v and flash_bwd_q_v compute what
// flash_bwd_kv and flash_bwd_q do, in the same per-accumulator order (no
// atomics: bitwise reproducible run to run), with two knobs:
//   NW warps per block (16·NW keys, or query rows, per block; each warp still
//     owns 16), so that a streamed tile, loaded once per block, serves NW
//     warps: NW = 8 halves the shared-memory fill traffic per key (per row);
//   SM: the warp's fixed operands (its K and V rows in flash_bwd_kv_v, its Q
//     and dO rows in flash_bwd_q_v) stay in shared memory and reach the mma
//     through ldmatrix at each use instead of sitting in registers as A
//     fragments: 2·HS/4 registers fewer, room for 64-row streamed tiles at
//     head size 128 (BQ, BK) instead of 32.
// Shared memory is one dynamic area (fa_bwd_kv_smem, fa_bwd_q_smem bytes),
// carved here: [SM: Ks, Vs (or Qs, Gs), 16·NW rows each] then the streamed
// tiles as in flash_bwd_kv (Qb two tiles, Gs one, Lb, Db) or flash_bwd_q
// (Kb two tiles, Vs one). Rows of stride HS+8.
template <int HS, int BQ, int NW, bool SM>
constexpr int fa_bwd_kv_smem() {
    return ((SM ? 2 * 16 * NW : 0) + 3 * BQ) * (HS + 8) * 2 + 4 * BQ * 4;
}
template <int HS, int BK, int NW, bool SM>
constexpr int fa_bwd_q_smem() {
    return ((SM ? 2 * 16 * NW : 0) + 3 * BK) * (HS + 8) * 2;
}

// fa_ld_afrag loads the A fragments (16 rows from row r of the shared tile
// s, row stride HS+8, columns 16kk..16kk+15) by ldmatrix: lanes 0-15 give
// rows r..r+15 at column 16kk, lanes 16-31 the same rows at 16kk+8.
template <int HS>
__device__ __forceinline__ void fa_ld_afrag(uint32_t* a, const uint16_t* s, int r, int kk) {
    const int lane = threadIdx.x & 31;
    fa_ldsm4(a, s + (r + (lane & 15)) * (HS + 8) + 16 * kk + 8 * (lane >> 4));
}

template <int HS, int BQ, int NW, bool SM>
__device__ __forceinline__ void flash_bwd_kv_v(uint16_t* __restrict__ dqkv, const uint16_t* __restrict__ dout,
                                               const uint16_t* __restrict__ qkv, const float* __restrict__ lse,
                                               const float* __restrict__ Dd, int T, int NH, int NKV, float scale_log2,
                                               float scale, bool set, uint16_t* smem) {
    constexpr int NT = 32 * NW, BKV = 16 * NW, QS = HS + 8, KD = HS / 16, ND = HS / 8, NQ = BQ / 8;
    constexpr int KR = SM ? 1 : KD;  // register fragments of K and V kept (1: unused)
    uint16_t* Ksm = smem;                          // SM: the block's K rows
    uint16_t* Vsm = Ksm + (SM ? BKV * QS : 0);     // SM: its V rows
    uint16_t* Qb = Vsm + (SM ? BKV * QS : 0);
    uint16_t* Gs = Qb + 2 * BQ * QS;
    float* Lb = reinterpret_cast<float*>(Gs + BQ * QS);
    float* Db = Lb + 2 * BQ;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    const int C = NH * HS, rep = NH / NKV;
    const int z = blockIdx.y, b = z / NKV, kv = z - b * NKV;  // one key/value head
    const int k0 = blockIdx.x * BKV;
    const i64 W = (i64)(NH + 2 * NKV) * HS;
    const uint16_t* kbase = qkv + (i64)b * T * W + (i64)(NH + kv) * HS;
    const uint16_t* vbase = kbase + (i64)NKV * HS;
    const int kw0 = k0 + warp * 16, kr0 = kw0 + g, kr1 = kr0 + 8;
    const bool active = kw0 < T;
    uint32_t kf[KR][4], vf[KR][4];
    if constexpr (SM) {
        fa_cp_rows<HS, NT>(Ksm, kbase, W, k0, BKV, T);  // waited for with the first Q tile
        fa_cp_rows<HS, NT>(Vsm, vbase, W, k0, BKV, T);
    } else {
        fa_ld_frag<HS>(kf, kbase, W, kr0, T);
        fa_ld_frag<HS>(vf, vbase, W, kr0, T);
    }
    float dk[ND][4], dv[ND][4];
#pragma unroll
    for (int j = 0; j < ND; j++) dk[j][0] = dk[j][1] = dk[j][2] = dk[j][3] = dv[j][0] = dv[j][1] = dv[j][2] = dv[j][3] = 0.f;
    const int nt = (T - k0 + BQ - 1) / BQ, nit = rep * nt;
    auto qhead = [&](int it) { return kv * rep + it / nt; };
    auto qstart = [&](int it) { return k0 + (it % nt) * BQ; };
    auto ld_q = [&](int it, int buf) {
        const int h = qhead(it), q0 = qstart(it);
        fa_cp_rows<HS, NT>(Qb + buf * BQ * QS, qkv + (i64)b * T * W + (i64)h * HS, W, q0, BQ, T);
        fa_cp_commit();
        const float* lz = lse + ((i64)b * NH + h) * T;
        const float* dz = Dd + ((i64)b * NH + h) * T;
        for (int i = tid; i < BQ; i += NT) {
            const int q = q0 + i;
            Lb[buf * BQ + i] = q < T ? lz[q] * FA_LOG2E : INFINITY;
            Db[buf * BQ + i] = q < T ? dz[q] : 0.f;
        }
    };
    ld_q(0, 0);
    for (int it = 0; it < nit; it++) {
        const int q0 = qstart(it);
        const uint16_t* Qs = Qb + (it & 1) * BQ * QS;
        const float* Ls = Lb + (it & 1) * BQ;
        const float* Ds = Db + (it & 1) * BQ;
        fa_cp_wait();
        __syncthreads();  // Q(q0) (and at first K, V) is in; every warp is done with the previous tile
        fa_cp_rows<HS, NT>(Gs, dout + (i64)b * T * C + (i64)qhead(it) * HS, C, q0, BQ, T);
        fa_cp_commit();
        const bool work = active && q0 + BQ > kw0;

        // Pᵀ = exp(scale·K·Qᵀ - lse), 16 keys x BQ queries.
        float s[NQ][4];
        const bool mask = q0 < kw0 + 16;
        if (work) {
#pragma unroll
            for (int j = 0; j < NQ; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < KD; kk++) {
                uint32_t ka[4];
                if constexpr (SM) fa_ld_afrag<HS>(ka, Ksm, warp * 16, kk);
                const uint32_t* a = SM ? ka : kf[SM ? 0 : kk];
#pragma unroll
                for (int j = 0; j < NQ; j += 2) {
                    uint32_t bq[4];  // Q rows 8j..8j+15, columns 16kk..16kk+15
                    fa_ldsm4(bq, Qs + (8 * j + (lane & 7) + 8 * (lane >> 4)) * QS + 16 * kk + 8 * ((lane >> 3) & 1));
                    fa_mma(s[j], a, bq[0], bq[1]);
                    fa_mma(s[j + 1], a, bq[2], bq[3]);
                }
            }
#pragma unroll
            for (int j = 0; j < NQ; j++) {
                const int qi = 8 * j + 2 * c, q = q0 + qi;
                const float l0 = Ls[qi], l1 = Ls[qi + 1];
                s[j][0] = fa_exp2(s[j][0] * scale_log2 - l0);
                s[j][1] = fa_exp2(s[j][1] * scale_log2 - l1);
                s[j][2] = fa_exp2(s[j][2] * scale_log2 - l0);
                s[j][3] = fa_exp2(s[j][3] * scale_log2 - l1);
                if (mask) {
                    if (q < kr0) s[j][0] = 0.f;
                    if (q + 1 < kr0) s[j][1] = 0.f;
                    if (q < kr1) s[j][2] = 0.f;
                    if (q + 1 < kr1) s[j][3] = 0.f;
                }
            }
        }
        fa_cp_wait();
        __syncthreads();  // dO(q0) is in
        if (it + 1 < nit) ld_q(it + 1, (it + 1) & 1);
        if (!work) continue;

        // dPᵀ = V·dOᵀ, then dSᵀ = Pᵀ∘(dPᵀ - D) in place.
        float dp[NQ][4];
#pragma unroll
        for (int j = 0; j < NQ; j++) dp[j][0] = dp[j][1] = dp[j][2] = dp[j][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < KD; kk++) {
            uint32_t va[4];
            if constexpr (SM) fa_ld_afrag<HS>(va, Vsm, warp * 16, kk);
            const uint32_t* a = SM ? va : vf[SM ? 0 : kk];
#pragma unroll
            for (int j = 0; j < NQ; j += 2) {
                uint32_t bg[4];
                fa_ldsm4(bg, Gs + (8 * j + (lane & 7) + 8 * (lane >> 4)) * QS + 16 * kk + 8 * ((lane >> 3) & 1));
                fa_mma(dp[j], a, bg[0], bg[1]);
                fa_mma(dp[j + 1], a, bg[2], bg[3]);
            }
        }
#pragma unroll
        for (int j = 0; j < NQ; j++) {
            const int qi = 8 * j + 2 * c;
            const float d0 = Ds[qi], d1 = Ds[qi + 1];
            dp[j][0] = s[j][0] * (dp[j][0] - d0);
            dp[j][1] = s[j][1] * (dp[j][1] - d1);
            dp[j][2] = s[j][2] * (dp[j][2] - d0);
            dp[j][3] = s[j][3] * (dp[j][3] - d1);
        }
        // dV += Pᵀ·dO and dK += dSᵀ·Q.
#pragma unroll
        for (int kk = 0; kk < BQ / 16; kk++) {
            uint32_t pa[4], da[4];
            pa[0] = fa_pack(s[2 * kk][0], s[2 * kk][1]);
            pa[1] = fa_pack(s[2 * kk][2], s[2 * kk][3]);
            pa[2] = fa_pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            pa[3] = fa_pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
            da[0] = fa_pack(dp[2 * kk][0], dp[2 * kk][1]);
            da[1] = fa_pack(dp[2 * kk][2], dp[2 * kk][3]);
            da[2] = fa_pack(dp[2 * kk + 1][0], dp[2 * kk + 1][1]);
            da[3] = fa_pack(dp[2 * kk + 1][2], dp[2 * kk + 1][3]);
            const int off = (16 * kk + (lane & 15)) * QS + 8 * (lane >> 4);
#pragma unroll
            for (int j = 0; j < ND; j += 2) {
                uint32_t bg[4], bq[4];
                fa_ldsm4t(bg, Gs + off + 8 * j);
                fa_mma(dv[j], pa, bg[0], bg[1]);
                fa_mma(dv[j + 1], pa, bg[2], bg[3]);
                fa_ldsm4t(bq, Qs + off + 8 * j);
                fa_mma(dk[j], da, bq[0], bq[1]);
                fa_mma(dk[j + 1], da, bq[2], bq[3]);
            }
        }
    }
    if (!active) return;
    uint16_t* dkb = dqkv + (i64)b * T * W + (i64)(NH + kv) * HS + 2 * c;
    uint16_t* dvb = dkb + (i64)NKV * HS;
    if (kr0 < T) {
#pragma unroll
        for (int j = 0; j < ND; j++) {
            fa_acc2(dkb + (i64)kr0 * W + j * 8, dk[j][0] * scale, dk[j][1] * scale, set);
            fa_acc2(dvb + (i64)kr0 * W + j * 8, dv[j][0], dv[j][1], set);
        }
    }
    if (kr1 < T) {
#pragma unroll
        for (int j = 0; j < ND; j++) {
            fa_acc2(dkb + (i64)kr1 * W + j * 8, dk[j][2] * scale, dk[j][3] * scale, set);
            fa_acc2(dvb + (i64)kr1 * W + j * 8, dv[j][2], dv[j][3], set);
        }
    }
}

template <int HS, int BK, int NW, bool SM>
__device__ __forceinline__ void flash_bwd_q_v(uint16_t* __restrict__ dqkv, const uint16_t* __restrict__ dout,
                                              const uint16_t* __restrict__ qkv, const float* __restrict__ lse,
                                              const float* __restrict__ Dd, int T, int NH, int NKV, float scale_log2,
                                              float scale, bool set, uint16_t* smem) {
    constexpr int NT = 32 * NW, BR = 16 * NW, KS = HS + 8, KD = HS / 16, ND = HS / 8, NK = BK / 8;
    constexpr int QR = SM ? 1 : KD;
    uint16_t* Qsm = smem;                       // SM: the block's Q rows
    uint16_t* Gsm = Qsm + (SM ? BR * KS : 0);   // SM: its dO rows
    uint16_t* Kb = Gsm + (SM ? BR * KS : 0);
    uint16_t* Vs = Kb + 2 * BK * KS;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    const int C = NH * HS, z = blockIdx.y, b = z / NH, h = z - b * NH, kv = h / (NH / NKV);
    const int q0 = (gridDim.x - 1 - blockIdx.x) * BR;  // the most keys first
    const i64 W = (i64)(NH + 2 * NKV) * HS;
    const uint16_t* base = qkv + (i64)b * T * W + (i64)h * HS;
    const uint16_t* kbase = qkv + (i64)b * T * W + (i64)(NH + kv) * HS;
    const uint16_t* vbase = kbase + (i64)NKV * HS;
    const uint16_t* gbase = dout + (i64)b * T * C + (i64)h * HS;
    const int w0 = q0 + warp * 16, r0 = w0 + g, r1 = r0 + 8;
    const bool active = w0 < T;
    uint32_t qf[QR][4], gf[QR][4];
    if constexpr (SM) {
        fa_cp_rows<HS, NT>(Qsm, base, W, q0, BR, T);  // waited for with the first K tile
        fa_cp_rows<HS, NT>(Gsm, gbase, C, q0, BR, T);
    } else {
        fa_ld_frag<HS>(qf, base, W, r0, T);
        fa_ld_frag<HS>(gf, gbase, C, r0, T);
    }
    const float l0 = r0 < T ? lse[(i64)z * T + r0] * FA_LOG2E : INFINITY;
    const float l1 = r1 < T ? lse[(i64)z * T + r1] * FA_LOG2E : INFINITY;
    const float d0 = r0 < T ? Dd[(i64)z * T + r0] : 0.f;
    const float d1 = r1 < T ? Dd[(i64)z * T + r1] : 0.f;
    float dq[ND][4];
#pragma unroll
    for (int j = 0; j < ND; j++) dq[j][0] = dq[j][1] = dq[j][2] = dq[j][3] = 0.f;
    const int qlast = min(q0 + BR, T) - 1;

    fa_cp_rows<HS, NT>(Kb, kbase, W, 0, BK, T);
    fa_cp_commit();
    for (int k0 = 0, it = 0; k0 <= qlast; k0 += BK, it++) {
        const uint16_t* Ks = Kb + (it & 1) * BK * KS;
        fa_cp_wait();
        __syncthreads();  // K(k0) (and at first Q, dO) is in; every warp is done with V and K of the previous tile
        fa_cp_rows<HS, NT>(Vs, vbase, W, k0, BK, T);
        fa_cp_commit();
        const bool work = active && k0 <= w0 + 15;

        // P = exp(scale·Q·Kᵀ - lse), 16 rows x BK keys.
        float s[NK][4];
        if (work) {
            const bool mask = k0 + BK - 1 > w0;
#pragma unroll
            for (int j = 0; j < NK; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < KD; kk++) {
                uint32_t qa[4];
                if constexpr (SM) fa_ld_afrag<HS>(qa, Qsm, warp * 16, kk);
                const uint32_t* a = SM ? qa : qf[SM ? 0 : kk];
#pragma unroll
                for (int j = 0; j < NK; j += 2) {
                    uint32_t bk[4];
                    fa_ldsm4(bk, Ks + (8 * j + (lane & 7) + 8 * (lane >> 4)) * KS + 16 * kk + 8 * ((lane >> 3) & 1));
                    fa_mma(s[j], a, bk[0], bk[1]);
                    fa_mma(s[j + 1], a, bk[2], bk[3]);
                }
            }
#pragma unroll
            for (int j = 0; j < NK; j++) {
                const int key = k0 + 8 * j + 2 * c;
                s[j][0] = fa_exp2(s[j][0] * scale_log2 - l0);
                s[j][1] = fa_exp2(s[j][1] * scale_log2 - l0);
                s[j][2] = fa_exp2(s[j][2] * scale_log2 - l1);
                s[j][3] = fa_exp2(s[j][3] * scale_log2 - l1);
                if (mask) {
                    if (key > r0) s[j][0] = 0.f;
                    if (key + 1 > r0) s[j][1] = 0.f;
                    if (key > r1) s[j][2] = 0.f;
                    if (key + 1 > r1) s[j][3] = 0.f;
                }
            }
        }
        fa_cp_wait();
        __syncthreads();  // V(k0) is in
        if (k0 + BK <= qlast) {
            fa_cp_rows<HS, NT>(Kb + ((it + 1) & 1) * BK * KS, kbase, W, k0 + BK, BK, T);
            fa_cp_commit();
        }
        if (!work) continue;

        // dP = dO·Vᵀ, then dS = P∘(dP - D) in place.
        float dp[NK][4];
#pragma unroll
        for (int j = 0; j < NK; j++) dp[j][0] = dp[j][1] = dp[j][2] = dp[j][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < KD; kk++) {
            uint32_t ga[4];
            if constexpr (SM) fa_ld_afrag<HS>(ga, Gsm, warp * 16, kk);
            const uint32_t* a = SM ? ga : gf[SM ? 0 : kk];
#pragma unroll
            for (int j = 0; j < NK; j += 2) {
                uint32_t bv[4];
                fa_ldsm4(bv, Vs + (8 * j + (lane & 7) + 8 * (lane >> 4)) * KS + 16 * kk + 8 * ((lane >> 3) & 1));
                fa_mma(dp[j], a, bv[0], bv[1]);
                fa_mma(dp[j + 1], a, bv[2], bv[3]);
            }
        }
#pragma unroll
        for (int j = 0; j < NK; j++) {
            dp[j][0] = s[j][0] * (dp[j][0] - d0);
            dp[j][1] = s[j][1] * (dp[j][1] - d0);
            dp[j][2] = s[j][2] * (dp[j][2] - d1);
            dp[j][3] = s[j][3] * (dp[j][3] - d1);
        }
        // dQ += dS·K.
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) {
            uint32_t da[4];
            da[0] = fa_pack(dp[2 * kk][0], dp[2 * kk][1]);
            da[1] = fa_pack(dp[2 * kk][2], dp[2 * kk][3]);
            da[2] = fa_pack(dp[2 * kk + 1][0], dp[2 * kk + 1][1]);
            da[3] = fa_pack(dp[2 * kk + 1][2], dp[2 * kk + 1][3]);
            const int off = (16 * kk + (lane & 15)) * KS + 8 * (lane >> 4);
#pragma unroll
            for (int j = 0; j < ND; j += 2) {
                uint32_t bk[4];
                fa_ldsm4t(bk, Ks + off + 8 * j);
                fa_mma(dq[j], da, bk[0], bk[1]);
                fa_mma(dq[j + 1], da, bk[2], bk[3]);
            }
        }
    }
    if (!active) return;
    uint16_t* dqb = dqkv + (i64)b * T * W + (i64)h * HS + 2 * c;
    if (r0 < T) {
#pragma unroll
        for (int j = 0; j < ND; j++) fa_acc2(dqb + (i64)r0 * W + j * 8, dq[j][0] * scale, dq[j][1] * scale, set);
    }
    if (r1 < T) {
#pragma unroll
        for (int j = 0; j < ND; j++) fa_acc2(dqb + (i64)r1 * W + j * 8, dq[j][2] * scale, dq[j][3] * scale, set);
    }
}

// ---- Entry points ----

// flash_fwd_bf16_hs64 and _hs128: out(B,T,C) and lse(B,NH,T) from
// qkv(B,T,(NH+2·NKV)·hs), all bf16 but lse, C = NH·hs: NH query heads, then
// NKV key heads, then NKV value heads (NKV divides NH; query head h attends
// with key/value head h/(NH/NKV); NKV = NH is multi-head attention, the
// layout (B,T,3C)). Grid (ceil(T/64), B·NH), 128 threads. scale_log2 is
// log2(e)/sqrt(hs).
extern "C" __global__ void __launch_bounds__(FA_THREADS, FA_FWD_MINB)
    flash_fwd_bf16_hs64(void* out, float* lse, const void* qkv, int T, int NH, int NKV, float scale_log2) {
    __shared__ __align__(16) uint16_t Ks[FA_BK * (64 + 8)];
    __shared__ __align__(16) uint16_t Vs[FA_BK * (64 + 8)];
    flash_fwd<64>((uint16_t*)out, lse, (const uint16_t*)qkv, T, NH, NKV, scale_log2, Ks, Vs);
}

extern "C" __global__ void __launch_bounds__(FA_THREADS)
    flash_fwd_bf16_hs128(void* out, float* lse, const void* qkv, int T, int NH, int NKV, float scale_log2) {
    __shared__ __align__(16) uint16_t Ks[FA_BK * (128 + 8)];
    __shared__ __align__(16) uint16_t Vs[FA_BK * (128 + 8)];
    flash_fwd<128>((uint16_t*)out, lse, (const uint16_t*)qkv, T, NH, NKV, scale_log2, Ks, Vs);
}

// flash_fwd_bf16_hs80 and _hs96: the same at head sizes 80 and 96 (five
// and six 16-column slices of a head: fa_mma_k2 takes the odd one alone).
#define FA_FWD(HS) \
    extern "C" __global__ void __launch_bounds__(FA_THREADS) \
        flash_fwd_bf16_hs##HS(void* out, float* lse, const void* qkv, int T, int NH, int NKV, float scale_log2) { \
        __shared__ __align__(16) uint16_t Ks[FA_BK * (HS + 8)]; \
        __shared__ __align__(16) uint16_t Vs[FA_BK * (HS + 8)]; \
        flash_fwd<HS>((uint16_t*)out, lse, (const uint16_t*)qkv, T, NH, NKV, scale_log2, Ks, Vs); \
    }
FA_FWD(80)
FA_FWD(96)

// flash_fwd2_bf16_hs64: flash_fwd_bf16_hs64 with two 16-row tiles per
// warp (flash_fwd_mt): grid (ceil(T/128), B·NH), 128 threads.
extern "C" __global__ void __launch_bounds__(FA_THREADS, 2)
    flash_fwd2_bf16_hs64(void* out, float* lse, const void* qkv, int T, int NH, int NKV, float scale_log2) {
    __shared__ __align__(16) uint16_t Ks[FA_BK * (64 + 8)];
    __shared__ __align__(16) uint16_t Vs[FA_BK * (64 + 8)];
    flash_fwd_mt<64, 2>((uint16_t*)out, lse, (const uint16_t*)qkv, T, NH, NKV, scale_log2, Ks, Vs);
}

// flash_fwd2_bf16_hs128 and flash_fwd2k32_bf16_hs128 (the default, see
// flash.go's flashFwd2x128): head size 128, 64 and 32 keys per tile;
// grid (ceil(T/128), B·NH), 128 threads.
extern "C" __global__ void __launch_bounds__(FA_THREADS, 1)
    flash_fwd2_bf16_hs128(void* out, float* lse, const void* qkv, int T, int NH, int NKV, float scale_log2) {
    __shared__ __align__(16) uint16_t Ks[FA_BK * (128 + 8)];
    __shared__ __align__(16) uint16_t Vs[FA_BK * (128 + 8)];
    flash_fwd_mt<128, 2>((uint16_t*)out, lse, (const uint16_t*)qkv, T, NH, NKV, scale_log2, Ks, Vs);
}

extern "C" __global__ void __launch_bounds__(FA_THREADS, 2)
    flash_fwd2k32_bf16_hs128(void* out, float* lse, const void* qkv, int T, int NH, int NKV, float scale_log2) {
    __shared__ __align__(16) uint16_t Ks[32 * (128 + 8)];
    __shared__ __align__(16) uint16_t Vs[32 * (128 + 8)];
    flash_fwd_mt<128, 2, 32>((uint16_t*)out, lse, (const uint16_t*)qkv, T, NH, NKV, scale_log2, Ks, Vs);
}

// flash_bwd entry points: dqkv(B,T,(NH+2·NKV)·hs) += the gradients from
// dout(B,T,C), qkv (the forward's layout), lse(B,NH,T) (natural log, the
// forward's) and D(B,NH,T), all bf16 but lse and D. Grids (ceil(T/64),
// B·NKV) for flash_bwd_kv (a block sums dK and dV over the group's query
// heads), (ceil(T/64), B·NH) for flash_bwd_q, 128 threads. scale_log2 is
// log2(e)/sqrt(hs), scale 1/sqrt(hs). For head size 128 the kernels stream
// 32 queries (keys) at a time, to keep their accumulators in registers.
extern "C" __global__ void __launch_bounds__(FA_THREADS)
    flash_bwd_kv_bf16_hs64(void* dqkv, const void* dout, const void* qkv, const float* lse, const float* D, int T, int NH,
                           int NKV, float scale_log2, float scale, int set) {
    __shared__ __align__(16) uint16_t Qb[2 * 64 * (64 + 8)];
    __shared__ __align__(16) uint16_t Gs[64 * (64 + 8)];
    __shared__ float Lb[2 * 64], Db[2 * 64];
    flash_bwd_kv<64, 64>((uint16_t*)dqkv, (const uint16_t*)dout, (const uint16_t*)qkv, lse, D, T, NH, NKV, scale_log2, scale, set != 0,
                         Qb, Gs, Lb, Db);
}

extern "C" __global__ void __launch_bounds__(FA_THREADS)
    flash_bwd_kv_bf16_hs128(void* dqkv, const void* dout, const void* qkv, const float* lse, const float* D, int T, int NH,
                            int NKV, float scale_log2, float scale, int set) {
    __shared__ __align__(16) uint16_t Qb[2 * 32 * (128 + 8)];
    __shared__ __align__(16) uint16_t Gs[32 * (128 + 8)];
    __shared__ float Lb[2 * 32], Db[2 * 32];
    flash_bwd_kv<128, 32>((uint16_t*)dqkv, (const uint16_t*)dout, (const uint16_t*)qkv, lse, D, T, NH, NKV, scale_log2, scale, set != 0,
                          Qb, Gs, Lb, Db);
}

extern "C" __global__ void __launch_bounds__(FA_THREADS)
    flash_bwd_q_bf16_hs64(void* dqkv, const void* dout, const void* qkv, const float* lse, const float* D, int T, int NH,
                          int NKV, float scale_log2, float scale, int set) {
    __shared__ __align__(16) uint16_t Kb[2 * 64 * (64 + 8)];
    __shared__ __align__(16) uint16_t Vs[64 * (64 + 8)];
    flash_bwd_q<64, 64>((uint16_t*)dqkv, (const uint16_t*)dout, (const uint16_t*)qkv, lse, D, T, NH, NKV, scale_log2, scale, set != 0, Kb, Vs);
}

extern "C" __global__ void __launch_bounds__(FA_THREADS)
    flash_bwd_q_bf16_hs128(void* dqkv, const void* dout, const void* qkv, const float* lse, const float* D, int T, int NH,
                           int NKV, float scale_log2, float scale, int set) {
    __shared__ __align__(16) uint16_t Kb[2 * 32 * (128 + 8)];
    __shared__ __align__(16) uint16_t Vs[32 * (128 + 8)];
    flash_bwd_q<128, 32>((uint16_t*)dqkv, (const uint16_t*)dout, (const uint16_t*)qkv, lse, D, T, NH, NKV, scale_log2, scale, set != 0, Kb, Vs);
}

// flash_bwd_kv_bf16_hs80, _hs96, flash_bwd_q_bf16_hs80, _hs96: the split
// kernels at head sizes 80 and 96, 32 queries (keys) at a time as at 128.
#define FA_BWD_SPLIT(HS, BT) \
    extern "C" __global__ void __launch_bounds__(FA_THREADS) \
        flash_bwd_kv_bf16_hs##HS(void* dqkv, const void* dout, const void* qkv, const float* lse, const float* D, int T, \
                                 int NH, int NKV, float scale_log2, float scale, int set) { \
        __shared__ __align__(16) uint16_t Qb[2 * BT * (HS + 8)]; \
        __shared__ __align__(16) uint16_t Gs[BT * (HS + 8)]; \
        __shared__ float Lb[2 * BT], Db[2 * BT]; \
        flash_bwd_kv<HS, BT>((uint16_t*)dqkv, (const uint16_t*)dout, (const uint16_t*)qkv, lse, D, T, NH, NKV, scale_log2, \
                             scale, set != 0, Qb, Gs, Lb, Db); \
    } \
    extern "C" __global__ void __launch_bounds__(FA_THREADS) \
        flash_bwd_q_bf16_hs##HS(void* dqkv, const void* dout, const void* qkv, const float* lse, const float* D, int T, \
                                int NH, int NKV, float scale_log2, float scale, int set) { \
        __shared__ __align__(16) uint16_t Kb[2 * BT * (HS + 8)]; \
        __shared__ __align__(16) uint16_t Vs[BT * (HS + 8)]; \
        flash_bwd_q<HS, BT>((uint16_t*)dqkv, (const uint16_t*)dout, (const uint16_t*)qkv, lse, D, T, NH, NKV, scale_log2, \
                            scale, set != 0, Kb, Vs); \
    }
FA_BWD_SPLIT(80, 32)
FA_BWD_SPLIT(96, 32)

// flash_bwd_kv_v and flash_bwd_q_v entry points (the split backward's
// variants; flash.go): operands as flash_bwd_kv_* and flash_bwd_q_*; grid
// (ceil(T/(16·NW)), B·NKV) and (ceil(T/(16·NW)), B·NH), 32·NW threads,
// fa_bwd_kv_smem / fa_bwd_q_smem bytes of dynamic shared memory (flash.go
// computes the same sizes, flashBwdVariantOf). _sm: 4 warps, the fixed
// operands in shared memory, 64-row tiles. (8 warps per block, with or
// without the fixed operands in shared memory, ran slower on the H200:
// tools/bench/results/kernels_h200.json; the template keeps NW for them.)
#define FA_BWD_V(KIND, NAME, HS, BT, NW, SM, MINB) \
    extern "C" __global__ void __launch_bounds__(32 * NW, MINB) \
        NAME(void* dqkv, const void* dout, const void* qkv, const float* lse, const float* D, int T, int NH, int NKV, \
             float scale_log2, float scale, int set) { \
        extern __shared__ __align__(16) uint16_t fa_dyn[]; \
        KIND<HS, BT, NW, SM>((uint16_t*)dqkv, (const uint16_t*)dout, (const uint16_t*)qkv, lse, D, T, NH, NKV, scale_log2, \
                             scale, set != 0, fa_dyn); \
    }
FA_BWD_V(flash_bwd_kv_v, flash_bwd_kv_sm_bf16_hs64, 64, 64, 4, true, 3)
FA_BWD_V(flash_bwd_kv_v, flash_bwd_kv_sm_bf16_hs128, 128, 64, 4, true, 2)
FA_BWD_V(flash_bwd_q_v, flash_bwd_q_sm_bf16_hs64, 64, 64, 4, true, 4)
FA_BWD_V(flash_bwd_q_v, flash_bwd_q_sm_bf16_hs128, 128, 64, 4, true, 2)
FA_BWD_V(flash_bwd_kv_v, flash_bwd_kv_sm_bf16_hs80, 80, 64, 4, true, 2)
FA_BWD_V(flash_bwd_kv_v, flash_bwd_kv_sm_bf16_hs96, 96, 64, 4, true, 2)
FA_BWD_V(flash_bwd_q_v, flash_bwd_q_sm_bf16_hs80, 80, 64, 4, true, 2)
FA_BWD_V(flash_bwd_q_v, flash_bwd_q_sm_bf16_hs96, 96, 64, 4, true, 2)

// flash_bwd_fused entry points: dqkv's key and value columns += (or, with
// set, =) dK and dV, and dq(B, NH, T, hs) float32 += the unscaled dQ, which
// must be zero on entry (flash_bwd_prep zeroes it) and is then written into
// dqkv by flash_bwd_dq. Operands as flash_bwd_kv's; dq 8-byte aligned.
// Grid (ceil(T/64), B·NKV), 128 threads: 64 keys per block, 16 per warp.
// The head-size-64 kernel walks 64 query rows at a time, the head-size-128
// kernel 32 with K read from shared memory (registers: dK, dV and V
// fragments stay in them). Not bitwise reproducible: dq's atomic float32 sums follow
// the blocks' schedule.
#define FA_FUSED_SMEM(HS, BQ) \
    __shared__ __align__(16) uint16_t Ks[64 * (HS + 8)]; \
    __shared__ __align__(16) uint16_t Qb[2 * BQ * (HS + 8)]; \
    __shared__ __align__(16) uint16_t Gs[BQ * (HS + 8)]; \
    __shared__ __align__(16) uint16_t St[64 * (BQ + 8)]; \
    __shared__ float Lb[2 * BQ], Db[2 * BQ]
#define FA_FUSED_CALL(HS, BQ, KREG) \
    flash_bwd_fused<HS, BQ, 4, KREG>((uint16_t*)dqkv, dq, (const uint16_t*)dout, (const uint16_t*)qkv, lse, D, T, NH, NKV, \
                               scale_log2, scale, set != 0, Ks, Qb, Gs, St, Lb, Db)

extern "C" __global__ void __launch_bounds__(FA_THREADS)
    flash_bwd_fused_bf16_hs64(void* dqkv, float* dq, const void* dout, const void* qkv, const float* lse, const float* D,
                              int T, int NH, int NKV, float scale_log2, float scale, int set) {
    FA_FUSED_SMEM(64, 64);
    FA_FUSED_CALL(64, 64, true);
}

extern "C" __global__ void __launch_bounds__(FA_THREADS)
    flash_bwd_fused_bf16_hs128(void* dqkv, float* dq, const void* dout, const void* qkv, const float* lse, const float* D,
                               int T, int NH, int NKV, float scale_log2, float scale, int set) {
    FA_FUSED_SMEM(128, 32);
    FA_FUSED_CALL(128, 32, false);
}

// flash_bwd_dq: dqkv's query columns = (set ? 0 : dqkv) + scale·dq, one
// rounding to bf16; dq(B, NH, T, hs) float32 from flash_bwd_fused, n2 =
// B·NH·T·hs/2 pairs, grid-stride. hs even; dqkv 4-byte aligned.
extern "C" __global__ void flash_bwd_dq(void* dqkv, const float* dq, long long n2, int T, int NH, int NKV, int hs,
                                        float scale, int set) {
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n2; i += (i64)gridDim.x * blockDim.x)
        flash_bwd_dq_store((uint16_t*)dqkv, dq, i, T, NH, NKV, hs, scale, set != 0);
}

// flash_bwd_prep: D[(b·NH + h)·T + t] = Σ_d dout·out over head h of token
// (b, t), in float32; one warp per (token, head), grid-stride. dout and out
// bf16 (B,T,C), 4-byte aligned; hs even. Unless dq is null it also zeroes
// the first nzr rows of hs floats of dq, float32, 8-byte aligned: the
// accumulator of the fused backward (B·NH·T rows for flash_bwd_fused's
// dq(B, NH, T, hs), B·NH·ceil(T/64)·64 for the Hopper ones' tiles).
extern "C" __global__ void flash_bwd_prep(float* D, const void* dout, const void* out, int BT, int T, int C, int NH,
                                          float* dq, long long nzr) {
    const int hs = C / NH, lane = threadIdx.x & 31;
    const int nw = BT * NH, stride = gridDim.x * (blockDim.x >> 5);  // BT·NH < 2^31 (checked by the host)
    for (int w = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); w < nw; w += stride) {
        const int tok = w / NH, h = w - tok * NH;
        const uint16_t* g = (const uint16_t*)dout + (i64)tok * C + h * hs;
        const uint16_t* o = (const uint16_t*)out + (i64)tok * C + h * hs;
        float acc = 0.f;
        for (int d = 2 * lane; d < hs; d += 64) {
            const uint32_t a = fa_ld32(g + d), e = fa_ld32(o + d);
            acc += __uint_as_float(a << 16) * __uint_as_float(e << 16) +
                   __uint_as_float(a & 0xffff0000u) * __uint_as_float(e & 0xffff0000u);
        }
        acc = warp_sum(acc);
        const int b = tok / T, t = tok - b * T;
        if (lane == 0) D[((i64)b * NH + h) * T + t] = acc;
    }
    if (dq == nullptr) return;
    for (i64 w = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); w < nzr; w += stride) {
        float* r = dq + w * hs;
        for (int d = 2 * lane; d < hs; d += 64) *reinterpret_cast<float2*>(r + d) = make_float2(0.f, 0.f);
    }
}
