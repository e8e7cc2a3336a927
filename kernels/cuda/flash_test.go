//go:build cuda

package cuda

import (
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/spill-ml/spill/kernels"
)

// TestFlashBwdFused checks the chain CPU reference -> split flash backward
// -> fused flash backward and the split variants split-smem, sm90 and
// sm90p (the Hopper kernels, on a compute capability 9.x device; split-smem
// at head sizes 80 and 96): head sizes
// 64, 80, 96 and 128 (80 and 96 without a fused kernel), T off the kernels' 16-, 32- and 64-row tiles (1, 65, 200,
// 300), multi-head attention accumulating (AttentionBackward) and
// overwriting a poisoned dqkv (AttentionBackwardSet), grouped-query
// attention (GQAttentionBackward, NH 8 and NKV 2; it only accumulates).
// Each implementation is checked against the CPU, then the fused results
// against the split one within bf16 tolerance relative to the gradient's
// rms (the fused dQ sums in another order; the split variants keep the
// split kernels' order, and the test logs whether they matched them bit for
// bit), and each call must have taken the kernels its mode names.
func TestFlashBwdFused(t *testing.T) {
	defer func(impl int, mode string) { attnImpl, flashBwdMode = impl, mode }(attnImpl, flashBwdMode)
	attnImpl = attnAuto
	p := openPair(t)
	be := p.g.(*Backend)
	if be.flashErr != nil || be.flashBwdErr != nil || be.flashBwdFusedErr != nil {
		t.Fatalf("flash self-checks at Open: forward %v, split backward %v, fused backward %v", be.flashErr, be.flashBwdErr,
			be.flashBwdFusedErr)
	}
	if be.flashBwdSMErr != nil {
		t.Fatalf("flash self-check at Open of the split variant %s: %v", flashBwdSplitSM, be.flashBwdSMErr)
	}
	modes := []string{flashBwdSplit, flashBwdFused, flashBwdSplitSM}
	// add appends the modes when their self-check at Open passed, logs
	// them when it could not run here, and fails otherwise.
	add := func(err error, what string, ms ...string) {
		switch {
		case errors.Is(err, errNoSM90), errors.Is(err, errNoTensorMaps):
			t.Logf("%s %v not checked: %v", what, ms, err)
		case err != nil:
			t.Errorf("flash self-check at Open of the %s %v: %v", what, ms, err)
		default:
			modes = append(modes, ms...)
		}
	}
	add(be.flashBwdSM90Err, "Hopper backward", flashBwdSM90, flashBwdSM90P)
	add(be.flashBwdSM90WErr, "Hopper backward", flashBwdSM90W)
	for _, m := range fusedSM90Modes {
		add(be.flashBwdFusedSM90Err[m.mode], "fused Hopper backward", m.mode)
	}
	if be.flashBwdSM90Err == nil && be.flashBwdSM90WErr == nil && be.flashBwdFusedSM90Err[flashBwdFused2BSM90] == nil &&
		be.flashBwdFusedSM90Err[flashBwdFused2WSM90] == nil && be.flashBwdFusedSM90Err[flashBwdFused1WSM90] == nil {
		modes = append(modes, flashBwdAuto) // the default: each head size's choice
	}
	for _, sh := range [][5]int{ // B, T, NH, NKV, hs
		{1, 1, 8, 2, 64}, {1, 1, 2, 2, 128}, {2, 65, 8, 2, 128}, {2, 65, 4, 4, 64}, {1, 200, 8, 8, 64},
		{1, 200, 8, 2, 128}, {2, 300, 8, 2, 64}, {1, 300, 4, 4, 128},
		{2, 65, 4, 4, 80}, {1, 200, 8, 2, 96}, {2, 300, 4, 2, 80}, {1, 129, 6, 6, 96},
	} {
		B, T, NH, NKV, hs := sh[0], sh[1], sh[2], sh[3], sh[4]
		W, C := kernels.GQAWidth(NH, NKV, hs), NH*hs
		qkv := p.random(kernels.BF16, B*T*W, 2)
		out, lse := p.poison(kernels.BF16, B*T*C), p.poison(kernels.F32, B*NH*T)
		p.both(func(b kernels.Backend, q kernels.Queue, s func(tp) kernels.Tensor) {
			llama(b).GQAttentionForward(q, s(out), s(lse), s(qkv), B, T, NH, NKV, hs)
		})
		// The backward pass from the CPU's out and lse on both sides.
		_, wantOut := p.download(out)
		same := p.upload(kernels.BF16, wantOut)
		_, wantLse := p.download(lse)
		sameLse := p.upload(kernels.F32, wantLse)
		g := p.random(kernels.BF16, B*T*C, 1)
		start := make([]float32, B*T*W)
		for i := range start {
			start[i] = 2*p.rng.Float32() - 1
		}
		slack := 2 * math.Sqrt(float64(T*NH/NKV))
		for _, set := range []bool{false, true} {
			if set && NKV != NH {
				continue
			}
			name := fmt.Sprintf("B%d,T%d,NH%d,NKV%d,hs%d,set=%v", B, T, NH, NKV, hs, set)
			res := map[string]tp{}
			for _, mode := range modes {
				flashBwdMode = mode
				var dqkv tp
				if set {
					dqkv = p.poison(kernels.BF16, B*T*W)
				} else {
					dqkv = p.upload(kernels.BF16, start)
				}
				nb, nf, nv, n9 := flashBwdLaunches.Load(), flashBwdFusedLaunches.Load(), flashBwdVariantLaunches.Load(),
					flashBwdSM90Launches.Load()
				p.both(func(b kernels.Backend, q kernels.Queue, s func(tp) kernels.Tensor) {
					switch {
					case set:
						kernels.AttentionBackwardSet(b, q, s(dqkv), s(g), s(qkv), s(same), s(sameLse), B, T, C, NH)
					case NKV == NH:
						b.AttentionBackward(q, s(dqkv), s(g), s(qkv), s(same), s(sameLse), B, T, C, NH)
					default:
						llama(b).GQAttentionBackward(q, s(dqkv), s(g), s(qkv), s(same), s(sameLse), B, T, NH, NKV, hs)
					}
				})
				if flashBwdLaunches.Load() == nb {
					t.Errorf("%s/%s: the flash backward did not run", name, mode)
				}
				// Head sizes 80 and 96 have no fused kernel: "fused" takes
				// split, "sm90f" the default (split-smem there).
				m := flashBwdModeAt(hs, T, mode)
				variant := isFlashBwdVariant(m) || (isFusedSM90(m) && flashFusedName(hs, m) == "")
				wantFused := m != flashBwdSplit && !variant && flashFusedName(hs, m) != ""
				if fused := flashBwdFusedLaunches.Load() > nf; fused != wantFused {
					t.Errorf("%s/%s: fused kernels ran: %v", name, mode, fused)
				}
				if ran := flashBwdVariantLaunches.Load() > nv; ran != variant {
					t.Errorf("%s/%s: split variant ran: %v", name, mode, ran)
				}
				// The Hopper modes at head sizes 64 and 128; split-smem at the others.
				if ran, want := flashBwdSM90Launches.Load() > n9, isFlashBwdSM90(m) && (hs == 64 || hs == 128); ran != want {
					t.Errorf("%s/%s: Hopper backward ran: %v", name, mode, ran)
				}
				p.check(name+"/"+mode+"/dqkv", dqkv, slack)
				res[mode] = dqkv
			}
			// Fused against split: tighter than against the CPU, whose
			// slack grows with T. Both round the same P and dS to bf16 up
			// to the order of float32 sums, so the bound is the bf16
			// tolerance scaled by the gradient's rms (as tools/cuda/emu.sh
			// checks against float64), twice over.
			split, _ := p.download(res[flashBwdSplit])
			var ms float64
			for i, w := range split {
				d := float64(w)
				if !set {
					d -= float64(kernels.F32FromBF16(kernels.BF16FromF32(start[i])))
				}
				ms += d * d
			}
			rms := math.Sqrt(ms / float64(len(split)))
			_, eps := tolerance(kernels.BF16)
			for _, mode := range modes[1:] {
				fused, _ := p.download(res[mode])
				bad, first, same := 0, "", 0
				for i, w := range split {
					if fused[i] == w {
						same++
					}
					d := math.Abs(float64(fused[i]) - float64(w))
					if !(d <= 2*(2e-2*rms+eps*math.Abs(float64(w)))) {
						if bad == 0 {
							first = fmt.Sprintf("[%d]: fused %g, split %g", i, fused[i], w)
						}
						bad++
					}
				}
				if bad > 0 {
					t.Errorf("%s/%s: %d of %d elements differ from the split kernels', first %s", name, mode, bad, len(split), first)
				}
				if isFlashBwdVariant(mode) {
					t.Logf("%s/%s: %d of %d elements bitwise equal to the split kernels'", name, mode, same, len(split))
				}
			}
		}
	}
}
