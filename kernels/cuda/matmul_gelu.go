//go:build cuda

package cuda

import (
	"fmt"
	"sync/atomic"

	"github.com/spill-ml/spill/kernels"
	"gorgonia.org/cu"
)

// The GELU of a GPT MLP fused into its GEMMs through cuBLASLt epilogues
// (tanh approximation, like GeluForward):
//
//	MatmulGeluForward:     pre = inp·weightᵀ + bias, out = gelu(pre)  (CUBLASLT_EPILOGUE_GELU_AUX_BIAS)
//	MatmulBackwardGeluSet: dinp = gelu'(pre)∘(dout·weight)             (CUBLASLT_EPILOGUE_DGELU)
//
// the first in place of MatmulForward then GeluForward for the fc layer, the
// second in place of MatmulBackwardSet then GeluBackwardSet for the
// projection after the GELU (inp = gelu(pre)). Where cuBLASLt cannot (see
// gemmEpi) they run those ops one after the other on the queue instead.

// The engine's GPT blocks call them through kernels.GeluMatmuler.
var _ kernels.GeluMatmuler = (*Backend)(nil)

// geluEpiRuns counts the fused GEMMs run by epilogue (tests check that the
// fused path, not the fallback, ran).
var geluEpiRuns [3]atomic.Int64

// MatmulGeluForward computes pre(BT,OC) = inp(BT,C)·weight(OC,C)ᵀ + bias(OC)
// and out(BT,OC) = gelu(pre), float32 accumulation, each rounded once.
func (b *Backend) MatmulGeluForward(kq kernels.Queue, out, pre, inp, weight, bias kernels.Tensor, BT, C, OC int) {
	q := b.queue(kq)
	const op = "MatmulGeluForward"
	needDims(op, BT, C, OC)
	if BT == 0 || OC == 0 {
		return
	}
	o := b.float(op, "out", out, BT*OC)
	pr := b.float(op, "pre", pre, BT*OC)
	x := b.float(op, "inp", inp, BT*C)
	w := b.float(op, "weight", weight, OC*C)
	bs := b.float(op, "bias", bias, OC)
	q.putGemm(gemmCall{epi: epiGeluBias, ta: true, m: OC, n: BT, k: C, a: w, lda: C, b: x, ldb: C, c: o, ldc: OC,
		bias: bs, aux: pr, ldAux: OC})
}

// MatmulBackwardGeluSet is MatmulBackwardSet for a layer whose input is
// inp = gelu(pre), with the GELU's backward fused: dinp = gelu'(pre)∘
// (dout·weight) is written (not accumulated), dweight += doutᵀ·inp and
// dbias += Σ_rows dout accumulate as in MatmulBackward. dinp and pre are
// required.
func (b *Backend) MatmulBackwardGeluSet(kq kernels.Queue, dinp, dweight, dbias, dout, inp, weight, pre kernels.Tensor, BT, C, OC int) {
	q := b.queue(kq)
	const op = "MatmulBackwardGeluSet"
	needDims(op, BT, C, OC)
	if BT == 0 {
		return
	}
	di := b.float(op, "dinp", dinp, BT*C)
	pr := b.float(op, "pre", pre, BT*C)
	if OC == 0 {
		b.Zero(kq, dinp) // an empty product
		return
	}
	if C > 0 {
		g := b.float(op, "dout", dout, BT*OC)
		w := b.float(op, "weight", weight, OC*C)
		// dinpᵀ(C,BT) = gelu'(preᵀ)∘(Wᵀ(C,OC)·doutᵀ(OC,BT)).
		q.putGemm(gemmCall{epi: epiDGelu, m: C, n: BT, k: OC, a: w, lda: C, b: g, ldb: OC, c: di, ldc: C, aux: pr, ldAux: C})
	}
	// dweight and dbias as MatmulBackward (dinp done above).
	b.matmulBackward(kq, true, kernels.Tensor{}, dweight, dbias, dout, inp, weight, BT, C, OC)
}

// runGelu runs a GEMM job with a GELU epilogue on the queue's goroutine:
// one cublasLtMatmul where cuBLASLt can, else the GEMM and a GELU kernel.
func (q *queue) runGelu(g *gemmCall) error {
	done, err := q.gemmEpi(g.epi, g.ta, g.tb, g.m, g.n, g.k, g.a, g.lda, g.b, g.ldb, g.bias, g.aux, g.ldAux, g.c, g.ldc)
	if err != nil {
		return err
	}
	if done {
		geluEpiRuns[g.epi].Add(1)
		return nil
	}
	n := g.m * g.n // aux and c are contiguous: ldAux = ldc = m
	switch g.epi {
	case epiGeluBias:
		// pre = ab + bias, then out = gelu(pre).
		pg := *g
		pg.epi, pg.c, pg.aux = epiBias, g.aux, operand{}
		if err := q.runGemm(&pg); err != nil {
			return err
		}
		return q.geluNow(false, g.c, g.aux, operand{}, n)
	case epiDGelu:
		// c = ab, then c = gelu'(aux)·c.
		if err := q.gemm(g.ta, g.tb, g.m, g.n, g.k, g.a, g.lda, g.b, g.ldb, 0, g.c, g.ldc); err != nil {
			return err
		}
		return q.geluNow(true, g.c, g.aux, g.c, n)
	}
	return fmt.Errorf("kernels/cuda: GEMM epilogue %d", g.epi)
}

// geluNow launches, on the queue's goroutine, out = gelu(inp) (bwd false)
// or out = gelu'(inp)·dout (bwd true; dout may be out itself: the kernels
// are elementwise, each element read before it is written).
func (q *queue) geluNow(bwd bool, out, inp, dout operand, n int) error {
	b := q.b
	if !bwd {
		if f, ok := b.typedFn("gelu_forward", out.dt); ok && inp.dt == out.dt && alignedLike(out.dt.Size(), out.p, inp.p) {
			return q.launchNow(f, vecGrid(n, out.dt), block, aPtr(out.p), aPtr(inp.p), aI64(int64(n)))
		}
		return q.launchNow(b.fn("gelu_forward"), elems(n), block, aPtr(out.p), aDT(out.dt), aPtr(inp.p), aDT(inp.dt), aI64(int64(n)))
	}
	if f, ok := b.typedFn("gelu_backward_set", out.dt); ok && sameDT(out.dt, inp, dout) && alignedLike(out.dt.Size(), out.p, inp.p, dout.p) {
		return q.launchNow(f, vecGrid(n, out.dt), block, aPtr(out.p), aPtr(inp.p), aPtr(dout.p), aI64(int64(n)))
	}
	// The generic kernel accumulates: dout to the scratch area, out zeroed.
	tmp, err := q.ensureScratch(int64(n * dout.dt.Size()))
	if err != nil {
		return err
	}
	if err := cu.MemcpyDtoDAsync(tmp, dout.p, int64(n*dout.dt.Size()), q.stream); err != nil {
		return err
	}
	if err := cu.MemsetD8Async(out.p, 0, int64(n*out.dt.Size()), q.stream); err != nil {
		return err
	}
	return q.launchNow(b.fn("gelu_backward"), elems(n), block, aPtr(out.p), aDT(out.dt), aPtr(inp.p), aDT(inp.dt),
		aPtr(tmp), aDT(dout.dt), aI64(int64(n)))
}
