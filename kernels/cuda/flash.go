//go:build cuda

package cuda

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"sync/atomic"
	"unsafe"

	"github.com/spill-ml/spill/kernels"
	"gorgonia.org/cu"
)

// The tensor-core forward kernel (kernels/flashattn.cu) computes causal
// attention for bf16 qkv and out with head size 64, 80, 96 or 128, flash style: one
// pass over the keys with the softmax online, mma.sync bf16 products with
// float32 accumulation, nothing but out and lse written, no workspace.
//
// It is used by AttentionForward in place of the cuBLAS path when it
// applies (flashFunc) and when the backend's self-check at Open passed
// (checkFlash: the kernel against the row-wise CUDA-core kernel on a small
// problem per head size). A kernel missing from the embedded PTX or
// failing the check leaves Backend.flashErr set and the cuBLAS path in use;
// TestAttention reports it. AttentionBackward likewise takes the flash
// backward kernels below.

// flashLaunches counts launches of the flash kernel by AttentionForward,
// not by the self-check (tests check that the variant they select ran).
var flashLaunches atomic.Int64

// flashHeadSize says the tensor-core flash kernels (forward, split and
// split-smem backward) are built for head size hs: 64, 80, 96 or 128. The
// fused backward and the Hopper forwards exist at 64 and 128 only; at 80
// and 96 those modes fall back to the split-smem backward and the
// mma.sync forward.
func flashHeadSize(hs int) bool { return hs == 64 || hs == 80 || hs == 96 || hs == 128 }

// flashHeadSizes are the head sizes of flashHeadSize, for the self-checks.
var flashHeadSizes = [...]int{64, 80, 96, 128}

// flashName is the forward kernel of head size hs (flashHeadSize); the names
// are constants, so that a launch formats nothing.
func flashName(hs int) string {
	switch hs {
	case 64:
		return "flash_fwd_bf16_hs64"
	case 80:
		return "flash_fwd_bf16_hs80"
	case 96:
		return "flash_fwd_bf16_hs96"
	}
	return "flash_fwd_bf16_hs128"
}

// flashFwd2Name is the head-size-64 forward with two 16-row tiles per warp
// (flash_fwd_mt), flashRows2 its query rows per block. AttentionForward
// takes it in place of flash_fwd_bf16_hs64 when flashFwd2 is set (the
// default; SPILL_FLASH_FWD=1 at start-up clears it) and its own self-check
// at Open passed (Backend.flashFwd2Err). On the H200 it ran 1.09-1.17x
// faster than the one-tile kernel at T 1024-8192
// (tools/bench/results/kernels_h200_e4475bd.json).
const flashFwd2Name = "flash_fwd2_bf16_hs64"

var flashFwd2 = flashFwdEnv != "1"

// flashFwd2x128 is the two-tile forward at head size 128 that
// AttentionForward takes: flash_fwd2k32_bf16_hs128 (32 keys per tile, the
// default, or SPILL_FLASH_FWD2_128=32 at start-up), flash_fwd2_bf16_hs128
// (64 keys per tile, =64; it spills 450 bytes at 255 registers) or, with
// any other value, neither (""): the one-tile flash_fwd_bf16_hs128. On the
// H200 (2026-12-04, tools/bench/results/attn_fwd2_hs128_h200.json) the
// default ran the forward 1.00x, 1.06x, 1.07x and 1.07x as fast as the
// one-tile kernel at T 1024, 2048, 4096 and 8192, the 64-key one
// 0.98-1.03x. Both are checked at Open (Backend.flashFwd2x128Err); tests
// set it.
var flashFwd2x128 = flashFwd2x128Of(os.Getenv("SPILL_FLASH_FWD2_128"))

// The head-size-128 two-tile forwards (flashFwd2x128).
const (
	flashFwd2HS128    = "flash_fwd2_bf16_hs128"
	flashFwd2K32HS128 = "flash_fwd2k32_bf16_hs128"
)

func flashFwd2x128Of(v string) string {
	switch v {
	case "64":
		return flashFwd2HS128
	case "32", "":
		return flashFwd2K32HS128
	}
	return ""
}

// flashFwd2Launches counts the forward calls that took a two-tile kernel
// (flashFwd2Name, or flashFwd2x128 at head size 128).
var flashFwd2Launches atomic.Int64

// flashFunc returns the flash kernel for a forward call, or false when it
// does not apply: dtypes other than bf16, a head size flashHeadSize rejects,
// operands not aligned for its vector accesses (qkv to 16 bytes, out to 4),
// or more than 65535 query heads in all (the grid's y dimension).
func (b *Backend) flashFunc(o, x operand, B, NH, hs int) (fn kfunc, rows int, ok bool) {
	if o.dt != kernels.BF16 || x.dt != kernels.BF16 || !flashHeadSize(hs) || x.p%16 != 0 || o.p%4 != 0 || B*NH > 65535 {
		return 0, 0, false
	}
	if fn, rows, ok := b.useFlashSM90(hs); ok {
		return fn, rows, true // flash_sm90.go
	}
	if hs == 128 && flashFwd2x128 != "" && b.flashFwd2x128Err == nil {
		if fn, ok := b.fns[flashFwd2x128]; ok {
			return fn, flashRows2, true
		}
	}
	if hs == 64 && flashFwd2 && b.flashFwd2Err == nil {
		if fn, ok := b.fns[flashFwd2Name]; ok {
			return fn, flashRows2, true
		}
	}
	fn, ok = b.fns[flashName(hs)]
	return fn, flashRows, ok
}

// flashScale is log2(e)/sqrt(hs): the flash kernel works in base 2.
func flashScale(hs int) float32 { return float32(math.Log2E / math.Sqrt(float64(hs))) }

