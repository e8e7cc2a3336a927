//go:build cuda

package cuda

import (
	"context"
	"fmt"
	"math"
	"testing"

	"github.com/spill-ml/spill/kernels"
)

var sizes = []int{1, 7, 1000, 65537}

func TestElementwise(t *testing.T) {
	p := openPair(t)
	for _, n := range sizes {
		for _, dt := range floatTypes {
			name := fmt.Sprintf("n=%d/%v", n, dt)
			x := p.random(dt, n, 3)
			g := p.random(dt, n, 1)

			out := p.poison(dt, n)
			p.both(func(b kernels.Backend, q kernels.Queue, s func(tp) kernels.Tensor) { b.GeluForward(q, s(out), s(x), n) })
			p.check(name+"/GeluForward", out, 1)

			dx := p.random(dt, n, 1)
			p.both(func(b kernels.Backend, q kernels.Queue, s func(tp) kernels.Tensor) {
				b.GeluBackward(q, s(dx), s(x), s(g), n)
			})
			p.check(name+"/GeluBackward", dx, 1)

			acc := p.random(dt, n, 1)
			p.both(func(b kernels.Backend, q kernels.Queue, s func(tp) kernels.Tensor) {
				b.Add(q, s(acc), s(x))
				b.Scale(q, s(acc), -0.75)
			})
			p.check(name+"/AddScale", acc, 1)

			tgt := p.random(kernels.F32, n, 2)
			loss := p.poison(kernels.F32, n)
			dp := p.random(dt, n, 1)
			p.both(func(b kernels.Backend, q kernels.Queue, s func(tp) kernels.Tensor) {
				b.MSEForward(q, s(loss), s(x), s(tgt), n)
				b.MSEBackward(q, s(dp), s(x), s(tgt), n, 0.5)
			})
			p.check(name+"/MSEForward", loss, 1)
			p.check(name+"/MSEBackward", dp, 1)

			for _, to := range floatTypes {
				c := p.poison(to, n)
				p.both(func(b kernels.Backend, q kernels.Queue, s func(tp) kernels.Tensor) { b.Cast(q, s(c), s(x)) })
				p.check(fmt.Sprintf("%s/Cast->%v", name, to), c, 0) // exact
			}

			f := p.poison(dt, n)
			p.both(func(b kernels.Backend, q kernels.Queue, s func(tp) kernels.Tensor) { b.Fill(q, s(f), 1.0/3) })
			p.check(name+"/Fill", f, 0)
			p.both(func(b kernels.Backend, q kernels.Queue, s func(tp) kernels.Tensor) { b.Zero(q, s(f).Slice(0, n/2)) })
			p.check(name+"/Zero", f, 0)
		}
	}
}

// TestCastSpecials checks NaN, ±Inf, overflow and subnormals against the
// CPU conversions.
func TestCastSpecials(t *testing.T) {
	p := openPair(t)
	p.nanOK = true
	inf := float32(math.Inf(1))
	vals := []float32{0, float32(math.Copysign(0, -1)), inf, -inf, float32(math.NaN()), 65504, 65520, 1e6, -1e6,
		1e-8, -3e-7, 6e-8, 1e-40, -1e-39, 3.4e38, 1 + 1.0/256, 1 + 3.0/256}
	for _, from := range floatTypes {
		x := p.upload(from, vals)
		for _, to := range floatTypes {
			c := p.poison(to, len(vals))
			p.both(func(b kernels.Backend, q kernels.Queue, s func(tp) kernels.Tensor) { b.Cast(q, s(c), s(x)) })
			p.check(fmt.Sprintf("%v->%v", from, to), c, 0)
		}
	}
}

