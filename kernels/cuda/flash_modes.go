package cuda

// The flash backward's modes (SPILL_FLASH_BWD, flash.go) and the default's
// choice among them by head size and sequence length. Untagged, so that
// their tests run in every build, CI's included.

// Flash backward implementations (flashBwdMode). flashBwdSM90 and
// flashBwdSM90P are the Hopper variants, flashBwdFusedSM90,
// flashBwdFused2SM90, flashBwdFused2BSM90 and flashBwdFused1BSM90 the
// fused Hopper backward (flash_sm90.go; one and two warpgroups per block,
// dQ by vector atomics or by one bulk reduction per tile),
// flashBwdFused1WSM90 and flashBwdFused2WSM90 flashBwdFused1BSM90 and
// flashBwdFused2BSM90 warp-specialised (a producer warpgroup copying the
// tiles by bulk tensor copies).
const (
	flashBwdAuto        = "auto"
	flashBwdFused       = "fused"
	flashBwdSplit       = "split"
	flashBwdSplitSM     = "split-smem"
	flashBwdSM90        = "sm90"
	flashBwdSM90P       = "sm90p"
	flashBwdSM90W       = "sm90w"
	flashBwdFusedSM90   = "sm90f"
	flashBwdFused2SM90  = "sm90f2"
	flashBwdFused2BSM90 = "sm90f2b"
	flashBwdFused1BSM90 = "sm90f1b"
	flashBwdFused1WSM90 = "sm90f1w"
	flashBwdFused2WSM90 = "sm90f2w"
)

// flashBwdModeOf is the mode SPILL_FLASH_BWD=v selects: v itself when it
// names one, flashBwdAuto otherwise.
func flashBwdModeOf(v string) string {
	switch v {
	case flashBwdFused, flashBwdSplit, flashBwdSplitSM, flashBwdSM90, flashBwdSM90P, flashBwdSM90W:
		return v
	}
	if isFusedSM90(v) {
		return v
	}
	return flashBwdAuto
}

// flashBwdModeAt is mode at head size hs and sequence length T:
// flashBwdAuto is a fused Hopper backward with dQ by bulk reduction (not
// bitwise reproducible) at the long sequences, where it beat the split
// Hopper kernels, and those (deterministic) elsewhere: at head size 128
// above flashFused128WST the two-warpgroup one warp-specialised
// (sm90f2w), above flashFused128MinT the two-warpgroup one (sm90f2b), and
// up to it the split kernels with the warp-specialised dK, dV kernel
// (sm90w); at head size 64 above flashFused64MinT the one-warpgroup one
// warp-specialised (sm90f1w). It falls back to the split kernels where the
// fused one does not apply (and the Backend to wsFallback's mode where a
// warp-specialised one is off). Other modes are themselves. On the H100
// (tools/bench/results/attn_bwdpipe_h100.json): at 2789f45 the split
// kernels took 0.692 ms at hs128 T1024 against sm90f2b's 0.762, and
// sm90f2b 0.97x the split kernels' time at T 2048 and 0.82-0.90x at
// 4096-8192; at f6cc900 sm90f1b took 1.08x and 1.02x the split kernels'
// time at hs64 T 1024 and 2048, 0.97x and 0.95x at 4096 and 8192. At
// aa921cf (attn_bwdws_h100.json, one call): sm90w 0.654 ms against sm90's
// 0.723 at hs128 T1024; sm90f2w 1.182/1.852/3.291 ms against sm90f2b's
// 1.119/2.039/3.442 at T 2048/4096/8192; sm90f1w 0.96x/0.96x sm90f1b's
// time at hs64 T 4096/8192.
func flashBwdModeAt(hs, T int, mode string) string {
	switch {
	case mode != flashBwdAuto:
		return mode
	case hs == 128 && T > flashFused128WST:
		return flashBwdFused2WSM90
	case hs == 128 && T > flashFused128MinT:
		return flashBwdFused2BSM90
	case hs == 128:
		return flashBwdSM90W
	case hs == 64 && T > flashFused64MinT:
		return flashBwdFused1WSM90
	}
	return flashBwdSM90
}

// flashFused128MinT and flashFused64MinT are the sequence lengths up to
// which the default backward takes the split Hopper kernels at head sizes
// 128 and 64, flashFused128WST the one above which it takes the
// warp-specialised fused kernel at 128 (flashBwdModeAt).
const (
	flashFused128MinT = 1024
	flashFused128WST  = 2048
	flashFused64MinT  = 2048
)

// wsFallback is the mode that takes the place of mode when mode's
// warp-specialised kernels are off (their self-check failed, or the build
// has no tensor maps): the same kernels without the producer warpgroup.
// Other modes are themselves.
func wsFallback(mode string) string {
	switch mode {
	case flashBwdSM90W:
		return flashBwdSM90
	case flashBwdFused1WSM90:
		return flashBwdFused1BSM90
	case flashBwdFused2WSM90:
		return flashBwdFused2BSM90
	}
	return mode
}

// sm90BwdSmem is f9_bwd_smem<hs>() of flashattn_sm90.cu: the dynamic
// shared memory of both Hopper backward kernels, six tiles of 64 rows of
// hs bf16, four rows of 64 floats and 1024 bytes of room to align the
// tiles for the 128-byte swizzle.
func sm90BwdSmem(hs int) int { return 6*64*hs*2 + 4*64*4 + 1024 }