// flashJob is the launch of fn (rows query rows per block of
// flashBlockThreads(fn) threads, with the dynamic shared memory
// flashShared holds for it; flashGridX blocks per head, so that a
// pipelined Hopper kernel's blocks may take several) for out, lse,
// qkv with NH query and NKV key/value heads of size hs (NKV = NH for
// multi-head attention).
//
// A flash_fwd5 kernel (flashTMA holds its keys per tile) takes the tensor
// map of qkv as its last argument, by value (withTensorMaps).
func flashJob(fn kfunc, rows int, o, lse, x cu.DevicePtr, B, T, NH, NKV, hs int) job {
	j := launchJob(fn, dim3{x: flashGridX(fn, rows, T, B*NH), y: B * NH}, dim3{x: flashBlockThreads(fn)},
		aPtr(o), aPtr(lse), aPtr(x), aI32(T), aI32(NH), aI32(NKV), aF32(flashScale(hs)))
	if n, ok := flashShared.Load(fn); ok {
		j = j.withShared(n.(int))
	}
	if bk, ok := flashTMA.Load(fn); ok {
		j = j.withTensorMaps(tensorMapOf{x, (NH + 2*NKV) * hs, T, B, bk.(int)})
	}
	return j
}

// AttentionKernels describes, for diagnostics and benchmarks, the
// attention kernels this backend runs for dtype dt, sequence length T and
// C, NH under the default selection (operand alignment aside; workspace
// permitting).
func (b *Backend) AttentionKernels(dt kernels.DType, T, C, NH int) string {
	hs := C / NH
	switch {
	case dt != kernels.BF16 || !flashHeadSize(hs):
		return "forward and backward: cuBLAS batched GEMMs"
	case b.flashErr != nil:
		return fmt.Sprintf("forward and backward: cuBLAS batched GEMMs (flash forward off: %v)", b.flashErr)
	case b.flashBwdErr != nil:
		return fmt.Sprintf("forward: tensor-core flash kernel; backward: cuBLAS batched GEMMs (flash backward off: %v)", b.flashBwdErr)
	}
	fwd := "forward: tensor-core flash kernel"
	if _, rows, ok := b.useFlashSM90(hs); ok {
		fwd = "forward: wgmma flash kernel for sm_90a"
		if k, ok := sm90wsSel(hs); ok && b.flashSM90WSErr == nil {
			fwd += fmt.Sprintf(" with a producer warpgroup (%s: bulk tensor copies, mbarriers)", k.name)
		} else if ok {
			fwd += fmt.Sprintf(" (%s off: %v)", k.env, b.flashSM90WSErr)
		}
		if flashSM90p {
			fwd += fmt.Sprintf(" (pipelined, %d query rows per block)", rows)
			if flashPersistent {
				fwd += ", persistent"
			}
		} else if rows == flashRows2 {
			fwd += " (128 query rows per block)"
		}
	} else if hs == 64 && flashFwd2 && b.flashFwd2Err == nil {
		fwd += " (two 16-row tiles per warp)"
	} else if hs == 128 && flashFwd2x128 != "" && b.flashFwd2x128Err == nil {
		fwd += " (two 16-row tiles per warp: " + flashFwd2x128 + ")"
	}
	mode := b.bwdMode(hs, T)
	f, _ := b.flashBwdByHead(hs, mode)
	if isFusedSM90(mode) && (f.fused == 0 || b.fusedErr(f) != nil) {
		mode = flashBwdSM90 // where the fused Hopper kernel does not apply
	}
	switch {
	case mode == flashBwdSplit:
		return fwd + "; backward: split tensor-core flash kernels (deterministic)"
	case isFlashBwdVariant(mode) && (f.v.kv == 0 || b.variantErr(f.v) != nil):
		return fmt.Sprintf("%s; backward: split tensor-core flash kernels (%s off: %v)", fwd, mode,
			b.variantErr(f.v))
	case isFlashBwdVariant(mode):
		return fmt.Sprintf("%s; backward: split tensor-core flash kernels, variant %s (%s, %s; deterministic)", fwd,
			f.v.mode, f.v.kvName, f.v.qName)
	case flashFusedName(hs, mode) == "":
		return fmt.Sprintf("%s; backward: split tensor-core flash kernels (no fused kernel at head size %d)", fwd, hs)
	case f.fused == 0 || b.fusedErr(f) != nil:
		return fmt.Sprintf("%s; backward: split tensor-core flash kernels (fused backward off: %v)", fwd, b.fusedErr(f))
	}
	how := "float32 atomics"
	if m, ok := fusedSM90ModeOf(mode); ok && m.bulk {
		how = "float32 bulk reductions"
	}
	return fmt.Sprintf("%s; backward: fused tensor-core flash kernel %s (dQ by %s, not bitwise reproducible)", fwd,
		flashFusedName(hs, mode), how)
}

// checkFlash runs the flash kernel of each head size beside the row-wise
// kernel on pseudo-random bf16 data (two key tiles, the second partial) on
// the backend's allocation stream and compares out and lse. Called on a
// context goroutine at Open; nil means the kernels may be used.
func (b *Backend) checkFlash() error {
	const B, T, NH = 2, 80, 2
	for _, hs := range flashHeadSizes {
		name := flashName(hs)
		fn, ok := b.fns[name]
		if !ok {
			return fmt.Errorf("kernel %s missing from the embedded PTX", name)
		}
		if err := b.checkFlashShape(fn, flashRows, B, T, NH*hs, NH); err != nil {
			return fmt.Errorf("%s self-check (B%d T%d C%d NH%d): %w", name, B, T, NH*hs, NH, err)
		}
	}
	// The optional two-tile forward: T 200 spans two of its 128-row blocks.
	if fn, ok := b.fns[flashFwd2Name]; !ok {
		b.flashFwd2Err = fmt.Errorf("kernel %s missing from the embedded PTX", flashFwd2Name)
	} else if err := b.checkFlashShape(fn, flashRows2, B, 200, NH*64, NH); err != nil {
		b.flashFwd2Err = fmt.Errorf("%s self-check (B%d T200 C%d NH%d): %w", flashFwd2Name, B, NH*64, NH, err)
	}
	for _, name := range []string{flashFwd2HS128, flashFwd2K32HS128} {
		if fn, ok := b.fns[name]; !ok {
			b.flashFwd2x128Err = fmt.Errorf("kernel %s missing from the embedded PTX", name)
		} else if err := b.checkFlashShape(fn, flashRows2, B, 200, NH*128, NH); err != nil {
			b.flashFwd2x128Err = fmt.Errorf("%s self-check (B%d T200 C%d NH%d): %w", name, B, NH*128, NH, err)
		}
	}
	return nil
}

