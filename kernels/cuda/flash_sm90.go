//go:build cuda

package cuda

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"strconv"
	"sync"
	"sync/atomic"

	"gorgonia.org/cu"
)

// The Hopper forward (kernels/flashattn_sm90.cu, compiled for compute_90a)
// computes what flash_fwd_bf16_hs64/_hs128 do, with the same arguments, on
// the warpgroup tensor-core instructions (wgmma) of sm_90a. With
// SPILL_FLASH_FWD=sm90, 128 query rows per block: flash_fwd2_sm90_bf16_hs64,
// one warpgroup (128 threads) with two 64-row tiles, and
// flash_fwd2_sm90_bf16_hs128, two warpgroups (256 threads,
// flashBlockThreads) of one tile each sharing the key and value tiles;
// with SPILL_FLASH_FWD=sm90x1 flash_fwd_sm90_bf16_hs64 and _hs128, one
// warpgroup and one 64-row tile per block. flashFunc takes it for the
// forward, in place of the mma.sync kernels, when
//   - the device has compute capability 9.x and its module loaded (the
//     module is optional: loadModules hands it to loadFlashSM90, and a
//     failed load leaves Backend.flashSM90Err set, not Open failing; PTX for
//     compute_90a loads on sm_90 devices only),
//   - its self-check at Open passed (checkFlashSM90, against the row-wise
//     kernel like checkFlash), and
//   - SPILL_FLASH_FWD is unset or "sm90wsp" (the default since
//     2026-12-07: flash_fwd5p, below, where its self-check passed and the
//     build has CUDA 12's tensor maps; else "sm90p"'s kernels), or
//     "sm90p", which takes the pipelined
//     kernels flash_fwd3_sm90_bf16_hs64 and _hs128 (flash_fwd_sm90p: two
//     warpgroups, 256 threads, 128 query rows per block; each key tile's
//     S = Q·Kᵀ and the previous tile's O += P·V are issued together and
//     the softmax runs while P·V is still on the tensor cores; the two
//     warpgroups run in lockstep at head size 64 and half an iteration
//     apart (ping-pong) at 128, where one's softmax also runs under the
//     other's products; rings of sm90FwdPDepth K and V tiles in dynamic
//     shared memory in the 128-byte swizzled layout, each tile copied
//     three iterations before its use), or "sm90px1" (their one-warpgroup versions
//     flash_fwd3x1_sm90_bf16_hs64 and _hs128, 128 threads, 64 rows), or
//     "sm90" / "sm90x1" (the first, unpipelined kernels), or "sm90p4" /
//     "sm90p4x" (the pipelined kernels with 128-key tiles, flash_fwd4:
//     two warpgroups in lockstep at both head sizes, or three warpgroups
//     and 192 query rows per block at head size 64 and ping-pong at 128).
//     SPILL_FLASH_FWD=sm90wsp, sm90ws or sm90wsk takes the
//     warp-specialised kernels (flash_fwd5, sm90wsKernels:
//     flash_fwd_sm90p with a producer warpgroup beside two or three
//     others, which copies the K and V tiles on the bulk copy engine
//     through a tensor map of qkv and hands them over through mbarriers,
//     so that the others neither copy nor meet a block barrier in the
//     loop; the producer gives its registers to them with setmaxnreg;
//     sm90ws 128-key tiles, sm90wsk 64-key tiles and three warpgroups at
//     head size 64, sm90wsp sm90ws with the two warpgroups taking turns
//     at issuing their products). They need a CUDA 12 build
//     (cuTensorMapEncodeTiled) and their own self-check
//     (Backend.flashSM90WSErr, run at Open unless SPILL_FLASH_FWD selects
//     another forward); without either they fall back to "sm90p"'s.
//     On the H100 beside the sm90p kernels, same call
//     (tools/bench/results/attn_ws_h100.json), sm90wsp ran the forward
//     1.04/1.08/1.13/1.15x faster at head size 64 and 1.27/1.22/1.20/1.18x
//     at 128 (T 1k/2k/4k/8k); sm90ws was level with it at 128 and
//     0.92-0.96x sm90p at 64, sm90wsk 0.94-1.07x and 1.06-1.14x.
//     SPILL_FLASH_FWD=mma (or 1) keeps the mma.sync kernels.
// The pipelined kernels are the default since their tiles are swizzled:
// on the H100 (tools/bench/results/attn_swizzle_h100.json) they ran
// 1.24-1.63x faster than the mma.sync forward at head sizes 64 and 128,
// T 1024-8192; unswizzled they were level with it (0.94-1.01x), Nsight
// Compute counting 69% of their shared wavefronts excessive (the tensor
// cores' reads of the unswizzled tiles). The unpipelined kernels, which
// read unswizzled tiles, ran 1.25-1.28x slower than the mma.sync ones on
// the H200 (attn_variants_h200.json) and stay opt-in.
// The pipelined kernels are launched persistent where that pays
// (flashGridX, sm90Grid): fewer blocks per head than query blocks, each
// taking several in turn with its copies running on from one to the next,
// so that a query block's first tiles and Q arrive under the previous
// one's work instead of while the multiprocessor waits (and the launch
// of a block per query block is gone). On the H100 that made the
// forward 1.03-1.09x faster at head sizes 64 and 128, T 1024-8192
// (attn_persist_h100.json); SPILL_FLASH_PERSIST=0 launches one block per
// query block (flashPersistent).
// The backward has Hopper kernels of its own (below), selected apart.

