//go:build cuda

package cuda

import (
	"fmt"
	"math"
	"testing"

	"github.com/spill-ml/spill/kernels"
)

var _ kernels.Overwriter = (*Backend)(nil)

// TestOverwriter checks the overwriting backward forms against the CPU
// backend, which has none and so runs Zero and the accumulating op: the
// gradient being overwritten starts random (nonzero), the others still
// accumulate. Attention covers the flash kernels (bf16, head size 64) and
// the Zero fallback (f32).
func TestOverwriter(t *testing.T) {
	p := openPair(t)
	for _, dt := range floatTypes {
		for _, n := range []int{1, 1000, 4099} {
			name := fmt.Sprintf("gelu/N%d/%v", n, dt)
			x, g, dx := p.random(dt, n, 2), p.random(dt, n, 1), p.random(dt, n, 1)
			p.both(func(b kernels.Backend, q kernels.Queue, s func(tp) kernels.Tensor) {
				kernels.GeluBackwardSet(b, q, s(dx), s(x), s(g), n)
			})
			p.check(name, dx, 1)
		}
		for _, sh := range [][3]int{{37, 24, 40}, {64, 128, 96}, {5, 3, 1}} {
			BT, C, OC := sh[0], sh[1], sh[2]
			name := fmt.Sprintf("matmul/BT%d,C%d,OC%d/%v", BT, C, OC, dt)
			x, w, g := p.random(dt, BT*C, 1), p.random(dt, OC*C, 1), p.random(dt, BT*OC, 1)
			dx, dw, db := p.random(dt, BT*C, 1), p.random(dt, OC*C, 1), p.random(dt, OC, 1)
			p.both(func(b kernels.Backend, q kernels.Queue, s func(tp) kernels.Tensor) {
				kernels.MatmulBackwardSet(b, q, s(dx), s(dw), s(db), s(g), s(x), s(w), BT, C, OC)
			})
			p.check(name+"/dinp", dx, math.Sqrt(float64(OC)))
			p.check(name+"/dweight", dw, math.Sqrt(float64(BT)))
			p.check(name+"/dbias", db, math.Sqrt(float64(BT)))
		}
	}
	for _, dt := range floatTypes {
		for _, sh := range [][2]int{{5, 7}, {6, 5001}} {
			BT, V := sh[0], sh[1]
			name := fmt.Sprintf("crossentropy/BT%d,V%d/%v", BT, V, dt)
			logits := p.random(dt, BT*V, 4)
			tg := make([]int32, BT)
			for i := range tg {
				tg[i] = int32(p.rng.IntN(V))
				if i%3 == 1 {
					tg[i] = -1 // an ignored row: zeros
				}
			}
			targets := p.ints(tg)
			dl := p.random(dt, BT*V, 1)
			p.both(func(b kernels.Backend, q kernels.Queue, s func(tp) kernels.Tensor) {
				kernels.CrossEntropyBackwardSet(b, q, s(dl), s(logits), s(targets), BT, V, 0.5)
			})
			p.check(name, dl, 2)
		}
	}
	for _, dt := range []kernels.DType{kernels.BF16, kernels.F32} {
		B, T, C, NH := 2, 65, 128, 2
		name := fmt.Sprintf("attention/B%d,T%d,C%d,NH%d/%v", B, T, C, NH, dt)
		qkv := p.random(dt, B*T*3*C, 1)
		out, lse := p.poison(dt, B*T*C), p.poison(kernels.F32, B*NH*T)
		p.both(func(b kernels.Backend, q kernels.Queue, s func(tp) kernels.Tensor) {
			b.AttentionForward(q, s(out), s(lse), s(qkv), B, T, C, NH)
		})
		_, wantOut := p.download(out)
		same := p.upload(dt, wantOut)
		_, wantLse := p.download(lse)
		sameLse := p.upload(kernels.F32, wantLse)
		g, dqkv := p.random(dt, B*T*C, 1), p.random(dt, B*T*3*C, 1)
		n0 := flashBwdLaunches.Load()
		p.both(func(b kernels.Backend, q kernels.Queue, s func(tp) kernels.Tensor) {
			kernels.AttentionBackwardSet(b, q, s(dqkv), s(g), s(qkv), s(same), s(sameLse), B, T, C, NH)
		})
		if ran := flashBwdLaunches.Load() > n0; ran != (dt == kernels.BF16) {
			t.Errorf("%s: flash backward ran: %v", name, ran)
		}
		p.check(name+"/dqkv", dqkv, 2*math.Sqrt(float64(T)))
	}
}
