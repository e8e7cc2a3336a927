package cpu

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/spill-ml/spill/kernels"
)

// hostChunk is the number of elements a HostAdamW worker claims at a time
// (64K: 1.75 MiB of traffic with 16-bit gradients, enough to amortise the
// claim, small enough to balance a layer over many cores). A call of fewer
// than 2*hostChunk elements runs on the calling goroutine alone.
const hostChunk = 1 << 16

// HostAdamW applies one AdamW step to layer state in host memory, with the
// arithmetic of the CPU backend's AdamW kernel (adamwBlock, shared with
// Backend.AdamW), so it gives the kernel's bits. param, m and v hold the n
// float32 master weights and moments; grad holds n elements of the float
// dtype gdt (scaled by p.GradScale, 0 meaning 1); out, if not nil,
// receives the n updated parameters rounded to nearest even to the float
// dtype odt. grad and out must be aligned to their element size.
//
// A call on a large layer is split into chunks of hostChunk elements that
// the calling goroutine and up to GOMAXPROCS-2 host workers (hostHelpers;
// started on first need and kept) update in parallel, yielding between
// chunks; it returns when all are done.
// It allocates nothing in the steady state.
func HostAdamW(param []float32, grad []byte, gdt kernels.DType, m, v []float32, out []byte, odt kernels.DType, p kernels.AdamWParams) error {
	return hostAdamW(param, m, v, nil, nil, nil, grad, gdt, out, odt, p)
}

// HostAdamWFrom is HostAdamW out of place: it reads the master weights and
// moments from p0, m0 and v0 and writes the updated ones to param, m and v,
// leaving the sources unchanged, so that an update can be computed ahead
// and dropped (the speculative host update of out-of-core training). The
// destinations must not overlap the sources. It gives the bits HostAdamW
// gives on a copy of the sources: the kernel reads the sources and writes
// the destinations in one pass (the moments with non-temporal stores when
// aligned), so it moves about as many bytes as the in-place update.
func HostAdamWFrom(param, m, v, p0, m0, v0 []float32, grad []byte, gdt kernels.DType, out []byte, odt kernels.DType, p kernels.AdamWParams) error {
	n := len(param)
	if len(p0) != n || len(m0) != n || len(v0) != n {
		return fmt.Errorf("host AdamW: %d params with %d/%d/%d source params/moments", n, len(p0), len(m0), len(v0))
	}
	if n > 0 && (overlaps(param, p0) || overlaps(m, m0) || overlaps(v, v0)) {
		return fmt.Errorf("host AdamW: the destination overlaps the source")
	}
	return hostAdamW(param, m, v, p0, m0, v0, grad, gdt, out, odt, p)
}

// overlaps reports whether a and b share memory.
func overlaps(a, b []float32) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	a0, b0 := uintptr(unsafe.Pointer(&a[0])), uintptr(unsafe.Pointer(&b[0]))
	return a0 < b0+4*uintptr(len(b)) && b0 < a0+4*uintptr(len(a))
}

// hostAdamW is HostAdamW, out of place when p0 is not nil.
func hostAdamW(param, m, v, p0, m0, v0 []float32, grad []byte, gdt kernels.DType, out []byte, odt kernels.DType, p kernels.AdamWParams) error {
	n := len(param)
	if len(m) != n || len(v) != n || len(grad) != n*gdt.Size() || (out != nil && len(out) != n*odt.Size()) {
		return fmt.Errorf("host AdamW: %d params with %d grad bytes (%v), %d/%d moments, %d out bytes (%v)",
			n, len(grad), gdt, len(m), len(v), len(out), odt)
	}
	if !gdt.IsFloat() || (out != nil && !odt.IsFloat()) {
		return fmt.Errorf("host AdamW: grad %v and out %v must be float dtypes", gdt, odt)
	}
	c, err := newAdamConsts(p)
	if err != nil {
		return fmt.Errorf("host AdamW: %w", err)
	}
	g, err := hostView(grad, gdt, n)
	if err != nil {
		return fmt.Errorf("host AdamW: grad: %w", err)
	}
	var o view
	if out != nil {
		if o, err = hostView(out, odt, n); err != nil {
			return fmt.Errorf("host AdamW: out: %w", err)
		}
	}
	if n < 2*hostChunk || runtime.GOMAXPROCS(0) == 1 {
		var ga [blk]float32
		for lo := 0; lo < n; lo += blk {
			adamwBlockFrom(param, m, v, p0, m0, v0, g, o, out != nil, lo, min(lo+blk, n), &c, &ga)
		}
		return nil
	}
	k := min(hostHelpers(runtime.GOMAXPROCS(0)), (n+hostChunk-1)/hostChunk-1)
	j, jobs := acquireJob(k)
	j.p, j.m, j.v, j.g, j.o, j.hasOut, j.c = param, m, v, g, o, out != nil, c
	j.p0, j.m0, j.v0 = p0, m0, v0
	j.chunks = int64((n + hostChunk - 1) / hostChunk)
	j.next.Store(0)
	j.run(k, jobs)
	j.p, j.m, j.v, j.g, j.o = nil, nil, nil, view{}, view{} // drop the caller's arrays
	j.p0, j.m0, j.v0 = nil, nil, nil
	releaseJob(j)
	return nil
}

