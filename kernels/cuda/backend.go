//go:build cuda

package cuda

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/spill-ml/spill/kernels"
	"github.com/spill-ml/spill/kernels/internal/memclr"
	"gorgonia.org/cu"
)

func init() {
	kernels.Register("cuda", func(cfg kernels.Config) (kernels.Backend, error) { return Open(cfg) })
}

// Backend is the CUDA implementation of kernels.Backend (and of
// kernels.DeviceInspector and kernels.PinnedAllocator).
type Backend struct {
	dev    cu.Device
	ctx    cu.CUContext
	name   string
	pool   *pool
	mods   []uintptr        // CUmodule handles (module.go)
	fns    map[string]kfunc // read-only after Open
	alloc  cu.Stream        // zeroes new allocations; used from the pool
	limit  int64
	defq   *queue
	closed atomic.Bool
	// flashErr is why the tensor-core attention forward is not used (its
	// kernels missing or its self-check at Open failed); nil when it is.
	flashErr error
	// flashBwdErr is the same for the flash backward kernels.
	flashBwdErr error
	// flashFwd2Err is the same for the two-tile forward (flash.go).
	flashFwd2Err error
	// flashFwd2x128Err is the same for the head-size-128 two-tile
	// forwards (flash.go, flashFwd2x128).
	flashFwd2x128Err error
	// flashBwdFusedErr is the same for the fused backward kernels
	// (flash.go); without them the flash backward takes the split kernels.
	flashBwdFusedErr error
	// flashBwdSMErr is the same for the split backward's variant with its
	// fixed operands in shared memory (split-smem, the default where the
	// Hopper backward does not apply; flash.go): without it the flash
	// backward takes the split kernels.
	flashBwdSMErr error
	// flashSM90Err is the same for the Hopper forward (flash_sm90.go).
	flashSM90Err error
	// flashSM90WSErr is the same for the Hopper forwards with a producer
	// warp (flash_fwd5, SPILL_FLASH_FWD=sm90ws or sm90wsk): apart, so that
	// a driver or build without tensor maps keeps the other Hopper
	// forwards.
	flashSM90WSErr error
	// flashBwdSM90Err is the same for the Hopper backward (flash_sm90.go);
	// without it the modes sm90 (the default) and sm90p take split-smem.
	flashBwdSM90Err error
	// flashBwdSM90WErr is the same for sm90w, the Hopper split backward
	// with its dK, dV kernel warp-specialised (apart, so that its failure
	// leaves sm90 and sm90p on).
	flashBwdSM90WErr error
	// flashBwdFusedSM90Err is the same for each mode of the fused Hopper
	// backward (sm90f, sm90f2, sm90f2b: flash_sm90.go), set for every one
	// at Open; a mode whose check failed takes the default.
	flashBwdFusedSM90Err map[string]error
	// reducedPrecision lets cuBLAS and cuBLASLt reduce split-K partial
	// sums in the output type (bf16, f16) instead of float32, as PyTorch
	// does by default; set at Open from SPILL_CUBLAS_REDUCED_PRECISION=1.
	reducedPrecision bool

	// dead holds the events whose cleanups ran, for destroyDead.
	dead struct {
		sync.Mutex
		evs      []cu.Event
		draining bool
	}

	mem struct {
		sync.Mutex
		allocated, peak, allocs, frees, failed int64
		byTag                                  map[string]int64
		live                                   map[*buffer]struct{}
	}
	mu struct {
		sync.Mutex
		queues []*queue
		pinned map[uintptr]pinnedMem
	}
}

var (
	_ kernels.Backend         = (*Backend)(nil)
	_ kernels.DeviceInspector = (*Backend)(nil)
	_ kernels.PinnedAllocator = (*Backend)(nil)
)

// reducedPrecisionEnv names the environment variable that, set to 1 at
// Open, allows reduced-precision split-K reductions (Backend.reducedPrecision).
const reducedPrecisionEnv = "SPILL_CUBLAS_REDUCED_PRECISION"