func (b *Backend) checkFlashShape(fn kfunc, qrows, B, T, C, NH int) error {
	nx, no, nl := B*T*3*C, B*T*C, B*NH*T
	host := make([]byte, 2*nx)
	seed := uint32(12345)
	for i := 0; i < nx; i++ {
		seed = seed*1664525 + 1013904223
		v := float32(seed>>8)/float32(1<<24)*4 - 2 // [-2, 2): peaked rows, far from uniform
		binary.LittleEndian.PutUint16(host[2*i:], kernels.BF16FromF32(v))
	}
	offX := int64(0)
	offO1 := align256(int64(2 * nx))
	offO2 := offO1 + align256(int64(2*no))
	offL1 := offO2 + align256(int64(2*no))
	offL2 := offL1 + align256(int64(4*nl))
	total := offL2 + align256(int64(4*nl))
	base, err := cu.MemAlloc(total)
	if err != nil {
		return err
	}
	s := b.alloc
	defer func() {
		_ = s.Synchronize() // nothing in flight when the area is freed
		_ = cu.MemFree(base)
	}()
	dx, do1, do2, dl1, dl2 := base+cu.DevicePtr(offX), base+cu.DevicePtr(offO1), base+cu.DevicePtr(offO2),
		base+cu.DevicePtr(offL1), base+cu.DevicePtr(offL2)
	if err := cu.MemsetD8Async(base, 0, total, s); err != nil {
		return err
	}
	if err := cu.MemcpyHtoDAsync(dx, unsafe.Pointer(&host[0]), int64(len(host)), s); err != nil {
		return err
	}
	fj := flashJob(fn, qrows, do1, dl1, dx, B, T, NH, NH, C/NH)
	if err := fj.launchOn(s); err != nil {
		return err
	}
	if err := launchOn(s, b.fn("attention_forward"), rows(B*NH*T), block, aPtr(do2), aDT(kernels.BF16), aPtr(dl2),
		aPtr(dx), aDT(kernels.BF16), aI32(B), aI32(T), aI32(C), aI32(NH)); err != nil {
		return err
	}
	got := make([]byte, 2*no)
	want := make([]byte, 2*no)
	gotL := make([]byte, 4*nl)
	wantL := make([]byte, 4*nl)
	for _, c := range []struct {
		dst []byte
		src cu.DevicePtr
	}{{got, do1}, {want, do2}, {gotL, dl1}, {wantL, dl2}} {
		if err := cu.MemcpyDtoHAsync(unsafe.Pointer(&c.dst[0]), c.src, int64(len(c.dst)), s); err != nil {
			return err
		}
	}
	if err := s.Synchronize(); err != nil {
		return err
	}
	for i := 0; i < no; i++ {
		g := float64(kernels.F32FromBF16(binary.LittleEndian.Uint16(got[2*i:])))
		w := float64(kernels.F32FromBF16(binary.LittleEndian.Uint16(want[2*i:])))
		if !(math.Abs(g-w) <= 2e-2+1.6e-2*math.Abs(w)) {
			return fmt.Errorf("out[%d] = %g, row-wise kernel %g", i, g, w)
		}
	}
	for i := 0; i < nl; i++ {
		g := float64(math.Float32frombits(binary.LittleEndian.Uint32(gotL[4*i:])))
		w := float64(math.Float32frombits(binary.LittleEndian.Uint32(wantL[4*i:])))
		if !(math.Abs(g-w) <= 1e-2+1e-3*math.Abs(w)) {
			return fmt.Errorf("lse[%d] = %g, row-wise kernel %g", i, g, w)
		}
	}
	return nil
}

