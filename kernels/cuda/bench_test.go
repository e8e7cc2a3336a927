//go:build cuda

package cuda

import (
	"context"
	"testing"

	"github.com/spill-ml/spill/kernels"
)

func benchBackend(b *testing.B) *Backend {
	be, err := Open(kernels.Config{MemoryLimit: 16 << 30})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = be.Close() })
	return be
}

func benchTensor(b *testing.B, be *Backend, dt kernels.DType, n int) kernels.Tensor {
	buf, err := be.Alloc(int64(n*dt.Size()), "bench")
	if err != nil {
		b.Fatal(err)
	}
	t := kernels.View(buf, 0, dt, n)
	be.Fill(be.DefaultQueue(), t, 0.01)
	return t
}

func syncB(b *testing.B, be *Backend) {
	if err := be.DefaultQueue().Synchronize(context.Background()); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkMatmulBF16 is the GPT-2 124M fc layer (B=8, T=1024): forward and
// backward, reported as bytes of the three operands per op.
func BenchmarkMatmulBF16(b *testing.B) {
	be := benchBackend(b)
	q := be.DefaultQueue()
	BT, C, OC := 8*1024, 768, 3072
	x, w, out := benchTensor(b, be, kernels.BF16, BT*C), benchTensor(b, be, kernels.BF16, OC*C), benchTensor(b, be, kernels.BF16, BT*OC)
	dx, dw, db := benchTensor(b, be, kernels.BF16, BT*C), benchTensor(b, be, kernels.BF16, OC*C), benchTensor(b, be, kernels.BF16, OC)
	bias := benchTensor(b, be, kernels.BF16, OC)
	syncB(b, be)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		be.MatmulForward(q, out, x, w, bias, BT, C, OC)
		be.MatmulBackward(q, dx, dw, db, out, x, w, BT, C, OC)
	}
	syncB(b, be)
	b.ReportMetric(3*2*float64(BT)*float64(C)*float64(OC)*float64(b.N)/b.Elapsed().Seconds()/1e12, "TFLOP/s")
}

// BenchmarkAttention is one GPT-2 124M attention layer (B=8, T=1024, C=768,
// NH=12) forward and backward in bf16.
func BenchmarkAttention(b *testing.B) {
	be := benchBackend(b)
	q := be.DefaultQueue()
	B, T, C, NH := 8, 1024, 768, 12
	qkv, out := benchTensor(b, be, kernels.BF16, B*T*3*C), benchTensor(b, be, kernels.BF16, B*T*C)
	lse := benchTensor(b, be, kernels.F32, B*NH*T)
	dqkv, dout := benchTensor(b, be, kernels.BF16, B*T*3*C), benchTensor(b, be, kernels.BF16, B*T*C)
	syncB(b, be)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		be.AttentionForward(q, out, lse, qkv, B, T, C, NH)
		be.AttentionBackward(q, dqkv, dout, qkv, out, lse, B, T, C, NH)
	}
	syncB(b, be)
	// Causal attention: T²/2 query-key pairs of 4·hs flops (QK and PV) in
	// the forward pass; forward plus backward counted as 3.5 × forward, as
	// flash-attention papers do.
	fwd := 4 * float64(B) * float64(NH) * float64(T) * float64(T) / 2 * float64(C/NH)
	b.ReportMetric(3.5*fwd*float64(b.N)/b.Elapsed().Seconds()/1e12, "TFLOP/s")
}

// BenchmarkCopyPinned is a 64 MiB host-to-device copy from pinned memory.
func BenchmarkCopyPinned(b *testing.B) {
	be := benchBackend(b)
	q := be.DefaultQueue()
	const n = 64 << 20
	host, err := be.AllocPinned(n)
	if err != nil {
		b.Fatal(err)
	}
	defer be.FreePinned(host)
	dst := benchTensor(b, be, kernels.U8, n)
	syncB(b, be)
	b.SetBytes(n)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		be.CopyToDevice(q, dst, host)
	}
	syncB(b, be)
}

// BenchmarkLaunch is the host cost of enqueueing one small kernel: ns/op
// and allocs/op on the caller's side and the queue goroutine's (allocs
// count every goroutine), and the queue goroutine's time per launch
// (host-ns/launch, from HostStats). The kernel is tiny, so ns/op is bound
// by whichever of the host and the GPU is slower.
func BenchmarkLaunch(b *testing.B) {
	be := benchBackend(b)
	q := be.DefaultQueue()
	x := benchTensor(b, be, kernels.F32, 1024)
	syncB(b, be)
	_, l0, t0 := HostStats()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		be.Scale(q, x, 1)
	}
	syncB(b, be)
	b.StopTimer()
	if _, l1, t1 := HostStats(); l1 > l0 {
		b.ReportMetric(float64(t1-t0)/float64(l1-l0), "host-ns/launch")
	}
}
