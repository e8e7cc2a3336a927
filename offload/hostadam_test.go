package offload_test

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"testing"

	"github.com/spill-ml/spill/kernels"
	_ "github.com/spill-ml/spill/kernels/cpu"
	"github.com/spill-ml/spill/offload"
)

// TestHostAdamWMatchesCPUKernel: the host optimizer and the CPU backend's
// AdamW kernel give the same bits, for fp32 and bf16 gradients and
// compute copies, on a length that exercises the vector and scalar tails.
func TestHostAdamWMatchesCPUKernel(t *testing.T) {
	be, err := kernels.Open("cpu", kernels.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	q := be.DefaultQueue()
	const n = 1003
	seed := uint32(1)
	rnd := func() float32 {
		seed = seed*1664525 + 1013904223
		return float32(seed>>8)/float32(1<<24)*2 - 1
	}
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
		param, m, v := make([]float32, n), make([]float32, n), make([]float32, n)
		for i := range param {
			param[i], m[i], v[i] = rnd(), rnd()*0.1, rnd()*rnd()*0.01
		}
		grad := offload.NewF32Bytes(int64(n * dt.Size()))
		for i := 0; i < n; i++ {
			g := rnd() * 3
			if dt == kernels.F32 {
				binary.LittleEndian.PutUint32(grad[4*i:], math.Float32bits(g))
			} else {
				binary.LittleEndian.PutUint16(grad[2*i:], kernels.BF16FromF32(g))
			}
		}
		hp := kernels.AdamWParams{LR: 1e-2, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Step: 3, GradScale: 0.7}

		dev := func(nb int) kernels.Buffer {
			b, err := be.Alloc(int64(nb), "t")
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
		bytesOf := func(f []float32) []byte {
			b := offload.NewF32Bytes(int64(4 * len(f)))
			copy(offload.F32s(b), f)
			return b
		}
		dp, dg, dm, dv, do := dev(4*n), dev(n*dt.Size()), dev(4*n), dev(4*n), dev(n*dt.Size())
		tp, tg, tm, tv, to := kernels.View(dp, 0, kernels.F32, n), kernels.View(dg, 0, dt, n),
			kernels.View(dm, 0, kernels.F32, n), kernels.View(dv, 0, kernels.F32, n), kernels.View(do, 0, dt, n)
		be.CopyToDevice(q, tp, bytesOf(param))
		be.CopyToDevice(q, tg, grad)
		be.CopyToDevice(q, tm, bytesOf(m))
		be.CopyToDevice(q, tv, bytesOf(v))
		be.AdamW(q, tp, tg, tm, tv, to, hp)
		wantP, wantO := offload.NewF32Bytes(4*n), offload.NewF32Bytes(int64(n*dt.Size()))
		be.CopyToHost(q, wantP, tp)
		be.CopyToHost(q, wantO, to)
		if err := q.Synchronize(context.Background()); err != nil {
			t.Fatal(err)
		}

		out := offload.NewF32Bytes(int64(n * dt.Size()))
		if err := offload.HostAdamW(param, grad, dt, m, v, out, dt, hp); err != nil {
			t.Fatal(err)
		}
		got := bytesOf(param)
		for i := range got {
			if got[i] != wantP[i] {
				t.Fatalf("%v: param byte %d differs from the kernel's", dt, i)
			}
		}
		for i := range out {
			if out[i] != wantO[i] {
				t.Fatalf("%v: compute copy byte %d differs from the kernel's", dt, i)
			}
		}
	}
	if err := offload.HostAdamW(make([]float32, 3), make([]byte, 8), kernels.F32, nil, nil, nil, kernels.F32, kernels.AdamWParams{Step: 1}); err == nil {
		t.Error("mismatched lengths: no error")
	}
}

// TestCacheWhole: a Whole cache hands out whole backend buffers, reuses a
// freed one only for the same rounded size and never exceeds its limit.
func TestCacheWhole(t *testing.T) {
	be, err := kernels.Open("cpu", kernels.Config{MemoryLimit: 8 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	c := offload.NewCache(be, offload.CacheConfig{Limit: 8 << 10, Whole: true})
	a, err := c.Alloc(1000, offload.Weights)
	if err != nil {
		t.Fatal(err)
	}
	if a.Buffer().Size() != 1024 {
		t.Errorf("buffer of %d bytes for a request of 1000, want 1024", a.Buffer().Size())
	}
	c.Free(a)
	b, err := c.Alloc(1020, offload.Grads)
	if err != nil {
		t.Fatal(err)
	}
	if b.Buffer() != a.Buffer() {
		t.Error("a freed block of the same rounded size was not reused")
	}
	if _, err := c.Alloc(7<<10+512, offload.Activations); !errors.Is(err, offload.ErrBudget) {
		t.Errorf("over the limit: got %v, want ErrBudget", err)
	}
	c.Free(b)
	if _, err := c.Alloc(7<<10+512, offload.Activations); err != nil {
		t.Errorf("after freeing, 7.5 KiB of 8 should fit: %v", err)
	}
	if s := c.Stats(); s.PeakReserved > 8<<10 {
		t.Errorf("peak reserved %d over the limit", s.PeakReserved)
	}
}

func TestHostFinite(t *testing.T) {
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16, kernels.F16} {
		for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)), 0} {
			vals := []float32{1, -2.5, 65504, 1e-3, 0}
			vals[2] = bad
			b := offload.NewF32Bytes(int64(len(vals) * dt.Size()))
			for i, x := range vals {
				switch dt {
				case kernels.F32:
					binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
				case kernels.BF16:
					binary.LittleEndian.PutUint16(b[2*i:], kernels.BF16FromF32(x))
				default:
					binary.LittleEndian.PutUint16(b[2*i:], kernels.F16FromF32(x))
				}
			}
			want := bad == 0
			if got := offload.HostFinite(b, dt); got != want {
				t.Errorf("%v with %v: HostFinite = %v, want %v", dt, bad, got, want)
			}
		}
	}
}
