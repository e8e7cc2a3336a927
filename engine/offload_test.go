package engine

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/spill-ml/spill/kernels"
	"github.com/spill-ml/spill/offload"
)

// oocShape is a GPT deep enough that its weights, gradients and optimizer
// state are many times what one layer's working set needs.
var oocShape = GPTShape{Layers: 16, Heads: 2, Embd: 32, Vocab: 64, MaxSeq: 8}

const oocB, oocT, oocAccum = 1, 8, 2

func oocOptions() TrainerOptions {
	return TrainerOptions{
		B: oocB, T: oocT, Accum: oocAccum, Schedule: LRSchedule{Peak: 1e-2, Min: 1e-3, Warmup: 1, Steps: 4},
		WeightDecay: 0.1, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, GradClip: 1, LossScale: 1, ScaleWindow: 1000,
	}
}

// stateBytes is the bytes of weights, gradients, master and Adam moments.
func stateBytes(m *Model) int64 {
	s := int64(m.DType.Size())
	per := 2*s + 12 // weights + grads in compute dtype, master + m + v in fp32
	if m.DType == kernels.F32 {
		per = 16 // the weights are the master
	}
	return per * m.NumParams()
}

func oocFeed() *rowsFeed {
	r := &rng{s: 99}
	n := 6 * oocB * oocT
	in, tg := make([]int32, n), make([]int32, n)
	for i := range in {
		in[i], tg[i] = int32(r.next()%64), int32(r.next()%64)
	}
	return &rowsFeed{in: in, tg: tg, T: oocT, perBatch: oocB}
}

// trainSteps runs steps and returns the losses and final master weights.
func trainSteps(t *testing.T, tr *Trainer, steps int) ([]float64, [][]float32) {
	t.Helper()
	ctx := context.Background()
	if err := tr.InitWeights(ctx, 7); err != nil {
		t.Fatal(err)
	}
	feed := oocFeed()
	var losses []float64
	for s := 0; s < steps; s++ {
		r, err := tr.TrainStep(ctx, feed)
		if err != nil {
			t.Fatalf("step %d: %v", s, err)
		}
		losses = append(losses, r.Loss)
	}
	w, err := tr.MasterWeights(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return losses, w
}

func recomputeBlocks(m *Model) []offload.ActPolicy {
	p := make([]offload.ActPolicy, len(m.Layers))
	for i := 1; i < len(p)-1; i++ {
		p[i] = offload.Recompute
	}
	return p
}

// runOOC trains the model out of core under a device budget of
// stateBytes/8 and checks the budget and the predicted peak.
func runOOC(t *testing.T, dt kernels.DType, o OffloadOptions, steps int) ([]float64, [][]float32) {
	t.Helper()
	m, err := NewGPT(oocShape, dt)
	if err != nil {
		t.Fatal(err)
	}
	budget := stateBytes(m) / 8
	be, err := kernels.Open("cpu", kernels.Config{Threads: 2, MemoryLimit: budget})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	o.DeviceBudget = budget
	if o.Activations == nil {
		o.Activations = recomputeBlocks(m)
	}
	tr, err := NewOffloadTrainer(be, m, oocOptions(), o)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	losses, w := trainSteps(t, tr, steps)
	ms := be.MemStats()
	if ms.Peak > budget {
		t.Errorf("device peak %d exceeds the budget %d", ms.Peak, budget)
	}
	cs := tr.Cache().Stats()
	pred := tr.PredictedDevicePeak()
	if pred < cs.PeakAllocated || float64(pred) > 1.15*float64(cs.PeakAllocated) {
		t.Errorf("predicted device peak %d, measured %d: want measured <= predicted <= 1.15 measured", pred, cs.PeakAllocated)
	}
	t.Logf("%v: state %s, budget %s, device peak %s (predicted %s), backend peak %s", dt,
		kernels.FormatBytes(stateBytes(m)), kernels.FormatBytes(budget), kernels.FormatBytes(cs.PeakAllocated),
		kernels.FormatBytes(pred), kernels.FormatBytes(ms.Peak))
	return losses, w
}

func runResident(t *testing.T, dt kernels.DType, steps int) ([]float64, [][]float32) {
	t.Helper()
	m, err := NewGPT(oocShape, dt)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := NewTrainer(openCPU(t), m, oocOptions())
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	return trainSteps(t, tr, steps)
}

func streamed() OffloadOptions {
	return OffloadOptions{Weights: offload.TierHost, Grads: offload.TierHost, Optimizer: offload.TierHost, Prefetch: 1}
}

// TestOutOfCoreBitwiseFP32: a GPT whose state is 8x the device budget
// trains, streamed layer by layer with a host optimizer and recomputed
// activations, to the same losses and weights, bit for bit, as the
// resident run with no budget.
func TestOutOfCoreBitwiseFP32(t *testing.T) {
	const steps = 3
	wantL, wantW := runResident(t, kernels.F32, steps)
	for _, tc := range []struct {
		name string
		o    OffloadOptions
	}{
		{"stream", streamed()},
		{"stream-depth2", func() OffloadOptions { o := streamed(); o.Prefetch = 2; return o }()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gotL, gotW := runOOC(t, kernels.F32, tc.o, steps)
			for s := range wantL {
				if math.Float64bits(gotL[s]) != math.Float64bits(wantL[s]) {
					t.Errorf("step %d: loss %v, resident %v", s, gotL[s], wantL[s])
				}
			}
			for l := range wantW {
				for i := range wantW[l] {
					if math.Float32bits(gotW[l][i]) != math.Float32bits(wantW[l][i]) {
						t.Fatalf("layer %d param %d: %v, resident %v", l, i, gotW[l][i], wantW[l][i])
					}
				}
			}
		})
	}
}

