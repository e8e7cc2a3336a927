//go:build cuda

package cuda

import (
	"fmt"
	"sync/atomic"

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
	b.matmulForward(kq, "MatmulForward", out, inp, weight, bias, kernels.Tensor{}, BT, C, OC)
}

// MatmulForwardResidual computes out = inp·weightᵀ + bias + res
// (kernels.ResidualMatmuler): one cublasLtMatmul whose C operand is the
// residual (beta 1) and whose epilogue adds the bias, out rounded once;
// where cuBLASLt cannot, MatmulForward then Add (rounded twice).
func (b *Backend) MatmulForwardResidual(kq kernels.Queue, out, inp, weight, bias, res kernels.Tensor, BT, C, OC int) {
	if res.IsZero() {
		panic("kernels/cuda: MatmulForwardResidual: res is required")
	}
	b.matmulForward(kq, "MatmulForwardResidual", out, inp, weight, bias, res, BT, C, OC)
}

// matmulForward enqueues out = inp·weightᵀ [+ bias] [+ res] (res the zero
// Tensor for none).
func (b *Backend) matmulForward(kq kernels.Queue, op string, out, inp, weight, bias, res kernels.Tensor, BT, C, OC int) {
	q := b.queue(kq)
	needDims(op, BT, C, OC)
	if BT == 0 || OC == 0 {
		return
	}
	o := b.float(op, "out", out, BT*OC)
	x := b.float(op, "inp", inp, BT*C)
	w := b.float(op, "weight", weight, OC*C)
	bs := b.optFloat(op, "bias", bias, OC)
	r := b.optFloat(op, "res", res, BT*OC)
	if r.p != 0 && r.p == o.p {
		panic(fmt.Sprintf("kernels/cuda: %s: res and out are the same tensor", op))
	}
	// Column-major: outᵀ(OC,BT) = W(OC,C)·inpᵀ(C,BT), W stored as (C,OC);
	// the bias runs along the OC rows of outᵀ.
	q.putGemm(gemmCall{ta: true, m: OC, n: BT, k: C, a: w, lda: C, b: x, ldb: C, c: o, ldc: OC, bias: bs, res: r})
}

// residEpiRuns counts the GEMMs that added their residual in cuBLASLt's
// epilogue (tests check that the fused path ran).
var residEpiRuns atomic.Int64

// gemmCall is a GEMM job: column-major c(m,n) = op(a)·op(b) + beta·c, or
// with a bias c = op(a)·op(b) + bias(m) (beta ignored), or with epi
// epiGeluBias or epiDGelu what gemmEpi says, through runGelu. With res
// (an (m,n) matrix of c's layout), c = op(a)·op(b) [+ bias] + res.
type gemmCall struct {
	epi                  int
	ta, tb               bool
	m, n, k              int
	a, b, c, bias, aux   operand
	res                  operand
	lda, ldb, ldc, ldAux int
	beta                 float32
}

// putGemm enqueues g.
func (q *queue) putGemm(g gemmCall) {
	j := job{kind: jobGemm, gemm: g}
	q.put(&j)
}

// runGemm runs a GEMM job on the queue's goroutine. With a bias it is one
// cublasLtMatmul with the bias epilogue when cuBLASLt can do it, else the
// bias is broadcast into c and the GEMM adds onto it (beta 1).
func (q *queue) runGemm(g *gemmCall) error {
	if g.epi != epiBias {
		return q.runGelu(g)
	}
	if g.res.p != 0 {
		return q.runResidual(g)
	}
	beta := g.beta
	if g.bias.p != 0 {
		if done, err := q.gemmBias(g.ta, g.tb, g.m, g.n, g.k, g.a, g.lda, g.b, g.ldb, g.bias, g.c, g.ldc); done || err != nil {
			return err
		}
		// matmul_forward_bias broadcasts bias(OC) over the rows of a
		// row-major (BT,OC) matrix: c(m,n) column-major with ldc = m.
		if err := q.launchNow(q.b.fn("matmul_forward_bias"), elems(g.m*g.n), block, aPtr(g.c.p), aDT(g.c.dt), aPtr(g.bias.p),
			aDT(g.bias.dt), aI32(g.n), aI32(g.m)); err != nil {
			return err
		}
		beta = 1
	}
	return q.gemm(g.ta, g.tb, g.m, g.n, g.k, g.a, g.lda, g.b, g.ldb, beta, g.c, g.ldc)
}

