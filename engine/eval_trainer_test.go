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
// when they are streamed (and below the resident trainer's, which holds
// the whole training state, when they are kept); it refuses to train.
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

			weights := m.NumParams() * int64(dt.Size())
			for _, c := range []struct {
				name   string
				budget int64
				limit  int64 // the device peak must stay below it
			}{
				{"weights-resident", 0, peakR},
				{"weights-streamed", weights / 2, weights / 2},
			} {
				beF, err := kernels.Open("cpu", kernels.Config{Threads: 2, MemoryLimit: c.budget})
				if err != nil {
					t.Fatal(err)
				}
				defer beF.Close()
				fwd, err := newForwardTrainer(beF, m, oocB, oocT, c.budget)
				if err != nil {
					t.Fatalf("%s: %v", c.name, err)
				}
				if _, err := fwd.TrainStep(ctx, oocFeed()); !errors.Is(err, errForwardOnly) {
					t.Errorf("%s: TrainStep on a forward trainer: %v", c.name, err)
				}
				got, peakF := run(fwd, beF)
				if math.Float64bits(got) != math.Float64bits(want) {
					t.Errorf("%s: forward trainer's loss %v, the resident trainer's %v", c.name, got, want)
				}
				t.Logf("%s: device peak %d, resident trainer's %d (training state %d, weights %d)", c.name, peakF, peakR, stateBytes(m), weights)
				if peakF >= c.limit || peakF >= stateBytes(m) {
					t.Errorf("%s: device peak %d, want below %d and the training state's %d", c.name, peakF, c.limit, stateBytes(m))
				}
			}
		})
	}
}
