package cpu

import (
	"fmt"
	"math"
	"sync/atomic"

	"github.com/spill-ml/spill/kernels"
)

// Elementwise ops run over [0, N) in parallel ranges, each range in blocks
// of blk elements converted through stack scratch.
const (
	blk        = 1024
	elemGrain  = 1 << 14
	scratchLen = blk
)

func (b *Backend) elementwise(n int, fn func(lo, hi int)) {
	b.pool.parallel(n, elemGrain, func(lo, hi int) {
		for s := lo; s < hi; s += blk {
			fn(s, min(s+blk, hi))
		}
	})
}

// Zero implements kernels.Ops (any dtype).
func (b *Backend) Zero(q kernels.Queue, t kernels.Tensor) {
	d := bytesOf(t)
	b.queue(q).enqueue("Zero", func() error {
		b.pool.parallel(len(d), 1<<18, func(lo, hi int) { clear(d[lo:hi]) })
		return nil
	})
}

// Fill implements kernels.Ops.
func (b *Backend) Fill(q kernels.Queue, t kernels.Tensor, x float32) {
	v := fview("Fill", "t", t, t.N)
	b.queue(q).enqueue("Fill", func() error {
		b.elementwise(v.n, func(lo, hi int) {
			var s [scratchLen]float32
			o := s[:hi-lo]
			for i := range o {
				o[i] = x
			}
			v.store(lo, o)
		})
		return nil
	})
}

// Cast implements kernels.Ops.
func (b *Backend) Cast(q kernels.Queue, dst, src kernels.Tensor) {
	if dst.N != src.N {
		panic(fmt.Sprintf("kernels/cpu: Cast of %d elements into %d", src.N, dst.N))
	}
	d, s := fview("Cast", "dst", dst, dst.N), fview("Cast", "src", src, src.N)
	b.queue(q).enqueue("Cast", func() error {
		b.elementwise(d.n, func(lo, hi int) {
			var sa [scratchLen]float32
			d.store(lo, s.load(lo, hi, sa[:]))
		})
		return nil
	})
}

// Add implements kernels.Ops.
func (b *Backend) Add(q kernels.Queue, dst, src kernels.Tensor) {
	if dst.N != src.N {
		panic(fmt.Sprintf("kernels/cpu: Add of %d elements into %d", src.N, dst.N))
	}
	d, s := fview("Add", "dst", dst, dst.N), fview("Add", "src", src, src.N)
	b.queue(q).enqueue("Add", func() error {
		b.elementwise(d.n, func(lo, hi int) {
			var da, sa [scratchLen]float32
			x, y := d.load(lo, hi, da[:]), s.load(lo, hi, sa[:])
			for i := range x {
				x[i] += y[i]
			}
			d.store(lo, x)
		})
		return nil
	})
}

// Scale implements kernels.Ops.
func (b *Backend) Scale(q kernels.Queue, t kernels.Tensor, sc float32) {
	v := fview("Scale", "t", t, t.N)
	b.queue(q).enqueue("Scale", func() error {
		b.elementwise(v.n, func(lo, hi int) {
			var sa [scratchLen]float32
			x := v.load(lo, hi, sa[:])
			for i := range x {
				x[i] *= sc
			}
			v.store(lo, x)
		})
		return nil
	})
}

const (
	geluScale = 0.7978845608028654 // sqrt(2/pi)
	geluCube  = 0.044715
)

// GeluForward implements kernels.Ops.
func (b *Backend) GeluForward(q kernels.Queue, out, inp kernels.Tensor, N int) {
	dims("GeluForward", N)
	o, x := fview("GeluForward", "out", out, N), fview("GeluForward", "inp", inp, N)
	b.queue(q).enqueue("GeluForward", func() error {
		b.elementwise(N, func(lo, hi int) {
			var xa, oa [scratchLen]float32
			xs := x.load(lo, hi, xa[:])
			os := oa[:hi-lo]
			if o.dt == kernels.F32 {
				os = o.f[lo:hi]
			}
			for i, v := range xs {
				u := geluScale * (v + geluCube*v*v*v)
				os[i] = 0.5 * v * (1 + float32(math.Tanh(float64(u))))
			}
			o.store(lo, os)
		})
		return nil
	})
}

// GeluBackward implements kernels.Ops.
func (b *Backend) GeluBackward(q kernels.Queue, dinp, inp, dout kernels.Tensor, N int) {
	dims("GeluBackward", N)
	di := fview("GeluBackward", "dinp", dinp, N)
	x := fview("GeluBackward", "inp", inp, N)
	dy := fview("GeluBackward", "dout", dout, N)
	b.queue(q).enqueue("GeluBackward", func() error {
		b.elementwise(N, func(lo, hi int) {
			var xa, ya, da [scratchLen]float32
			xs, ys, ds := x.load(lo, hi, xa[:]), dy.load(lo, hi, ya[:]), di.load(lo, hi, da[:])
			for i, v := range xs {
				u := geluScale * (v + geluCube*v*v*v)
				th := float32(math.Tanh(float64(u)))
				sech2 := 1 - th*th
				g := 0.5*(1+th) + 0.5*v*sech2*geluScale*(1+3*geluCube*v*v)
				ds[i] += g * ys[i]
			}
			di.store(lo, ds)
		})
		return nil
	})
}