// reserveBytes is what a zero Config.MemoryLimit leaves free of the device's
// free memory at Open, for cuBLAS workspaces, modules and the driver.
func reserveBytes(free int64) int64 { return min(512<<20, free/10) }

// Open opens device cfg.Device (ordinal) with a budget of cfg.MemoryLimit
// bytes (0: the free memory at open less a reserve of min(512 MiB, 10%)).
// cfg.Threads is ignored.
func Open(cfg kernels.Config) (*Backend, error) {
	if cfg.MemoryLimit < 0 {
		return nil, fmt.Errorf("kernels/cuda: negative memory limit %d", cfg.MemoryLimit)
	}
	if err := driverInit(); err != nil {
		return nil, fmt.Errorf("kernels/cuda: no usable CUDA driver or device: %w", err)
	}
	n, err := cu.NumDevices()
	if err != nil {
		return nil, fmt.Errorf("kernels/cuda: counting devices: %w", err)
	}
	if n == 0 {
		return nil, errors.New("kernels/cuda: no CUDA device found")
	}
	if cfg.Device < 0 || cfg.Device >= n {
		return nil, fmt.Errorf("kernels/cuda: device %d does not exist (%d found)", cfg.Device, n)
	}
	b := &Backend{dev: cu.Device(cfg.Device), fns: map[string]kfunc{}, reducedPrecision: os.Getenv(reducedPrecisionEnv) == "1"}
	if b.ctx, err = b.dev.RetainPrimaryCtx(); err != nil {
		return nil, fmt.Errorf("kernels/cuda: device %d: primary context: %w", cfg.Device, err)
	}
	b.pool = newPool(b.ctx)
	b.mem.byTag = map[string]int64{}
	b.mem.live = map[*buffer]struct{}{}
	b.mu.pinned = map[uintptr]pinnedMem{}
	var free int64
	err = b.pool.call(func() error {
		var err error
		if b.name, err = b.dev.Name(); err != nil {
			return err
		}
		if free, _, err = cu.MemInfo(); err != nil {
			return err
		}
		if b.alloc, err = cu.MakeStream(cu.NonBlocking); err != nil {
			return err
		}
		if err = b.loadModules(); err != nil {
			return err
		}
		if b.flashErr == nil {
			b.flashErr = b.checkFlash()
		}
		if b.flashErr != nil {
			b.flashFwd2Err, b.flashFwd2x128Err = b.flashErr, b.flashErr
			if b.flashSM90Err == nil {
				b.flashSM90Err = b.flashErr
			}
		}
		b.checkFlashSM90()
		if b.flashBwdErr = b.flashErr; b.flashBwdErr == nil {
			b.flashBwdErr = b.checkFlashBwd()
		}
		if b.flashBwdErr != nil {
			b.flashBwdFusedErr = b.flashBwdErr
		}
		b.checkFlashBwdSM90()
		b.checkFlashBwdFusedSM90()
		return nil
	})
	if err != nil {
		b.release()
		return nil, fmt.Errorf("kernels/cuda: opening device %d: %w", cfg.Device, err)
	}
	b.limit = cfg.MemoryLimit
	if b.limit == 0 {
		b.limit = free - reserveBytes(free)
	}
	if b.defq, err = b.newQueue("compute"); err != nil {
		b.release()
		return nil, err
	}
	return b, nil
}

// release undoes Open after a failure or at Close.
func (b *Backend) release() {
	_ = b.pool.call(func() error {
		for _, m := range b.mods {
			_ = moduleUnload(m)
		}
		if b.alloc != (cu.Stream{}) {
			_ = b.alloc.Destroy()
		}
		return nil
	})
	b.pool.close()
	_ = b.dev.ReleasePrimaryCtx()
}

// Name returns "cuda".
func (b *Backend) Name() string { return "cuda" }

// DeviceName returns the device's name, e.g. "NVIDIA H200".
func (b *Backend) DeviceName() string { return b.name }

