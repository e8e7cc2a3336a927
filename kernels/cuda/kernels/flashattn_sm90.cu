// flashattn_sm90: causal attention forward for Hopper (sm_90a) on the
// warpgroup tensor-core instructions (wgmma), bf16 with head size 64 or 128;
// the same contract as flash_fwd_bf16_hs64/_hs128 in flashattn.cu (see
// flash_sm90.go). Compiled for compute_90a by tools/cuda/ptx.sh (files
// named *_sm90.cu); the module loads only on a device of compute capability
// 9.0.
//
// A block computes 64·MT·WG query rows of one (batch, head) with WG
// warpgroups (4 warps, 128 threads each) of MT row tiles of 64 rows each,
// warp w of a warpgroup owning rows 16w..16w+15 of each of its tiles
// (flash_fwd_sm90<HS, MT, WG>; the entry points use MT·WG = 1, or 2 in the
// flash_fwd2_sm90 kernels: MT 2 for head size 64, WG 2 for 128, where two
// tiles' accumulators would not fit one warpgroup's registers). Keys and
// values stream through shared memory 64 at a time (cp.async; the next K
// tile loads during this tile's P·V, V during its S = Q·Kᵀ and softmax),
// each tile feeding every row tile of the block. Per key tile and row tile:
//   S(64x64) = Q·Kᵀ: HS/16 wgmma m64n64k16, A = Q from registers (loaded
//     once), B = the K tile, K-major (keys are N, head dims K);
//   causal mask on the tiles that reach past the warp's first row, online
//     softmax in base 2 on the accumulator fragments (as flash_fwd);
//   O(64xHS) += P·V: 4 wgmma m64nHSk16, A = P converted to bf16 in
//     registers, B = the V tile, N-major (imm-trans-b 1: head dims are N,
//     contiguous; keys K).
// Only out(B,T,C) and lse(B,NH,T) (natural log) are written.
//
// flash_fwd_sm90p (entry points flash_fwd3_sm90, two warpgroups, and
// flash_fwd3x1_sm90, one) pipelines the same work: per key tile j it
// issues S(j) and the previous tile's P(j-1)·V(j-1) as two wgmma groups,
// waits for S(j) only (wait_group 1), and does the softmax of S(j) while
// P(j-1)·V(j-1) runs on the tensor cores; O is rescaled after wait_group 0.
// It keeps rings of D K and D V tiles in dynamic shared memory, in the
// 128-byte swizzled layout (f9_load_tile_sw; each tile
// copied D-1 iterations before its use, cp.async.wait_group D-2; one
// barrier per key tile) and loops over every key tile of the block in
// both warpgroups, with no wgmma under a branch (ptxas serializes all
// wgmma of a function otherwise: C7515).
//
// PTX ISA facts used (section 9.7.15, "Asynchronous Warpgroup Level Matrix
// Multiply-Accumulate"):
//  - Register fragments of .m64nNk16 (9.7.15.5.1.1.1): warp w of the
//    warpgroup holds rows 16w..16w+15; within a warp, A (64x16 bf16, 4
//    registers) and D (f32, N/2 registers) have the layouts of the
//    mma.m16n8k16 A and C fragments, D repeated per 8 columns: with g =
//    lane/4, c = lane%4, d[4j], d[4j+1] are row g, cols 8j+2c, 8j+2c+1 and
//    d[4j+2], d[4j+3] row g+8, same cols; a0: row g cols 2c,2c+1, a1: row
//    g+8, a2: row g cols 2c+8,+9, a3: row g+8 cols 2c+8,+9.
//  - Shared memory layouts without swizzling (9.7.15.5.1.2, "canonical
//    layouts", T = 8 bf16 = 16 bytes): K-major ((8,m),(T,2k)) with strides
//    ((T,SBO),(1,LBO)); MN-major ((T,1,m),(8,k)) with strides
//    ((1,T,SBO),(T,LBO)). In both, a core matrix is 8 rows of 16 contiguous
//    bytes (128 bytes); LBO steps 8 elements along K and SBO 8 along M/N.
//  - Matrix descriptor (9.7.15.5.1.2.2): bits 0-13 start address, 16-29
//    LBO, 32-45 SBO, each encoded (x & 0x3FFFF) >> 4; bits 49-51 base
//    offset (0; unused without swizzle); bits 62-63 swizzle mode 0 (none).
//  - wgmma.fence before the first wgmma and whenever its registers were
//    written by other instructions; commit_group/wait_group before the
//    accumulators are read; shared memory written through the generic
//    proxy (cp.async without .bulk counts as such) must be made visible to
//    the async proxy with fence.proxy.async before wgmma reads it (9.7.15.2,
//    and the memory consistency model's proxy section).
//
// Tile layout in shared memory (both K and V, 64 keys x HS): the 16-byte
// chunk of key t, head dims 8q..8q+7 is at byte q·1024 + t·16. For K
// (K-major, N = key, K = dim) that makes LBO 1024 (next 8 dims) and SBO 128
// (next 8 keys); for V (N-major, N = dim, K = key) LBO 128 (next 8 keys) and
// SBO 1024 (next 8 dims). No swizzle: each core matrix is 128 contiguous
// bytes.
#include "flash_common.cuh"

#define F9_BQ 64  // query rows per block (one warpgroup)
#define F9_BK 64  // keys per shared-memory tile
#define F9_THREADS 128
#define F9_LN2 0.6931471805599453f

// f9_smem is the shared-window address of p.
__device__ __forceinline__ uint32_t f9_smem(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

// f9_cp16 starts a 16-byte cp.async from src to the shared dst; n bytes are
// read (16 or 0), the rest of the 16 written as zeros.
__device__ __forceinline__ void f9_cp16(uint16_t* dst, const uint16_t* src, int n) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(f9_smem(dst)), "l"(src), "r"(n));
}
// f9_fence_proxy orders this thread's shared-memory writes through the
// generic proxy (its completed cp.async copies included) before later
// async-proxy accesses (wgmma operand reads); a barrier after it publishes
// them to the warpgroup.
__device__ __forceinline__ void f9_fence_proxy() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// f9_bar<N> is bar.sync 1 over N threads (a multiple of 32): a named
// barrier, so that the threads of a block may meet it from different
// places in the code (the ping-pong forward's two warpgroups do).
template <int N>
__device__ __forceinline__ void f9_bar() {
    asm volatile("bar.sync 1, %0;\n" ::"n"(N) : "memory");
}

// f9_bar_sync_id and f9_bar_arrive_id meet, or only arrive at, named
// barrier id (2 or more: 0 is __syncthreads', 1 f9_bar's) of n threads:
// bar.sync waits until n threads have arrived, bar.arrive does not wait
// (the warpgroups with a producer order their products this way).
__device__ __forceinline__ void f9_bar_sync_id(int id, int n) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void f9_bar_arrive_id(int id, int n) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

// f9_wg_fence orders this thread's earlier register and shared accesses
// before the wgmma operations that follow (wgmma.fence).
__device__ __forceinline__ void f9_wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void f9_wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// f9_wg_wait waits for all of the warpgroup's committed wgmma groups.
__device__ __forceinline__ void f9_wg_wait() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// f9_wg_wait1 waits until at most one of the warpgroup's committed wgmma
// groups is pending (all but the newest done; wgmma.wait_group 1).
__device__ __forceinline__ void f9_wg_wait1() { asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory"); }
// f9_regs passes the N accumulators d through empty asm statements: after
// f9_wg_wait, it keeps the compiler from reading them before the wait.
template <int N>
__device__ __forceinline__ void f9_regs(float* d) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}

// f9_wgmma_n64: d(64x64, f32) = a(64x16, bf16 registers)·B(16x64) (+ d when acc
// != 0); B from shared memory through desc, TRANS_B 0 for K-major, 1 for N-major.
template <int TRANS_B>
__device__ __forceinline__ void f9_wgmma_n64(float* d, const uint32_t* a, uint64_t desc, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, %38;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(acc), "n"(TRANS_B));
}

// f9_wgmma_n128: d(64x128, f32) = a(64x16, bf16 registers)·B(16x128) (+ d when acc
// != 0); B from shared memory through desc, TRANS_B 0 for K-major, 1 for N-major.
template <int TRANS_B>
__device__ __forceinline__ void f9_wgmma_n128(float* d, const uint32_t* a, uint64_t desc, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, %70;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(acc), "n"(TRANS_B));
}

// f9_wgmma_ss_n64: d(64x64, f32) = A(64x16)·B(16x64) (+ d when acc != 0),
// both from shared memory: A through adesc, TRANS_A 0 for K-major (rows
// are M), 1 for M-major (rows are K: the N-major layout of B, M for N); B
// through bdesc, TRANS_B 0 for K-major, 1 for N-major.
template <int TRANS_B, int TRANS_A = 0>
__device__ __forceinline__ void f9_wgmma_ss_n64(float* d, uint64_t adesc, uint64_t bdesc, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, %36, %35;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(adesc), "l"(bdesc), "r"(acc), "n"(TRANS_B), "n"(TRANS_A));
}

// f9_wgmma_ss_n32 is f9_wgmma_ss_n64 with N = 32: d(64x32, f32).
template <int TRANS_B, int TRANS_A = 0>
__device__ __forceinline__ void f9_wgmma_ss_n32(float* d, uint64_t adesc, uint64_t bdesc, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1, %20, %19;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "l"(adesc), "l"(bdesc), "r"(acc), "n"(TRANS_B), "n"(TRANS_A));
}

// f9_wgmma_ss_n128 is f9_wgmma_ss_n64 with N = 128: d(64x128, f32).
template <int TRANS_B, int TRANS_A = 0>
__device__ __forceinline__ void f9_wgmma_ss_n128(float* d, uint64_t adesc, uint64_t bdesc, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, %68, %67;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(adesc), "l"(bdesc), "r"(acc), "n"(TRANS_B), "n"(TRANS_A));
}