// flashSM90Module is the embedded PTX of the Hopper forward.
const flashSM90Module = "ptx/flashattn_sm90.ptx"

// errNoSM90 is flashSM90Err on a device whose compute capability is not 9.x.
var errNoSM90 = errors.New("not a compute capability 9.x device")

// errWSUnselected is flashSM90WSErr when SPILL_FLASH_FWD selected
// another forward at start-up: the kernels with a producer warpgroup are
// then not self-checked at Open.
var errWSUnselected = errors.New("SPILL_FLASH_FWD selects another forward (not sm90wsp, sm90ws or sm90wsk), so not self-checked")

// sm90wsDefault is the SPILL_FLASH_FWD value an unset one stands for
// among the kernels with a producer warpgroup.
const sm90wsDefault = "sm90wsp"

// sm90wsSel is the flash_fwd5 kernel that SPILL_FLASH_FWD (flashFwdEnv;
// unset: sm90wsDefault) selects at head size hs, false when it selects
// none.
func sm90wsSel(hs int) (sm90wsKernel, bool) {
	v := flashFwdEnv
	if v == "" {
		v = sm90wsDefault
	}
	return sm90wsOf(hs, v)
}

var flashSM90 = flashFwdEnv == "sm90" || flashFwdEnv == "sm90x1" || flashSM90p

// flashSM90p selects the pipelined Hopper kernels (the default:
// SPILL_FLASH_FWD unset or sm90p, or sm90px1 for their 64-row versions,
// flashSM90x2 cleared).
var flashSM90p = flashSM90pOf(flashFwdEnv)

// flashSM90pOf reports whether SPILL_FLASH_FWD=v selects the pipelined
// Hopper forward.
func flashSM90pOf(v string) bool {
	return v == "" || v == "sm90p" || v == "sm90px1" || v == "sm90p3" || v == "sm90p4" || v == "sm90p4x" ||
		isSM90WS(v)
}

// isSM90WS reports whether SPILL_FLASH_FWD=v selects the kernels with a
// producer warpgroup (sm90wsKernels).
func isSM90WS(v string) bool {
	_, ok := sm90wsOf(64, v)
	return ok
}

// flashFwdEnv is SPILL_FLASH_FWD at start-up.
var flashFwdEnv = os.Getenv("SPILL_FLASH_FWD")

// flashTMA holds the keys per tile of each flash_fwd5 kernel (kfunc keys,
// int values; set when a module loads, read by flashJob, which passes
// those kernels the tensor map of qkv).
var flashTMA sync.Map

// flashSM90p4 selects, among the pipelined Hopper kernels of 128 query
// rows or more per block, those with 128-key tiles (flash_fwd4):
// sm90p4Auto (SPILL_FLASH_FWD unset or sm90p, the default) the ping-pong
// flash_fwd4p kernel at head size 128 and the 64-key flash_fwd3 kernel at
// 64, sm90p4None (sm90p3) the flash_fwd3 kernels at both, sm90p4Pair
// (sm90p4) or sm90p4Wide (sm90p4x) those flash_fwd4 kernels at both. On
// the H100 (tools/bench/results/attn_fwd4_h100.json) the ping-pong
// 128-key kernel ran the head-size-128 forward 1.08-1.19x faster than
// flash_fwd3 at T 1024-8192; at head size 64 every flash_fwd4 kernel ran
// slower (0.83-0.91x lockstep, 0.63-0.82x three warpgroups, which spill).
var flashSM90p4 = map[string]int{"sm90p3": sm90p4None, "sm90p4": sm90p4Pair,
	"sm90p4x": sm90p4Wide}[flashFwdEnv]

