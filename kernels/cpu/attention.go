package cpu

import (
	"fmt"

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
// row, keeping only the log-sum-exp of each row. It is grouped-query
// attention with as many key/value heads as query heads (the qkv layout is
// the same), bit for bit (TestGQAttentionIsMHA).
func (b *Backend) AttentionForward(q kernels.Queue, out, lse, qkv kernels.Tensor, B, T, C, NH int) {
	hs := attnDims("AttentionForward", B, T, C, NH)
	b.GQAttentionForward(q, out, lse, qkv, B, T, NH, NH, hs)
}

// AttentionBackward implements kernels.Ops: GQAttentionBackward with as
// many key/value heads as query heads.
func (b *Backend) AttentionBackward(q kernels.Queue, dqkv, dout, qkv, out, lse kernels.Tensor, B, T, C, NH int) {
	hs := attnDims("AttentionBackward", B, T, C, NH)
	b.GQAttentionBackward(q, dqkv, dout, qkv, out, lse, B, T, NH, NH, hs)
}

// dot is Σ a[i]·b[i] over a (b is at least as long) in float32, with four
// partial sums; RMSNormForward takes its Σ x² as dot(x, x).
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
