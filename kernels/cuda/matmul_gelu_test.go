//go:build cuda

package cuda

import (
	"fmt"
	"math"
	"testing"

	"github.com/spill-ml/spill/kernels"
)

// TestMatmulGelu checks MatmulGeluForward and MatmulBackwardGeluSet against
// the CPU backend's unfused ops (MatmulForward and GeluForward;
// MatmulBackwardSet and GeluBackwardSet) on random inputs with poisoned
// outputs, and that bf16 at shapes of whole 16-byte rows took the fused
// cuBLASLt epilogues rather than the fallback.
func TestMatmulGelu(t *testing.T) {
	p := openPair(t)
	gb := p.g.(*Backend)
	shapes := [][3]int{{7, 13, 5}, {64, 96, 80}, {130, 256, 136}}
	for _, sh := range shapes {
		BT, C, OC := sh[0], sh[1], sh[2]
		for _, dt := range floatTypes {
			name := fmt.Sprintf("%dx%dx%d/%v", BT, C, OC, dt)
			// Forward: pre = x·wᵀ + bias, out = gelu(pre), with pre in [-3, 3]-ish.
			x, w, bs := p.random(dt, BT*C, 1), p.random(dt, OC*C, 0.2), p.random(dt, OC, 0.5)
			pre, out := p.poison(dt, BT*OC), p.poison(dt, BT*OC)
			// Backward of a layer whose input is gelu(pre2): inp2 (BT,OC), w2 (C,OC), dout2 (BT,C).
			pre2, inp2, w2, g2 := p.random(dt, BT*OC, 3), p.random(dt, BT*OC, 1), p.random(dt, C*OC, 1), p.random(dt, BT*C, 1)
			dinp := p.poison(dt, BT*OC)
			dw, db := p.random(dt, C*OC, 1), p.random(dt, C, 1)
			tmp := p.alloc(dt, BT*OC) // the CPU's unfused intermediate
			f0, b0 := geluEpiRuns[epiGeluBias].Load(), geluEpiRuns[epiDGelu].Load()
			q := gb.DefaultQueue()
			gb.MatmulGeluForward(q, out.g, pre.g, x.g, w.g, bs.g, BT, C, OC)
			gb.MatmulBackwardGeluSet(q, dinp.g, dw.g, db.g, g2.g, inp2.g, w2.g, pre2.g, BT, OC, C)
			c, cq := p.c, p.c.DefaultQueue()
			c.MatmulForward(cq, pre.c, x.c, w.c, bs.c, BT, C, OC)
			c.GeluForward(cq, out.c, pre.c, BT*OC)
			kernels.MatmulBackwardSet(c, cq, tmp.c, dw.c, db.c, g2.c, inp2.c, w2.c, BT, OC, C)
			kernels.GeluBackwardSet(c, cq, dinp.c, pre2.c, tmp.c, BT*OC)
			slack := 2 * math.Sqrt(float64(max(C, BT, OC)))
			p.check(name+"/pre", pre, slack)
			p.check(name+"/out", out, slack)
			p.check(name+"/dinp", dinp, slack)
			p.check(name+"/dweight", dw, slack)
			p.check(name+"/dbias", db, slack)
			if dt == kernels.BF16 && C%8 == 0 && OC%8 == 0 {
				if geluEpiRuns[epiGeluBias].Load() == f0 {
					t.Errorf("%s: the forward did not take the cuBLASLt GELU epilogue", name)
				}
				if geluEpiRuns[epiDGelu].Load() == b0 {
					t.Errorf("%s: the backward did not take the cuBLASLt DGELU epilogue", name)
				}
			}
		}
	}
}

// BenchmarkMatmulGelu is GPT-2 124M's MLP GELU (B=16, T=1024, bf16): the fc
// GEMM with bias and GELU, and the projection's input gradient with the
// GELU's backward, fused (cuBLASLt epilogues) and unfused (GEMM + kernel).
func BenchmarkMatmulGelu(b *testing.B) {
	be := benchBackend(b)
	q := be.DefaultQueue()
	BT, C, OC := 16*1024, 768, 3072
	bf := kernels.BF16
	x, w, bias := benchTensor(b, be, bf, BT*C), benchTensor(b, be, bf, OC*C), benchTensor(b, be, bf, OC)
	pre, out := benchTensor(b, be, bf, BT*OC), benchTensor(b, be, bf, BT*OC)
	w2, g2, dinp := benchTensor(b, be, bf, C*OC), benchTensor(b, be, bf, BT*C), benchTensor(b, be, bf, BT*OC)
	for _, fused := range []bool{true, false} {
		b.Run(fmt.Sprintf("forward/fused=%v", fused), func(b *testing.B) {
			syncB(b, be)
			b.ResetTimer()
			for range b.N {
				if fused {
					be.MatmulGeluForward(q, out, pre, x, w, bias, BT, C, OC)
				} else {
					be.MatmulForward(q, pre, x, w, bias, BT, C, OC)
					be.GeluForward(q, out, pre, BT*OC)
				}
			}
			syncB(b, be)
			b.ReportMetric(b.Elapsed().Seconds()/float64(b.N)*1e6, "µs/op")
		})
		b.Run(fmt.Sprintf("backward-dinp/fused=%v", fused), func(b *testing.B) {
			syncB(b, be)
			b.ResetTimer()
			for range b.N {
				if fused {
					be.MatmulBackwardGeluSet(q, dinp, kernels.Tensor{}, kernels.Tensor{}, g2, out, w2, pre, BT, OC, C)
				} else {
					be.MatmulBackwardSet(q, out, kernels.Tensor{}, kernels.Tensor{}, g2, out, w2, BT, OC, C)
					be.GeluBackwardSet(q, dinp, pre, out, BT*OC)
				}
			}
			syncB(b, be)
			b.ReportMetric(b.Elapsed().Seconds()/float64(b.N)*1e6, "µs/op")
		})
	}
}