// sm90p4Sel is flashSM90p4 at head size hs, sm90p4Auto resolved.
func sm90p4Sel(hs int) int {
	if flashSM90p4 != sm90p4Auto {
		return flashSM90p4
	}
	if hs == 128 {
		return sm90p4Wide
	}
	return sm90p4None
}

// flashSM90pName is the pipelined Hopper forward of head size hs (128
// query rows per block, 256 threads).
func flashSM90pName(hs int) string {
	if hs == 64 {
		return "flash_fwd3_sm90_bf16_hs64"
	}
	return "flash_fwd3_sm90_bf16_hs128"
}

// flashSM90px1Name is the pipelined Hopper forward of head size hs with
// one warpgroup (64 query rows per block, 128 threads).
func flashSM90px1Name(hs int) string {
	if hs == 64 {
		return "flash_fwd3x1_sm90_bf16_hs64"
	}
	return "flash_fwd3x1_sm90_bf16_hs128"
}

// flashSM90x2 selects the Hopper kernels with flashRows2 (128) query rows
// per block (SPILL_FLASH_FWD=sm90 or sm90p; sm90x1 or sm90px1 at start-up
// clears it).
var flashSM90x2 = flashFwdEnv != "sm90x1" && flashFwdEnv != "sm90px1"

// flashSM90x2Name is the Hopper forward of head size hs with 128 query rows
// per block.
func flashSM90x2Name(hs int) string {
	if hs == 64 {
		return "flash_fwd2_sm90_bf16_hs64"
	}
	return "flash_fwd2_sm90_bf16_hs128"
}

// flashWide holds the block size, in threads, of the flash kernels
// launched with more than one warpgroup (kfunc keys, int values; set when
// a module loads, read by flashJob).
var flashWide sync.Map

// flashShared holds the dynamic shared memory, in bytes, of the flash
// forward kernels that take some (kfunc keys, int values; set when a
// module loads, read by flashJob).
var flashShared sync.Map

// flashBlockThreads is the block size of flash kernel fn.
func flashBlockThreads(fn kfunc) int {
	if n, ok := flashWide.Load(fn); ok {
		return n.(int)
	}
	return flashThreads
}

// flashSM90Launches counts the forward calls that took the Hopper kernel
// (not the self-check), for tests.
var flashSM90Launches atomic.Int64

// flashSM90Name is the Hopper forward kernel of head size hs (64 or 128).
func flashSM90Name(hs int) string {
	if hs == 64 {
		return "flash_fwd_sm90_bf16_hs64"
	}
	return "flash_fwd_sm90_bf16_hs128"
}