// TestOutOfCoreBF16: the same in bf16 matches within tolerance.
func TestOutOfCoreBF16(t *testing.T) {
	const steps = 2
	wantL, wantW := runResident(t, kernels.BF16, steps)
	gotL, gotW := runOOC(t, kernels.BF16, streamed(), steps)
	for s := range wantL {
		if math.Abs(gotL[s]-wantL[s]) > 1e-3*math.Abs(wantL[s]) {
			t.Errorf("step %d: loss %v, resident %v", s, gotL[s], wantL[s])
		}
	}
	var maxd float64
	for l := range wantW {
		for i := range wantW[l] {
			maxd = max(maxd, math.Abs(float64(gotW[l][i]-wantW[l][i])))
		}
	}
	if maxd > 1e-3 {
		t.Errorf("weights differ from the resident run by up to %v", maxd)
	}
}

// TestOutOfCoreDiskOptimizer: with the Adam moments on the disk tier the
// run matches the in-RAM one bit for bit, and a disk that refuses the
// files is a clear error.
func TestOutOfCoreDiskOptimizer(t *testing.T) {
	const steps = 2
	wantL, wantW := runOOC(t, kernels.F32, streamed(), steps)
	o := streamed()
	o.Optimizer, o.DiskDir, o.DiskBudget = offload.TierDisk, t.TempDir(), 64<<20
	gotL, gotW := runOOC(t, kernels.F32, o, steps)
	for s := range wantL {
		if math.Float64bits(gotL[s]) != math.Float64bits(wantL[s]) {
			t.Errorf("step %d: loss %v, in RAM %v", s, gotL[s], wantL[s])
		}
	}
	for l := range wantW {
		for i := range wantW[l] {
			if math.Float32bits(gotW[l][i]) != math.Float32bits(wantW[l][i]) {
				t.Fatalf("layer %d param %d: %v, in RAM %v", l, i, gotW[l][i], wantW[l][i])
			}
		}
	}

	m, err := NewGPT(oocShape, kernels.F32)
	if err != nil {
		t.Fatal(err)
	}
	o.DiskBudget = 1 << 10 // far too small
	_, err = NewOffloadTrainer(openCPU(t), m, oocOptions(), o)
	if !errors.Is(err, offload.ErrBudget) {
		t.Errorf("disk budget too small: got %v, want an offload.ErrBudget", err)
	}
}