// buffer is device memory from Alloc.
type buffer struct {
	ptr  cu.DevicePtr
	size int64
	tag  string
	b    *Backend
}

func (p *buffer) Size() int64 { return p.size }
func (p *buffer) Tag() string { return p.tag }

// reserve charges n bytes to the budget or returns an *OOMError.
func (b *Backend) reserve(n int64, tag string) error {
	b.mem.Lock()
	defer b.mem.Unlock()
	if b.mem.allocated+n > b.limit {
		b.mem.failed++
		return &kernels.OOMError{Requested: n, Tag: tag, Allocated: b.mem.allocated, Limit: b.limit, ByTag: maps.Clone(b.mem.byTag)}
	}
	b.mem.allocated += n
	b.mem.peak = max(b.mem.peak, b.mem.allocated)
	b.mem.byTag[tag] += n
	return nil
}

func (b *Backend) unreserve(n int64, tag string) {
	b.mem.Lock()
	defer b.mem.Unlock()
	b.mem.allocated -= n
	if b.mem.byTag[tag] -= n; b.mem.byTag[tag] == 0 {
		delete(b.mem.byTag, tag)
	}
}

// Alloc returns n zeroed bytes of device memory under the budget.
func (b *Backend) Alloc(n int64, tag string) (kernels.Buffer, error) {
	if n < 0 {
		return nil, fmt.Errorf("kernels/cuda: negative allocation %d for %q", n, tag)
	}
	if b.closed.Load() {
		return nil, errClosed
	}
	if err := b.reserve(n, tag); err != nil {
		return nil, err
	}
	buf := &buffer{size: n, tag: tag, b: b}
	err := b.pool.call(func() error {
		var err error
		if buf.ptr, err = cu.MemAlloc(max(n, 1)); err != nil {
			return err
		}
		if err = cu.MemsetD8Async(buf.ptr, 0, n, b.alloc); err == nil {
			err = b.alloc.Synchronize()
		}
		if err != nil {
			_ = cu.MemFree(buf.ptr)
		}
		return err
	})
	if err != nil {
		b.unreserve(n, tag)
		b.mem.Lock()
		b.mem.failed++
		held, byTag := b.mem.allocated, maps.Clone(b.mem.byTag)
		b.mem.Unlock()
		if errors.Is(err, cu.OutOfMemory) {
			return nil, &kernels.OOMError{Requested: n, Tag: tag, Allocated: held, Limit: b.limit, ByTag: byTag}
		}
		return nil, fmt.Errorf("kernels/cuda: allocating %s for %q: %w", kernels.FormatBytes(n), tag, err)
	}
	b.mem.Lock()
	b.mem.allocs++
	b.mem.live[buf] = struct{}{}
	b.mem.Unlock()
	return buf, nil
}

// Free releases a Buffer from Alloc. Freeing twice or freeing another
// backend's buffer panics.
func (b *Backend) Free(kb kernels.Buffer) {
	buf, ok := kb.(*buffer)
	if !ok || buf.b != b {
		panic(fmt.Sprintf("kernels/cuda: Free of a buffer not from this backend (%T)", kb))
	}
	b.mem.Lock()
	if _, live := b.mem.live[buf]; !live {
		b.mem.Unlock()
		panic(fmt.Sprintf("kernels/cuda: double Free of %q buffer (%d bytes)", buf.tag, buf.size))
	}
	delete(b.mem.live, buf)
	b.mem.frees++
	b.mem.Unlock()
	ptr := buf.ptr
	_ = b.pool.call(func() error { return cu.MemFree(ptr) })
	b.unreserve(buf.size, buf.tag)
}

// MemStats returns a snapshot of the memory statistics.
func (b *Backend) MemStats() kernels.MemStats {
	b.mem.Lock()
	defer b.mem.Unlock()
	return kernels.MemStats{Limit: b.limit, Allocated: b.mem.allocated, Peak: b.mem.peak, Allocs: b.mem.allocs,
		Frees: b.mem.frees, Failed: b.mem.failed, ByTag: maps.Clone(b.mem.byTag)}
}

