package cpu

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas32"

	"github.com/spill-ml/spill/kernels"
)

// Side-by-side benchmarks: spill's matmul against gonum's Sgemm at GPT-2
// shapes, and the fused AdamW against streaming the same bytes.
//
//	go test ./kernels/cpu -run XXX -bench . -benchtime 20x

var benchShapes = []struct{ BT, C, OC int }{{512, 768, 768}, {512, 768, 3072}}

func BenchmarkMatmul(b *testing.B) {
	for _, s := range benchShapes {
		flops := 2 * float64(s.BT) * float64(s.C) * float64(s.OC)
		r := rand.New(rand.NewPCG(1, 2))
		x, w := randVals(r, s.BT*s.C, 1), randVals(r, s.OC*s.C, 1)
		name := fmt.Sprintf("BT%d_C%d_OC%d", s.BT, s.C, s.OC)
		for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
			b.Run(name+"/spill_"+dt.String(), func(b *testing.B) {
				be, err := Open(kernels.Config{})
				if err != nil {
					b.Fatal(err)
				}
				defer be.Close()
				tx, tw := upload(b, be, dt, x), upload(b, be, dt, w)
				out := upload(b, be, kernels.F32, make([]float32, s.BT*s.OC))
				q := be.DefaultQueue()
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					be.MatmulForward(q, out, tx, tw, kernels.Tensor{}, s.BT, s.C, s.OC)
				}
				syncQ(b, be)
				b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
		b.Run(name+"/gonum_f32", func(b *testing.B) {
			A := blas32.General{Rows: s.BT, Cols: s.C, Stride: s.C, Data: x}
			B := blas32.General{Rows: s.OC, Cols: s.C, Stride: s.C, Data: w}
			C := blas32.General{Rows: s.BT, Cols: s.OC, Stride: s.OC, Data: make([]float32, s.BT*s.OC)}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				blas32.Gemm(blas.NoTrans, blas.Trans, 1, A, B, 0, C)
			}
			b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}

func BenchmarkMatmulBackward(b *testing.B) {
	s := benchShapes[0]
	flops := 4 * float64(s.BT) * float64(s.C) * float64(s.OC)
	r := rand.New(rand.NewPCG(1, 2))
	be, err := Open(kernels.Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer be.Close()
	tx, tw, tdy := upload(b, be, kernels.F32, randVals(r, s.BT*s.C, 1)), upload(b, be, kernels.F32, randVals(r, s.OC*s.C, 1)), upload(b, be, kernels.F32, randVals(r, s.BT*s.OC, 1))
	dx, dw, db := upload(b, be, kernels.F32, make([]float32, s.BT*s.C)), upload(b, be, kernels.F32, make([]float32, s.OC*s.C)), upload(b, be, kernels.F32, make([]float32, s.OC))
	q := be.DefaultQueue()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		be.MatmulBackward(q, dx, dw, db, tdy, tx, tw, s.BT, s.C, s.OC)
	}
	syncQ(b, be)
	b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}

const adamN = 1 << 22

func BenchmarkAdamW(b *testing.B) {
	// Bytes touched per parameter: param, m, v read+written (24), grad read (4).
	const bytesPer = 28
	b.Run("spill", func(b *testing.B) {
		be, err := Open(kernels.Config{})
		if err != nil {
			b.Fatal(err)
		}
		defer be.Close()
		r := rand.New(rand.NewPCG(3, 4))
		p, g := upload(b, be, kernels.F32, randVals(r, adamN, 1)), upload(b, be, kernels.F32, randVals(r, adamN, 1))
		m, v := upload(b, be, kernels.F32, make([]float32, adamN)), upload(b, be, kernels.F32, make([]float32, adamN))
		q := be.DefaultQueue()
		hp := kernels.AdamWParams{LR: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1}
		b.SetBytes(adamN * bytesPer)
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			hp.Step = i + 1
			be.AdamW(q, p, g, m, v, kernels.Tensor{}, hp)
		}
		syncQ(b, be)
		b.ReportMetric(float64(adamN)*float64(b.N)/b.Elapsed().Seconds()/1e6, "Mparams/s")
	})
	b.Run("stream", func(b *testing.B) {
		// The same arrays read and written by a plain loop on the same
		// number of goroutines: the memory-bandwidth bound AdamW aims for.
		p, g, m, v := make([]float32, adamN), make([]float32, adamN), make([]float32, adamN), make([]float32, adamN)
		threads := runtime.GOMAXPROCS(0)
		b.SetBytes(adamN * bytesPer)
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			var wg sync.WaitGroup
			per := adamN / threads
			for t := 0; t < threads; t++ {
				wg.Add(1)
				go func(lo, hi int) {
					defer wg.Done()
					ps, gs, ms, vs := p[lo:hi], g[lo:hi], m[lo:hi], v[lo:hi]
					for j := range ps {
						gj := gs[j]
						ms[j] += gj
						vs[j] += gj
						ps[j] += gj
					}
				}(t*per, (t+1)*per)
			}
			wg.Wait()
		}
		b.ReportMetric(float64(adamN)*float64(b.N)/b.Elapsed().Seconds()/1e6, "Mparams/s")
	})
}