// f9_sts32 stores the 32-bit word v at the shared address p (4-byte
// aligned): a generic-proxy write, which a wgmma may read only after
// fence.proxy.async and a barrier.
__device__ __forceinline__ void f9_sts32(uint16_t* p, uint32_t v) { *reinterpret_cast<uint32_t*>(p) = v; }
// f9_red2 adds (a, b) to the float32 pair at the global address p (8-byte
// aligned) as one vector reduction (red.global.add.v2.f32, sm_90).
__device__ __forceinline__ void f9_red2(float* p, float a, float b) {
    atomicAdd(reinterpret_cast<float2*>(p), make_float2(a, b));
}
// f9_sts128f stores (a, b, c, d) as the four float32 values at the shared
// address p (16-byte aligned): a generic-proxy write, which the bulk copy
// engine may read only after fence.proxy.async and a barrier.
__device__ __forceinline__ void f9_sts128f(float* p, float a, float b, float c, float d) {
    *reinterpret_cast<float4*>(p) = make_float4(a, b, c, d);
}
// f9_ldg128f loads the four float32 values at the global address p
// (16-byte aligned) into v as one vector load.
__device__ __forceinline__ void f9_ldg128f(const float* p, float* v) {
    const float4 x = *reinterpret_cast<const float4*>(p);
    v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
}
// f9_bulk_red adds the float32 values of bytes bytes (a multiple of 16) at
// shared address s to those at the global address p (both 16-byte aligned)
// on the bulk copy engine (cp.reduce.async.bulk ... .add.f32, sm_90), in
// the issuing thread's current bulk group; f9_bulk_commit closes the group.
// The shared source must not be written until f9_bulk_wait_read (the
// thread's committed groups have read their sources) and the barrier after
// it; f9_bulk_wait (the groups complete) before the block exits.
__device__ __forceinline__ void f9_bulk_red(float* p, uint32_t s, int bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(p), "r"(s),
                 "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void f9_bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void f9_bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
__device__ __forceinline__ void f9_bulk_wait() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

// f9_tmap is a tensor map (CUtensorMap: 128 opaque bytes, 64-byte
// aligned), encoded on the host by cuTensorMapEncodeTiled (cgo.go,
// spill_tmap3) and passed to a kernel by value as a __grid_constant__
// parameter, so that its address is one the bulk tensor copies may name.
struct __align__(64) f9_tmap {
    unsigned long long w[16];
};
// The mbarriers (PTX ISA 9.7.13.15, 64-bit objects in shared memory, 8-byte
// aligned): f9_mbar_init sets the barrier's expected arrivals to count
// (phase 0 in progress); f9_mbar_init_fence makes the initialisations
// visible to the async proxy (the bulk tensor copies that complete
// transactions on them) before the barrier that publishes them to the
// block; f9_mbar_expect_tx arrives once and raises the phase's expected
// transaction bytes by bytes (mbarrier.arrive.expect_tx); f9_mbar_arrive
// arrives once (release); f9_mbar_wait spins until the phase of the given
// parity has completed (try_wait.parity, acquire): phase k of a barrier
// has parity k & 1, and a fresh barrier counts its phase -1 (parity 1) as
// completed.
__device__ __forceinline__ void f9_mbar_init(uint64_t* bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(f9_smem(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void f9_mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void f9_mbar_expect_tx(uint64_t* bar, int bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(f9_smem(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void f9_mbar_arrive(uint64_t* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(f9_smem(bar)) : "memory");
}
__device__ __forceinline__ void f9_mbar_wait(uint64_t* bar, int parity) {
    asm volatile(
        "{\n.reg .pred p;\nF9_WAIT:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra F9_WAIT;\n}\n" ::"r"(
            f9_smem(bar)),
        "r"(parity)
        : "memory");
}
// f9_setmaxnreg_dec<N> and _inc<N> set the registers of each thread of
// the executing warpgroup (all of whose warps must run it) to N, a
// multiple of 8 in 24..256 (setmaxnreg.sync.aligned, sm_90a): a producer
// warpgroup gives registers up that the warpgroups of larger accumulators
// take; ptxas allocates the code that follows within N.
template <int N>
__device__ __forceinline__ void f9_setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void f9_setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
// f9_tma_load3 copies the box at coordinates (c0, c1, c2) (innermost
// first, in elements) of the tensor that tm maps into shared memory at dst
// on the bulk copy engine (cp.async.bulk.tensor.3d, tile mode), in the
// layout tm names (here the 128-byte swizzle; dst 1024-byte aligned), with
// elements outside the tensor written as zeros; the copy completes its
// bytes as transactions on bar, whose phase must expect them.
__device__ __forceinline__ void f9_tma_load3(uint16_t* dst, const f9_tmap* tm, int c0, int c1, int c2,
                                             uint64_t* bar) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
        "[%5];\n" ::"r"(f9_smem(dst)),
        "l"(tm), "r"(c0), "r"(c1), "r"(c2), "r"(f9_smem(bar))
        : "memory");
}

// ---- Device code: tools/cuda/emu.sh sm90 runs everything from here to the
// entry points on the host (tools/cuda/emu/flashattn_sm90_emu.cpp, with its
// own versions of the helpers above: fa_pack, fa_exp2, fa_ld32, f9_smem,
// f9_cp16, fa_cp_commit, fa_cp_wait, f9_fence_proxy, the wgmma ones,
// f9_regs), so it must stay plain C++ apart from those.

// f9_desc is the wgmma matrix descriptor of an operand at shared address a
// without swizzling, with leading and stride dimension byte offsets lbo and
// sbo (all multiples of 16).
__device__ __forceinline__ uint64_t f9_desc(uint32_t a, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((a & 0x3FFFFu) >> 4) | (uint64_t)((lbo & 0x3FFFFu) >> 4) << 16 |
           (uint64_t)((sbo & 0x3FFFFu) >> 4) << 32;
}

// f9_load_tile starts (with NT threads) the cp.async copies of global rows r0..r0+63 (row
// stride `stride` elements, HS elements each; zeros for rows at or past T)
// into the tile s in the layout above. The 8 threads of a quarter warp take
// one 16-byte column of 8 consecutive keys (128 contiguous shared bytes: no
// bank conflicts); a warp's 4 quarters take 4 consecutive columns of the
// same keys (64 contiguous global bytes per key).
template <int HS, int NT, bool UNROLL = false>
__device__ __forceinline__ void f9_load_tile(uint16_t* s, const uint16_t* g, i64 stride, int r0, int T) {
    // Thread i takes chunks i, i + NT, ...: the same column q, keys KS apart
    // (a loop, or unrolled with UNROLL: fewer registers in some kernels,
    // more in others, by ptxas -v).
    constexpr int ND = HS / 8, KS = NT / ND;
    static_assert(NT % (8 * ND) == 0 && F9_BK % KS == 0, "f9_load_tile: NT must cover whole 8-key rows of chunks");
    const int key0 = (threadIdx.x / (8 * ND)) * 8 + (threadIdx.x & 7), q = (threadIdx.x >> 3) % ND;
    if constexpr (UNROLL) {
#pragma unroll
        for (int it = 0; it < F9_BK / KS; it++) {
            const int key = key0 + it * KS, t = r0 + key;
            f9_cp16(s + q * (F9_BK * 8) + key * 8, t < T ? g + (i64)t * stride + q * 8 : g, t < T ? 16 : 0);
        }
    } else {
#pragma unroll 1
        for (int it = 0; it < F9_BK / KS; it++) {
            const int key = key0 + it * KS, t = r0 + key;
            f9_cp16(s + q * (F9_BK * 8) + key * 8, t < T ? g + (i64)t * stride + q * 8 : g, t < T ? 16 : 0);
        }
    }
}

// The 128-byte swizzled tile layout (flash_fwd_sm90p): without swizzling,
// the tensor cores' reads of a tile hit the same banks several times over
// (Nsight Compute on the H100: 69% of the forward's shared wavefronts
// excessive). A tile of BK keys (64, or 128 in the flash_fwd4 kernels) is
// HS/64 blocks of BK keys x 64 head dims (BK·128 bytes each, block d/64,
// 1024-byte aligned); in a block, key t's 64 dims are the 128-byte row at
// t·128 and their 16-byte chunk c (dims 8c..8c+7) sits at chunk position
// c ^ (t % 8) of the row: the PTX ISA's 128-byte swizzle (address bits 4-6
// XOR bits 7-9; 9.7.15.5.1.2). Both operands read the same layout: K as
// the K-major B of S = Q·Kᵀ (N = key rows of 128 bytes, 8-row groups SBO =
// 1024 apart, as many as the BK keys; LBO unused, 16; the k16 step kk at
// byte (kk/4)·BK·128 + (kk%4)·32), V as the N-major B of P·V (N = head
// dim, 64 per 128-byte row, the next 64 at LBO = BK·128; K = key, 8-key
// groups SBO = 1024 apart; the k16 step kk at byte kk·2048).
#ifndef F9_VSW_LBO
#define F9_VSW_LBO (BK * 128)
#define F9_VSW_SBO 1024
#endif

// f9_desc_sw is f9_desc with the 128-byte swizzle mode (bits 62-63 = 1).
__device__ __forceinline__ uint64_t f9_desc_sw(uint32_t a, uint32_t lbo, uint32_t sbo) {
    return f9_desc(a, lbo, sbo) | (uint64_t)1 << 62;
}

// f9_kdesc is the descriptor of k16 step kk of the swizzled tile of BK
// keys at shared address a read K-major (the tile's rows are M or N, head
// dims K); f9_ndesc that of the tile read N-major (rows are K: 16 rows a
// step, head dims N).
template <int BK = F9_BK>
__device__ __forceinline__ uint64_t f9_kdesc(uint32_t a, int kk) {
    return f9_desc_sw(a + (kk >> 2) * (BK * 128) + (kk & 3) * 32, 16, 1024);
}
template <int BK = F9_BK>
__device__ __forceinline__ uint64_t f9_ndesc(uint32_t a, int kk) {
    return f9_desc_sw(a + kk * 2048, F9_VSW_LBO, F9_VSW_SBO);
}

// f9_sw_off is the element offset of key t, head dims 8c..8c+7 in the
// swizzled tile of BK keys.
template <int BK = F9_BK>
__device__ __forceinline__ int f9_sw_off(int t, int c) {
    return (c >> 3) * (BK * 64) + t * 64 + (((c & 7) ^ (t & 7)) << 3);
}

// f9_cp_rows issues this thread's share of a swizzled tile copy of BK keys
// by NT threads (HS/8 consecutive threads a key row: HS·2 contiguous global
// bytes, whole 128-byte rows in shared memory, no bank conflicts): rows
// key0 + it·KS (key0 = threadIdx.x / (HS/8), KS = NT / (HS/8)) from p,
// p + kstride, ... (kstride = KS rows of the source) to s, s + KS·64, ...
// (s = the tile plus f9_sw_off(key0, its head dims): KS is a multiple of 8,
// so every row of the thread has key0's swizzle), zeros for the rows at or
// past rem (the source's rows left from key0; g, any valid address, read
// for none of them). When NT does not divide the tile's chunks (384
// threads), the last pass leaves some threads out. With the rows' products
// and swizzled offsets out of the loop, a copy takes a handful of
// instructions; worked out per copy (as before), about 25 in the SASS of
// flash_fwd3_sm90_bf16_hs64 (attn_cptile_h100.json).
template <int HS, int NT, int BK = F9_BK>
__device__ __forceinline__ void f9_cp_rows(uint16_t* s, const uint16_t* p, const uint16_t* g, i64 kstride, int rem) {
    constexpr int ND = HS / 8, KS = NT / ND, IT = (BK + KS - 1) / KS;
    static_assert(NT % ND == 0 && KS % 8 == 0, "f9_cp_rows: NT must cover whole keys, 8 rows a pass");
    const int key0 = threadIdx.x / ND;
#pragma unroll
    for (int it = 0; it < IT; it++) {
        if (BK % KS == 0 || key0 + it * KS < BK) f9_cp16(s + it * KS * 64, it * KS < rem ? p : g, it * KS < rem ? 16 : 0);
        p += kstride;
    }
}

// f9_load_tile_sw is f9_load_tile into the swizzled layout of BK keys (s
// 1024-byte aligned) with NT threads, through f9_cp_rows.
template <int HS, int NT, int BK = F9_BK>
__device__ __forceinline__ void f9_load_tile_sw(uint16_t* s, const uint16_t* g, i64 stride, int r0, int T) {
    constexpr int ND = HS / 8, KS = NT / ND;
    const int c = threadIdx.x % ND, key0 = threadIdx.x / ND;
    f9_cp_rows<HS, NT, BK>(s + f9_sw_off<BK>(key0, c), g + (i64)(r0 + key0) * stride + c * 8, g, KS * stride,
                           T - r0 - key0);
}

// flash_fwd_sm90 computes the block's 64·MT·WG query rows with WG
// warpgroups (128·WG threads): warpgroup w owns MT row tiles of 64 (its
// tile t: rows qw+64t..qw+64t+63, qw = q0 + 64·MT·w), and each K and V tile
// in shared memory feeds MT·WG wgmma batches, MT of them back to back in
// each warpgroup (fewer tile loads per product than one tile per block,
// and the tensor cores get independent batches per wait). Ks and Vs are
// the key and value tiles (F9_BK·HS elements each, 128-byte aligned).
template <int HS, int MT, int WG>
__device__ __forceinline__ void flash_fwd_sm90(uint16_t* __restrict__ out, float* __restrict__ lse,
                                               const uint16_t* __restrict__ qkv, int T, int NH, int NKV,
                                               float scale_log2, uint16_t* Ks, uint16_t* Vs) {
    constexpr int KD = HS / 16, NS = F9_BK / 2, NO = HS / 2, BQ = F9_BQ * MT * WG, NT = F9_THREADS * WG;
    const int tid = threadIdx.x, warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, c = lane & 3;
    const int C = NH * HS, z = blockIdx.y, b = z / NH, h = z - b * NH, kv = h / (NH / NKV);
    // The last query blocks have the most keys: start them first.
    const int q0 = (gridDim.x - 1 - blockIdx.x) * BQ;
    const i64 W = (i64)(NH + 2 * NKV) * HS;                              // row stride of qkv
    const uint16_t* base = qkv + (i64)b * T * W + (i64)h * HS;            // q of token 0 of this head
    const uint16_t* kbase = qkv + (i64)b * T * W + (i64)(NH + kv) * HS;  // k of token 0 of its key head
    const uint16_t* vbase = kbase + (i64)NKV * HS;                        // v of token 0 of its value head
    const int qlast = min(q0 + BQ, T) - 1;                               // the block's last valid row
    const int qw = q0 + F9_BQ * MT * (tid >> 7);                         // this warpgroup's first row

    // Q as wgmma A fragments (rows past T zero); this thread's rows of tile
    // t are r0 = qw + 64t + 16·warp + g and r1 = r0 + 8 (warp within the
    // warpgroup).
    uint32_t qf[MT][KD][4];
    float o[MT][NO], s[MT][NS], m[MT][2], l[MT][2];
#pragma unroll
    for (int t = 0; t < MT; t++) {
        const int r0 = qw + F9_BQ * t + warp * 16 + g, r1 = r0 + 8;
#pragma unroll
        for (int kk = 0; kk < KD; kk++) {
            const int d = kk * 16 + 2 * c;
            qf[t][kk][0] = r0 < T ? fa_ld32(base + (i64)r0 * W + d) : 0u;
            qf[t][kk][1] = r1 < T ? fa_ld32(base + (i64)r1 * W + d) : 0u;
            qf[t][kk][2] = r0 < T ? fa_ld32(base + (i64)r0 * W + d + 8) : 0u;
            qf[t][kk][3] = r1 < T ? fa_ld32(base + (i64)r1 * W + d + 8) : 0u;
        }
#pragma unroll
        for (int i = 0; i < NO; i++) o[t][i] = 0.f;
        m[t][0] = m[t][1] = -INFINITY;
        l[t][0] = l[t][1] = 0.f;
    }
    const uint32_t ks = f9_smem(Ks), vs = f9_smem(Vs);

    // Keys past T are zero: masked, and never NaN times 0. Row tile t takes
    // part in key tile k0 (uniformly over the warpgroup, as wgmma needs)
    // when it has a row at or past k0 and a row before T; every row of a
    // tile that takes part in its first key tile sees key 0 there.
    f9_load_tile<HS, NT>(Ks, kbase, W, 0, T);
    fa_cp_commit();
    for (int k0 = 0; k0 <= qlast; k0 += F9_BK) {
        bool work[MT];
#pragma unroll
        for (int t = 0; t < MT; t++)  // always with one tile per block: q0 <= k0 <= qlast < q0 + 64
            work[t] = (MT == 1 && WG == 1) || (qw + F9_BQ * t <= qlast && k0 <= qw + F9_BQ * t + F9_BQ - 1);
        fa_cp_wait();
        f9_fence_proxy();
        __syncthreads();  // K(k0) is in; every warp is done with V of the previous tile
        f9_load_tile<HS, NT>(Vs, vbase, W, k0, T);
        fa_cp_commit();

        // S = Q·Kᵀ (64 rows x 64 keys per row tile): K-major B, LBO 8 dims
        // = 1024 bytes, SBO 8 keys = 128 bytes; each k16 step starts 2048
        // bytes on.
        f9_wg_fence();
#pragma unroll
        for (int t = 0; t < MT; t++)
            if (work[t]) {
#pragma unroll
                for (int kk = 0; kk < KD; kk++)
                    f9_wgmma_n64<0>(s[t], qf[t][kk], f9_desc(ks + kk * 2 * (F9_BK * 16), F9_BK * 16, 128), kk);
            }
        f9_wg_commit();
        f9_wg_wait();
#pragma unroll
        for (int t = 0; t < MT; t++) f9_regs<NS>(s[t]);

        uint32_t pa[MT][F9_BK / 16][4];
#pragma unroll
        for (int t = 0; t < MT; t++) {
            if (!work[t]) continue;
            const int w0 = qw + F9_BQ * t + warp * 16, r0 = w0 + g, r1 = r0 + 8;
            // Raw scores (scale > 0 commutes with max); keys after a row, and
            // so keys past T, are masked on the tiles that reach past w0.
            if (k0 + F9_BK - 1 > w0) {
#pragma unroll
                for (int j = 0; j < NS / 4; j++) {
                    const int key = k0 + j * 8 + 2 * c;
                    if (key > r0) s[t][4 * j] = -INFINITY;
                    if (key + 1 > r0) s[t][4 * j + 1] = -INFINITY;
                    if (key > r1) s[t][4 * j + 2] = -INFINITY;
                    if (key + 1 > r1) s[t][4 * j + 3] = -INFINITY;
                }
            }
            float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
            for (int j = 0; j < NS / 4; j++) {
                mx0 = fmaxf(mx0, fmaxf(s[t][4 * j], s[t][4 * j + 1]));
                mx1 = fmaxf(mx1, fmaxf(s[t][4 * j + 2], s[t][4 * j + 3]));
            }
            // The four lanes of a quad hold one row between them.
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
            const float n0 = fmaxf(m[t][0], mx0), n1 = fmaxf(m[t][1], mx1);
            // n0 and n1 are finite from the tile's first key tile on; the
            // guards only keep -inf - -inf out.
            const float b0 = n0 == -INFINITY ? 0.f : n0 * scale_log2, b1 = n1 == -INFINITY ? 0.f : n1 * scale_log2;
            const float f0 = fa_exp2(m[t][0] * scale_log2 - b0), f1 = fa_exp2(m[t][1] * scale_log2 - b1);  // 0 while m is -inf
            m[t][0] = n0;
            m[t][1] = n1;
            float ps0 = 0.f, ps1 = 0.f;
#pragma unroll
            for (int j = 0; j < NS / 4; j++) {
                s[t][4 * j] = fa_exp2(s[t][4 * j] * scale_log2 - b0);
                s[t][4 * j + 1] = fa_exp2(s[t][4 * j + 1] * scale_log2 - b0);
                s[t][4 * j + 2] = fa_exp2(s[t][4 * j + 2] * scale_log2 - b1);
                s[t][4 * j + 3] = fa_exp2(s[t][4 * j + 3] * scale_log2 - b1);
                ps0 += s[t][4 * j] + s[t][4 * j + 1];
                ps1 += s[t][4 * j + 2] + s[t][4 * j + 3];
            }
            l[t][0] = l[t][0] * f0 + ps0;
            l[t][1] = l[t][1] * f1 + ps1;
#pragma unroll
            for (int j = 0; j < NO / 4; j++) {
                o[t][4 * j] *= f0;
                o[t][4 * j + 1] *= f0;
                o[t][4 * j + 2] *= f1;
                o[t][4 * j + 3] *= f1;
            }
            // P as A fragments: the accumulator layout of keys 16kk..16kk+15
            // is the A layout of the k16 step kk.
#pragma unroll
            for (int kk = 0; kk < F9_BK / 16; kk++) {
                pa[t][kk][0] = fa_pack(s[t][8 * kk], s[t][8 * kk + 1]);
                pa[t][kk][1] = fa_pack(s[t][8 * kk + 2], s[t][8 * kk + 3]);
                pa[t][kk][2] = fa_pack(s[t][8 * kk + 4], s[t][8 * kk + 5]);
                pa[t][kk][3] = fa_pack(s[t][8 * kk + 6], s[t][8 * kk + 7]);
            }
        }
        fa_cp_wait();
        f9_fence_proxy();
        __syncthreads();  // V(k0) is in; every warp is done with K(k0)
        if (k0 + F9_BK <= qlast) {
            f9_load_tile<HS, NT>(Ks, kbase, W, k0 + F9_BK, T);
            fa_cp_commit();
        }
        // O += P·V: N-major B, LBO 8 keys = 128 bytes, SBO 8 dims = 1024
        // bytes; each k16 step starts 256 bytes on.
        f9_wg_fence();
#pragma unroll
        for (int t = 0; t < MT; t++)
            if (work[t]) {
#pragma unroll
                for (int kk = 0; kk < F9_BK / 16; kk++) {
                    const uint64_t dv = f9_desc(vs + kk * 256, 128, F9_BK * 16);
                    if constexpr (HS == 64)
                        f9_wgmma_n64<1>(o[t], pa[t][kk], dv, 1);
                    else
                        f9_wgmma_n128<1>(o[t], pa[t][kk], dv, 1);
                }
            }
        f9_wg_commit();
        f9_wg_wait();
#pragma unroll
        for (int t = 0; t < MT; t++) f9_regs<NO>(o[t]);
    }
#pragma unroll
    for (int t = 0; t < MT; t++) {
        const int r0 = qw + F9_BQ * t + warp * 16 + g, r1 = r0 + 8;
        float l0 = l[t][0], l1 = l[t][1];
        l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
        l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
        uint16_t* ob = out + (i64)b * T * C + (i64)h * HS + 2 * c;
        if (r0 < T) {
            const float inv = 1.f / l0;
#pragma unroll
            for (int j = 0; j < NO / 4; j++)
                *reinterpret_cast<uint32_t*>(ob + (i64)r0 * C + j * 8) = fa_pack(o[t][4 * j] * inv, o[t][4 * j + 1] * inv);
            if (c == 0) lse[(i64)z * T + r0] = (m[t][0] * scale_log2 + log2f(l0)) * F9_LN2;
        }
        if (r1 < T) {
            const float inv = 1.f / l1;
#pragma unroll
            for (int j = 0; j < NO / 4; j++)
                *reinterpret_cast<uint32_t*>(ob + (i64)r1 * C + j * 8) =
                    fa_pack(o[t][4 * j + 2] * inv, o[t][4 * j + 3] * inv);
            if (c == 0) lse[(i64)z * T + r1] = (m[t][1] * scale_log2 + log2f(l1)) * F9_LN2;
        }
    }
}

// flash_fwd_sm90p is flash_fwd_sm90<HS, 1, WG> with the products
// overlapped with the softmax and the copies A key tiles ahead (the
// flash_fwd3_sm90 kernels). Key tile j's iteration issues S(j) = Q·K(j)ᵀ
// and then O += P(j-1)·V(j-1) as two wgmma groups, waits for the first
// only (wgmma.wait_group 1), and does the softmax of S(j) while the tensor
// cores still run P(j-1)·V(j-1); it waits for that (wait_group 0) only
// before rescaling O and turning P(j) into A fragments. Shared memory
// (smem, f9_fwdp_smem<HS, D>() bytes): a ring of D K tiles and one of D V
// tiles, K(g) in K slot g%D and V(g) in V slot g%D. Copy group g (one
// cp.async commit group per thread) holds K(g) and V(g-1) (group 0 K(0)
// only): groups 0..A-1 go out before the loop, group j+A at the start of
// iteration j. Barrier R_j (named
// barrier 1, every thread of the block) ends iteration j; before it each
// thread lands group j+1 (cp.async.wait_group A-1: K(j+1), V(j)) and
// fences it, so each copy has A iterations to arrive.
//
// Lockstep (PP false, A = D-1): both warpgroups meet R_j at the end of
// iteration j. Group j+A, issued after R_{j-1}, goes into the slots of
// K(j-1) and V(j-2), whose last readers (S(j-1), P(j-2)·V(j-2), issued in
// iteration j-1) every thread waited for before R_{j-1}.
//
// Ping-pong (PP, two warpgroups, A = D-2): warpgroup 0 meets R_j at the
// end of iteration j, warpgroup 1 right after S(j) is done, before its
// softmax, so the two run half an iteration apart and one's softmax runs
// under the other's products (the tensor cores are otherwise idle during a
// softmax that waits for no wgmma). Group j+A, issued after R_{j-1} by
// both, goes into the slots of K(j-2) and V(j-3): S(j-2) is done in both
// warpgroups before R_{j-2}; P(j-3)·V(j-3), issued in iteration j-2, is
// done in warpgroup 0 before R_{j-2} and in warpgroup 1 (whose wait_group
// 0 follows its softmax) before R_{j-1}. One slot of each ring more than
// lockstep for the same copy distance; with A = D-1 a copy would overwrite
// V(j-2) while warpgroup 1's P(j-2)·V(j-2) may still read it.
//
// Iteration 0 issues S(0) only and iteration n (n key tiles in the block)
// only the last P·V: both are peeled off the loop (step, with f9_bool
// flags), where they used to issue both groups every iteration, P·V(-1)
// on zeros and an S(n) that was dropped (a block of n tiles did the
// products of n + 1). Both warpgroups go through all the block's key
// tiles.
//
// A block may take several items (query blocks of 64·WG rows of its head
// blockIdx.y; persistent when gridDim.x is below the query blocks: item_q0
// gives the order) one after another. The copies and the barriers run as
// one stream over them: j above counts the block's steps over all its
// items (n + 1 for an item of n key tiles, with its n + 1 copy groups),
// and the slots of group g are g%D as above, so the next item's first
// tiles are copied under the last steps of the one before and its Q loads
// under the last P·V and the output (flash_sm90.go's sm90Grid picks
// gridDim.x).
//
// BK is the keys per tile: 64, or 128 (the flash_fwd4 kernels: S is then
// HS/16 wgmma m64n128k16 per tile and P·V 8 k16 steps, so that each
// barrier, wait and row reduction of the softmax covers twice the keys).
// WG (1 to 3) warpgroups of 64 query rows each share the rings; the
// block's key tiles run to its last row's, so with 192 rows and 128-key
// tiles a warpgroup may see a tile wholly past its rows (masked: P zero).
// f9_bool<B> is a compile-time flag passed as a value (to a generic
// lambda: decltype(flag)::value).
template <bool B>
struct f9_bool {
    static constexpr bool value = B;
};

//
// With WS (warp specialised, the flash_fwd5 kernels; not with PP) the
// block has one more warpgroup, after the WG others, which first gives up
// registers for theirs (setmaxnreg: with two, 24 a thread against their
// 240; a block's threads share the registers per warpgroup, so a lone
// producer warp cost as much as a warpgroup: 168 a thread, and spills, for
// 288 threads). Its first thread is the producer, which copies every K and V tile of the block's items on the
// bulk copy engine (f9_tma_load3 through the tensor map tm of qkv, rows
// past T zero, straight into the swizzled layout), and the warpgroups
// neither copy nor meet any barrier in the loop. The rings are handed
// over through mbarriers, four per slot: K tile i (counted over the
// block's items, in the order the warpgroups use them) goes into K slot
// i%D once the slot's empty barrier completed phase i/D - 1 (every warp
// of every warpgroup arrived on it after the wgmma that read tile i - D
// was done: S(j) after wait_group 1, or 0 in a first step), its full
// barrier expecting the tile's bytes; the warpgroups wait on the full
// barrier's phase i/D before the tile's first wgmma. V tiles alike, with
// P·V's wait_group 0. The producer copies K(j) and then V(j-1) for each
// step j of each item, as the warpgroups use them, and at the end waits
// until every slot it filled was emptied, so that no copy outlives it.
// WS with PP (two warpgroups: flash_fwd5p) takes turns at issuing the
// products: warpgroup w meets named barrier 2 + w before a step's wgmma
// and arrives at the other's after them (bar.arrive, no wait), warpgroup
// 1 arriving once at the start and not in its last step, so that each
// barrier gets as many arrivals as meetings; each warpgroup's softmax then
// runs under the other's products.
template <int HS, int D, int BK = F9_BK>
constexpr int f9_fwdp_smem() {
    return 2 * D * BK * HS * 2 + 1024;  // + room to align the tiles to 1024 bytes
}
// f9_fwdws_smem is the WS kernels' shared memory: the rings, then the
// 4·D mbarriers (256 bytes, D <= 8).
template <int HS, int D, int BK = F9_BK>
constexpr int f9_fwdws_smem() {
    return f9_fwdp_smem<HS, D, BK>() + 256;
}

template <int HS, int WG, int D, bool PP, int BK = F9_BK, bool WS = false>
__device__ __forceinline__ void flash_fwd_sm90p(uint16_t* __restrict__ out, float* __restrict__ lse,
                                                const uint16_t* __restrict__ qkv, int T, int NH, int NKV,
                                                float scale_log2, uint16_t* smem, const f9_tmap* tm = nullptr) {
    static_assert(D >= 2 && D <= 8, "flash_fwd_sm90p: ring depth 2..8");
    static_assert(!PP || (WG == 2 && D >= 3), "flash_fwd_sm90p: ping-pong needs two warpgroups and depth 3 or more");
    static_assert(!(WS && PP) || WG == 2, "flash_fwd_sm90p: turns between two warpgroups only");
    static_assert(WG >= 1 && WG <= 3 && (BK == 64 || BK == 128), "flash_fwd_sm90p: 1 to 3 warpgroups, 64 or 128 keys a tile");
    constexpr int A = PP ? D - 2 : D - 1;  // copy groups in flight ahead of the tile in use
    const bool late = PP && !WS && (threadIdx.x >> 7) == 1;  // the warpgroup whose barrier comes before its softmax
    constexpr int KD = HS / 16, NS = BK / 2, NO = HS / 2, BQ = F9_BQ * WG, NT = F9_THREADS * WG, TILE = BK * HS;
    const int tid = threadIdx.x, warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, c = lane & 3;
    const int C = NH * HS, z = blockIdx.y, b = z / NH, h = z - b * NH, kv = h / (NH / NKV);
    const i64 W = (i64)(NH + 2 * NKV) * HS;
    const uint16_t* base = qkv + (i64)b * T * W + (i64)h * HS;
    const uint16_t* kbase = qkv + (i64)b * T * W + (i64)(NH + kv) * HS;
    const uint16_t* vbase = kbase + (i64)NKV * HS;
    // The block's items are query blocks of head z: in round r, position
    // p = r·X + x (r even) or r·X + X-1-x (r odd) of the query blocks
    // sorted longest first (query block nq-1-p), x = blockIdx.x, X =
    // gridDim.x (1..nq; nq, one item a block, or fewer, persistent): the
    // snake order evens out the blocks' keys. item_q0 is the first row of
    // item r, -1 past the block's last.
    const int nq = (T + BQ - 1) / BQ, X = gridDim.x, x = blockIdx.x;
    auto item_q0 = [&](int r) {
        const int p = r * X + ((r & 1) ? X - 1 - x : x);
        return p < nq ? (nq - 1 - p) * BQ : -1;
    };
    auto tiles = [&](int q) { return (min(q + BQ, T) - 1) / BK + 1; };  // key tiles of the item at row q
    if (item_q0(0) < 0) return;  // the whole block (X > nq)
    smem += ((1024u - (f9_smem(smem) & 1023u)) & 1023u) / 2;  // the swizzle's 1024-byte alignment
    uint16_t* Ks = smem;
    uint16_t* Vs = smem + D * TILE;
    // WS: the full and empty barriers of the K and V slots.
    uint64_t* kfull = reinterpret_cast<uint64_t*>(smem + 2 * D * TILE);
    uint64_t* kempty = kfull + D;
    uint64_t* vfull = kfull + 2 * D;
    uint64_t* vempty = kfull + 3 * D;
    int kc = 0, vc = 0;  // WS: the K and V tiles this thread's warpgroup has taken so far
    bool final = false;  // WS with PP: the block's last step is next
    const int wgi = threadIdx.x >> 7;

    uint32_t qf[KD][4];
    // load_q loads the Q fragments of the item at row q (rows past T zero).
    auto load_q = [&](int q) {
        const int q_r0 = q + F9_BQ * (tid >> 7) + warp * 16 + g, q_r1 = q_r0 + 8;
#pragma unroll
        for (int kk = 0; kk < KD; kk++) {
            const int d = kk * 16 + 2 * c;
            qf[kk][0] = q_r0 < T ? fa_ld32(base + (i64)q_r0 * W + d) : 0u;
            qf[kk][1] = q_r1 < T ? fa_ld32(base + (i64)q_r1 * W + d) : 0u;
            qf[kk][2] = q_r0 < T ? fa_ld32(base + (i64)q_r0 * W + d + 8) : 0u;
            qf[kk][3] = q_r1 < T ? fa_ld32(base + (i64)q_r1 * W + d + 8) : 0u;
        }
    };
    float o[NO], s[NS], m0, m1, l0, l1;
    uint32_t pa[BK / 16][4];

    // The copies run as one stream over the block's items: copy group G
    // (one cp.async commit group per thread, G counted over all items) is
    // the group g of its item, which holds K(g) (g < n) in K slot G%D and
    // V(g-1) (g >= 1) in V slot (G-1)%D, for g = 0..n (n + 1 groups for
    // the item's n + 1 steps, below); past the last item groups are empty,
    // committed all the same so that group counts stay uniform. ld issues
    // the next group (cursor lq, ln, lg: its item's first row, tiles and
    // g; lr the item, lG the group).
    //
    // cp_tile is f9_load_tile_sw's copy of the tile of keys r0.. from the
    // key (src kbase) or value (vbase) rows, with each thread's first row
    // (lth, in K; + vdelta in V) and swizzled offset (loff) worked out once
    // for the kernel, not per tile.
    constexpr int LND = HS / 8, LKS = NT / LND;
    const int lkey = tid / LND;
    const int loff = f9_sw_off<BK>(lkey, tid % LND);
    const uint16_t* lth = kbase + (i64)lkey * W + (tid % LND) * 8;
    const i64 lksW = (i64)LKS * W, vdelta = vbase - kbase;
    auto cp_tile = [&](uint16_t* tile, i64 delta, const uint16_t* src, int r0) {
        f9_cp_rows<HS, NT, BK>(tile + loff, lth + delta + (i64)r0 * W, src, lksW, T - r0 - lkey);
    };
    int lr = 0, lq = item_q0(0), ln = tiles(lq), lg = 0, lG = 0;
    auto ld = [&]() {
        if (lq >= 0) {
            if (lg < ln) cp_tile(Ks + (lG % D) * TILE, 0, kbase, lg * BK);
            if (lg >= 1) cp_tile(Vs + ((lG - 1) % D) * TILE, vdelta, vbase, (lg - 1) * BK);
            if (++lg > ln) {
                lq = item_q0(++lr);
                lg = 0;
                if (lq >= 0) ln = tiles(lq);
            }
        }
        fa_cp_commit();
        lG++;
    };
    // The item in progress: its rows (w0 this warp's first, r0 and r1 this
    // thread's) and the step's group G.
    int w0 = 0, r0 = 0, r1 = 0, G = 0;
    // step(j, S, PV) is iteration j of the item, global step G: with S (j <
    // n) it issues S(j) = Q·K(j)ᵀ (K slot G%D, K-major B as in
    // flash_fwd_sm90) and does its softmax, with PV (j > 0) it issues O +=
    // P(j-1)·V(j-1) (V slot (G-1)%D, N-major B) after it, as a second
    // group. S and PV are compile-time (f9_bool): the loop runs the steps
    // with both, and the first (S only) and the last (PV only) are peeled
    // off, so that no wgmma is issued for nothing and none sits under a
    // runtime branch (ptxas serializes all wgmma of a function then,
    // C7515). Every step issues a copy group and meets its barrier: step G
    // issues group G+A and lands group G+1 (its next step's) before it.
    auto step = [&](int j, auto withS, auto withPV) {
        constexpr bool DS = decltype(withS)::value, DPV = decltype(withPV)::value;
        const int k0 = j * BK;
        if constexpr (WS) {
            if constexpr (DS) f9_mbar_wait(&kfull[kc % D], (kc / D) & 1);   // K(j) is in
            if constexpr (DPV) f9_mbar_wait(&vfull[vc % D], (vc / D) & 1);  // V(j-1) is in
        } else {
            ld();  // group G+A, into the slots of groups G+A-D (K) and G+A-D-1 (V)
        }
        if constexpr (WS && PP) f9_bar_sync_id(2 + wgi, 2 * F9_THREADS);  // this warpgroup's turn
        f9_wg_fence();
        if constexpr (DS) {
            const uint32_t ks = WS ? f9_smem(Ks + (kc % D) * TILE) : f9_smem(Ks + (G % D) * TILE);
#pragma unroll
            for (int kk = 0; kk < KD; kk++)
                if constexpr (BK == 64)
                    f9_wgmma_n64<0>(s, qf[kk], f9_kdesc<BK>(ks, kk), kk);
                else
                    f9_wgmma_n128<0>(s, qf[kk], f9_kdesc<BK>(ks, kk), kk);
            f9_wg_commit();
        }
        if constexpr (DPV) {
            const uint32_t vs = WS ? f9_smem(Vs + (vc % D) * TILE) : f9_smem(Vs + ((G + D - 1) % D) * TILE);  // V(j-1)
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++) {
                const uint64_t dv = f9_ndesc<BK>(vs, kk);
                if constexpr (HS == 64)
                    f9_wgmma_n64<1>(o, pa[kk], dv, 1);
                else
                    f9_wgmma_n128<1>(o, pa[kk], dv, 1);
            }
            f9_wg_commit();
        }
        if constexpr (WS && PP)
            if (!(final && wgi == 1)) f9_bar_arrive_id(2 + (wgi ^ 1), 2 * F9_THREADS);  // the other's turn
        if constexpr (DS) {
            if constexpr (DPV) {
                f9_wg_wait1();  // S(j) is done; P(j-1)·V(j-1) may still run
            } else {
                f9_wg_wait();  // the first step: S(0) is the only group
            }
            f9_regs<NS>(s);
            if constexpr (WS) {  // S(j) has read K slot kc
                if (lane == 0) f9_mbar_arrive(&kempty[kc % D]);
                kc++;
            }
        }
        if (late) {  // warpgroup 1 meets R_G here under ping-pong: see above
            fa_cp_wait_n<A - 1>();  // group G+1, as below
            f9_fence_proxy();
            f9_bar<2 * F9_THREADS>();
        }

        // The softmax of key tile j < n. A warpgroup whose rows all come
        // before the tile (the first one, at the block's diagonal tile) has
        // it all masked: -inf scores, P zero, m, l and O unchanged.
        float f0 = 1.f, f1 = 1.f;
        if constexpr (DS) {
            if (k0 + BK - 1 > w0) {  // causal mask (and keys past T) on the tiles past w0
#pragma unroll
                for (int jj = 0; jj < NS / 4; jj++) {
                    const int key = k0 + jj * 8 + 2 * c;
                    if (key > r0) s[4 * jj] = -INFINITY;
                    if (key + 1 > r0) s[4 * jj + 1] = -INFINITY;
                    if (key > r1) s[4 * jj + 2] = -INFINITY;
                    if (key + 1 > r1) s[4 * jj + 3] = -INFINITY;
                }
            }
            float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
            for (int jj = 0; jj < NS / 4; jj++) {
                mx0 = fmaxf(mx0, fmaxf(s[4 * jj], s[4 * jj + 1]));
                mx1 = fmaxf(mx1, fmaxf(s[4 * jj + 2], s[4 * jj + 3]));
            }
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
            const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
            const float b0 = n0 == -INFINITY ? 0.f : n0 * scale_log2, b1 = n1 == -INFINITY ? 0.f : n1 * scale_log2;
            f0 = fa_exp2(m0 * scale_log2 - b0);  // 0 while m is -inf
            f1 = fa_exp2(m1 * scale_log2 - b1);
            m0 = n0;
            m1 = n1;
            float ps0 = 0.f, ps1 = 0.f;
#pragma unroll
            for (int jj = 0; jj < NS / 4; jj++) {
                s[4 * jj] = fa_exp2(s[4 * jj] * scale_log2 - b0);
                s[4 * jj + 1] = fa_exp2(s[4 * jj + 1] * scale_log2 - b0);
                s[4 * jj + 2] = fa_exp2(s[4 * jj + 2] * scale_log2 - b1);
                s[4 * jj + 3] = fa_exp2(s[4 * jj + 3] * scale_log2 - b1);
                ps0 += s[4 * jj] + s[4 * jj + 1];
                ps1 += s[4 * jj + 2] + s[4 * jj + 3];
            }
            l0 = l0 * f0 + ps0;
            l1 = l1 * f1 + ps1;
        }
        if constexpr (DPV) {
            f9_wg_wait();  // P(j-1)·V(j-1) is done
            f9_regs<NO>(o);
            if constexpr (WS) {  // and has read V slot vc
                if (lane == 0) f9_mbar_arrive(&vempty[vc % D]);
                vc++;
            }
        }
        if constexpr (DS) {
            if constexpr (DPV) {  // before the first P·V, O is zero
#pragma unroll
                for (int jj = 0; jj < NO / 4; jj++) {
                    o[4 * jj] *= f0;
                    o[4 * jj + 1] *= f0;
                    o[4 * jj + 2] *= f1;
                    o[4 * jj + 3] *= f1;
                }
            }
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++) {
                pa[kk][0] = fa_pack(s[8 * kk], s[8 * kk + 1]);
                pa[kk][1] = fa_pack(s[8 * kk + 2], s[8 * kk + 3]);
                pa[kk][2] = fa_pack(s[8 * kk + 4], s[8 * kk + 5]);
                pa[kk][3] = fa_pack(s[8 * kk + 6], s[8 * kk + 7]);
            }
        }
        if (!late && !WS) {
            fa_cp_wait_n<A - 1>();
            f9_fence_proxy();
            f9_bar<WG * F9_THREADS>();  // K(j+1) and V(j) are in; see above for what is done
        }
        G++;
    };
    if constexpr (WS) {
        if (tid == 0) {
#pragma unroll 1
            for (int i = 0; i < D; i++) {
                f9_mbar_init(&kfull[i], 1);
                f9_mbar_init(&vfull[i], 1);
                f9_mbar_init(&kempty[i], 4 * WG);
                f9_mbar_init(&vempty[i], 4 * WG);
            }
            f9_mbar_init_fence();
        }
        __syncthreads();  // the barriers are initialised
        constexpr int RP = WG == 2 ? 24 : 32, RC = WG == 2 ? 240 : 160;  // registers: producer, the others
        if (tid >= NT) {  // the producer warpgroup
            f9_setmaxnreg_dec<RP>();
            if (tid != NT) return;
            const int kcol = (NH + kv) * HS, vcol = (NH + NKV + kv) * HS;
            // put copies tile `row0` of the column block at col into slot i%D
            // of ring r (full and empty barriers f, e) as tile i of that ring.
            auto put = [&](uint16_t* r, uint64_t* f, uint64_t* e, int i, int col, int row0) {
                const int slot = i % D;
                f9_mbar_wait(&e[slot], ((i / D) & 1) ^ 1);  // tile i - D is done with
                f9_mbar_expect_tx(&f[slot], TILE * 2);
#pragma unroll
                for (int p = 0; p < HS / 64; p++) f9_tma_load3(r + slot * TILE + p * BK * 64, tm, col + 64 * p, row0, b, &f[slot]);
            };
            int kp = 0, vp = 0;
#pragma unroll 1
            for (int r = 0;; r++) {
                const int q0 = item_q0(r);
                if (q0 < 0) break;
                const int n = tiles(q0);
#pragma unroll 1
                for (int j = 0; j <= n; j++) {
                    if (j < n) put(Ks, kfull, kempty, kp++, kcol, j * BK);
                    if (j >= 1) put(Vs, vfull, vempty, vp++, vcol, (j - 1) * BK);
                }
            }
            // Every slot filled is emptied before the producer leaves.
#pragma unroll 1
            for (int i = max(kp - D, 0); i < kp; i++) f9_mbar_wait(&kempty[i % D], (i / D) & 1);
#pragma unroll 1
            for (int i = max(vp - D, 0); i < vp; i++) f9_mbar_wait(&vempty[i % D], (i / D) & 1);
            return;
        }
        f9_setmaxnreg_inc<RC>();
        if constexpr (PP)
            if (wgi == 1) f9_bar_arrive_id(2, 2 * F9_THREADS);  // warpgroup 0 goes first
        load_q(item_q0(0));
    } else {
        load_q(item_q0(0));
#pragma unroll 1
        for (int gi = 0; gi < A; gi++) ld();
        fa_cp_wait_n<A - 1>();
        f9_fence_proxy();
        __syncthreads();  // group 0 (K(0) of the first item) is in
    }
#pragma unroll 1
    for (int r = 0;; r++) {
        const int q0 = item_q0(r);
        if (q0 < 0) break;
        const int n = tiles(q0), qn = item_q0(r + 1);
        w0 = q0 + F9_BQ * (tid >> 7) + warp * 16;
        r0 = w0 + g;
        r1 = r0 + 8;
        m0 = m1 = -INFINITY;
        l0 = l1 = 0.f;
#pragma unroll
        for (int i = 0; i < NO; i++) o[i] = 0.f;
        step(0, f9_bool<true>{}, f9_bool<false>{});
#pragma unroll 1
        for (int j = 1; j < n; j++) step(j, f9_bool<true>{}, f9_bool<true>{});
        // The next item's Q fragments load under the last P·V and the
        // output: no S reads qf until the next item's first step.
        if (qn >= 0) load_q(qn);
        final = qn < 0;
        step(n, f9_bool<false>{}, f9_bool<true>{});

        l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
        l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
        uint16_t* ob = out + (i64)b * T * C + (i64)h * HS + 2 * c;
        if (r0 < T) {
            const float inv = 1.f / l0;
#pragma unroll
            for (int jj = 0; jj < NO / 4; jj++)
                *reinterpret_cast<uint32_t*>(ob + (i64)r0 * C + jj * 8) = fa_pack(o[4 * jj] * inv, o[4 * jj + 1] * inv);
            if (c == 0) lse[(i64)z * T + r0] = (m0 * scale_log2 + log2f(l0)) * F9_LN2;
        }
        if (r1 < T) {
            const float inv = 1.f / l1;
#pragma unroll
            for (int jj = 0; jj < NO / 4; jj++)
                *reinterpret_cast<uint32_t*>(ob + (i64)r1 * C + jj * 8) =
                    fa_pack(o[4 * jj + 2] * inv, o[4 * jj + 3] * inv);
            if (c == 0) lse[(i64)z * T + r1] = (m1 * scale_log2 + log2f(l1)) * F9_LN2;
        }
    }
}

// ---- Backward: flash_bwd_kv_sm90 (dK, dV) and flash_bwd_q_sm90 (dQ), the
// split backward of flashattn.cu (flash_bwd_kv, flash_bwd_q: same
// operands, same contract, no atomics) on wgmma. One warpgroup per block;
// its 64 fixed rows (keys, or query rows) sit in shared memory as the A
// operand of the first two products (A through a descriptor, K-major:
// every tile is in the 128-byte swizzled layout of f9_load_tile_sw, read
// through f9_kdesc), the streamed 64-row tiles (queries, or keys) as their
// B operand, K-major likewise; P and dS go from the accumulators to A
// fragments in registers (as P in flash_fwd_sm90) for the last products,
// whose B operand is the streamed tile again, N-major (f9_ndesc).
// Per streamed tile of 64:
//   flash_bwd_kv_sm90 (64 keys, queries streaming from the block's
//     diagonal to T, for each query head of the group in turn):
//     Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ (HS/16 wgmma m64n64k16 each), Pᵀ = exp2(Sᵀ·
//     scale_log2 - lse·log2 e) with queries before a key masked, dSᵀ =
//     Pᵀ∘(dPᵀ - D), dV += Pᵀ·dO and dK += dSᵀ·Q (4 wgmma m64nHSk16 each);
//   flash_bwd_q_sm90 (64 query rows, keys streaming up to the diagonal):
//     S = Q·Kᵀ, dP = dO·Vᵀ, P, dS = P∘(dP - D), dQ += dS·K.
// Within a tile, P is computed while dP is still on the tensor cores
// (wait_group 1). With PIPE the tile's last products are not waited for:
// they run while the next tile's S and dP are issued, and the wait that
// gives S also completes them (commit groups complete in order); the next
// tile's copies are then issued after a barrier, into the buffers those
// products read. Without PIPE they are waited for at the end of the tile
// and the next tile's copies start at its beginning. Shared memory
// (dynamic, f9_bwd_smem bytes): the two fixed tiles, two buffers of each
// streamed tile and, in flash_bwd_kv_sm90, two rows of 64 lse (base 2,
// +inf past T, so that P is 0 there) and D values.
#define F9_LOG2E 1.4426950408889634f

//
// With DQ (flash_bwd_fused_sm90_*, not with PIPE) the kv kernel is the
// fused backward: five products per tile instead of the split pair's
// seven. Each tile's dSᵀ goes as bf16 into the 64x64 shared tile St (key
// rows, query columns, the swizzled layout), dK += dSᵀ·Q reads it K-major
// and dQ(tile) = dS·K reads it M-major (imm-trans-a 1) with the block's K
// tile N-major, in the same commit group as dV and dK; after the wait each
// thread adds its dQ fragments to the float32 dq(B, NH, T, HS) (zero on
// entry, unscaled: flash_bwd_dq scales and rounds) with vector atomics, so
// dQ's float32 sums follow the blocks' schedule (not bitwise
// reproducible; dK and dV are). With WG 2 (DQ only) a block of two
// warpgroups takes 128 keys, 64 each, sharing the streamed tiles: both
// St tiles feed each warpgroup's dQ, over all 128 keys (8 k16 steps),
// warpgroup w computing head dims w·HS/2.. of it (N = HS/2), so that each
// element of dq takes one atomic add per 128 keys, not per 64. With BULK
// (DQ only) the block's dQ(tile) goes instead as float32 into the shared
// 64 x HS tile Dq in the order of the warpgroups' accumulators
// (f9_dqf_at: each thread's four floats of column group j at float4 j·NT +
// thread, so that a warp's stores are 512 contiguous bytes, four
// wavefronts, with no register shuffled), dq holding every 64-query tile
// of each head in that order too (ceil(T/64) tiles a head; flash_bwd_dqf
// reads it back), and thread 0 adds the whole tile to dq with one bulk
// reduction (f9_bulk_red) after the next tile's first barrier; it waits
// for the reduction's reads before the barrier that precedes the next
// stores. The rows of a last tile past T add zeros (their P and dS are 0).
//
// With WS (warp specialised, not with PIPE) the block has one more
// warpgroup, after the WG others, which gives its registers to them
// (setmaxnreg: 24 a thread against 232 with one, 240 with two). Its first
// thread copies the block's K and V tiles once and then each query tile's
// Q and dO on the bulk copy engine (f9_tma_load3 through the tensor maps
// tm[0] of qkv and tm[1] of dout, boxes of 64 columns by 64 rows, rows
// past T zero, straight into the swizzled layout), and its first 64
// threads store the tile's lse (base 2, +inf past T) and D rows; the
// others leave. Tile it goes into slot it % 2 once the slot's empty
// barrier completed phase it/2 - 1 (every warp of the warpgroups arrived
// on it after the tile's last product was done), and the full barrier's
// phase it/2 completes with the copies' bytes and 65 arrivals (the
// copying thread's expect_tx, and the 64 stores, released); the
// warpgroups wait on it before the tile's first product. The K and V
// tiles complete a barrier of their own once. The warpgroups meet no
// barrier in the loop without DQ; with DQ their block barriers (St and Dq
// whole) are f9_bar over the warpgroups only.
// f9_dqf_at is the float offset, in a 64 x HS tile of dQ stored in the
// order of the fused backward's accumulators (BULK), of the four floats of
// thread tid's (of NT, its warpgroups') column group j: that thread's
// dqa[4j..4j+3], rows 16·warp + g and + 8, columns wg·HS/WG + 8j + 2c and
// + 1 (the D fragment of the PTX ISA facts above). A warp's four floats
// of one j lie in 512 contiguous bytes. flash_bwd_dqf reads the order back.
template <int NT>
__device__ __forceinline__ int f9_dqf_at(int tid, int j) {
    return (j * NT + tid) * 4;
}

template <int HS, bool DQ = false, int WG = 1, bool BULK = false>
constexpr int f9_bwd_smem() {
    // WG K and V tiles, two Q and two dO tiles, + WG St with DQ, + Dq with
    // BULK; + room to align the tiles to 1024 bytes
    return (2 * WG + 4) * F9_BK * HS * 2 + (DQ ? WG * F9_BK * F9_BK * 2 : 0) + 4 * F9_BK * 4 +
           (BULK ? F9_BK * HS * 4 : 0) + 1024;
}
// f9_bwdws_smem is the WS kernels' shared memory: f9_bwd_smem's, then the
// five mbarriers (64 bytes).
template <int HS, bool DQ = false, int WG = 1, bool BULK = false>
constexpr int f9_bwdws_smem() {
    return f9_bwd_smem<HS, DQ, WG, BULK>() + 64;
}

template <int HS, bool PIPE, bool DQ = false, int WG = 1, bool BULK = false, bool WS = false>
__device__ __forceinline__ void flash_bwd_kv_sm90(uint16_t* __restrict__ dqkv, const uint16_t* __restrict__ dout,
                                                  const uint16_t* __restrict__ qkv, const float* __restrict__ lse,
                                                  const float* __restrict__ Dd, int T, int NH, int NKV, float scale_log2,
                                                  float scale, bool set, uint16_t* smem, float* __restrict__ dq = nullptr,
                                                  const f9_tmap* tm = nullptr) {
    static_assert(!(PIPE && DQ), "the fused backward is not pipelined");
    static_assert(!(PIPE && WS), "the warp-specialised backward is not pipelined");
    static_assert(WG == 1 || (WG == 2 && DQ), "two warpgroups only in the fused backward");
    static_assert(!BULK || DQ, "the bulk reduction is the fused backward's");
    constexpr int KD = HS / 16, NS = F9_BK / 2, NO = HS / 2, TILE = F9_BK * HS, NT = F9_THREADS * WG;
    constexpr int DN = HS / WG, NQ = DN / 2;  // dQ's columns per warpgroup and their accumulators
    smem += ((1024u - (f9_smem(smem) & 1023u)) & 1023u) / 2;  // the swizzle's 1024-byte alignment
    uint16_t* Ks = smem;            // WG K tiles
    uint16_t* Vs = Ks + WG * TILE;  // WG V tiles
    uint16_t* Qb = Vs + WG * TILE;  // two Q tiles
    uint16_t* Gb = Qb + 2 * TILE;   // two dO tiles
    uint16_t* St = Gb + 2 * TILE;   // WG dSᵀ tiles with DQ
    float* Lb = reinterpret_cast<float*>(St + (DQ ? WG * F9_BK * F9_BK : 0));
    float* Db = Lb + 2 * F9_BK;
    float* Dq = Db + 2 * F9_BK;  // with BULK, 1024-byte aligned
    // WS: the full and empty barriers of the two query slots, the K and V tiles' barrier.
    uint64_t* qfull = reinterpret_cast<uint64_t*>(Dq + (BULK ? F9_BK * HS : 0));
    uint64_t* qempty = qfull + 2;
    uint64_t* kvfull = qfull + 4;
    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, c = lane & 3;
    const int C = NH * HS, rep = NH / NKV;
    const int z = blockIdx.y, b = z / NKV, kv = z - b * NKV;  // one key/value head
    const int k0 = blockIdx.x * F9_BK * WG, kw = k0 + wg * F9_BK;  // the block's keys, the warpgroup's
    const i64 W = (i64)(NH + 2 * NKV) * HS;
    const uint16_t* kbase = qkv + (i64)b * T * W + (i64)(NH + kv) * HS;
    const uint16_t* vbase = kbase + (i64)NKV * HS;
    const int kr0 = kw + warp * 16 + g, kr1 = kr0 + 8;  // this thread's accumulator rows (keys)
    // The block's query tiles: from k0 to T for each query head of the
    // group in turn, nt per head; dK and dV sum over them in this order.
    const int nt = (T - k0 + F9_BK - 1) / F9_BK, nit = rep * nt;
    auto ld_q = [&](int it, int buf) {  // Q, dO, lse and D of tile it
        const int h = kv * rep + it / nt, q0 = k0 + (it % nt) * F9_BK;
        f9_load_tile_sw<HS, NT>(Qb + buf * TILE, qkv + (i64)b * T * W + (i64)h * HS, W, q0, T);
        f9_load_tile_sw<HS, NT>(Gb + buf * TILE, dout + (i64)b * T * C + (i64)h * HS, C, q0, T);
        fa_cp_commit();
        if (tid < F9_BK) {
            const int q = q0 + tid;
            const i64 r = ((i64)b * NH + h) * T + q;
            Lb[buf * F9_BK + tid] = q < T ? lse[r] * F9_LOG2E : INFINITY;
            Db[buf * F9_BK + tid] = q < T ? Dd[r] : 0.f;
        }
    };
    auto dq_reduce = [&](int it) {  // thread 0: dq's tile it += Dq, in f9_dqf_at's order
        const int h = kv * rep + it / nt, qt = k0 / F9_BK + it % nt, ntq = (T + F9_BK - 1) / F9_BK;
        f9_bulk_red(dq + (((i64)b * NH + h) * ntq + qt) * (F9_BK * HS), f9_smem(Dq), F9_BK * HS * 4);
        f9_bulk_commit();
    };
    // csync: the warpgroups' block barrier (with WS, f9_bar over them only).
    auto csync = [&] {
        if constexpr (WS)
            f9_bar<NT>();
        else
            __syncthreads();
    };
    if constexpr (WS) {
        if (tid == 0) {
#pragma unroll 1
            for (int i = 0; i < 2; i++) {
                f9_mbar_init(&qfull[i], 1 + F9_BK);
                f9_mbar_init(&qempty[i], 4 * WG);
            }
            f9_mbar_init(kvfull, 1);
            f9_mbar_init_fence();
        }
        __syncthreads();  // the barriers are initialised
        if (tid >= NT) {  // the producer warpgroup
            f9_setmaxnreg_dec<24>();
            const int p = tid - NT;
            if (p >= F9_BK) return;
            if (p == 0) {
                f9_mbar_expect_tx(kvfull, 2 * WG * TILE * 2);
#pragma unroll 1
                for (int w = 0; w < WG; w++)
#pragma unroll
                    for (int pp = 0; pp < HS / 64; pp++) {
                        f9_tma_load3(Ks + w * TILE + pp * F9_BK * 64, tm, (NH + kv) * HS + 64 * pp, k0 + w * F9_BK, b,
                                     kvfull);
                        f9_tma_load3(Vs + w * TILE + pp * F9_BK * 64, tm, (NH + NKV + kv) * HS + 64 * pp,
                                     k0 + w * F9_BK, b, kvfull);
                    }
            }
#pragma unroll 1
            for (int it = 0; it < nit; it++) {
                const int slot = it & 1, h = kv * rep + it / nt, q0 = k0 + (it % nt) * F9_BK;
                f9_mbar_wait(&qempty[slot], ((it >> 1) & 1) ^ 1);  // tile it - 2 is done with
                if (p == 0) {
                    f9_mbar_expect_tx(&qfull[slot], 2 * TILE * 2);
#pragma unroll
                    for (int pp = 0; pp < HS / 64; pp++) {
                        f9_tma_load3(Qb + slot * TILE + pp * F9_BK * 64, tm, h * HS + 64 * pp, q0, b, &qfull[slot]);
                        f9_tma_load3(Gb + slot * TILE + pp * F9_BK * 64, tm + 1, h * HS + 64 * pp, q0, b,
                                     &qfull[slot]);
                    }
                }
                const int q = q0 + p;
                const i64 r = ((i64)b * NH + h) * T + q;
                Lb[slot * F9_BK + p] = q < T ? lse[r] * F9_LOG2E : INFINITY;
                Db[slot * F9_BK + p] = q < T ? Dd[r] : 0.f;
                f9_mbar_arrive(&qfull[slot]);
            }
            // Every slot filled is emptied before the copying thread leaves.
            if (p == 0)
#pragma unroll 1
                for (int i = max(nit - 2, 0); i < nit; i++) f9_mbar_wait(&qempty[i & 1], (i >> 1) & 1);
            return;
        }
        f9_setmaxnreg_inc<WG == 2 ? 240 : 232>();
        f9_mbar_wait(kvfull, 0);
    } else {
#pragma unroll
        for (int w = 0; w < WG; w++) {
            f9_load_tile_sw<HS, NT>(Ks + w * TILE, kbase, W, k0 + w * F9_BK, T);
            f9_load_tile_sw<HS, NT>(Vs + w * TILE, vbase, W, k0 + w * F9_BK, T);
        }
        ld_q(0, 0);  // commits K and V with the first tile
    }
    float dk[NO], dv[NO], s[NS], dp[NS];
#pragma unroll
    for (int i = 0; i < NO; i++) dk[i] = dv[i] = 0.f;
    uint32_t pa[F9_BK / 16][4], da[F9_BK / 16][4];
    const uint32_t ks = f9_smem(Ks + wg * TILE), vs = f9_smem(Vs + wg * TILE);
    // dv_issue issues dV += Pᵀ·dO from pa, dk_issue (without DQ) dK +=
    // dSᵀ·Q from da, with the dO tile gs and the Q tile qs N-major
    // (f9_ndesc); neither commits.
    auto dv_issue = [&](uint32_t gs) {
#pragma unroll
        for (int kk = 0; kk < F9_BK / 16; kk++) {
            const uint64_t dg = f9_ndesc(gs, kk);
            if constexpr (HS == 64)
                f9_wgmma_n64<1>(dv, pa[kk], dg, 1);
            else
                f9_wgmma_n128<1>(dv, pa[kk], dg, 1);
        }
    };
    auto dk_issue = [&](uint32_t qs) {
#pragma unroll
        for (int kk = 0; kk < F9_BK / 16; kk++) {
            const uint64_t bq = f9_ndesc(qs, kk);
            if constexpr (HS == 64)
                f9_wgmma_n64<1>(dk, da[kk], bq, 1);
            else
                f9_wgmma_n128<1>(dk, da[kk], bq, 1);
        }
    };
    // tile(it, prev) is query tile it. With PIPE, prev (f9_bool, compile
    // time: every tile but the first) issues tile it-1's dV and dK first,
    // from the pa and da it left, in a commit group of their own; they run
    // on the tensor cores while S(it) and dP(it) are issued, and the
    // wait_group 1 that gives S(it) completes them, so that no wgmma group
    // outlives a call (ptxas serialized every wgmma when the last products
    // ran across the loop's back edge: C7515). The last tile's dV and dK
    // follow the loop.
    auto tile = [&](int it, auto prev) {
        constexpr bool PV = decltype(prev)::value;
        static_assert(PIPE || !PV, "only the pipelined backward defers a tile's last products");
        const int buf = it & 1, q0 = k0 + (it % nt) * F9_BK;
        const uint32_t qs = f9_smem(Qb + buf * TILE), gs = f9_smem(Gb + buf * TILE);
        const float* Ls = Lb + buf * F9_BK;
        const float* Ds = Db + buf * F9_BK;
        if constexpr (WS) {
            if constexpr (DQ) {
                f9_fence_proxy();
                csync();  // every product of tile it-1 is done, Dq whole
            }
            f9_mbar_wait(&qfull[buf], (it >> 1) & 1);  // tile it is in
        } else {
            fa_cp_wait();
            f9_fence_proxy();
            __syncthreads();  // tile it is in; without PIPE, every product of tile it-1 is done
            if (!PIPE && it + 1 < nit) ld_q(it + 1, buf ^ 1);
        }
        if constexpr (BULK)
            if (tid == 0 && it > 0) dq_reduce(it - 1);  // Dq holds tile it-1's, fenced before that barrier
        f9_wg_fence();
        if constexpr (PV) {  // tile it-1's dV and dK, from the other buffers
            dv_issue(f9_smem(Gb + (buf ^ 1) * TILE));
            dk_issue(f9_smem(Qb + (buf ^ 1) * TILE));
            f9_wg_commit();
        }
#pragma unroll
        for (int kk = 0; kk < KD; kk++)
            f9_wgmma_ss_n64<0>(s, f9_kdesc(ks, kk),
                               f9_kdesc(qs, kk), kk);
        f9_wg_commit();
#pragma unroll
        for (int kk = 0; kk < KD; kk++)
            f9_wgmma_ss_n64<0>(dp, f9_kdesc(vs, kk),
                               f9_kdesc(gs, kk), kk);
        f9_wg_commit();
        f9_wg_wait1();  // Sᵀ (and with prev the previous tile's dV, dK) done; dPᵀ may run
        f9_regs<NS>(s);
        if constexpr (PV) {
            f9_regs<NO>(dv);
            f9_regs<NO>(dk);
        }
        if (PIPE) {
            __syncthreads();  // every warp is past that wait: the other buffers are free
            if (it + 1 < nit) ld_q(it + 1, buf ^ 1);
        }
        // The tiles with queries before some of the warpgroup's keys: its
        // diagonal and, in the second warpgroup, the block's first tile.
        const bool diag = q0 < kw + F9_BK;
#pragma unroll
        for (int j = 0; j < NS / 4; j++) {
            const int qi = 8 * j + 2 * c, q = q0 + qi;
            const float l0 = Ls[qi], l1 = Ls[qi + 1];
            s[4 * j] = fa_exp2(s[4 * j] * scale_log2 - l0);
            s[4 * j + 1] = fa_exp2(s[4 * j + 1] * scale_log2 - l1);
            s[4 * j + 2] = fa_exp2(s[4 * j + 2] * scale_log2 - l0);
            s[4 * j + 3] = fa_exp2(s[4 * j + 3] * scale_log2 - l1);
            if (diag) {
                if (q < kr0) s[4 * j] = 0.f;
                if (q + 1 < kr0) s[4 * j + 1] = 0.f;
                if (q < kr1) s[4 * j + 2] = 0.f;
                if (q + 1 < kr1) s[4 * j + 3] = 0.f;
            }
        }
        f9_wg_wait();
        f9_regs<NS>(dp);
#pragma unroll
        for (int j = 0; j < NS / 4; j++) {
            const int qi = 8 * j + 2 * c;
            const float d0 = Ds[qi], d1 = Ds[qi + 1];
            dp[4 * j] = s[4 * j] * (dp[4 * j] - d0);
            dp[4 * j + 1] = s[4 * j + 1] * (dp[4 * j + 1] - d1);
            dp[4 * j + 2] = s[4 * j + 2] * (dp[4 * j + 2] - d0);
            dp[4 * j + 3] = s[4 * j + 3] * (dp[4 * j + 3] - d1);
        }
#pragma unroll
        for (int kk = 0; kk < F9_BK / 16; kk++) {
            pa[kk][0] = fa_pack(s[8 * kk], s[8 * kk + 1]);
            pa[kk][1] = fa_pack(s[8 * kk + 2], s[8 * kk + 3]);
            pa[kk][2] = fa_pack(s[8 * kk + 4], s[8 * kk + 5]);
            pa[kk][3] = fa_pack(s[8 * kk + 6], s[8 * kk + 7]);
            if constexpr (!DQ) {
                da[kk][0] = fa_pack(dp[8 * kk], dp[8 * kk + 1]);
                da[kk][1] = fa_pack(dp[8 * kk + 2], dp[8 * kk + 3]);
                da[kk][2] = fa_pack(dp[8 * kk + 4], dp[8 * kk + 5]);
                da[kk][3] = fa_pack(dp[8 * kk + 6], dp[8 * kk + 7]);
            }
        }
        if constexpr (DQ) {
            // dSᵀ into St: key row t, query column q at chunk q/8 of row
            // t, swizzled (chunk position (q/8) ^ (t % 8)); a warp's 32
            // words of one j fall in 32 distinct banks.
            const int t0 = warp * 16 + g, t1 = t0 + 8;
            uint16_t* sw = St + wg * F9_BK * F9_BK;
#pragma unroll
            for (int j = 0; j < NS / 4; j++) {
                f9_sts32(sw + t0 * 64 + ((j ^ (t0 & 7)) << 3) + 2 * c, fa_pack(dp[4 * j], dp[4 * j + 1]));
                f9_sts32(sw + t1 * 64 + ((j ^ (t1 & 7)) << 3) + 2 * c, fa_pack(dp[4 * j + 2], dp[4 * j + 3]));
            }
            f9_fence_proxy();
            if constexpr (BULK)
                if (tid == 0) f9_bulk_wait_read();  // the previous tile's reduction is past Dq
            csync();  // St is whole
        }
        // dV += Pᵀ·dO, dK += dSᵀ·Q (with PIPE in the next call, or after the
        // loop).
        if constexpr (PIPE) return;
        f9_wg_fence();
        dv_issue(gs);
        float dqa[DQ ? NQ : 1];
        if constexpr (DQ) {
            const uint32_t st = f9_smem(St), sw = st + wg * (F9_BK * F9_BK * 2);
#pragma unroll
            for (int kk = 0; kk < F9_BK / 16; kk++) {
                const uint64_t a = f9_kdesc(sw, kk), bq = f9_ndesc(qs, kk);
                if constexpr (HS == 64)
                    f9_wgmma_ss_n64<1>(dk, a, bq, 1);
                else
                    f9_wgmma_ss_n128<1>(dk, a, bq, 1);
            }
            // dQ(tile) = dS·K over the block's keys, DN head dims from dn
            // (bytes into the K tiles' rows: the second 64-dim block at
            // head size 128, the second 32 dims at 64): A = the St tiles
            // read M-major, B = the K tiles N-major.
            const uint32_t k0s = f9_smem(Ks), dn = WG == 1 ? 0 : HS == 128 ? wg * (F9_BK * 128) : wg * 64;
#pragma unroll
            for (int kk = 0; kk < WG * F9_BK / 16; kk++) {
                const uint64_t a = f9_ndesc(st + (kk >> 2) * (F9_BK * F9_BK * 2), kk & 3),
                               bk = f9_ndesc(k0s + (kk >> 2) * (TILE * 2) + dn, kk & 3);
                if constexpr (DN == 32)
                    f9_wgmma_ss_n32<1, 1>(dqa, a, bk, kk);
                else if constexpr (DN == 64)
                    f9_wgmma_ss_n64<1, 1>(dqa, a, bk, kk);
                else
                    f9_wgmma_ss_n128<1, 1>(dqa, a, bk, kk);
            }
        } else {
            dk_issue(qs);
        }
        f9_wg_commit();
        f9_wg_wait();
        f9_regs<NO>(dv);
        f9_regs<NO>(dk);
        if constexpr (WS)  // every product of tile it is done: its slot is free
            if (lane == 0) f9_mbar_arrive(&qempty[buf]);
        if constexpr (BULK) {
            f9_regs<NQ>(dqa);
#pragma unroll
            for (int j = 0; j < NQ / 4; j++)
                f9_sts128f(Dq + f9_dqf_at<NT>(tid, j), dqa[4 * j], dqa[4 * j + 1], dqa[4 * j + 2], dqa[4 * j + 3]);
        } else if constexpr (DQ) {
            f9_regs<NQ>(dqa);
            const int h = kv * rep + it / nt, qr0 = q0 + warp * 16 + g, qr1 = qr0 + 8;
            float* dqz = dq + ((i64)b * NH + h) * T * HS + wg * DN + 2 * c;
#pragma unroll
            for (int j = 0; j < NQ / 4; j++) {
                if (qr0 < T) f9_red2(dqz + (i64)qr0 * HS + 8 * j, dqa[4 * j], dqa[4 * j + 1]);
                if (qr1 < T) f9_red2(dqz + (i64)qr1 * HS + 8 * j, dqa[4 * j + 2], dqa[4 * j + 3]);
            }
        }
    };
    if constexpr (PIPE) {
        tile(0, f9_bool<false>{});
        for (int it = 1; it < nit; it++) tile(it, f9_bool<true>{});
        const int lb = (nit - 1) & 1;  // the last tile's buffers
        f9_wg_fence();
        dv_issue(f9_smem(Gb + lb * TILE));
        dk_issue(f9_smem(Qb + lb * TILE));
        f9_wg_commit();
        f9_wg_wait();
        f9_regs<NO>(dv);
        f9_regs<NO>(dk);
    } else {
        for (int it = 0; it < nit; it++) tile(it, f9_bool<false>{});
    }
    if constexpr (BULK) {
        f9_fence_proxy();
        csync();  // Dq holds the last tile's
        if (tid == 0) {
            dq_reduce(nit - 1);
            f9_bulk_wait();
        }
    }
    uint16_t* dkb = dqkv + (i64)b * T * W + (i64)(NH + kv) * HS + 2 * c;
    uint16_t* dvb = dkb + (i64)NKV * HS;
    if (kr0 < T) {
#pragma unroll
        for (int j = 0; j < NO / 4; j++) {
            fa_acc2(dkb + (i64)kr0 * W + j * 8, dk[4 * j] * scale, dk[4 * j + 1] * scale, set);
            fa_acc2(dvb + (i64)kr0 * W + j * 8, dv[4 * j], dv[4 * j + 1], set);
        }
    }
    if (kr1 < T) {
#pragma unroll
        for (int j = 0; j < NO / 4; j++) {
            fa_acc2(dkb + (i64)kr1 * W + j * 8, dk[4 * j + 2] * scale, dk[4 * j + 3] * scale, set);
            fa_acc2(dvb + (i64)kr1 * W + j * 8, dv[4 * j + 2], dv[4 * j + 3], set);
        }
    }
}

template <int HS, bool PIPE>
__device__ __forceinline__ void flash_bwd_q_sm90(uint16_t* __restrict__ dqkv, const uint16_t* __restrict__ dout,
                                                 const uint16_t* __restrict__ qkv, const float* __restrict__ lse,
                                                 const float* __restrict__ Dd, int T, int NH, int NKV, float scale_log2,
                                                 float scale, bool set, uint16_t* smem) {
    constexpr int KD = HS / 16, NS = F9_BK / 2, NO = HS / 2, TILE = F9_BK * HS;
    smem += ((1024u - (f9_smem(smem) & 1023u)) & 1023u) / 2;  // the swizzle's 1024-byte alignment
    uint16_t* Qs = smem;
    uint16_t* Gs = Qs + TILE;
    uint16_t* Kb = Gs + TILE;      // two K tiles
    uint16_t* Vb = Kb + 2 * TILE;  // two V tiles
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    const int C = NH * HS, z = blockIdx.y, b = z / NH, h = z - b * NH, kv = h / (NH / NKV);
    const int q0 = (gridDim.x - 1 - blockIdx.x) * F9_BQ;  // the most keys first
    const i64 W = (i64)(NH + 2 * NKV) * HS;
    const uint16_t* base = qkv + (i64)b * T * W + (i64)h * HS;
    const uint16_t* kbase = qkv + (i64)b * T * W + (i64)(NH + kv) * HS;
    const uint16_t* vbase = kbase + (i64)NKV * HS;
    const uint16_t* gbase = dout + (i64)b * T * C + (i64)h * HS;
    const int w0 = q0 + warp * 16, r0 = w0 + g, r1 = r0 + 8;
    const float l0 = r0 < T ? lse[(i64)z * T + r0] * F9_LOG2E : INFINITY;
    const float l1 = r1 < T ? lse[(i64)z * T + r1] * F9_LOG2E : INFINITY;
    const float d0 = r0 < T ? Dd[(i64)z * T + r0] : 0.f;
    const float d1 = r1 < T ? Dd[(i64)z * T + r1] : 0.f;
    const int n = (min(q0 + F9_BQ, T) - 1) / F9_BK + 1;  // key tiles, the last one the diagonal's
    auto ld_kv = [&](int j, int buf) {
        f9_load_tile_sw<HS, F9_THREADS>(Kb + buf * TILE, kbase, W, j * F9_BK, T);
        f9_load_tile_sw<HS, F9_THREADS>(Vb + buf * TILE, vbase, W, j * F9_BK, T);
        fa_cp_commit();
    };
    f9_load_tile_sw<HS, F9_THREADS>(Qs, base, W, q0, T);
    f9_load_tile_sw<HS, F9_THREADS>(Gs, gbase, C, q0, T);
    ld_kv(0, 0);  // commits Q and dO with the first tile
    float dq[NO], s[NS], dp[NS];
#pragma unroll
    for (int i = 0; i < NO; i++) dq[i] = 0.f;
    uint32_t da[F9_BK / 16][4];
    const uint32_t qs = f9_smem(Qs), gs = f9_smem(Gs);
    // dq_issue issues dQ += dS·K from da, the K tile ks N-major
    // (f9_ndesc); no commit.
    auto dq_issue = [&](uint32_t ks) {
#pragma unroll
        for (int kk = 0; kk < F9_BK / 16; kk++) {
            const uint64_t dk = f9_ndesc(ks, kk);
            if constexpr (HS == 64)
                f9_wgmma_n64<1>(dq, da[kk], dk, 1);
            else
                f9_wgmma_n128<1>(dq, da[kk], dk, 1);
        }
    };
    // tile(j, prev) is key tile j; with PIPE and prev (every tile but the
    // first) it issues tile j-1's dQ first, as flash_bwd_kv_sm90's tile
    // does its dV and dK; the last tile's follows the loop.
    auto tile = [&](int j, auto prev) {
        constexpr bool PV = decltype(prev)::value;
        static_assert(PIPE || !PV, "only the pipelined backward defers a tile's last product");
        const int buf = j & 1, kk0 = j * F9_BK;
        const uint32_t ks = f9_smem(Kb + buf * TILE), vs = f9_smem(Vb + buf * TILE);
        fa_cp_wait();
        f9_fence_proxy();
        __syncthreads();  // tile j is in; without PIPE, every product of tile j-1 is done
        if (!PIPE && j + 1 < n) ld_kv(j + 1, buf ^ 1);
        f9_wg_fence();
        if constexpr (PV) {  // tile j-1's dQ, from the other K buffer
            dq_issue(f9_smem(Kb + (buf ^ 1) * TILE));
            f9_wg_commit();
        }
#pragma unroll
        for (int kk = 0; kk < KD; kk++)
            f9_wgmma_ss_n64<0>(s, f9_kdesc(qs, kk),
                               f9_kdesc(ks, kk), kk);
        f9_wg_commit();
#pragma unroll
        for (int kk = 0; kk < KD; kk++)
            f9_wgmma_ss_n64<0>(dp, f9_kdesc(gs, kk),
                               f9_kdesc(vs, kk), kk);
        f9_wg_commit();
        f9_wg_wait1();  // S (and with prev the previous tile's dQ) done; dP may run
        f9_regs<NS>(s);
        if constexpr (PV) f9_regs<NO>(dq);
        if (PIPE) {
            __syncthreads();  // every warp is past that wait: the other buffers are free
            if (j + 1 < n) ld_kv(j + 1, buf ^ 1);
        }
        const bool mask = kk0 + F9_BK - 1 > w0;  // keys after some row of the warp (and keys past T)
#pragma unroll
        for (int jj = 0; jj < NS / 4; jj++) {
            const int key = kk0 + 8 * jj + 2 * c;
            s[4 * jj] = fa_exp2(s[4 * jj] * scale_log2 - l0);
            s[4 * jj + 1] = fa_exp2(s[4 * jj + 1] * scale_log2 - l0);
            s[4 * jj + 2] = fa_exp2(s[4 * jj + 2] * scale_log2 - l1);
            s[4 * jj + 3] = fa_exp2(s[4 * jj + 3] * scale_log2 - l1);
            if (mask) {
                if (key > r0) s[4 * jj] = 0.f;
                if (key + 1 > r0) s[4 * jj + 1] = 0.f;
                if (key > r1) s[4 * jj + 2] = 0.f;
                if (key + 1 > r1) s[4 * jj + 3] = 0.f;
            }
        }
        f9_wg_wait();
        f9_regs<NS>(dp);
#pragma unroll
        for (int jj = 0; jj < NS / 4; jj++) {
            dp[4 * jj] = s[4 * jj] * (dp[4 * jj] - d0);
            dp[4 * jj + 1] = s[4 * jj + 1] * (dp[4 * jj + 1] - d0);
            dp[4 * jj + 2] = s[4 * jj + 2] * (dp[4 * jj + 2] - d1);
            dp[4 * jj + 3] = s[4 * jj + 3] * (dp[4 * jj + 3] - d1);
        }
#pragma unroll
        for (int kk = 0; kk < F9_BK / 16; kk++) {
            da[kk][0] = fa_pack(dp[8 * kk], dp[8 * kk + 1]);
            da[kk][1] = fa_pack(dp[8 * kk + 2], dp[8 * kk + 3]);
            da[kk][2] = fa_pack(dp[8 * kk + 4], dp[8 * kk + 5]);
            da[kk][3] = fa_pack(dp[8 * kk + 6], dp[8 * kk + 7]);
        }
        // dQ += dS·K (with PIPE in the next call, or after the loop).
        if constexpr (!PIPE) {
            f9_wg_fence();
            dq_issue(ks);
            f9_wg_commit();
            f9_wg_wait();
            f9_regs<NO>(dq);
        }
    };
    if constexpr (PIPE) {
        tile(0, f9_bool<false>{});
        for (int j = 1; j < n; j++) tile(j, f9_bool<true>{});
        f9_wg_fence();
        dq_issue(f9_smem(Kb + ((n - 1) & 1) * TILE));  // the last tile's
        f9_wg_commit();
        f9_wg_wait();
        f9_regs<NO>(dq);
    } else {
        for (int j = 0; j < n; j++) tile(j, f9_bool<false>{});
    }
    uint16_t* dqb = dqkv + (i64)b * T * W + (i64)h * HS + 2 * c;
    if (r0 < T) {
#pragma unroll
        for (int j = 0; j < NO / 4; j++) fa_acc2(dqb + (i64)r0 * W + j * 8, dq[4 * j] * scale, dq[4 * j + 1] * scale, set);
    }
    if (r1 < T) {
#pragma unroll
        for (int j = 0; j < NO / 4; j++) fa_acc2(dqb + (i64)r1 * W + j * 8, dq[4 * j + 2] * scale, dq[4 * j + 3] * scale, set);
    }
}

// f9_dqf_tiles: dqkv's query columns = (set ? 0 : dqkv) + scale·dq, one
// rounding to bf16, rows past T skipped, for the fused kernels with bulk
// dQ, whose float32 dq holds, per (batch, head), ceil(T/64) tiles of 64 x
// hs in their wg warpgroups' accumulators' order (f9_dqf_at). Block blk of
// nblk takes tiles blk, blk + nblk, .. of ntiles; its thread tid of nthr
// the tile's float4s tid, tid + nthr, .. counted in the order of the row
// they go to, not of dq: consecutive ones hold consecutive column pairs
// (c, then the column group j) of one accumulator row pair, so that a
// warp writes whole rows of hs/wg columns and reads runs of four float4s
// (64 bytes). hs/wg 32, 64 or 128; dq 16-byte and dqkv 4-byte aligned.
__device__ __forceinline__ void f9_dqf_tiles(uint16_t* __restrict__ dqkv, const float* __restrict__ dq, i64 ntiles,
                                             int T, int NH, int NKV, int hs, int wg, float scale, bool set, int blk,
                                             int nblk, int tid, int nthr) {
    const int per = 16 * hs, nt = F9_THREADS * wg, dn = hs / wg, ntq = (T + F9_BK - 1) / F9_BK;
    int lj = 0;  // log2 of the column groups of a row: dn / 8
    while ((8 << lj) < dn) lj++;
    const i64 W = (i64)(NH + 2 * NKV) * hs;
    for (i64 tile = blk; tile < ntiles; tile += nblk) {  // (b·NH + h)·ntq + the tile of T
        const i64 bh = tile / ntq;
        const int t0 = (int)(tile - bh * ntq) * F9_BK, h = (int)(bh % NH);
        const float* src = dq + tile * per * 4;
        uint16_t* d = dqkv + (bh / NH) * T * W + (i64)h * hs;
        for (int u = tid; u < per; u += nthr) {
            const int c = u & 3, j = (u >> 2) & ((1 << lj) - 1), r = u >> (2 + lj);
            const int g = r & 7, warp = (r >> 3) & 3, w = r >> 5;
            float v[4];
            f9_ldg128f(src + 4 * (j * nt + w * F9_THREADS + warp * 32 + g * 4 + c), v);
            const int t = t0 + warp * 16 + g;
            uint16_t* o = d + w * dn + 8 * j + 2 * c;
            if (t < T) fa_acc2(o + (i64)t * W, v[0] * scale, v[1] * scale, set);
            if (t + 8 < T) fa_acc2(o + (i64)(t + 8) * W, v[2] * scale, v[3] * scale, set);
        }
    }
}

// ---- Entry points ----

// flash_fwd_sm90_bf16_hs64 and _hs128: flash_fwd_bf16_hs64 and _hs128 of
// flashattn.cu (same arguments and contract, qkv 16-byte and out 4-byte
// aligned) on the sm_90a tensor cores, one row tile per warpgroup: grid
// (ceil(T/64), B·NH), 128 threads.
extern "C" __global__ void __launch_bounds__(F9_THREADS)
    flash_fwd_sm90_bf16_hs64(void* out, float* lse, const void* qkv, int T, int NH, int NKV, float scale_log2) {
    __shared__ __align__(128) uint16_t Ks[F9_BK * 64];
    __shared__ __align__(128) uint16_t Vs[F9_BK * 64];
    flash_fwd_sm90<64, 1, 1>((uint16_t*)out, lse, (const uint16_t*)qkv, T, NH, NKV, scale_log2, Ks, Vs);
}

extern "C" __global__ void __launch_bounds__(F9_THREADS)
    flash_fwd_sm90_bf16_hs128(void* out, float* lse, const void* qkv, int T, int NH, int NKV, float scale_log2) {
    __shared__ __align__(128) uint16_t Ks[F9_BK * 128];
    __shared__ __align__(128) uint16_t Vs[F9_BK * 128];
    flash_fwd_sm90<128, 1, 1>((uint16_t*)out, lse, (const uint16_t*)qkv, T, NH, NKV, scale_log2, Ks, Vs);
}

// flash_fwd2_sm90_bf16_hs64: flash_fwd_sm90_bf16_hs64 with two row tiles
// per warpgroup: grid (ceil(T/128), B·NH), 128 threads.
extern "C" __global__ void __launch_bounds__(F9_THREADS)
    flash_fwd2_sm90_bf16_hs64(void* out, float* lse, const void* qkv, int T, int NH, int NKV, float scale_log2) {
    __shared__ __align__(128) uint16_t Ks[F9_BK * 64];
    __shared__ __align__(128) uint16_t Vs[F9_BK * 64];
    flash_fwd_sm90<64, 2, 1>((uint16_t*)out, lse, (const uint16_t*)qkv, T, NH, NKV, scale_log2, Ks, Vs);
}

// flash_fwd2_sm90_bf16_hs128: flash_fwd_sm90_bf16_hs128 with two
// warpgroups of one row tile each sharing the K and V tiles: grid
// (ceil(T/128), B·NH), 256 threads.
extern "C" __global__ void __launch_bounds__(2 * F9_THREADS)
    flash_fwd2_sm90_bf16_hs128(void* out, float* lse, const void* qkv, int T, int NH, int NKV, float scale_log2) {
    __shared__ __align__(128) uint16_t Ks[F9_BK * 128];
    __shared__ __align__(128) uint16_t Vs[F9_BK * 128];
    flash_fwd_sm90<128, 1, 2>((uint16_t*)out, lse, (const uint16_t*)qkv, T, NH, NKV, scale_log2, Ks, Vs);
}

// flash_fwd3_sm90_bf16_hs64 and _hs128: the same contract with the
// products overlapped with the softmax (flash_fwd_sm90p), two warpgroups
// of one 64-row tile each sharing the K and V rings, in lockstep or
// ping-pong (F9_FWD3_PP64, F9_FWD3_PP128) with rings of F9_FWD3_D64 and
// F9_FWD3_D128 tiles (copies three tiles ahead either way at the
// defaults: 4 lockstep at head size 64, 5 ping-pong at 128; timed side by
// side on the H100 on 2026-12-06, tools/bench/results/
// attn_pingpong_h100.json: at head size 64 lockstep took 4-5% less time,
// at 128 ping-pong 1-2% less): grid (ceil(T/128), B·NH), 256 threads,
// f9_fwdp_smem<HS, D>() bytes of dynamic shared memory (65 and 161 KB;
// flash_sm90.go computes the same); head size 64 within 128 registers, two
// blocks per SM. flash_fwd3x1_sm90_bf16_hs64 and _hs128: one warpgroup
// (one 64-row tile) per block, depth 2: grid (ceil(T/64), B·NH), 128
// threads, f9_fwdp_smem<HS, 2>() bytes; blocks on one SM run their
// products and softmaxes independently.
#ifndef F9_FWD3_D64
#define F9_FWD3_D64 4
#endif
#ifndef F9_FWD3_PP64
#define F9_FWD3_PP64 false
#endif
#ifndef F9_FWD3_D128
#define F9_FWD3_D128 5
#endif
#ifndef F9_FWD3_PP128
#define F9_FWD3_PP128 true
#endif
#define F9_FWD3(NAME, HS, WG, D, PP, MINB) \
    extern "C" __global__ void __launch_bounds__(WG * F9_THREADS, MINB) \
        NAME(void* out, float* lse, const void* qkv, int T, int NH, int NKV, float scale_log2) { \
        extern __shared__ __align__(1024) uint16_t f9_dynp[]; \
        flash_fwd_sm90p<HS, WG, D, PP>((uint16_t*)out, lse, (const uint16_t*)qkv, T, NH, NKV, scale_log2, f9_dynp); \
    }
F9_FWD3(flash_fwd3_sm90_bf16_hs64, 64, 2, F9_FWD3_D64, F9_FWD3_PP64, 2)
F9_FWD3(flash_fwd3_sm90_bf16_hs128, 128, 2, F9_FWD3_D128, F9_FWD3_PP128, 1)
F9_FWD3(flash_fwd3x1_sm90_bf16_hs64, 64, 1, 2, false, 4)
F9_FWD3(flash_fwd3x1_sm90_bf16_hs128, 128, 1, 2, false, 2)

// flash_fwd4_sm90_bf16_hs64 and _hs128: flash_fwd_sm90p with 128-key
// tiles (BK 128), two warpgroups in lockstep, 128 query rows per block:
// grid (ceil(T/128), B·NH), 256 threads, rings of F9_FWD4_D64 (4) and
// F9_FWD4_D128 (3) tiles, f9_fwdp_smem<HS, D, 128>() bytes of dynamic
// shared memory (129 and 193 KB), one block per SM. flash_fwd4w3_sm90_bf16_hs64:
// three warpgroups, 192 rows per block (grid ceil(T/192)), 384 threads,
// ring of F9_FWD4_D64; flash_fwd4p_sm90_bf16_hs128: two warpgroups in
// ping-pong, ring of F9_FWD4_D128 (one copy ahead at 3). flash_sm90.go
// computes the same sizes.
#ifndef F9_FWD4_D64
#define F9_FWD4_D64 4
#endif
#ifndef F9_FWD4_D128
#define F9_FWD4_D128 3
#endif
#define F9_FWD4(NAME, HS, WG, D, PP) \
    extern "C" __global__ void __launch_bounds__(WG * F9_THREADS, 1) \
        NAME(void* out, float* lse, const void* qkv, int T, int NH, int NKV, float scale_log2) { \
        extern __shared__ __align__(1024) uint16_t f9_dynp[]; \
        flash_fwd_sm90p<HS, WG, D, PP, 128>((uint16_t*)out, lse, (const uint16_t*)qkv, T, NH, NKV, scale_log2, f9_dynp); \
    }
F9_FWD4(flash_fwd4_sm90_bf16_hs64, 64, 2, F9_FWD4_D64, false)
F9_FWD4(flash_fwd4_sm90_bf16_hs128, 128, 2, F9_FWD4_D128, false)
F9_FWD4(flash_fwd4w3_sm90_bf16_hs64, 64, 3, F9_FWD4_D64, false)
F9_FWD4(flash_fwd4p_sm90_bf16_hs128, 128, 2, F9_FWD4_D128, true)

// flash_fwd5_sm90_*: flash_fwd_sm90p with WS, a producer warpgroup copying the
// K and V tiles on the bulk copy engine through the tensor map tm of qkv
// (the 3-D tensor of (NH + 2·NKV)·hs columns, T rows and B batches, boxes
// of 64 columns and BK rows in the 128-byte swizzle: cgo.go's
// spill_tmap3) and handing them over through mbarriers: (WG + 1)·128
// threads, f9_fwdws_smem<HS, D, BK>() bytes of dynamic shared memory, one
// block per SM, grid (ceil(T/(64·WG)) or fewer, B·NH). flash_fwd5: two
// warpgroups, 128-key tiles (rings of 4 at head size 64, 3 at 128);
// flash_fwd5w3_sm90_bf16_hs64: three warpgroups (192 rows), 64-key tiles,
// ring of 6; flash_fwd5k_sm90_bf16_hs128: two warpgroups, 64-key tiles,
// ring of 5; flash_fwd5p: flash_fwd5 with the two warpgroups taking turns
// at issuing their products (PP). flash_shapes.go's sm90wsKernels lists the same.
#define F9_FWD5(NAME, HS, WG, D, BK, PP) \
    extern "C" __global__ void __launch_bounds__((WG + 1) * F9_THREADS, 1) \
        NAME(void* out, float* lse, const void* qkv, int T, int NH, int NKV, float scale_log2, \
             const __grid_constant__ f9_tmap tm) { \
        extern __shared__ __align__(1024) uint16_t f9_dynp[]; \
        flash_fwd_sm90p<HS, WG, D, PP, BK, true>((uint16_t*)out, lse, (const uint16_t*)qkv, T, NH, NKV, scale_log2, \
                                                    f9_dynp, &tm); \
    }
F9_FWD5(flash_fwd5_sm90_bf16_hs64, 64, 2, 4, 128, false)
F9_FWD5(flash_fwd5w3_sm90_bf16_hs64, 64, 3, 6, 64, false)
F9_FWD5(flash_fwd5p_sm90_bf16_hs64, 64, 2, 4, 128, true)
F9_FWD5(flash_fwd5_sm90_bf16_hs128, 128, 2, 3, 128, false)
F9_FWD5(flash_fwd5k_sm90_bf16_hs128, 128, 2, 5, 64, false)
F9_FWD5(flash_fwd5p_sm90_bf16_hs128, 128, 2, 3, 128, true)

// flash_bwd_kv_sm90_* and flash_bwd_q_sm90_*: flash_bwd_kv_bf16_* and
// flash_bwd_q_bf16_* of flashattn.cu (same arguments and contract: dqkv +=,
// or with set =, the gradients; qkv and dout 16-byte, dqkv 4-byte aligned)
// on the sm_90a tensor cores: grids (ceil(T/64), B·NKV) and (ceil(T/64),
// B·NH), 128 threads, f9_bwd_smem<HS>() bytes of dynamic shared memory
// (flash_sm90.go computes the same). sm90p: the pipelined kernels (PIPE),
// flash_bwd_kv_sm90p_bf16_hs64 held to 168 registers (three blocks per SM,
// as flash_bwd_kv_sm90_bf16_hs64 at its 158; unbounded it took 186 and two).
#define F9_BWD(KIND, NAME, HS, PIPE, MINB) \
    extern "C" __global__ void __launch_bounds__(F9_THREADS, MINB) \
        NAME(void* dqkv, const void* dout, const void* qkv, const float* lse, const float* D, int T, int NH, int NKV, \
             float scale_log2, float scale, int set) { \
        extern __shared__ __align__(1024) uint16_t f9_dynb[]; \
        KIND<HS, PIPE>((uint16_t*)dqkv, (const uint16_t*)dout, (const uint16_t*)qkv, lse, D, T, NH, NKV, scale_log2, \
                       scale, set != 0, f9_dynb); \
    }
F9_BWD(flash_bwd_kv_sm90, flash_bwd_kv_sm90_bf16_hs64, 64, false, 2)
F9_BWD(flash_bwd_kv_sm90, flash_bwd_kv_sm90_bf16_hs128, 128, false, 2)
F9_BWD(flash_bwd_kv_sm90, flash_bwd_kv_sm90p_bf16_hs64, 64, true, 3)
F9_BWD(flash_bwd_kv_sm90, flash_bwd_kv_sm90p_bf16_hs128, 128, true, 2)
F9_BWD(flash_bwd_q_sm90, flash_bwd_q_sm90_bf16_hs64, 64, false, 2)
F9_BWD(flash_bwd_q_sm90, flash_bwd_q_sm90_bf16_hs128, 128, false, 2)
F9_BWD(flash_bwd_q_sm90, flash_bwd_q_sm90p_bf16_hs64, 64, true, 2)
F9_BWD(flash_bwd_q_sm90, flash_bwd_q_sm90p_bf16_hs128, 128, true, 2)

// flash_bwd_fused_sm90_*: flash_bwd_fused_bf16_* of flashattn.cu (same
// arguments and contract: dqkv's key and value columns += (or, with set,
// =) dK and dV, the float32 dq(B, NH, T, hs) += the unscaled dQ, zero on
// entry and written into dqkv by flash_bwd_dq; dq 8-byte aligned) on the
// sm_90a tensor cores: flash_bwd_kv_sm90 with DQ, grid (ceil(T/64),
// B·NKV), 128 threads, f9_bwd_smem<HS, true>() bytes of dynamic shared
// memory (flash_sm90.go computes the same). flash_bwd_fused1b_sm90_*: dQ
// by one bulk reduction per tile (BULK, as flash_bwd_fused2b_sm90_*),
// f9_bwd_smem<HS, true, 1, true>() bytes (74 and 138 KB), dq 16-byte
// aligned and in tiles of f9_dqf_at's order (B·NH·ceil(T/64) of 64 x hs:
// flash_bwd_dqf writes it into dqkv); at head size 64 held to 168 registers, so that three blocks
// share an SM (as the split flash_bwd_kv_sm90_bf16_hs64 does).
#define F9_BWDF(NAME, HS, BULK, MINB) \
    extern "C" __global__ void __launch_bounds__(F9_THREADS, MINB) \
        NAME(void* dqkv, float* dq, const void* dout, const void* qkv, const float* lse, const float* D, int T, int NH, \
             int NKV, float scale_log2, float scale, int set) { \
        extern __shared__ __align__(1024) uint16_t f9_dynb[]; \
        flash_bwd_kv_sm90<HS, false, true, 1, BULK>((uint16_t*)dqkv, (const uint16_t*)dout, (const uint16_t*)qkv, lse, \
                                                    D, T, NH, NKV, scale_log2, scale, set != 0, f9_dynb, dq); \
    }
F9_BWDF(flash_bwd_fused_sm90_bf16_hs64, 64, false, 2)
F9_BWDF(flash_bwd_fused_sm90_bf16_hs128, 128, false, 2)
F9_BWDF(flash_bwd_fused1b_sm90_bf16_hs64, 64, true, 3)
F9_BWDF(flash_bwd_fused1b_sm90_bf16_hs128, 128, true, 1)

// flash_bwd_fused2_sm90_*: the same with two warpgroups and 128 keys per
// block (WG 2): grid (ceil(T/128), B·NKV), 256 threads,
// f9_bwd_smem<HS, true, 2>() bytes of dynamic shared memory (82 and 146
// KB; flash_sm90.go computes the same). flash_bwd_fused2b_sm90_*: dQ by
// one bulk reduction per tile (BULK), f9_bwd_smem<HS, true, 2, true>()
// bytes (98 and 178 KB), dq as flash_bwd_fused1b's.
#define F9_BWDF2(NAME, HS, BULK) \
    extern "C" __global__ void __launch_bounds__(2 * F9_THREADS, 1) \
        NAME(void* dqkv, float* dq, const void* dout, const void* qkv, const float* lse, const float* D, int T, int NH, \
             int NKV, float scale_log2, float scale, int set) { \
        extern __shared__ __align__(1024) uint16_t f9_dynb[]; \
        flash_bwd_kv_sm90<HS, false, true, 2, BULK>((uint16_t*)dqkv, (const uint16_t*)dout, (const uint16_t*)qkv, lse, \
                                                    D, T, NH, NKV, scale_log2, scale, set != 0, f9_dynb, dq); \
    }
F9_BWDF2(flash_bwd_fused2_sm90_bf16_hs64, 64, false)
F9_BWDF2(flash_bwd_fused2_sm90_bf16_hs128, 128, false)
F9_BWDF2(flash_bwd_fused2b_sm90_bf16_hs64, 64, true)
F9_BWDF2(flash_bwd_fused2b_sm90_bf16_hs128, 128, true)

// flash_bwd_dqf: flash_bwd_dq of flashattn.cu for the fused kernels with
// bulk dQ (BULK: flash_bwd_fused1b, 2b, 1w, 2w): f9_dqf_tiles over
// ntiles = B·NH·ceil(T/64) tiles, a block of any size per tile at a
// time (grid-stride).
extern "C" __global__ void flash_bwd_dqf(void* dqkv, const float* dq, long long ntiles, int T, int NH, int NKV, int hs,
                                         int wg, float scale, int set) {
    f9_dqf_tiles((uint16_t*)dqkv, dq, ntiles, T, NH, NKV, hs, wg, scale, set != 0, blockIdx.x, gridDim.x, threadIdx.x,
                 blockDim.x);
}

// flash_bwd_fused1w_sm90_* and flash_bwd_fused2w_sm90_*: flash_bwd_fused1b
// and flash_bwd_fused2b warp-specialised (WS): a producer warpgroup after
// the WG others copies the K, V, Q and dO tiles by bulk tensor copies
// through the tensor maps tm.m[0] of qkv (the 3-D tensor of (NH + 2·NKV)·hs
// columns, T rows and B batches) and tm.m[1] of dout (NH·hs columns),
// boxes of 64 columns by 64 rows in the 128-byte swizzle (cgo.go's
// spill_tmap3), and stores lse and D, handing each tile over through
// mbarriers: (WG + 1)·128 threads, f9_bwdws_smem<HS, true, WG, true>()
// bytes of dynamic shared memory, grid (ceil(T/(64·WG)), B·NKV); the same
// arguments and contract as the fused kernels otherwise. The one-warpgroup
// kernels are bounded for two blocks of 256 threads per SM (128 registers
// at launch, the whole of what setmaxnreg hands out: 24 + 232; at head
// size 128 the shared memory fits one); the two-warpgroup ones take 168
// at launch (24 + 2·240). flash_modes.go's fusedSM90Modes lists them.
struct __align__(64) f9_tmap2 {
    f9_tmap m[2];
};
#define F9_BWDFW(NAME, HS, WG, MINB) \
    extern "C" __global__ void __launch_bounds__((WG + 1) * F9_THREADS, MINB) \
        NAME(void* dqkv, float* dq, const void* dout, const void* qkv, const float* lse, const float* D, int T, int NH, \
             int NKV, float scale_log2, float scale, int set, const __grid_constant__ f9_tmap2 tm) { \
        extern __shared__ __align__(1024) uint16_t f9_dynb[]; \
        flash_bwd_kv_sm90<HS, false, true, WG, true, true>((uint16_t*)dqkv, (const uint16_t*)dout, \
                                                           (const uint16_t*)qkv, lse, D, T, NH, NKV, scale_log2, \
                                                           scale, set != 0, f9_dynb, dq, tm.m); \
    }
F9_BWDFW(flash_bwd_fused1w_sm90_bf16_hs64, 64, 1, 2)
F9_BWDFW(flash_bwd_fused1w_sm90_bf16_hs128, 128, 1, 2)
F9_BWDFW(flash_bwd_fused2w_sm90_bf16_hs64, 64, 2, 1)
F9_BWDFW(flash_bwd_fused2w_sm90_bf16_hs128, 128, 2, 1)

// flash_bwd_kvw_sm90_*: flash_bwd_kv_sm90_* warp-specialised (WS), beside
// flash_bwd_q_sm90_* (SPILL_FLASH_BWD=sm90w): the same arguments and
// contract, then the tensor maps of qkv and dout as for flash_bwd_fused1w;
// 256 threads (bounded for two blocks per SM: 24 + 232 registers),
// f9_bwdws_smem<HS>() bytes of dynamic shared memory, grid (ceil(T/64),
// B·NKV).
#define F9_BWDW(NAME, HS) \
    extern "C" __global__ void __launch_bounds__(2 * F9_THREADS, 2) \
        NAME(void* dqkv, const void* dout, const void* qkv, const float* lse, const float* D, int T, int NH, int NKV, \
             float scale_log2, float scale, int set, const __grid_constant__ f9_tmap2 tm) { \
        extern __shared__ __align__(1024) uint16_t f9_dynb[]; \
        flash_bwd_kv_sm90<HS, false, false, 1, false, true>((uint16_t*)dqkv, (const uint16_t*)dout, \
                                                            (const uint16_t*)qkv, lse, D, T, NH, NKV, scale_log2, \
                                                            scale, set != 0, f9_dynb, nullptr, tm.m); \
    }
F9_BWDW(flash_bwd_kvw_sm90_bf16_hs64, 64)
F9_BWDW(flash_bwd_kvw_sm90_bf16_hs128, 128)
