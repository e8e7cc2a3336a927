package offload_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"
	"testing"

	"github.com/spill-ml/spill/kernels"
	_ "github.com/spill-ml/spill/kernels/cpu"
	"github.com/spill-ml/spill/offload"
)

// TestHostAdamWMatchesCPUKernel: the host optimizer and the CPU backend's
// AdamW kernel give the same bits (parameters, moments and compute copy)
// for every gradient dtype, every compute-copy dtype and none, on lengths
// that exercise the vector body, the scalar tails, the serial path and the
// parallel one (with more workers than cores), with gradients that include
// NaN, ±Inf, subnormals and values beyond binary16's range.
func TestHostAdamWMatchesCPUKernel(t *testing.T) {
	be, err := kernels.Open("cpu", kernels.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	dts := []kernels.DType{kernels.F32, kernels.BF16, kernels.F16}
	for _, n := range []int{0, 1, 7, 8, 9, 1003, 2<<16 + 1029, 5<<16 + 3} {
		for _, gdt := range dts {
			for _, odt := range append([]kernels.DType{0}, dts...) {
				name := fmt.Sprintf("n=%d/grad=%v/out=%v", n, gdt, odt)
				if odt == 0 {
					name = fmt.Sprintf("n=%d/grad=%v/no-out", n, gdt)
				}
				t.Run(name, func(t *testing.T) {
					if n == 5<<16+3 && gdt == kernels.BF16 {
						// More workers than cores: chunks claimed concurrently.
						defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(8))
					}
					checkHostAdamW(t, be, n, gdt, odt, uint32(n)*31+uint32(gdt)*7+uint32(odt))
				})
			}
		}
	}
	if err := offload.HostAdamW(make([]float32, 3), make([]byte, 8), kernels.F32, nil, nil, nil, kernels.F32, kernels.AdamWParams{Step: 1}); err == nil {
		t.Error("mismatched lengths: no error")
	}
	if err := offload.HostAdamW(make([]float32, 3), make([]byte, 12), kernels.F32, make([]float32, 3), make([]float32, 3), nil, kernels.F32, kernels.AdamWParams{Step: 0}); err == nil {
		t.Error("step 0: no error")
	}
	if err := offload.HostAdamW(make([]float32, 3), make([]byte, 6), kernels.BF16, make([]float32, 3), make([]float32, 3), make([]byte, 3), kernels.I32, kernels.AdamWParams{Step: 1}); err == nil {
		t.Error("non-float out: no error")
	}
}

// hostAdamState is one layer's optimizer state and gradient in host memory.
type hostAdamState struct {
	param, m, v []float32
	grad        []byte
}

func newHostAdamState(n int, gdt kernels.DType, seed uint32) hostAdamState {
	rnd := func() float32 {
		seed = seed*1664525 + 1013904223
		return float32(seed>>8)/float32(1<<24)*2 - 1
	}
	s := hostAdamState{param: make([]float32, n), m: make([]float32, n), v: make([]float32, n), grad: offload.NewF32Bytes(int64(n * gdt.Size()))}
	for i := range s.param {
		s.param[i], s.m[i], s.v[i] = rnd(), rnd()*0.1, rnd()*rnd()*0.01
		if i%97 == 5 {
			s.param[i] *= 1e5 // rounds to Inf in binary16
		}
	}
	specials := []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)), 1e-40, -3e-8, 7e4, 0}
	for i := 0; i < n; i++ {
		g := rnd() * 3
		if i%101 == 50 {
			g = specials[(i/101)%len(specials)]
		}
		switch gdt {
		case kernels.F32:
			binary.LittleEndian.PutUint32(s.grad[4*i:], math.Float32bits(g))
		case kernels.BF16:
			binary.LittleEndian.PutUint16(s.grad[2*i:], kernels.BF16FromF32(g))
		default:
			binary.LittleEndian.PutUint16(s.grad[2*i:], kernels.F16FromF32(g))
		}
	}
	return s
}

var hostAdamParams = kernels.AdamWParams{LR: 1e-2, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Step: 3, GradScale: 0.7}