// ResetPeak sets the peak to the current allocation.
func (b *Backend) ResetPeak() {
	b.mem.Lock()
	b.mem.peak = b.mem.allocated
	b.mem.Unlock()
}

// DefaultQueue is the "compute" queue.
func (b *Backend) DefaultQueue() kernels.Queue { return b.defq }

// NewQueue creates a queue with its own stream.
func (b *Backend) NewQueue(name string) (kernels.Queue, error) { return b.newQueue(name) }

func (b *Backend) newQueue(name string) (*queue, error) {
	if b.closed.Load() {
		return nil, errClosed
	}
	q, err := startQueue(b, name)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	b.mu.queues = append(b.mu.queues, q)
	b.mu.Unlock()
	return q, nil
}

func (b *Backend) queue(kq kernels.Queue) *queue {
	q, ok := kq.(*queue)
	if !ok || q.b != b {
		panic(fmt.Sprintf("kernels/cuda: queue %T is not from this backend", kq))
	}
	return q
}

// event is a kernels.Event: a CUDA event recorded by its queue's goroutine.
type event struct {
	b        *Backend
	recorded chan struct{} // closed once the record call has been issued
	h        *eventHandle  // set before recorded is closed
	passed   atomic.Bool   // the device has passed it: no more queries
}

type eventHandle struct {
	ev  cu.Event
	err error
}

const eventFlags = cu.DisableTiming | cu.BlockingSyncEvent

// RecordEvent marks the current end of q.
func (b *Backend) RecordEvent(kq kernels.Queue) (kernels.Event, error) {
	q := b.queue(kq)
	e := &event{b: b, recorded: make(chan struct{}), h: &eventHandle{}}
	h := e.h
	q.enqueue(func(q *queue) error {
		ev, err := cu.MakeEvent(eventFlags)
		if err == nil {
			if err = ev.Record(q.stream); err != nil {
				_ = cu.DestroyEvent(&ev)
			}
		}
		h.ev, h.err = ev, err
		close(e.recorded)
		return err
	})
	runtime.AddCleanup(e, func(h *eventHandle) {
		if h.err == nil && h.ev != (cu.Event{}) {
			b.destroyLater(h.ev)
		}
	}, h)
	return e, nil
}

// destroyLater destroys ev on a context goroutine. The garbage collector
// runs the events' cleanups in bursts of thousands: they are destroyed
// in batches by one pool job, not by one job (and thread) each.
func (b *Backend) destroyLater(ev cu.Event) {
	b.dead.Lock()
	b.dead.evs = append(b.dead.evs, ev)
	start := !b.dead.draining
	b.dead.draining = true
	b.dead.Unlock()
	if start && !b.pool.run(b.destroyDead) {
		// Closed: the context went, and its events with it.
		b.dead.Lock()
		b.dead.evs, b.dead.draining = nil, false
		b.dead.Unlock()
	}
}

// destroyDead destroys the events destroyLater collected until none is
// left.
func (b *Backend) destroyDead() {
	for {
		b.dead.Lock()
		evs := b.dead.evs
		b.dead.evs = nil
		if len(evs) == 0 {
			b.dead.draining = false
			b.dead.Unlock()
			return
		}
		b.dead.Unlock()
		for i := range evs {
			_ = cu.DestroyEvent(&evs[i])
		}
	}
}

// WaitEvent makes work enqueued on q from now on wait for e.
func (b *Backend) WaitEvent(kq kernels.Queue, ke kernels.Event) error {
	q := b.queue(kq)
	e, ok := ke.(*event)
	if !ok || e.b != b {
		return fmt.Errorf("kernels/cuda: event %T is not from this backend", ke)
	}
	q.enqueue(func(q *queue) error {
		t := time.Now()
		<-e.recorded
		q.waited += time.Since(t)
		if e.h.err != nil {
			return e.h.err
		}
		return q.stream.Wait(e.h.ev, 0)
	})
	return nil
}