func TestMatmul(t *testing.T) {
	p := openPair(t)
	shapes := [][3]int{{1, 1, 1}, {7, 13, 5}, {64, 96, 80}, {33, 257, 129}}
	for _, sh := range shapes {
		BT, C, OC := sh[0], sh[1], sh[2]
		for _, dt := range floatTypes {
			for _, bias := range []bool{false, true} {
				name := fmt.Sprintf("%dx%dx%d/%v/bias=%v", BT, C, OC, dt, bias)
				x := p.random(dt, BT*C, 1)
				w := p.random(dt, OC*C, 1)
				var bs tp
				if bias {
					bs = p.random(dt, OC, 1)
				}
				out := p.poison(dt, BT*OC)
				g := p.random(dt, BT*OC, 1)
				dx := p.random(dt, BT*C, 1)
				dw := p.random(dt, OC*C, 1)
				db := p.random(dt, OC, 1)
				slack := math.Sqrt(float64(max(C, BT, OC))) // long float32 sums in different orders
				p.both(func(b kernels.Backend, q kernels.Queue, s func(tp) kernels.Tensor) {
					b.MatmulForward(q, s(out), s(x), s(w), s(bs), BT, C, OC)
					if bias {
						b.MatmulBackward(q, s(dx), s(dw), s(db), s(g), s(x), s(w), BT, C, OC)
					} else {
						b.MatmulBackward(q, kernels.Tensor{}, s(dw), kernels.Tensor{}, s(g), s(x), s(w), BT, C, OC)
					}
				})
				p.check(name+"/forward", out, slack)
				p.check(name+"/dweight", dw, slack)
				if bias {
					p.check(name+"/dinp", dx, slack)
					p.check(name+"/dbias", db, slack)
				}
			}
		}
	}
}

// TestMatmulMixed covers dtype mixes that cuBLAS cannot take directly.
func TestMatmulMixed(t *testing.T) {
	p := openPair(t)
	BT, C, OC := 19, 40, 23
	x := p.random(kernels.F32, BT*C, 1)
	w := p.random(kernels.BF16, OC*C, 1)
	bs := p.random(kernels.F16, OC, 1)
	out := p.poison(kernels.BF16, BT*OC)
	dx := p.random(kernels.F16, BT*C, 1)
	dw := p.random(kernels.F32, OC*C, 1)
	g := p.random(kernels.BF16, BT*OC, 1)
	p.both(func(b kernels.Backend, q kernels.Queue, s func(tp) kernels.Tensor) {
		b.MatmulForward(q, s(out), s(x), s(w), s(bs), BT, C, OC)
		b.MatmulBackward(q, s(dx), s(dw), kernels.Tensor{}, s(g), s(x), s(w), BT, C, OC)
	})
	p.check("forward", out, 2)
	p.check("dinp", dx, 4)
	p.check("dweight", dw, 8)
}

func TestEncoder(t *testing.T) {
	p := openPair(t)
	// The last shape puts about 1400 positions on each of two tokens: more
	// than the backward kernel sorts in shared memory (ENC_SORT, 1024), so
	// it takes the scanning path that real text takes for its commonest
	// tokens.
	for _, sh := range [][4]int{{1, 1, 1, 3}, {2, 5, 7, 11}, {4, 64, 96, 50}, {3, 33, 1100, 7}, {4, 700, 64, 2}} {
		B, T, C, V := sh[0], sh[1], sh[2], sh[3]
		for _, dt := range floatTypes {
			name := fmt.Sprintf("B%d,T%d,C%d,V%d/%v", B, T, C, V, dt)
			toks := make([]int32, B*T)
			for i := range toks {
				toks[i] = int32(p.rng.IntN(V))
			}
			tk := p.ints(toks)
			wte := p.random(dt, V*C, 1)
			wpe := p.random(dt, T*C, 1)
			out := p.poison(dt, B*T*C)
			g := p.random(dt, B*T*C, 1)
			dwte := p.random(dt, V*C, 1)
			dwpe := p.random(dt, T*C, 1)
			p.both(func(b kernels.Backend, q kernels.Queue, s func(tp) kernels.Tensor) {
				b.EncoderForward(q, s(out), s(tk), s(wte), s(wpe), B, T, C)
				b.EncoderBackward(q, s(dwte), s(dwpe), s(g), s(tk), B, T, C)
			})
			p.check(name+"/forward", out, 1)
			p.check(name+"/dwte", dwte, max(2, math.Sqrt(float64(B*T)/float64(V))))
			p.check(name+"/dwpe", dwpe, 2)
		}
	}
}

