// Package memclr clears large host buffers on all cores: what a backend
// does to the pinned memory it hands out zeroed (tens of GiB for an
// out-of-core run's host state), which one core clears at a few GB/s.
package memclr

import (
	"runtime"
	"sync"
)

// chunk is the bytes one goroutine clears at a time; a buffer of fewer
// than two chunks is cleared by the caller alone.
const chunk = 64 << 20

// Clear sets every byte of b to zero, splitting a large b among up to
// GOMAXPROCS goroutines. It returns when all of b is clear.
func Clear(b []byte) {
	n := len(b)
	workers := min(runtime.GOMAXPROCS(0), (n+chunk-1)/chunk)
	if workers < 2 {
		clear(b)
		return
	}
	per := (n + workers - 1) / workers
	var wg sync.WaitGroup
	for lo := per; lo < n; lo += per {
		wg.Go(func() { clear(b[lo:min(lo+per, n)]) })
	}
	clear(b[:min(per, n)])
	wg.Wait()
}
