package engine

import (
	"context"
	"math"
	"testing"

	"github.com/spill-ml/spill/kernels"
)

// TestTrainStepLossFromOneReadBack: with Accum 3 (the two staging slots
// reused within a step and across steps, nothing waited for between
// micro-batches) the loss a step reports is the mean of the micro-batch
// losses MicroLoss measures on the same batches with the same weights, and
// the second step sees the first step's update (the AdamW the first step
// enqueued without waiting for it).
func TestTrainStepLossFromOneReadBack(t *testing.T) {
	ctx := context.Background()
	be := openCPU(t)
	const B, T, accum = 2, 6, 3
	tr := newTestTrainer(t, be, tinyGPT(t, kernels.F32), B, accum, 1)
	in, tg := randomRows(B * T * accum)
	feed := &rowsFeed{in: in, tg: tg, T: T, perBatch: B}
	var prev float64
	for step := 0; step < 2; step++ {
		probe := &rowsFeed{in: in, tg: tg, T: T, perBatch: B}
		hb := HostBatch{Input: make([]byte, 4*B*T), Targets: make([]byte, 4*B*T)}
		var want float64
		var losses []float64
		for k := 0; k < accum; k++ {
			if err := probe.Next(ctx, &hb); err != nil {
				t.Fatal(err)
			}
			l, err := tr.MicroLoss(ctx, &hb)
			if err != nil {
				t.Fatal(err)
			}
			losses = append(losses, l)
			want += l / accum
		}
		if losses[0] == losses[1] || losses[1] == losses[2] {
			t.Fatalf("step %d: micro-batch losses %v are not distinct; the check would be weak", step, losses)
		}
		r, err := tr.TrainStep(ctx, feed)
		if err != nil {
			t.Fatal(err)
		}
		if math.Abs(r.Loss-want) > 1e-12*math.Abs(want) {
			t.Errorf("step %d: loss %v, mean of the micro-batch losses %v (%v)", step, r.Loss, want, losses)
		}
		if step == 1 && r.Loss == prev {
			t.Errorf("step 2 loss %v equals step 1's: the update was not seen", r.Loss)
		}
		prev = r.Loss
	}
}
