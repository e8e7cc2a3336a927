// flashattn_sm90_emu.cpp: runs flash_fwd_sm90 of
// kernels/cuda/kernels/flashattn_sm90.cu on the host, with emulated wgmma,
// cp.async, proxy fences, shuffles and barriers: each block is 128
// std::threads per warpgroup (one or two warpgroups, one or two row tiles
// each), and out and lse are compared with a float64 reference for
// multi-head and grouped-query layouts. Built with
// AddressSanitizer and UBSan by tools/cuda/emu.sh sm90 (g++ 12 or later, no
// CUDA toolkit).
//
// The model of the hardware, and the PTX ISA sections it follows (PTX ISA
// 8.x, section 9.7.15 "Asynchronous Warpgroup Level Matrix Multiply-
// Accumulate Instructions"):
//  - Matrix descriptor (9.7.15.5.1.2.2): start address, LBO and SBO are
//    decoded from bits 0-13, 16-29 and 32-45 (each << 4); bits 62-63 (the
//    swizzle mode) 0 (none) or 1 (128-byte swizzle; 64 and 32 bytes abort);
//    the base offset (bits 49-51) is ignored without swizzling, as the ISA
//    says, and must be 0 with it (operands' 1024-byte atoms aligned).
//  - The 128-byte swizzle (the canonical swizzled layouts of
//    9.7.15.5.1.2.1): K-major, element (k, n) at start + (n%8)·128 +
//    (n/8)·SBO + k·2 (a k16 step within one 128-byte row; LBO unused);
//    N-major, start + (n%64)·2 + (n/64)·LBO + (k%8)·128 + (k/8)·SBO; then
//    bits 4-6 of the shared address XOR bits 7-9.
//  - Shared memory layout without swizzling (9.7.15.5.1.2.1, canonical
//    layouts, T = 8 bf16 per 16 bytes): element (k, n) of B (K x N) is at
//    byte start + (n%8)·16 + (n/8)·SBO + (k%8)·2 + (k/8)·LBO when K-major
//    (imm-trans-b 0) and start + (n%8)·2 + (n/8)·SBO + (k%8)·16 + (k/8)·LBO
//    when N-major (imm-trans-b 1). Reads outside the emulated shared window
//    abort; shared memory starts as NaN, so an element read where nothing
//    was written poisons the result.
//  - Register fragments of m64nNk16 (9.7.15.5.1.1.1): warp w holds rows
//    16w..16w+15; A register i (0..3) of lane l holds row 16w + l/4 +
//    8·(i%2), cols 2(l%4) + 8·(i/2) and +1 (lower half the lower index); D
//    register 4j+e holds row 16w + l/4 + 8·(e/2), col 8j + 2(l%4) + e%2.
//  - Asynchrony: a wgmma snapshots its A registers at issue and reads
//    shared memory and writes its accumulators only at the
//    wgmma.wait_group N that completes its group (commit_group closes a
//    group; wait_group N completes all but the newest N committed groups,
//    in issue order), so accumulators read before that wait are stale.
//    From issue to completion, the shared chunks a wgmma reads are marked
//    pending: a cp.async issued into a pending chunk aborts (a copy may
//    land any time after its issue: the write-after-read hazard of
//    reloading a tile that a wgmma in flight still reads), and a wgmma whose
//    chunk has a copy issued and not landed aborts too (read-after-write:
//    seen when the copy was issued first). A wgmma issued without a
//    wgmma.fence since the thread's last wait aborts. It checks, per 16-byte
//    chunk it reads, that the chunk's last cp.async landed before a
//    __syncthreads that the issuing thread passed before the issue (a
//    missing barrier aborts) and that every thread fenced its landed copies
//    with fence.proxy.async before that barrier (generic-proxy writes made
//    visible to the async proxy; memory consistency model, proxies).
//  - cp.async (9.7.9.25): copies are queued in the thread's commit group
//    and land at the cp.async.wait_group N that completes it (all but the
//    newest N committed groups; the latest moment allowed), zero-filled
//    past the source size; destination and source must be 16-byte aligned.
//  - Shared operands read M-major (imm-trans-a 1, the fused backward's dS
//    tile) follow the N-major layout with M for N. Plain stores into the
//    shared window (f9_sts32) count as landed copies: a barrier, and
//    fence.proxy.async before it, must come between them and a wgmma that
//    reads them, and they must not hit a chunk a wgmma in flight reads.
//    red.global.add.v2.f32 (f9_red2) is an atomic add on the host.
//  - cp.reduce.async.bulk .add.f32 (f9_bulk_red, 9.7.9.25.4): queued in
//    the issuing thread's bulk group, its shared source marked pending
//    (a store or cp.async into it aborts) until the
//    cp.async.bulk.wait_group(.read) that completes the group, which is
//    when the source is read and added to global memory (the latest moment
//    allowed); the source must have been written before a barrier the
//    issuer passed, and fenced with fence.proxy.async before it, as a
//    wgmma's; a group not waited for when the thread exits aborts.
// Not modelled: the exact rounding
// and summation order of the tensor cores (products are summed in float),
// the 64/32-byte swizzle modes, bank conflicts and timing.
#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>
typedef long long i64;
struct __nv_bfloat16 { uint16_t bits; };
struct __nv_bfloat162 { __nv_bfloat16 x, y; };
static uint16_t f2bf(float f) { uint32_t u; memcpy(&u, &f, 4); if ((u & 0x7fffffff) > 0x7f800000) return 0x7fc0; u += 0x7fff + ((u >> 16) & 1); return u >> 16; }
static float bf2f(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
struct dim { int x, y; };
thread_local dim threadIdx, blockIdx;
dim gridDim;
#define __device__
#define __forceinline__
#define __restrict__
#define F9_BQ 64
#define F9_BK 64
#define F9_THREADS 128
#define F9_LN2 0.6931471805599453f
using std::max;
using std::min;
static void die(const char* m) { printf("emulator: %s (thread %d, block %d,%d)\n", m, threadIdx.x, blockIdx.x, blockIdx.y); fflush(stdout); abort(); }

// The block: barriers, the emulated shared window.
std::barrier<>* blockBar;
std::barrier<>* warpBar[16];
std::barrier<>* wgBar[3];
uint8_t* smemBase;   // the shared window of the running block
size_t smemSize;
thread_local int nsync;  // __syncthreads passed by this thread
static void __syncthreads() { blockBar->arrive_and_wait(); nsync++; }
// f9_bar<N>: named barrier 1 over the whole block (N = the block's
// threads), the same count of barriers as __syncthreads; or, in a block
// with a producer warpgroup, over the others (N = their threads, consBar),
// counted as a barrier by those that meet it.
int blockThreads, consThreads;
std::barrier<>* consBar;
template <int N> static void f9_bar() {
  if (N == blockThreads) { __syncthreads(); return; }
  if (N != consThreads || !consBar) die("f9_bar: thread count neither the block's nor its warpgroups' before the producer");
  consBar->arrive_and_wait();
  nsync++;
}
// Named barriers 2 and up (f9_bar_sync_id, f9_bar_arrive_id): n arrivals
// complete a phase; bar.sync waits for its phase to complete, bar.arrive
// does not. A phase that does not complete in 30 s aborts (a deadlock).
struct NamedBar { int arrived = 0; long gen = 0; };
std::mutex nbMu;
std::condition_variable nbCv;
NamedBar namedBar[16];
static void nb_arrive(int id, int n, bool wait) {
  if (id < 2 || id >= 16 || n % 32) die("named barrier: id or thread count out of range");
  std::unique_lock<std::mutex> lk(nbMu);
  NamedBar& b = namedBar[id];
  const long gen = b.gen;
  if (++b.arrived == n) { b.arrived = 0; b.gen++; nbCv.notify_all(); return; }
  if (wait && !nbCv.wait_for(lk, std::chrono::seconds(30), [&] { return b.gen != gen; }))
    die("named barrier: no progress in 30 s (deadlock)");
}
static void f9_bar_sync_id(int id, int n) { nb_arrive(id, n, true); }
static void f9_bar_arrive_id(int id, int n) { nb_arrive(id, n, false); }
float shf[16][32];
static float __shfl_xor_sync(unsigned, float v, int o) {
  int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  shf[w][l] = v; warpBar[w]->arrive_and_wait();
  float r = shf[w][l ^ o]; warpBar[w]->arrive_and_wait();
  return r;
}
static uint32_t fa_pack(float lo, float hi) { return (uint32_t)f2bf(lo) | ((uint32_t)f2bf(hi) << 16); }
static float fa_exp2(float x) { return exp2f(x); }
static uint32_t fa_ld32(const uint16_t* p) { uint32_t v; memcpy(&v, p, 4); return v; }
static float __uint_as_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
// fa_acc2 as flash_common.cuh's: (lo, hi) added to the bf16 pair at p,
// rounded once; with set written over it.
static void fa_acc2(uint16_t* p, float lo, float hi, bool set) {
  uint32_t w; memcpy(&w, p, 4);
  if (!set) { lo += __uint_as_float(w << 16); hi += __uint_as_float(w & 0xffff0000u); }
  w = fa_pack(lo, hi); memcpy(p, &w, 4);
}
static uint32_t f9_smem(const void* p) {
  const uint8_t* q = (const uint8_t*)p;
  if (q < smemBase || q >= smemBase + smemSize) die("shared address outside the shared window");
  return (uint32_t)(q - smemBase);
}

// cp.async: queued per thread, landing at fa_cp_wait.
struct Copy { uint16_t* dst; const uint16_t* src; int n, group; };
thread_local std::vector<Copy> copies;
thread_local int cpCommitted;  // cp.async groups this thread committed
std::vector<int> chunkSync;          // per 16-byte shared chunk: the writer's nsync when it landed
std::vector<int> lastUnfencedSync;   // per thread: nsync at which it last left copies unfenced, -1 none
std::unique_ptr<std::atomic<int>[]> pendingReads;  // per 16-byte shared chunk: issued, uncompleted wgmma reading it
std::unique_ptr<std::atomic<int>[]> pendingWrites;  // per 16-byte shared chunk: issued cp.async not landed
static void f9_cp16(uint16_t* dst, const uint16_t* src, int n) {
  if ((uintptr_t)dst % 16 || (n && (uintptr_t)src % 16)) die("cp.async: address not 16-byte aligned");
  f9_smem(dst); f9_smem((uint8_t*)dst + 15);
  if (pendingReads[f9_smem(dst) / 16].load() > 0) die("cp.async into shared memory that a wgmma in flight still reads");
  pendingWrites[f9_smem(dst) / 16]++;
  copies.push_back({dst, src, n, cpCommitted});
}
static void fa_cp_commit() { cpCommitted++; }
// cp_wait lands the copies of all but the newest `pending` committed
// groups (cp.async.wait_group; copies not yet committed stay queued).
static void cp_wait(int pending) {
  size_t kept = 0;
  bool landed = false;
  for (auto& c : copies) {
    if (c.group >= cpCommitted - pending) { copies[kept++] = c; continue; }
    if (c.n) memcpy(c.dst, c.src, 16); else memset(c.dst, 0, 16);
    chunkSync[f9_smem(c.dst) / 16] = nsync;
    pendingWrites[f9_smem(c.dst) / 16]--;
    landed = true;
  }
  if (landed) lastUnfencedSync[threadIdx.x] = nsync;
  copies.resize(kept);
}
static void fa_cp_wait() { cp_wait(0); }
template <int N> static void fa_cp_wait_n() { cp_wait(N); }
static void f9_fence_proxy() { lastUnfencedSync[threadIdx.x] = -1; }

// The mbarriers and the bulk tensor copies (flash_fwd5: PTX ISA 9.7.13.15
// and 9.7.9.25.5): a barrier is a side record per 8 bytes of the window
// (its expected arrivals, those still missing, the transaction bytes
// outstanding and the phases completed, c: the phase in progress is c, of
// parity c & 1); try_wait.parity P returns once P != c & 1 (the phase of
// parity P completed; a fresh barrier's phase -1 counts as completed), or
// aborts after 30 s (a deadlock). A bulk tensor copy lands at its issue
// (the earliest moment), in the 128-byte swizzle relative to its
// 1024-byte-aligned destination, zeros for rows past the tensor, and then
// completes its bytes on the barrier, which must expect them already. Each
// chunk it writes records the barrier and its phase in progress: a wgmma
// that reads the chunk aborts unless the issuing thread waited for that
// phase (read-after-write), and a copy into a chunk a wgmma in flight
// reads aborts (write-after-read). A barrier used by a thread that has
// not passed a __syncthreads since its initialisation, or by a copy before
// fence.mbarrier_init, aborts.
struct MBar { int count = 0, pending = 0, phase = 0, initSync = -1; long tx = 0; bool init = false, fenced = false; };
std::mutex mbarMu;
std::condition_variable mbarCv;
std::vector<MBar> mbars;                    // per 8 bytes of the window
std::vector<std::pair<int, int>> chunkTma;  // per chunk: (barrier, phase) of the copy that wrote it, or (-1, 0)
thread_local std::vector<int> mbarSeen;      // per barrier: the phases this thread saw completed
template <int N> static void f9_setmaxnreg_dec() {}  // registers are not modelled
template <int N> static void f9_setmaxnreg_inc() {}
struct f9_tmap { const uint16_t* base; i64 dim[3]; i64 stride[2]; int box[2]; };  // strides in elements
static MBar& mbar_of(uint64_t* bar, int* idx) {
  const uint32_t o = f9_smem(bar);
  if (o % 8) die("mbarrier not 8-byte aligned");
  *idx = o / 8;
  MBar& m = mbars[o / 8];
  if (!m.init) die("mbarrier used before mbarrier.init");
  if (nsync <= m.initSync) die("mbarrier used without a barrier after its mbarrier.init");
  return m;
}
static void mbar_complete(MBar& m) { m.phase++; m.pending = m.count; m.tx = 0; mbarCv.notify_all(); }
static void mbar_arrive_locked(MBar& m) {
  if (--m.pending < 0) die("mbarrier: more arrivals than expected");
  if (m.pending == 0 && m.tx == 0) mbar_complete(m);
}
static void f9_mbar_init(uint64_t* bar, int count) {
  const uint32_t o = f9_smem(bar);
  if (o % 8) die("mbarrier not 8-byte aligned");
  std::lock_guard<std::mutex> lk(mbarMu);
  mbars[o / 8] = MBar{count, count, 0, nsync, 0, true, false};
}
static void f9_mbar_init_fence() {
  std::lock_guard<std::mutex> lk(mbarMu);
  for (auto& m : mbars) if (m.init && m.initSync == nsync) m.fenced = true;
}
static void f9_mbar_expect_tx(uint64_t* bar, int bytes) {
  std::lock_guard<std::mutex> lk(mbarMu);
  int i;
  MBar& m = mbar_of(bar, &i);
  m.tx += bytes;
  mbar_arrive_locked(m);
}
static void f9_mbar_arrive(uint64_t* bar) {
  std::lock_guard<std::mutex> lk(mbarMu);
  int i;
  mbar_arrive_locked(mbar_of(bar, &i));
}
static void f9_mbar_wait(uint64_t* bar, int parity) {
  std::unique_lock<std::mutex> lk(mbarMu);
  int i;
  MBar& m = mbar_of(bar, &i);
  if (!mbarCv.wait_for(lk, std::chrono::seconds(30), [&] { return (m.phase & 1) != (parity & 1); }))
    die("mbarrier try_wait.parity: no progress in 30 s (deadlock)");
  if ((int)mbarSeen.size() <= i) mbarSeen.resize(i + 1, 0);
  mbarSeen[i] = std::max(mbarSeen[i], m.phase);
}
static void f9_tma_load3(uint16_t* dst, const f9_tmap* tm, int c0, int c1, int c2, uint64_t* bar) {
  const uint32_t o = f9_smem(dst);
  const int rows = tm->box[1], cols = tm->box[0];
  if (o % 1024) die("bulk tensor copy (128-byte swizzle) to shared memory not 1024-byte aligned");
  if (cols * 2 != 128) die("bulk tensor copy: the box's inner dimension must be the 128-byte swizzle span");
  if (o + rows * 128 > smemSize) die("bulk tensor copy past the shared window");
  std::lock_guard<std::mutex> lk(mbarMu);
  int bi;
  MBar& m = mbar_of(bar, &bi);
  if (!m.fenced) die("bulk tensor copy completing on an mbarrier without fence.mbarrier_init");
  for (int r = 0; r < rows; r++)
    for (int q = 0; q < 8; q++) {
      const uint32_t a = o + r * 128 + ((q ^ (r % 8)) * 16), ch = a / 16;
      if (pendingReads[ch].load() > 0) die("bulk tensor copy into shared memory that a wgmma in flight still reads");
      if (pendingWrites[ch].load() > 0) die("bulk tensor copy into shared memory that a cp.async in flight writes");
      const i64 x = c0 + 8 * q, y = c1 + r, z = c2;
      if (x + 8 <= tm->dim[0] && y < tm->dim[1] && z < tm->dim[2] && x >= 0 && y >= 0 && z >= 0)
        memcpy(smemBase + a, tm->base + z * tm->stride[1] + y * tm->stride[0] + x, 16);
      else
        memset(smemBase + a, 0, 16);
      chunkSync[ch] = -1;
      chunkTma[ch] = {bi, m.phase};
    }
  m.tx -= rows * 128;
  if (m.tx < 0) die("bulk tensor copy completes bytes its mbarrier's phase did not expect");
  if (m.pending == 0 && m.tx == 0) mbar_complete(m);
}

// bAddr is the shared byte address of element (k, n) of B through desc
// (the ISA's no-swizzle layouts).
static uint32_t bAddr(uint64_t desc, int trans, int k, int n) {
  const uint32_t start = (uint32_t)(desc & 0x3fff) << 4, lbo = (uint32_t)((desc >> 16) & 0x3fff) << 4,
                 sbo = (uint32_t)((desc >> 32) & 0x3fff) << 4;
  if ((desc >> 62) == 1) {  // 128-byte swizzle
    if ((desc >> 49) & 7) die("swizzled descriptor with a base offset: not modelled");
    // K-major: N rows of 128 bytes, 8-row groups SBO apart, K along the
    // row (a k16 step fits one row: LBO unused); N-major: 64 N per
    // 128-byte row, the next 64 LBO on, K rows, 8-row groups SBO apart.
    // Then address bits 4-6 XOR bits 7-9.
    const uint32_t a = trans ? start + (n % 64) * 2 + (n / 64) * lbo + (k % 8) * 128 + (k / 8) * sbo
                             : start + (n % 8) * 128 + (n / 8) * sbo + k * 2;
    if (!trans && (start % 128) + k * 2 >= 128) die("swizzled K-major operand past its 128-byte row");
    return a ^ (((a >> 7) & 7) << 4);
  }
  if (desc >> 62) die("descriptor with a 64- or 32-byte swizzle mode: not modelled");
  const uint32_t a = trans ? start + (n % 8) * 2 + (n / 8) * sbo + (k % 8) * 16 + (k / 8) * lbo
                           : start + (n % 8) * 16 + (n / 8) * sbo + (k % 8) * 2 + (k / 8) * lbo;
  if (a + 2 > smemSize) die("wgmma reads past the shared window");
  return a;
}

// wgmma: issued ops queue per thread, each in its commit group; A
// snapshots in wgA by slot (issue count mod 64, the same in every thread
// of a warpgroup: the ops are warpgroup-collective). The first thread of
// the warpgroup marks the chunks an op reads pending (chunks).
struct Op { float* d; int N, trans, acc; uint64_t desc; int sync, group, slot; std::vector<uint32_t> chunks; bool ss; uint64_t adesc; int transA; };
thread_local std::vector<Op> ops;
thread_local bool wgFenced;
thread_local int wgCommitted, wgIssued;
uint32_t wgA[64][384][4];
// wg_issue queues d (64xN) = A·B (+ d): A from the registers a, or with a
// null a from shared memory through adesc (transA 0, K-major: element
// (m, k) where bAddr puts element (k, n = m) of a K-major B; transA 1,
// M-major: where it puts that of an N-major B).
static void wg_issue(float* d, const uint32_t* a, uint64_t desc, int acc, int N, int trans, uint64_t adesc = 0, int transA = 0) {
  if (!wgFenced) die("wgmma.mma_async without a wgmma.fence since the last wait");
  if (ops.size() >= 64) die("too many wgmma in flight");
  const int slot = wgIssued++ % 64;
  if (a) memcpy(wgA[slot][threadIdx.x], a, 16);
  Op op{d, N, trans, acc, desc, nsync, wgCommitted, slot, {}, a == nullptr, adesc, transA};
  if (threadIdx.x % 128 == 0) {
    for (int k = 0; k < 16; k++) {
      for (int n = 0; n < N; n++) op.chunks.push_back(bAddr(desc, trans, k, n) / 16);
      if (!a)
        for (int m = 0; m < 64; m++) op.chunks.push_back(bAddr(adesc, transA, k, m) / 16);
    }
    std::sort(op.chunks.begin(), op.chunks.end());
    op.chunks.erase(std::unique(op.chunks.begin(), op.chunks.end()), op.chunks.end());
    for (uint32_t c : op.chunks) {
      // A copy issued and not landed may land any time: a wgmma that reads
      // its chunk races with it (the copies of other threads are seen here
      // once issued, so this catches the hazard when they came first).
      if (pendingWrites[c].load() > 0) die("wgmma reads shared memory that a cp.async in flight writes");
      {
        std::lock_guard<std::mutex> lk(mbarMu);
        const auto [bi, ph] = chunkTma[c];
        if (bi >= 0 && ((int)mbarSeen.size() <= bi || mbarSeen[bi] <= ph))
          die("wgmma reads a chunk whose bulk tensor copy's mbarrier phase the issuing thread did not wait for");
      }
      pendingReads[c]++;
    }
  }
  ops.push_back(std::move(op));
}
template <int TB> static void f9_wgmma_n64(float* d, const uint32_t* a, uint64_t desc, int acc) { wg_issue(d, a, desc, acc, 64, TB); }
template <int TB> static void f9_wgmma_n128(float* d, const uint32_t* a, uint64_t desc, int acc) { wg_issue(d, a, desc, acc, 128, TB); }
template <int TB, int TA = 0> static void f9_wgmma_ss_n64(float* d, uint64_t adesc, uint64_t bdesc, int acc) { wg_issue(d, nullptr, bdesc, acc, 64, TB, adesc, TA); }
template <int TB, int TA = 0> static void f9_wgmma_ss_n32(float* d, uint64_t adesc, uint64_t bdesc, int acc) { wg_issue(d, nullptr, bdesc, acc, 32, TB, adesc, TA); }
template <int TB, int TA = 0> static void f9_wgmma_ss_n128(float* d, uint64_t adesc, uint64_t bdesc, int acc) { wg_issue(d, nullptr, bdesc, acc, 128, TB, adesc, TA); }
// f9_sts32: a generic-proxy store into the shared window; like a landed
// copy it needs fence.proxy.async and a barrier before a wgmma reads it,
// and it must not hit a chunk a wgmma in flight reads.
static void f9_sts32(uint16_t* p, uint32_t v) {
  if ((uintptr_t)p % 4) die("st.shared.b32: address not 4-byte aligned");
  const uint32_t a = f9_smem(p);
  if (pendingReads[a / 16].load() > 0) die("st.shared into shared memory that a wgmma in flight still reads");
  memcpy(p, &v, 4);
  chunkSync[a / 16] = nsync;
  lastUnfencedSync[threadIdx.x] = nsync;
}
// f9_red2: the vector reduction, atomic on the host.
static void f9_red2(float* p, float a, float b) {
  if ((uintptr_t)p % 8) die("red.global.add.v2.f32: address not 8-byte aligned");
  std::atomic_ref<float>(p[0]).fetch_add(a);
  std::atomic_ref<float>(p[1]).fetch_add(b);
}
// f9_sts128f: four float32 values stored into the shared window, as f9_sts32.
static void f9_sts128f(float* p, float a, float b, float c, float d) {
  if ((uintptr_t)p % 16) die("st.shared.v4.f32: address not 16-byte aligned");
  const uint32_t o = f9_smem(p);
  f9_smem((uint8_t*)p + 15);
  if (pendingReads[o / 16].load() > 0) die("st.shared into shared memory that a wgmma or bulk reduction in flight still reads");
  p[0] = a; p[1] = b; p[2] = c; p[3] = d;
  chunkSync[o / 16] = nsync;
  lastUnfencedSync[threadIdx.x] = nsync;
}
// f9_ldg128f: four float32 values read from global memory.
static void f9_ldg128f(const float* p, float* v) {
  if ((uintptr_t)p % 16) die("ld.global.v4.f32: address not 16-byte aligned");
  memcpy(v, p, 16);
}
// The bulk reductions: queued per thread, performed at the wait.
struct Bulk { float* dst; uint32_t src; int bytes, group, sync; };
thread_local std::vector<Bulk> bulks;
thread_local int bulkCommitted;
static void f9_bulk_red(float* p, uint32_t s, int bytes) {
  if ((uintptr_t)p % 16 || s % 16 || bytes % 16 || bytes <= 0) die("cp.reduce.async.bulk: address or size not a multiple of 16");
  if (s + bytes > smemSize) die("cp.reduce.async.bulk reads past the shared window");
  for (uint32_t c = s / 16; c < (s + bytes) / 16; c++) {
    if (chunkSync[c] >= nsync) die("cp.reduce.async.bulk reads a chunk written after the issuer's last barrier");
    if (pendingWrites[c].load() > 0) die("cp.reduce.async.bulk reads shared memory that a cp.async in flight writes");
    pendingReads[c]++;
  }
  bulks.push_back({p, s, bytes, bulkCommitted, nsync});
}
static void f9_bulk_commit() { bulkCommitted++; }
static void bulk_wait() {
  for (const Bulk& r : bulks) {
    if (r.group >= bulkCommitted) die("cp.async.bulk.wait_group with a bulk reduction not committed");
    for (int u = 0; u < (int)lastUnfencedSync.size(); u++)
      if (lastUnfencedSync[u] >= 0 && lastUnfencedSync[u] < r.sync) die("bulk reduction after a barrier without fence.proxy.async of shared stores");
    const float* src = (const float*)(smemBase + r.src);
    for (int i = 0; i < r.bytes / 4; i++) std::atomic_ref<float>(r.dst[i]).fetch_add(src[i]);
    for (uint32_t c = r.src / 16; c < (r.src + r.bytes) / 16; c++) pendingReads[c]--;
  }
  bulks.clear();
}
static void f9_bulk_wait_read() { bulk_wait(); }
static void f9_bulk_wait() { bulk_wait(); }
static void f9_wg_fence() { wgFenced = true; }
static void f9_wg_commit() { wgCommitted++; }
static float halfOf(uint32_t r, int h) { return bf2f(h ? r >> 16 : r & 0xffff); }
// bElem reads element (k, n) of B through desc.
static float bElem(uint64_t desc, int trans, int k, int n, int issueSync) {
  const uint32_t a = bAddr(desc, trans, k, n);
  if (chunkSync[a / 16] >= issueSync) die("wgmma reads a chunk whose cp.async landed after the issuer's last barrier");
  uint16_t v; memcpy(&v, smemBase + a, 2);
  return bf2f(v);
}
// wg_wait completes the ops of all but the newest `pending` committed groups.
static void wg_wait(int pending) {
  const int t = threadIdx.x, w = (t >> 5) & 3, l = t & 31, g = l >> 2, c = l & 3, wg0 = t & ~127;
  wgBar[t >> 7]->arrive_and_wait();  // the warpgroup has issued (the ops are warpgroup-collective)
  size_t done = 0;
  for (; done < ops.size() && ops[done].group < wgCommitted - pending; done++) {
    const Op& op = ops[done];
    // Landed copies must have been fenced before the barrier preceding the issue.
    for (int u = 0; u < (int)lastUnfencedSync.size(); u++)
      if (lastUnfencedSync[u] >= 0 && lastUnfencedSync[u] < op.sync) die("wgmma after a barrier without fence.proxy.async of landed cp.async writes");
    for (int i = 0; i < op.N / 2; i++) {
      const int j = i / 4, e = i % 4, row = 16 * w + g + 8 * (e / 2), col = 8 * j + 2 * c + (e & 1);
      float acc = op.acc ? op.d[i] : 0.f;
      for (int k = 0; k < 16; k++) {
        const int rr = row % 16, owner = wg0 + 32 * (row / 16) + (rr % 8) * 4 + (k % 8) / 2, reg = rr / 8 + 2 * (k / 8);
        const float av = op.ss ? bElem(op.adesc, op.transA, k, row, op.sync) : halfOf(wgA[op.slot][owner][reg], k % 2);
        acc += av * bElem(op.desc, op.trans, k, col, op.sync);
      }
      op.d[i] = acc;
    }
  }
  // The completed ops' reads are over once the whole warpgroup is here.
  for (size_t oi = 0; oi < done; oi++)
    for (uint32_t ch : ops[oi].chunks) pendingReads[ch]--;
  wgBar[t >> 7]->arrive_and_wait();  // nobody reuses wgA before the warpgroup has read it
  ops.erase(ops.begin(), ops.begin() + done);
  wgFenced = false;
}
static void f9_wg_wait() { wg_wait(0); }
static void f9_wg_wait1() { wg_wait(1); }

template <int N> static void f9_regs(float*) {}

#include "flashattn_sm90_body.inc"  // extracted from flashattn_sm90.cu by emu.sh

// run_grid runs kernel over gridDim, one block at a time, each block as
// 128·WG threads with a fresh (NaN-filled) shared window of smem bytes.
template <class F> void run_grid(int WG, size_t smem, F kernel, int extra = 0) {
  const int NT = 128 * WG + extra;
  std::vector<uint8_t> window(smem);
  for (int by = 0; by < gridDim.y; by++)
    for (int bx = 0; bx < gridDim.x; bx++) {
      for (size_t i = 0; i + 1 < smem; i += 2) { window[i] = 0xc0; window[i + 1] = 0x7f; }
      smemBase = window.data(); smemSize = smem;
      chunkSync.assign(smem / 16, -1);
      pendingReads.reset(new std::atomic<int>[smem / 16]);
      pendingWrites.reset(new std::atomic<int>[smem / 16]);
      for (size_t i = 0; i < smem / 16; i++) pendingReads[i] = pendingWrites[i] = 0;
      lastUnfencedSync.assign(NT, -1);
      mbars.assign(smem / 8, MBar{});
      for (auto& nb : namedBar) nb = NamedBar{};
      chunkTma.assign(smem / 16, {-1, 0});
      std::barrier<> bb(NT), cb(128 * WG);
      blockThreads = NT;
      consThreads = 128 * WG;
      consBar = extra ? &cb : nullptr;
      std::vector<std::unique_ptr<std::barrier<>>> wb, wgb;
      for (int w = 0; w < NT / 32; w++) { wb.emplace_back(new std::barrier<>(32)); warpBar[w] = wb.back().get(); }
      for (int w = 0; w < WG; w++) { wgb.emplace_back(new std::barrier<>(128)); wgBar[w] = wgb.back().get(); }
      blockBar = &bb;
      std::vector<std::thread> th;
      for (int t = 0; t < NT; t++)
        th.emplace_back([&, t] {
          threadIdx = {t, 0}; blockIdx = {bx, by}; nsync = 0; wgFenced = false; wgCommitted = wgIssued = cpCommitted = 0;
          copies.clear(); ops.clear(); bulks.clear(); bulkCommitted = 0; mbarSeen.clear();
          kernel();
          if (!copies.empty()) die("cp.async copies never waited for");
          if (!bulks.empty()) die("bulk reductions never waited for");
          if (!ops.empty()) die("wgmma never waited for");
        });
      for (auto& x : th) x.join();
      for (auto& nb : namedBar)
        if (nb.arrived) die("named barrier: arrivals left over when the block exits");
    }
}

// run checks flash_fwd_sm90<HS, MT, WG> (flash_fwd_sm90p<HS, WG, D, PP, BK>
// when P: rings of D K and D V tiles of BK keys, PP ping-pong)
// with NH query heads and NKV key/value heads (0 means NKV = NH) against
// a float64 reference.
// GX > 0 launches the pipelined kernels persistent, with gridDim.x =
// min(GX, query blocks): each block takes several query blocks in turn.
template <int HS, int MT = 1, int WG = 1, bool P = false, int D = 2, bool PP = false, int BK = 64, bool WS = false> void run(int B, int T, int NH, unsigned seed, int& bad, int NKV = 0, int GX = 0) {
  if (NKV == 0) NKV = NH;
  int C = NH * HS, rep = NH / NKV;
  size_t W = (size_t)(NH + 2 * NKV) * HS;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> U(-2, 2);
  std::vector<uint16_t> qkv((size_t)B * T * W), out((size_t)B * T * C, 0x7fc0);
  std::vector<float> lse((size_t)B * NH * T, NAN);
  for (auto& x : qkv) x = f2bf(U(rng));
  float sl2 = (float)(1.4426950408889634 / std::sqrt((double)HS));
  gridDim = {(T + 64 * MT * WG - 1) / (64 * MT * WG), B * NH};
  if (P && GX > 0) gridDim.x = std::min(gridDim.x, GX);
  const size_t tile = (size_t)F9_BK * HS * 2;  // bytes of one K or V tile
  // The tensor map of the WS kernels: qkv as (W columns, T rows, B
  // batches), boxes of 64 columns and BK rows (spill_tmap_qkv's).
  const f9_tmap tm{qkv.data(), {(i64)W, T, B}, {(i64)W, (i64)T * (i64)W}, {64, BK}};
  const size_t smem = WS ? (size_t)f9_fwdws_smem<HS, D, BK>() : P ? (size_t)f9_fwdp_smem<HS, D, BK>() : 2 * tile;
  run_grid(WG, smem, [&] {
    uint16_t* Ks = (uint16_t*)smemBase;
    uint16_t* Vs = (uint16_t*)(smemBase + tile);
    if constexpr (P)
      flash_fwd_sm90p<HS, WG, D, PP, BK, WS>(out.data(), lse.data(), qkv.data(), T, NH, NKV, sl2, Ks, &tm);
    else
      flash_fwd_sm90<HS, MT, WG>(out.data(), lse.data(), qkv.data(), T, NH, NKV, sl2, Ks, Vs);
  }, WS ? 128 : 0);
  double worst = 0, worstL = 0;
  for (int b = 0; b < B; b++) for (int h = 0; h < NH; h++) for (int t = 0; t < T; t++) {
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
  printf("sm90%s%s%s D%d BK%d HS%d MT%d WG%d B%d T%d NH%d NKV%d GX%d: worst out err/tol %.3f, worst lse err %.2e, bad %d\n", P ? "p" : "", PP ? " ping-pong" : "", WS ? " producer warpgroup" : "", D, BK, HS, MT, WG, B, T, NH, NKV, (int)gridDim.x, worst, worstL, bad);
}

// run_bwd checks flash_bwd_kv_sm90<HS, PIPE> and flash_bwd_q_sm90<HS, PIPE>
// against a float64 reference of dQ, dK and dV (dK and dV summed over a
// key/value head's group), with NH query and NKV key/value heads (0: NKV =
// NH): dqkv starts at 0.25 and is accumulated into, or with set starts as
// NaN and is written over. lse and D = rowsum(dO∘O) come from the
// reference forward.
// run_bwd checks the backward: flash_bwd_kv_sm90 and flash_bwd_q_sm90
// (PIPE: pipelined), or with FUSED flash_bwd_kv_sm90 with DQ into a
// float32 dq started at zero, then dqkv's query columns from it as
// flash_bwd_dq writes them (scale, one rounding); WG 2: two warpgroups,
// 128 keys per block; BULK: dQ by bulk reductions.
// WS (not with PIPE): the warp-specialised kv kernel, a producer
// warpgroup copying the tiles through tensor maps of qkv and dout (the
// fused one with BULK, or the split one beside flash_bwd_q_sm90).
template <int HS, bool PIPE, bool FUSED = false, int WG = 1, bool BULK = false, bool WS = false> void run_bwd(int B, int T, int NH, unsigned seed, int& bad, int NKV = 0, bool set = false) {
  static_assert(!WS || (!PIPE && (BULK || !FUSED)), "run_bwd: the warp-specialised backward is the split one or the fused one with bulk dQ");
  if (NKV == 0) NKV = NH;
  const int C = NH * HS, rep = NH / NKV;
  const size_t W = (size_t)(NH + 2 * NKV) * HS;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> U(-2, 2), G(-1, 1);
  std::vector<uint16_t> qkv((size_t)B * T * W), dout((size_t)B * T * C), dqkv((size_t)B * T * W, set ? 0x7fc0 : f2bf(0.25f));
  for (auto& x : qkv) x = f2bf(U(rng));
  for (auto& x : dout) x = f2bf(G(rng));
  std::vector<float> lse((size_t)B * NH * T), D((size_t)B * NH * T);
  std::vector<double> want((size_t)B * T * W, set ? 0.0 : (double)bf2f(f2bf(0.25f)));
  const double sc = 1 / std::sqrt((double)HS);
  auto X = [&](int b, int t, size_t col) { return (double)bf2f(qkv[((size_t)b * T + t) * W + col]); };
  for (int b = 0; b < B; b++) for (int h = 0; h < NH; h++) {
    const size_t qc = (size_t)h * HS, kc = (size_t)(NH + h / rep) * HS, vc = kc + (size_t)NKV * HS;
    for (int t = 0; t < T; t++) {
      std::vector<double> p(t + 1), o(HS, 0.0);
      double m = -INFINITY, l = 0, Dt = 0;
      for (int j = 0; j <= t; j++) { double a = 0; for (int d = 0; d < HS; d++) a += X(b, t, qc + d) * X(b, j, kc + d); p[j] = a * sc; m = std::max(m, p[j]); }
      for (int j = 0; j <= t; j++) l += std::exp(p[j] - m);
      const double L = m + std::log(l);
      for (int j = 0; j <= t; j++) { p[j] = std::exp(p[j] - L); for (int d = 0; d < HS; d++) o[d] += p[j] * X(b, j, vc + d); }
      auto dO = [&](int d) { return (double)bf2f(dout[((size_t)b * T + t) * C + qc + d]); };
      for (int d = 0; d < HS; d++) Dt += dO(d) * o[d];
      lse[((size_t)b * NH + h) * T + t] = (float)L;
      D[((size_t)b * NH + h) * T + t] = (float)Dt;
      for (int j = 0; j <= t; j++) {
        double dp = 0; for (int d = 0; d < HS; d++) dp += dO(d) * X(b, j, vc + d);
        const double ds = p[j] * (dp - Dt);
        for (int d = 0; d < HS; d++) {
          want[((size_t)b * T + t) * W + qc + d] += sc * ds * X(b, j, kc + d);
          want[((size_t)b * T + j) * W + kc + d] += sc * ds * X(b, t, qc + d);
          want[((size_t)b * T + j) * W + vc + d] += p[j] * dO(d);
        }
      }
    }
  }
  const float sl2 = (float)(1.4426950408889634 * sc), scale = (float)sc;
  // The tensor maps of the WS kernel (spill_tmap3's): qkv as (W columns,
  // T rows, B batches) and dout as (C, T, B), boxes of 64 by 64.
  const f9_tmap tm[2] = {{qkv.data(), {(i64)W, T, B}, {(i64)W, (i64)T * (i64)W}, {64, 64}},
                         {dout.data(), {(i64)C, T, B}, {(i64)C, (i64)T * (i64)C}, {64, 64}}};
  if constexpr (FUSED) {
    // With BULK dq holds ceil(T/64) tiles of 64 x HS per head, each in
    // the accumulators' order (f9_dqf_at), which flash_bwd_dqf's own code
    // (f9_dqf_tiles) writes into dqkv; without, dq(B, NH, T, HS).
    const int ntq = (T + 63) / 64;
    std::vector<float> dq((size_t)B * NH * (BULK ? ntq * 64 : T) * HS, 0.f);
    gridDim = {(T + 64 * WG - 1) / (64 * WG), B * NKV};
    const size_t smem = WS ? (size_t)f9_bwdws_smem<HS, true, WG, BULK>() : (size_t)f9_bwd_smem<HS, true, WG, BULK>();
    run_grid(WG, smem, [&] { flash_bwd_kv_sm90<HS, false, true, WG, BULK, WS>(dqkv.data(), dout.data(), qkv.data(), lse.data(), D.data(), T, NH, NKV, sl2, scale, set, (uint16_t*)smemBase, dq.data(), tm); }, WS ? 128 : 0);
    if constexpr (BULK) {
      // flash_bwd_dqf's own code, 3 blocks of 96 threads (any count will do).
      for (int blk = 0; blk < 3; blk++) for (int t = 0; t < 96; t++)
        f9_dqf_tiles(dqkv.data(), dq.data(), (i64)B * NH * ntq, T, NH, NKV, HS, WG, scale, set, blk, 3, t, 96);
    } else {
      for (int b = 0; b < B; b++) for (int t = 0; t < T; t++) for (int h = 0; h < NH; h++) for (int d = 0; d < HS; d += 2) {
        const size_t i = (((size_t)b * NH + h) * T + t) * HS + d;
        fa_acc2(&dqkv[((size_t)b * T + t) * W + (size_t)h * HS + d], scale * dq[i], scale * dq[i + 1], set);
      }
    }
  } else {
    const size_t smem = f9_bwd_smem<HS>();
    gridDim = {(T + 63) / 64, B * NKV};
    run_grid(1, WS ? (size_t)f9_bwdws_smem<HS>() : smem, [&] { flash_bwd_kv_sm90<HS, PIPE, false, 1, false, WS>(dqkv.data(), dout.data(), qkv.data(), lse.data(), D.data(), T, NH, NKV, sl2, scale, set, (uint16_t*)smemBase, nullptr, tm); }, WS ? 128 : 0);
    gridDim = {(T + 63) / 64, B * NH};
    run_grid(1, smem, [&] { flash_bwd_q_sm90<HS, PIPE>(dqkv.data(), dout.data(), qkv.data(), lse.data(), D.data(), T, NH, NKV, sl2, scale, set, (uint16_t*)smemBase); });
  }
  double worst = 0;
  const char* part[] = {"dq", "dk", "dv"};
  for (size_t i = 0; i < dqkv.size(); i++) {
    const size_t col = i % W;
    const int which = col < (size_t)C ? 0 : col < (size_t)(C + NKV * HS) ? 1 : 2;
    const double g = bf2f(dqkv[i]), w = want[i], tol = 2e-2 + 1.6e-2 * std::fabs(w), e = std::fabs(g - w);
    worst = std::max(worst, e / tol);
    if (!(e <= tol) && bad++ < 5) printf("%s row %zu col %zu: %g vs %g\n", part[which], i / W, col, g, w);
  }
  printf("sm90 bwd%s%s HS%d B%d T%d NH%d NKV%d%s: worst err/tol %.3f, bad %d\n", WS ? " producer warpgroup" : "", FUSED ? (BULK ? (WG == 2 ? " (fused, two warpgroups, bulk dQ)" : " (fused, bulk dQ)") : WG == 2 ? " (fused, two warpgroups)" : " (fused)") : PIPE ? " (pipelined)" : "", HS, B, T, NH, NKV, set ? " set" : "", worst, bad);
}

int main(int argc, char** argv) {
  int bad = 0;
  const bool quick = argc > 1 && !strcmp(argv[1], "quick");  // the mutants: one small case per head size
  const bool bwdOnly = argc > 1 && !strcmp(argv[1], "bwd");  // emu.sh sm90bwd: the backward only
  const bool fwd4Only = argc > 1 && !strcmp(argv[1], "fwd4");  // emu.sh sm90fwd4: the 128-key forwards only
  const bool wsOnly = argc > 1 && !strcmp(argv[1], "ws");  // emu.sh sm90ws: the forwards with a producer warp only
  const bool bwdWSOnly = argc > 1 && !strcmp(argv[1], "bwdws");  // emu.sh sm90bwdws: the backward with a producer warpgroup only
  if (quick) {
    run<64>(1, 130, 2, 1, bad, 1);
    run<128>(1, 65, 1, 2, bad);
    run<64, 2>(1, 200, 2, 3, bad, 1);
    run<128, 1, 2>(1, 200, 2, 4, bad, 1);
    run<64, 1, 2, true, 4>(1, 330, 2, 5, bad, 1);
    run<128, 1, 2, true, 4>(1, 330, 2, 6, bad);
    run<64, 1, 1, true>(1, 130, 2, 7, bad, 1);
    run<64, 1, 2, true, 5, true>(1, 330, 2, 11, bad, 1);
    run<128, 1, 2, true, 5, true>(1, 330, 2, 12, bad);
    run<64, 1, 3, true, 4, false, 128>(1, 450, 2, 13, bad, 1);
    run<128, 1, 2, true, 3, true, 128>(1, 330, 2, 14, bad);
    run<128, 1, 2, true, 3, true, 128>(1, 700, 2, 21, bad, 0, 2);  // persistent: 3 items a block
    run<64, 1, 2, true, 4>(1, 600, 2, 22, bad, 1, 2);              // persistent, 64-key tiles
    run<64, 1, 2, true, 4, false, 128, true>(1, 330, 2, 24, bad, 1);         // producer warp
    run<128, 1, 2, true, 3, false, 128, true>(1, 700, 2, 25, bad, 0, 2);     // producer warp, persistent
    run<64, 1, 3, true, 6, false, 64, true>(1, 450, 2, 26, bad, 0, 2);       // producer warp, three warpgroups
    run<128, 1, 2, true, 3, true, 128, true>(1, 700, 2, 27, bad, 0, 2);      // producer warp, turns, persistent
    run_bwd<64, true>(1, 130, 2, 8, bad, 1);
    run_bwd<128, false>(1, 130, 2, 9, bad);
    run_bwd<128, true>(1, 70, 2, 10, bad, 0, true);
    run_bwd<64, false, true>(1, 130, 2, 15, bad, 1);
    run_bwd<128, false, true>(1, 130, 2, 16, bad, 0, true);
    run_bwd<64, false, true, 2>(1, 200, 2, 17, bad, 1);
    run_bwd<128, false, true, 2>(1, 130, 2, 18, bad, 0, true);
    run_bwd<64, false, true, 2, true>(1, 200, 2, 19, bad, 1);
    run_bwd<128, false, true, 2, true>(1, 130, 2, 20, bad, 0, true);
    run_bwd<64, false, true, 1, true>(1, 130, 2, 23, bad, 1);
    run_bwd<64, false, true, 1, true, true>(1, 200, 2, 28, bad, 1);       // producer warpgroup
    run_bwd<128, false, true, 2, true, true>(1, 200, 2, 29, bad, 0, true);  // producer warpgroup, two warpgroups
    run_bwd<64, false, false, 1, false, true>(1, 200, 2, 30, bad, 1);       // producer warpgroup, split
    return bad != 0;
  }
  const int Ts[] = {1, 63, 64, 65, 200, 300, 600};
  unsigned seed = 100;
  // The fused backward with a producer warpgroup (flash_bwd_fused1w and
  // flash_bwd_fused2w kernels: mbarriers, bulk tensor copies).
  for (int T : wsOnly || fwd4Only ? std::vector<int>{} : std::vector<int>{1, 63, 64, 65, 127, 129, 200, 300}) {
    run_bwd<64, false, true, 1, true, true>(T < 100 ? 2 : 1, T, 2, seed++, bad);  // multi-head
    run_bwd<64, false, true, 1, true, true>(1, T, 4, seed++, bad, 2, true);       // groups of 2, written over
    run_bwd<128, false, true, 1, true, true>(1, T, 3, seed++, bad, 1);            // multi-query
    run_bwd<64, false, true, 2, true, true>(1, T, 4, seed++, bad, 2);             // two warpgroups, groups of 2
    run_bwd<128, false, true, 2, true, true>(T < 100 ? 2 : 1, T, 2, seed++, bad, 0, true);  // multi-head, written over
    run_bwd<64, false, false, 1, false, true>(T < 100 ? 2 : 1, T, 2, seed++, bad);  // split, multi-head
    run_bwd<64, false, false, 1, false, true>(1, T, 4, seed++, bad, 2);             // split, groups of 2
    run_bwd<128, false, false, 1, false, true>(1, T, 3, seed++, bad, 1, true);      // split, multi-query, written over
  }
  if (bwdWSOnly) return bad != 0;
  // The forwards with a producer warp (flash_fwd5 kernels), one block a
  // query block and persistent.
  const int T5[] = {1, 64, 100, 128, 129, 193, 257, 450, 700};
  for (int T : bwdOnly || fwd4Only ? std::vector<int>{} : std::vector<int>(std::begin(T5), std::end(T5))) {
    run<64, 1, 2, true, 4, false, 128, true>(T < 150 ? 2 : 1, T, 2, seed++, bad);  // multi-head
    run<64, 1, 3, true, 6, false, 64, true>(1, T, 4, seed++, bad, 2);              // three warpgroups, groups of 2
    run<128, 1, 2, true, 3, false, 128, true>(1, T, 3, seed++, bad, 1);            // multi-query
    run<128, 1, 2, true, 5, false, 64, true>(1, T, 2, seed++, bad);                // 64-key tiles
    run<128, 1, 2, true, 3, false, 128, true>(1, T, 2, seed++, bad, 0, 1);         // persistent: one block a head
    run<64, 1, 3, true, 6, false, 64, true>(1, T, 2, seed++, bad, 0, 2);
    run<64, 1, 2, true, 4, false, 128, true>(1, T, 4, seed++, bad, 2, 2);
    run<64, 1, 2, true, 4, true, 128, true>(T < 150 ? 2 : 1, T, 2, seed++, bad);  // turns
    run<128, 1, 2, true, 3, true, 128, true>(1, T, 3, seed++, bad, 1, 2);         // turns, persistent
  }
  if (wsOnly) return bad != 0;
  // The 128-key forwards (flash_fwd4 kernels): T around 128, 192 and 256
  // (partial tiles, a warpgroup's rows wholly before a tile).
  const int T4[] = {1, 100, 127, 128, 129, 191, 193, 257, 450, 700};
  for (int T : bwdOnly ? std::vector<int>{} : std::vector<int>(std::begin(T4), std::end(T4))) {
    run<64, 1, 2, true, 4, false, 128>(T < 150 ? 2 : 1, T, 2, seed++, bad);  // 128 keys a tile, multi-head
    run<64, 1, 3, true, 4, false, 128>(1, T, 4, seed++, bad, 2);             // three warpgroups, groups of 2
    run<64, 1, 3, true, 2, false, 128>(1, T, 2, seed++, bad);                // three warpgroups, ring of 2
    run<128, 1, 2, true, 3, false, 128>(1, T, 2, seed++, bad);               // head size 128, multi-head
    run<128, 1, 2, true, 3, true, 128>(1, T, 3, seed++, bad, 1);             // ping-pong, multi-query
    run<128, 1, 1, true, 2, false, 128>(1, T, 2, seed++, bad);               // one warpgroup
    // Persistent (a block takes several query blocks): one and two blocks a head.
    run<128, 1, 2, true, 3, true, 128>(T < 150 ? 2 : 1, T, 2, seed++, bad, 1, 1);  // ping-pong
    run<128, 1, 2, true, 3, true, 128>(1, T, 3, seed++, bad, 1, 2);
    run<64, 1, 3, true, 4, false, 128>(1, T, 2, seed++, bad, 0, 2);                // three warpgroups
    run<64, 1, 2, true, 4>(1, T, 2, seed++, bad, 2, 1);                            // 64-key tiles, lockstep
    run<64, 1, 2, true, 4>(1, T, 4, seed++, bad, 2, 3);
  }
  if (fwd4Only) return bad != 0;
  for (int T : bwdOnly ? std::vector<int>{} : std::vector<int>(std::begin(Ts), std::end(Ts))) {
    run<64>(T < 100 ? 2 : 1, T, 2, seed++, bad);        // multi-head
    run<128>(1, T, 2, seed++, bad);                     // multi-head
    run<64>(1, T, 4, seed++, bad, 2);                   // groups of 2
    run<128>(1, T, 3, seed++, bad, 1);                  // multi-query
    run<64, 2>(T < 100 ? 2 : 1, T, 2, seed++, bad);     // two row tiles, multi-head
    run<64, 2>(1, T, 4, seed++, bad, 2);                // two row tiles, groups of 2
    run<128, 1, 2>(1, T, 2, seed++, bad);               // two warpgroups, multi-head
    run<128, 1, 2>(1, T, 3, seed++, bad, 1);            // two warpgroups, multi-query
    run<64, 1, 2, true, 4>(T < 100 ? 2 : 1, T, 2, seed++, bad);  // pipelined, ring of 4, multi-head
    run<64, 1, 2, true, 4>(1, T, 4, seed++, bad, 2);             // pipelined, groups of 2
    run<128, 1, 2, true, 4>(1, T, 2, seed++, bad);               // pipelined, multi-head
    run<128, 1, 2, true, 4>(1, T, 3, seed++, bad, 1);            // pipelined, multi-query
    run<64, 1, 2, true, 3>(1, T, 2, seed++, bad);                // pipelined, ring of 3
    run<64, 1, 2, true, 5, true>(T < 100 ? 2 : 1, T, 2, seed++, bad);  // ping-pong, ring of 5, multi-head
    run<64, 1, 2, true, 5, true>(1, T, 4, seed++, bad, 2);             // ping-pong, groups of 2
    run<128, 1, 2, true, 5, true>(1, T, 2, seed++, bad);               // ping-pong, multi-head
    run<128, 1, 2, true, 5, true>(1, T, 3, seed++, bad, 1);            // ping-pong, multi-query
    run<64, 1, 2, true, 3, true>(1, T, 2, seed++, bad);                // ping-pong, ring of 3 (one copy ahead)
    run<64, 1, 1, true>(1, T, 4, seed++, bad, 2);             // pipelined, one warpgroup, groups of 2
    run<128, 1, 1, true>(1, T, 2, seed++, bad);               // pipelined, one warpgroup, multi-head
  }
  const int Tb[] = {1, 63, 64, 65, 130, 200};
  for (int T : Tb) {
    run_bwd<64, false>(T < 100 ? 2 : 1, T, 2, seed++, bad);  // backward, multi-head
    run_bwd<64, true>(1, T, 4, seed++, bad, 2);              // pipelined, groups of 2
    run_bwd<128, false>(1, T, 3, seed++, bad, 1, true);      // multi-query, written over
    run_bwd<128, true>(1, T, 2, seed++, bad);                // pipelined, multi-head
    run_bwd<64, true>(1, T, 2, seed++, bad, 0, true);        // pipelined, written over
    run_bwd<128, true>(1, T, 4, seed++, bad, 2);             // pipelined, groups of 2
    run_bwd<64, false, true>(T < 100 ? 2 : 1, T, 2, seed++, bad);  // fused, multi-head
    run_bwd<64, false, true>(1, T, 4, seed++, bad, 2, true);       // fused, groups of 2, written over
    run_bwd<128, false, true>(1, T, 3, seed++, bad, 1);            // fused, multi-query
    run_bwd<128, false, true>(1, T, 2, seed++, bad, 0, true);      // fused, written over
    run_bwd<64, false, true, 2>(T < 100 ? 2 : 1, T, 2, seed++, bad);     // fused, two warpgroups, multi-head
    run_bwd<64, false, true, 2>(1, T, 4, seed++, bad, 2, true);          // groups of 2, written over
    run_bwd<128, false, true, 2>(1, T, 3, seed++, bad, 1);               // multi-query
    run_bwd<128, false, true, 2>(1, T, 2, seed++, bad, 0, true);         // written over
    run_bwd<64, false, true, 2, true>(T < 100 ? 2 : 1, T, 2, seed++, bad);  // bulk dQ, multi-head
    run_bwd<64, false, true, 2, true>(1, T, 4, seed++, bad, 2, true);       // groups of 2, written over
    run_bwd<128, false, true, 2, true>(1, T, 3, seed++, bad, 1);            // multi-query
    run_bwd<128, false, true, 2, true>(1, T, 2, seed++, bad, 0, true);      // written over
    run_bwd<64, false, true, 1, true>(T < 100 ? 2 : 1, T, 2, seed++, bad);  // one warpgroup, bulk dQ, multi-head
    run_bwd<64, false, true, 1, true>(1, T, 4, seed++, bad, 2, true);       // groups of 2, written over
    run_bwd<128, false, true, 1, true>(1, T, 3, seed++, bad, 1);            // multi-query
  }
  return bad != 0;
}