// checkHostAdamW runs one step on the CPU backend's kernel and one with
// HostAdamW from the same state and compares every byte. odt 0: no
// compute copy.
func checkHostAdamW(t *testing.T, be kernels.Backend, n int, gdt, odt kernels.DType, seed uint32) {
	t.Helper()
	q := be.DefaultQueue()
	s := newHostAdamState(n, gdt, seed)
	bytesOf := func(f []float32) []byte {
		b := offload.NewF32Bytes(int64(4 * len(f)))
		copy(offload.F32s(b), f)
		return b
	}
	tensor := func(dt kernels.DType, host []byte) kernels.Tensor {
		b, err := be.Alloc(int64(max(1, n*dt.Size())), "t")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { be.Free(b) })
		tt := kernels.View(b, 0, dt, n)
		if host != nil {
			be.CopyToDevice(q, tt, host)
		}
		return tt
	}
	tp, tg := tensor(kernels.F32, bytesOf(s.param)), tensor(gdt, s.grad)
	tm, tv := tensor(kernels.F32, bytesOf(s.m)), tensor(kernels.F32, bytesOf(s.v))
	var to kernels.Tensor
	var out, wantO []byte
	if odt != 0 {
		to = tensor(odt, nil)
		out, wantO = offload.NewF32Bytes(int64(n*odt.Size())), offload.NewF32Bytes(int64(n*odt.Size()))
	}
	be.AdamW(q, tp, tg, tm, tv, to, hostAdamParams)
	wantP, wantM, wantV := offload.NewF32Bytes(int64(4*n)), offload.NewF32Bytes(int64(4*n)), offload.NewF32Bytes(int64(4*n))
	be.CopyToHost(q, wantP, tp)
	be.CopyToHost(q, wantM, tm)
	be.CopyToHost(q, wantV, tv)
	if odt != 0 {
		be.CopyToHost(q, wantO, to)
	}
	if err := q.Synchronize(context.Background()); err != nil {
		t.Fatal(err)
	}

	if err := offload.HostAdamW(s.param, s.grad, gdt, s.m, s.v, out, odt, hostAdamParams); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name      string
		got, want []byte
	}{{"param", bytesOf(s.param), wantP}, {"m", bytesOf(s.m), wantM}, {"v", bytesOf(s.v), wantV}, {"compute copy", out, wantO}} {
		if !bytes.Equal(c.got, c.want) {
			i := 0
			for c.got[i] == c.want[i] {
				i++
			}
			t.Fatalf("%s byte %d of %d differs from the kernel's", c.name, i, len(c.want))
		}
	}
}

// TestHostAdamWConcurrent: calls on several layers at once (sharing the
// host workers) give the same bits as the same calls one after the other.
func TestHostAdamWConcurrent(t *testing.T) {
	const layers, n = 4, 3<<16 + 77
	serial, conc := make([]hostAdamState, layers), make([]hostAdamState, layers)
	outS, outC := make([][]byte, layers), make([][]byte, layers)
	for l := range serial {
		serial[l], conc[l] = newHostAdamState(n, kernels.BF16, uint32(l)), newHostAdamState(n, kernels.BF16, uint32(l))
		outS[l], outC[l] = offload.NewF32Bytes(2*n), offload.NewF32Bytes(2*n)
		s := serial[l]
		if err := offload.HostAdamW(s.param, s.grad, kernels.BF16, s.m, s.v, outS[l], kernels.BF16, hostAdamParams); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, layers)
	for l := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := conc[l]
			errs[l] = offload.HostAdamW(s.param, s.grad, kernels.BF16, s.m, s.v, outC[l], kernels.BF16, hostAdamParams)
		}()
	}
	wg.Wait()
	for l := range conc {
		if errs[l] != nil {
			t.Fatal(errs[l])
		}
		for i := range serial[l].param {
			if math.Float32bits(serial[l].param[i]) != math.Float32bits(conc[l].param[i]) {
				t.Fatalf("layer %d: param %d differs between serial and concurrent calls", l, i)
			}
		}
		if !bytes.Equal(outS[l], outC[l]) {
			t.Fatalf("layer %d: compute copies differ", l)
		}
	}
}

// TestHostAdamWAllocs: once warm, a call allocates nothing, on the serial
// path and on the parallel one.
func TestHostAdamWAllocs(t *testing.T) {
	for _, n := range []int{1000, 4<<16 + 5} {
		s := newHostAdamState(n, kernels.BF16, 1)
		out := offload.NewF32Bytes(int64(2 * n))
		hp := hostAdamParams
		call := func() {
			hp.Step++
			if err := offload.HostAdamW(s.param, s.grad, kernels.BF16, s.m, s.v, out, kernels.BF16, hp); err != nil {
				t.Fatal(err)
			}
		}
		call()
		if a := testing.AllocsPerRun(20, call); a != 0 {
			t.Errorf("n=%d: %v allocations per call, want 0", n, a)
		}
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
