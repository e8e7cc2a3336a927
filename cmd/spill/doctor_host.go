package main

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/spill-ml/spill/kernels"
	"github.com/spill-ml/spill/offload"
)

// hostRates are the host's measured rates: what the host optimizer of an
// out-of-core run can do.
type hostRates struct {
	AdamPinned, AdamGo float64 // host AdamW, parameters/s (bf16 grads and weights)
	Finite             float64 // the gradients' finiteness check, parameters/s
	Copy               float64 // memcpy, bytes/s
	// Pin1 and Pin4 are how fast fresh pinned memory is taken (allocated,
	// page-locked and cleared), bytes/s, one buffer at a time and four
	// at once: the start-up of an out-of-core run pins its host state so.
	Pin1, Pin4 float64
}

// measureHost times the host AdamW on n parameters of state in pinned
// memory (when be offers it) and in Go memory, the finiteness check, and a
// memory copy. The state is touched before the clock starts.
func measureHost(be kernels.Backend, n int) (hostRates, error) {
	var r hostRates
	sizes := []int{4 * n, 4 * n, 4 * n, 2 * n, 2 * n} // master, m, v, grads, out
	run := func(bufs [][]byte) (adam, finite float64, err error) {
		for _, b := range bufs {
			for i := 0; i < len(b); i += 4096 {
				b[i] = 0
			}
		}
		p := kernels.AdamWParams{LR: 1e-4, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Step: 1}
		const reps = 3
		for rep := range reps + 1 {
			if rep == 1 {
				start := time.Now()
				defer func() {
					if err == nil {
						adam = float64(n) * reps / time.Since(start).Seconds()
					}
				}()
			}
			if err = offload.HostAdamW(offload.F32s(bufs[0]), bufs[3], kernels.BF16, offload.F32s(bufs[1]),
				offload.F32s(bufs[2]), bufs[4], kernels.BF16, p); err != nil {
				return 0, 0, err
			}
		}
		start := time.Now()
		for range reps {
			if !offload.HostFinite(bufs[3], kernels.BF16) {
				return 0, 0, fmt.Errorf("zero gradients reported not finite")
			}
		}
		finite = float64(n) * reps / time.Since(start).Seconds()
		return adam, finite, nil
	}
	goBufs := make([][]byte, len(sizes))
	for i, s := range sizes {
		goBufs[i] = offload.NewF32Bytes(int64(s))
	}
	var err error
	if r.AdamGo, r.Finite, err = run(goBufs); err != nil {
		return r, err
	}
	start := time.Now()
	copy(goBufs[1], goBufs[0])
	copy(goBufs[0], goBufs[2])
	r.Copy = float64(2*sizes[0]) / time.Since(start).Seconds()
	goBufs = nil
	pa, ok := be.(kernels.PinnedAllocator)
	if !ok {
		return r, nil
	}
	pinned := make([][]byte, 0, len(sizes))
	defer func() {
		for _, b := range pinned {
			_ = pa.FreePinned(b)
		}
	}()
	for _, s := range sizes {
		b, err := pa.AllocPinned(s)
		if err != nil {
			return r, fmt.Errorf("pinning %s: %w", kernels.FormatBytes(int64(s)), err)
		}
		pinned = append(pinned, b)
	}
	if r.AdamPinned, _, err = run(pinned); err != nil {
		return r, err
	}
	r.Pin1, r.Pin4, err = measurePinning(pa, max(int64(n)*8, 64<<20))
	return r, err
}

// measurePinning times taking 4 fresh pinned buffers of size bytes one
// after the other, then 4 at once, each set freed after; it returns the
// bytes/s of each way.
func measurePinning(pa kernels.PinnedAllocator, size int64) (serial, parallel float64, err error) {
	take := func(workers int) (float64, error) {
		bufs := make([][]byte, 4)
		errs := make([]error, 4)
		start := time.Now()
		var wg sync.WaitGroup
		sem := make(chan struct{}, workers)
		for i := range bufs {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				bufs[i], errs[i] = pa.AllocPinned(int(size))
			}()
		}
		wg.Wait()
		rate := float64(4*size) / time.Since(start).Seconds()
		for _, b := range bufs {
			if b != nil {
				errs = append(errs, pa.FreePinned(b))
			}
		}
		return rate, errors.Join(errs...)
	}
	if serial, err = take(1); err != nil {
		return 0, 0, fmt.Errorf("pinning %s: %w", kernels.FormatBytes(size), err)
	}
	if parallel, err = take(4); err != nil {
		return 0, 0, fmt.Errorf("pinning %s four at once: %w", kernels.FormatBytes(size), err)
	}
	return serial, parallel, nil
}
