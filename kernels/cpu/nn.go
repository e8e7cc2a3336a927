package cpu

import (
	"fmt"
	"math"
	"sort"

	"github.com/spill-ml/spill/kernels"
)

// EncoderForward implements kernels.Ops.
func (b *Backend) EncoderForward(q kernels.Queue, out, tokens, wte, wpe kernels.Tensor, B, T, C int) {
	const op = "EncoderForward"
	dims(op, B, T, C)
	o := fview(op, "out", out, B*T*C)
	tok := i32view(op, "tokens", tokens, B*T)
	V := wte.N / C
	if V < 1 {
		panic(fmt.Sprintf("kernels/cpu: %s: wte has %d elements, fewer than one row of %d", op, wte.N, C))
	}
	we := fview(op, "wte", wte, V*C)
	wp := fview(op, "wpe", wpe, T*C)
	b.queue(q).enqueue(op, func() error {
		b.pool.parallel(B*T, max(1, 4096/C), func(lo, hi int) {
			ea, pa := getScratch(C), getScratch(C)
			defer putScratch(ea)
			defer putScratch(pa)
			for r := lo; r < hi; r++ {
				id := int(tok[r])
				if id < 0 || id >= V {
					panic(fmt.Sprintf("token %d at (b=%d, t=%d) outside the vocabulary [0, %d)", id, r/T, r%T, V))
				}
				e := we.load(id*C, id*C+C, ea)
				t := r % T
				p := wp.load(t*C, t*C+C, pa)
				row := ea[:C]
				if o.dt == kernels.F32 {
					row = o.f[r*C : r*C+C]
				}
				for i := range row {
					row[i] = e[i] + p[i]
				}
				o.store(r*C, row)
			}
		})
		return nil
	})
}

// EncoderBackward implements kernels.Ops. Rows are grouped by token so
// each row of dwte is read, summed in float32 and rounded exactly once,
// and distinct tokens update disjoint rows in parallel.
func (b *Backend) EncoderBackward(q kernels.Queue, dwte, dwpe, dout, tokens kernels.Tensor, B, T, C int) {
	const op = "EncoderBackward"
	dims(op, B, T, C)
	V := dwte.N / C
	if V < 1 {
		panic(fmt.Sprintf("kernels/cpu: %s: dwte has %d elements, fewer than one row of %d", op, dwte.N, C))
	}
	dwe := fview(op, "dwte", dwte, V*C)
	dwp := fview(op, "dwpe", dwpe, T*C)
	dy := fview(op, "dout", dout, B*T*C)
	tok := i32view(op, "tokens", tokens, B*T)
	b.queue(q).enqueue(op, func() error {
		// Group rows by token id.
		rows := make([]int32, B*T)
		for i := range rows {
			rows[i] = int32(i)
			if id := tok[i]; id < 0 || int(id) >= V {
				panic(fmt.Sprintf("token %d at (b=%d, t=%d) outside the vocabulary [0, %d)", id, i/T, i%T, V))
			}
		}
		sort.Slice(rows, func(i, j int) bool {
			ti, tj := tok[rows[i]], tok[rows[j]]
			return ti < tj || ti == tj && rows[i] < rows[j]
		})
		var starts []int
		for i := range rows {
			if i == 0 || tok[rows[i]] != tok[rows[i-1]] {
				starts = append(starts, i)
			}
		}
		starts = append(starts, len(rows))
		b.pool.run(len(starts)-1, func(g int) {
			acc, sa := getScratch(C), getScratch(C)
			defer putScratch(acc)
			defer putScratch(sa)
			id := int(tok[rows[starts[g]]])
			d := dwe.load(id*C, id*C+C, acc)
			for _, r := range rows[starts[g]:starts[g+1]] {
				for i, x := range dy.load(int(r)*C, int(r)*C+C, sa) {
					d[i] += x
				}
			}
			dwe.store(id*C, d)
		})
		// dwpe: each position sums over the batch.
		b.pool.parallel(T, max(1, 4096/(B*C)), func(lo, hi int) {
			acc, sa := getScratch(C), getScratch(C)
			defer putScratch(acc)
			defer putScratch(sa)
			for t := lo; t < hi; t++ {
				d := dwp.load(t*C, t*C+C, acc)
				for bb := 0; bb < B; bb++ {
					r := bb*T + t
					for i, x := range dy.load(r*C, r*C+C, sa) {
						d[i] += x
					}
				}
				dwp.store(t*C, d)
			}
		})
		return nil
	})
}

