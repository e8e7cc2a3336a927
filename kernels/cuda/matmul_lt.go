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
// (MatmulForward, gemmBias). Each queue keeps its cuBLASLt handle and
// plans in its blasHandle, destroyed with it when the queue closes.

// ltMaxWorkspace bounds the workspace the cuBLASLt heuristic may choose
// algorithms for (also at most 1/32 of the budget). The chosen algorithm's
// own need is drawn from the queue's scratch area.
const ltMaxWorkspace = 32 << 20

// ltKey identifies a fused-bias GEMM: transposes, shape, leading
// dimensions, dtypes (of a and b; of d and the bias), and the address
// alignments of the operands (bytes, at most 256), which limit the
// algorithms the heuristic may pick.
type ltKey struct {
	ta, tb                 bool
	m, n, k, lda, ldb, ldd int
	ab, d                  kernels.DType
	alA, alB, alD, alBias  uint32
}

// align is the alignment of address p in bytes, at most 256.
func align(p cu.DevicePtr) uint32 {
	v := uint64(p)
	return uint32(min(v&-v, 256))
}

// gemmBias computes, column-major, d(m,n) = op(a)·op(b) + bias(m) in one
// cublasLtMatmul with CUBLASLT_EPILOGUE_BIAS: float32 accumulation, the
// bias added in float32 before d is rounded once. a and b must share a
// dtype, d be of it or f32, and the bias of d's dtype (cuBLASLt documents
// no other bias type for these). It reports false, having done nothing,
// when cuBLASLt cannot do it (no handle, no algorithm for the dtypes or
// the alignments, not enough budget for the workspace, a matmul refused
// as not supported or invalid); the caller then takes the cuBLAS path.
// Plans, failed ones included, are made once per ltKey and kept until the
// queue closes. Runs on the queue's goroutine.
func (q *queue) gemmBias(ta, tb bool, m, n, k int, a operand, lda int, bm operand, ldb int, bias, d operand, ldd int) (bool, error) {
	if m == 0 || n == 0 || k == 0 || a.dt != bm.dt || (d.dt != a.dt && d.dt != kernels.F32) || bias.dt != d.dt {
		return false, nil
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
	key := ltKey{ta: ta, tb: tb, m: m, n: n, k: k, lda: lda, ldb: ldb, ldd: ldd, ab: a.dt, d: d.dt,
		alA: align(a.p), alB: align(bm.p), alD: align(d.p), alBias: align(bias.p)}
	p, ok := lt.plans[key]
	if !ok {
		p, err = lt.planBias(key, bias.p, min(ltMaxWorkspace, q.b.limit/32), q.b.reducedPrecision)
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
	err = lt.matmulBias(p, a.p, bm.p, d.p, bias.p, ws, q.stream)
	if errors.Is(err, blasError(blasNotSupported)) || errors.Is(err, blasError(blasInvalidValue)) {
		lt.drop(key, err)
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("kernels/cuda: cublasLtMatmul %dx%dx%d (%v·%v+%v→%v): %w", m, n, k, a.dt, bm.dt, bias.dt, d.dt, err)
	}
	return true, nil
}
