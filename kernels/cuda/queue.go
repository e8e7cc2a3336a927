//go:build cuda

package cuda

import (
	"context"
	"fmt"
	"math"
	"os"
	"reflect"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/spill-ml/spill/kernels"
	"gorgonia.org/cu"
)

// queue is a kernels.Queue: one CUDA stream driven by one goroutine locked
// to an OS thread with the context current. Jobs run on that goroutine in
// the order they were enqueued; each issues asynchronous CUDA work.
//
// A job is a value (job), sent through a buffered channel: the common ones
// (a kernel launch, a memset, a copy, a GEMM) are described by its fields,
// so that enqueueing them allocates nothing; the rest carry a closure
// (jobFunc).
type queue struct {
	b      *Backend
	name   string
	stream cu.Stream
	cs     uintptr // stream's CUstream, for launchArgs
	jobs   chan job
	done   chan struct{} // closed when the goroutine has finished

	// sendMu is held while jobs are sent, so that the jobs of one op
	// (putGroup) reach the goroutine together: they share the scratch
	// area, which a job of another op in between could overwrite or grow.
	sendMu sync.Mutex

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
	tmaps    map[[2]tensorMapOf]*tensorMaps // encoded maps by description (encodedMaps)

	// The in-flight bound: an event recorded after every inflightEvery
	// jobs into a ring of inflightMarks; before a slot's event is recorded
	// again the goroutine waits until the device has passed it. So at most
	// about inflightEvery·inflightMarks jobs are ahead of the device, well
	// below the depth at which the driver's launch queue fills and
	// cuLaunchKernel itself blocks: the time the goroutine waits for the
	// device is then its own (waited), apart from the time it spends
	// issuing work, and HostStats can tell the two apart. A slot's event is
	// made on its first use; the ring depends on the device's progress on
	// this stream alone, which every job already issued ensures (WaitEvent
	// issues a wait only on an event already recorded), so it cannot
	// deadlock.
	marks     [inflightMarks]cu.Event
	markI     int           // next slot
	sinceMark int           // jobs since the last mark
	waited    time.Duration // of the job running, time spent waiting, not issuing
}

// inflightEvery and inflightMarks set the in-flight bound (queue.marks):
// about 256 jobs, some 15 ms of a GPT-2 124M step on the H200.
const (
	inflightEvery = 64
	inflightMarks = 4
)

// jobKind says what a job does.
type jobKind uint8

const (
	jobFunc     jobKind = iota // f(q)
	jobLaunch                  // fn<<<grid, block>>>(args[:n])
	jobMemset8                 // args: address, value, count
	jobMemset16                // args: address, value, count
	jobMemset32                // args: address, value, count
	jobCopyHtoD                // args: device address, bytes; host: source
	jobCopyDtoH                // args: device address, bytes; host: destination
	jobCopyDtoD                // args: destination, source, bytes
	jobGemm                    // gemm: q.gemmCall
)

// job is one unit of a queue's work. Arguments flagged in rel are offsets
// into the queue's scratch area, which the job needs at least scratch
// bytes of: the goroutine adds the area's address when it runs the job
// (the area only grows, after the stream has drained, so consecutive jobs
// that name the same size see the same area).
type job struct {
	kind        jobKind
	n           uint8  // arguments used
	rel         uint32 // bit i: args[i] is relative to the scratch area
	scratch     int64
	fn          kfunc
	grid, block dim3
	smem        uint32 // dynamic shared memory per block, bytes (withShared)
	maps        uint8  // tensor maps in the last argument, encoded when the job runs (withTensorMaps)
	tm          [2]tensorMapOf
	args        [maxArgs]uint64
	host        unsafe.Pointer
	gemm        gemmCall
	f           func(*queue) error
}

