//go:build cuda

package cuda

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"testing"

	"github.com/spill-ml/spill/kernels"
)

// The Llama kernels (kernels.LlamaOps) against the CPU reference, on
// fresh random inputs, outputs poisoned with NaN before the run and
// gradients accumulated into random values, at shapes that include odd
// sizes (the generic kernels), whole 16-byte vectors (the typed ones) and
// sequence lengths off the flash kernels' tiles.

func llama(b kernels.Backend) kernels.LlamaOps { return b.(kernels.LlamaOps) }

func TestRMSNorm(t *testing.T) {
	p := openPair(t)
	for _, sh := range [][2]int{{1, 1}, {5, 7}, {64, 768}, {3, 1025}, {300, 2048}} {
		N, C := sh[0], sh[1]
		for _, dt := range floatTypes {
			for _, withDinp := range []bool{true, false} {
				name := fmt.Sprintf("N%d,C%d/%v/dinp=%v", N, C, dt, withDinp)
				x := p.random(dt, N*C, 2)
				w := p.random(dt, C, 1)
				out := p.poison(dt, N*C)
				rstd := p.poison(kernels.F32, N)
				g := p.random(dt, N*C, 1)
				dx := p.random(dt, N*C, 1)
				dw := p.random(dt, C, 1)
				p.both(func(b kernels.Backend, q kernels.Queue, s func(tp) kernels.Tensor) {
					llama(b).RMSNormForward(q, s(out), s(rstd), s(x), s(w), N, C, 1e-5)
					di := kernels.Tensor{}
					if withDinp {
						di = s(dx)
					}
					llama(b).RMSNormBackward(q, di, s(dw), s(g), s(x), s(w), s(rstd), N, C)
				})
				p.check(name+"/forward", out, 1)
				p.check(name+"/rstd", rstd, 4)
				p.check(name+"/dinp", dx, 4) // unchanged without dinp
				p.check(name+"/dweight", dw, math.Sqrt(float64(N)))
			}
		}
	}
}

// TestRMSNormMixed: bf16 activations with float32 weight and weight
// gradient (the generic kernels), and a large eps.
func TestRMSNormMixed(t *testing.T) {
	p := openPair(t)
	const N, C = 37, 512
	x := p.random(kernels.BF16, N*C, 2)
	w := p.random(kernels.F32, C, 1)
	out := p.poison(kernels.BF16, N*C)
	rstd := p.poison(kernels.F32, N)
	g := p.random(kernels.BF16, N*C, 1)
	dx := p.random(kernels.F16, N*C, 1)
	dw := p.random(kernels.F32, C, 1)
	p.both(func(b kernels.Backend, q kernels.Queue, s func(tp) kernels.Tensor) {
		llama(b).RMSNormForward(q, s(out), s(rstd), s(x), s(w), N, C, 0.5)
		llama(b).RMSNormBackward(q, s(dx), s(dw), s(g), s(x), s(w), s(rstd), N, C)
	})
	p.check("forward", out, 1)
	p.check("rstd", rstd, 4)
	p.check("dinp", dx, 4)
	// The CPU sums bf16 products in float32 too, in another order.
	p.check("dweight", dw, 4*math.Sqrt(N))
}

// ropeShapes are (B, T, NH, NKV, hs): grouped and multi-head, head sizes
// from 2 to 128, odd T.
var ropeShapes = [][5]int{{1, 1, 1, 1, 2}, {2, 7, 4, 2, 8}, {3, 33, 6, 2, 64}, {1, 70, 3, 1, 128}, {2, 65, 4, 4, 6}}