const lnEps = 1e-5

// normRows runs the rows of a norm's forward pass, N rows of C, in
// parallel: it calls row for each row r with xs, row r of x as float32,
// and ys, the output row to fill, then stores ys into o. ys is o's own
// memory when o is F32, else a scratch row that the store rounds.
func (b *Backend) normRows(o, x view, N, C int, row func(r int, xs, ys []float32)) {
	b.pool.parallel(N, max(1, 8192/C), func(lo, hi int) {
		xa, oa := getScratch(C), getScratch(C)
		defer putScratch(xa)
		defer putScratch(oa)
		for r := lo; r < hi; r++ {
			xs := x.load(r*C, r*C+C, xa)
			ys := oa[:C]
			if o.dt == kernels.F32 {
				ys = o.f[r*C : r*C+C]
			}
			row(r, xs, ys)
			o.store(r*C, ys)
		}
	})
}

// LayerNormForward implements kernels.Ops.
func (b *Backend) LayerNormForward(q kernels.Queue, out, mean, rstd, inp, weight, bias kernels.Tensor, N, C int) {
	const op = "LayerNormForward"
	dims(op, N, C)
	o := fview(op, "out", out, N*C)
	mu := f32view(op, "mean", mean, N)
	rs := f32view(op, "rstd", rstd, N)
	x := fview(op, "inp", inp, N*C)
	w := fview(op, "weight", weight, C)
	bi, hasBias := optview(op, "bias", bias, C)
	b.queue(q).enqueue(op, func() error {
		wf, relW := b.inputSmall(w)
		defer relW()
		var bf []float32
		if hasBias {
			var relB func()
			bf, relB = b.inputSmall(bi)
			defer relB()
		}
		b.normRows(o, x, N, C, func(r int, xs, row []float32) {
			var s float32
			for _, v := range xs {
				s += v
			}
			m := s / float32(C)
			var vs float32
			for _, v := range xs {
				d := v - m
				vs += d * d
			}
			rstd := 1 / float32(math.Sqrt(float64(vs/float32(C)+lnEps)))
			for i, v := range xs {
				y := (v - m) * rstd * wf[i]
				if bf != nil {
					y += bf[i]
				}
				row[i] = y
			}
			mu[r], rs[r] = m, rstd
		})
		return nil
	})
}

// inputSmall converts a small operand (a parameter vector) without the pool.
func (b *Backend) inputSmall(v view) ([]float32, func()) {
	if v.dt == kernels.F32 {
		return v.f, func() {}
	}
	s := getScratch(v.n)
	v.load(0, v.n, s)
	return s, func() { putScratch(s) }
}

// normChunks runs the rows of a norm's backward pass, N rows of C, in
// parallel chunks of rows. It calls chunk once a chunk, with its rows
// [lo, hi), nparts zeroed partial sums of C floats that only the chunk
// adds to (its part of the weight gradients) and three scratch rows of C
// floats. It returns, for each part, the partial sums of all the chunks,
// in the order of the chunks, for addPartials.
func (b *Backend) normChunks(N, C, nparts int, chunk func(lo, hi int, parts [][]float32, xa, ya, da []float32)) [][]float32 {
	chunks := min(b.threads*4, max(1, N*C/8192), N)
	size := (N + chunks - 1) / chunks
	chunks = (N + size - 1) / size
	sums := make([][]float32, nparts)
	for k := range sums {
		sums[k] = make([]float32, chunks*C)
	}
	b.pool.run(chunks, func(ch int) {
		xa, ya, da := getScratch(C), getScratch(C), getScratch(C)
		defer putScratch(xa)
		defer putScratch(ya)
		defer putScratch(da)
		parts := make([][]float32, nparts)
		for k, s := range sums {
			parts[k] = s[ch*C : ch*C+C]
		}
		chunk(ch*size, min(ch*size+size, N), parts, xa, ya, da)
	})
	return sums
}

// addPartials adds to dst, C floats, the partial sums of normChunks' chunks
// (sums, C floats a chunk), one chunk after another; buf (C floats) holds
// dst converted to float32 when it is not F32.
func addPartials(dst view, sums, buf []float32) {
	C := len(buf)
	d := dst.load(0, C, buf)
	for ch := 0; ch < len(sums)/C; ch++ {
		for i, v := range sums[ch*C : ch*C+C] {
			d[i] += v
		}
	}
	dst.store(0, d)
}

