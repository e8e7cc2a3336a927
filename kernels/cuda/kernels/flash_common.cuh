// flash_common.cuh: the register and copy primitives both flash-attention
// files use (flashattn.cu on mma.sync, flashattn_sm90.cu on wgmma). The
// host emulators (tools/cuda/emu) give their own versions of these: they
// take only the device code after each file's "---- Device code" marker.
#pragma once
#include "common.cuh"

// fa_pack rounds lo and hi to bf16 and packs them, lo in the lower half.
__device__ __forceinline__ uint32_t fa_pack(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // one cvt.rn.bf16x2.f32
    return *reinterpret_cast<const uint32_t*>(&v);
}

// fa_exp2 is 2^x by the special-function unit (ex2.approx.ftz: relative
// error about 2^-22, denormal results flushed to 0; 2^-inf = 0).
__device__ __forceinline__ float fa_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// fa_ld32 loads the bf16 pair at p (4-byte aligned).
__device__ __forceinline__ uint32_t fa_ld32(const uint16_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

// fa_acc2 adds (lo, hi) to the bf16 pair at p (4-byte aligned), rounding
// once; with set it overwrites the pair instead.
__device__ __forceinline__ void fa_acc2(uint16_t* p, float lo, float hi, bool set) {
    if (!set) {
        const uint32_t w = *reinterpret_cast<uint32_t*>(p);
        lo += __uint_as_float(w << 16);
        hi += __uint_as_float(w & 0xffff0000u);
    }
    *reinterpret_cast<uint32_t*>(p) = fa_pack(lo, hi);
}

// fa_cp_commit closes this thread's group of cp.async copies; fa_cp_wait
// waits for all of its groups (a barrier after it publishes the data).
__device__ __forceinline__ void fa_cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void fa_cp_wait() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
// fa_cp_wait_n waits until at most N of this thread's committed groups of
// cp.async copies are pending: all but the newest N have landed.
template <int N>
__device__ __forceinline__ void fa_cp_wait_n() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
