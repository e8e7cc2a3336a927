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

// Fault faults in every page of b, which must read as zero (fresh
// anonymous memory), on all cores, by writing a zero to each page: what
// pinning would otherwise do on one thread. b stays all zero.
func Fault(b []byte) {
	parallel(b, func(c []byte) {
		for i := 0; i < len(c); i += page {
			c[i] = 0
		}
	})
}

// page is the smallest page size: a write every page bytes touches each.
const page = 4096

// Clear sets every byte of b to zero, splitting a large b among up to
// GOMAXPROCS goroutines. It returns when all of b is clear.
func Clear(b []byte) { parallel(b, func(c []byte) { clear(c) }) }

// parallel calls f on consecutive parts of b, one per goroutine, up to
// GOMAXPROCS of them, and returns when all have returned. The parts are
// multiples of page long but for the last.
func parallel(b []byte, f func([]byte)) {
	n := len(b)
	workers := min(runtime.GOMAXPROCS(0), (n+chunk-1)/chunk)
	if workers < 2 {
		f(b)
		return
	}
	per := ((n+workers-1)/workers + page - 1) &^ (page - 1)
	var wg sync.WaitGroup
	for lo := per; lo < n; lo += per {
		wg.Go(func() { f(b[lo:min(lo+per, n)]) })
	}
	f(b[:min(per, n)])
	wg.Wait()
}
