package engine

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/spill-ml/spill/kernels"
)

// TestForwardTrainer: the evaluation-only trainer's loss is bitwise the
// resident trainer's Evaluate on the same weights and batches, in fp32
// and bf16, while its device peak stays below the model's weights alone
// (the resident trainer's holds the whole training state); it refuses
// to train.
func TestForwardTrainer(t *testing.T) {
	ctx := context.Background()
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
		t.Run(dt.String(), func(t *testing.T) {
			m, err := NewGPT(oocShape, dt)
			if err != nil {
				t.Fatal(err)
			}
			run := func(tr *Trainer, be kernels.Backend) (float64, int64) {
				t.Helper()
				defer tr.Close()
				if err := tr.InitWeights(ctx, 7); err != nil {
					t.Fatal(err)
				}
				l, err := tr.Evaluate(ctx, oocFeed(), 3)
				if err != nil {
					t.Fatal(err)
				}
				return l, be.MemStats().Peak
			}
			beR := openCPU(t)
			res, err := NewTrainer(beR, m, oocOptions())
			if err != nil {
				t.Fatal(err)
			}
			want, peakR := run(res, beR)

			beF := openCPU(t)
			fwd, err := newForwardTrainer(beF, m, oocB, oocT, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := fwd.TrainStep(ctx, oocFeed()); !errors.Is(err, errForwardOnly) {
				t.Errorf("TrainStep on a forward trainer: %v", err)
			}
			got, peakF := run(fwd, beF)
			if math.Float64bits(got) != math.Float64bits(want) {
				t.Errorf("forward trainer's loss %v, the resident trainer's %v", got, want)
			}
			weights := m.NumParams() * int64(dt.Size())
			t.Logf("device peak: forward %d, resident %d (training state %d, weights %d)", peakF, peakR, stateBytes(m), weights)
			if peakF >= peakR || peakF >= weights {
				t.Errorf("forward trainer's device peak %d, want below the resident trainer's %d and the weights' %d", peakF, peakR, weights)
			}
		})
	}
}