func TestRoPE(t *testing.T) {
	p := openPair(t)
	scaled := kernels.RoPEConfig{Theta: 500000, Scaling: kernels.RoPEScaling{Factor: 32, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 8192}}
	for k, sh := range ropeShapes {
		B, T, NH, NKV, hs := sh[0], sh[1], sh[2], sh[3], sh[4]
		cfg := kernels.RoPEConfig{Theta: 10000}
		if k%2 == 1 {
			cfg = scaled
		}
		n := B * T * kernels.GQAWidth(NH, NKV, hs)
		tab := p.upload(kernels.F32, cfg.Table(T+3, hs)) // more rows than T: only the first T are read
		for _, dt := range floatTypes {
			name := fmt.Sprintf("B%d,T%d,NH%d,NKV%d,hs%d/%v", B, T, NH, NKV, hs, dt)
			x := p.random(dt, n, 2)
			out := p.poison(dt, n)
			inPlace := p.random(dt, n, 2)
			g := p.random(dt, n, 1)
			dacc := p.random(dt, n, 1)
			dset := p.poison(dt, n)
			dsame := p.random(dt, n, 1)
			p.both(func(b kernels.Backend, q kernels.Queue, s func(tp) kernels.Tensor) {
				lo := llama(b)
				lo.RoPEForward(q, s(out), s(x), s(tab), B, T, NH, NKV, hs)
				lo.RoPEForward(q, s(inPlace), s(inPlace), s(tab), B, T, NH, NKV, hs)
				lo.RoPEBackward(q, s(dacc), s(g), s(tab), B, T, NH, NKV, hs)
				lo.RoPEBackwardSet(q, s(dset), s(g), s(tab), B, T, NH, NKV, hs)
				lo.RoPEBackwardSet(q, s(dsame), s(dsame), s(tab), B, T, NH, NKV, hs)
			})
			p.check(name+"/forward", out, 1)
			p.check(name+"/forward in place", inPlace, 1)
			p.check(name+"/backward", dacc, 1)
			p.check(name+"/backward set", dset, 1)
			p.check(name+"/backward set in place", dsame, 1)
		}
	}
	// Mixed dtypes (the generic kernel): f32 in, bf16 out.
	B, T, NH, NKV, hs := 2, 9, 4, 2, 16
	n := B * T * kernels.GQAWidth(NH, NKV, hs)
	tab := p.upload(kernels.F32, kernels.RoPEConfig{Theta: 10000}.Table(T, hs))
	x := p.random(kernels.F32, n, 2)
	out := p.poison(kernels.BF16, n)
	d := p.random(kernels.F32, n, 1)
	p.both(func(b kernels.Backend, q kernels.Queue, s func(tp) kernels.Tensor) {
		llama(b).RoPEForward(q, s(out), s(x), s(tab), B, T, NH, NKV, hs)
		llama(b).RoPEBackward(q, s(d), s(out), s(tab), B, T, NH, NKV, hs)
	})
	p.check("mixed/forward", out, 1)
	p.check("mixed/backward", d, 1)
}

// TestRoPEOverlap: an output that overlaps its input other than exactly,
// or that is its input when accumulating, panics before anything runs.
func TestRoPEOverlap(t *testing.T) {
	p := openPair(t)
	B, T, NH, NKV, hs := 1, 4, 2, 1, 8
	n := B * T * kernels.GQAWidth(NH, NKV, hs)
	tab := p.upload(kernels.F32, kernels.RoPEConfig{Theta: 10000}.Table(T, hs))
	x := p.random(kernels.F32, n+8, 1)
	lo := llama(p.g)
	q := p.g.DefaultQueue()
	for _, c := range []struct {
		name string
		f    func()
	}{
		{"shifted", func() { lo.RoPEForward(q, x.g.Slice(8, n), x.g.Slice(0, n), tab.g, B, T, NH, NKV, hs) }},
		{"accumulating in place", func() { lo.RoPEBackward(q, x.g.Slice(0, n), x.g.Slice(0, n), tab.g, B, T, NH, NKV, hs) }},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", c.name)
				}
			}()
			c.f()
		}()
	}
}

func TestSwiGLU(t *testing.T) {
	p := openPair(t)
	for _, n := range sizes {
		for _, dt := range floatTypes {
			name := fmt.Sprintf("n=%d/%v", n, dt)
			// Gates far into both tails: σ saturates, e^-g overflows.
			gate := p.random(dt, n, 12)
			up := p.random(dt, n, 2)
			out := p.poison(dt, n)
			g := p.random(dt, n, 1)
			dg := p.random(dt, n, 1)
			du := p.random(dt, n, 1)
			p.both(func(b kernels.Backend, q kernels.Queue, s func(tp) kernels.Tensor) {
				llama(b).SwiGLUForward(q, s(out), s(gate), s(up), n)
				llama(b).SwiGLUBackward(q, s(dg), s(du), s(g), s(gate), s(up), n)
			})
			p.check(name+"/forward", out, 1)
			p.check(name+"/dgate", dg, 1)
			p.check(name+"/dup", du, 1)
		}
	}
	// Operands one element off 16-byte alignment (the typed kernels' head
	// and tail), and mixed dtypes (the generic kernels).
	const n = 1000
	gate, up := p.random(kernels.BF16, n+1, 6), p.random(kernels.BF16, n+1, 2)
	out := p.poison(kernels.BF16, n+1)
	gf := p.random(kernels.F32, n, 6)
	outMixed := p.poison(kernels.F16, n)
	dg, du := p.random(kernels.F32, n, 1), p.random(kernels.BF16, n, 1)
	p.both(func(b kernels.Backend, q kernels.Queue, s func(tp) kernels.Tensor) {
		llama(b).SwiGLUForward(q, s(out).Slice(1, n), s(gate).Slice(1, n), s(up).Slice(1, n), n)
		llama(b).SwiGLUForward(q, s(outMixed), s(gf), s(up).Slice(0, n), n)
		llama(b).SwiGLUBackward(q, s(dg), s(du), s(outMixed), s(gf), s(up).Slice(0, n), n)
	})
	p.nanOK = true // out[0] stays poisoned on both
	p.check("unaligned/forward", out, 1)
	p.nanOK = false
	p.check("mixed/forward", outMixed, 1)
	p.check("mixed/dgate", dg, 2)
	p.check("mixed/dup", du, 1)
}