// Synchronize blocks until the queue has passed the event.
func (e *event) Synchronize(ctx context.Context) error {
	if e.passed.Load() {
		return nil
	}
	select {
	case <-e.recorded:
	case <-ctx.Done():
		return ctx.Err()
	}
	if e.h.err != nil {
		return e.h.err
	}
	done := make(chan error, 1)
	h := e.h
	if !e.b.pool.run(func() { done <- h.ev.Synchronize() }) {
		return errClosed
	}
	defer runtime.KeepAlive(e)
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("kernels/cuda: event: %w", err)
		}
		e.passed.Store(true)
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Done reports whether the queue has passed the event.
func (e *event) Done() bool {
	if e.passed.Load() {
		return true
	}
	select {
	case <-e.recorded:
	default:
		return false
	}
	if e.h.err != nil {
		return true
	}
	h := e.h
	err := e.b.pool.call(func() error { return h.ev.Query() })
	runtime.KeepAlive(e)
	if err == nil {
		e.passed.Store(true)
	}
	return err == nil
}

// devPtr returns the device address of t's element 0, checking that t lies
// inside a live buffer of this backend.
func (b *Backend) devPtr(t kernels.Tensor, op, name string) cu.DevicePtr {
	buf, ok := t.Buf.(*buffer)
	if !ok || buf.b != b {
		panic(fmt.Sprintf("kernels/cuda: %s: %s is not a buffer of this backend (%T)", op, name, t.Buf))
	}
	if t.Off < 0 || t.Off+t.Bytes() > buf.size {
		panic(fmt.Sprintf("kernels/cuda: %s: %s [%d, %d) outside its %d-byte buffer", op, name, t.Off, t.Off+t.Bytes(), buf.size))
	}
	return buf.ptr + cu.DevicePtr(t.Off)
}

// CopyToDevice enqueues a copy of src into dst.
func (b *Backend) CopyToDevice(kq kernels.Queue, dst kernels.Tensor, src []byte) {
	q := b.queue(kq)
	if int64(len(src)) != dst.Bytes() {
		panic(fmt.Sprintf("kernels/cuda: CopyToDevice: %d host bytes into a %d-byte tensor", len(src), dst.Bytes()))
	}
	d := b.devPtr(dst, "CopyToDevice", "dst")
	if len(src) == 0 {
		return
	}
	q.copyHost(true, d, unsafe.Pointer(&src[0]), int64(len(src)))
}

// CopyToHost enqueues a copy of src into dst.
func (b *Backend) CopyToHost(kq kernels.Queue, dst []byte, src kernels.Tensor) {
	q := b.queue(kq)
	if int64(len(dst)) != src.Bytes() {
		panic(fmt.Sprintf("kernels/cuda: CopyToHost: a %d-byte tensor into %d host bytes", src.Bytes(), len(dst)))
	}
	s := b.devPtr(src, "CopyToHost", "src")
	if len(dst) == 0 {
		return
	}
	q.copyHost(false, s, unsafe.Pointer(&dst[0]), int64(len(dst)))
}

// CopyDevice enqueues a device-to-device copy.
func (b *Backend) CopyDevice(kq kernels.Queue, dst, src kernels.Tensor) {
	q := b.queue(kq)
	if dst.Bytes() != src.Bytes() {
		panic(fmt.Sprintf("kernels/cuda: CopyDevice: %d bytes into %d", src.Bytes(), dst.Bytes()))
	}
	d, s := b.devPtr(dst, "CopyDevice", "dst"), b.devPtr(src, "CopyDevice", "src")
	if n := dst.Bytes(); n > 0 {
		q.copyDevice(d, s, n)
	}
}