// The backward kernels (kernels/flashattn.cu) take the same operands: bf16
// dqkv, dout, qkv and out, head size 64, 80, 96 or 128 (the fused
// kernels 64 and 128 only). Two implementations:
//
//   - fused (opt-in): flash_bwd_fused_*, one block per 64 keys of one
//     (batch, key/value head), recomputes P and dS once per tile (five
//     products: S, dP, dV, dK, dQ) and keeps dK and dV in registers; dQ
//     goes through a float32 accumulator in the queue's scratch area with
//     atomic adds, which flash_bwd_dq then writes into dqkv. The atomics
//     make the float32 sums of dQ depend on the blocks' schedule: dQ is
//     not bitwise reproducible from run to run (as with FlashAttention-2's
//     and cuDNN's default backward); dK and dV are. On the H200 it ran
//     1.03-1.17x slower than the split kernels (register-bound at 4 warps
//     per block, 2 blocks per SM; tools/bench/results/attn_variants_h200.json),
//     so it is not the default.
//   - split: flash_bwd_kv_* (dK, dV) and flash_bwd_q_* (dQ), each
//     recomputing P and dP (seven products), no atomics: the result does
//     not depend on scheduling. Also the fallback of the other paths. Its
//     variants "split-smem" (below) and "sm90" (the Hopper kernels,
//     flash_sm90.go) compute the same bits faster; sm90 is the default
//     where it applies, split-smem elsewhere.
//
// Both need D = rowsum(dO∘O) (flash_bwd_prep), one float32 per (batch,
// head, row), in the scratch area; flash_bwd_prep also zeroes the fused
// path's accumulator. Checked at Open like the forward (checkFlashBwd,
// against the row-wise kernels): a failure of the split kernels turns the
// flash backward off (flashBwdErr), of the fused ones only the fused path
// (flashBwdFusedErr).
//
// SPILL_FLASH_BWD, read at start-up, selects the implementation: unset
// (or "auto"), the default, is by head size and T (flashBwdAuto,
// flashBwdModeAt in flash_modes.go: at head size 128 "sm90f2w" above T
// 2048, "sm90f2b" above 1024, "sm90w" up to it; at 64 "sm90f1w" above T
// 2048, "sm90" up to it; a warp-specialised mode whose self-check failed
// gives way to the same kernels without the producer); "sm90" the
// Hopper split kernels at head sizes 64 and 128 on a 9.x device whose
// self-check passed, split-smem elsewhere; "split-smem" and "split" the
// split kernels (all three bitwise reproducible, and bitwise equal; "sm90"
// is the choice for bitwise reproducible runs on Hopper), "fused" the
// fused kernels.
// split-smem is the split kernels' variant (flash_bwd_kv_v and
// flash_bwd_q_v in flashattn.cu; the same products and the same order of
// every sum, so as deterministic, and bit for bit equal to them on the
// emulator and on the H200) with each warp's fixed operands (K and V rows,
// or Q and dO rows) in shared memory instead of registers, which leaves
// room for 64-row streamed tiles at head size 128 (32 in the split
// kernels). On the H200 (tools/bench/results/attn_variants_h200.json)
// its forward and backward ran 1.14-1.22x faster than split's at head
// sizes 64 and 128, T 1k-8k. Slower variants timed in that run and then
// removed: 8 warps per block (1.00-1.08x), 8 warps with the operands in
// shared memory (1.06-1.12x), and the fused kernel with 32 query rows per
// tile at head size 64, for 2 or 3 blocks per SM (0.85-0.96x of fused).
// Each is checked at Open like the fused ones (checkFlashBwd); a variant that
// fails (Backend.flashBwdSMErr) leaves the backward on the split kernels.
// "sm90" and "sm90p" take the Hopper backward (flash_sm90.go) where it
// applies, split-smem elsewhere; "sm90f", "sm90f2", "sm90f2b" and
// "sm90f1b" the fused Hopper backward (flash_sm90.go) where it applies,
// the default elsewhere. Other values are taken as the default.

// flashBwdMode is the implementation the flash backward takes; tests set it.
var flashBwdMode = flashBwdModeOf(os.Getenv("SPILL_FLASH_BWD"))

// variantErr is the self-check result that gates the split variant v.
func (b *Backend) variantErr(v flashBwdVariant) error {
	if v.mode == flashBwdSM90W {
		return b.flashBwdSM90WErr
	}
	if isFlashBwdSM90(v.mode) {
		return b.flashBwdSM90Err
	}
	return b.flashBwdSMErr
}

// 1/flashFusedMaxScratch is the fraction of the memory budget the fused
// backward's scratch (D and the float32 dQ, B·NH·T·(hs+1)·4 bytes, the
// rows of dQ rounded up to 64 per head with bulk dQ) may
// take; above it the call takes the split kernels, which need only D. The
// scratch area is grow-only and charged to the budget ("scratch") beside
// the layers' memory the trainer plans, so it is kept small (the tests of
// out-of-core training leave the backend 1/8 of the limit).
const flashFusedMaxScratch = 16

// flashBwdLaunches counts AttentionBackward calls that took the flash path,
// flashBwdFusedLaunches those of them that took the fused kernels,
// flashBwdVariantLaunches those that took a split variant.
var flashBwdLaunches, flashBwdFusedLaunches, flashBwdVariantLaunches atomic.Int64

// flashBwd holds the kernels of one head size: the split ones, the prep
// kernel they share with the fused path, the fused kernel selected by
// flashBwdMode (0 when missing) with flash_bwd_dq, its dynamic shared
// memory, keys and threads per block (0: flashRows, flashThreads) and its
// mode when it is a Hopper one (sm90f, sm90f2, sm90f2b), and the split
// variant it selects (v.kv 0 when none or missing).
type flashBwd struct {
	kv, q, prep, fused, dq             kfunc
	fusedSmem, fusedRows, fusedThreads int
	fusedSM90                          string
	fusedWS                            bool // the fused kernel takes the tensor maps of qkv and dout
	// fusedTiles, when not 0, is the fused kernel's warpgroups: its dQ
	// accumulator holds 64-query tiles in their accumulators' order, which
	// f.dq (flash_bwd_dqf) reads back; 0: dq(B, NH, T, hs), f.dq flash_bwd_dq.
	fusedTiles int
	v          flashBwdVariant
}

// fusedErr is the self-check result that gates f's fused kernel.
func (b *Backend) fusedErr(f flashBwd) error {
	if f.fusedSM90 != "" {
		if err, ok := b.flashBwdFusedSM90Err[f.fusedSM90]; ok {
			return err
		}
		return fmt.Errorf("fused Hopper backward %s: not checked at Open", f.fusedSM90)
	}
	return b.flashBwdFusedErr
}

// flashBwdVariant is a split variant of one head size: its dK, dV and dQ
// kernels, the mode that selects it, the keys (query rows) per block, the
// threads per block and the dynamic shared memory of each kernel.
type flashBwdVariant struct {
	kv, q                        kfunc
	mode                         string
	rows, threads, smemKV, smemQ int
	kvName, qName                string
	kvThreads                    int  // the dK, dV kernel's threads when not threads (a producer warpgroup more)
	kvWS                         bool // the dK, dV kernel takes the tensor maps of qkv and dout
}

