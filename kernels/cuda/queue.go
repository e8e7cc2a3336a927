//go:build cuda

package cuda

import (
	"context"
	"fmt"
	"math"
	"sync"
	"unsafe"

	"github.com/spill-ml/spill/kernels"
	"gorgonia.org/cu"
)

// queue is a kernels.Queue: one CUDA stream driven by one goroutine locked
// to an OS thread with the context current. Jobs run on that goroutine in
// the order they were enqueued; each issues asynchronous CUDA work.
type queue struct {
	b      *Backend
	name   string
	stream cu.Stream
	jobs   chan func(*queue) error
	done   chan struct{} // closed when the goroutine has finished

	mu struct {
		sync.Mutex
		err    error // first error of any job (sticky)
		closed bool
	}

	// Owned by the queue's goroutine.
	blas     *blasHandle
	scratch  cu.DevicePtr
	scratchN int64
	attn     cu.DevicePtr // attention workspace (attention.go)
	attnN    int64
}

// startQueue starts the goroutine of a new queue and creates its stream.
func startQueue(b *Backend, name string) (*queue, error) {
	q := &queue{b: b, name: name, jobs: make(chan func(*queue) error, 4096), done: make(chan struct{})}
	started := make(chan error, 1)
	go q.run(started)
	if err := <-started; err != nil {
		return nil, fmt.Errorf("kernels/cuda: creating queue %q: %w", name, err)
	}
	return q, nil
}

func (q *queue) run(started chan<- error) {
	defer close(q.done)
	err := lockToContext(q.b.ctx)
	if err == nil {
		q.stream, err = cu.MakeStream(cu.NonBlocking)
	}
	started <- err
	if err != nil {
		return
	}
	for f := range q.jobs {
		if err := f(q); err != nil {
			q.fail(err)
		}
	}
	if err := q.stream.Synchronize(); err != nil {
		q.fail(err)
	}
	if q.blas != nil {
		q.blas.destroy()
	}
	if q.scratchN > 0 {
		_ = cu.MemFree(q.scratch)
		q.b.unreserve(q.scratchN, "scratch")
	}
	if q.attnN > 0 {
		_ = cu.MemFree(q.attn)
		q.b.unreserve(q.attnN, "attention")
	}
	_ = q.stream.Destroy()
}

// fail records err as the queue's sticky error unless one is there already.
func (q *queue) fail(err error) {
	q.mu.Lock()
	if q.mu.err == nil {
		q.mu.err = fmt.Errorf("kernels/cuda: queue %q: %w", q.name, err)
	}
	q.mu.Unlock()
}

func (q *queue) firstErr() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.mu.err
}

// enqueue hands f to the queue's goroutine.
func (q *queue) enqueue(f func(*queue) error) {
	q.mu.Lock()
	closed := q.mu.closed
	q.mu.Unlock()
	if closed {
		panic(fmt.Sprintf("kernels/cuda: queue %q used after Close", q.name))
	}
	q.jobs <- f
}

// stop ends the goroutine after the queued jobs and returns the sticky error.
func (q *queue) stop() error {
	q.mu.Lock()
	if !q.mu.closed {
		q.mu.closed = true
		close(q.jobs)
	}
	q.mu.Unlock()
	<-q.done
	return q.firstErr()
}

// Name is the queue's name.
func (q *queue) Name() string { return q.name }

// Synchronize waits until all work enqueued so far has finished.
func (q *queue) Synchronize(ctx context.Context) error {
	done := make(chan error, 1)
	q.enqueue(func(q *queue) error {
		ev, err := cu.MakeEvent(eventFlags)
		if err == nil {
			if err = ev.Record(q.stream); err != nil {
				_ = cu.DestroyEvent(&ev)
			}
		}
		if err != nil {
			done <- err
			return err
		}
		q.b.pool.run(func() {
			err := ev.Synchronize()
			_ = cu.DestroyEvent(&ev)
			if err != nil {
				q.fail(err)
			}
			done <- err
		})
		return nil
	})
	select {
	case <-done:
		return q.firstErr()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ensureScratch returns at least n bytes of the queue's scratch area,
// growing it (charged to the budget as "scratch") when needed. Called on
// the queue's goroutine only.
func (q *queue) ensureScratch(n int64) (cu.DevicePtr, error) {
	if n <= q.scratchN {
		return q.scratch, nil
	}
	n = max(n, 2*q.scratchN, 1<<20)
	if err := q.b.reserve(n, "scratch"); err != nil {
		return 0, err
	}
	p, err := cu.MemAlloc(n)
	if err != nil {
		q.b.unreserve(n, "scratch")
		return 0, fmt.Errorf("scratch of %s: %w", kernels.FormatBytes(n), err)
	}
	if q.scratchN > 0 {
		// Work already queued may still use the old area.
		if err := q.stream.Synchronize(); err != nil {
			return 0, err
		}
		_ = cu.MemFree(q.scratch)
		q.b.unreserve(q.scratchN, "scratch")
	}
	q.scratch, q.scratchN = p, n
	return p, nil
}

// blasHandle returns the queue's cuBLAS handle, creating it on first use.
func (q *queue) blasHandle() (*blasHandle, error) {
	if q.blas == nil {
		h, err := newBlasHandle(q.stream)
		if err != nil {
			return nil, err
		}
		q.blas = h
	}
	return q.blas, nil
}

// dim3 is a launch dimension.
type dim3 struct{ x, y, z int }

// launch starts kernel name with grid and block sizes and the arguments,
// each already encoded as 8 bytes (see the arg helpers).
func (q *queue) launch(fn cu.Function, grid, block dim3, args ...uint64) error {
	return launchOn(q.stream, fn, grid, block, args...)
}

// launchOn is launch on stream s (from any context goroutine).
func launchOn(s cu.Stream, fn cu.Function, grid, block dim3, args ...uint64) error {
	if grid.x == 0 {
		return nil
	}
	ptrs := make([]unsafe.Pointer, len(args))
	for i := range args {
		ptrs[i] = unsafe.Pointer(&args[i])
	}
	return fn.Launch(grid.x, max(grid.y, 1), max(grid.z, 1), block.x, max(block.y, 1), max(block.z, 1), 0, s, ptrs)
}

// Kernel arguments, each in 8 bytes: the driver reads the parameter's own
// size (4 bytes for int and float) from the start of the slot.
func aPtr(p cu.DevicePtr) uint64 { return uint64(p) }
func aI32(v int) uint64          { return uint64(uint32(int32(v))) }
func aI64(v int64) uint64        { return uint64(v) }
func aF32(v float32) uint64      { return uint64(math.Float32bits(v)) }
func aDT(d kernels.DType) uint64 { return uint64(d) }
