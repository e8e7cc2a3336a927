//go:build cuda && !linux

package cuda

import (
	"errors"
	"unsafe"
)

// pinnedMem is one allocation of AllocPinned: memory from cuMemHostAlloc.
type pinnedMem struct {
	p unsafe.Pointer
	n int
}

func (m pinnedMem) free() error { return hostFree(m.p) }

// registerHost is not available here: AllocPinned uses cuMemHostAlloc.
func (b *Backend) registerHost(n int) (pinnedMem, error) {
	return pinnedMem{}, errors.New("kernels/cuda: no anonymous mappings to register on this system")
}
