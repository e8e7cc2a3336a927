package cpu

import "time"

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

// simulateLink runs copy and then sleeps for what remains of the
// simulated duration.
func simulateLink(dur time.Duration, copy func()) {
	start := time.Now()
	copy()
	if rest := dur - time.Since(start); rest > 0 {
		time.Sleep(rest)
	}
}
