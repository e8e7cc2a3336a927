//go:build cuda

package cuda

import (
	"bytes"
	"fmt"
	"math"
	"testing"

	"github.com/spill-ml/spill/kernels"
)

// offset is x without its first element: a tensor 2 or 4 bytes off the
// alignment of its buffer.
func offset(x tp, n int) tp { return tp{x.g.Slice(1, n), x.c.Slice(1, n)} }

// ltPlans are the cuBLASLt plans of be's default queue; read them only
// after a sync.
func ltPlans(be kernels.Backend) map[ltKey]*ltPlan {
	q := be.(*Backend).defq
	if q.blas == nil || q.blas.lt == nil {
		return nil
	}
	return q.blas.lt.plans
}

// TestMatmulBiasEpilogue covers the forward pass through cuBLASLt's bias
// epilogue and its fallbacks: out of inp's dtype or f32, biases of every
// dtype, operands off their alignment. Aligned problems with the bias and
// out of one dtype and dimensions a multiple of 8 must take cuBLASLt.
func TestMatmulBiasEpilogue(t *testing.T) {
	p := openPair(t)
	for _, sh := range [][3]int{{64, 96, 80}, {300, 64, 264}, {33, 257, 129}} {
		BT, C, OC := sh[0], sh[1], sh[2]
		for _, dt := range floatTypes {
			odts := []kernels.DType{dt}
			if dt != kernels.F32 {
				odts = append(odts, kernels.F32)
			}
			for _, odt := range odts {
				for _, bdt := range floatTypes {
					for _, off := range []bool{false, true} {
						if off && bdt != odt {
							continue
						}
						name := fmt.Sprintf("%dx%dx%d/%v·%v+%v→%v/offset=%v", BT, C, OC, dt, dt, bdt, odt, off)
						x := p.random(dt, BT*C, 1)
						w := p.random(dt, OC*C, 1)
						bs := p.random(bdt, OC+1, 1)
						out := p.poison(odt, BT*OC+1)
						if off {
							bs, out = offset(bs, OC), offset(out, BT*OC)
						} else {
							bs, out = tp{bs.g.Slice(0, OC), bs.c.Slice(0, OC)}, tp{out.g.Slice(0, BT*OC), out.c.Slice(0, BT*OC)}
						}
						p.both(func(b kernels.Backend, q kernels.Queue, s func(tp) kernels.Tensor) {
							b.MatmulForward(q, s(out), s(x), s(w), s(bs), BT, C, OC)
						})
						p.check(name, out, math.Sqrt(float64(C)))
					}
				}
			}
		}
	}
	plans := ltPlans(p.g)
	if len(plans) == 0 {
		t.Fatal("no cuBLASLt plan was made")
	}
	for k, pl := range plans {
		aligned := k.alA >= 16 && k.alB >= 16 && k.alD >= 16 && k.alBias >= 16 && k.m%8 == 0 && k.k%8 == 0
		switch {
		case pl.c != nil:
			t.Logf("cuBLASLt %dx%dx%d %v→%v align %d/%d/%d/%d: fused, workspace %d", k.m, k.n, k.k, k.ab, k.d, k.alA, k.alB, k.alD, k.alBias, pl.ws)
		case aligned && k.ab == k.d:
			t.Errorf("cuBLASLt %dx%dx%d %v→%v align %d/%d/%d/%d: not fused: %v", k.m, k.n, k.k, k.ab, k.d, k.alA, k.alB, k.alD, k.alBias, pl.err)
		default:
			t.Logf("cuBLASLt %dx%dx%d %v→%v align %d/%d/%d/%d: fallback: %v", k.m, k.n, k.k, k.ab, k.d, k.alA, k.alB, k.alD, k.alBias, pl.err)
		}
	}
}

// TestMatmulBiasGrad covers the two-pass bias gradient: many slabs, the
// vector and the scalar path (odd OC, dout off its alignment), dbias of
// every dtype, and bitwise repeatability.
func TestMatmulBiasGrad(t *testing.T) {
	p := openPair(t)
	const C = 8
	for _, sh := range [][2]int{{1, 8}, {2048, 776}, {1000, 24}, {517, 264}, {4096, 8}, {300, 41}} {
		BT, OC := sh[0], sh[1]
		for _, dt := range floatTypes {
			for _, dbt := range floatTypes {
				for _, off := range []bool{false, true} {
					name := fmt.Sprintf("%dx%d/dout %v/dbias %v/offset=%v", BT, OC, dt, dbt, off)
					x := p.random(dt, BT*C, 1)
					w := p.random(dt, OC*C, 1)
					dw := p.random(dt, OC*C, 1)
					db := p.random(dbt, OC, 1)
					g := p.random(dt, BT*OC+1, 1)
					if off {
						g = offset(g, BT*OC)
					} else {
						g = tp{g.g.Slice(0, BT*OC), g.c.Slice(0, BT*OC)}
					}
					p.both(func(b kernels.Backend, q kernels.Queue, s func(tp) kernels.Tensor) {
						b.MatmulBackward(q, kernels.Tensor{}, s(dw), s(db), s(g), s(x), s(w), BT, C, OC)
					})
					p.check(name+"/dbias", db, math.Sqrt(float64(BT)))
					p.check(name+"/dweight", dw, math.Sqrt(float64(BT)))
					if BT == 2048 {
						var runs [2][]byte
						for i := range runs {
							p.g.Zero(p.g.DefaultQueue(), db.g)
							p.g.MatmulBackward(p.g.DefaultQueue(), kernels.Tensor{}, dw.g, db.g, g.g, x.g, w.g, BT, C, OC)
							runs[i] = make([]byte, db.g.Bytes())
							p.g.CopyToHost(p.g.DefaultQueue(), runs[i], db.g)
							p.sync()
						}
						if !bytes.Equal(runs[0], runs[1]) {
							t.Errorf("%s: dbias differs between two runs", name)
						}
					}
				}
			}
		}
	}
}