func TestLayerNorm(t *testing.T) {
	p := openPair(t)
	for _, sh := range [][2]int{{1, 1}, {5, 7}, {64, 768}, {3, 1025}} {
		N, C := sh[0], sh[1]
		for _, dt := range floatTypes {
			name := fmt.Sprintf("N%d,C%d/%v", N, C, dt)
			x := p.random(dt, N*C, 2)
			w := p.random(dt, C, 1)
			bs := p.random(dt, C, 1)
			out := p.poison(dt, N*C)
			mean, rstd := p.poison(kernels.F32, N), p.poison(kernels.F32, N)
			g := p.random(dt, N*C, 1)
			dx := p.random(dt, N*C, 1)
			dw := p.random(dt, C, 1)
			db := p.random(dt, C, 1)
			p.both(func(b kernels.Backend, q kernels.Queue, s func(tp) kernels.Tensor) {
				b.LayerNormForward(q, s(out), s(mean), s(rstd), s(x), s(w), s(bs), N, C)
				b.LayerNormBackward(q, s(dx), s(dw), s(db), s(g), s(x), s(w), s(mean), s(rstd), N, C)
			})
			p.check(name+"/forward", out, 1)
			p.check(name+"/mean", mean, 1)
			p.check(name+"/rstd", rstd, 4)
			p.check(name+"/dinp", dx, 4)
			p.check(name+"/dweight", dw, math.Sqrt(float64(N)))
			p.check(name+"/dbias", db, math.Sqrt(float64(N)))
		}
	}
}

// TestAttention checks each implementation against the CPU backend: the
// cuBLAS one with its default blocking and with tiny query blocks and
// rounds (several blocks, partial last blocks, one head per round), the
// tiled and the row-wise kernels.
func TestAttention(t *testing.T) {
	cases := []struct {
		name   string
		impl   int
		qblock int
		chunk  int64
	}{
		{"gemm", attnNoFlash, 256, 1 << 30},
		{"gemm-blocked", attnNoFlash, 16, 1},
		{"flash", attnFlash, 256, 1 << 30},
		{"tiled", attnTiled, 256, 1 << 30},
		{"rowwise", attnRowwise, 256, 1 << 30},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			defer func(impl, qb int, ch int64) { attnImpl, attnQBlock, attnChunkBytes = impl, qb, ch }(attnImpl, attnQBlock, attnChunkBytes)
			attnImpl, attnQBlock, attnChunkBytes = c.impl, c.qblock, c.chunk
			n0, nb0 := flashLaunches.Load(), flashBwdLaunches.Load()
			testAttention(t)
			// The shapes include bf16 with head sizes 128 and 64.
			if ran := flashLaunches.Load() > n0; ran != (c.impl == attnFlash) {
				t.Errorf("flash kernel ran: %v", ran)
			}
			if ran := flashBwdLaunches.Load() > nb0; ran != (c.impl == attnFlash) {
				t.Errorf("flash backward kernels ran: %v", ran)
			}
		})
	}
}