// flashBwdVariantOf describes split-smem's kernels of head size hs
// (flashHeadSize; not looked up): 4 warps per block, 64 keys (query rows) per block
// and per streamed tile (BQ of flash_bwd_kv_v, BK of flash_bwd_q_v), the
// fixed operands (2·64 rows) in shared memory, as the entry points of
// flashattn.cu instantiate them; the shared memory sizes are
// fa_bwd_kv_smem's and fa_bwd_q_smem's. Constant names: a call formats
// nothing.
func flashBwdVariantOf(hs int) flashBwdVariant {
	const rows, tile, fixed = 64, 64, 2 * 64
	v := flashBwdVariant{mode: flashBwdSplitSM, rows: rows, threads: 2 * rows,
		smemKV: (fixed+3*tile)*(hs+8)*2 + 4*tile*4, smemQ: (fixed + 3*tile) * (hs + 8) * 2,
		kvName: "flash_bwd_kv_sm_bf16_hs64", qName: "flash_bwd_q_sm_bf16_hs64"}
	switch hs {
	case 80:
		v.kvName, v.qName = "flash_bwd_kv_sm_bf16_hs80", "flash_bwd_q_sm_bf16_hs80"
	case 96:
		v.kvName, v.qName = "flash_bwd_kv_sm_bf16_hs96", "flash_bwd_q_sm_bf16_hs96"
	case 128:
		v.kvName, v.qName = "flash_bwd_kv_sm_bf16_hs128", "flash_bwd_q_sm_bf16_hs128"
	}
	return v
}

// flashBwdFuncs returns the backward kernels for a call, or false when they
// do not apply (as flashFunc; dqkv and out need 4-byte, qkv and dout
// 16-byte alignment; B·T·NH below 2^31).
func (b *Backend) flashBwdFuncs(d, g, x, o operand, B, T, NH, hs int) (flashBwd, bool) {
	for _, t := range []operand{d, g, x, o} {
		if t.dt != kernels.BF16 {
			return flashBwd{}, false
		}
	}
	if !flashHeadSize(hs) || d.p%4 != 0 || o.p%4 != 0 || x.p%16 != 0 || g.p%16 != 0 || B*NH > 65535 || int64(B)*int64(T)*int64(NH) >= 1<<31 {
		return flashBwd{}, false
	}
	return b.flashBwdByHead(hs, b.bwdMode(hs, T))
}

// bwdMode is the backward's mode at head size hs and sequence length T:
// flashBwdModeAt(hs, T, flashBwdMode), or its wsFallback where that
// mode's warp-specialised kernels are off.
func (b *Backend) bwdMode(hs, T int) string {
	mode := flashBwdModeAt(hs, T, flashBwdMode)
	off := mode == flashBwdSM90W && b.flashBwdSM90WErr != nil
	if m, ok := fusedSM90ModeOf(mode); ok && m.ws {
		err, checked := b.flashBwdFusedSM90Err[mode]
		off = !checked || err != nil
	}
	if off {
		return wsFallback(mode)
	}
	return mode
}

// flashFusedName is the fused backward kernel of head size hs under mode
// (the Hopper one of fusedSM90Modes under a fused Hopper mode), "" at head
// sizes 80 and 96, which have none.
func flashFusedName(hs int, mode string) string {
	if hs != 64 && hs != 128 {
		return ""
	}
	k := hs/64 - 1 // 0 at 64, 1 at 128
	if m, ok := fusedSM90ModeOf(mode); ok {
		return m.names[k]
	}
	return [2]string{"flash_bwd_fused_bf16_hs64", "flash_bwd_fused_bf16_hs128"}[k]
}

// flashBwdByHead returns the kernels of head size hs; ok says the split
// kernels are there (the fused one is optional, f.fused 0 without it).
func (b *Backend) flashBwdByHead(hs int, mode string) (f flashBwd, ok bool) {
	kvName, qName := "flash_bwd_kv_bf16_hs128", "flash_bwd_q_bf16_hs128"
	switch hs {
	case 64:
		kvName, qName = "flash_bwd_kv_bf16_hs64", "flash_bwd_q_bf16_hs64"
	case 80:
		kvName, qName = "flash_bwd_kv_bf16_hs80", "flash_bwd_q_bf16_hs80"
	case 96:
		kvName, qName = "flash_bwd_kv_bf16_hs96", "flash_bwd_q_bf16_hs96"
	}
	kv, ok1 := b.fns[kvName]
	q, ok2 := b.fns[qName]
	prep, ok3 := b.fns["flash_bwd_prep"]
	f = flashBwd{kv: kv, q: q, prep: prep}
	if isFusedSM90(mode) {
		// The fused Hopper kernel where it applies, with the default's
		// variant for the calls whose scratch does not fit, and where it
		// does not apply.
		b.sm90Fused(&f, hs, mode)
		mode = flashBwdSM90
	}
	if v, ok := b.sm90BwdVariant(hs, mode); ok && b.flashBwdSM90Err == nil {
		f.v = v // flash_sm90.go
	} else if isFlashBwdVariant(mode) {
		v := flashBwdVariantOf(hs)
		kv, ok4 := b.fns[v.kvName]
		q, ok5 := b.fns[v.qName]
		if ok4 && ok5 {
			v.kv, v.q = kv, q
			f.v = v
		}
	} else if mode != flashBwdSplit {
		fused, ok4 := b.fns[flashFusedName(hs, mode)]
		dq, ok5 := b.fns["flash_bwd_dq"]
		if ok4 && ok5 {
			f.fused, f.dq = fused, dq
		}
	}
	return f, ok1 && ok2 && ok3
}

