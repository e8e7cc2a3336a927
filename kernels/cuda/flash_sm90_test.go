//go:build cuda

package cuda

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/spill-ml/spill/kernels"
)

// TestAttentionFlashSM90 checks the Hopper forward (flash_sm90.go) in a
// chain: the CPU backend, the mma.sync flash kernel (SPILL_FLASH_FWD=mma's
// choice) against it, the Hopper kernels (128 and 64 query rows per
// block) against it, and each Hopper kernel and the mma.sync one against each other on the same inputs, with poisoned outputs, at head
// sizes 64 and 128, multi-head and grouped-query, T of 1, 65, 200 and 1000
// (partial query blocks and key tiles), asserting that the Hopper kernel
// ran; the default kernel also persistent (several query blocks a block),
// bit for bit against one query block per block; the same for the kernels
// with a producer warpgroup (sm90ws, sm90wsk, sm90wsp), which must have passed their
// self-check. Skipped on a device whose compute capability is not 9.x.
func TestAttentionFlashSM90(t *testing.T) {
	defer func(impl int, h, x2, pp bool, p4 int, pers bool, sms int, env string) {
		attnImpl, flashSM90, flashSM90x2, flashSM90p, flashSM90p4 = impl, h, x2, pp, p4
		flashPersistent, sm90GridSMs, flashFwdEnv = pers, sms, env
	}(attnImpl, flashSM90, flashSM90x2, flashSM90p, flashSM90p4, flashPersistent, sm90GridSMs, flashFwdEnv)
	attnImpl = attnFlash
	p := openPair(t)
	gb := p.g.(*Backend)
	if errors.Is(gb.flashSM90Err, errNoSM90) {
		t.Skipf("Hopper forward not checked: %v", gb.flashSM90Err)
	}
	if gb.flashSM90Err != nil {
		t.Fatalf("Hopper forward off: %v", gb.flashSM90Err)
	}
	if gb.flashErr != nil {
		t.Fatalf("flash self-check at Open: %v", gb.flashErr)
	}
	wsEnvs := []string{"sm90ws", "sm90wsk", "sm90wsp"}
	switch err := gb.flashSM90WSErr; {
	case errors.Is(err, errWSUnselected):
		t.Logf("Hopper forwards with a producer warpgroup not checked: %v", err)
		wsEnvs = nil
	case err != nil:
		t.Fatalf("Hopper forward with a producer warpgroup off: %v", err)
	}
	flashFwdEnv = ""
	type shape struct{ B, T, NH, NKV, hs int }
	var shapes []shape
	for _, hs := range []int{64, 128} {
		for _, T := range []int{1, 65, 200, 1000} {
			B := 1
			if T <= 65 {
				B = 2
			}
			shapes = append(shapes, shape{B, T, 2, 2, hs}) // multi-head
			if hs == 64 {
				shapes = append(shapes, shape{B, T, 4, 2, hs}) // groups of 2
			} else {
				shapes = append(shapes, shape{B, T, 3, 1, hs}) // multi-query
			}
		}
	}
	for _, sh := range shapes {
		B, T, NH, NKV, hs := sh.B, sh.T, sh.NH, sh.NKV, sh.hs
		name := fmt.Sprintf("B%d,T%d,NH%d,NKV%d,hs%d", B, T, NH, NKV, hs)
		W, C := kernels.GQAWidth(NH, NKV, hs), NH*hs
		qkv := p.random(kernels.BF16, B*T*W, 2)
		fwd := func(out, lse tp) {
			p.both(func(b kernels.Backend, q kernels.Queue, s func(tp) kernels.Tensor) {
				llama(b).GQAttentionForward(q, s(out), s(lse), s(qkv), B, T, NH, NKV, hs)
			})
		}
		// The mma.sync kernel against the CPU.
		flashSM90 = false
		outM, lseM := p.poison(kernels.BF16, B*T*C), p.poison(kernels.F32, B*NH*T)
		n0 := flashSM90Launches.Load()
		fwd(outM, lseM)
		if flashSM90Launches.Load() != n0 {
			t.Errorf("%s: the Hopper kernel ran with flashSM90 off", name)
		}
		p.check(name+"/mma/out", outM, 1)
		p.check(name+"/mma/lse", lseM, 2)
		// The Hopper kernels against the CPU, then against the mma.sync
		// kernel: 128 query rows per block, 64, the pipelined kernels
		// with 128 (the default, per head size; sm90p3, 64-key tiles at
		// both) and 64 (sm90px1), and those with 128-key tiles (sm90p4,
		// sm90p4x: 192 rows at head size 64).
		flashSM90 = true
		type variant struct {
			x2, p bool
			p4    int
			env   string
		}
		// env "sm90p" keeps the kernels before the producer warpgroup's
		// (the fallback), "" the default.
		variants := []variant{{true, false, 0, "sm90p"}, {false, false, 0, "sm90p"}, {true, true, sm90p4Auto, "sm90p"},
			{true, true, sm90p4None, "sm90p"}, {false, true, 0, "sm90p"}, {true, true, sm90p4Pair, "sm90p"},
			{true, true, sm90p4Wide, "sm90p"}}
		for _, env := range wsEnvs {
			variants = append(variants, variant{true, true, sm90p4Auto, env})
		}
		if wsEnvs != nil {
			variants = append(variants, variant{true, true, sm90p4Auto, ""})
		}
		for _, v := range variants {
			flashSM90x2, flashSM90p, flashSM90p4, flashFwdEnv = v.x2, v.p, v.p4, v.env
			vname := fmt.Sprintf("%s/sm90-x2=%v-p=%v-p4=%d%s", name, v.x2, v.p, v.p4, v.env)
			env := v.env
			if env == "" {
				env = "sm90wsp" // the default
			}
			if k, ok := sm90wsOf(hs, env); ok {
				if fn, _, _ := gb.useFlashSM90(hs); fn != gb.fns[k.name] {
					t.Fatalf("%s: SPILL_FLASH_FWD=%q does not take %s", vname, v.env, k.name)
				}
			}
			out, lse := p.poison(kernels.BF16, B*T*C), p.poison(kernels.F32, B*NH*T)
			n0 = flashSM90Launches.Load()
			fwd(out, lse)
			if flashSM90Launches.Load() == n0 {
				t.Errorf("%s: the Hopper kernel did not run", vname)
			}
			p.check(vname+"/out", out, 1)
			p.check(vname+"/lse", lse, 2)
			for _, c := range []struct {
				name     string
				sm90, mm tp
				tol, e   float64
			}{{"out", out, outM, 2e-2, 1.6e-2}, {"lse", lse, lseM, 1e-3, 1e-4}} {
				a, _ := p.download(c.sm90)
				m, _ := p.download(c.mm)
				for i := range m {
					if g, w := float64(a[i]), float64(m[i]); !(math.Abs(g-w) <= c.tol+c.e*math.Abs(w)) {
						t.Errorf("%s/%s[%d]: Hopper kernel %g, mma.sync kernel %g", vname, c.name, i, g, w)
						break
					}
				}
			}
		}
		// The default pipelined kernel persistent: with sm90GridSMs 1 and 3
		// standing for the device, its blocks take several query blocks of
		// their head in turn (flashGridX below the query blocks with one
		// multiprocessor, asserted).
		// Against the CPU, and bit for bit against one query block per
		// block (each query block's arithmetic is the same either way).
		flashSM90x2, flashSM90p, flashSM90p4 = true, true, sm90p4Auto
		for _, env := range append([]string{"sm90p"}, wsEnvs...) {
			flashFwdEnv = env
			fn, rows, ok := gb.useFlashSM90(hs)
			if !ok {
				t.Fatalf("%s: no pipelined Hopper kernel", name)
			}
			flashPersistent, sm90GridSMs = false, 0
			ref, refL := p.poison(kernels.BF16, B*T*C), p.poison(kernels.F32, B*NH*T)
			fwd(ref, refL)
			flashPersistent = true
			for _, sms := range []int{1, 3} {
				sm90GridSMs = sms
				vname := fmt.Sprintf("%s/persistent-sms%d%s", name, sms, env)
				nq := (T + rows - 1) / rows
				// One multiprocessor always makes a grid of several query
				// blocks persistent; with three, sm90Grid may keep one query
				// block a block when fewer would leave slots idle.
				if X := flashGridX(fn, rows, T, B*NH); nq > 1 && sms == 1 && X >= nq {
					t.Errorf("%s: %d blocks a head for %d query blocks: not persistent", vname, X, nq)
				}
				out, lse := p.poison(kernels.BF16, B*T*C), p.poison(kernels.F32, B*NH*T)
				fwd(out, lse)
				p.check(vname+"/out", out, 1)
				p.check(vname+"/lse", lse, 2)
				for _, c := range []struct {
					name     string
					got, one tp
				}{{"out", out, ref}, {"lse", lse, refL}} {
					a, _ := p.download(c.got)
					m, _ := p.download(c.one)
					for i := range m {
						if a[i] != m[i] {
							t.Errorf("%s/%s[%d]: %g persistent, %g one query block per block", vname, c.name, i, a[i], m[i])
							break
						}
					}
				}
			}
			flashPersistent, sm90GridSMs = true, 0
		}
		flashFwdEnv = ""
	}
}

// TestAttentionKernelsSM90 checks that AttentionKernels names the Hopper
// forward when it is in use and the mma.sync one when SPILL_FLASH_FWD=mma's
// choice is made.
func TestAttentionKernelsSM90(t *testing.T) {
	defer func(h bool) { flashSM90 = h }(flashSM90)
	p := openPair(t)
	gb := p.g.(*Backend)
	if gb.flashSM90Err != nil || gb.flashBwdErr != nil {
		t.Skipf("Hopper forward off (%v) or flash backward off (%v)", gb.flashSM90Err, gb.flashBwdErr)
	}
	const prefix = "forward: wgmma flash kernel for sm_90a"
	for _, hs := range []int{64, 128} {
		flashSM90 = true
		if s := gb.AttentionKernels(kernels.BF16, 1024, 4*hs, 4); !strings.HasPrefix(s, prefix) {
			t.Errorf("hs %d: AttentionKernels = %q", hs, s)
		}
		flashSM90 = false
		if s := gb.AttentionKernels(kernels.BF16, 1024, 4*hs, 4); strings.HasPrefix(s, prefix) {
			t.Errorf("hs %d, flashSM90 off: AttentionKernels = %q", hs, s)
		}
	}
}