// loadFlashSM90 loads the Hopper module src (file f) on a compute
// capability 9.x device and adds its entry points; otherwise, or when the
// load fails, it sets b.flashSM90Err and adds nothing. Called by
// loadModules on a context goroutine.
func (b *Backend) loadFlashSM90(f, src string) {
	major, err := b.dev.Attribute(cu.ComputeCapabilityMajor)
	if err != nil {
		b.flashSM90Err = fmt.Errorf("compute capability: %w", err)
		return
	}
	if major != 9 {
		minor, _ := b.dev.Attribute(cu.ComputeCapabilityMinor)
		b.flashSM90Err = fmt.Errorf("%w (%d.%d)", errNoSM90, major, minor)
		return
	}
	fns, err := b.loadModule(f, src)
	if err != nil {
		b.flashSM90Err = err
		return
	}
	for _, name := range []string{flashSM90x2Name(128), flashSM90pName(64), flashSM90pName(128)} {
		if fn, ok := fns[name]; ok {
			flashWide.Store(fn, 2*flashThreads)
		}
	}
	sms, err := b.dev.Attribute(cu.MultiprocessorCount)
	if err != nil {
		b.flashSM90Err = fmt.Errorf("multiprocessor count: %w", err)
		return
	}
	// The pipelined kernels (flash_fwd_sm90p): dynamic shared memory, and
	// what sm90Grid needs to launch them persistent.
	type pipelined struct {
		name                string
		smem, threads, keys int
	}
	shared := []pipelined{{flashSM90pName(64), sm90FwdPSmem(64, sm90FwdPDepth(64)), 2 * flashThreads, 64},
		{flashSM90pName(128), sm90FwdPSmem(128, sm90FwdPDepth(128)), 2 * flashThreads, 64},
		{flashSM90px1Name(64), sm90FwdPSmem(64, sm90FwdPx1Depth), flashThreads, 64},
		{flashSM90px1Name(128), sm90FwdPSmem(128, sm90FwdPx1Depth), flashThreads, 64}}
	for _, k := range sm90p4Kernels {
		if fn, ok := fns[k.name]; ok {
			flashWide.Store(fn, k.threads)
		}
		shared = append(shared, pipelined{k.name, k.smem, k.threads, 128})
	}
	for _, k := range sm90wsKernels {
		if fn, ok := fns[k.name]; ok {
			flashWide.Store(fn, k.threads)
			flashTMA.Store(fn, k.bk)
		}
		shared = append(shared, pipelined{k.name, k.smem, k.threads, k.bk})
	}
	for _, k := range shared {
		fn, ok := fns[k.name]
		if !ok {
			continue // checkFlashSM90 reports it
		}
		if err := setMaxDynamicShared(fn, k.smem); err != nil {
			b.flashSM90Err = fmt.Errorf("%s: %d bytes of dynamic shared memory: %w", k.name, k.smem, err)
			return
		}
		flashShared.Store(fn, k.smem)
		perSM, err := blocksPerSM(fn, k.threads, k.smem)
		if err != nil || perSM < 1 {
			b.flashSM90Err = fmt.Errorf("%s: blocks per multiprocessor (%d threads, %d bytes of shared memory): %d, %v",
				k.name, k.threads, k.smem, perSM, err)
			return
		}
		flashPipelined.Store(fn, sm90Pipelined{keys: k.keys, sms: sms, perSM: perSM})
	}
	maps.Copy(b.fns, fns)
}

// sm90Pipelined is what sm90Grid needs of a pipelined Hopper forward
// kernel: its keys per tile, and the device's multiprocessors and how
// many of its blocks each keeps resident.
type sm90Pipelined struct{ keys, sms, perSM int }

// flashPipelined holds the sm90Pipelined of each pipelined Hopper forward
// kernel (kfunc keys; set when a module loads, read by flashGridX).
var flashPipelined sync.Map

// flashPersistent lets flashGridX launch the pipelined Hopper forward
// persistent (sm90Grid); SPILL_FLASH_PERSIST=0 turns it off. The kernels
// give the same bits either way (TestAttentionFlashSM90).
var flashPersistent = os.Getenv("SPILL_FLASH_PERSIST") != "0"

// sm90GridSMs, when above 0, stands for the device's multiprocessor count
// in flashGridX (tests: a small value makes small problems persistent).
var sm90GridSMs int

// flashGridXForce, when above 0, is the blocks a head that a persistent
// launch takes in place of sm90Grid's choice (at most the query blocks):
// SPILL_FLASH_GRIDX=N, for measuring the grid's cost model on a device.
// Values that are not positive integers leave sm90Grid's choice.
var flashGridXForce = func() int {
	n, err := strconv.Atoi(os.Getenv("SPILL_FLASH_GRIDX"))
	if err != nil || n < 1 {
		return 0
	}
	return n
}()

// flashGridX is gridDim.x of flash forward kernel fn for T query rows in
// blocks of rows and z heads: sm90Grid's for a pipelined Hopper kernel
// while flashPersistent holds, else one block per query block.
func flashGridX(fn kfunc, rows, T, z int) int {
	if flashPersistent {
		if v, ok := flashPipelined.Load(fn); ok {
			if flashGridXForce > 0 {
				return min(flashGridXForce, (T+rows-1)/rows)
			}
			k := v.(sm90Pipelined)
			sms := k.sms
			if sm90GridSMs > 0 {
				sms = sm90GridSMs
			}
			return sm90GridMemo(T, rows, k.keys, z, sms, k.perSM)
		}
	}
	return (T + rows - 1) / rows
}

