package cpu

import (
	"fmt"
	"math"

	"github.com/spill-ml/spill/kernels"
)

// The Llama kernels (kernels.LlamaOps): RMSNorm, RoPE, SwiGLU and
// grouped-query attention.

var _ kernels.LlamaOps = (*Backend)(nil)

// RMSNormForward implements kernels.LlamaOps.
func (b *Backend) RMSNormForward(q kernels.Queue, out, rstd, inp, weight kernels.Tensor, N, C int, eps float32) {
	const op = "RMSNormForward"
	dims(op, N, C)
	if !(eps >= 0) {
		panic(fmt.Sprintf("kernels/cpu: %s: eps %v must be non-negative", op, eps))
	}
	o := fview(op, "out", out, N*C)
	rs := f32view(op, "rstd", rstd, N)
	x := fview(op, "inp", inp, N*C)
	w := fview(op, "weight", weight, C)
	b.queue(q).enqueue(op, func() error {
		wf, relW := b.inputSmall(w)
		defer relW()
		b.normRows(o, x, N, C, func(r int, xs, row []float32) {
			s := dot(xs, xs) // Σ x²
			rstd := 1 / float32(math.Sqrt(float64(s/float32(C)+eps)))
			for i, v := range xs {
				row[i] = v * rstd * wf[i]
			}
			rs[r] = rstd
		})
		return nil
	})
}

// RMSNormBackward implements kernels.LlamaOps. With n = x·rstd the
// normalised row, dx = rstd·(w·dy - n·mean(w·dy·n)) and dw = Σ_rows dy·n;
// dweight is summed per chunk of rows and added once.
func (b *Backend) RMSNormBackward(q kernels.Queue, dinp, dweight, dout, inp, weight, rstd kernels.Tensor, N, C int) {
	const op = "RMSNormBackward"
	dims(op, N, C)
	di, hasDi := optview(op, "dinp", dinp, N*C)
	dw := fview(op, "dweight", dweight, C)
	dy := fview(op, "dout", dout, N*C)
	x := fview(op, "inp", inp, N*C)
	w := fview(op, "weight", weight, C)
	rs := f32view(op, "rstd", rstd, N)
	b.queue(q).enqueue(op, func() error {
		wf, relW := b.inputSmall(w)
		defer relW()
		sums := b.normChunks(N, C, 1, func(lo, hi int, parts [][]float32, xa, ya, da []float32) {
			cw := parts[0]
			for r := lo; r < hi; r++ {
				xs, ys := x.load(r*C, r*C+C, xa), dy.load(r*C, r*C+C, ya)
				s := rs[r]
				var dot float32
				for i, v := range xs {
					n := v * s
					dot += wf[i] * ys[i] * n
					cw[i] += ys[i] * n
				}
				dot /= float32(C)
				if hasDi {
					ds := di.load(r*C, r*C+C, da)
					for i, v := range xs {
						ds[i] += (wf[i]*ys[i] - v*s*dot) * s
					}
					di.store(r*C, ds)
				}
			}
		})
		addPartials(dw, sums[0], make([]float32, C))
		return nil
	})
}

func silu(g float32) (silu, sigmoid float32) {
	s := float32(1 / (1 + math.Exp(-float64(g))))
	return g * s, s
}

// SwiGLUForward implements kernels.LlamaOps.
func (b *Backend) SwiGLUForward(q kernels.Queue, out, gate, up kernels.Tensor, N int) {
	const op = "SwiGLUForward"
	dims(op, N)
	o, g, u := fview(op, "out", out, N), fview(op, "gate", gate, N), fview(op, "up", up, N)
	b.queue(q).enqueue(op, func() error {
		b.elementwise(N, func(lo, hi int) {
			var ga, ua, oa [scratchLen]float32
			gs, us := g.load(lo, hi, ga[:]), u.load(lo, hi, ua[:])
			os := oa[:hi-lo]
			if o.dt == kernels.F32 {
				os = o.f[lo:hi]
			}
			for i, v := range gs {
				sl, _ := silu(v)
				os[i] = sl * us[i]
			}
			o.store(lo, os)
		})
		return nil
	})
}

// SwiGLUBackward implements kernels.LlamaOps, with
// silu'(g) = σ(g)·(1 + g·(1-σ(g))).
func (b *Backend) SwiGLUBackward(q kernels.Queue, dgate, dup, dout, gate, up kernels.Tensor, N int) {
	const op = "SwiGLUBackward"
	dims(op, N)
	dg, du := fview(op, "dgate", dgate, N), fview(op, "dup", dup, N)
	dy := fview(op, "dout", dout, N)
	g, u := fview(op, "gate", gate, N), fview(op, "up", up, N)
	b.queue(q).enqueue(op, func() error {
		b.elementwise(N, func(lo, hi int) {
			var ga, ua, ya, dga, dua [scratchLen]float32
			gs, us, ys := g.load(lo, hi, ga[:]), u.load(lo, hi, ua[:]), dy.load(lo, hi, ya[:])
			dgs, dus := dg.load(lo, hi, dga[:]), du.load(lo, hi, dua[:])
			for i, v := range gs {
				sl, s := silu(v)
				dgs[i] += ys[i] * us[i] * (s * (1 + v*(1-s)))
				dus[i] += ys[i] * sl
			}
			dg.store(lo, dgs)
			du.store(lo, dus)
		})
		return nil
	})
}

