//go:build cuda

package cuda

import (
	"errors"
	"runtime"
	"sync"

	"gorgonia.org/cu"
)

var errClosed = errors.New("kernels/cuda: backend is closed")

// lockToContext locks the calling goroutine to its OS thread and makes ctx
// current there. Every goroutine that issues CUDA calls starts with it.
func lockToContext(ctx cu.CUContext) error {
	runtime.LockOSThread()
	return cu.SetCurrentContext(ctx)
}

// pool runs functions on goroutines that own the context (locked OS threads
// with the context current). It grows by one goroutine whenever every
// existing one is busy, up to maxPoolWorkers (each is an OS thread; a burst
// must not exhaust the process's threads); past that, run waits for a
// worker. The workers end at close.
type pool struct {
	ctx  cu.CUContext
	jobs chan func() // unbuffered: a send succeeds only when a worker is idle
	quit chan struct{}
	wg   sync.WaitGroup
	mu   struct {
		sync.Mutex
		closed  bool
		workers int
	}
}

// maxPoolWorkers bounds the pool's threads. Its jobs never wait for one
// another (they wait for the device, whose queued work needs no pool
// thread to finish), so a full pool only delays a job.
const maxPoolWorkers = 128

func newPool(ctx cu.CUContext) *pool {
	return &pool{ctx: ctx, jobs: make(chan func()), quit: make(chan struct{})}
}

// run starts f on a context goroutine and returns without waiting (but
// for an idle worker when the pool is at its bound). It reports false,
// running nothing, after close.
func (p *pool) run(f func()) bool {
	p.mu.Lock()
	if p.mu.closed {
		p.mu.Unlock()
		return false
	}
	select {
	case p.jobs <- f:
		p.mu.Unlock()
		return true
	default:
	}
	if p.mu.workers < maxPoolWorkers {
		p.mu.workers++
		p.wg.Add(1)
		go p.worker(f)
		p.mu.Unlock()
		return true
	}
	p.mu.Unlock()
	select {
	case p.jobs <- f:
		return true
	case <-p.quit:
		return false
	}
}

func (p *pool) worker(first func()) {
	defer p.wg.Done()
	// A failure here shows up as an InvalidContext error from the jobs' own calls.
	_ = lockToContext(p.ctx)
	first()
	for {
		select {
		case f := <-p.jobs:
			f()
		case <-p.quit:
			return // still locked, so its thread ends with it
		}
	}
}

// call runs f on a context goroutine and waits for its result.
func (p *pool) call(f func() error) error {
	done := make(chan error, 1)
	if !p.run(func() { done <- f() }) {
		return errClosed
	}
	return <-done
}

func (p *pool) close() {
	p.mu.Lock()
	if !p.mu.closed {
		p.mu.closed = true
		close(p.quit)
	}
	p.mu.Unlock()
	p.wg.Wait()
}