// gqaShapes are (B, T, NH, NKV, hs): groups of 2 to 6 query heads and
// multi-query (NKV 1), head sizes of the flash kernels (64, 80, 96, 128) at T off
// their 16-, 32- and 64-row tiles, other head sizes (the row-wise
// kernels), and NKV = NH (AttentionForward).
var gqaShapes = [][5]int{
	{1, 1, 2, 1, 64}, {2, 63, 4, 2, 64}, {1, 65, 6, 2, 128}, {2, 129, 8, 2, 64}, {1, 200, 3, 1, 128},
	{2, 17, 4, 2, 40}, {1, 9, 6, 3, 8}, {2, 33, 4, 1, 256}, {2, 7, 4, 4, 16}, {2, 65, 4, 2, 80}, {1, 129, 6, 3, 96},
}

// TestGQAttention checks grouped-query attention against the CPU, with the
// default choice of kernels (flash for bf16 with head size 64, 80, 96 or 128) and
// with the row-wise kernels forced.
func TestGQAttention(t *testing.T) {
	for _, c := range []struct {
		name string
		impl int
	}{{"auto", attnAuto}, {"rowwise", attnRowwise}} {
		t.Run(c.name, func(t *testing.T) {
			defer func(impl int) { attnImpl = impl }(attnImpl)
			attnImpl = c.impl
			p := openPair(t)
			for _, sh := range gqaShapes {
				B, T, NH, NKV, hs := sh[0], sh[1], sh[2], sh[3], sh[4]
				W, C := kernels.GQAWidth(NH, NKV, hs), NH*hs
				for _, dt := range floatTypes {
					name := fmt.Sprintf("B%d,T%d,NH%d,NKV%d,hs%d/%v", B, T, NH, NKV, hs, dt)
					flash := c.impl == attnAuto && dt == kernels.BF16 && flashHeadSize(hs) && p.g.(*Backend).flashErr == nil
					qkv := p.random(dt, B*T*W, 2)
					out := p.poison(dt, B*T*C)
					lse := p.poison(kernels.F32, B*NH*T)
					n0 := flashLaunches.Load()
					p.both(func(b kernels.Backend, q kernels.Queue, s func(tp) kernels.Tensor) {
						llama(b).GQAttentionForward(q, s(out), s(lse), s(qkv), B, T, NH, NKV, hs)
					})
					if ran := flashLaunches.Load() > n0; ran != flash {
						t.Errorf("%s: flash forward ran: %v, want %v", name, ran, flash)
					}
					p.check(name+"/out", out, 1)
					p.check(name+"/lse", lse, 2)
					// The backward pass from the CPU's out and lse on both sides.
					_, wantOut := p.download(out)
					same := p.upload(dt, wantOut)
					_, wantLse := p.download(lse)
					sameLse := p.upload(kernels.F32, wantLse)
					g := p.random(dt, B*T*C, 1)
					dqkv := p.random(dt, B*T*W, 1)
					nb0 := flashBwdLaunches.Load()
					p.both(func(b kernels.Backend, q kernels.Queue, s func(tp) kernels.Tensor) {
						llama(b).GQAttentionBackward(q, s(dqkv), s(g), s(qkv), s(same), s(sameLse), B, T, NH, NKV, hs)
					})
					if ran := flashBwdLaunches.Load() > nb0; ran != (flash && p.g.(*Backend).flashBwdErr == nil) {
						t.Errorf("%s: flash backward ran: %v", name, ran)
					}
					p.check(name+"/dqkv", dqkv, 2*math.Sqrt(float64(T*NH/NKV)))
				}
			}
		})
	}
}