// ropeDims checks the RoPE and GQA dimensions and returns the packed row
// width (NH+2·NKV)·hs.
func ropeDims(op string, B, T, NH, NKV, hs int) int {
	dims(op, B, T, NH, NKV, hs)
	if NH%NKV != 0 {
		panic(fmt.Sprintf("kernels/cpu: %s: NH=%d query heads is not a multiple of NKV=%d key/value heads", op, NH, NKV))
	}
	return kernels.GQAWidth(NH, NKV, hs)
}

// overlap reports whether the byte ranges of a and b share memory.
func overlap(a, b kernels.Tensor) bool {
	return a.Buf == b.Buf && a.Off < b.Off+b.Bytes() && b.Off < a.Off+a.Bytes()
}

// RoPEForward implements kernels.LlamaOps.
func (b *Backend) RoPEForward(q kernels.Queue, out, inp, table kernels.Tensor, B, T, NH, NKV, hs int) {
	b.rope("RoPEForward", q, out, inp, table, B, T, NH, NKV, hs, false, false)
}

// RoPEBackward implements kernels.LlamaOps.
func (b *Backend) RoPEBackward(q kernels.Queue, dinp, dout, table kernels.Tensor, B, T, NH, NKV, hs int) {
	b.rope("RoPEBackward", q, dinp, dout, table, B, T, NH, NKV, hs, true, true)
}

// RoPEBackwardSet implements kernels.LlamaOps.
func (b *Backend) RoPEBackwardSet(q kernels.Queue, dinp, dout, table kernels.Tensor, B, T, NH, NKV, hs int) {
	b.rope("RoPEBackwardSet", q, dinp, dout, table, B, T, NH, NKV, hs, true, false)
}

// rope computes out = R·inp (or Rᵀ·inp with inverse), or out += Rᵀ·inp
// with accumulate, one token row at a time: a row is loaded whole before
// it is written, so out may be inp.
func (b *Backend) rope(op string, q kernels.Queue, out, inp, table kernels.Tensor, B, T, NH, NKV, hs int, inverse, accumulate bool) {
	W := ropeDims(op, B, T, NH, NKV, hs)
	if hs%2 != 0 {
		panic(fmt.Sprintf("kernels/cpu: %s: head size %d is odd", op, hs))
	}
	o := fview(op, "out", out, B*T*W)
	x := fview(op, "inp", inp, B*T*W)
	tab := f32view(op, "table", table, T*hs)
	o1, x1 := out.Slice(0, B*T*W), inp.Slice(0, B*T*W)
	if overlap(o1, x1) && (accumulate || o1 != x1) {
		panic(fmt.Sprintf("kernels/cpu: %s: the output overlaps the input (only exactly the same tensor is allowed, and not when accumulating)", op))
	}
	nrot := (NH + NKV) * hs // the query and key heads
	b.queue(q).enqueue(op, func() error {
		b.pool.parallel(B*T, max(1, 8192/W), func(lo, hi int) {
			xa, oa, da := getScratch(W), getScratch(W), getScratch(W)
			defer putScratch(xa)
			defer putScratch(oa)
			defer putScratch(da)
			for r := lo; r < hi; r++ {
				t := r % T
				xs := x.load(r*W, r*W+W, xa)
				ys := oa[:W]
				if o.dt == kernels.F32 && !accumulate {
					ys = o.f[r*W : r*W+W]
				}
				ropeRow(ys[:nrot], xs[:nrot], tab[t*hs:t*hs+hs], inverse)
				copy(ys[nrot:], xs[nrot:])
				if accumulate {
					ds := o.load(r*W, r*W+W, da)
					for i, v := range ys {
						ds[i] += v
					}
					ys = ds
				}
				o.store(r*W, ys)
			}
		})
		return nil
	})
}

// ropeRow rotates each head of x (a multiple of len(cs) long) into y,
// pairing element i with i+hs/2; cs is one table row, cos then sin. y may
// be x.
func ropeRow(y, x, cs []float32, inverse bool) {
	hs := len(cs)
	half := hs / 2
	cos, sin := cs[:half], cs[half:hs]
	for h := 0; h+hs <= len(x); h += hs {
		xh, yh := x[h:h+hs], y[h:h+hs]
		for i, c := range cos {
			s := sin[i]
			if inverse {
				s = -s
			}
			a, e := xh[i], xh[i+half]
			yh[i] = a*c - e*s
			yh[i+half] = e*c + a*s
		}
	}
}