// BenchmarkMatmulForwardBias is the GPT-2 124M fc layer (B=16, T=1024) in
// bf16 without and with a bias: the bias should cost next to nothing.
func BenchmarkMatmulForwardBias(b *testing.B) {
	be := benchBackend(b)
	q := be.DefaultQueue()
	BT, C, OC := 16*1024, 768, 3072
	x, w, out := benchTensor(b, be, kernels.BF16, BT*C), benchTensor(b, be, kernels.BF16, OC*C), benchTensor(b, be, kernels.BF16, BT*OC)
	bias := benchTensor(b, be, kernels.BF16, OC)
	for _, bs := range []kernels.Tensor{{}, bias} {
		b.Run(fmt.Sprintf("bias=%v", !bs.IsZero()), func(b *testing.B) {
			syncB(b, be)
			b.ResetTimer()
			for range b.N {
				be.MatmulForward(q, out, x, w, bs, BT, C, OC)
			}
			syncB(b, be)
			b.ReportMetric(b.Elapsed().Seconds()/float64(b.N)*1e6, "µs/op")
		})
	}
}

// BenchmarkBiasGrad is the bias gradient alone for GPT-2 124M's layers
// (BT=16384, bf16), reported as bandwidth over dout.
func BenchmarkBiasGrad(b *testing.B) {
	be := benchBackend(b)
	BT := 16 * 1024
	for _, OC := range []int{768, 2304, 3072} {
		b.Run(fmt.Sprint(OC), func(b *testing.B) {
			g, db := benchTensor(b, be, kernels.BF16, BT*OC), benchTensor(b, be, kernels.BF16, OC)
			gp, dbp := operand{be.devPtr(g, "bench", "g"), g.DType}, operand{be.devPtr(db, "bench", "db"), db.DType}
			q := be.defq
			syncB(b, be)
			b.SetBytes(g.Bytes())
			b.ResetTimer()
			for range b.N {
				q.biasGrad(dbp, gp, BT, OC)
			}
			syncB(b, be)
			b.ReportMetric(b.Elapsed().Seconds()/float64(b.N)*1e6, "µs/op")
		})
	}
}

// TestMatmulForwardResidual: out = inp·Wᵀ + bias + res (the bias present
// or not) against the CPU backend's MatmulForward then Add, every dtype,
// shapes with and without multiples of 8, outputs poisoned; and the
// aligned bf16 calls added the residual in cuBLASLt's epilogue.
func TestMatmulForwardResidual(t *testing.T) {
	p := openPair(t)
	for _, sh := range [][3]int{{64, 96, 80}, {300, 64, 264}, {33, 257, 129}} {
		BT, C, OC := sh[0], sh[1], sh[2]
		for _, dt := range floatTypes {
			for _, withBias := range []bool{true, false} {
				name := fmt.Sprintf("%dx%dx%d/%v/bias=%v", BT, C, OC, dt, withBias)
				x, w := p.random(dt, BT*C, 1), p.random(dt, OC*C, 1)
				res := p.random(dt, BT*OC, 2)
				out := p.poison(dt, BT*OC)
				var bs tp
				if withBias {
					bs = p.random(dt, OC, 1)
				}
				before := residEpiRuns.Load()
				p.both(func(b kernels.Backend, q kernels.Queue, s func(tp) kernels.Tensor) {
					var bias kernels.Tensor
					if withBias {
						bias = s(bs)
					}
					kernels.MatmulForwardResidual(b, q, s(out), s(x), s(w), bias, s(res), BT, C, OC)
				})
				p.check(name, out, math.Sqrt(float64(C)))
				if dt == kernels.BF16 && BT%8 == 0 && C%8 == 0 && OC%8 == 0 && residEpiRuns.Load() == before {
					t.Errorf("%s: the residual was not added in the epilogue", name)
				}
			}
		}
	}
}
