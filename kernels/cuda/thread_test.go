//go:build cuda

package cuda

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"
)

// TestPoolBounded: a burst of jobs that each hold their thread a while
// grows the pool to its bound and no further; every job still runs.
func TestPoolBounded(t *testing.T) {
	b := openCUDA(t, 0)
	p := newPool(b.ctx)
	defer p.close()
	var wg sync.WaitGroup
	n := 4 * maxPoolWorkers
	wg.Add(n)
	for range n {
		if !p.run(func() { time.Sleep(2 * time.Millisecond); wg.Done() }) {
			t.Fatal("run refused before close")
		}
	}
	wg.Wait()
	p.mu.Lock()
	w := p.mu.workers
	p.mu.Unlock()
	if w > maxPoolWorkers || w == 0 {
		t.Fatalf("%d workers, bound %d", w, maxPoolWorkers)
	}
	p.close()
	if p.run(func() {}) {
		t.Fatal("run after close")
	}
}

// TestEventCleanupBurst: tens of thousands of events dropped at once are
// destroyed in batches: the backend's pool stays within its bound.
func TestEventCleanupBurst(t *testing.T) {
	b := openCUDA(t, 0)
	q := b.DefaultQueue()
	for range 20000 {
		if _, err := b.RecordEvent(q); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.Synchronize(context.Background()); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		runtime.GC()
		time.Sleep(50 * time.Millisecond)
	}
	b.pool.mu.Lock()
	w := b.pool.mu.workers
	b.pool.mu.Unlock()
	if w > maxPoolWorkers {
		t.Fatalf("%d pool workers after the burst, bound %d", w, maxPoolWorkers)
	}
	b.dead.Lock()
	left, draining := len(b.dead.evs), b.dead.draining
	b.dead.Unlock()
	t.Logf("%d pool workers; %d events left to destroy (draining %v)", w, left, draining)
}