// sm90BwdNames are the Hopper backward kernels of head size hs (64 or 128)
// under mode; constants, so that a call formats nothing.
func sm90BwdNames(hs int, mode string) (kv, q string) {
	switch {
	case hs == 64 && mode == flashBwdSM90W:
		return "flash_bwd_kvw_sm90_bf16_hs64", "flash_bwd_q_sm90_bf16_hs64"
	case mode == flashBwdSM90W:
		return "flash_bwd_kvw_sm90_bf16_hs128", "flash_bwd_q_sm90_bf16_hs128"
	case hs == 64 && mode == flashBwdSM90:
		return "flash_bwd_kv_sm90_bf16_hs64", "flash_bwd_q_sm90_bf16_hs64"
	case hs == 64:
		return "flash_bwd_kv_sm90p_bf16_hs64", "flash_bwd_q_sm90p_bf16_hs64"
	case mode == flashBwdSM90:
		return "flash_bwd_kv_sm90_bf16_hs128", "flash_bwd_q_sm90_bf16_hs128"
	}
	return "flash_bwd_kv_sm90p_bf16_hs128", "flash_bwd_q_sm90p_bf16_hs128"
}

// isFlashBwdVariant says mode takes a split variant: split-smem, or a
// Hopper one (which falls back to split-smem where it has no kernels).
func isFlashBwdVariant(mode string) bool { return mode == flashBwdSplitSM || isFlashBwdSM90(mode) }

// isFlashBwdSM90 says mode is a Hopper split backward (sm90w: sm90 with
// the dK, dV kernel warp-specialised).
func isFlashBwdSM90(mode string) bool {
	return mode == flashBwdSM90 || mode == flashBwdSM90P || mode == flashBwdSM90W
}

// fusedSM90Mode is one mode of the fused Hopper backward: the shape of its
// kernels, which f9_bwd_smem and the kernels' template arguments in
// flashattn_sm90.cu must match.
type fusedSM90Mode struct {
	mode  string    // the SPILL_FLASH_BWD value
	names [2]string // the kernels at head sizes 64 and 128
	wg    int       // warpgroups per block, each 64 keys
	bulk  bool      // dQ by one bulk reduction per tile, not atomics
	ws    bool      // a producer warpgroup more, two tensor maps as the last argument
}

// fusedSM90Modes are the fused Hopper backward's modes, the one table of
// their kernels and shapes.
var fusedSM90Modes = []fusedSM90Mode{
	{flashBwdFusedSM90, [2]string{"flash_bwd_fused_sm90_bf16_hs64", "flash_bwd_fused_sm90_bf16_hs128"}, 1, false, false},
	{flashBwdFused2SM90, [2]string{"flash_bwd_fused2_sm90_bf16_hs64", "flash_bwd_fused2_sm90_bf16_hs128"}, 2, false, false},
	{flashBwdFused2BSM90, [2]string{"flash_bwd_fused2b_sm90_bf16_hs64", "flash_bwd_fused2b_sm90_bf16_hs128"}, 2, true, false},
	{flashBwdFused1BSM90, [2]string{"flash_bwd_fused1b_sm90_bf16_hs64", "flash_bwd_fused1b_sm90_bf16_hs128"}, 1, true, false},
	{flashBwdFused1WSM90, [2]string{"flash_bwd_fused1w_sm90_bf16_hs64", "flash_bwd_fused1w_sm90_bf16_hs128"}, 1, true, true},
	{flashBwdFused2WSM90, [2]string{"flash_bwd_fused2w_sm90_bf16_hs64", "flash_bwd_fused2w_sm90_bf16_hs128"}, 2, true, true},
}

// sm90FusedSmem is f9_bwd_smem<hs, true, wg, bulk>() of flashattn_sm90.cu
// (f9_bwdws_smem with ws): the Hopper backward's shared memory with wg K
// and V tiles, wg 64x64 bf16 tiles of dSᵀ, with bulk the 64 x hs float32
// tile of dQ, and with ws the five mbarriers' 64 bytes.
func sm90FusedSmem(hs, wg int, bulk, ws bool) int {
	n := (2*wg+4)*64*hs*2 + wg*64*64*2 + 4*64*4 + 1024
	if bulk {
		n += 64 * hs * 4
	}
	if ws {
		n += sm90BwdBarBytes
	}
	return n
}

// sm90BwdBarBytes is the shared memory the warp-specialised backward
// kernels add for their mbarriers (f9_bwdws_smem's 64 bytes: five of 8).
const sm90BwdBarBytes = 64

// shape is the launch of m's kernel of head size hs: keys per block,
// threads per block (with ws the producer warpgroup's too) and dynamic
// shared memory.
func (m fusedSM90Mode) shape(hs int) (rows, threads, smem int) {
	rows, threads = m.wg*flashRows, m.wg*flashThreads
	if m.ws {
		threads += flashThreads
	}
	return rows, threads, sm90FusedSmem(hs, m.wg, m.bulk, m.ws)
}

// fusedSM90ModeOf is mode's entry of fusedSM90Modes; false when mode is
// not a fused Hopper backward.
func fusedSM90ModeOf(mode string) (fusedSM90Mode, bool) {
	for _, m := range fusedSM90Modes {
		if m.mode == mode {
			return m, true
		}
	}
	return fusedSM90Mode{}, false
}

// isFusedSM90 says mode is a fused Hopper backward.
func isFusedSM90(mode string) bool {
	_, ok := fusedSM90ModeOf(mode)
	return ok
}
