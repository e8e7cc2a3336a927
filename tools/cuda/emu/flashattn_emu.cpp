// flashattn_emu.cpp: runs flash_fwd, flash_fwd_mt and the backward kernels (split and
// fused) of kernels/cuda/kernels/flashattn.cu on
// the host, to check the kernel's index arithmetic without a GPU: each block
// is 128 std::threads, __syncthreads a barrier, and mma.m16n8k16 and the
// shuffles and ldmatrix are emulated warp-collectively from the fragment layouts of the
// PTX ISA; atomicAdd on float is std::atomic_ref (blocks run one at a
// time, so only the threads of one block race). Out, lse and dqkv are compared with a float64 reference, for
// multi-head and grouped-query layouts (NKV key/value heads shared by
// NH/NKV query heads each); built with
// AddressSanitizer it also checks every global and shared access is in
// bounds. Run with tools/cuda/emu.sh (g++ only, no CUDA toolkit).
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>
#include <random>
#include <algorithm>
#include <cstdlib>
typedef long long i64;
struct __nv_bfloat16 { uint16_t bits; };
struct __nv_bfloat162 { __nv_bfloat16 x, y; };
struct uint4 { uint32_t x, y, z, w; };
static uint4 make_uint4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) { return {a, b, c, d}; }
static uint16_t f2bf(float f) { uint32_t u; memcpy(&u, &f, 4); if ((u & 0x7fffffff) > 0x7f800000) return 0x7fc0; u += 0x7fff + ((u >> 16) & 1); return u >> 16; }
static float bf2f(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
static __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {{f2bf(a)}, {f2bf(b)}}; }
struct dim { int x, y; };
thread_local dim threadIdx, blockIdx;
dim gridDim;
#define __device__
#define __forceinline__
#define __restrict__
#define FA_BQ 64
#define FA_BK 64
#define FA_THREADS 128
#define FA_LN2 0.6931471805599453f
#define FA_LOG2E 1.4426950408889634f
std::barrier<>* blockBar;
std::barrier<>* warpBar[8];  // up to 8 warps per block (the split backward's _w8 variants)
static void __syncthreads() { blockBar->arrive_and_wait(); }
float shf[8][32];
static float __shfl_xor_sync(unsigned, float v, int o) {
  int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  shf[w][l] = v; warpBar[w]->arrive_and_wait();
  float r = shf[w][l ^ o]; warpBar[w]->arrive_and_wait();
  return r;
}
static uint32_t fa_pack(float lo, float hi) { return (uint32_t)f2bf(lo) | ((uint32_t)f2bf(hi) << 16); }
static float fa_exp2(float x) { return exp2f(x); }
static uint32_t fa_ld32(const uint16_t* p) { uint32_t v; memcpy(&v, p, 4); return v; }
uint32_t ma[8][32][4], mb[8][32][2];
static float half(uint32_t r, int h) { return bf2f(h ? r >> 16 : r & 0xffff); }
static void fa_mma(float* d, const uint32_t* a, uint32_t b0, uint32_t b1) {
  int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  for (int i = 0; i < 4; i++) ma[w][l][i] = a[i];
  mb[w][l][0] = b0; mb[w][l][1] = b1;
  warpBar[w]->arrive_and_wait();
  int g = l >> 2, c = l & 3;
  for (int i = 0; i < 4; i++) {
    int row = g + 8 * (i / 2), col = 2 * c + (i % 2);
    float acc = d[i];
    for (int k = 0; k < 16; k++) {
      float A = half(ma[w][(row % 8) * 4 + (k % 8) / 2][(row / 8) + 2 * (k / 8)], k % 2);
      float B = half(mb[w][col * 4 + (k % 8) / 2][k / 8], k % 2);
      acc += A * B;
    }
    d[i] = acc;
  }
  warpBar[w]->arrive_and_wait();
}
using std::min;

