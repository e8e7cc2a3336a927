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
// existing one is busy; they end at close.
type pool struct {
	ctx  cu.CUContext
	jobs chan func() // unbuffered: a send succeeds only when a worker is idle
	wg   sync.WaitGroup
	mu   struct {
		sync.Mutex
		closed bool
	}
}

func newPool(ctx cu.CUContext) *pool { return &pool{ctx: ctx, jobs: make(chan func())} }

// run starts f on a context goroutine and returns without waiting. It
// reports false, running nothing, after close.
func (p *pool) run(f func()) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mu.closed {
		return false
	}
	select {
	case p.jobs <- f:
	default:
		p.wg.Add(1)
		go p.worker(f)
	}
	return true
}

func (p *pool) worker(first func()) {
	defer p.wg.Done()
	// A failure here shows up as an InvalidContext error from the jobs' own calls.
	_ = lockToContext(p.ctx)
	first()
	for f := range p.jobs {
		f()
	}
	// The goroutine exits still locked, so its thread ends with it.
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
		close(p.jobs)
	}
	p.mu.Unlock()
	p.wg.Wait()
}