// LayerNormBackward implements kernels.Ops.
func (b *Backend) LayerNormBackward(q kernels.Queue, dinp, dweight, dbias, dout, inp, weight, mean, rstd kernels.Tensor, N, C int) {
	const op = "LayerNormBackward"
	dims(op, N, C)
	di, hasDi := optview(op, "dinp", dinp, N*C)
	dw := fview(op, "dweight", dweight, C)
	db, hasDb := optview(op, "dbias", dbias, C)
	dy := fview(op, "dout", dout, N*C)
	x := fview(op, "inp", inp, N*C)
	w := fview(op, "weight", weight, C)
	mu := f32view(op, "mean", mean, N)
	rs := f32view(op, "rstd", rstd, N)
	b.queue(q).enqueue(op, func() error {
		wf, relW := b.inputSmall(w)
		defer relW()
		sums := b.normChunks(N, C, 2, func(lo, hi int, parts [][]float32, xa, ya, da []float32) {
			cw, cb := parts[0], parts[1]
			for r := lo; r < hi; r++ {
				xs, ys := x.load(r*C, r*C+C, xa), dy.load(r*C, r*C+C, ya)
				m, s := mu[r], rs[r]
				var dnMean, dnNormMean float32
				for i, v := range xs {
					nrm := (v - m) * s
					dn := wf[i] * ys[i]
					dnMean += dn
					dnNormMean += dn * nrm
					cb[i] += ys[i]
					cw[i] += nrm * ys[i]
				}
				dnMean /= float32(C)
				dnNormMean /= float32(C)
				if hasDi {
					ds := di.load(r*C, r*C+C, da)
					for i, v := range xs {
						nrm := (v - m) * s
						ds[i] += (wf[i]*ys[i] - dnMean - nrm*dnNormMean) * s
					}
					di.store(r*C, ds)
				}
			}
		})
		acc := make([]float32, C)
		addPartials(dw, sums[0], acc)
		if hasDb {
			addPartials(db, sums[1], acc)
		}
		return nil
	})
}

// CrossEntropyForward implements kernels.Ops.
func (b *Backend) CrossEntropyForward(q kernels.Queue, losses, logits, targets kernels.Tensor, BT, V int) {
	const op = "CrossEntropyForward"
	dims(op, BT, V)
	l := f32view(op, "losses", losses, BT)
	lg := fview(op, "logits", logits, BT*V)
	tg := i32view(op, "targets", targets, BT)
	b.queue(q).enqueue(op, func() error {
		b.pool.parallel(BT, max(1, 8192/V), func(lo, hi int) {
			sa := getScratch(V)
			defer putScratch(sa)
			for r := lo; r < hi; r++ {
				t := int(tg[r])
				if t < 0 {
					l[r] = 0
					continue
				}
				if t >= V {
					panic(fmt.Sprintf("target %d at row %d outside [0, %d)", t, r, V))
				}
				z := lg.load(r*V, r*V+V, sa)
				l[r] = logSumExp(z) - z[t]
			}
		})
		return nil
	})
}

func logSumExp(z []float32) float32 {
	mx := float32(math.Inf(-1))
	for _, v := range z {
		mx = max(mx, v)
	}
	var s float32
	for _, v := range z {
		s += float32(math.Exp(float64(v - mx)))
	}
	return mx + float32(math.Log(float64(s)))
}

// CrossEntropyBackward implements kernels.Ops.
func (b *Backend) CrossEntropyBackward(q kernels.Queue, dlogits, logits, targets kernels.Tensor, BT, V int, scale float32) {
	const op = "CrossEntropyBackward"
	dims(op, BT, V)
	dl := fview(op, "dlogits", dlogits, BT*V)
	lg := fview(op, "logits", logits, BT*V)
	tg := i32view(op, "targets", targets, BT)
	b.queue(q).enqueue(op, func() error {
		b.pool.parallel(BT, max(1, 8192/V), func(lo, hi int) {
			sa, da := getScratch(V), getScratch(V)
			defer putScratch(sa)
			defer putScratch(da)
			for r := lo; r < hi; r++ {
				t := int(tg[r])
				if t < 0 {
					continue
				}
				if t >= V {
					panic(fmt.Sprintf("target %d at row %d outside [0, %d)", t, r, V))
				}
				z := lg.load(r*V, r*V+V, sa)
				lse := logSumExp(z)
				d := dl.load(r*V, r*V+V, da)
				for i, v := range z {
					p := float32(math.Exp(float64(v - lse)))
					if i == t {
						p--
					}
					d[i] += scale * p
				}
				dl.store(r*V, d)
			}
		})
		return nil
	})
}
