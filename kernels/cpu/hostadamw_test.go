package cpu

import (
	"runtime"
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
