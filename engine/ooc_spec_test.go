package engine

import (
	"context"
	"testing"

	"github.com/spill-ml/spill/kernels"
	"github.com/spill-ml/spill/offload"
)

// specClip is a clipping threshold between the test GPT's gradient norms
// (oocOptions, seed 7, oocFeed): over specSteps steps some are clipped
// and some are not (checked by TestOutOfCoreSpeculativeUpdate).
const (
	specClip  = 1.6
	specSteps = 6
)

// specOutcome is what becomes of the speculation of a step of gradient
// norm n after a step that was clipped (prevClipped) or not: none after a
// clipped step, else kept when n is within specClip and dropped when not.
func specOutcome(prevClipped bool, n float64) Speculation {
	switch {
	case prevClipped:
		return Unspeculated
	case n <= specClip:
		return SpecKept
	}
	return SpecDropped
}

// specCounts counts the steps of norms whose speculation is kept and
// dropped (specOutcome).
func specCounts(norms []float64) (kept, dropped int) {
	prev := false
	for _, n := range norms {
		switch specOutcome(prev, n) {
		case SpecKept:
			kept++
		case SpecDropped:
			dropped++
		}
		prev = n > specClip
	}
	return kept, dropped
}

// trainNorms runs steps from seed 7 on oocFeed and returns the losses,
// the gradient norms and the final master weights; it checks that each
// step reports the speculation specOutcome says (none when the trainer
// does not speculate).
func trainNorms(t *testing.T, tr *Trainer, steps int) ([]float64, []float64, [][]float32) {
	t.Helper()
	ctx := context.Background()
	if err := tr.InitWeights(ctx, 7); err != nil {
		t.Fatal(err)
	}
	feed := oocFeed()
	var losses, norms []float64
	prev := false
	for s := range steps {
		r, err := tr.TrainStep(ctx, feed)
		if err != nil {
			t.Fatalf("step %d: %v", s, err)
		}
		losses, norms = append(losses, r.Loss), append(norms, r.GradNorm)
		want := Unspeculated
		if tr.off != nil && tr.off.opts.Speculate {
			want = specOutcome(prev, r.GradNorm)
		}
		prev = r.GradNorm > specClip
		if r.Speculation != want {
			t.Errorf("step %d (norm %v): speculation %d, want %d", s, r.GradNorm, r.Speculation, want)
		}
	}
	w, err := tr.MasterWeights(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return losses, norms, w
}

// sameSpeculation checks that tr's gradient norms got are want's (the
// run it is compared with), and that every layer's speculative update was
// kept or dropped in the steps specCounts says.
func sameSpeculation(t *testing.T, what string, tr *Trainer, want, got []float64) {
	t.Helper()
	for s := range want {
		if got[s] != want[s] {
			t.Errorf("step %d: norm %v, %s %v", s, got[s], what, want[s])
		}
	}
	kept, dropped := specCounts(want)
	if hs, l := tr.off.host, len(tr.model.Layers); hs.specKept != kept*l || hs.specDropped != dropped*l {
		t.Errorf("%d speculative layer updates kept and %d dropped, want %d and %d (%d and %d steps of %d layers)",
			hs.specKept, hs.specDropped, kept*l, dropped*l, kept, dropped, l)
	}
}

// TestOutOfCoreSpeculativeUpdate: with clipping, speculative host updates
// (each layer's AdamW during the backward, into a second copy, kept when
// the norm is within the clip) give the resident run's losses and
// weights bit for bit in fp32, and the non-speculative out-of-core run's
// in bf16, over steps of which some are clipped (the speculation
// dropped) and some not (kept); a step after a clipped one does not
// speculate.
func TestOutOfCoreSpeculativeUpdate(t *testing.T) {
	to := oocOptions()
	to.GradClip = specClip
	to.Schedule.Steps = specSteps
	m, err := NewGPT(oocShape, kernels.F32)
	if err != nil {
		t.Fatal(err)
	}
	res, err := NewTrainer(openCPU(t), m, to)
	if err != nil {
		t.Fatal(err)
	}
	wantL, norms, wantW := trainNorms(t, res, specSteps)
	res.Close()
	kept, dropped := specCounts(norms)
	if kept == 0 || dropped == 0 {
		t.Fatalf("gradient norms %v against clip %v: want some speculations kept and some dropped", norms, specClip)
	}
	spec := func(o OffloadOptions) OffloadOptions { o.Speculate = true; return o }
	resident := OffloadOptions{Weights: offload.TierDevice, Grads: offload.TierHost, Optimizer: offload.TierHost,
		DeviceBudget: stateBytes(m) / 3}
	for name, o := range map[string]OffloadOptions{"streamed": spec(streamed()), "resident-weights": spec(resident)} {
		t.Run(name, func(t *testing.T) {
			tr, check := newOOC(t, kernels.F32, to, o)
			gotL, gotN, gotW := trainNorms(t, tr, specSteps)
			check()
			sameRun(t, "resident", wantL, gotL, wantW, gotW)
			sameSpeculation(t, "resident", tr, norms, gotN)
			if tr.Step != specSteps {
				t.Errorf("Step %d after %d steps", tr.Step, specSteps)
			}
		})
	}
	t.Run("bf16", func(t *testing.T) {
		plainTr, _ := newOOC(t, kernels.BF16, to, streamed())
		wantL, wantN, wantW := trainNorms(t, plainTr, specSteps)
		tr, check := newOOC(t, kernels.BF16, to, spec(streamed()))
		gotL, gotN, gotW := trainNorms(t, tr, specSteps)
		check()
		sameRun(t, "without speculation", wantL, gotL, wantW, gotW)
		sameSpeculation(t, "without speculation", tr, wantN, gotN)
	})
}
