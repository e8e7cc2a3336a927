package engine

import (
	"context"
	"runtime"
	"testing"

	"github.com/spill-ml/spill/kernels"
)

// TestTrainStepHostAllocs: once warm, a bf16 training step of a GPT with
// a 50257-token vocabulary on the CPU backend allocates far less Go memory
// than its logits. The CPU backend used to allocate a fresh logits-sized
// float32 scratch every few steps while its pool kept the old ones, so the
// heap and RSS grew step after step (issue 9: 1.45 GB to 3.07 GB of RSS in
// 10 steps).
func TestTrainStepHostAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("counts Go allocations, which the race detector adds to")
	}
	if testing.Short() {
		t.Skip("short")
	}
	ctx := context.Background()
	be := openCPU(t)
	m, err := NewGPT(GPTShape{Layers: 1, Heads: 2, Embd: 16, Vocab: 50257, MaxSeq: 32}, kernels.BF16)
	if err != nil {
		t.Fatal(err)
	}
	const B, T = 4, 32
	tr, err := NewTrainer(be, m, TrainerOptions{
		B: B, T: T, Accum: 1, Schedule: LRSchedule{Peak: 1e-3, Min: 1e-4, Warmup: 2, Steps: 100},
		WeightDecay: 0.1, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, GradClip: 1, LossScale: 1, ScaleWindow: 1000,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tr.Close)
	if err := tr.InitWeights(ctx, 1); err != nil {
		t.Fatal(err)
	}
	in, tg := randomRows(B * T)
	step := func() {
		if _, err := tr.TrainStep(ctx, &rowsFeed{in: in, tg: tg, T: T, perBatch: B}); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		step()
	}
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	const steps = 8
	for range steps {
		step()
	}
	runtime.ReadMemStats(&m1)
	logits := uint64(4 * B * T * 50257)
	if got := (m1.TotalAlloc - m0.TotalAlloc) / steps; got > logits/8 {
		t.Errorf("a warm step allocates %d bytes of Go memory; the float32 logits are %d", got, logits)
	} else {
		t.Logf("a warm step allocates %d bytes of Go memory (float32 logits: %d)", got, logits)
	}
}