// useFlashSM90 returns the Hopper kernel that forward calls of head size
// hs take and its query rows per block, or false when they take none
// (flashFunc's choice, dtype and alignment aside).
func (b *Backend) useFlashSM90(hs int) (kfunc, int, bool) {
	if !flashSM90 || b.flashSM90Err != nil || (hs != 64 && hs != 128) {
		return 0, 0, false
	}
	if k, ok := sm90wsSel(hs); ok && b.flashSM90WSErr == nil {
		fn, ok := b.fns[k.name]
		return fn, k.rows, ok
	}
	if sel := sm90p4Sel(hs); flashSM90p && flashSM90x2 && sel > 0 {
		k := sm90p4Of(hs, sel)
		fn, ok := b.fns[k.name]
		return fn, k.rows, ok
	}
	if flashSM90p && flashSM90x2 {
		fn, ok := b.fns[flashSM90pName(hs)]
		return fn, flashRows2, ok
	}
	if flashSM90p {
		fn, ok := b.fns[flashSM90px1Name(hs)]
		return fn, flashRows, ok
	}
	if flashSM90x2 {
		fn, ok := b.fns[flashSM90x2Name(hs)]
		return fn, flashRows2, ok
	}
	fn, ok := b.fns[flashSM90Name(hs)]
	return fn, flashRows, ok
}

// countFlashSM90 counts a forward launch of fn and reports true when fn is
// a Hopper kernel.
func (b *Backend) countFlashSM90(fn kfunc) bool {
	for _, k := range sm90wsKernels {
		if f, ok := b.fns[k.name]; ok && f == fn {
			flashSM90Launches.Add(1)
			return true
		}
	}
	for _, name := range []string{flashSM90Name(64), flashSM90Name(128), flashSM90x2Name(64), flashSM90x2Name(128),
		flashSM90pName(64), flashSM90pName(128), flashSM90px1Name(64), flashSM90px1Name(128),
		sm90p4Kernels[0].name, sm90p4Kernels[1].name, sm90p4Kernels[2].name, sm90p4Kernels[3].name} {
		if f, ok := b.fns[name]; ok && f == fn {
			flashSM90Launches.Add(1)
			return true
		}
	}
	return false
}

// checkFlashSM90 runs the Hopper kernels beside the row-wise kernel
// (checkFlashShape) on problems with partial tiles: T 80 (two key tiles,
// the second partial) and T 200 (several query blocks, the last partial),
// and sets b.flashSM90Err when one fails. Called on a context goroutine at
// Open after checkFlash, when the module loaded.
func (b *Backend) checkFlashSM90() {
	if b.flashSM90Err != nil {
		return
	}
	const B, NH = 2, 2
	type checked struct {
		name     string
		hs, rows int
	}
	all := []checked{{flashSM90Name(64), 64, flashRows}, {flashSM90Name(128), 128, flashRows}, {flashSM90x2Name(64), 64, flashRows2},
		{flashSM90x2Name(128), 128, flashRows2}, {flashSM90pName(64), 64, flashRows2}, {flashSM90pName(128), 128, flashRows2},
		{flashSM90px1Name(64), 64, flashRows}, {flashSM90px1Name(128), 128, flashRows}}
	for _, sel := range []int{sm90p4Pair, sm90p4Wide} {
		for _, hs := range []int{64, 128} {
			k := sm90p4Of(hs, sel)
			all = append(all, checked{k.name, hs, k.rows})
		}
	}
	check := func(k checked) error {
		fn, ok := b.fns[k.name]
		if !ok {
			return fmt.Errorf("kernel %s missing from the embedded PTX", k.name)
		}
		for _, T := range []int{80, 200} {
			if err := b.checkFlashShape(fn, k.rows, B, T, NH*k.hs, NH); err != nil {
				return fmt.Errorf("%s self-check (B%d T%d C%d NH%d): %w", k.name, B, T, NH*k.hs, NH, err)
			}
		}
		return nil
	}
	for _, k := range all {
		if err := check(k); err != nil {
			b.flashSM90Err = err
			return
		}
	}
	if _, ok := sm90wsSel(64); !ok {
		b.flashSM90WSErr = errWSUnselected
		return
	}
	for _, k := range sm90wsKernels {
		if err := check(checked{k.name, k.hs, k.rows}); err != nil {
			b.flashSM90WSErr = err
			return
		}
	}
}