// ldmatrix, warp-collectively: lanes 8i..8i+7 give the rows of matrix i.
const uint16_t* la[8][32];
// n matrices (4 or 2: with 2, lanes 16..31 give no address and are not read).
static void ldsm4(uint32_t* r, const uint16_t* p, bool trans, int n = 4) {
  int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  if (l < 8 * n && ((uintptr_t)p) % 16 != 0) { printf("ldmatrix: row address %p not 16-byte aligned\n", (const void*)p); abort(); }
  la[w][l] = l < 8 * n ? p : nullptr; warpBar[w]->arrive_and_wait();
  int g = l >> 2, c = l & 3;
  for (int i = 0; i < n; i++) {
    uint16_t e0, e1;
    if (!trans) { e0 = la[w][8 * i + g][2 * c]; e1 = la[w][8 * i + g][2 * c + 1]; }
    else { e0 = la[w][8 * i + 2 * c][g]; e1 = la[w][8 * i + 2 * c + 1][g]; }
    r[i] = (uint32_t)e0 | ((uint32_t)e1 << 16);
  }
  warpBar[w]->arrive_and_wait();
}
static void fa_ldsm4(uint32_t* r, const uint16_t* p) { ldsm4(r, p, false); }
static void fa_ldsm4t(uint32_t* r, const uint16_t* p) { ldsm4(r, p, true); }
static void fa_ldsm2(uint32_t* r, const uint16_t* p) { ldsm4(r, p, false, 2); }
static float __uint_as_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
// fa_acc2 as flash_common.cuh's: (lo, hi) added to the bf16 pair at p,
// rounded once; with set written over it.
static void fa_acc2(uint16_t* p, float lo, float hi, bool set) {
  uint32_t w; memcpy(&w, p, 4);
  if (!set) { lo += __uint_as_float(w << 16); hi += __uint_as_float(w & 0xffff0000u); }
  w = fa_pack(lo, hi); memcpy(p, &w, 4);
}
// cp.async, synchronously: the copies land at once (the pipeline's races
// are not modelled, only its indexing).
template <int HS, int NT = FA_THREADS>
static void fa_cp_rows(uint16_t* s, const uint16_t* g, i64 stride, int r0, int rows, int T) {
  for (int i = threadIdx.x; i < rows * (HS / 8); i += NT) {
    const int r = i / (HS / 8), d = (i - r * (HS / 8)) * 8, t = r0 + r;
    if (((uintptr_t)(s + r * (HS + 8) + d)) % 16 != 0) { printf("cp.async: destination not 16-byte aligned\n"); abort(); }
    if (t < T) memcpy(s + r * (HS + 8) + d, g + (i64)t * stride + d, 16);
    else memset(s + r * (HS + 8) + d, 0, 16);
  }
}
static void fa_cp_commit() {}
// atomicAdd on global float32: the threads of a block run concurrently.
struct float2 { float x, y; };
static float atomicAdd(float* p, float v) { return std::atomic_ref<float>(*p).fetch_add(v); }
static void fa_cp_wait() {}
#include "flashattn_body.inc" // extracted from flashattn.cu by emu.sh

// run_grid runs kernel (a device-function call) over gridDim, one block at
// a time, each block as nt threads (128 or 256) with their barriers.
template <class F> void run_grid(F kernel, int nt = 128) {
  for (int by = 0; by < gridDim.y; by++)
    for (int bx = 0; bx < gridDim.x; bx++) {
      std::barrier<> bb(nt), w0(32), w1(32), w2(32), w3(32), w4(32), w5(32), w6(32), w7(32);
      blockBar = &bb;
      std::barrier<>* ws[8] = {&w0, &w1, &w2, &w3, &w4, &w5, &w6, &w7};
      for (int w = 0; w < 8; w++) warpBar[w] = ws[w];
      std::vector<std::thread> th;
      for (int t = 0; t < nt; t++)
        th.emplace_back([&, t] {
          threadIdx = {t, 0}; blockIdx = {bx, by};
          kernel();
        });
      for (auto& x : th) x.join();
    }
}

