package cpu

import (
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/spill-ml/spill/kernels"
)

// A small request must not take a large pooled buffer: that is how a
// logits-sized scratch ended up as a LayerNorm row buffer while the next
// logits op allocated a fresh one, step after step.
func TestScratchSizeClass(t *testing.T) {
	for n := 1; n < 1<<16; n++ {
		c, size := scratchClass(n)
		if size < n || size > n+n/4+1 || scratchClassOf(size) != c || c >= len(scratchPools) {
			t.Fatalf("scratchClass(%d) = class %d of size %d (class of that size: %d)", n, c, size, scratchClassOf(size))
		}
		if n > 1 {
			if cp, _ := scratchClass(n - 1); cp != c && cp != c-1 {
				t.Fatalf("classes skip between %d (%d) and %d (%d)", n-1, cp, n, c)
			}
		}
	}
	for _, n := range []int{1, 100, 1024, 1025, 3000, 1 << 16, 50257*8 + 3} {
		s := getScratch(n)
		if len(s) != n || cap(s) < n || cap(s) > n+n/4+1 {
			t.Errorf("getScratch(%d): len %d cap %d, want len %d and cap within 25%%", n, len(s), cap(s), n)
		}
		putScratch(s)
	}
	big := getScratch(1 << 22)
	putScratch(big)
	for _, n := range []int{128, 2048, 1 << 20} {
		s := getScratch(n)
		if cap(s) > n+n/4+1 {
			t.Errorf("getScratch(%d) after putting back %d elements: cap %d", n, len(big), cap(s))
		}
		putScratch(s)
	}
}

// TestScratchSteadyState runs a step-like sequence on 2 threads (the
// logits of a bf16 GPT: a matmul whose bf16 output converts through a
// scratch of the output's size, the cross-entropy's row scratch from the
// same pools on every worker, the backward matmul) and checks that, once warm, the sequence does not keep
// allocating large scratch: the host heap of a training run must not grow
// with the number of steps (issue 9: a bf16 GPT with a 50257-token
// vocabulary went from 1.45 to 3.07 GB of RSS in 10 steps).
func TestScratchSteadyState(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("short, or counting allocations under the race detector")
	}
	be := openBE(t, 0)
	q := be.DefaultQueue()
	r := rand.New(rand.NewPCG(1, 2))
	const BT, C, OC = 256, 16, 8192 // out: 2M elements, an 8 MiB float32 scratch
	x := upload(t, be, kernels.BF16, randVals(r, BT*C, 1))
	w := upload(t, be, kernels.BF16, randVals(r, OC*C, 1))
	dx := upload(t, be, kernels.BF16, make([]float32, BT*C))
	dw := upload(t, be, kernels.BF16, make([]float32, OC*C))
	logits := upload(t, be, kernels.BF16, make([]float32, BT*OC))
	dlogits := upload(t, be, kernels.BF16, make([]float32, BT*OC))
	losses := upload(t, be, kernels.F32, make([]float32, BT))
	tg := make([]int32, BT)
	for i := range tg {
		tg[i] = int32(r.IntN(OC))
	}
	targets := uploadI32(t, be, tg)
	step := func() {
		be.MatmulForward(q, logits, x, w, kernels.Tensor{}, BT, C, OC)
		be.CrossEntropyForward(q, losses, logits, targets, BT, OC)
		be.CrossEntropyBackward(q, dlogits, logits, targets, BT, OC, 1)
		be.MatmulBackward(q, dx, dw, kernels.Tensor{}, dlogits, x, w, BT, C, OC)
		syncQ(t, be)
	}
	for range 3 {
		step()
	}
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	const steps = 20
	for range steps {
		step()
	}
	runtime.ReadMemStats(&m1)
	scratch := uint64(4 * BT * OC)
	if got := m1.TotalAlloc - m0.TotalAlloc; got > 2*scratch {
		t.Errorf("%d warm steps allocated %d bytes (%.1f output scratches of %d bytes); want at most 2", steps, got, float64(got)/float64(scratch), scratch)
	}
}

