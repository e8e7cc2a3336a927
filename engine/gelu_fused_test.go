package engine

import (
	"sync"
	"testing"

	"github.com/spill-ml/spill/kernels"
	"github.com/spill-ml/spill/kernels/cpu"
)

// fusedGelu is the CPU backend with kernels.GeluMatmuler made of the
// unfused ops, so that the GPT block's fused path runs on the CPU: each
// method is exactly the sequence its contract names (the temporary of
// the backward in one buffer kept for the backend's life).
type fusedGelu struct {
	*cpu.Backend
	mu    sync.Mutex
	tmp   kernels.Buffer
	calls [2]int
}

func (f *fusedGelu) MatmulGeluForward(q kernels.Queue, out, pre, inp, weight, bias kernels.Tensor, BT, C, OC int) {
	f.calls[0]++
	f.MatmulForward(q, pre, inp, weight, bias, BT, C, OC)
	f.GeluForward(q, out, pre, BT*OC)
}

func (f *fusedGelu) MatmulBackwardGeluSet(q kernels.Queue, dinp, dweight, dbias, dout, inp, weight, pre kernels.Tensor, BT, C, OC int) {
	f.calls[1]++
	n := int64(BT*C) * int64(dinp.DType.Size())
	f.mu.Lock()
	if f.tmp == nil || f.tmp.Size() < n {
		// Grown only between steps in this test's shapes (a buffer still
		// in use by a queued op is never freed before Close).
		b, err := f.Alloc(n, "test tmp")
		if err != nil {
			panic(err)
		}
		f.tmp = b
	}
	t := kernels.View(f.tmp, 0, dinp.DType, BT*C)
	f.mu.Unlock()
	kernels.MatmulBackwardSet(f.Backend, q, t, dweight, dbias, dout, inp, weight, BT, C, OC)
	kernels.GeluBackwardSet(f.Backend, q, dinp, pre, t, BT*C)
}

// TestGPTFusedGeluPath: the GPT block on a backend that fuses the MLP's
// GELU into its GEMMs (kernels.GeluMatmuler: CUDA's cuBLASLt epilogues)
// calls the fused ops and, where they are the unfused sequence, trains bit
// for bit like the unfused block, with full and with lean activations.
func TestGPTFusedGeluPath(t *testing.T) {
	const steps = 2
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
		for _, lean := range []bool{false, true} {
			wantL, wantW := runResident(t, dt, steps)
			be, err := kernels.Open("cpu", kernels.Config{Threads: 2})
			if err != nil {
				t.Fatal(err)
			}
			f := &fusedGelu{Backend: be.(*cpu.Backend)}
			m, err := NewGPT(oocShape, dt)
			if err != nil {
				t.Fatal(err)
			}
			m.SetLeanActivations(lean)
			tr, err := NewTrainer(f, m, oocOptions())
			if err != nil {
				t.Fatal(err)
			}
			gotL, gotW := trainSteps(t, tr, steps)
			tr.Close()
			be.Close()
			if f.calls[0] == 0 || f.calls[1] == 0 {
				t.Errorf("%v lean %v: fused ops called %v times (forward, backward); want both", dt, lean, f.calls)
			}
			sameRun(t, "unfused", wantL, gotL, wantW, gotW)
		}
	}
}
