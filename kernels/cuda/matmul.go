//go:build cuda

package cuda

import (
	"github.com/spill-ml/spill/kernels"
	"gorgonia.org/cu"
)

// MatmulForward computes out(BT,OC) = inp(BT,C)·weight(OC,C)ᵀ + bias(OC)
// with float32 accumulation, rounding the sum once. With a bias it is one
// cublasLtMatmul with the bias epilogue (matmul_lt.go) when inp and weight
// share a dtype, out is of it or f32 and cuBLASLt has an algorithm for the
// dtypes and alignments; otherwise the bias is broadcast into out and a
// cuBLAS GEMM adds onto it (beta = 1).
func (b *Backend) MatmulForward(kq kernels.Queue, out, inp, weight, bias kernels.Tensor, BT, C, OC int) {
	q := b.queue(kq)
	const op = "MatmulForward"
	needDims(op, BT, C, OC)
	if BT == 0 || OC == 0 {
		return
	}
	o := b.float(op, "out", out, BT*OC)
	x := b.float(op, "inp", inp, BT*C)
	w := b.float(op, "weight", weight, OC*C)
	bs := b.optFloat(op, "bias", bias, OC)
	q.enqueue(func(q *queue) error {
		// Column-major: outᵀ(OC,BT) = W(OC,C)·inpᵀ(C,BT), W stored as (C,OC);
		// the bias runs along the OC rows of outᵀ.
		if bs.p != 0 {
			if done, err := q.gemmBias(true, false, OC, BT, C, w, C, x, C, bs, o, OC); done || err != nil {
				return err
			}
		}
		beta := float32(0)
		if bs.p != 0 {
			if err := q.launch(b.fn("matmul_forward_bias"), elems(BT*OC), block, aPtr(o.p), aDT(o.dt), aPtr(bs.p), aDT(bs.dt),
				aI32(BT), aI32(OC)); err != nil {
				return err
			}
			beta = 1
		}
		return q.gemm(true, false, OC, BT, C, w, C, x, C, beta, o, OC)
	})
}

// MatmulBackward accumulates dinp += dout·weight, dweight += doutᵀ·inp
// (cuBLAS) and dbias += Σ_rows dout (biasGrad).
func (b *Backend) MatmulBackward(kq kernels.Queue, dinp, dweight, dbias, dout, inp, weight kernels.Tensor, BT, C, OC int) {
	b.matmulBackward(kq, false, dinp, dweight, dbias, dout, inp, weight, BT, C, OC)
}

// MatmulBackwardSet is MatmulBackward with dinp = dout·weight (the GEMM's
// beta 0): kernels.Overwriter.
func (b *Backend) MatmulBackwardSet(kq kernels.Queue, dinp, dweight, dbias, dout, inp, weight kernels.Tensor, BT, C, OC int) {
	b.matmulBackward(kq, true, dinp, dweight, dbias, dout, inp, weight, BT, C, OC)
}

func (b *Backend) matmulBackward(kq kernels.Queue, set bool, dinp, dweight, dbias, dout, inp, weight kernels.Tensor, BT, C, OC int) {
	q := b.queue(kq)
	const op = "MatmulBackward"
	needDims(op, BT, C, OC)
	if set && OC == 0 && !dinp.IsZero() {
		b.Zero(kq, dinp) // an empty product
	}
	if BT == 0 || OC == 0 {
		return
	}
	beta := float32(1)
	if set {
		beta = 0
	}
	di := b.optFloat(op, "dinp", dinp, BT*C)
	dw := b.optFloat(op, "dweight", dweight, OC*C)
	db := b.optFloat(op, "dbias", dbias, OC)
	g := b.float(op, "dout", dout, BT*OC)
	var x, w operand
	if dw.p != 0 {
		x = b.float(op, "inp", inp, BT*C)
	}
	if di.p != 0 {
		w = b.float(op, "weight", weight, OC*C)
	}
	q.enqueue(func(q *queue) error {
		if di.p != 0 && C > 0 {
			// dinpᵀ(C,BT) (+)= Wᵀ(C,OC)·doutᵀ(OC,BT).
			if err := q.gemm(false, false, C, BT, OC, w, C, g, OC, beta, di, C); err != nil {
				return err
			}
		}
		if dw.p != 0 && C > 0 {
			// dWᵀ(C,OC) += inpᵀ(C,BT)·dout(BT,OC).
			if err := q.gemm(false, true, C, OC, BT, x, C, g, OC, 1, dw, C); err != nil {
				return err
			}
		}
		if db.p != 0 {
			return q.biasGrad(db, g, BT, OC)
		}
		return nil
	})
}

