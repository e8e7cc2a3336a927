// Package cpu is the pure-Go kernels backend: the default build, and the
// reference every other backend is checked against.
//
// Device memory is host memory handed out under a hard budget
// (Config.MemoryLimit), so that out-of-core schedules can be exercised
// without a GPU. Queues are goroutines that run enqueued work in order, so
// copies and compute really overlap; the ops of all queues share one pool
// of Config.Threads workers.
//
// Importing the package registers it as "cpu":
//
//	import _ "github.com/spill-ml/spill/kernels/cpu"
//	be, err := kernels.Open("cpu", kernels.Config{MemoryLimit: 1 << 30})
package cpu

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/spill-ml/spill/kernels"
)

func init() {
	kernels.Register("cpu", func(cfg kernels.Config) (kernels.Backend, error) { return Open(cfg) })
}

// Backend is the CPU implementation of kernels.Backend.
type Backend struct {
	threads int
	pool    *pool
	alloc   *allocator
	defq    *queue
	delay   atomic.Pointer[copyDelay] // simulated link (SetCopyLatency)

	mu struct {
		sync.Mutex
		queues []*queue
		closed bool
	}
}

var _ kernels.Backend = (*Backend)(nil)

// Open opens a CPU backend. cfg.MemoryLimit is the simulated device budget
// (0 = unlimited); cfg.Threads bounds the worker threads of one op (0 =
// GOMAXPROCS).
func Open(cfg kernels.Config) (*Backend, error) {
	if cfg.MemoryLimit < 0 {
		return nil, fmt.Errorf("kernels/cpu: negative memory limit %d", cfg.MemoryLimit)
	}
	if cfg.Threads < 0 {
		return nil, fmt.Errorf("kernels/cpu: negative thread count %d", cfg.Threads)
	}
	if cfg.Device != 0 {
		return nil, fmt.Errorf("kernels/cpu: device %d does not exist (the cpu backend has only device 0)", cfg.Device)
	}
	threads := cfg.Threads
	if threads == 0 {
		threads = runtime.GOMAXPROCS(0)
	}
	b := &Backend{threads: threads, pool: newPool(threads), alloc: newAllocator(cfg.MemoryLimit)}
	b.defq = newQueue(b, "compute")
	b.mu.queues = append(b.mu.queues, b.defq)
	return b, nil
}

// Name returns "cpu".
func (b *Backend) Name() string { return "cpu" }

// DeviceName describes the host, e.g. "cpu (2 threads)".
func (b *Backend) DeviceName() string { return fmt.Sprintf("cpu (%d threads)", b.threads) }

// Threads is the number of worker threads one op may use.
func (b *Backend) Threads() int { return b.threads }

// Alloc implements kernels.Backend.
func (b *Backend) Alloc(n int64, tag string) (kernels.Buffer, error) {
	b.mu.Lock()
	closed := b.mu.closed
	b.mu.Unlock()
	if closed {
		return nil, errors.New("kernels/cpu: Alloc on a closed backend")
	}
	return b.alloc.alloc(n, tag)
}

// Free implements kernels.Backend. It panics on a buffer that this backend
// did not allocate or that was already freed.
func (b *Backend) Free(buf kernels.Buffer) { b.alloc.free(buf) }

// MemStats implements kernels.Backend.
func (b *Backend) MemStats() kernels.MemStats { return b.alloc.stats() }

// ResetPeak implements kernels.Backend.
func (b *Backend) ResetPeak() { b.alloc.resetPeak() }

// DefaultQueue implements kernels.Backend.
func (b *Backend) DefaultQueue() kernels.Queue { return b.defq }

// NewQueue implements kernels.Backend.
func (b *Backend) NewQueue(name string) (kernels.Queue, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.mu.closed {
		return nil, errors.New("kernels/cpu: NewQueue on a closed backend")
	}
	q := newQueue(b, name)
	b.mu.queues = append(b.mu.queues, q)
	return q, nil
}

// RecordEvent implements kernels.Backend.
func (b *Backend) RecordEvent(q kernels.Queue) (kernels.Event, error) {
	return b.queue(q).record(), nil
}

// WaitEvent implements kernels.Backend.
func (b *Backend) WaitEvent(q kernels.Queue, e kernels.Event) error {
	ev, ok := e.(*event)
	if !ok || ev.q.b != b {
		panic("kernels/cpu: WaitEvent with an event from another backend")
	}
	b.queue(q).wait(ev)
	return nil
}

// queue resolves q; nil means the default queue.
func (b *Backend) queue(q kernels.Queue) *queue {
	if q == nil {
		return b.defq
	}
	cq, ok := q.(*queue)
	if !ok || cq.b != b {
		panic(fmt.Sprintf("kernels/cpu: queue %v does not belong to this backend", q))
	}
	return cq
}