// prepJob is the launch of flash_bwd_prep: D = rowsum(dO∘O) into the
// float32 array at D (argument 0) and, unless dq is 0, zeros into the
// first dqRows rows of hs floats at dq (argument 7).
func prepJob(prep kfunc, D, dout, out, dq cu.DevicePtr, dqRows int64, B, T, NH, hs int) job {
	warps := B * T * NH
	return launchJob(prep, dim3{x: min((warps+7)/8, 132*16)}, dim3{x: 256}, aPtr(D), aPtr(dout), aPtr(out),
		aI32(B*T), aI32(T), aI32(NH*hs), aI32(NH), aPtr(dq), aI64(dqRows))
}

// fusedDQRows is the number of rows of hs float32 values in f's dQ
// accumulator: B·NH·T, or with the tiled order of the Hopper kernels with
// bulk dQ (f.fusedTiles) B·NH·ceil(T/64)·64.
func fusedDQRows(f flashBwd, B, T, NH int) int64 {
	if f.fusedTiles != 0 {
		T = (T + flashRows - 1) / flashRows * flashRows
	}
	return int64(B) * int64(NH) * int64(T)
}

// flashBwdJobs are the three launches of the split backward pass: D =
// rowsum(dO∘O) into the float32 array at D (argument 0 of the first
// launch, 4 of the others), then dK, dV and dQ, accumulated into dqkv or,
// with set, written over it. NH query and NKV key/value heads of size hs
// (NKV = NH for multi-head attention); the dK, dV kernel takes one block
// row per key/value head and sums over its group.
func flashBwdJobs(f flashBwd, dqkv, dout, qkv, out, lse, D cu.DevicePtr, B, T, NH, NKV, hs int, set bool) [3]job {
	v := flashBwdVariant{kv: f.kv, q: f.q, rows: flashRows, threads: flashThreads}
	return flashBwdSplitJobs(f.prep, v, dqkv, dout, qkv, out, lse, D, B, T, NH, NKV, hs, set)
}

// flashBwdVariantJobs are flashBwdJobs with f's split variant (f.v) in
// place of the split kernels: v.rows keys (query rows) and v.threads
// threads per block, v.smemKV and v.smemQ bytes of dynamic shared memory.
func flashBwdVariantJobs(f flashBwd, dqkv, dout, qkv, out, lse, D cu.DevicePtr, B, T, NH, NKV, hs int, set bool) [3]job {
	return flashBwdSplitJobs(f.prep, f.v, dqkv, dout, qkv, out, lse, D, B, T, NH, NKV, hs, set)
}

func flashBwdSplitJobs(prep kfunc, v flashBwdVariant, dqkv, dout, qkv, out, lse, D cu.DevicePtr, B, T, NH, NKV, hs int,
	set bool) [3]job {
	nx := (T + v.rows - 1) / v.rows
	scale, rscale := aF32(flashScale(hs)), aF32(float32(1/math.Sqrt(float64(hs))))
	kvThreads := v.threads
	if v.kvThreads != 0 {
		kvThreads = v.kvThreads
	}
	kj := launchJob(v.kv, dim3{x: nx, y: B * NKV}, dim3{x: kvThreads}, aPtr(dqkv), aPtr(dout), aPtr(qkv), aPtr(lse),
		aPtr(D), aI32(T), aI32(NH), aI32(NKV), scale, rscale, aI32(setFlag(set))).withShared(v.smemKV)
	if v.kvWS {
		kj = withBwdMaps(kj, qkv, dout, B, T, NH, NKV, hs)
	}
	return [3]job{
		prepJob(prep, D, dout, out, 0, 0, B, T, NH, hs),
		kj,
		launchJob(v.q, dim3{x: nx, y: B * NH}, dim3{x: v.threads}, aPtr(dqkv), aPtr(dout), aPtr(qkv), aPtr(lse), aPtr(D),
			aI32(T), aI32(NH), aI32(NKV), scale, rscale, aI32(setFlag(set))).withShared(v.smemQ),
	}
}

// withBwdMaps appends to a warp-specialised backward launch its tensor
// maps (f9_tmap2): of qkv (NH + 2·NKV heads of hs columns) and of dout (NH
// heads), T rows and B batches, boxes of 64 columns by flashRows rows.
func withBwdMaps(j job, qkv, dout cu.DevicePtr, B, T, NH, NKV, hs int) job {
	return j.withTensorMaps(tensorMapOf{qkv, (NH + 2*NKV) * hs, T, B, flashRows}, tensorMapOf{dout, NH * hs, T, B, flashRows})
}

