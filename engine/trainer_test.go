package engine

import (
	"context"
	"math"
	"strings"
	"testing"

	"github.com/spill-ml/spill/kernels"
)

// rowsFeed hands out consecutive rows of a fixed set, wrapping around.
type rowsFeed struct {
	in, tg   []int32
	T, pos   int
	perBatch int
}

func (f *rowsFeed) Next(ctx context.Context, hb *HostBatch) error {
	n := f.perBatch * f.T
	putI32(hb.Input, f.in[f.pos:f.pos+n])
	putI32(hb.Targets, f.tg[f.pos:f.pos+n])
	f.pos = (f.pos + n) % len(f.in)
	return nil
}

func tinyGPT(t *testing.T, dt kernels.DType) *Model {
	t.Helper()
	m, err := NewGPT(GPTShape{Layers: 2, Heads: 2, Embd: 16, Vocab: 13, MaxSeq: 8}, dt)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func newTestTrainer(t *testing.T, be kernels.Backend, m *Model, B, accum int, scale float64) *Trainer {
	t.Helper()
	tr, err := NewTrainer(be, m, TrainerOptions{
		B: B, T: 6, Accum: accum, Schedule: LRSchedule{Peak: 1e-2, Min: 1e-3, Warmup: 2, Steps: 10},
		WeightDecay: 0.1, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, GradClip: 1, LossScale: scale, ScaleWindow: 1000,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tr.Close)
	if err := tr.InitWeights(context.Background(), 42); err != nil {
		t.Fatal(err)
	}
	return tr
}

func randomRows(n int) (in, tg []int32) {
	r := &rng{s: 8}
	in, tg = make([]int32, n), make([]int32, n)
	for i := range in {
		in[i], tg[i] = int32(r.next()%13), int32(r.next()%13)
	}
	return in, tg
}

// TestAccumulationMatchesLargerBatch: accum=2 with batch 2 gives the same
// gradients and update as accum=1 with batch 4 (fp32 rounding aside).
func TestAccumulationMatchesLargerBatch(t *testing.T) {
	ctx := context.Background()
	be := openCPU(t)
	in, tg := randomRows(4 * 6)
	a := newTestTrainer(t, be, tinyGPT(t, kernels.F32), 2, 2, 1)
	b := newTestTrainer(t, be, tinyGPT(t, kernels.F32), 4, 1, 1)
	la, ga, err := a.Gradients(ctx, &rowsFeed{in: in, tg: tg, T: 6, perBatch: 2})
	if err != nil {
		t.Fatal(err)
	}
	lb, gb, err := b.Gradients(ctx, &rowsFeed{in: in, tg: tg, T: 6, perBatch: 4})
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(la-lb) > 1e-6*lb {
		t.Errorf("loss %v (accum 2) vs %v (batch 4)", la, lb)
	}
	for l := range ga {
		for i := range ga[l] {
			if d := math.Abs(float64(ga[l][i] - gb[l][i])); d > 1e-7+1e-4*math.Abs(float64(gb[l][i])) {
				t.Fatalf("layer %d grad %d: %v (accum 2) vs %v (batch 4)", l, i, ga[l][i], gb[l][i])
			}
		}
	}
	for s := 0; s < 2; s++ {
		if _, err := a.TrainStep(ctx, &rowsFeed{in: in, tg: tg, T: 6, perBatch: 2}); err != nil {
			t.Fatal(err)
		}
		if _, err := b.TrainStep(ctx, &rowsFeed{in: in, tg: tg, T: 6, perBatch: 4}); err != nil {
			t.Fatal(err)
		}
	}
	wa, _ := a.MasterWeights(ctx)
	wb, _ := b.MasterWeights(ctx)
	for l := range wa {
		for i := range wa[l] {
			if d := math.Abs(float64(wa[l][i] - wb[l][i])); d > 1e-5 {
				t.Fatalf("layer %d weight %d after 2 steps: %v vs %v", l, i, wa[l][i], wb[l][i])
			}
		}
	}
}

// TestFP16OverflowSkipped poisons one gradient with +Inf at step 2: that
// step is skipped (weights and moments unchanged), the scale halves, and
// training continues.
func TestFP16OverflowSkipped(t *testing.T) {
	ctx := context.Background()
	be := openCPU(t)
	tr := newTestTrainer(t, be, tinyGPT(t, kernels.F16), 2, 1, 1024)
	tr.gradHook = func(step int) {
		if step == 2 {
			g := tr.st.Layers[1].Grads
			be.Fill(tr.q, g.Slice(5, 1), float32(math.Inf(1)))
		}
	}
	in, tg := randomRows(2 * 6)
	feed := &rowsFeed{in: in, tg: tg, T: 6, perBatch: 2}
	var before [][]float32
	skipped := 0
	for s := 0; s < 4; s++ {
		if s == 2 {
			before, _ = tr.MasterWeights(ctx)
		}
		r, err := tr.TrainStep(ctx, feed)
		if err != nil {
			t.Fatal(err)
		}
		if r.Skipped {
			skipped++
		}
		if s == 2 {
			if !r.Skipped || !math.IsInf(r.GradNorm, 1) {
				t.Fatalf("step 3: skipped %v, grad norm %v; want skipped with Inf norm", r.Skipped, r.GradNorm)
			}
			after, _ := tr.MasterWeights(ctx)
			for l := range before {
				for i := range before[l] {
					if math.Float32bits(before[l][i]) != math.Float32bits(after[l][i]) {
						t.Fatalf("layer %d weight %d changed in a skipped step", l, i)
					}
				}
			}
			if tr.Scaler.Scale != 512 {
				t.Errorf("scale after overflow %v, want 512", tr.Scaler.Scale)
			}
		} else if r.Skipped {
			t.Errorf("step %d skipped", s+1)
		}
	}
	if skipped != 1 || tr.Step != 4 {
		t.Errorf("skipped %d steps of %d, want 1 of 4", skipped, tr.Step)
	}
	after, _ := tr.MasterWeights(ctx)
	if math.Float32bits(after[1][0]) == math.Float32bits(before[1][0]) {
		t.Errorf("training did not continue after the skipped step")
	}
}

func TestLossScalerGrows(t *testing.T) {
	s := NewLossScaler(kernels.F16, 8, 2)
	s.Update(false)
	if s.Scale != 8 {
		t.Fatalf("scale %v after 1 good step", s.Scale)
	}
	s.Update(false)
	if s.Scale != 16 || s.Good != 0 {
		t.Fatalf("scale %v good %d after 2 good steps, want 16, 0", s.Scale, s.Good)
	}
	if !s.Update(true) || s.Scale != 8 {
		t.Fatalf("overflow: scale %v", s.Scale)
	}
	bf := NewLossScaler(kernels.BF16, 65536, 2)
	if bf.Scale != 1 || !bf.Update(true) || bf.Scale != 1 {
		t.Fatalf("bf16 scaler changed: %+v", bf)
	}
}

func TestLRSchedule(t *testing.T) {
	l := LRSchedule{Peak: 1, Min: 0.1, Warmup: 10, Steps: 110}
	if got := l.At(0); got != 0.1 {
		t.Errorf("At(0) = %v, want 0.1", got)
	}
	if got := l.At(9); got != 1 {
		t.Errorf("At(9) = %v, want 1", got)
	}
	if got := l.At(60); math.Abs(got-0.55) > 1e-12 {
		t.Errorf("At(60) = %v, want 0.55 (half way down the cosine)", got)
	}
	prev := math.Inf(1)
	for s := 10; s < 110; s++ {
		if v := l.At(s); v > prev || v < 0.1 {
			t.Fatalf("At(%d) = %v after %v", s, v, prev)
		} else {
			prev = v
		}
	}
}

func TestGPTLayout(t *testing.T) {
	m, err := NewGPT(GPTShape{Layers: 12, Heads: 12, Embd: 768, Vocab: 50304, MaxSeq: 1024}, kernels.BF16)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := m.NumParams(), int64(124475904); got != want { // llm.c's count for padded GPT-2 124M
		t.Errorf("gpt2-124m has %d parameters, want %d", got, want)
	}
	if got := GPTParams(12, 768, 50304, 1024); got != m.NumParams() {
		t.Errorf("GPTParams %d, model %d", got, m.NumParams())
	}
	if len(m.Layers) != 14 || m.Layers[13].Tied()[0] != 0 {
		t.Fatalf("want embedding + 12 blocks + head tied to layer 0")
	}
	for _, l := range m.Layers {
		end := 0
		for _, p := range l.Params() {
			if p.Offset != end {
				t.Errorf("%s: offset %d, want %d (contiguous)", p.Name, p.Offset, end)
			}
			end += p.Elems()
			norm := strings.Contains(p.Name, "ln_") || strings.HasSuffix(p.Name, ".bias")
			if p.Decay == norm {
				t.Errorf("%s: decay %v", p.Name, p.Decay)
			}
		}
		if end != l.NumParams() {
			t.Errorf("%s: params end at %d of %d", l.Name(), end, l.NumParams())
		}
	}
}

// TestInitDeterministic: the same seed gives the same weights, GPT-2 init
// statistics hold (std 0.02, residual projections scaled by 1/sqrt(2L)).
func TestInitDeterministic(t *testing.T) {
	m := tinyGPT(t, kernels.F32)
	blk := m.Layers[1]
	a, b := make([]float32, blk.NumParams()), make([]float32, blk.NumParams())
	InitParams(a, blk.Params(), 1)
	InitParams(b, blk.Params(), 1)
	for i := range a {
		if a[i] != b[i] {
			t.Fatal("init not deterministic")
		}
	}
	for _, p := range blk.Params() {
		x := a[p.Offset : p.Offset+p.Elems()]
		var ss float64
		for _, v := range x {
			ss += float64(v) * float64(v)
		}
		std := math.Sqrt(ss / float64(len(x)))
		want := map[Init]float64{InitZeros: 0, InitOnes: 1, InitNormal: p.Std}[p.Init]
		if math.Abs(std-want) > 0.15*want+1e-9 {
			t.Errorf("%s: rms %v, want %v", p.Name, std, want)
		}
		if strings.HasSuffix(p.Name, "c_proj.weight") && math.Abs(p.Std-0.02/math.Sqrt(4)) > 1e-12 {
			t.Errorf("%s: std %v, want 0.02/sqrt(2L)", p.Name, p.Std)
		}
	}
}

// TestResidentStepHoldsStill: the resident trainer's program allocates
// its blocks once; a step allocates, frees and moves nothing, and the
// device peak is ResidentDeviceBytes, whatever the accumulation.
func TestResidentStepHoldsStill(t *testing.T) {
	ctx := context.Background()
	for _, accum := range []int{1, 3} {
		be := openCPU(t)
		m := tinyGPT(t, kernels.BF16)
		tr := newTestTrainer(t, be, m, 2, accum, 1)
		in, tg := randomRows(2 * 6 * accum)
		feed := &rowsFeed{in: in, tg: tg, T: 6, perBatch: 2}
		if _, err := tr.TrainStep(ctx, feed); err != nil {
			t.Fatal(err)
		}
		before := tr.Cache().Stats()
		for range 2 {
			r, err := tr.TrainStep(ctx, feed)
			if err != nil {
				t.Fatal(err)
			}
			if r.H2DBytes != 0 || r.D2HBytes != 0 {
				t.Errorf("accum %d: a resident step moved %d and %d bytes", accum, r.H2DBytes, r.D2HBytes)
			}
		}
		after := tr.Cache().Stats()
		if after.Allocs != before.Allocs || after.Frees != before.Frees {
			t.Errorf("accum %d: a step allocated %d and freed %d blocks", accum, after.Allocs-before.Allocs, after.Frees-before.Frees)
		}
		want := byteClasses(ResidentDeviceBytes(m, 2, 6)).total()
		if after.PeakAllocated != want || tr.PredictedDevicePeak() != want {
			t.Errorf("accum %d: device peak %d, predicted %d, ResidentDeviceBytes %d", accum, after.PeakAllocated, tr.PredictedDevicePeak(), want)
		}
		if tr.Residency() != nil || tr.HostBytes() != 0 {
			t.Errorf("accum %d: residency %v, host bytes %d", accum, tr.Residency(), tr.HostBytes())
		}
	}
}
