package engine

import (
	"context"
	"encoding/binary"
	"math"
	"testing"

	"github.com/spill-ml/spill/kernels"
)

// fixedFeed delivers the same micro-batch every time.
type fixedFeed struct{ hb HostBatch }

func (f *fixedFeed) Next(ctx context.Context, hb *HostBatch) error {
	copy(hb.Input, f.hb.Input)
	copy(hb.Targets, f.hb.Targets)
	return nil
}

func openCPU(t testing.TB) kernels.Backend {
	t.Helper()
	be, err := kernels.Open("cpu", kernels.Config{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	return be
}

func putI32(b []byte, v []int32) {
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(x))
	}
}

func putF32(b []byte, v []float32) {
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
}

// randomWeights sets every parameter of the trainer's model to values of
// order one (larger than GPT-2 init, so that every gradient is well above
// the finite-difference noise) and returns them.
func randomWeights(t *testing.T, tr *Trainer, seed uint64) [][]float32 {
	ctx := context.Background()
	var all [][]float32
	for i, l := range tr.model.Layers {
		v := make([]float32, l.NumParams())
		for _, ps := range l.Params() {
			x := v[ps.Offset : ps.Offset+ps.Elems()]
			newTensorRNG(seed, ps.Name).fillNormal(x, 0.3)
			if ps.Init == InitOnes {
				for j := range x {
					x[j] += 1
				}
			}
		}
		if err := tr.setLayerMaster(ctx, i, f32Bytes(v)); err != nil {
			t.Fatal(err)
		}
		all = append(all, v)
	}
	return all
}

// gradCheck compares the trainer's analytic gradients on feed with central
// finite differences at a few elements of every parameter tensor: the
// element of largest gradient and two pseudo-random ones.
func gradCheck(t *testing.T, tr *Trainer, feed *fixedFeed) { gradCheckStep(t, tr, feed, 1e-2) }

// gradCheckStep is gradCheck with finite differences of step h.
func gradCheckStep(t *testing.T, tr *Trainer, feed *fixedFeed, h float64) {
	ctx := context.Background()
	w := randomWeights(t, tr, 7)
	_, grads, err := tr.Gradients(ctx, feed)
	if err != nil {
		t.Fatal(err)
	}
	r := &rng{s: 99}
	checked := 0
	for li, l := range tr.model.Layers {
		for _, ps := range l.Params() {
			g := grads[li][ps.Offset : ps.Offset+ps.Elems()]
			best := 0
			for j := range g {
				if math.Abs(float64(g[j])) > math.Abs(float64(g[best])) {
					best = j
				}
			}
			for _, j := range []int{best, int(r.next() % uint64(len(g))), int(r.next() % uint64(len(g)))} {
				k := ps.Offset + j
				orig := w[li][k]
				plus, minus := float32(float64(orig)+h), float32(float64(orig)-h)
				loss := func(v float32) float64 {
					w[li][k] = v
					if err := tr.setLayerMaster(ctx, li, f32Bytes(w[li])); err != nil {
						t.Fatal(err)
					}
					l, err := tr.MicroLoss(ctx, &feed.hb)
					if err != nil {
						t.Fatal(err)
					}
					return l
				}
				num := (loss(plus) - loss(minus)) / float64(plus-minus)
				loss(orig)
				ana := float64(g[j])
				if d := math.Abs(ana - num); d > 2e-4+3e-2*math.Max(math.Abs(ana), math.Abs(num)) {
					t.Errorf("%s[%d]: analytic %.6g, numeric %.6g", ps.Name, j, ana, num)
				}
				checked++
			}
		}
	}
	if checked == 0 {
		t.Fatal("nothing checked")
	}
}

func TestGPTGradientCheck(t *testing.T) {
	m, err := NewGPT(GPTShape{Layers: 2, Heads: 2, Embd: 16, Vocab: 13, MaxSeq: 8}, kernels.F32)
	if err != nil {
		t.Fatal(err)
	}
	tr, feed := gradCheckTrainer(t, m)
	gradCheck(t, tr, feed)
}

func TestMLPGradientCheck(t *testing.T) {
	for _, task := range []string{TaskClassification, TaskRegression} {
		t.Run(task, func(t *testing.T) {
			be := openCPU(t)
			out := 4
			if task == TaskRegression {
				out = 1
			}
			m, err := NewMLP(MLPShape{In: 5, Hidden: []int{7, 6}, Out: out, Task: task}, kernels.F32)
			if err != nil {
				t.Fatal(err)
			}
			const B = 4
			tr, err := NewTrainer(be, m, TrainerOptions{B: B, T: 1, Accum: 1, LossScale: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Close()
			r := &rng{s: 5}
			x := make([]float32, B*5)
			r.fillNormal(x, 1)
			feed := &fixedFeed{hb: HostBatch{Input: make([]byte, 4*B*5), Targets: make([]byte, 4*B)}}
			putF32(feed.hb.Input, x)
			if task == TaskRegression {
				y := make([]float32, B)
				r.fillNormal(y, 1)
				putF32(feed.hb.Targets, y)
			} else {
				putI32(feed.hb.Targets, []int32{0, 3, 1, 2})
			}
			gradCheck(t, tr, feed)
		})
	}
}