// TestAttentionFlash checks the tensor-core forward and backward kernels
// against the CPU backend at tile edges (T of 1, 63, 64, 65, 129, 200;
// 16-row warp, 32- and 64-row tile boundaries) for head sizes 64, 80, 96 and
// 128, and that
// the backend's self-checks at Open passed, which is what makes the kernels
// the default.
func TestAttentionFlash(t *testing.T) {
	defer func(impl int) { attnImpl = impl }(attnImpl)
	attnImpl = attnFlash
	p := openPair(t)
	if err := p.g.(*Backend).flashErr; err != nil {
		t.Errorf("flash self-check at Open: %v (the cuBLAS path is used instead)", err)
	}
	if err := p.g.(*Backend).flashBwdErr; err != nil {
		t.Errorf("flash backward self-check at Open: %v (the cuBLAS path is used instead)", err)
	}
	for _, sh := range [][4]int{{1, 1, 64, 1}, {2, 63, 128, 2}, {1, 64, 256, 2}, {2, 65, 256, 4}, {1, 129, 384, 3}, {2, 200, 512, 4},
		{2, 65, 160, 2}, {1, 63, 320, 4}, {1, 200, 384, 4}, {2, 129, 192, 2}} { // the last four: head sizes 80 and 96
		B, T, C, NH := sh[0], sh[1], sh[2], sh[3]
		name := fmt.Sprintf("B%d,T%d,C%d,NH%d", B, T, C, NH)
		qkv := p.random(kernels.BF16, B*T*3*C, 2)
		out := p.poison(kernels.BF16, B*T*C)
		lse := p.poison(kernels.F32, B*NH*T)
		n0 := flashLaunches.Load()
		p.both(func(b kernels.Backend, q kernels.Queue, s func(tp) kernels.Tensor) {
			b.AttentionForward(q, s(out), s(lse), s(qkv), B, T, C, NH)
		})
		if flashLaunches.Load() == n0 {
			t.Errorf("%s: the flash kernel did not run", name)
		}
		p.check(name+"/out", out, 1)
		p.check(name+"/lse", lse, 2)
		// Backward from the CPU's out and lse on both sides, into a random dqkv.
		_, wantOut := p.download(out)
		same := p.upload(kernels.BF16, wantOut)
		_, wantLse := p.download(lse)
		sameLse := p.upload(kernels.F32, wantLse)
		g := p.random(kernels.BF16, B*T*C, 1)
		dqkv := p.random(kernels.BF16, B*T*3*C, 1)
		nb0 := flashBwdLaunches.Load()
		p.both(func(b kernels.Backend, q kernels.Queue, s func(tp) kernels.Tensor) {
			b.AttentionBackward(q, s(dqkv), s(g), s(qkv), s(same), s(sameLse), B, T, C, NH)
		})
		if flashBwdLaunches.Load() == nb0 {
			t.Errorf("%s: the flash backward kernels did not run", name)
		}
		p.check(name+"/dqkv", dqkv, 2*math.Sqrt(float64(T)))
	}
}

