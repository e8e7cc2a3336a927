//go:build cuda && linux

package cuda

import (
	"fmt"
	"os"
	"unsafe"

	"github.com/spill-ml/spill/kernels"
)

// pinnedMem is one allocation of AllocPinned: n bytes at p, either an
// anonymous mapping registered with the driver (mapped) or, when mapped is
// nil, memory from cuMemHostAlloc.
type pinnedMem struct {
	p      unsafe.Pointer
	n      int
	mapped []byte
}

// free releases m; it runs on a thread with the context current.
func (m pinnedMem) free() error {
	if m.mapped == nil {
		return hostFree(m.p)
	}
	err := hostUnregister(m.p)
	if e := kernels.UnmapHost(m.mapped); e != nil && err == nil {
		err = fmt.Errorf("kernels/cuda: munmap of pinned memory: %w", e)
	}
	return err
}

// registerHost maps n bytes (rounded up to pages) of anonymous memory,
// asks for transparent huge pages, faults every page in on all cores and
// registers the mapping with the driver. SPILL_PIN=hostalloc turns it off
// (AllocPinned then uses cuMemHostAlloc), for comparisons.
func (b *Backend) registerHost(n int) (pinnedMem, error) {
	if os.Getenv("SPILL_PIN") == "hostalloc" {
		return pinnedMem{}, fmt.Errorf("kernels/cuda: SPILL_PIN=hostalloc")
	}
	ps := os.Getpagesize()
	size := (n + ps - 1) &^ (ps - 1)
	mem, err := kernels.MapHost(size, true) // huge pages where granted: fewer faults and pins
	if err != nil {
		return pinnedMem{}, fmt.Errorf("kernels/cuda: %w", err)
	}
	p := unsafe.Pointer(unsafe.SliceData(mem))
	if err := b.pool.call(func() error { return hostRegister(p, size) }); err != nil {
		_ = kernels.UnmapHost(mem)
		return pinnedMem{}, err
	}
	return pinnedMem{p: p, n: n, mapped: mem}, nil
}
