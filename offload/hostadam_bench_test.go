package offload_test

import (
	"fmt"
	"testing"

	"github.com/spill-ml/spill/kernels"
	"github.com/spill-ml/spill/offload"
)

// hostAdamBytesPerParam is the memory traffic of one parameter's update
// with 16-bit gradients and outputs: the fp32 master weight, m and v read
// and written (24 bytes), the gradient read (2) and the compute copy
// written (2).
const hostAdamBytesPerParam = 4*2*3 + 2 + 2

// BenchmarkHostAdamW: one host AdamW step over a layer of 1M and 50M
// parameters, bf16 gradients and bf16 compute copy. SetBytes counts the
// bytes touched per call, so MB/s is the memory bandwidth achieved; params/s
// is reported beside it.
func BenchmarkHostAdamW(b *testing.B) {
	for _, n := range []int{1 << 20, 50 << 20} {
		b.Run(fmt.Sprintf("n=%dM", n>>20), func(b *testing.B) {
			param, m, v := make([]float32, n), make([]float32, n), make([]float32, n)
			grad, out := offload.NewF32Bytes(int64(2*n)), offload.NewF32Bytes(int64(2*n))
			g := offload.F32s(grad) // fill the bf16 pairs with small values
			for i := range param {
				param[i] = float32(i%1000) * 1e-3
				v[i] = 1e-4
			}
			for i := range g {
				g[i] = 0.01
			}
			hp := kernels.AdamWParams{LR: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Step: 1}
			if err := offload.HostAdamW(param, grad, kernels.BF16, m, v, out, kernels.BF16, hp); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(n) * hostAdamBytesPerParam)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				hp.Step = 2 + i
				if err := offload.HostAdamW(param, grad, kernels.BF16, m, v, out, kernels.BF16, hp); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "params/s")
		})
	}
}

// BenchmarkHostAdamWFrom: the out-of-place step (the speculative update)
// over the same layers, from one copy of the state into another and back,
// beside BenchmarkHostAdamW; SetBytes counts the same bytes, so the two
// MB/s compare the same work.
func BenchmarkHostAdamWFrom(b *testing.B) {
	for _, n := range []int{1 << 20, 50 << 20} {
		b.Run(fmt.Sprintf("n=%dM", n>>20), func(b *testing.B) {
			var st [2][3][]float32
			for k := range st {
				for j := range st[k] {
					st[k][j] = offload.F32s(offload.NewF32Bytes(int64(4 * n)))
				}
			}
			grad, out := offload.NewF32Bytes(int64(2*n)), offload.NewF32Bytes(int64(2*n))
			g := offload.F32s(grad)
			for i := range n {
				st[0][0][i] = float32(i%1000) * 1e-3
				st[0][2][i] = 1e-4
			}
			for i := range g {
				g[i] = 0.01
			}
			hp := kernels.AdamWParams{LR: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Step: 1}
			b.SetBytes(int64(n) * hostAdamBytesPerParam)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				hp.Step = 1 + i
				s, d := st[i%2], st[(i+1)%2]
				if err := offload.HostAdamWFrom(d[0], d[1], d[2], s[0], s[1], s[2], grad, kernels.BF16, out, kernels.BF16, hp); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "params/s")
		})
	}
}