// TestAttentionWorkspace checks that the cuBLAS path charges its workspace
// to the budget under the tag "attention".
func TestAttentionWorkspace(t *testing.T) {
	be := openCUDA(t, 256<<20)
	B, T, C, NH := 2, 64, 128, 4
	alloc := func(dt kernels.DType, n int) kernels.Tensor {
		buf, err := be.Alloc(int64(n*dt.Size()), "test")
		if err != nil {
			t.Fatal(err)
		}
		return kernels.View(buf, 0, dt, n)
	}
	qkv, out, lse := alloc(kernels.BF16, B*T*3*C), alloc(kernels.BF16, B*T*C), alloc(kernels.F32, B*NH*T)
	q := be.DefaultQueue()
	be.Fill(q, qkv, 0.5)
	be.AttentionForward(q, out, lse, qkv, B, T, C, NH)
	if err := q.Synchronize(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := planAttention(B, T, C, NH, kernels.BF16, false, be.attnChunk()).total
	if got := be.MemStats().ByTag["attention"]; got != want {
		t.Fatalf("attention workspace charged %d bytes, want %d", got, want)
	}
}

func testAttention(t *testing.T) {
	p := openPair(t)
	shapes := [][4]int{{1, 1, 4, 1}, {2, 7, 12, 3}, {2, 64, 128, 4}, {1, 33, 256, 2}, {1, 17, 40, 1},
		{3, 100, 192, 3}, {1, 9, 320, 2}}
	for _, sh := range shapes {
		B, T, C, NH := sh[0], sh[1], sh[2], sh[3]
		for _, dt := range floatTypes {
			name := fmt.Sprintf("B%d,T%d,C%d,NH%d/%v", B, T, C, NH, dt)
			qkv := p.random(dt, B*T*3*C, 1)
			out := p.poison(dt, B*T*C)
			lse := p.poison(kernels.F32, B*NH*T)
			p.both(func(b kernels.Backend, q kernels.Queue, s func(tp) kernels.Tensor) {
				b.AttentionForward(q, s(out), s(lse), s(qkv), B, T, C, NH)
			})
			p.check(name+"/out", out, 1)
			p.check(name+"/lse", lse, 2)
			// The backward pass gets the same out and lse on both sides (the CPU's).
			_, wantOut := p.download(out)
			same := p.upload(dt, wantOut)
			_, wantLse := p.download(lse)
			sameLse := p.upload(kernels.F32, wantLse)
			g := p.random(dt, B*T*C, 1)
			dqkv := p.random(dt, B*T*3*C, 1)
			p.both(func(b kernels.Backend, q kernels.Queue, s func(tp) kernels.Tensor) {
				b.AttentionBackward(q, s(dqkv), s(g), s(qkv), s(same), s(sameLse), B, T, C, NH)
			})
			p.check(name+"/dqkv", dqkv, 2*math.Sqrt(float64(T)))
		}
	}
}

func TestCrossEntropy(t *testing.T) {
	p := openPair(t)
	for _, sh := range [][2]int{{1, 1}, {5, 7}, {8, 5000}, {3, 50257}} {
		BT, V := sh[0], sh[1]
		for _, dt := range floatTypes {
			name := fmt.Sprintf("BT%d,V%d/%v", BT, V, dt)
			logits := p.random(dt, BT*V, 4)
			tg := make([]int32, BT)
			for i := range tg {
				tg[i] = int32(p.rng.IntN(V))
				if i%3 == 2 {
					tg[i] = -1
				}
			}
			targets := p.ints(tg)
			losses := p.poison(kernels.F32, BT)
			dl := p.random(dt, BT*V, 1)
			p.both(func(b kernels.Backend, q kernels.Queue, s func(tp) kernels.Tensor) {
				b.CrossEntropyForward(q, s(losses), s(logits), s(targets), BT, V)
				b.CrossEntropyBackward(q, s(dl), s(logits), s(targets), BT, V, 0.25)
			})
			p.check(name+"/losses", losses, 2)
			p.check(name+"/dlogits", dl, 1)
		}
	}
}

func TestAdamW(t *testing.T) {
	p := openPair(t)
	for _, n := range sizes {
		for _, dt := range floatTypes {
			name := fmt.Sprintf("n=%d/%v", n, dt)
			param := p.random(kernels.F32, n, 1)
			grad := p.random(dt, n, 1)
			m := p.random(kernels.F32, n, 0.1)
			v := p.upload(kernels.F32, make([]float32, n))
			p.both(func(b kernels.Backend, q kernels.Queue, s func(tp) kernels.Tensor) { b.Scale(q, s(v), 0) })
			out := p.poison(dt, n)
			prm := kernels.AdamWParams{LR: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Step: 3, GradScale: 0.5}
			p.both(func(b kernels.Backend, q kernels.Queue, s func(tp) kernels.Tensor) {
				b.AdamW(q, s(param), s(grad), s(m), s(v), s(out), prm)
				prm.Step = 4
				b.AdamW(q, s(param), s(grad), s(m), s(v), kernels.Tensor{}, prm)
				prm.Step = 3
			})
			p.check(name+"/param", param, 1)
			p.check(name+"/m", m, 1)
			p.check(name+"/v", v, 1)
			p.check(name+"/out", out, 1)
		}
	}
	// Operands off the four-element alignment of the vector kernels (a
	// slice from element 1 or 2) take the generic one: the same results.
	for _, off := range []int{1, 2} {
		const n = 1000
		name := fmt.Sprintf("offset %d", off)
		param, m := p.random(kernels.F32, n, 1), p.random(kernels.F32, n, 0.1)
		vs := make([]float32, n)
		for i := range vs {
			vs[i] = float32(i%97) * 1e-4
		}
		v, grad, out := p.upload(kernels.F32, vs), p.random(kernels.BF16, n, 1), p.poison(kernels.BF16, n)
		prm := kernels.AdamWParams{LR: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Step: 2}
		p.both(func(b kernels.Backend, q kernels.Queue, s func(tp) kernels.Tensor) {
			sl := func(x tp, o int) kernels.Tensor { return s(x).Slice(o, n-2) }
			b.AdamW(q, sl(param, off), sl(grad, off), sl(m, off), sl(v, off), sl(out, off), prm)
			b.AdamW(q, sl(param, 0), sl(grad, off), sl(m, 0), sl(v, 0), sl(out, off), prm)
		})
		p.check(name+"/param", param, 1)
		p.check(name+"/m", m, 1)
		p.check(name+"/v", v, 1)
	}
}

// TestSumSquaresFinite: out[0] accumulates Σ x² (twice, from 0.5) as the
// CPU backend does, at every size (vector heads and tails included) and
// dtype; out[1] stays 0 on finite data and is set by a NaN or -Inf in the
// last element.
func TestSumSquaresFinite(t *testing.T) {
	p := openPair(t)
	for _, n := range append(sizes, 3<<20) {
		for _, dt := range floatTypes {
			name := fmt.Sprintf("n=%d/%v", n, dt)
			x := p.random(dt, n, 1)
			out := p.upload(kernels.F32, []float32{0.5, 0})
			p.both(func(b kernels.Backend, q kernels.Queue, s func(tp) kernels.Tensor) {
				b.SumSquaresFinite(q, s(out), s(x))
				b.SumSquaresFinite(q, s(out), s(x))
			})
			p.check(name, out, math.Sqrt(float64(n)))
			if got, _ := p.download(out); got[1] != 0 {
				t.Errorf("%s: flag set on finite data", name)
			}
			for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(-1))} {
				p.both(func(b kernels.Backend, q kernels.Queue, s func(tp) kernels.Tensor) {
					b.Fill(q, s(x).Slice(n-1, 1), bad)
					b.SumSquaresFinite(q, s(out), s(x))
				})
				if got, _ := p.download(out); got[1] != 1 {
					t.Errorf("%s: missed %v", name, bad)
				}
				p.both(func(b kernels.Backend, q kernels.Queue, s func(tp) kernels.Tensor) { b.Zero(q, s(out)) })
			}
		}
	}
}

