//go:build linux

package kernels

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/spill-ml/spill/kernels/internal/memclr"
)

// MapHost maps n bytes of anonymous memory off the Go heap (release it
// with UnmapHost). With prefault it asks for transparent huge pages and
// faults every page in on all cores, so that the first touch
// of a large buffer costs neither a fault per page nor a single core's
// zeroing. The pinned host memory of the CUDA backend and the out-of-core
// trainer's host state are both mapped here.
func MapHost(n int, prefault bool) ([]byte, error) {
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("mmap %d bytes: %w", n, err)
	}
	if prefault {
		_ = unix.Madvise(b, unix.MADV_HUGEPAGE) // advice: fewer faults and TLB misses where granted
		memclr.Fault(b)
	}
	return b, nil
}

// UnmapHost releases memory from MapHost.
func UnmapHost(b []byte) error { return unix.Munmap(b) }
