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