// TestMatmulForwardRowBlocks: a 16-bit output larger than fwdScratch (a
// logits-shaped product, computed a block of rows at a time through a
// bounded scratch) has the bits of the float32 product of the whole
// matrix (one gemm) rounded once, with and without bias, and the scratch
// it takes is a block's, not the whole output's.
func TestMatmulForwardRowBlocks(t *testing.T) {
	if raceEnabled {
		t.Skip("counts allocations, which the race detector adds to")
	}
	be := openBE(t, 0)
	q := be.DefaultQueue()
	r := rand.New(rand.NewPCG(5, 6))
	const BT, C, OC = 3*mcBlk + 5, 16, 50257
	if BT*OC <= fwdScratch || max(1, fwdScratch/OC/mcBlk)*mcBlk >= BT {
		t.Fatal("the shape does not exercise the row blocks")
	}
	x := upload(t, be, kernels.BF16, randVals(r, BT*C, 1))
	w := upload(t, be, kernels.BF16, randVals(r, OC*C, 1))
	bias := upload(t, be, kernels.BF16, randVals(r, OC, 1))
	ref := upload(t, be, kernels.F32, make([]float32, BT*OC))
	for _, dt := range []kernels.DType{kernels.BF16, kernels.F16} {
		for _, bi := range []kernels.Tensor{{}, bias} {
			out := upload(t, be, dt, make([]float32, BT*OC))
			be.MatmulForward(q, ref, x, w, bi, BT, C, OC)
			var m0, m1 runtime.MemStats
			runtime.ReadMemStats(&m0)
			be.MatmulForward(q, out, x, w, bi, BT, C, OC)
			syncQ(t, be)
			runtime.ReadMemStats(&m1)
			if got := m1.TotalAlloc - m0.TotalAlloc; got >= 4*BT*OC/2 {
				t.Errorf("%v: the matmul allocated %d bytes, the whole float32 output is %d", dt, got, 4*BT*OC)
			}
			want, got := f32s(ref), u16s(out)
			for i := range got {
				var w uint16
				if dt == kernels.BF16 {
					w = kernels.BF16FromF32(want[i])
				} else {
					w = kernels.F16FromF32(want[i])
				}
				if got[i] != w {
					t.Fatalf("%v, bias %v: element %d (row %d) = %#04x, want %#04x", dt, !bi.IsZero(), i, i/OC, got[i], w)
				}
			}
			be.Free(out.Buf)
		}
	}
}

// TestLargeScratchAging: a large buffer left unused survives one garbage
// collection (it is taken again after it) and is dropped after two.
func TestLargeScratchAging(t *testing.T) {
	cycles := func() int64 {
		largeFree.Lock()
		defer largeFree.Unlock()
		return largeFree.cycles
	}
	// waitGC collects until ageLargeScratch has run k more times.
	waitGC := func(k int64) {
		want := cycles() + k
		for deadline := time.Now().Add(10 * time.Second); cycles() < want; {
			if time.Now().After(deadline) {
				t.Fatalf("the scratch lists were not aged after %d collections", k)
			}
			runtime.GC()
			time.Sleep(time.Millisecond)
		}
	}
	const n = 3 << 20 // a class of its own in this test binary
	// Other tests' collections can age the lists too: a try counts only
	// when exactly one cycle passed between the put and the get.
	var a []float32
	for try := 0; ; try++ {
		a = getScratch(n)
		putScratch(a)
		c0 := cycles()
		waitGC(1)
		b := getScratch(n)
		elapsed := cycles() - c0
		putScratch(b)
		if elapsed == 1 {
			if &b[0] != &a[0] {
				t.Fatal("a buffer unused for less than a GC cycle was dropped")
			}
			break
		}
		if try == 20 {
			t.Skip("collections ran too often to observe one cycle")
		}
	}
	waitGC(2)
	c := getScratch(n)
	if &c[0] == &a[0] {
		t.Fatal("a buffer unused for two GC cycles was kept")
	}
	putScratch(c)
}
