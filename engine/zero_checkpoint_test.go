package engine

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/spill-ml/spill/kernels"
)

// onRanks builds, on ranks fake ranks (ranks 0: no communicator), the
// out-of-core trainer of the tiny fp32 GPT with ZeroStage zero and runs
// fn on each, concurrently.
func onRanks(t *testing.T, ranks, zero int, fn func(ctx context.Context, r int, tr *Trainer) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := ddpCase{ranks: max(ranks, 1), accum: 1, steps: 4, clip: 0, offload: zeroOffload(false), zero: zero}
	bes := make([]kernels.Backend, c.ranks)
	for r := range bes {
		bes[r] = openCPU(t)
	}
	var id []byte
	if ranks > 0 {
		var err error
		if id, err = bes[0].(kernels.CommOpener).NewCommID(); err != nil {
			t.Fatal(err)
		}
	}
	errs := make([]error, c.ranks)
	var wg sync.WaitGroup
	for r := range c.ranks {
		wg.Go(func() {
			errs[r] = func() error {
				to := c.options()
				if ranks > 0 {
					comm, err := bes[r].(kernels.CommOpener).OpenComm(ctx, id, r, ranks)
					if err != nil {
						return err
					}
					defer comm.Close()
					to.Comm = comm
				}
				tr, err := c.newTrainer(bes[r], tinyGPT(t, kernels.F32), to)
				if err != nil {
					return err
				}
				defer tr.Close()
				return fn(ctx, r, tr)
			}()
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

// TestZeroCheckpointReshard saves a sharded run of 2 ranks (every rank
// gathers, rank 0 writes) and resumes it on 3 sharded ranks and on one
// unsharded trainer: the restored master weights and moments equal the
// saved ones bit for bit, and the 3 sharded ranks then train a step to
// the same weights, bit for bit, as 3 unsharded ranks resumed from the
// same checkpoint.
func TestZeroCheckpointReshard(t *testing.T) {
	dir := t.TempDir()
	in, tg := randomRows(16 * ddpB * ddpT)
	feed := func(ranks, r int, steps ...int) *mbFeed {
		f := &mbFeed{in: in, tg: tg, n: ddpB * ddpT}
		for _, s := range steps {
			f.idx = append(f.idx, (s*ranks+r)%16)
		}
		return f
	}
	var saved []NamedTensor // rank 0's gathered tensors
	var path string
	onRanks(t, 2, 2, func(ctx context.Context, r int, tr *Trainer) error {
		if err := tr.InitWeights(ctx, 42); err != nil {
			return err
		}
		f := feed(2, r, 0, 1)
		for range 2 {
			if _, err := tr.TrainStep(ctx, f); err != nil {
				return err
			}
		}
		w, o, err := tr.CheckpointTensors(ctx)
		if err != nil || r != 0 {
			return err
		}
		saved = append(append([]NamedTensor(nil), w...), o...)
		path, err = SaveCheckpoint(dir, &Checkpoint{State: TrainState{Step: tr.Step, LossScale: 1}, Weights: w, Optim: o}, 2)
		return err
	})
	check := func(what string, w, o []NamedTensor) {
		got := append(append([]NamedTensor(nil), w...), o...)
		if len(got) != len(saved) {
			t.Fatalf("%s: %d tensors, saved %d", what, len(got), len(saved))
		}
		for k := range saved {
			if got[k].Name != saved[k].Name || string(got[k].Data) != string(saved[k].Data) {
				t.Fatalf("%s: tensor %s differs from the saved one", what, saved[k].Name)
			}
		}
	}
	resume := func(ctx context.Context, r int, tr *Trainer) error {
		st, err := tr.RestoreCheckpoint(ctx, path)
		if err != nil {
			return err
		}
		tr.Step = st.Step
		w, o, err := tr.SaveTensors(ctx) // gathered: a collective
		if err == nil && r == 0 {
			check(fmt.Sprintf("resumed (zero %v)", tr.ShardsOptimizer()), w, o)
		}
		return err
	}
	onRanks(t, 0, 0, resume) // one trainer, unsharded
	after := map[int][][]float32{}
	var mu sync.Mutex
	for _, zero := range []int{0, 2} {
		onRanks(t, 3, zero, func(ctx context.Context, r int, tr *Trainer) error {
			if err := resume(ctx, r, tr); err != nil {
				return err
			}
			if _, err := tr.TrainStep(ctx, feed(3, r, 2)); err != nil {
				return err
			}
			w, err := tr.MasterWeights(ctx)
			if r == 0 {
				mu.Lock()
				after[zero] = w
				mu.Unlock()
			}
			return err
		})
	}
	zeroSameWeights(t, "3 sharded ranks vs 3 unsharded, a step after resuming", after[2], after[0])
}
