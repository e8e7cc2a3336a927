package cpu

import (
	"runtime"
	"time"
)

// copyDelay simulates a host-device link: every CopyToDevice and
// CopyToHost takes at least Fixed plus bytes/Bandwidth.
type copyDelay struct {
	Fixed     time.Duration
	Bandwidth float64 // bytes per second; 0 = no per-byte cost
}

// SetCopyLatency makes every host<->device copy take at least fixed plus
// its size divided by bandwidth (bytes per second, 0 for none), as a PCIe
// link would, while leaving the copying thread idle (it sleeps) so that
// compute on other queues proceeds. It is for benchmarks and tests of
// transfer/compute overlap; fixed = 0 and bandwidth = 0 turn it off.
// It applies to copies enqueued after the call.
func (b *Backend) SetCopyLatency(fixed time.Duration, bandwidth float64) {
	if fixed <= 0 && bandwidth <= 0 {
		b.delay.Store(nil)
		return
	}
	b.delay.Store(&copyDelay{Fixed: fixed, Bandwidth: bandwidth})
}

// copyTime is the simulated duration of an n-byte copy, 0 when off.
func (b *Backend) copyTime(n int) time.Duration {
	d := b.delay.Load()
	if d == nil {
		return 0
	}
	t := d.Fixed
	if d.Bandwidth > 0 {
		t += time.Duration(float64(n) / d.Bandwidth * 1e9)
	}
	return t
}

// sleepGrain is how late a time.Sleep may wake: on an otherwise idle
// process the runtime's timers fire with about a millisecond of
// granularity, which would turn every simulated 100 µs copy into a 1 ms
// one exactly when nothing else runs (the start and end of a step).
const sleepGrain = 1200 * time.Microsecond

// simulateLink runs copy and then waits for what remains of the simulated
// duration: it sleeps for all but the last sleepGrain and yields the
// processor in a loop for the rest, so that short copies take what they
// should (within a few microseconds) while compute goroutines keep
// running.
func simulateLink(dur time.Duration, copy func()) {
	start := time.Now()
	copy()
	end := start.Add(dur)
	if rest := time.Until(end); rest > sleepGrain {
		time.Sleep(rest - sleepGrain)
	}
	for time.Now().Before(end) {
		runtime.Gosched()
	}
}
