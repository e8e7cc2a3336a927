//go:build linux

package engine

import (
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// dontNeed drops the whole pages of b, a part of a read-only file mapping,
// from the process (madvise MADV_DONTNEED): the loader has copied them, and
// they would otherwise stay in its resident set until the file is unmapped.
// Errors are ignored: it is only a hint.
func dontNeed(b []byte) {
	if len(b) == 0 {
		return
	}
	page := uintptr(os.Getpagesize())
	start := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	lo := (start + page - 1) &^ (page - 1)
	hi := (start + uintptr(len(b))) &^ (page - 1)
	if hi <= lo {
		return
	}
	_ = unix.Madvise(b[lo-start:hi-start], unix.MADV_DONTNEED)
}