// launchJob describes a launch of fn with the arguments, each already
// encoded as 8 bytes (see the arg helpers).
func launchJob(fn kfunc, grid, block dim3, args ...uint64) job {
	if len(args) > maxArgs {
		panic(fmt.Sprintf("kernels/cuda: %d kernel arguments, at most %d", len(args), maxArgs))
	}
	j := job{kind: jobLaunch, fn: fn, grid: grid, block: block, n: uint8(len(args))}
	copy(j.args[:], args)
	return j
}

// withShared gives the launch n bytes of dynamic shared memory per block
// (extern __shared__); past 48 KB the kernel must have been allowed it at
// Open (setMaxDynamicShared).
func (j job) withShared(n int) job {
	j.smem = uint32(n)
	return j
}

// tensorMapOf describes the tensor map of a bf16 array at x: w columns, t
// rows, b batches, copied in boxes of 64 columns by rows rows (tensorMap3).
// A map is a function of these alone, so equal descriptions encode equal
// maps (queue.tmaps).
type tensorMapOf struct {
	x             cu.DevicePtr
	w, t, b, rows int
}

// tensorMaps holds up to two encoded tensor maps, 128 bytes each, one
// after the other: a kernel's f9_tmap or f9_tmap2 argument.
type tensorMaps [32]uint64

// withTensorMaps appends to the launch one argument of len(ms) tensor maps
// (1 or 2: a kernel's f9_tmap, or f9_tmap2 of two), passed by value. The
// job holds their descriptions, not the 128 bytes of each: the queue's
// goroutine encodes them when the job runs, where the context is current,
// as the driver's encoder needs (from any other goroutine it reports
// CUDA_ERROR_INVALID_CONTEXT), and keeps what it encoded for the next job
// that names the same arrays (queue.encodedMaps), so a training step
// encodes its maps once, not at every launch.
func (j job) withTensorMaps(ms ...tensorMapOf) job {
	if len(ms) == 0 || len(ms) > len(j.tm) || int(j.n) >= maxArgs {
		panic(fmt.Sprintf("kernels/cuda: %d kernel arguments and %d tensor maps, at most %d arguments and %d maps",
			j.n, len(ms), maxArgs, len(j.tm)))
	}
	j.tm = [2]tensorMapOf{}
	copy(j.tm[:], ms)
	j.args[j.n] = 0
	j.n++
	j.maps = uint8(len(ms))
	return j
}

// encodeMaps encodes into out the tensor maps of a withTensorMaps job.
func (j *job) encodeMaps(out *tensorMaps) error {
	for k, m := range j.tm[:j.maps] {
		if err := tensorMap3((*[16]uint64)(out[16*k:16*k+16]), m.x, m.w, m.t, m.b, m.rows); err != nil {
			return fmt.Errorf("tensor map %d (%d columns, %d rows, %d batches, boxes of %d rows): %w", k, m.w, m.t, m.b,
				m.rows, err)
		}
	}
	return nil
}

// maxEncodedMaps bounds queue.tmaps: past it the goroutine forgets what it
// encoded and starts again (a step's attention layers name a few maps
// each; more means arrays that move, such as activations swapped in and
// out at new addresses).
const maxEncodedMaps = 1024

// encodedMaps returns the tensor maps of job j, encoded on a first use and
// remembered after that. On the queue's goroutine only.
func (q *queue) encodedMaps(j *job) (*tensorMaps, error) {
	if m, ok := q.tmaps[j.tm]; ok { // a zero second entry: one map
		return m, nil
	}
	m := new(tensorMaps)
	if err := j.encodeMaps(m); err != nil {
		return nil, err
	}
	if q.tmaps == nil || len(q.tmaps) >= maxEncodedMaps {
		q.tmaps = make(map[[2]tensorMapOf]*tensorMaps)
	}
	q.tmaps[j.tm] = m
	return m, nil
}

// withScratch marks the arguments at the indices as offsets into a scratch
// area of at least n bytes.
func (j job) withScratch(n int64, idx ...int) job {
	j.scratch = max(j.scratch, n)
	for _, i := range idx {
		j.rel |= 1 << i
	}
	return j
}

