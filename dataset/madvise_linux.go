//go:build linux

package dataset

import (
	"os"

	"golang.org/x/sys/unix"
)

// adviseWillNeed calls madvise(MADV_WILLNEED) on m[from:to], widened to page boundaries.
// Errors are ignored: it is only a hint.
func adviseWillNeed(m []byte, from, to int64) {
	page := int64(os.Getpagesize())
	from -= from % page
	to = min(to, int64(len(m)))
	if from < 0 || from >= to {
		return
	}
	_ = unix.Madvise(m[from:to], unix.MADV_WILLNEED)
}