// TestAttentionFlash2HS128 checks the two-tile forwards at head size 128
// (flashFwd2x128: 64 and 32 keys per tile, the default) against the CPU
// backend with poisoned outputs, multi-head (T of 1, 65, 129, 200, 300:
// 16-row tiles, 32- and 64-key tiles, 128-row blocks) and grouped-query,
// and that their self-check at Open passed.
func TestAttentionFlash2HS128(t *testing.T) {
	defer func(impl int, v string, h bool) { attnImpl, flashFwd2x128, flashSM90 = impl, v, h }(attnImpl, flashFwd2x128, flashSM90)
	attnImpl, flashSM90 = attnFlash, false
	p := openPair(t)
	if err := p.g.(*Backend).flashFwd2x128Err; err != nil {
		t.Fatalf("head-size-128 two-tile forward self-check at Open: %v", err)
	}
	for _, v := range []string{"64", "32"} {
		flashFwd2x128 = flashFwd2x128Of(v)
		for _, sh := range [][5]int{{1, 1, 1, 1}, {2, 65, 2, 2}, {1, 129, 4, 4}, {1, 200, 2, 2}, {2, 300, 4, 4}, {1, 130, 6, 2}, {2, 97, 4, 1}} {
			B, T, NH, NKV := sh[0], sh[1], sh[2], sh[3]
			const hs = 128
			name := fmt.Sprintf("%s/B%d,T%d,NH%d,NKV%d", flashFwd2x128, B, T, NH, NKV)
			W, C := kernels.GQAWidth(NH, NKV, hs), NH*hs
			qkv := p.random(kernels.BF16, B*T*W, 2)
			out, lse := p.poison(kernels.BF16, B*T*C), p.poison(kernels.F32, B*NH*T)
			n0 := flashFwd2Launches.Load()
			p.both(func(b kernels.Backend, q kernels.Queue, s func(tp) kernels.Tensor) {
				llama(b).GQAttentionForward(q, s(out), s(lse), s(qkv), B, T, NH, NKV, hs)
			})
			if flashFwd2Launches.Load() == n0 {
				t.Errorf("%s: the two-tile kernel did not run", name)
			}
			p.check(name+"/out", out, 1)
			p.check(name+"/lse", lse, 2)
		}
	}
}