// CopyToDevice implements kernels.Backend.
func (b *Backend) CopyToDevice(q kernels.Queue, dst kernels.Tensor, src []byte) {
	d := bytesOf(dst)
	if int64(len(src)) != dst.Bytes() {
		panic(fmt.Sprintf("kernels/cpu: CopyToDevice of %d bytes into a tensor of %d", len(src), dst.Bytes()))
	}
	dur := b.copyTime(len(src))
	b.queue(q).enqueue("CopyToDevice", func() error {
		simulateLink(dur, func() { b.copyPar(d, src) })
		return nil
	})
}

// CopyToHost implements kernels.Backend.
func (b *Backend) CopyToHost(q kernels.Queue, dst []byte, src kernels.Tensor) {
	s := bytesOf(src)
	if int64(len(dst)) != src.Bytes() {
		panic(fmt.Sprintf("kernels/cpu: CopyToHost of a tensor of %d bytes into %d", src.Bytes(), len(dst)))
	}
	dur := b.copyTime(len(dst))
	b.queue(q).enqueue("CopyToHost", func() error {
		simulateLink(dur, func() { b.copyPar(dst, s) })
		return nil
	})
}

// CopyDevice implements kernels.Backend.
func (b *Backend) CopyDevice(q kernels.Queue, dst, src kernels.Tensor) {
	d, s := bytesOf(dst), bytesOf(src)
	if len(d) != len(s) {
		panic(fmt.Sprintf("kernels/cpu: CopyDevice of %d bytes into %d", len(s), len(d)))
	}
	b.queue(q).enqueue("CopyDevice", func() error { b.copyPar(d, s); return nil })
}

// copyPar copies large blocks with a couple of threads: one core rarely
// saturates memory bandwidth.
func (b *Backend) copyPar(dst, src []byte) {
	const grain = 1 << 20
	if len(src) < 2*grain {
		copy(dst, src)
		return
	}
	b.pool.parallel(len(src), grain, func(lo, hi int) { copy(dst[lo:hi], src[lo:hi]) })
}

// Close drains every queue, stops their goroutines and frees every buffer
// still allocated. It returns the first sticky error of any queue.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.mu.closed {
		b.mu.Unlock()
		return nil
	}
	b.mu.closed = true
	qs := b.mu.queues
	b.mu.Unlock()
	var errs []error
	for _, q := range qs {
		if err := q.close(); err != nil {
			errs = append(errs, fmt.Errorf("queue %s: %w", q.name, err))
		}
	}
	b.pool.close()
	b.alloc.freeAll()
	return errors.Join(errs...)
}

// bytesOf returns the bytes of t's view, checking it lies in its buffer.
func bytesOf(t kernels.Tensor) []byte {
	buf, ok := t.Buf.(*buffer)
	if !ok {
		if t.Buf == nil {
			panic("kernels/cpu: absent (zero) tensor used as an operand")
		}
		panic(fmt.Sprintf("kernels/cpu: buffer %T is not from the cpu backend", t.Buf))
	}
	n := t.Bytes()
	if t.Off < 0 || t.N < 0 || t.Off+n > buf.size {
		panic(fmt.Sprintf("kernels/cpu: view [%d, %d) outside buffer %q of %d bytes", t.Off, t.Off+n, buf.tag, buf.size))
	}
	if sz := int64(t.DType.Size()); t.Off%sz != 0 {
		panic(fmt.Sprintf("kernels/cpu: %v view at unaligned byte offset %d", t.DType, t.Off))
	}
	d := buf.bytes()
	return d[t.Off : t.Off+n : t.Off+n]
}

func f32s(t kernels.Tensor) []float32 {
	if t.DType != kernels.F32 {
		panic(fmt.Sprintf("kernels/cpu: want an f32 tensor, got %v", t.DType))
	}
	b := bytesOf(t)
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), t.N)
}

func u16s(t kernels.Tensor) []uint16 {
	if t.DType.Size() != 2 {
		panic(fmt.Sprintf("kernels/cpu: want a 16-bit tensor, got %v", t.DType))
	}
	b := bytesOf(t)
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*uint16)(unsafe.Pointer(&b[0])), t.N)
}

func i32s(t kernels.Tensor) []int32 {
	if t.DType != kernels.I32 {
		panic(fmt.Sprintf("kernels/cpu: want an i32 tensor, got %v", t.DType))
	}
	b := bytesOf(t)
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*int32)(unsafe.Pointer(&b[0])), t.N)
}