// run checks flash_fwd (MT 0) or flash_fwd_mt<HS, MT, BK> with NH query
// heads and NKV key/value heads (grouped-query attention; 0 means NKV = NH).
template <int HS, int MT = 0, int BK = 64> void run(int B, int T, int NH, unsigned seed, int& bad, int NKV = 0) {
  if (NKV == 0) NKV = NH;
  int C = NH * HS, rep = NH / NKV;
  size_t W = (size_t)(NH + 2 * NKV) * HS;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> U(-2, 2);
  std::vector<uint16_t> qkv((size_t)B * T * W), out((size_t)B * T * C, 0x7fc0);
  std::vector<float> lse((size_t)B * NH * T, NAN);
  for (auto& x : qkv) x = f2bf(U(rng));
  float sl2 = (float)(1.4426950408889634 / std::sqrt((double)HS));
  const int BQ = 64 * (MT ? MT : 1);
  gridDim = {(T + BQ - 1) / BQ, B * NH};
  std::vector<uint16_t> Ks(64 * (HS + 8)), Vs(64 * (HS + 8));
  if constexpr (MT == 0)
    run_grid([&] { flash_fwd<HS>(out.data(), lse.data(), qkv.data(), T, NH, NKV, sl2, Ks.data(), Vs.data()); });
  else
    run_grid([&] { flash_fwd_mt<HS, MT, BK>(out.data(), lse.data(), qkv.data(), T, NH, NKV, sl2, Ks.data(), Vs.data()); });
  // reference in double
  double worst = 0, worstL = 0;
  for (int b = 0; b < B; b++) for (int h = 0; h < NH; h++) for (int t = 0; t < T; t++) {
    // which 0: q of head h; 1, 2: k, v of its key/value head h/rep.
    auto at = [&](int tok, int which, int d) {
      size_t col = which == 0 ? (size_t)h * HS : (size_t)(NH + (which - 1) * NKV + h / rep) * HS;
      return (double)bf2f(qkv[((size_t)b * T + tok) * W + col + d]);
    };
    std::vector<double> s(t + 1);
    double m = -INFINITY;
    for (int j = 0; j <= t; j++) { double acc = 0; for (int d = 0; d < HS; d++) acc += at(t, 0, d) * at(j, 1, d); s[j] = acc / std::sqrt((double)HS); m = std::max(m, s[j]); }
    double l = 0; for (int j = 0; j <= t; j++) l += std::exp(s[j] - m);
    double L = m + std::log(l);
    double gl = lse[((size_t)b * NH + h) * T + t];
    double el = std::fabs(gl - L); worstL = std::max(worstL, el);
    if (!(el <= 1e-3 + 1e-4 * std::fabs(L))) { if (bad++ < 5) printf("lse b%d h%d t%d: %g vs %g\n", b, h, t, gl, L); }
    for (int d = 0; d < HS; d++) {
      double o = 0; for (int j = 0; j <= t; j++) o += std::exp(s[j] - L) * at(j, 2, d);
      double g = bf2f(out[((size_t)b * T + t) * C + h * HS + d]);
      double e = std::fabs(g - o); worst = std::max(worst, e / (2e-2 + 1.6e-2 * std::fabs(o)));
      if (!(e <= 2e-2 + 1.6e-2 * std::fabs(o))) { if (bad++ < 5) printf("out b%d h%d t%d d%d: %g vs %g\n", b, h, t, d, g, o); }
    }
  }
  printf("HS%d MT%d BK%d B%d T%d NH%d NKV%d: worst out err/tol %.3f, worst lse err %.2e, bad %d\n", HS, MT, BK, B, T, NH, NKV, worst, worstL, bad);
}
// run_bwd checks flash_bwd_kv and flash_bwd_q (FUSED 0) or flash_bwd_fused
// with K in registers (1) or read from shared memory (2) followed by
// flash_bwd_dq_store: dqkv starts random (the kernels accumulate, or with
// set overwrite), lse and D come from a float64 forward pass. NKV as in
// run: dK and dV sum over the query heads of a group.
//
// With NW > 0 (FUSED 0) it checks instead the split backward's variants
// flash_bwd_kv_v<HS, BQ, NW, SM> and flash_bwd_q_v<HS, BQ, NW, SM> (NW
// warps per block, 32·NW threads; SM: the fixed operands in shared
// memory), each in a shared area of exactly fa_bwd_kv_smem /
// fa_bwd_q_smem bytes, against the reference and, bit for bit, against
// the split kernels (their BQ: 64 at head size 64, 32 at 128) run on the
// same data: the variants keep the split kernels' order of every sum.
template <int HS, int BQ, int FUSED = 0, int NW = 0, bool SM = false>
void run_bwd(int B, int T, int NH, unsigned seed, int& bad, bool set = false, int NKV = 0) {
  if (NKV == 0) NKV = NH;
  int C = NH * HS, rep = NH / NKV;
  i64 C3 = (i64)(NH + 2 * NKV) * HS;  // the row width of qkv and dqkv
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> U(-2, 2);
  std::vector<uint16_t> qkv((size_t)B * T * C3), dout((size_t)B * T * C), dqkv((size_t)B * T * C3);
  for (auto& x : qkv) x = f2bf(U(rng));
  for (auto& x : dout) x = f2bf(U(rng));
  for (auto& x : dqkv) x = f2bf(U(rng) * 0.5f);
  std::vector<uint16_t> dqkv0 = dqkv;
  std::vector<float> lse((size_t)B * NH * T), D((size_t)B * NH * T);
  std::vector<double> ref((size_t)B * T * C3, 0.0);
  double sc = 1 / std::sqrt((double)HS);
  for (int b = 0; b < B; b++) for (int h = 0; h < NH; h++) {
    // col(which): the column of q of head h (0) or of k, v of its key/value head (1, 2).
    auto col = [&](int which) { return which == 0 ? (size_t)h * HS : (size_t)(NH + (which - 1) * NKV + h / rep) * HS; };
    auto at = [&](int tok, int which, int d) { return (double)bf2f(qkv[((size_t)b * T + tok) * C3 + col(which) + d]); };
    auto go = [&](int tok, int d) { return (double)bf2f(dout[((size_t)b * T + tok) * C + h * HS + d]); };
    std::vector<double> P((size_t)T * T, 0.0), L(T), Dv(T);
    for (int t = 0; t < T; t++) {
      double m = -INFINITY;
      for (int j = 0; j <= t; j++) { double a = 0; for (int d = 0; d < HS; d++) a += at(t, 0, d) * at(j, 1, d); P[(size_t)t * T + j] = a * sc; m = std::max(m, a * sc); }
      double l = 0; for (int j = 0; j <= t; j++) l += std::exp(P[(size_t)t * T + j] - m);
      L[t] = m + std::log(l);
      for (int j = 0; j <= t; j++) P[(size_t)t * T + j] = std::exp(P[(size_t)t * T + j] - L[t]);
      double dd = 0;
      for (int d = 0; d < HS; d++) { double o = 0; for (int j = 0; j <= t; j++) o += P[(size_t)t * T + j] * at(j, 2, d); dd += o * go(t, d); }
      Dv[t] = dd;
      lse[((size_t)b * NH + h) * T + t] = (float)L[t];
      D[((size_t)b * NH + h) * T + t] = (float)dd;
    }
    for (int t = 0; t < T; t++) for (int j = 0; j <= t; j++) {
      double p = P[(size_t)t * T + j], dp = 0;
      for (int d = 0; d < HS; d++) dp += go(t, d) * at(j, 2, d);
      double ds = p * (dp - Dv[t]);
      for (int d = 0; d < HS; d++) {
        ref[((size_t)b * T + t) * C3 + col(0) + d] += sc * ds * at(j, 1, d);  // dQ
        ref[((size_t)b * T + j) * C3 + col(1) + d] += sc * ds * at(t, 0, d);  // dK
        ref[((size_t)b * T + j) * C3 + col(2) + d] += p * go(t, d);          // dV
      }
    }
  }
  float sl2 = (float)(1.4426950408889634 / std::sqrt((double)HS)), s1 = (float)sc;
  if constexpr (FUSED != 0) {
    // One pass: dK, dV into dqkv, dQ into the float32 accumulator (zero on
    // entry, as flash_bwd_prep leaves it), then the accumulator into dqkv.
    gridDim = {(T + 63) / 64, B * NKV};
    std::vector<float> dq((size_t)B * NH * T * HS, 0.f);
    std::vector<uint16_t> Ks(64 * (HS + 8)), Qb(2 * BQ * (HS + 8)), Gs(BQ * (HS + 8)), St(64 * (BQ + 8));
    std::vector<float> Ls(2 * BQ), Ds(2 * BQ);
    run_grid([&] {
      flash_bwd_fused<HS, BQ, 4, FUSED == 1>(dqkv.data(), dq.data(), dout.data(), qkv.data(), lse.data(), D.data(), T, NH, NKV, sl2, s1, set,
                                             Ks.data(), Qb.data(), Gs.data(), St.data(), Ls.data(), Ds.data());
    });
    for (i64 i = 0; i < (i64)dq.size() / 2; i++) flash_bwd_dq_store(dqkv.data(), dq.data(), i, T, NH, NKV, HS, s1, set);
  }
  std::vector<uint16_t> dqkvS;  // the split kernels' result, beside a variant's
  if constexpr (NW > 0) {
    dqkvS = dqkv;
    for (int pass = 0; pass < 2; pass++) {
      gridDim = {(T + 16 * NW - 1) / (16 * NW), B * (pass == 0 ? NKV : NH)};
      std::vector<uint16_t> sm(pass == 0 ? fa_bwd_kv_smem<HS, BQ, NW, SM>() / 2 : fa_bwd_q_smem<HS, BQ, NW, SM>() / 2);
      run_grid([&] {
        if (pass == 0)
          flash_bwd_kv_v<HS, BQ, NW, SM>(dqkv.data(), dout.data(), qkv.data(), lse.data(), D.data(), T, NH, NKV, sl2, s1, set, sm.data());
        else
          flash_bwd_q_v<HS, BQ, NW, SM>(dqkv.data(), dout.data(), qkv.data(), lse.data(), D.data(), T, NH, NKV, sl2, s1, set, sm.data());
      }, 32 * NW);
    }
    std::swap(dqkv, dqkvS);  // the split kernels below run on dqkv
  }
  constexpr int SBQ = NW > 0 ? (HS == 64 ? 64 : 32) : BQ;  // the split kernels' tile
  for (int pass = 0; pass < (FUSED ? 0 : 2); pass++) {
    gridDim = {(T + 63) / 64, B * (pass == 0 ? NKV : NH)};  // flash_bwd_kv: one block row per key/value head
    // Exact sizes, so that AddressSanitizer sees any access past a tile:
    // both kernels stream BQ rows at a time, double-buffering Q (with lse
    // and D) or K.
    std::vector<uint16_t> S1(2 * SBQ * (HS + 8)), S2(SBQ * (HS + 8));
    std::vector<float> Ls(2 * SBQ), Ds(2 * SBQ);
    run_grid([&] {
      if (pass == 0)
        flash_bwd_kv<HS, SBQ>(dqkv.data(), dout.data(), qkv.data(), lse.data(), D.data(), T, NH, NKV, sl2, s1, set, S1.data(), S2.data(), Ls.data(), Ds.data());
      else
        flash_bwd_q<HS, SBQ>(dqkv.data(), dout.data(), qkv.data(), lse.data(), D.data(), T, NH, NKV, sl2, s1, set, S1.data(), S2.data());
    });
  }
  int diff = 0;
  if constexpr (NW > 0) {
    for (size_t i = 0; i < dqkv.size(); i++) diff += dqkv[i] != dqkvS[i];
    if (diff) { bad++; printf("variant differs from the split kernels in %d of %zu elements\n", diff, dqkv.size()); }
    std::swap(dqkv, dqkvS);  // check the variant's against the reference
  }
  double rms = 0;
  for (auto r : ref) rms += r * r;
  rms = std::sqrt(rms / ref.size());
  double worst = 0;
  const char* part[3] = {"dq", "dk", "dv"};
  for (size_t i = 0; i < ref.size(); i++) {
    double want = ref[i] + (set ? 0.0 : bf2f(dqkv0[i])), got = bf2f(dqkv[i]);
    double tol = 2e-2 * rms + 1.6e-2 * std::fabs(want);
    double e = std::fabs(got - want);
    worst = std::max(worst, e / tol);
    if (!(e <= tol)) {
      size_t tok = i / C3; int cl = (int)(i % C3);
      int which = cl < C ? 0 : cl < C + NKV * HS ? 1 : 2;
      if (bad++ < 8) printf("%s tok %zu col %d: %g vs %g\n", part[which], tok, cl, got, want);
    }
  }
  char var[64] = "";
  if (NW > 0) snprintf(var, sizeof var, " variant NW%d%s (bitwise as split: %s)", NW, SM ? " SM" : "", diff ? "NO" : "yes");
  printf("bwd%s%s%s HS%d BQ%d B%d T%d NH%d NKV%d: worst err/tol %.3f (rms grad %.3g), bad %d\n", FUSED == 1 ? " fused" : FUSED == 2 ? " fused (K in smem)" : "", var, set ? " (set)" : "", HS, BQ, B, T, NH, NKV, worst, rms, bad);
}

