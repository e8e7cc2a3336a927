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
// ran. Skipped on a device whose compute capability is not 9.x.
func TestAttentionFlashSM90(t *testing.T) {
	defer func(impl int, h, x2, pp bool) { attnImpl, flashSM90, flashSM90x2, flashSM90p = impl, h, x2, pp }(attnImpl, flashSM90, flashSM90x2, flashSM90p)
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
		// kernel: 128 query rows per block (the default), 64, and the
		// pipelined kernels with 128 (sm90p) and 64 (sm90px1).
		flashSM90 = true
		for _, v := range []struct{ x2, p bool }{{true, false}, {false, false}, {true, true}, {false, true}} {
			flashSM90x2, flashSM90p = v.x2, v.p
			vname := fmt.Sprintf("%s/sm90-x2=%v-p=%v", name, v.x2, v.p)
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
		if s := gb.AttentionKernels(kernels.BF16, 4*hs, 4); !strings.HasPrefix(s, prefix) {
			t.Errorf("hs %d: AttentionKernels = %q", hs, s)
		}
		flashSM90 = false
		if s := gb.AttentionKernels(kernels.BF16, 4*hs, 4); strings.HasPrefix(s, prefix) {
			t.Errorf("hs %d, flashSM90 off: AttentionKernels = %q", hs, s)
		}
	}
}
