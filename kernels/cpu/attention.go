package cpu

import (
	"fmt"
	"math"

	"github.com/spill-ml/spill/kernels"
)

func attnDims(op string, B, T, C, NH int) int {
	dims(op, B, T, C, NH)
	if C%NH != 0 {
		panic(fmt.Sprintf("kernels/cpu: %s: C=%d is not a multiple of NH=%d", op, C, NH))
	}
	return C / NH
}

// AttentionForward implements kernels.Ops: causal softmax attention row by
// row, keeping only the log-sum-exp of each row.
func (b *Backend) AttentionForward(q kernels.Queue, out, lse, qkv kernels.Tensor, B, T, C, NH int) {
	const op = "AttentionForward"
	hs := attnDims(op, B, T, C, NH)
	o := fview(op, "out", out, B*T*C)
	ls := f32view(op, "lse", lse, B*NH*T)
	in := fview(op, "qkv", qkv, B*T*3*C)
	scale := float32(1 / math.Sqrt(float64(hs)))
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
				qv := x[(bb*T+t)*3*C+h*hs:][:hs]
				mx := float32(math.Inf(-1))
				for t2 := 0; t2 <= t; t2++ {
					s := dot(qv, x[(bb*T+t2)*3*C+C+h*hs:][:hs]) * scale
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
					axpy(p[t2]*inv, x[(bb*T+t2)*3*C+2*C+h*hs:][:hs], yo)
				}
			}
		})
		commit()
		return nil
	})
}

// AttentionBackward implements kernels.Ops. Probabilities are recomputed
// from qkv and lse; each (batch, head) pair is one task, so the key and
// value gradients it accumulates are private to it.
func (b *Backend) AttentionBackward(q kernels.Queue, dqkv, dout, qkv, out, lse kernels.Tensor, B, T, C, NH int) {
	const op = "AttentionBackward"
	hs := attnDims(op, B, T, C, NH)
	dx := fview(op, "dqkv", dqkv, B*T*3*C)
	dy := fview(op, "dout", dout, B*T*C)
	in := fview(op, "qkv", qkv, B*T*3*C)
	fview(op, "out", out, B*T*C) // not needed: D is recomputed exactly
	ls := f32view(op, "lse", lse, B*NH*T)
	scale := float32(1 / math.Sqrt(float64(hs)))
	b.queue(q).enqueue(op, func() error {
		x, relX := b.input(in)
		defer relX()
		g, relG := b.input(dy)
		defer relG()
		d, commit := b.output(dx, true)
		b.pool.run(B*NH, func(bh int) {
			bb, h := bh/NH, bh%NH
			p, dp := getScratch(T), getScratch(T)
			defer putScratch(p)
			defer putScratch(dp)
			for t := 0; t < T; t++ {
				qv := x[(bb*T+t)*3*C+h*hs:][:hs]
				gv := g[(bb*T+t)*C+h*hs:][:hs]
				l := ls[bh*T+t]
				var D float32
				for t2 := 0; t2 <= t; t2++ {
					base := (bb*T + t2) * 3 * C
					pi := float32(math.Exp(float64(dot(qv, x[base+C+h*hs:][:hs])*scale - l)))
					dpi := dot(gv, x[base+2*C+h*hs:][:hs])
					p[t2], dp[t2] = pi, dpi
					D += pi * dpi
				}
				dq := d[(bb*T+t)*3*C+h*hs:][:hs]
				for t2 := 0; t2 <= t; t2++ {
					base := (bb*T + t2) * 3 * C
					ds := p[t2] * (dp[t2] - D) * scale
					axpy(ds, x[base+C+h*hs:][:hs], dq)
					axpy(ds, qv, d[base+C+h*hs:][:hs])
					axpy(p[t2], gv, d[base+2*C+h*hs:][:hs])
				}
			}
		})
		commit()
		return nil
	})
}

func dot(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}

// axpy computes y += a*x.
func axpy(a float32, x, y []float32) {
	y = y[:len(x)]
	i := 0
	for ; i+4 <= len(x); i += 4 {
		y[i] += a * x[i]
		y[i+1] += a * x[i+1]
		y[i+2] += a * x[i+2]
		y[i+3] += a * x[i+3]
	}
	for ; i < len(x); i++ {
		y[i] += a * x[i]
	}
}
