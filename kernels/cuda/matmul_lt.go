//go:build cuda

package cuda

import (
	"errors"
	"fmt"

	"github.com/spill-ml/spill/kernels"
	"gorgonia.org/cu"
)

// The forward GEMM with a bias runs through cuBLASLt when it can, the bias
// added by the GEMM's epilogue instead of a broadcast kernel beforehand
// (MatmulForward, gemmBias); MatmulGeluForward and MatmulBackwardGeluSet
// fuse the GELU and its derivative likewise (gemmEpi). Each queue keeps its
// cuBLASLt handle and plans in its blasHandle, destroyed with it when the
// queue closes.

// ltMaxWorkspace bounds the workspace the cuBLASLt heuristic may choose
// algorithms for (also at most 1/32 of the budget). The chosen algorithm's
// own need is drawn from the queue's scratch area.
const ltMaxWorkspace = 32 << 20

// ltKey identifies a fused GEMM: epilogue, transposes, shape, leading
// dimensions (of aux too), dtypes (of a and b; of d, the bias and aux),
// and the address alignments of the operands (bytes, at most 256), which
// limit the algorithms the heuristic may pick.
type ltKey struct {
	epi                           int
	ta, tb                        bool
	m, n, k, lda, ldb, ldd, ldAux int
	ab, d                         kernels.DType
	alA, alB, alC, alD, alBias    uint32
	alAux                         uint32
}

// align is the alignment of address p in bytes, at most 256 (256 for 0).
func align(p cu.DevicePtr) uint32 {
	v := uint64(p)
	if v == 0 {
		return 256
	}
	return uint32(min(v&-v, 256))
}

// gemmBias computes, column-major, d(m,n) = op(a)·op(b) + bias(m) in one
// cublasLtMatmul with CUBLASLT_EPILOGUE_BIAS: float32 accumulation, the
// bias added in float32 before d is rounded once (gemmEpi).
func (q *queue) gemmBias(ta, tb bool, m, n, k int, a operand, lda int, bm operand, ldb int, bias, d operand, ldd int) (bool, error) {
	return q.gemmEpi(epiBias, ta, tb, m, n, k, a, lda, bm, ldb, bias, operand{}, 0, d, ldd)
}

// gemmEpi computes, column-major, with ab = op(a)·op(b) (float32
// accumulation) in one cublasLtMatmul
//
//	epiBias:     d = ab + bias(m)
//	epiGeluBias: aux = ab + bias(m), d = gelu(aux)
//	epiDGelu:    d = gelu'(aux)·ab
//	epiResid:    d = ab + aux        (aux: the residual, d's layout: ldAux = ldd)
//	epiBiasRes:  d = ab + bias(m) + aux
//
// rounding d (and aux) once. a and b must share a dtype, d be of it or
// f32, and the bias and aux of d's dtype (cuBLASLt documents no other bias
// type for these). It reports false, having done nothing, when cuBLASLt
// cannot do it (no handle, no algorithm for the dtypes or the alignments,
// not enough budget for the workspace, a matmul refused as not supported
// or invalid); the caller then takes another path. Plans, failed ones
// included, are made once per ltKey and kept until the queue closes. Runs
// on the queue's goroutine.
func (q *queue) gemmEpi(epi int, ta, tb bool, m, n, k int, a operand, lda int, bm operand, ldb int, bias, aux operand, ldAux int,
	d operand, ldd int) (bool, error) {
	if m == 0 || n == 0 || k == 0 || a.dt != bm.dt || (d.dt != a.dt && d.dt != kernels.F32) {
		return false, nil
	}
	hasBias := epi == epiBias || epi == epiGeluBias || epi == epiBiasRes
	if (hasBias && bias.dt != d.dt) || (epi != epiBias && aux.dt != d.dt) {
		return false, nil
	}
	alC := align(d.p)
	if epi == epiResid || epi == epiBiasRes {
		if ldAux != ldd || aux.p == d.p {
			return false, nil
		}
		alC = min(alC, align(aux.p))
	}
	h, err := q.blasHandle()
	if err != nil {
		return false, err
	}
	if h.lt == nil {
		if h.ltErr != nil {
			return false, nil
		}
		if h.lt, h.ltErr = newLtHandle(); h.ltErr != nil {
			return false, nil
		}
	}
	lt := h.lt
	key := ltKey{epi: epi, ta: ta, tb: tb, m: m, n: n, k: k, lda: lda, ldb: ldb, ldd: ldd, ldAux: ldAux, ab: a.dt, d: d.dt,
		alA: align(a.p), alB: align(bm.p), alC: alC, alD: align(d.p), alBias: align(bias.p), alAux: align(aux.p)}
	p, ok := lt.plans[key]
	if !ok {
		p, err = lt.plan(key, bias.p, aux.p, min(ltMaxWorkspace, q.b.limit/32), q.b.reducedPrecision)
		if err != nil {
			p = &ltPlan{err: err}
		}
		lt.plans[key] = p
	}
	if p.c == nil {
		return false, nil
	}
	var ws cu.DevicePtr
	if p.ws > 0 {
		if ws, err = q.ensureScratch(p.ws); err != nil {
			lt.drop(key, err)
			return false, nil
		}
	}
	err = lt.matmul(p, a.p, bm.p, d.p, bias.p, aux.p, ws, q.stream)
	if errors.Is(err, blasError(blasNotSupported)) || errors.Is(err, blasError(blasInvalidValue)) {
		lt.drop(key, err)
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("kernels/cuda: cublasLtMatmul (epilogue %d) %dx%dx%d (%v·%v→%v): %w", epi, m, n, k, a.dt, bm.dt, d.dt, err)
	}
	return true, nil
}