// MSEForward implements kernels.Ops.
func (b *Backend) MSEForward(q kernels.Queue, losses, pred, target kernels.Tensor, N int) {
	dims("MSEForward", N)
	l := f32view("MSEForward", "losses", losses, N)
	p := fview("MSEForward", "pred", pred, N)
	t := f32view("MSEForward", "target", target, N)
	b.queue(q).enqueue("MSEForward", func() error {
		b.elementwise(N, func(lo, hi int) {
			var pa [scratchLen]float32
			ps := p.load(lo, hi, pa[:])
			for i, v := range ps {
				d := v - t[lo+i]
				l[lo+i] = d * d / 2
			}
		})
		return nil
	})
}

// MSEBackward implements kernels.Ops.
func (b *Backend) MSEBackward(q kernels.Queue, dpred, pred, target kernels.Tensor, N int, scale float32) {
	dims("MSEBackward", N)
	dp := fview("MSEBackward", "dpred", dpred, N)
	p := fview("MSEBackward", "pred", pred, N)
	t := f32view("MSEBackward", "target", target, N)
	b.queue(q).enqueue("MSEBackward", func() error {
		b.elementwise(N, func(lo, hi int) {
			var pa, da [scratchLen]float32
			ps, ds := p.load(lo, hi, pa[:]), dp.load(lo, hi, da[:])
			for i, v := range ps {
				ds[i] += scale * (v - t[lo+i])
			}
			dp.store(lo, ds)
		})
		return nil
	})
}

// SumSquaresFinite implements kernels.Ops in one pass: partial sums in
// float64, so the norm of a large gradient does not lose its small terms;
// a block whose float32 sum is not finite (a NaN or Inf in it, or a square
// past float32's range) is scanned again element by element for the flag.
func (b *Backend) SumSquaresFinite(q kernels.Queue, out, x kernels.Tensor) {
	o := f32view("SumSquaresFinite", "out", out, 2)
	v := fview("SumSquaresFinite", "x", x, x.N)
	b.queue(q).enqueue("SumSquaresFinite", func() error {
		var bad atomic.Bool
		parts := b.partials(v.n, func(lo, hi int) float64 {
			var sa [scratchLen]float32
			acc, nonFinite := 0.0, false
			for s := lo; s < hi; s += blk {
				var a float32
				es := v.load(s, min(s+blk, hi), sa[:])
				for _, e := range es {
					a += e * e
				}
				if !nonFinite && (math.IsNaN(float64(a)) || math.IsInf(float64(a), 0)) {
					for _, e := range es {
						if math.IsNaN(float64(e)) || math.IsInf(float64(e), 0) {
							nonFinite = true
							break
						}
					}
				}
				acc += float64(a)
			}
			if nonFinite {
				bad.Store(true)
			}
			return acc
		})
		total := 0.0
		for _, p := range parts {
			total += p
		}
		o[0] += float32(total)
		if bad.Load() {
			o[1] = 1
		}
		return nil
	})
}

// partials runs fn over parallel ranges of [0, n) and returns one result
// per range, in order.
func (b *Backend) partials(n int, fn func(lo, hi int) float64) []float64 {
	if n == 0 {
		return nil
	}
	chunks := min(max(n/elemGrain, 1), 4*b.threads)
	size := (n + chunks - 1) / chunks
	chunks = (n + size - 1) / size
	out := make([]float64, chunks)
	b.pool.run(chunks, func(i int) {
		lo := i * size
		out[i] = fn(lo, min(lo+size, n))
	})
	return out
}

// AdamW implements kernels.Ops: one fused pass over param, grad, m, v (and
// out), in parallel chunks.
func (b *Backend) AdamW(q kernels.Queue, param, grad, m, v, out kernels.Tensor, p kernels.AdamWParams) {
	n := param.N
	pw := f32view("AdamW", "param", param, n)
	g := fview("AdamW", "grad", grad, n)
	mw := f32view("AdamW", "m", m, n)
	vw := f32view("AdamW", "v", v, n)
	o, hasOut := optview("AdamW", "out", out, n)
	c, err := newAdamConsts(p)
	if err != nil {
		panic("kernels/cpu: AdamW: " + err.Error())
	}
	b.queue(q).enqueue("AdamW", func() error {
		b.elementwise(n, func(lo, hi int) {
			var ga [blk]float32
			adamwBlock(pw, mw, vw, g, o, hasOut, lo, hi, &c, &ga)
		})
		return nil
	})
}
