package cpu

import (
	"context"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/spill-ml/spill/kernels"
)

func openBE(t testing.TB, limit int64) *Backend {
	t.Helper()
	be, err := Open(kernels.Config{MemoryLimit: limit, Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := be.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return be
}

func syncQ(t testing.TB, be *Backend) {
	t.Helper()
	if err := be.DefaultQueue().Synchronize(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// upload allocates a tensor of dtype dt holding vals (rounded to dt).
func upload(t testing.TB, be *Backend, dt kernels.DType, vals []float32) kernels.Tensor {
	t.Helper()
	buf, err := be.Alloc(int64(len(vals)*dt.Size()), "test")
	if err != nil {
		t.Fatal(err)
	}
	src := make([]byte, 4*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint32(src[4*i:], math.Float32bits(v))
	}
	host := make([]byte, len(vals)*dt.Size())
	kernels.ConvertBytes(host, dt, src, kernels.F32)
	tt := kernels.View(buf, 0, dt, len(vals))
	be.CopyToDevice(be.DefaultQueue(), tt, host)
	syncQ(t, be)
	return tt
}

func uploadI32(t testing.TB, be *Backend, vals []int32) kernels.Tensor {
	t.Helper()
	buf, err := be.Alloc(int64(4*len(vals)), "test")
	if err != nil {
		t.Fatal(err)
	}
	host := make([]byte, 4*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint32(host[4*i:], uint32(v))
	}
	tt := kernels.View(buf, 0, kernels.I32, len(vals))
	be.CopyToDevice(be.DefaultQueue(), tt, host)
	syncQ(t, be)
	return tt
}

// download returns the values of tt as float32.
func download(t testing.TB, be *Backend, tt kernels.Tensor) []float32 {
	t.Helper()
	host := make([]byte, tt.Bytes())
	be.CopyToHost(be.DefaultQueue(), host, tt)
	syncQ(t, be)
	f := make([]byte, 4*tt.N)
	kernels.ConvertBytes(f, kernels.F32, host, tt.DType)
	out := make([]float32, tt.N)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(f[4*i:]))
	}
	return out
}

// randVals returns n values ~ N(0, scale²) that are exact in bf16 and f16
// (bf16 grid, magnitudes kept in f16's normal range), so every dtype path
// sees the same inputs.
func randVals(r *rand.Rand, n int, scale float64) []float32 {
	out := make([]float32, n)
	for i := range out {
		v := r.NormFloat64() * scale
		if math.Abs(v) < 1e-3 {
			v = math.Copysign(1e-3, v)
		}
		out[i] = kernels.F32FromBF16(kernels.BF16FromF32(float32(v)))
	}
	return out
}

func to64(xs []float32) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = float64(x)
	}
	return out
}

// numGrad is the central-difference gradient of Σ dout·f(ins) with respect
// to ins[which], in float64.
func numGrad(f func([][]float64) []float64, ins [][]float64, dout []float64, which int) []float64 {
	loss := func() float64 {
		s := 0.0
		for i, v := range f(ins) {
			s += v * dout[i]
		}
		return s
	}
	x := ins[which]
	g := make([]float64, len(x))
	for j := range x {
		orig := x[j]
		h := 1e-6 * math.Max(1, math.Abs(orig))
		x[j] = orig + h
		lp := loss()
		x[j] = orig - h
		lm := loss()
		x[j] = orig
		g[j] = (lp - lm) / (2 * h)
	}
	return g
}

// checkClose compares float32 results with a float64 reference: each
// element within 2e-3 relative plus 1e-4 of the reference's largest
// magnitude.
func checkClose(t testing.TB, what string, got []float32, want []float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	maxAbs := 0.0
	for _, w := range want {
		maxAbs = math.Max(maxAbs, math.Abs(w))
	}
	bad := 0
	for i := range got {
		g, w := float64(got[i]), want[i]
		if !(math.Abs(g-w) <= 2e-3*math.Abs(w)+1e-4*(maxAbs+1e-2)) {
			bad++
			if bad <= 5 {
				t.Errorf("%s[%d] = %v, want %v", what, i, g, w)
			}
		}
	}
	if bad > 0 {
		t.Fatalf("%s: %d of %d values differ", what, bad, len(got))
	}
}

// checkDoubled checks that a second accumulation doubled the first.
func checkDoubled(t testing.TB, what string, once, twice []float32) {
	t.Helper()
	for i := range once {
		if d := math.Abs(float64(twice[i]) - 2*float64(once[i])); d > 1e-5*math.Abs(float64(once[i]))+1e-6 {
			t.Fatalf("%s[%d]: second backward gave %v, want 2×%v (gradients must accumulate)", what, i, twice[i], once[i])
		}
	}
}
