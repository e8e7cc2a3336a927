package cpu

import (
	"fmt"
	"sync"
	"sync/atomic"
)

// pool is the worker pool shared by the ops of every queue. An op splits
// its work into tasks; the goroutine running the op works on them too, so
// an op always makes progress even while the pool's workers are busy with
// another queue's op, and never waits on work that nobody will run.
type pool struct {
	threads int
	tasks   chan func()
	wg      sync.WaitGroup
}

func newPool(threads int) *pool {
	p := &pool{threads: threads, tasks: make(chan func(), 4*threads)}
	for i := 1; i < threads; i++ {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			for f := range p.tasks {
				f()
			}
		}()
	}
	return p
}

func (p *pool) close() {
	close(p.tasks)
	p.wg.Wait()
}

// run calls fn(i) for every i in [0, ntasks), on up to p.threads
// goroutines, and returns when all calls have returned. A panic in fn is
// re-raised in the caller after every started call has finished.
func (p *pool) run(ntasks int, fn func(i int)) {
	if ntasks <= 0 {
		return
	}
	if ntasks == 1 || p.threads == 1 {
		for i := 0; i < ntasks; i++ {
			fn(i)
		}
		return
	}
	var (
		next    atomic.Int64
		wg      sync.WaitGroup
		panicV  atomic.Pointer[string]
		helpers = min(p.threads-1, ntasks-1)
	)
	work := func() {
		defer func() {
			if r := recover(); r != nil {
				s := fmt.Sprint(r)
				panicV.CompareAndSwap(nil, &s)
				next.Store(int64(ntasks)) // stop handing out tasks
			}
		}()
		for {
			i := int(next.Add(1) - 1)
			if i >= ntasks {
				return
			}
			fn(i)
		}
	}
	for h := 0; h < helpers; h++ {
		wg.Add(1)
		select {
		case p.tasks <- func() { defer wg.Done(); work() }:
		default: // pool saturated: the caller does the work itself
			wg.Done()
		}
	}
	work()
	wg.Wait()
	if s := panicV.Load(); s != nil {
		panic(*s)
	}
}

// parallel splits [0, n) into ranges of at least grain elements and calls
// fn(lo, hi) for each, in parallel.
func (p *pool) parallel(n, grain int, fn func(lo, hi int)) {
	if n <= 0 {
		return
	}
	grain = max(grain, 1)
	chunks := min((n+grain-1)/grain, 4*p.threads)
	if chunks <= 1 {
		fn(0, n)
		return
	}
	size := (n + chunks - 1) / chunks
	chunks = (n + size - 1) / size
	p.run(chunks, func(i int) {
		lo := i * size
		fn(lo, min(lo+size, n))
	})
}