// runResidual runs a GEMM with a residual: fused in cuBLASLt's epilogue
// when it can, else the GEMM (with its bias) and then the add.
func (q *queue) runResidual(g *gemmCall) error {
	epi := epiResid
	if g.bias.p != 0 {
		epi = epiBiasRes
	}
	done, err := q.gemmEpi(epi, g.ta, g.tb, g.m, g.n, g.k, g.a, g.lda, g.b, g.ldb, g.bias, g.res, g.ldc, g.c, g.ldc)
	if err != nil {
		return err
	}
	if done {
		residEpiRuns.Add(1)
		return nil
	}
	plain := *g
	plain.res, plain.beta = operand{}, 0
	if err := q.runGemm(&plain); err != nil {
		return err
	}
	n := g.m * g.n
	if f, ok := q.b.typedFn("add_forward", g.c.dt); ok && g.res.dt == g.c.dt && alignedLike(g.c.dt.Size(), g.c.p, g.res.p) {
		return q.launchNow(f, vecGrid(n, g.c.dt), block, aPtr(g.c.p), aPtr(g.res.p), aI64(int64(n)))
	}
	return q.launchNow(q.b.fn("add_forward"), elems(n), block, aPtr(g.c.p), aDT(g.c.dt), aPtr(g.res.p), aDT(g.res.dt), aI64(int64(n)))
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
	if di.p != 0 && C > 0 {
		// dinpᵀ(C,BT) (+)= Wᵀ(C,OC)·doutᵀ(OC,BT).
		q.putGemm(gemmCall{m: C, n: BT, k: OC, a: w, lda: C, b: g, ldb: OC, beta: beta, c: di, ldc: C})
	}
	if dw.p != 0 && C > 0 {
		// dWᵀ(C,OC) += inpᵀ(C,BT)·dout(BT,OC).
		q.putGemm(gemmCall{tb: true, m: C, n: OC, k: BT, a: x, lda: C, b: g, ldb: OC, beta: 1, c: dw, ldc: C})
	}
	if db.p != 0 {
		q.biasGrad(db, g, BT, OC)
	}
}

// biasGrad accumulates db(OC) += Σ_rows g(BT,OC) in two deterministic
// passes: matmul_backward_bias_partial sums slabs of rows into float32
// partial sums in the scratch area (16-byte loads when g and its rows are
// 16-byte aligned), matmul_backward_bias adds them up in slab order and
// rounds once into db. Enqueues the two launches.
func (q *queue) biasGrad(db, g operand, BT, OC int) {
	const target = 2048 // blocks of the first pass: several waves, short tails
	cols := 32 * 16 / g.dt.Size()
	colBlocks := (OC + cols - 1) / cols
	slabs := max(1, min((BT+31)/32, (target+colBlocks-1)/colBlocks))
	rows := (BT + slabs - 1) / slabs
	need := 4 * int64(slabs) * int64(OC) // the partial sums at offset 0 of the scratch area
	vec := 0
	if g.p%16 == 0 && OC*g.dt.Size()%16 == 0 {
		vec = 1
	}
	b := q.b
	js := [...]job{
		launchJob(b.fn("matmul_backward_bias_partial"), dim3{x: colBlocks, y: slabs}, dim3{x: 32, y: 8}, 0,
			aPtr(g.p), aDT(g.dt), aI32(BT), aI32(OC), aI32(rows), aI32(vec)).withScratch(need, 0),
		launchJob(b.fn("matmul_backward_bias"), dim3{x: (OC + 31) / 32}, dim3{x: 32, y: 32}, aPtr(db.p), aDT(db.dt),
			0, aI32(slabs), aI32(OC)).withScratch(need, 2),
	}
	q.putGroup(js[:])
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