// hostStats counts, over every queue of the process, the jobs run, the
// kernel launches among them, the nanoseconds their goroutines spent
// running jobs (issuing asynchronous CUDA work) and the nanoseconds they
// spent waiting instead: for the device under the in-flight bound, or for
// another queue to record an event they wait on (WaitEvent).
var hostStats struct {
	jobs, launches, nanos, waitNanos atomic.Int64
}

// HostStats reports, summed over every queue of every CUDA backend of the
// process since it started, the jobs the queues' goroutines ran, the
// kernel launches among them and the time they spent running jobs: the
// host's side of issuing the work (argument checks and enqueueing on the
// caller's goroutine not included). Benchmarks compare it per training step
// with the step's time.
func HostStats() (jobs, launches int64, busy time.Duration) {
	return hostStats.jobs.Load(), hostStats.launches.Load(), time.Duration(hostStats.nanos.Load())
}

// HostWait reports, summed as HostStats, the time the queues' goroutines
// spent waiting rather than issuing: for the device, which holds them to a
// bounded number of jobs ahead of it (a GPU-bound step spends most of its
// host time here), and for other queues to record the events their work
// waits on. It is not part of HostStats' busy time.
func HostWait() time.Duration { return time.Duration(hostStats.waitNanos.Load()) }

// startQueue starts the goroutine of a new queue and creates its stream.
func startQueue(b *Backend, name string) (*queue, error) {
	q := &queue{b: b, name: name, jobs: make(chan job, 4096), done: make(chan struct{})}
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
		q.cs = streamHandle(q.stream)
	}
	started <- err
	if err != nil {
		return
	}
	// One job variable for the goroutine's life: exec passes its
	// arguments' address to C, which would move a per-iteration variable
	// to the heap on every job.
	j := new(job)
	for {
		var ok bool
		if *j, ok = <-q.jobs; !ok {
			break
		}
		t0 := time.Now()
		q.waited = 0
		err := q.exec(j)
		if q.sinceMark++; err == nil && q.sinceMark >= inflightEvery {
			err = q.mark()
		}
		if err != nil {
			q.fail(err)
		}
		d := time.Since(t0) - q.waited
		if hostSlow > 0 && d >= hostSlow {
			q.logSlow(j, d)
		}
		hostStats.nanos.Add(int64(d))
		hostStats.waitNanos.Add(int64(q.waited))
		hostStats.jobs.Add(1)
		j.f, j.host = nil, nil // let the closure and host memory go
	}
	if err := q.stream.Synchronize(); err != nil {
		q.fail(err)
	}
	for i := range q.marks {
		if q.marks[i] != (cu.Event{}) {
			_ = cu.DestroyEvent(&q.marks[i])
		}
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

// hostSlow, from SPILL_HOST_SLOW at start-up (a duration such as "1ms";
// unset or invalid: off), makes every job whose issue time reaches it
// print a line to standard error: the queue, the job's kind and kernel or
// function, and the time. It finds what holds a queue's goroutine when
// HostStats says the host is busy.
var hostSlow = func() time.Duration {
	d, err := time.ParseDuration(os.Getenv("SPILL_HOST_SLOW"))
	if err != nil {
		return 0
	}
	return d
}()

// logSlow prints the SPILL_HOST_SLOW line of job j, which took d.
func (q *queue) logSlow(j *job, d time.Duration) {
	what := fmt.Sprintf("kind %d", j.kind)
	switch j.kind {
	case jobFunc:
		what = "func " + runtime.FuncForPC(reflect.ValueOf(j.f).Pointer()).Name()
	case jobLaunch:
		what = "launch ?"
		for name, fn := range q.b.fns {
			if fn == j.fn {
				what = "launch " + name
				break
			}
		}
	case jobGemm:
		what = "gemm"
	case jobCopyDtoH, jobCopyHtoD:
		what = fmt.Sprintf("copy (kind %d) of %d bytes", j.kind, j.args[1])
	}
	fmt.Fprintf(os.Stderr, "spill: SPILL_HOST_SLOW: queue %q: %s: %v\n", q.name, what, d)
}

// mark records the next event of the in-flight ring (queue.marks) on the
// stream, first waiting, timed in q.waited, until the device has passed
// that slot's previous record.
func (q *queue) mark() error {
	q.sinceMark = 0
	ev := &q.marks[q.markI]
	q.markI = (q.markI + 1) % inflightMarks
	if *ev == (cu.Event{}) {
		e, err := cu.MakeEvent(eventFlags)
		if err != nil {
			return err
		}
		*ev = e
	} else {
		t := time.Now()
		err := ev.Synchronize()
		q.waited += time.Since(t)
		if err != nil {
			return err
		}
	}
	return ev.Record(q.stream)
}

// exec runs one job on the queue's goroutine.
func (q *queue) exec(j *job) error {
	if j.rel != 0 {
		base, err := q.ensureScratch(j.scratch)
		if err != nil {
			return err
		}
		for i := range int(j.n) {
			if j.rel&(1<<i) != 0 {
				j.args[i] += uint64(base)
			}
		}
	}
	a := &j.args
	switch j.kind {
	case jobFunc:
		return j.f(q)
	case jobLaunch:
		if j.grid.x == 0 {
			return nil
		}
		var maps *tensorMaps
		if j.maps != 0 {
			var err error
			if maps, err = q.encodedMaps(j); err != nil {
				return err
			}
		}
		hostStats.launches.Add(1)
		return launchArgs(q.cs, j.fn, j.grid, j.block, j.smem, a, int(j.n), maps)
	case jobMemset8:
		return cu.MemsetD8Async(cu.DevicePtr(a[0]), byte(a[1]), int64(a[2]), q.stream)
	case jobMemset16:
		return cu.MemsetD16Async(cu.DevicePtr(a[0]), uint16(a[1]), int64(a[2]), q.stream)
	case jobMemset32:
		return cu.MemsetD32Async(cu.DevicePtr(a[0]), uint(uint32(a[1])), int64(a[2]), q.stream)
	case jobCopyHtoD:
		return cu.MemcpyHtoDAsync(cu.DevicePtr(a[0]), j.host, int64(a[1]), q.stream)
	case jobCopyDtoH:
		return cu.MemcpyDtoHAsync(j.host, cu.DevicePtr(a[0]), int64(a[1]), q.stream)
	case jobCopyDtoD:
		return cu.MemcpyDtoDAsync(cu.DevicePtr(a[0]), cu.DevicePtr(a[1]), int64(a[2]), q.stream)
	case jobGemm:
		return q.runGemm(&j.gemm)
	}
	return fmt.Errorf("unknown job kind %d", j.kind)
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
	q.put(&job{kind: jobFunc, f: f})
}

// put hands a copy of j to the queue's goroutine.
func (q *queue) put(j *job) {
	q.sendMu.Lock()
	defer q.sendMu.Unlock()
	q.checkOpen()
	q.jobs <- *j
}

// putGroup hands copies of the jobs of one op to the queue's goroutine,
// with no other job in between.
func (q *queue) putGroup(js []job) {
	q.sendMu.Lock()
	defer q.sendMu.Unlock()
	q.checkOpen()
	for i := range js {
		q.jobs <- js[i]
	}
}

func (q *queue) checkOpen() {
	q.mu.Lock()
	closed := q.mu.closed
	q.mu.Unlock()
	if closed {
		panic(fmt.Sprintf("kernels/cuda: queue %q used after Close", q.name))
	}
}

// launch enqueues a launch of fn (launchJob).
func (q *queue) launch(fn kfunc, grid, block dim3, args ...uint64) {
	j := launchJob(fn, grid, block, args...)
	q.put(&j)
}

// memsetJob sets n elements of size es (1, 2 or 4 bytes) at p to v.
func memsetJob(p uint64, es int, v uint32, n int64) job {
	j := job{kind: jobMemset8, n: 3}
	j.args[0], j.args[1], j.args[2] = p, uint64(v), uint64(n)
	switch es {
	case 1:
	case 2:
		j.kind = jobMemset16
	case 4:
		j.kind = jobMemset32
	default:
		panic(fmt.Sprintf("kernels/cuda: memset of %d-byte elements", es))
	}
	return j
}

// memset enqueues memsetJob(p, es, v, n).
func (q *queue) memset(p cu.DevicePtr, es int, v uint32, n int64) {
	j := memsetJob(uint64(p), es, v, n)
	q.put(&j)
}

// copyDevice enqueues a copy of n bytes from device address s to d.
func (q *queue) copyDevice(d, s cu.DevicePtr, n int64) {
	j := job{kind: jobCopyDtoD, n: 3}
	j.args[0], j.args[1], j.args[2] = uint64(d), uint64(s), uint64(n)
	q.put(&j)
}

// copyHost enqueues a copy of n bytes between host memory h and device
// address d (toDevice: h to d).
func (q *queue) copyHost(toDevice bool, d cu.DevicePtr, h unsafe.Pointer, n int64) {
	j := job{kind: jobCopyDtoH, n: 2, host: h}
	if toDevice {
		j.kind = jobCopyHtoD
	}
	j.args[0], j.args[1] = uint64(d), uint64(n)
	q.put(&j)
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
		h, err := newBlasHandle(q.stream, q.b.reducedPrecision)
		if err != nil {
			return nil, err
		}
		q.blas = h
	}
	return q.blas, nil
}