// TestLlamaDeterministic: the backward ops that sum over rows or over a
// group of query heads (RMSNorm's weight gradient, the attention's dK and
// dV on the flash and the row-wise kernels) give bitwise the same result
// when run twice. The flash backward runs its split kernels (set here
// whatever SPILL_FLASH_BWD says): the fused ones sum dQ with
// float32 atomics and are not bitwise reproducible (TestFlashBwdFused
// checks them against the split kernels within bf16 tolerance instead);
// then each split variant of SPILL_FLASH_BWD.
func TestLlamaDeterministic(t *testing.T) {
	defer func(impl int, mode string) { attnImpl, flashBwdMode = impl, mode }(attnImpl, flashBwdMode)
	flashBwdMode = flashBwdSplit
	p := openPair(t)
	lo, q := llama(p.g), p.g.DefaultQueue()
	run := func(f func(out kernels.Tensor), out tp) []byte {
		res := make([]byte, out.g.Bytes())
		p.g.Zero(q, out.g)
		f(out.g)
		p.g.CopyToHost(q, res, out.g)
		if err := q.Synchronize(context.Background()); err != nil {
			t.Fatal(err)
		}
		return res
	}
	same := func(name string, f func(out kernels.Tensor), out tp) {
		if a, b := run(f, out), run(f, out); !bytes.Equal(a, b) {
			t.Errorf("%s: two runs differ", name)
		}
	}
	const N, C = 4096, 256
	x, w, g := p.random(kernels.BF16, N*C, 2), p.random(kernels.BF16, C, 1), p.random(kernels.BF16, N*C, 1)
	rstd := p.alloc(kernels.F32, N)
	lo.RMSNormForward(q, p.alloc(kernels.BF16, N*C).g, rstd.g, x.g, w.g, N, C, 1e-5)
	same("RMSNorm dweight", func(dw kernels.Tensor) {
		lo.RMSNormBackward(q, kernels.Tensor{}, dw, g.g, x.g, w.g, rstd.g, N, C)
	}, p.alloc(kernels.F32, C))
	const B, T, NH, NKV, hs = 2, 300, 8, 2, 64
	W := kernels.GQAWidth(NH, NKV, hs)
	qkv, dout := p.random(kernels.BF16, B*T*W, 2), p.random(kernels.BF16, B*T*NH*hs, 1)
	out, lse := p.alloc(kernels.BF16, B*T*NH*hs), p.alloc(kernels.F32, B*NH*T)
	for _, impl := range []int{attnAuto, attnRowwise} {
		attnImpl = impl
		lo.GQAttentionForward(q, out.g, lse.g, qkv.g, B, T, NH, NKV, hs)
		nf := flashBwdFusedLaunches.Load()
		same(fmt.Sprintf("GQAttentionBackward (impl %d)", impl), func(d kernels.Tensor) {
			lo.GQAttentionBackward(q, d, dout.g, qkv.g, out.g, lse.g, B, T, NH, NKV, hs)
		}, p.alloc(kernels.BF16, B*T*W))
		if flashBwdFusedLaunches.Load() != nf {
			t.Errorf("impl %d: the fused flash backward ran with SPILL_FLASH_BWD=split", impl)
		}
	}
	// The split backward's variants: split-smem keeps the split kernels'
	// order of every sum, the Hopper ones (split-smem on other devices)
	// a fixed order of their own: as reproducible.
	attnImpl = attnAuto
	lo.GQAttentionForward(q, out.g, lse.g, qkv.g, B, T, NH, NKV, hs)
	for _, mode := range []string{flashBwdSplitSM, flashBwdSM90, flashBwdSM90P} {
		flashBwdMode = mode
		nv := flashBwdVariantLaunches.Load()
		same("GQAttentionBackward ("+mode+")", func(d kernels.Tensor) {
			lo.GQAttentionBackward(q, d, dout.g, qkv.g, out.g, lse.g, B, T, NH, NKV, hs)
		}, p.alloc(kernels.BF16, B*T*W))
		if flashBwdVariantLaunches.Load() == nv {
			t.Errorf("%s: the split variant did not run", mode)
		}
	}
}