// TestAttentionFlash2 checks the two-tile forward (flash_fwd2_bf16_hs64,
// the default for head size 64) and the one-tile one it replaced against
// the CPU backend, then against each other on the same inputs (T of 1, 65,
// 128, 129, 200, 300: 16-row tiles, 64-key tiles and 128-row block edges),
// with poisoned outputs, and that its self-check at Open passed.
func TestAttentionFlash2(t *testing.T) {
	defer func(impl int, two, h bool) { attnImpl, flashFwd2, flashSM90 = impl, two, h }(attnImpl, flashFwd2, flashSM90)
	attnImpl, flashSM90 = attnFlash, false // the mma.sync kernels, not the Hopper one (flash_sm90.go)
	p := openPair(t)
	gb := p.g.(*Backend)
	if gb.flashFwd2Err != nil {
		t.Fatalf("two-tile forward self-check at Open: %v", gb.flashFwd2Err)
	}
	for _, sh := range [][4]int{{1, 1, 64, 1}, {2, 65, 128, 2}, {1, 128, 256, 4}, {2, 129, 128, 2}, {1, 200, 192, 3}, {1, 300, 256, 4}} {
		B, T, C, NH := sh[0], sh[1], sh[2], sh[3]
		name := fmt.Sprintf("B%d,T%d,C%d,NH%d", B, T, C, NH)
		qkv := p.random(kernels.BF16, B*T*3*C, 2)
		out, lse := p.poison(kernels.BF16, B*T*C), p.poison(kernels.F32, B*NH*T)
		out1, lse1 := p.poison(kernels.BF16, B*T*C), p.poison(kernels.F32, B*NH*T)
		n0 := flashFwd2Launches.Load()
		flashFwd2 = true
		p.both(func(b kernels.Backend, q kernels.Queue, s func(tp) kernels.Tensor) {
			b.AttentionForward(q, s(out), s(lse), s(qkv), B, T, C, NH)
		})
		if flashFwd2Launches.Load() == n0 {
			t.Errorf("%s: the two-tile kernel did not run", name)
		}
		p.check(name+"/out", out, 1)
		p.check(name+"/lse", lse, 2)
		// The one-tile kernel against the CPU, then the two kernels compared.
		flashFwd2 = false
		p.both(func(b kernels.Backend, q kernels.Queue, s func(tp) kernels.Tensor) {
			b.AttentionForward(q, s(out1), s(lse1), s(qkv), B, T, C, NH)
		})
		p.check(name+"/one-tile/out", out1, 1)
		p.check(name+"/one-tile/lse", lse1, 2)
		for _, c := range []struct {
			name   string
			two    tp
			one    tp
			tol, e float64
		}{{"out", out, out1, 2e-2, 1.6e-2}, {"lse", lse, lse1, 1e-3, 1e-4}} {
			two, _ := p.download(c.two)
			one, _ := p.download(c.one)
			for i := range one {
				if g, w := float64(two[i]), float64(one[i]); !(math.Abs(g-w) <= c.tol+c.e*math.Abs(w)) {
					t.Errorf("%s/%s[%d]: two-tile %g, one-tile %g", name, c.name, i, g, w)
					break
				}
			}
		}
	}
}