// run_variants checks the split backward's variants (see run_bwd). Not
// every shape passes the tolerance: at T 200, NH 2, NKV 1 (head size 64)
// and T 130, NH 3, NKV 1 (128) one dV element of the split kernels
// themselves (and so of the variants, bit for bit the same) is 1.2-1.3
// times over it, as at T 300 (the dV sums of multi-query attention run over
// every query head, each P rounded to bf16).
// NW 8 has no entry point (it ran slower on the H200); the template keeps
// the parameter, and these cases keep it correct.
static void run_variants(int& bad) {
  run_bwd<64, 64, 0, 8, false>(1, 1, 1, 60, bad);
  run_bwd<64, 64, 0, 8, false>(2, 65, 2, 61, bad, true);
  run_bwd<64, 64, 0, 8, false>(1, 200, 4, 62, bad, false, 2);
  run_bwd<128, 32, 0, 8, false>(1, 130, 2, 64, bad, true);
  run_bwd<64, 64, 0, 4, true>(2, 65, 2, 66, bad, true);
  run_bwd<64, 64, 0, 4, true>(1, 130, 4, 67, bad, false, 2);
  run_bwd<128, 64, 0, 4, true>(1, 1, 1, 68, bad, true);
  run_bwd<128, 64, 0, 4, true>(1, 130, 2, 70, bad, false, 1);
  run_bwd<64, 64, 0, 8, true>(1, 200, 2, 71, bad, true);
  run_bwd<128, 64, 0, 8, true>(2, 65, 2, 74, bad, true);
  run_bwd<128, 64, 0, 8, true>(1, 130, 2, 75, bad, false, 1);
  // Head sizes 80 (an odd number of 16-column slices) and 96, as the
  // entry points instantiate them (4 warps, SM, 64-row tiles).
  run_bwd<80, 64, 0, 4, true>(2, 65, 2, 76, bad, true);
  run_bwd<80, 64, 0, 4, true>(1, 130, 4, 77, bad, false, 2);
  run_bwd<96, 64, 0, 4, true>(1, 1, 1, 78, bad);
  run_bwd<96, 64, 0, 4, true>(1, 200, 2, 79, bad, false, 1);
}