// biasGrad accumulates db(OC) += Σ_rows g(BT,OC) in two deterministic
// passes: matmul_backward_bias_partial sums slabs of rows into float32
// partial sums in the scratch area (16-byte loads when g and its rows are
// 16-byte aligned), matmul_backward_bias adds them up in slab order and
// rounds once into db. Runs on the queue's goroutine.
func (q *queue) biasGrad(db, g operand, BT, OC int) error {
	const target = 2048 // blocks of the first pass: several waves, short tails
	cols := 32 * 16 / g.dt.Size()
	colBlocks := (OC + cols - 1) / cols
	slabs := max(1, min((BT+31)/32, (target+colBlocks-1)/colBlocks))
	rows := (BT + slabs - 1) / slabs
	part, err := q.ensureScratch(4 * int64(slabs) * int64(OC))
	if err != nil {
		return err
	}
	vec := 0
	if g.p%16 == 0 && OC*g.dt.Size()%16 == 0 {
		vec = 1
	}
	b := q.b
	if err := q.launch(b.fn("matmul_backward_bias_partial"), dim3{x: colBlocks, y: slabs}, dim3{x: 32, y: 8}, aPtr(part),
		aPtr(g.p), aDT(g.dt), aI32(BT), aI32(OC), aI32(rows), aI32(vec)); err != nil {
		return err
	}
	return q.launch(b.fn("matmul_backward_bias"), dim3{x: (OC + 31) / 32}, dim3{x: 32, y: 32}, aPtr(db.p), aDT(db.dt),
		aPtr(part), aI32(slabs), aI32(OC))
}

// gemm computes, column-major, c(m,n) = op(a)·op(b) + beta·c with float32
// accumulation. cuBLAS takes a and b of one dtype and c of that dtype or
// f32; other mixes go through f32 copies in the queue's scratch area.
// Runs on the queue's goroutine.
func (q *queue) gemm(ta, tb bool, m, n, k int, a operand, lda int, bm operand, ldb int, beta float32, c operand, ldc int) error {
	h, err := q.blasHandle()
	if err != nil {
		return err
	}
	if a.dt == bm.dt && (c.dt == a.dt || c.dt == kernels.F32) {
		return h.gemm(ta, tb, m, n, k, 1, a.p, a.dt, lda, bm.p, bm.dt, ldb, beta, c.p, c.dt, ldc)
	}
	// Sizes of the stored matrices (column-major, leading dimension ld).
	colsA, colsB := k, n
	if ta {
		colsA = m
	}
	if tb {
		colsB = k
	}
	na, nb, nc := int64(lda)*int64(colsA), int64(ldb)*int64(colsB), int64(ldc)*int64(n)
	base, err := q.ensureScratch(4 * (na + nb + nc))
	if err != nil {
		return err
	}
	a32 := operand{base, kernels.F32}
	b32 := operand{base + cu.DevicePtr(4*na), kernels.F32}
	c32 := operand{base + cu.DevicePtr(4*(na+nb)), kernels.F32}
	if err := q.cast(a32, a, int(na)); err != nil {
		return err
	}
	if err := q.cast(b32, bm, int(nb)); err != nil {
		return err
	}
	if beta != 0 {
		if err := q.cast(c32, c, int(nc)); err != nil {
			return err
		}
	}
	if err := h.gemm(ta, tb, m, n, k, 1, a32.p, kernels.F32, lda, b32.p, kernels.F32, ldb, beta, c32.p, kernels.F32, ldc); err != nil {
		return err
	}
	return q.cast(c, c32, int(nc))
}
