package engine

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/spill-ml/spill/kernels"
)

// newOffloadAtPeak builds an out-of-core trainer of m with options to and
// o on a CPU backend whose memory limit, and o's device budget, is exactly
// the device peak OffloadDeviceBytes predicts for them. The trainer and
// the backend are closed when t ends.
func newOffloadAtPeak(t *testing.T, m *Model, to TrainerOptions, o OffloadOptions) (*Trainer, kernels.Backend) {
	t.Helper()
	by, err := OffloadDeviceBytes(m, to.B, to.T, to.Accum, o)
	if err != nil {
		t.Fatal(err)
	}
	o.DeviceBudget = byteClasses(by).total()
	be, err := kernels.Open("cpu", kernels.Config{Threads: 2, MemoryLimit: o.DeviceBudget})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	tr, err := NewOffloadTrainer(be, m, to, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tr.Close)
	return tr, be
}

// gradCheckTrainer builds a resident fp32 trainer of m (B 2, T 6, no loss
// scaling) on a CPU backend, and a feed of one fixed batch of random
// tokens below 13, the vocabulary of the models the gradient checks
// build. The trainer and the backend are closed when t ends.
func gradCheckTrainer(t *testing.T, m *Model) (*Trainer, *fixedFeed) {
	t.Helper()
	be := openCPU(t)
	const B, T = 2, 6
	tr, err := NewTrainer(be, m, TrainerOptions{B: B, T: T, Accum: 1, LossScale: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tr.Close)
	r := &rng{s: 3}
	in, tg := make([]int32, B*T), make([]int32, B*T)
	for i := range in {
		in[i], tg[i] = int32(r.next()%13), int32(r.next()%13)
	}
	feed := &fixedFeed{hb: HostBatch{Input: make([]byte, 4*B*T), Targets: make([]byte, 4*B*T)}}
	putI32(feed.hb.Input, in)
	putI32(feed.hb.Targets, tg)
	return tr, feed
}

// trainFrom initialises tr's weights from seed, runs steps steps on feed
// and returns the losses and the final master weights.
func trainFrom(t *testing.T, tr *Trainer, seed uint64, feed BatchSource, steps int) ([]float64, [][]float32) {
	t.Helper()
	ctx := context.Background()
	if err := tr.InitWeights(ctx, seed); err != nil {
		t.Fatal(err)
	}
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

// eachRank opens a CPU backend for each of ranks fake ranks (closed when t
// ends) and one communicator id for them all, runs body for every rank on
// its own goroutine, with a context that times out after a minute, and
// waits for them.
func eachRank(t *testing.T, ranks int, body func(ctx context.Context, r int, be kernels.Backend, id []byte)) {
	t.Helper()
	bes := make([]kernels.Backend, ranks)
	for r := range bes {
		bes[r] = openCPU(t)
	}
	id, err := bes[0].(kernels.CommOpener).NewCommID()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for r := range ranks {
		wg.Go(func() { body(ctx, r, bes[r], id) })
	}
	wg.Wait()
}

// rankPlanConfig is the configuration of the data-parallel planning tests:
// the out-of-core test GPT (m) with half its state's bytes of device
// memory, 8 GiB of host memory, a 64 MiB disk tier and (for the test) as
// much memory available as wanted.
func rankPlanConfig(t *testing.T, m *Model) Config {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Model, cfg.Layers, cfg.Heads, cfg.Embd, cfg.Vocab, cfg.MaxSeq = "custom", oocShape.Layers, oocShape.Heads, oocShape.Embd, oocShape.Vocab, oocShape.MaxSeq
	cfg.Accum = oocAccum
	cfg.DeviceMemory, cfg.HostMemory = stateBytes(m)/2, 8<<30
	cfg.DiskDir, cfg.DiskMemory = t.TempDir(), 64<<20
	withMemAvailable(t, 1<<50)
	return cfg
}