// The Hopper backward (flashattn_sm90.cu: flash_bwd_kv_sm90 and
// flash_bwd_q_sm90) computes what the split kernels do, with the same
// arguments and no atomics, on wgmma: one warpgroup per 64 keys (query
// rows), the block's own rows in shared memory as the A operand of Sᵀ and
// dPᵀ (S and dP), P and dS from the accumulators as register A fragments
// of dV and dK (dQ), every shared tile in the 128-byte swizzled layout. It
// is a split variant (flashBwdVariant) selected by SPILL_FLASH_BWD=sm90 (or
// unset: the default at head size 64 up to T 2048), sm90w for its dK, dV
// kernel warp-specialised (flash_bwd_kvw_sm90_*: a producer warpgroup
// copying K, V, Q and dO by bulk tensor copies, as sm90f1w's; the default
// at head size 128 up to T 1024, 1.05-1.10x sm90's speed there on the
// H100, attn_bwdws_h100.json; the same bits), or sm90p for the pipelined kernels (each tile's dV
// and dK, or dQ, run while the next tile's S and dP are issued), at head
// sizes 64 and 128 on a device whose Hopper module loaded and whose
// self-check at Open passed (checkFlashBwdSM90, Backend.flashBwdSM90Err);
// elsewhere those modes take split-smem. Every sum runs over the same k16
// steps in the same order as in the split kernels: on the H200 the results
// matched theirs bit for bit at every shape of TestFlashBwdFused (the test
// logs it), and they are as deterministic. Speed: unswizzled, on the H200
// (tools/bench/results/attn_bwd_sm90_h200.json), sm90 ran 0.91-1.05x
// split-smem's backward; swizzled, on the H100
// (tools/bench/results/attn_swizzle_h100.json), 1.56-1.80x at head sizes 64
// and 128, T 1024-8192, hence the default. sm90p ran slower than sm90 in
// both while ptxas serialized its wgmma (C7515: the last products' group
// outlived the loop iteration); with those products issued at the start
// of the next iteration instead (2789f45) ptxas no longer does, but at
// head size 64 it still ran 0.90-0.97x sm90's speed on the H100 (186
// registers and two blocks per SM, then 162 and three:
// tools/bench/results/attn_bwdpipe_h100.json), so it stays opt-in.

// flashBwdSM90Launches counts the backward calls that took the Hopper
// kernels.
var flashBwdSM90Launches atomic.Int64

// sm90BwdVariant is the Hopper backward of head size hs under mode, its
// kernels looked up; false when mode is not a Hopper one, hs is neither 64
// nor 128, or the kernels are not loaded. Self-check results aside.
func (b *Backend) sm90BwdVariant(hs int, mode string) (flashBwdVariant, bool) {
	if !isFlashBwdSM90(mode) || (hs != 64 && hs != 128) {
		return flashBwdVariant{}, false
	}
	kvName, qName := sm90BwdNames(hs, mode)
	kv, ok1 := b.fns[kvName]
	q, ok2 := b.fns[qName]
	if !ok1 || !ok2 {
		return flashBwdVariant{}, false
	}
	smem := sm90BwdSmem(hs)
	v := flashBwdVariant{kv: kv, q: q, mode: mode, rows: flashRows, threads: flashThreads, smemKV: smem, smemQ: smem,
		kvName: kvName, qName: qName}
	if mode == flashBwdSM90W { // f9_bwdws_smem: the mbarriers after f9_bwd_smem's
		v.smemKV, v.kvThreads, v.kvWS = smem+sm90BwdBarBytes, 2*flashThreads, true
	}
	return v, true
}

// checkFlashBwdSM90 allows each Hopper backward kernel its dynamic shared
// memory and checks it beside the row-wise kernels (checkFlashBwdShape) at
// T 80 and 200 (partial tiles, several blocks), and sets
// b.flashBwdSM90Err when one of sm90 and sm90p is missing or fails, and
// b.flashBwdSM90WErr for sm90w: the flash backward's or the Hopper
// module's error when those are off. Called on a context goroutine at
// Open after checkFlashBwd.
func (b *Backend) checkFlashBwdSM90() {
	b.flashBwdSM90Err = b.checkSM90BwdMode(flashBwdSM90)
	if b.flashBwdSM90Err == nil {
		b.flashBwdSM90Err = b.checkSM90BwdMode(flashBwdSM90P)
	}
	b.flashBwdSM90WErr = b.checkSM90BwdMode(flashBwdSM90W)
}

