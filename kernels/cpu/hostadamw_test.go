package cpu

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/spill-ml/spill/kernels"
)

// TestHostAdamWLeavesAP: a large HostAdamW call never has more goroutines
// updating at once than hostHelpers allows (one P left free from 4 Ps
// up, 7 in 10 updating from 8 up), and hostHelpers keeps at least the
// caller below that.
func TestHostAdamWLeavesAP(t *testing.T) {
	for p, want := range map[int]int{1: 0, 2: 1, 3: 2, 4: 2, 7: 5, 8: 4, 16: 10} {
		if got := hostHelpers(p); got != want {
			t.Errorf("hostHelpers(%d) = %d, want %d", p, got, want)
		}
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	n := 64 * hostChunk
	param, m, v := make([]float32, n), make([]float32, n), make([]float32, n)
	grad := make([]byte, 4*n)
	var busy, most atomic.Int32
	hostChunkHook = func(start bool) {
		if !start {
			busy.Add(-1)
			return
		}
		b := busy.Add(1)
		for {
			old := most.Load()
			if b <= old || most.CompareAndSwap(old, b) {
				break
			}
		}
	}
	defer func() { hostChunkHook = nil }()
	if err := HostAdamW(param, grad, kernels.F32, m, v, nil, kernels.F32, kernels.AdamWParams{LR: 1e-3, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, Step: 1}); err != nil {
		t.Fatal(err)
	}
	if got := int(most.Load()); got < 1 || got > hostHelpers(4)+1 {
		t.Errorf("at GOMAXPROCS 4, %d goroutines updated at once, want 1 to %d", got, hostHelpers(4)+1)
	}
}

// TestHostAdamWFrom: the out-of-place update gives the bits of the
// in-place one on a copy of the sources (state, gradient scale and the
// rounded compute copy), leaves the sources unchanged, on one goroutine
// and on several, and refuses overlapping destinations.
func TestHostAdamWFrom(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	rng := rand.New(rand.NewPCG(7, 9))
	for _, n := range []int{1000, 3*hostChunk + 17} {
		p0, m0, v0 := make([]float32, n), make([]float32, n), make([]float32, n)
		grad := make([]byte, 2*n)
		for i := range n {
			p0[i], m0[i], v0[i] = rng.Float32()-0.5, (rng.Float32()-0.5)*1e-2, rng.Float32()*1e-4
			binary.LittleEndian.PutUint16(grad[2*i:], uint16(math.Float32bits((rng.Float32()-0.5)*0.1)>>16))
		}
		keep := [3][]float32{slices.Clone(p0), slices.Clone(m0), slices.Clone(v0)}
		hp := kernels.AdamWParams{LR: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Step: 3, GradScale: 0.5}
		// In place on copies.
		pw, mw, vw := slices.Clone(p0), slices.Clone(m0), slices.Clone(v0)
		ow := make([]byte, 2*n)
		if err := HostAdamW(pw, grad, kernels.BF16, mw, vw, ow, kernels.BF16, hp); err != nil {
			t.Fatal(err)
		}
		// Out of place, into poisoned destinations: aligned, all shifted
		// alike (the kernel's aligned part after a few elements), and
		// moments aligned unalike (no aligned kernel).
		for _, off := range [][3]int{{0, 0, 0}, {3, 3, 3}, {0, 1, 2}} {
			at := func(k int) []float32 { return make([]float32, n+off[k])[off[k]:] }
			p, m, v := at(0), at(1), at(2)
			o := make([]byte, 2*n)
			for i := range n {
				p[i], m[i], v[i] = float32(math.NaN()), float32(math.NaN()), float32(math.NaN())
			}
			if err := HostAdamWFrom(p, m, v, p0, m0, v0, grad, kernels.BF16, o, kernels.BF16, hp); err != nil {
				t.Fatal(err)
			}
			for i := range n {
				if math.Float32bits(p[i]) != math.Float32bits(pw[i]) || math.Float32bits(m[i]) != math.Float32bits(mw[i]) || math.Float32bits(v[i]) != math.Float32bits(vw[i]) {
					t.Fatalf("n %d, offsets %v, element %d: out of place %v %v %v, in place %v %v %v", n, off, i, p[i], m[i], v[i], pw[i], mw[i], vw[i])
				}
			}
			if !slices.Equal(o, ow) {
				t.Fatalf("n %d, offsets %v: rounded compute copies differ", n, off)
			}
		}
		m, v := make([]float32, n), make([]float32, n)
		for k, s := range [][]float32{p0, m0, v0} {
			if !slices.Equal(s, keep[k]) {
				t.Fatalf("n %d: source %d changed", n, k)
			}
		}
		if err := HostAdamWFrom(p0[1:], m[:n-1], v[:n-1], p0[:n-1], m0[:n-1], v0[:n-1], grad[2:], kernels.BF16, nil, kernels.BF16, hp); err == nil {
			t.Fatalf("n %d: overlapping destination accepted", n)
		}
	}
}