// flashBwdFusedJobs are the three launches of the fused backward pass:
// D into the float32 array at D and zeros into the float32 dQ accumulator
// dq (B·NH·T·hs), then dK, dV into dqkv and dQ into dq
// (flash_bwd_fused_*), then dqkv's query columns from dq (flash_bwd_dq);
// with set dqkv is written over, else accumulated. D is argument 0 of the
// first launch and 5 of the second; dq argument 7 of the first, 1 of the
// others.
func flashBwdFusedJobs(f flashBwd, dqkv, dout, qkv, out, lse, D, dq cu.DevicePtr, B, T, NH, NKV, hs int, set bool) [3]job {
	rows, threads := flashRows, flashThreads // 64 keys per block
	if f.fusedRows != 0 {
		rows, threads = f.fusedRows, f.fusedThreads
	}
	nx := (T + rows - 1) / rows
	scale, rscale := aF32(flashScale(hs)), aF32(float32(1/math.Sqrt(float64(hs))))
	dqRows := fusedDQRows(f, B, T, NH)
	fj := launchJob(f.fused, dim3{x: nx, y: B * NKV}, dim3{x: threads}, aPtr(dqkv), aPtr(dq), aPtr(dout), aPtr(qkv),
		aPtr(lse), aPtr(D), aI32(T), aI32(NH), aI32(NKV), scale, rscale, aI32(setFlag(set))).withShared(f.fusedSmem)
	if f.fusedWS {
		fj = withBwdMaps(fj, qkv, dout, B, T, NH, NKV, hs)
	}
	var dj job
	if f.fusedTiles != 0 { // flash_bwd_dqf, a 64-query tile a block
		tiles := dqRows / flashRows
		dj = launchJob(f.dq, dim3{x: int(min(tiles, 132*8))}, dim3{x: 256}, aPtr(dqkv), aPtr(dq), aI64(tiles),
			aI32(T), aI32(NH), aI32(NKV), aI32(hs), aI32(f.fusedTiles), rscale, aI32(setFlag(set)))
	} else { // flash_bwd_dq, a float pair a thread
		n2 := dqRows * int64(hs) / 2
		dj = launchJob(f.dq, dim3{x: int(min((n2+255)/256, 132*16))}, dim3{x: 256}, aPtr(dqkv), aPtr(dq), aI64(n2),
			aI32(T), aI32(NH), aI32(NKV), aI32(hs), rscale, aI32(setFlag(set)))
	}
	return [3]job{prepJob(f.prep, D, dout, out, dq, dqRows, B, T, NH, hs), fj, dj}
}

// putFlashBwd enqueues the backward pass: the fused kernels when f has
// them, their self-check passed (or force) and their scratch fits
// (1/flashFusedMaxScratch of the budget), else f's split variant when it
// has one and its self-check passed (or force), else the split kernels; D
// at the start of the scratch area, the fused path's dQ accumulator after it.
func (q *queue) putFlashBwd(f flashBwd, force bool, dqkv, dout, qkv, out, lse cu.DevicePtr, B, T, NH, NKV, hs int, set bool) {
	nD := align256(int64(B) * int64(NH) * int64(T) * 4)
	need := nD + fusedDQRows(f, B, T, NH)*int64(hs)*4
	if f.fused != 0 && (force || q.b.fusedErr(f) == nil) && need <= q.b.limit/flashFusedMaxScratch {
		flashBwdFusedLaunches.Add(1)
		js := flashBwdFusedJobs(f, dqkv, dout, qkv, out, lse, 0, cu.DevicePtr(nD), B, T, NH, NKV, hs, set)
		js[0] = js[0].withScratch(need, 0, 7)
		js[1] = js[1].withScratch(need, 1, 5)
		js[2] = js[2].withScratch(need, 1)
		q.putGroup(js[:])
		return
	}
	js := flashBwdJobs(f, dqkv, dout, qkv, out, lse, 0, B, T, NH, NKV, hs, set)
	if f.v.kv != 0 && (force || q.b.variantErr(f.v) == nil) {
		flashBwdVariantLaunches.Add(1)
		if isFlashBwdSM90(f.v.mode) {
			flashBwdSM90Launches.Add(1)
		}
		js = flashBwdVariantJobs(f, dqkv, dout, qkv, out, lse, 0, B, T, NH, NKV, hs, set)
	}
	need = int64(B) * int64(NH) * int64(T) * 4
	js[0] = js[0].withScratch(need, 0)
	js[1] = js[1].withScratch(need, 4)
	js[2] = js[2].withScratch(need, 4)
	q.putGroup(js[:])
}

// checkFlashBwd runs the backward kernels of each head size beside the
// row-wise kernels on the self-check's data (forward by the row-wise
// kernel, dout pseudo-random, dqkv starting at 0.25 to check that both
// accumulate; T 80, partial key and query tiles) and compares dqkv: the
// split kernels, then every fused variant, whose failure (or absence) only
// sets flashBwdFusedErr. Called on a context goroutine at Open.
func (b *Backend) checkFlashBwd() error {
	const B, T, NH = 2, 80, 2
	for _, hs := range flashHeadSizes {
		f, ok := b.flashBwdByHead(hs, flashBwdSplit)
		if !ok {
			return fmt.Errorf("flash backward kernels for head size %d missing from the embedded PTX", hs)
		}
		if err := b.checkFlashBwdShape(f, false, B, T, NH*hs, NH); err != nil {
			return fmt.Errorf("flash backward self-check (B%d T%d C%d NH%d): %w", B, T, NH*hs, NH, err)
		}
	}
	b.flashBwdSMErr = b.checkFlashBwdVariant()
	for _, v := range []struct {
		hs   int
		mode string
	}{{64, flashBwdFused}, {128, flashBwdFused}} {
		f, _ := b.flashBwdByHead(v.hs, v.mode)
		name := flashFusedName(v.hs, v.mode)
		if f.fused == 0 {
			b.flashBwdFusedErr = fmt.Errorf("kernel %s or flash_bwd_dq missing from the embedded PTX", name)
			break
		}
		if err := b.checkFlashBwdShape(f, true, B, T, NH*v.hs, NH); err != nil {
			b.flashBwdFusedErr = fmt.Errorf("%s self-check (B%d T%d C%d NH%d): %w", name, B, T, NH*v.hs, NH, err)
			break
		}
	}
	return nil
}