// checkSM90BwdMode is checkFlashBwdSM90's check of one mode.
func (b *Backend) checkSM90BwdMode(mode string) error {
	if b.flashBwdErr != nil {
		return b.flashBwdErr
	}
	prep := b.fns["flash_bwd_prep"]
	for _, hs := range []int{64, 128} {
		v, ok := b.sm90BwdVariant(hs, mode)
		if !ok {
			if b.flashSM90Err != nil {
				return b.flashSM90Err // the module did not load
			}
			kv, q := sm90BwdNames(hs, mode)
			return fmt.Errorf("kernel %s or %s missing from the embedded PTX", kv, q)
		}
		if v.kvWS && buildCUDAVersion() < 12000 {
			return errNoTensorMaps
		}
		for _, k := range []struct {
			fn   kfunc
			name string
			smem int
		}{{v.kv, v.kvName, v.smemKV}, {v.q, v.qName, v.smemQ}} {
			if err := setMaxDynamicShared(k.fn, k.smem); err != nil {
				return fmt.Errorf("%s: %d bytes of dynamic shared memory: %w", k.name, k.smem, err)
			}
		}
		const B, NH = 2, 2
		for _, T := range []int{80, 200} {
			if err := b.checkFlashBwdShape(flashBwd{prep: prep, v: v}, false, B, T, NH*hs, NH); err != nil {
				return fmt.Errorf("%s, %s self-check (B%d T%d C%d NH%d): %w", v.kvName, v.qName, B, T, NH*hs, NH, err)
			}
		}
	}
	return nil
}

// The fused Hopper backward (flashattn_sm90.cu: flash_bwd_fused_sm90_*,
// flash_bwd_kv_sm90 with DQ) is the fused path of flash.go on wgmma: one
// warpgroup per 64 keys walks the query tiles once, five products per
// tile (S, dP, dV, dK and dQ; the split pair does seven), dSᵀ through a
// shared tile that both dK and dQ read, dQ added to the float32
// accumulator with vector atomics and written into dqkv by flash_bwd_dq.
// dQ is not bitwise reproducible (its float32 sums follow the blocks'
// schedule); dK and dV are. SPILL_FLASH_BWD=sm90f2 takes its version
// with two warpgroups and 128 keys per block, sharing the streamed tiles,
// each warpgroup computing half of dQ's head dims over all 128 keys: half
// the atomic adds; SPILL_FLASH_BWD=sm90f2b that version with the block's
// dQ of each tile stored as a float32 shared tile and added to the
// accumulator by one bulk reduction (cp.reduce.async.bulk, the copy
// engine) instead of per-thread atomics (the tile stored in the order of
// the accumulators, a float4 a thread, and dq in 64-query tiles of that
// order, which flash_bwd_dqf writes into dqkv). On the H100, beside the split
// Hopper kernels (tools/bench/results/attn_fused2_h100.json, T 1k-8k),
// sm90f ran at 0.76-0.77x their speed (hs 64) and 0.74-0.80x (hs 128),
// sm90f2 at 0.81-0.95x and 0.88-1.08x, sm90f2b at 0.85-1.02x and
// 0.99-1.28x: sm90f2b is the default at head size 128 at T 1025-2048
// (flashBwdAuto). sm90f1b is sm90f with dQ by bulk reduction, three
// blocks per SM at head size 64, where it ran at 0.92-1.05x the split
// kernels' speed (T 1k-8k, attn_bwdpipe_h100.json). sm90f1w and sm90f2w
// (the defaults at head sizes 64 and 128 above T 2048, where they ran
// 1.02-1.05x and 1.00-1.10x sm90f1b's and sm90f2b's speed on the H100 in
// two calls: attn_bwdws_h100.json) are sm90f1b and sm90f2b
// warp-specialised (flashattn_sm90.cu's WS): a producer warpgroup more per
// block copies the K and V tiles once and every Q and dO tile by bulk
// tensor copies through tensor maps of qkv and dout (encoded when the job
// runs, as the forward's), stores the tiles' lse and D, and hands them
// over through mbarriers, so that the warpgroups neither copy nor wait for
// copies; off (errNoTensorMaps) in a build against CUDA 11 headers.
// Selected by SPILL_FLASH_BWD=sm90f, sm90f2, sm90f2b, sm90f1b, sm90f1w or
// sm90f2w (or unset, at head size 128 above T 1024 and 64 above T 2048)
// at head sizes 64 and 128 on a device whose Hopper
// module loaded and whose self-check of that mode at Open passed
// (checkFlashBwdFusedSM90, Backend.flashBwdFusedSM90Err); elsewhere, and
// for calls whose accumulator does not fit the scratch share, the default.

