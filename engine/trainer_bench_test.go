package engine

import (
	"context"
	"testing"

	"github.com/spill-ml/spill/kernels"
	"github.com/spill-ml/spill/kernels/cpu"
)

// BenchmarkTrainStepResident is one optimizer step of a tiny GPT, all
// of its state on the CPU backend's device (NewTrainer): 4 layers, 4
// micro-batches of 2 x 16 tokens, gradient clipping. The compute is
// small, so ns/op and allocs/op are mostly the host's work per step: what
// the trainer does around the kernels (enqueueing, bookkeeping, the one
// wait for the losses and gradient statistics).
func BenchmarkTrainStepResident(b *testing.B) {
	m, err := NewGPT(GPTShape{Layers: 4, Heads: 2, Embd: 32, Vocab: 64, MaxSeq: 16}, kernels.F32)
	if err != nil {
		b.Fatal(err)
	}
	be, err := cpu.Open(kernels.Config{Threads: 2})
	if err != nil {
		b.Fatal(err)
	}
	defer be.Close()
	to := oocOptions()
	to.B, to.T, to.Accum = 2, 16, 4
	tr, err := NewTrainer(be, m, to)
	if err != nil {
		b.Fatal(err)
	}
	defer tr.Close()
	ctx := context.Background()
	if err := tr.InitWeights(ctx, 1); err != nil {
		b.Fatal(err)
	}
	feed := randomFeed(3, 4*to.B*to.Accum, to.T, to.B)
	for range 2 { // warm-up
		if _, err := tr.TrainStep(ctx, feed); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(to.B * to.T * to.Accum * 4))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := tr.TrainStep(ctx, feed); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if _, err := tr.MasterWeights(ctx); err != nil { // the last update
		b.Fatal(err)
	}
}