// checkFlashBwdVariant allows split-smem's kernels their dynamic shared
// memory (setMaxDynamicShared, before their first launch) and checks them
// as the split kernels, at T 80 and at T 200 (four of their 64-row blocks,
// the last partial), per head size; nil means they may be used.
func (b *Backend) checkFlashBwdVariant() error {
	for _, hs := range flashHeadSizes {
		f, _ := b.flashBwdByHead(hs, flashBwdSplitSM)
		v := flashBwdVariantOf(hs)
		if f.v.kv == 0 {
			return fmt.Errorf("kernel %s or %s missing from the embedded PTX", v.kvName, v.qName)
		}
		if err := setMaxDynamicShared(f.v.kv, f.v.smemKV); err != nil {
			return fmt.Errorf("%s: %d bytes of dynamic shared memory: %w", v.kvName, f.v.smemKV, err)
		}
		if err := setMaxDynamicShared(f.v.q, f.v.smemQ); err != nil {
			return fmt.Errorf("%s: %d bytes of dynamic shared memory: %w", v.qName, f.v.smemQ, err)
		}
		const B, NH = 2, 2
		for _, T := range []int{80, 200} {
			if err := b.checkFlashBwdShape(f, false, B, T, NH*hs, NH); err != nil {
				return fmt.Errorf("%s, %s self-check (B%d T%d C%d NH%d): %w", v.kvName, v.qName, B, T, NH*hs, NH, err)
			}
		}
	}
	return nil
}

// checkFlashBwdShape checks f's fused kernels (fused), else its split
// variant when it has one, else its split kernels.
func (b *Backend) checkFlashBwdShape(f flashBwd, fused bool, B, T, C, NH int) error {
	nx, no, nl := B*T*3*C, B*T*C, B*NH*T
	seed := uint32(777)
	rnd := func(n int) []byte {
		h := make([]byte, 2*n)
		for i := 0; i < n; i++ {
			seed = seed*1664525 + 1013904223
			binary.LittleEndian.PutUint16(h[2*i:], kernels.BF16FromF32(float32(seed>>8)/float32(1<<24)*4-2))
		}
		return h
	}
	hx, hg := rnd(nx), rnd(no)
	hd := make([]byte, 2*nx)
	for i := 0; i < nx; i++ {
		binary.LittleEndian.PutUint16(hd[2*i:], kernels.BF16FromF32(0.25))
	}
	var off int64
	take := func(n int64) int64 { o := off; off += align256(n); return o }
	oX, oG, oO, oL, oD, oD1, oD2, oQ := take(int64(2*nx)), take(int64(2*no)), take(int64(2*no)), take(int64(4*nl)),
		take(int64(4*nl)), take(int64(2*nx)), take(int64(2*nx)), take(int64(4*no))
	base, err := cu.MemAlloc(off)
	if err != nil {
		return err
	}
	s := b.alloc
	defer func() {
		_ = s.Synchronize()
		_ = cu.MemFree(base)
	}()
	p := func(o int64) cu.DevicePtr { return base + cu.DevicePtr(o) }
	if err := cu.MemsetD8Async(base, 0, off, s); err != nil {
		return err
	}
	for _, c := range []struct {
		dst int64
		src []byte
	}{{oX, hx}, {oG, hg}, {oD1, hd}, {oD2, hd}} {
		if err := cu.MemcpyHtoDAsync(p(c.dst), unsafe.Pointer(&c.src[0]), int64(len(c.src)), s); err != nil {
			return err
		}
	}
	bf := aDT(kernels.BF16)
	if err := launchOn(s, b.fn("attention_forward"), rows(nl), block, aPtr(p(oO)), bf, aPtr(p(oL)),
		aPtr(p(oX)), bf, aI32(B), aI32(T), aI32(C), aI32(NH)); err != nil {
		return err
	}
	js := flashBwdJobs(f, p(oD1), p(oG), p(oX), p(oO), p(oL), p(oD), B, T, NH, NH, C/NH, false)
	if f.v.kv != 0 {
		js = flashBwdVariantJobs(f, p(oD1), p(oG), p(oX), p(oO), p(oL), p(oD), B, T, NH, NH, C/NH, false)
	}
	if fused {
		// The accumulator starts as garbage: flash_bwd_prep must zero it.
		if err := cu.MemsetD8Async(p(oQ), 0x7f, int64(4*no), s); err != nil {
			return err
		}
		js = flashBwdFusedJobs(f, p(oD1), p(oG), p(oX), p(oO), p(oL), p(oD), p(oQ), B, T, NH, NH, C/NH, false)
	}
	for _, j := range js {
		if err := j.launchOn(s); err != nil {
			return err
		}
	}
	if err := launchOn(s, b.fn("attention_backward"), rows(nl), block, aPtr(p(oD2)), bf, aPtr(p(oD)), aPtr(p(oG)), bf,
		aPtr(p(oX)), bf, aPtr(p(oO)), bf, aPtr(p(oL)), aI32(B), aI32(T), aI32(C), aI32(NH)); err != nil {
		return err
	}
	if err := launchOn(s, b.fn("attention_backward_kv"), rows(nl), block, aPtr(p(oD2)), bf, aPtr(p(oD)), aPtr(p(oG)), bf,
		aPtr(p(oX)), bf, aPtr(p(oL)), aI32(B), aI32(T), aI32(C), aI32(NH)); err != nil {
		return err
	}
	got, want := make([]byte, 2*nx), make([]byte, 2*nx)
	if err := cu.MemcpyDtoHAsync(unsafe.Pointer(&got[0]), p(oD1), int64(len(got)), s); err != nil {
		return err
	}
	if err := cu.MemcpyDtoHAsync(unsafe.Pointer(&want[0]), p(oD2), int64(len(want)), s); err != nil {
		return err
	}
	if err := s.Synchronize(); err != nil {
		return err
	}
	for i := 0; i < nx; i++ {
		g := float64(kernels.F32FromBF16(binary.LittleEndian.Uint16(got[2*i:])))
		w := float64(kernels.F32FromBF16(binary.LittleEndian.Uint16(want[2*i:])))
		if !(math.Abs(g-w) <= 5e-2+3e-2*math.Abs(w)) {
			return fmt.Errorf("dqkv[%d] = %g, row-wise kernels %g", i, g, w)
		}
	}
	return nil
}

func setFlag(set bool) int {
	if set {
		return 1
	}
	return 0
}