// errNoTensorMaps is the self-check result of the kernels that copy by
// bulk tensor copies in a build against CUDA headers older than 12.0,
// which cannot encode their tensor maps.
var errNoTensorMaps = errors.New("built against CUDA headers older than 12.0: no tensor maps")

// sm90Fused sets f's fused kernel to the fused Hopper backward of head
// size hs under mode (sm90f: one warpgroup and 64 keys per block, sm90f2:
// two and 128, sm90f2b and sm90f1b: sm90f2 and sm90f with dQ by bulk
// reduction, sm90f1w and sm90f2w: those warp-specialised) with
// flash_bwd_dq (with bulk dQ flash_bwd_dqf, the accumulator in tiles:
// f.fusedTiles), its shared memory and block, and reports true; false, f
// unchanged, when hs is neither 64 nor 128 or the kernels are not loaded.
// Self-check results aside.
func (b *Backend) sm90Fused(f *flashBwd, hs int, mode string) bool {
	if hs != 64 && hs != 128 {
		return false
	}
	m, ok := fusedSM90ModeOf(mode)
	if !ok {
		return false
	}
	fused, ok1 := b.fns[flashFusedName(hs, mode)]
	dqName, tiles := "flash_bwd_dq", 0
	if m.bulk {
		dqName, tiles = "flash_bwd_dqf", m.wg
	}
	dq, ok2 := b.fns[dqName]
	if !ok1 || !ok2 {
		return false
	}
	f.fused, f.dq, f.fusedSM90, f.fusedWS, f.fusedTiles = fused, dq, mode, m.ws, tiles
	f.fusedRows, f.fusedThreads, f.fusedSmem = m.shape(hs)
	return true
}

// checkFlashBwdFusedSM90 allows the fused Hopper kernels (each mode)
// their dynamic shared memory and checks them beside the row-wise kernels
// at T 80 and 200, as checkFlashBwdSM90 does the split ones, and sets
// b.flashBwdFusedSM90Err[mode] for every mode: nil, or why that mode's
// kernels are missing or failed. Called on a context goroutine at Open
// after checkFlashBwd.
func (b *Backend) checkFlashBwdFusedSM90() {
	b.flashBwdFusedSM90Err = make(map[string]error, len(fusedSM90Modes))
	for _, m := range fusedSM90Modes {
		b.flashBwdFusedSM90Err[m.mode] = b.checkFlashBwdFusedMode(m.mode)
	}
}

func (b *Backend) checkFlashBwdFusedMode(mode string) error {
	if b.flashBwdErr != nil {
		return b.flashBwdErr
	}
	prep := b.fns["flash_bwd_prep"]
	for _, hs := range []int{64, 128} {
		name := flashFusedName(hs, mode)
		f := flashBwd{prep: prep}
		if !b.sm90Fused(&f, hs, mode) {
			if b.flashSM90Err != nil {
				return b.flashSM90Err // the module did not load
			}
			return fmt.Errorf("kernel %s or its dQ kernel (flash_bwd_dq, flash_bwd_dqf) missing from the embedded PTX", name)
		}
		if f.fusedWS && buildCUDAVersion() < 12000 {
			return errNoTensorMaps
		}
		if err := setMaxDynamicShared(f.fused, f.fusedSmem); err != nil {
			return fmt.Errorf("%s: %d bytes of dynamic shared memory: %w", name, f.fusedSmem, err)
		}
		const B, NH = 2, 2
		for _, T := range []int{80, 200} {
			if err := b.checkFlashBwdShape(f, true, B, T, NH*hs, NH); err != nil {
				return fmt.Errorf("%s self-check (B%d T%d C%d NH%d): %w", name, B, T, NH*hs, NH, err)
			}
		}
	}
	return nil
}