// dim3 is a launch dimension.
type dim3 struct{ x, y, z int }

// launchOn launches fn on stream s at once, from any context goroutine
// (the self-checks at Open).
func launchOn(s cu.Stream, fn kfunc, grid, block dim3, args ...uint64) error {
	j := launchJob(fn, grid, block, args...)
	return j.launchOn(s)
}

// launchOn launches a jobLaunch without scratch-relative arguments on
// stream s at once.
func (j *job) launchOn(s cu.Stream) error {
	if j.kind != jobLaunch || j.rel != 0 {
		panic("kernels/cuda: launchOn of a job that is not a plain launch")
	}
	if j.grid.x == 0 {
		return nil
	}
	if j.maps != 0 {
		var maps tensorMaps
		if err := j.encodeMaps(&maps); err != nil {
			return err
		}
		return launchArgs(streamHandle(s), j.fn, j.grid, j.block, j.smem, &j.args, int(j.n), &maps)
	}
	return launchArgs(streamHandle(s), j.fn, j.grid, j.block, j.smem, &j.args, int(j.n), nil)
}

// Kernel arguments, each in 8 bytes: the driver reads the parameter's own
// size (4 bytes for int and float) from the start of the slot.
func aPtr(p cu.DevicePtr) uint64 { return uint64(p) }
func aI32(v int) uint64          { return uint64(uint32(int32(v))) }
func aI64(v int64) uint64        { return uint64(v) }
func aF32(v float32) uint64      { return uint64(math.Float32bits(v)) }
func aDT(d kernels.DType) uint64 { return uint64(d) }

// launchNow launches fn at once: on the queue's goroutine only, for the
// jobs that carry a closure.
func (q *queue) launchNow(fn kfunc, grid, block dim3, args ...uint64) error {
	j := launchJob(fn, grid, block, args...)
	if j.grid.x == 0 {
		return nil
	}
	hostStats.launches.Add(1)
	return launchArgs(q.cs, j.fn, j.grid, j.block, j.smem, &j.args, int(j.n), nil)
}