// hostHelpers is how many workers help a caller when GOMAXPROCS is p:
// all the other Ps but one from 4 up, so that the goroutines that drive
// a device (an executor enqueuing kernels while the host optimizer runs
// beside it) find a P at once instead of at the scheduler's next
// preemption, up to 10 ms later; and from 8 up, 7 in 10 of the Ps, caller
// included. The update is bound by memory bandwidth, which the device's
// copies share: on the H200 machine (16 cores), gpt2-1.3b under 8 GiB
// stepped in 1.32 s with 11 goroutines updating, 1.40 s with 14 or 8 and
// 1.58 s with 4 (tools/bench/results/ooc_h200_d9bcb7d.json).
//
// SPILL_HOST_THREADS, when set to n > 0, caps the goroutines at n, the
// caller included: the update is bound by host memory bandwidth, which the
// device's copies share.
func hostHelpers(p int) int {
	h := p - 1
	switch {
	case p >= 8:
		h = p*7/10 - 1
	case p >= 4:
		h = p - 2
	}
	if hostThreads > 0 {
		h = max(min(h, hostThreads-1), 0)
	}
	return h
}

// hostThreads is SPILL_HOST_THREADS (0: unset).
var hostThreads = func() int {
	n, err := strconv.Atoi(os.Getenv("SPILL_HOST_THREADS"))
	if err != nil || n < 0 {
		return 0
	}
	return n
}()

// hostChunkHook, if set (by tests), runs as a goroutine starts and ends a
// chunk.
var hostChunkHook func(start bool)

// hostView views host bytes as n elements of the float dtype dt.
func hostView(b []byte, dt kernels.DType, n int) (view, error) {
	v := view{dt: dt, n: n}
	if n == 0 {
		return v, nil
	}
	ptr := unsafe.Pointer(unsafe.SliceData(b))
	if uintptr(ptr)%uintptr(dt.Size()) != 0 {
		return v, fmt.Errorf("%v array at an address not aligned to %d bytes", dt, dt.Size())
	}
	if dt == kernels.F32 {
		v.f = unsafe.Slice((*float32)(ptr), n)
	} else {
		v.h = unsafe.Slice((*uint16)(ptr), n)
	}
	return v, nil
}

// hostJob is one parallel HostAdamW call: chunks claimed in turn by the
// caller and the workers it woke.
type hostJob struct {
	p, m, v    []float32
	p0, m0, v0 []float32 // the sources of an out-of-place update, else nil
	g, o       view
	hasOut     bool
	c          adamConsts
	chunks     int64
	next       atomic.Int64
	wg         sync.WaitGroup
}

// hostWorkers run the chunks of HostAdamW calls. They are started when a
// call first needs them, up to hostHelpers(GOMAXPROCS), and live as long as the
// process (idle, they cost a blocked goroutine each). free recycles the
// jobs of finished calls, so a call allocates nothing once warm.
var hostWorkers struct {
	mu      sync.Mutex
	started int
	jobs    chan *hostJob
	free    []*hostJob
}

// acquireJob returns an idle job and the channel of the host workers,
// after making sure that at least k workers run.
func acquireJob(k int) (*hostJob, chan *hostJob) {
	hostWorkers.mu.Lock()
	defer hostWorkers.mu.Unlock()
	if hostWorkers.jobs == nil {
		hostWorkers.jobs = make(chan *hostJob, 1024)
	}
	for ; hostWorkers.started < k; hostWorkers.started++ {
		go func(jobs chan *hostJob) {
			for j := range jobs {
				j.work()
				j.wg.Done()
			}
		}(hostWorkers.jobs)
	}
	f := hostWorkers.free
	if len(f) == 0 {
		return new(hostJob), hostWorkers.jobs
	}
	hostWorkers.free = f[:len(f)-1]
	return f[len(f)-1], hostWorkers.jobs
}

func releaseJob(j *hostJob) {
	hostWorkers.mu.Lock()
	hostWorkers.free = append(hostWorkers.free, j)
	hostWorkers.mu.Unlock()
}

// run updates every chunk of j with the help of k workers, and returns
// when all are done. A worker busy with another call picks j up later and
// finds its chunks taken; run waits for it all the same, so that j is
// never reused while a worker still holds it.
func (j *hostJob) run(k int, jobs chan *hostJob) {
	j.wg.Add(k)
	for i := 0; i < k; i++ {
		select {
		case jobs <- j:
		default: // every worker has a backlog: the caller does the share itself
			j.wg.Done()
		}
	}
	j.work()
	j.wg.Wait()
}

func (j *hostJob) work() {
	var ga [blk]float32
	n := len(j.p)
	for {
		k := j.next.Add(1) - 1
		if k >= j.chunks {
			return
		}
		lo := int(k) * hostChunk
		hi := min(lo+hostChunk, n)
		if hostChunkHook != nil {
			hostChunkHook(true)
		}
		for s := lo; s < hi; s += blk {
			adamwBlockFrom(j.p, j.m, j.v, j.p0, j.m0, j.v0, j.g, j.o, j.hasOut, s, min(s+blk, hi), &j.c, &ga)
		}
		// A chunk is a few hundred microseconds: yield between them, so
		// that a goroutine made runnable meanwhile (a queue's, an
		// executor's) waits no longer than that for a P.
		if hostChunkHook != nil {
			hostChunkHook(false)
		}
		runtime.Gosched()
	}
}