// Close waits for every queue, frees what is still allocated (device and
// pinned memory) and releases the device. The backend and its memory must
// not be used afterwards.
func (b *Backend) Close() error {
	if b.closed.Swap(true) {
		return nil
	}
	b.mu.Lock()
	queues := b.mu.queues
	b.mu.queues = nil
	pinned := b.mu.pinned
	b.mu.pinned = nil
	b.mu.Unlock()
	var errs []error
	for _, q := range queues {
		errs = append(errs, q.stop())
	}
	b.mem.Lock()
	live := b.mem.live
	b.mem.live = map[*buffer]struct{}{}
	b.mem.allocated, b.mem.byTag = 0, map[string]int64{}
	b.mem.Unlock()
	errs = append(errs, b.pool.call(func() error {
		for buf := range live {
			_ = cu.MemFree(buf.ptr)
		}
		for _, p := range pinned {
			_ = p.free()
		}
		return nil
	}))
	b.release()
	return errors.Join(errs...)
}

// AllocPinned returns n bytes of zeroed page-locked host memory.
//
// Pinning is first touch of every page: the kernel (and, in a virtual
// machine, the hypervisor) faults each one in and zeroes it, which
// cuMemHostAlloc does on one thread at a GB or two a second, and slower on
// a freshly started machine. So the memory is mapped anonymously (zero by
// construction, in huge pages where the kernel grants them), faulted in on
// all cores, and only then registered with the driver. Where that fails,
// cuMemHostAlloc and a clear on all cores.
func (b *Backend) AllocPinned(n int) ([]byte, error) {
	if n <= 0 {
		return nil, fmt.Errorf("kernels/cuda: AllocPinned(%d): size must be positive", n)
	}
	pm, err := b.registerHost(n)
	if err != nil {
		var p unsafe.Pointer
		err2 := b.pool.call(func() error {
			var err error
			p, err = hostAlloc(n)
			return err
		})
		if err2 != nil {
			return nil, errors.Join(err2, err)
		}
		pm = pinnedMem{p: p, n: n}
		// cuMemHostAlloc does not promise zeros.
		memclr.Clear(unsafe.Slice((*byte)(p), n))
	}
	b.mu.Lock()
	b.mu.pinned[uintptr(pm.p)] = pm
	b.mu.Unlock()
	return unsafe.Slice((*byte)(pm.p), n), nil
}

// FreePinned releases memory from AllocPinned.
func (b *Backend) FreePinned(s []byte) error {
	if len(s) == 0 {
		return errors.New("kernels/cuda: FreePinned of an empty slice")
	}
	key := uintptr(unsafe.Pointer(unsafe.SliceData(s)))
	b.mu.Lock()
	p, ok := b.mu.pinned[key]
	delete(b.mu.pinned, key)
	b.mu.Unlock()
	if !ok {
		return errors.New("kernels/cuda: FreePinned of memory not from AllocPinned (or freed twice)")
	}
	return b.pool.call(p.free)
}

// DeviceInfo describes the device.
func (b *Backend) DeviceInfo() (kernels.DeviceInfo, error) {
	info := kernels.DeviceInfo{Name: b.name, Ordinal: int(b.dev), Runtime: versionString(buildCUDAVersion()),
		Driver: versionString(cu.Version())}
	err := b.pool.call(func() error {
		var err error
		attr := func(a cu.DeviceAttribute) int {
			v, e := b.dev.Attribute(a)
			if e != nil && err == nil {
				err = e
			}
			return v
		}
		info.ComputeCapability = fmt.Sprintf("%d.%d", attr(cu.ComputeCapabilityMajor), attr(cu.ComputeCapabilityMinor))
		info.Multiprocessors = attr(cu.MultiprocessorCount)
		info.BusID = fmt.Sprintf("%04x:%02x:%02x.0", attr(cu.PciDomainID), attr(cu.PciBusID), attr(cu.PciDeviceID))
		if err != nil {
			return err
		}
		info.FreeMemory, info.TotalMemory, err = cu.MemInfo()
		return err
	})
	return info, err
}

func versionString(v int) string {
	if v <= 0 {
		return "unknown"
	}
	return fmt.Sprintf("%d.%d", v/1000, v%1000/10)
}
