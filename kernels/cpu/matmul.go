package cpu

import (
	"github.com/spill-ml/spill/kernels"
)

// MatmulForward implements kernels.Ops.
func (b *Backend) MatmulForward(q kernels.Queue, out, inp, weight, bias kernels.Tensor, BT, C, OC int) {
	const op = "MatmulForward"
	dims(op, BT, C, OC)
	o := fview(op, "out", out, BT*OC)
	x := fview(op, "inp", inp, BT*C)
	w := fview(op, "weight", weight, OC*C)
	bi, hasBias := optview(op, "bias", bias, OC)
	b.queue(q).enqueue(op, func() error {
		var bf []float32
		if hasBias {
			var relB func()
			bf, relB = b.inputSmall(bi)
			defer relB()
		}
		if o.dt == kernels.F32 || BT*OC <= fwdScratch {
			y, commit := b.output(o, false)
			b.gemmNT(y, x, 0, w, bf, BT, C, OC)
			commit()
			return nil
		}
		// A 16-bit output larger than fwdScratch (the logits) goes through
		// a float32 scratch of a few row blocks at a time, not one of its
		// whole size. The blocks are whole multiples of mcBlk rows, gemm's
		// own row blocking, so every tile and every sum is the one of the
		// unsplit product: the same bits.
		rows := max(1, fwdScratch/OC/mcBlk) * mcBlk
		y := getScratch(min(rows, BT) * OC)
		defer putScratch(y)
		for r0 := 0; r0 < BT; r0 += rows {
			ys := y[:min(rows, BT-r0)*OC]
			b.gemmNT(ys, x, r0*C, w, bf, len(ys)/OC, C, OC)
			b.pool.parallel(len(ys), 1<<14, func(lo, hi int) { o.store(r0*OC+lo, ys[lo:hi]) })
		}
		return nil
	})
}

// fwdScratch is the most elements of float32 scratch MatmulForward takes
// for a 16-bit output (16 MiB) unless one block of mcBlk rows needs more.
const fwdScratch = 1 << 22

// MatmulBackward implements kernels.Ops.
func (b *Backend) MatmulBackward(q kernels.Queue, dinp, dweight, dbias, dout, inp, weight kernels.Tensor, BT, C, OC int) {
	const op = "MatmulBackward"
	dims(op, BT, C, OC)
	di, hasDi := optview(op, "dinp", dinp, BT*C)
	dw := fview(op, "dweight", dweight, OC*C)
	db, hasDb := optview(op, "dbias", dbias, OC)
	dy := fview(op, "dout", dout, BT*OC)
	x := fview(op, "inp", inp, BT*C)
	w := fview(op, "weight", weight, OC*C)
	b.queue(q).enqueue(op, func() error {
		if hasDi {
			d, commit := b.output(di, true)
			b.gemmNN(d, dy, w, BT, OC, C)
			commit()
		}
		d, commit := b.output(dw, true)
		b.gemmTN(d, dy, x, BT, OC, C)
		commit()
		if hasDb {
			g, relG := b.input(dy)
			acc := make([]float32, OC)
			d := db.load(0, OC, acc)
			b.colSums(d, g, BT, OC)
			db.store(0, d)
			relG()
		}
		return nil
	})
}

// colSums adds the column sums of g(rows, cols) to d(cols).
func (b *Backend) colSums(d, g []float32, rows, cols int) {
	b.pool.parallel(cols, 64, func(lo, hi int) {
		dd := d[lo:hi]
		for r := 0; r < rows; r++ {
			for i, v := range g[r*cols+lo : r*cols+hi] {
				dd[i] += v
			}
		}
	})
}