// run_fwd_mt checks the two-tile forwards at head size 128 (64 and 32
// keys per tile): T off the 16-row, 32- and 64-key and 128-row edges, and
// grouped-query attention.
void run_fwd_mt(int& bad) {
  run<128, 2>(1, 130, 1, 25, bad);
  run<128, 2, 32>(1, 1, 1, 50, bad);
  run<128, 2, 32>(2, 65, 2, 51, bad);
  run<128, 2, 32>(1, 200, 1, 52, bad);
  run<128, 2, 32>(1, 130, 4, 53, bad, 2);
  run<128, 2>(1, 97, 3, 54, bad, 1);
}

// EMU_BWD_VARIANTS=1 runs only run_variants (quicker, for mutants);
// EMU_FWD_MT=1 only run_fwd_mt.
int main() {
  int bad = 0;
  if (getenv("EMU_BWD_VARIANTS")) { run_variants(bad); return bad != 0; }
  if (getenv("EMU_FWD_MT")) { run_fwd_mt(bad); return bad != 0; }
  run<64>(1, 1, 1, 1, bad);
  run<64>(2, 65, 2, 2, bad);
  run<128>(1, 63, 1, 3, bad);
  run<128>(1, 130, 2, 4, bad);
  run<64>(1, 200, 1, 5, bad);
  run<64, 2>(1, 1, 1, 21, bad);
  run<64, 2>(2, 65, 2, 22, bad);
  run<64, 2>(1, 129, 1, 23, bad);
  run<64, 2>(1, 200, 2, 24, bad);
  run_fwd_mt(bad);
  run<64, 1>(1, 100, 1, 26, bad);
  run<80>(1, 1, 1, 27, bad);
  run<80>(2, 65, 2, 28, bad);
  run<80>(1, 130, 4, 29, bad, 2);
  run<96>(1, 63, 1, 30, bad);
  run<96>(1, 200, 3, 39, bad, 1);
  run_bwd<64, 64>(1, 1, 1, 6, bad);
  run_bwd<64, 64>(2, 65, 2, 7, bad);
  run_bwd<64, 64>(2, 65, 2, 11, bad, true);
  run_bwd<128, 32>(1, 63, 1, 8, bad);
  run_bwd<128, 32>(1, 130, 2, 9, bad, true);
  run_bwd<64, 64>(1, 200, 1, 10, bad);
  run_bwd<80, 32>(1, 1, 1, 12, bad);
  run_bwd<80, 32>(2, 65, 2, 13, bad, true);
  run_bwd<80, 32>(1, 130, 4, 14, bad, false, 2);
  run_bwd<96, 32>(1, 63, 1, 15, bad);
  run_bwd<96, 32>(1, 130, 3, 16, bad, true, 1);
  // Grouped-query attention: groups of 2, 3 and 4 query heads per
  // key/value head, and one key/value head for all (multi-query).
  run<64>(2, 70, 4, 31, bad, 2);
  run<128>(1, 65, 3, 32, bad, 1);
  run<64, 2>(1, 130, 4, 33, bad, 1);
  run<64, 2>(2, 67, 6, 34, bad, 2);
  run_bwd<64, 64>(2, 70, 4, 35, bad, false, 2);
  run_bwd<64, 64>(1, 129, 6, 36, bad, true, 2);
  run_bwd<128, 32>(1, 65, 3, 37, bad, false, 1);
  run_bwd<64, 64>(1, 1, 2, 38, bad, false, 1);
  // The fused backward: both head sizes, K from registers and from shared
  // memory, 64- and 32-row query tiles, odd T (partial key and query
  // tiles), set and accumulate, multi-head and grouped-query.
  run_bwd<64, 64, 1>(1, 1, 1, 40, bad);
  run_bwd<64, 64, 1>(2, 65, 2, 41, bad);
  run_bwd<64, 64, 1>(1, 200, 1, 42, bad, true);
  run_bwd<64, 32, 1>(2, 65, 2, 43, bad, true);
  run_bwd<64, 32, 1>(1, 130, 4, 44, bad, false, 2);
  run_bwd<64, 64, 1>(2, 70, 4, 45, bad, false, 2);
  run_bwd<64, 64, 1>(1, 129, 6, 46, bad, true, 2);
  run_bwd<64, 64, 2>(1, 100, 2, 47, bad, false, 1);
  run_bwd<64, 32, 2>(2, 97, 4, 52, bad, true, 2);
  run_bwd<128, 32, 2>(1, 63, 1, 48, bad);
  run_bwd<128, 32, 2>(1, 130, 2, 49, bad, true);
  run_bwd<128, 32, 2>(1, 65, 3, 50, bad, false, 1);
  run_bwd<128, 32, 2>(2, 97, 4, 51, bad, true, 2);
  // The split backward's variants (flash_bwd_kv_v, flash_bwd_q_v) as the
  // entry points instantiate them: 8 warps (w8), fixed operands in shared
  // memory with 64-row tiles (sm), both (w8sm); T 1, 65, 130, 200 (partial
  // blocks of 64 and 128 rows), set and accumulate, multi-head and
  // grouped-query.
  run_variants(bad);
  return bad != 0;
}
