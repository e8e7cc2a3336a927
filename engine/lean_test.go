package engine

import (
	"testing"

	"github.com/spill-ml/spill/kernels"
	"github.com/spill-ml/spill/offload"
)

// TestLeanActivations: GPT blocks that save lean activations (layer norms
// and GELU recomputed in the backward) train to the same losses and
// weights, bit for bit, as blocks that save everything: resident, and out
// of core with kept, recomputed and offloaded activations under a budget;
// and they save 6 of every 16 activations per token less.
func TestLeanActivations(t *testing.T) {
	const steps = 2
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
		t.Run(dt.String(), func(t *testing.T) {
			wantL, wantW := runResident(t, dt, steps)

			m, err := NewGPT(oocShape, dt)
			if err != nil {
				t.Fatal(err)
			}
			full := m.Layers[1].ActivationBytes(oocB, oocT)
			if !m.SetLeanActivations(true) || !m.Lean {
				t.Fatal("a GPT cannot save lean activations")
			}
			lean := m.Layers[1].ActivationBytes(oocB, oocT)
			if saved := int64(6 * oocB * oocT * oocShape.Embd * dt.Size()); full-lean < saved {
				t.Errorf("lean block saves %d of %d activation bytes, want at least %d less", lean, full, saved)
			}
			tr, err := NewTrainer(openCPU(t), m, oocOptions())
			if err != nil {
				t.Fatal(err)
			}
			gotL, gotW := trainSteps(t, tr, steps)
			tr.Close()
			sameRun(t, "resident, full activations", wantL, gotL, wantW, gotW)

			m, err = NewGPT(oocShape, dt)
			if err != nil {
				t.Fatal(err)
			}
			m.SetLeanActivations(true)
			o := streamed()
			o.Activations = make([]offload.ActPolicy, len(m.Layers))
			for i := range o.Activations {
				o.Activations[i] = []offload.ActPolicy{offload.Keep, offload.Recompute, offload.OffloadTo,
					offload.RecomputeSelective, offload.RecomputeSelectiveHost}[i%5]
			}
			tr2, check := newOOCModel(t, m, oocOptions(), o)
			gotL, gotW = trainSteps(t, tr2, steps)
			check()
			sameRun(t, "resident, full activations", wantL, gotL, wantW, gotW)
		})
	}
}