// GQAttentionForward implements kernels.LlamaOps: causal softmax attention
// row by row, keeping only the log-sum-exp of each row. With NKV = NH it
// does exactly the arithmetic of AttentionForward.
func (b *Backend) GQAttentionForward(q kernels.Queue, out, lse, qkv kernels.Tensor, B, T, NH, NKV, hs int) {
	const op = "GQAttentionForward"
	W := ropeDims(op, B, T, NH, NKV, hs)
	C := NH * hs
	o := fview(op, "out", out, B*T*C)
	ls := f32view(op, "lse", lse, B*NH*T)
	in := fview(op, "qkv", qkv, B*T*W)
	scale := float32(1 / math.Sqrt(float64(hs)))
	rep := NH / NKV
	kOff, vOff := NH*hs, (NH+NKV)*hs
	b.queue(q).enqueue(op, func() error {
		x, relX := b.input(in)
		defer relX()
		y, commit := b.output(o, false)
		rows := B * NH * T
		b.pool.parallel(rows, max(1, 16384/(T*hs+1)), func(lo, hi int) {
			p := getScratch(T)
			defer putScratch(p)
			for r := lo; r < hi; r++ {
				bh, t := r/T, r%T
				bb, h := bh/NH, bh%NH
				kv := h / rep
				qv := x[(bb*T+t)*W+h*hs:][:hs]
				mx := float32(math.Inf(-1))
				for t2 := 0; t2 <= t; t2++ {
					s := dot(qv, x[(bb*T+t2)*W+kOff+kv*hs:][:hs]) * scale
					p[t2] = s
					mx = max(mx, s)
				}
				var sum float32
				for t2 := 0; t2 <= t; t2++ {
					e := float32(math.Exp(float64(p[t2] - mx)))
					p[t2] = e
					sum += e
				}
				ls[r] = mx + float32(math.Log(float64(sum)))
				inv := 1 / sum
				yo := y[(bb*T+t)*C+h*hs:][:hs]
				clear(yo)
				for t2 := 0; t2 <= t; t2++ {
					axpy(p[t2]*inv, x[(bb*T+t2)*W+vOff+kv*hs:][:hs], yo)
				}
			}
		})
		commit()
		return nil
	})
}

// GQAttentionBackward implements kernels.LlamaOps. Probabilities are
// recomputed from qkv and lse; each (batch, key/value head) pair is one
// task that runs the query heads of its group in order, so the key and
// value gradients it accumulates are private to it. With NKV = NH it does
// exactly the arithmetic of AttentionBackward.
func (b *Backend) GQAttentionBackward(q kernels.Queue, dqkv, dout, qkv, out, lse kernels.Tensor, B, T, NH, NKV, hs int) {
	const op = "GQAttentionBackward"
	W := ropeDims(op, B, T, NH, NKV, hs)
	C := NH * hs
	dx := fview(op, "dqkv", dqkv, B*T*W)
	dy := fview(op, "dout", dout, B*T*C)
	in := fview(op, "qkv", qkv, B*T*W)
	fview(op, "out", out, B*T*C) // not needed: D is recomputed exactly
	ls := f32view(op, "lse", lse, B*NH*T)
	scale := float32(1 / math.Sqrt(float64(hs)))
	rep := NH / NKV
	kOff, vOff := NH*hs, (NH+NKV)*hs
	b.queue(q).enqueue(op, func() error {
		x, relX := b.input(in)
		defer relX()
		g, relG := b.input(dy)
		defer relG()
		d, commit := b.output(dx, true)
		b.pool.run(B*NKV, func(bg int) {
			bb, kv := bg/NKV, bg%NKV
			p, dp := getScratch(T), getScratch(T)
			defer putScratch(p)
			defer putScratch(dp)
			for h := kv * rep; h < (kv+1)*rep; h++ {
				bh := bb*NH + h
				for t := 0; t < T; t++ {
					qv := x[(bb*T+t)*W+h*hs:][:hs]
					gv := g[(bb*T+t)*C+h*hs:][:hs]
					l := ls[bh*T+t]
					var D float32
					for t2 := 0; t2 <= t; t2++ {
						base := (bb*T + t2) * W
						pi := float32(math.Exp(float64(dot(qv, x[base+kOff+kv*hs:][:hs])*scale - l)))
						dpi := dot(gv, x[base+vOff+kv*hs:][:hs])
						p[t2], dp[t2] = pi, dpi
						D += pi * dpi
					}
					dq := d[(bb*T+t)*W+h*hs:][:hs]
					for t2 := 0; t2 <= t; t2++ {
						base := (bb*T + t2) * W
						ds := p[t2] * (dp[t2] - D) * scale
						axpy(ds, x[base+kOff+kv*hs:][:hs], dq)
						axpy(ds, qv, d[base+kOff+kv*hs:][:hs])
						axpy(p[t2], gv, d[base+vOff+kv*hs:][:hs])
					}
				}
			}
		})
		commit()
		return nil
	})
}
