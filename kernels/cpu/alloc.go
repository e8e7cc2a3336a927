package cpu

import (
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/spill-ml/spill/kernels"
)

// mmapMin is the size from which buffers are mapped directly from the
// kernel instead of the Go heap, so that Free returns the memory at once
// (the budget simulates a device: host RSS should follow it).
const mmapMin = 256 << 10

// align is the alignment of every buffer's first byte.
const align = 64

// buffer is a block of simulated device memory.
type buffer struct {
	owner  *allocator
	size   int64
	tag    string
	data   []byte // len == size, 64-byte aligned
	mapped []byte // the whole mapping when mmapped, else nil
	freed  atomic.Bool
}

func (b *buffer) Size() int64 { return b.size }
func (b *buffer) Tag() string { return b.tag }

func (b *buffer) bytes() []byte {
	if b.freed.Load() {
		panic(fmt.Sprintf("kernels/cpu: use of freed buffer %q (%d bytes)", b.tag, b.size))
	}
	return b.data
}

// allocator hands out buffers under a hard byte budget.
type allocator struct {
	limit int64 // 0 = unlimited

	mu struct {
		sync.Mutex
		live      map[*buffer]struct{}
		allocated int64
		peak      int64
		allocs    int64
		frees     int64
		failed    int64
		byTag     map[string]int64
	}
}

func newAllocator(limit int64) *allocator {
	a := &allocator{limit: limit}
	a.mu.live = map[*buffer]struct{}{}
	a.mu.byTag = map[string]int64{}
	return a
}

func (a *allocator) alloc(n int64, tag string) (kernels.Buffer, error) {
	if n < 0 {
		return nil, fmt.Errorf("kernels/cpu: Alloc of %d bytes for %q", n, tag)
	}
	// Reserve first, then get the memory outside the lock.
	a.mu.Lock()
	if a.limit > 0 && a.mu.allocated+n > a.limit {
		a.mu.failed++
		err := &kernels.OOMError{Requested: n, Tag: tag, Allocated: a.mu.allocated, Limit: a.limit, ByTag: maps.Clone(a.mu.byTag)}
		a.mu.Unlock()
		return nil, err
	}
	a.reserveLocked(n, tag)
	a.mu.Unlock()

	b := &buffer{owner: a, size: n, tag: tag}
	if n >= mmapMin {
		m, err := unix.Mmap(-1, 0, int(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
		if err != nil {
			a.mu.Lock()
			a.releaseLocked(n, tag)
			a.mu.allocs--
			a.mu.failed++
			a.mu.Unlock()
			return nil, fmt.Errorf("kernels/cpu: mapping %s for %q: %w", kernels.FormatBytes(n), tag, err)
		}
		b.mapped, b.data = m, m[:n:n]
	} else {
		raw := make([]byte, n+align)
		off := 0
		if r := int(uintptr(unsafe.Pointer(unsafe.SliceData(raw))) % align); r != 0 {
			off = align - r
		}
		b.data = raw[off : off+int(n) : off+int(n)]
	}
	a.mu.Lock()
	a.mu.live[b] = struct{}{}
	a.mu.Unlock()
	return b, nil
}

func (a *allocator) reserveLocked(n int64, tag string) {
	a.mu.allocated += n
	a.mu.allocs++
	a.mu.byTag[tag] += n
	if a.mu.allocated > a.mu.peak {
		a.mu.peak = a.mu.allocated
	}
}

func (a *allocator) releaseLocked(n int64, tag string) {
	a.mu.allocated -= n
	a.mu.byTag[tag] -= n
	if a.mu.byTag[tag] == 0 {
		delete(a.mu.byTag, tag)
	}
}

func (a *allocator) free(kb kernels.Buffer) {
	b, ok := kb.(*buffer)
	if !ok || b.owner != a {
		panic(fmt.Sprintf("kernels/cpu: Free of a buffer (%T) not allocated by this backend", kb))
	}
	a.mu.Lock()
	if _, live := a.mu.live[b]; !live {
		a.mu.Unlock()
		panic(fmt.Sprintf("kernels/cpu: double Free of buffer %q (%d bytes)", b.tag, b.size))
	}
	delete(a.mu.live, b)
	a.releaseLocked(b.size, b.tag)
	a.mu.frees++
	a.mu.Unlock()
	b.release()
}

func (b *buffer) release() {
	b.freed.Store(true)
	if b.mapped != nil {
		if err := unix.Munmap(b.mapped); err != nil {
			panic(fmt.Sprintf("kernels/cpu: unmapping buffer %q: %v", b.tag, err))
		}
		b.mapped = nil
	}
	b.data = nil
}

func (a *allocator) freeAll() {
	a.mu.Lock()
	live := a.mu.live
	a.mu.live = map[*buffer]struct{}{}
	for b := range live {
		a.releaseLocked(b.size, b.tag)
		a.mu.frees++
	}
	a.mu.Unlock()
	for b := range live {
		b.release()
	}
}

func (a *allocator) stats() kernels.MemStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return kernels.MemStats{
		Limit:     a.limit,
		Allocated: a.mu.allocated,
		Peak:      a.mu.peak,
		Allocs:    a.mu.allocs,
		Frees:     a.mu.frees,
		Failed:    a.mu.failed,
		ByTag:     maps.Clone(a.mu.byTag),
	}
}

func (a *allocator) resetPeak() {
	a.mu.Lock()
	a.mu.peak = a.mu.allocated
	a.mu.Unlock()
}
