package cuda

// The shapes of the flash kernels that both the CUDA backend (cuda build
// tag) and its source checks need: block sizes, the Hopper forwards' ring
// depths and shared memory, and the flash_fwd4 kernels' table. Untagged,
// so that TestSM90FwdDepths holds them to kernels/flashattn_sm90.cu in
// every build, CI's included.

// flashRows is the number of query rows per block of the flash kernel;
// flashThreads its block size.
const (
	flashRows    = 64
	flashThreads = 128
)

// flashRows2 is the query rows per block of the two-tile forwards and of
// the pipelined Hopper forwards (two warpgroups of 64).
const flashRows2 = 128

// The selections of flashSM90p4 (flash_sm90.go) among the pipelined
// Hopper forwards.
const (
	sm90p4None = -1 // the 64-key kernels
	sm90p4Auto = 0  // per head size
	sm90p4Pair = 1  // two warpgroups in lockstep, 128 rows per block
	sm90p4Wide = 2  // three warpgroups (192 rows) at head size 64, ping-pong at 128
)

// sm90p4Kernel is a flash_fwd4 kernel of flashattn_sm90.cu: its name,
// query rows and threads per block and dynamic shared memory (rings of
// depth 128-key tiles; F9_FWD4_D64 and F9_FWD4_D128 there).
type sm90p4Kernel struct {
	name                       string
	rows, threads, depth, smem int
}

// sm90p4Of is the flash_fwd4 kernel of head size hs (64 or 128) for
// selection sel (sm90p4Pair or sm90p4Wide).
func sm90p4Of(hs, sel int) sm90p4Kernel {
	depth := 3
	if hs == 64 {
		depth = 4
	}
	k := sm90p4Kernel{rows: flashRows2, threads: 2 * flashThreads, depth: depth, smem: sm90FwdPSmemBK(hs, depth, 128)}
	switch {
	case hs == 64 && sel == sm90p4Wide:
		k.name, k.rows, k.threads = "flash_fwd4w3_sm90_bf16_hs64", 3*flashRows, 3*flashThreads
	case hs == 64:
		k.name = "flash_fwd4_sm90_bf16_hs64"
	case sel == sm90p4Wide:
		k.name = "flash_fwd4p_sm90_bf16_hs128"
	default:
		k.name = "flash_fwd4_sm90_bf16_hs128"
	}
	return k
}

// sm90p4Kernels are the four flash_fwd4 kernels.
var sm90p4Kernels = []sm90p4Kernel{sm90p4Of(64, sm90p4Pair), sm90p4Of(128, sm90p4Pair), sm90p4Of(64, sm90p4Wide),
	sm90p4Of(128, sm90p4Wide)}

// sm90FwdPDepth is the depth of the key and value rings of
// flash_fwd3_sm90 at head size hs (F9_FWD3_D64 and F9_FWD3_D128 in
// flashattn_sm90.cu; a PTX built with smaller depths runs with the same
// allocation), sm90FwdPx1Depth that of flash_fwd3x1_sm90.
func sm90FwdPDepth(hs int) int {
	if hs == 64 {
		return 4
	}
	return 5
}

const sm90FwdPx1Depth = 2

// sm90FwdPSmem is f9_fwdp_smem<hs, depth>() of flashattn_sm90.cu: two
// rings of depth tiles of 64 rows of hs bf16, and 1024 bytes of room to
// align them for the 128-byte swizzle.
func sm90FwdPSmem(hs, depth int) int { return sm90FwdPSmemBK(hs, depth, 64) }

// sm90FwdPSmemBK is f9_fwdp_smem<hs, depth, bk>(): tiles of bk rows.
func sm90FwdPSmemBK(hs, depth, bk int) int { return 2*depth*bk*hs*2 + 1024 }

// sm90wsKernel is a flash_fwd5 kernel of flashattn_sm90.cu (the Hopper
// forward with a producer warpgroup copying the tiles on the bulk copy
// engine): the SPILL_FLASH_FWD value that selects it, its name, head size,
// query rows and threads per block, ring depth, keys per tile, whether its
// warpgroups take turns (PP) and its dynamic shared memory (f9_fwdws_smem:
// the rings and 256 bytes of mbarriers). The F9_FWD5 lines of the .cu hold
// the same (TestSM90WSKernels).
type sm90wsKernel struct {
	env, name                          string
	hs, rows, threads, depth, bk, smem int
	turns                              bool
}

func newSM90WS(env, name string, hs, wg, depth, bk int, turns bool) sm90wsKernel {
	return sm90wsKernel{env: env, name: name, hs: hs, rows: wg * flashRows, threads: (wg + 1) * flashThreads,
		depth: depth, bk: bk, smem: sm90FwdPSmemBK(hs, depth, bk) + 256, turns: turns}
}

// sm90wsKernels are the flash_fwd5 kernels, in the order of the F9_FWD5
// lines: sm90ws takes 128-key tiles and two warpgroups, sm90wsk 64-key
// tiles (three warpgroups at head size 64), sm90wsp sm90ws's with turns.
var sm90wsKernels = []sm90wsKernel{
	newSM90WS("sm90ws", "flash_fwd5_sm90_bf16_hs64", 64, 2, 4, 128, false),
	newSM90WS("sm90wsk", "flash_fwd5w3_sm90_bf16_hs64", 64, 3, 6, 64, false),
	newSM90WS("sm90wsp", "flash_fwd5p_sm90_bf16_hs64", 64, 2, 4, 128, true),
	newSM90WS("sm90ws", "flash_fwd5_sm90_bf16_hs128", 128, 2, 3, 128, false),
	newSM90WS("sm90wsk", "flash_fwd5k_sm90_bf16_hs128", 128, 2, 5, 64, false),
	newSM90WS("sm90wsp", "flash_fwd5p_sm90_bf16_hs128", 128, 2, 3, 128, true),
}

// sm90wsOf is the flash_fwd5 kernel of head size hs that SPILL_FLASH_FWD=v
// selects; false for values that select none.
func sm90wsOf(hs int, v string) (sm90wsKernel, bool) {
	for _, k := range sm90wsKernels {
		if k.env == v && k.hs == hs {
			return k, true
		}
	}
	return sm90wsKernel{}, false
}
