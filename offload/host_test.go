package offload

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// countingPinner hands out heap memory and tracks what is pinned.
type countingPinner struct {
	mu     sync.Mutex
	pinned int64
	peak   int64
	memlk  bool
}

type countedMem struct {
	p *countingPinner
	b []byte
}

func (m *countedMem) Bytes() []byte { return m.b }
func (m *countedMem) Free() error {
	m.p.mu.Lock()
	m.p.pinned -= int64(len(m.b))
	m.p.mu.Unlock()
	return nil
}

func (p *countingPinner) Pin(n int64) (HostMemory, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pinned += n
	p.peak = max(p.peak, p.pinned)
	return &countedMem{p: p, b: make([]byte, n)}, nil
}
func (p *countingPinner) CountsAgainstMemlock() bool { return p.memlk }

func limitsOf(l Limits) func() (Limits, error) { return func() (Limits, error) { return l, nil } }

func TestHostPoolBudgetAndReuse(t *testing.T) {
	pin := &countingPinner{}
	p, err := NewHostPool(HostConfig{Budget: 1 * MiB, Pinner: pin, ReadLimits: limitsOf(Limits{-1, -1})})
	if err != nil {
		t.Fatal(err)
	}
	if d := p.Decision(); d.Degraded || d.Granted != 1*MiB {
		t.Fatalf("decision %v", d)
	}
	ctx := context.Background()
	a, err := p.Acquire(ctx, 600*KiB)
	if err != nil || int64(len(a.Bytes())) != 600*KiB {
		t.Fatalf("Acquire: %v", err)
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := p.Acquire(short, 600*KiB); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("over-budget Acquire returned %v, want to wait until the deadline", err)
	}
	a.Release()
	b, err := p.Acquire(ctx, 600*KiB) // same size: reused, not pinned again
	if err != nil {
		t.Fatal(err)
	}
	if s := p.Stats(); s.Pins != 1 || s.InUse != 600*KiB {
		t.Fatalf("stats after reuse %+v", s)
	}
	b.Release()
	c, err := p.Acquire(ctx, 900*KiB) // different size: evicts the cached buffer
	if err != nil {
		t.Fatal(err)
	}
	if pin.peak > 1*MiB {
		t.Fatalf("pinned %d bytes, budget %d", pin.peak, 1*MiB)
	}
	c.Release()
	var be *BudgetError
	if _, err := p.Acquire(ctx, 2*MiB); !errors.As(err, &be) || be.Tier != TierHost {
		t.Fatalf("impossible Acquire: %v", err)
	}
	if err := p.Close(); err != nil || pin.pinned != 0 {
		t.Fatalf("Close: %v, %d bytes still pinned", err, pin.pinned)
	}
}

func TestHostPoolCancellation(t *testing.T) {
	p, err := NewHostPool(HostConfig{Budget: 64 * KiB, Pinner: &countingPinner{}, ReadLimits: limitsOf(Limits{-1, -1})})
	if err != nil {
		t.Fatal(err)
	}
	held, err := p.Acquire(context.Background(), 64*KiB)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := p.Acquire(ctx, 4*KiB)
		done <- err
	}()
	runtime.Gosched()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Acquire returned %v", err)
	}
	held.Release()
	if s := p.Stats(); s.InUse != 0 {
		t.Fatalf("cancelled Acquire left %d bytes in use", s.InUse)
	}
}

func TestHostPoolDegradesToStagingRing(t *testing.T) {
	pin := &countingPinner{memlk: true}
	cfg := HostConfig{Budget: 1 << 30, StagingSize: 4 * MiB, Pinner: pin,
		ReadLimits: limitsOf(Limits{Memlock: 8 * MiB, MemAvailable: 64 << 30})}
	p, err := NewHostPool(cfg)
	if err != nil {
		t.Fatal(err)
	}
	d := p.Decision()
	if !d.Degraded || d.StagingBuffers != 2 || d.StagingSize != 4*MiB || d.Granted != 8*MiB {
		t.Fatalf("decision %+v", d)
	}
	if !strings.Contains(d.String(), "RLIMIT_MEMLOCK is 8.0 MiB") || !strings.Contains(d.String(), "2 staging buffers of 4.0 MiB") {
		t.Errorf("decision text %q", d)
	}
	if pin.pinned != 8*MiB {
		t.Fatalf("ring not pinned up front: %d", pin.pinned)
	}
	ctx := context.Background()
	a, _ := p.Acquire(ctx, 1*KiB)
	b, _ := p.Acquire(ctx, 4*MiB)
	if a == nil || b == nil {
		t.Fatal("ring buffers not served")
	}
	short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	if _, err := p.Acquire(short, 1*KiB); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("third buffer of a ring of two: %v", err)
	}
	if _, err := p.Acquire(ctx, 5*MiB); err == nil || !strings.Contains(err.Error(), "copy in chunks") {
		t.Fatalf("request above the staging size: %v", err)
	}
	a.Release()
	b.Release()
	if s := p.Stats(); s.Pins != 2 {
		t.Fatalf("ring re-pinned: %d pins", s.Pins)
	}

	// MemAvailable also limits, even for a pinner the memlock limit ignores.
	cfg.Pinner = &countingPinner{}
	cfg.ReadLimits = limitsOf(Limits{Memlock: 8 * MiB, MemAvailable: 100 * MiB})
	d, err = DecideHost(cfg)
	// 80 MiB may be pinned, but a ring needs no more than 8 buffers.
	if err != nil || !d.Degraded || d.StagingBuffers != 8 || d.Granted != 8*d.StagingSize || !strings.Contains(d.Reason, "MemAvailable") {
		t.Fatalf("MemAvailable decision %+v, %v", d, err)
	}
	// Too little for even two small buffers: a clear error.
	cfg.Pinner = &countingPinner{memlk: true}
	cfg.ReadLimits = limitsOf(Limits{Memlock: 64 * KiB, MemAvailable: -1})
	if _, err := DecideHost(cfg); err == nil || !strings.Contains(err.Error(), "ulimit -l") {
		t.Fatalf("hopeless limits: %v", err)
	}
	// A small memlock limit shrinks the staging buffers rather than failing.
	cfg.ReadLimits = limitsOf(Limits{Memlock: 1 * MiB, MemAvailable: -1})
	if d, err := DecideHost(cfg); err != nil || d.StagingBuffers != 2 || d.StagingSize != 512*KiB {
		t.Fatalf("small memlock: %+v %v", d, err)
	}
}

func TestMmapPinnerAndLimits(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("mmap pinner is linux-only")
	}
	m, err := MmapPinner{Lock: true}.Pin(64 * KiB)
	if err != nil {
		t.Fatal(err)
	}
	b := m.Bytes()
	if int64(len(b)) != 64*KiB || b[0] != 0 || b[len(b)-1] != 0 {
		t.Fatalf("pinned memory: len %d", len(b))
	}
	b[100] = 7
	if err := m.Free(); err != nil {
		t.Fatal(err)
	}
	if err := m.Free(); err == nil {
		t.Fatal("double free not reported")
	}
	lim, err := ReadLimits()
	if err != nil || lim.MemAvailable <= 0 {
		t.Fatalf("ReadLimits: %+v %v", lim, err)
	}
	if _, err := parseMemAvailable([]byte("MemTotal: 10 kB\nMemAvailable: x kB\n")); err == nil || !strings.Contains(err.Error(), "/proc/meminfo:2") {
		t.Fatalf("bad meminfo: %v", err)
	}
	if n, err := parseMemAvailable([]byte("MemAvailable:    2048 kB\n")); err != nil || n != 2*MiB {
		t.Fatalf("meminfo: %d %v", n, err)
	}
}

// fakeAllocator is a kernels.PinnedAllocator that counts its buffers.
type fakeAllocator struct{ live map[*byte]int }

func (a *fakeAllocator) AllocPinned(n int) ([]byte, error) {
	b := make([]byte, n)
	a.live[&b[0]] = n
	return b, nil
}

func (a *fakeAllocator) FreePinned(b []byte) error {
	if _, ok := a.live[&b[0]]; !ok {
		return errors.New("not allocated here")
	}
	delete(a.live, &b[0])
	return nil
}

// TestHostPoolTryAcquireAndAllocatorPinner: TryAcquire never waits (it
// says the budget is taken instead), and a pool over a backend's allocator
// frees everything it pinned through it on Close.
func TestHostPoolTryAcquireAndAllocatorPinner(t *testing.T) {
	a := &fakeAllocator{live: map[*byte]int{}}
	pin := AllocatorPinner{A: a}
	if pin.CountsAgainstMemlock() {
		t.Error("driver-pinned memory counts against RLIMIT_MEMLOCK")
	}
	p, err := NewHostPool(HostConfig{Budget: 64 * KiB, Pinner: pin, ReadLimits: limitsOf(Limits{Memlock: 4 * KiB, MemAvailable: -1})})
	if err != nil {
		t.Fatal(err)
	}
	if p.Decision().Degraded {
		t.Fatalf("memlock applied to driver-pinned memory: %v", p.Decision())
	}
	b1, ok, err := p.TryAcquire(40 * KiB)
	if err != nil || !ok {
		t.Fatalf("TryAcquire: %v %v", ok, err)
	}
	if _, ok, err := p.TryAcquire(40 * KiB); ok || err != nil {
		t.Fatalf("second TryAcquire over budget: ok %v, err %v; want not ok, no error", ok, err)
	}
	var be *BudgetError
	if _, _, err := p.TryAcquire(100 * KiB); !errors.As(err, &be) {
		t.Fatalf("TryAcquire larger than the budget: %v", err)
	}
	if len(a.live) != 1 {
		t.Fatalf("%d buffers allocated, want 1", len(a.live))
	}
	b1.Release()
	if err := p.Close(); err != nil || len(a.live) != 0 {
		t.Fatalf("Close: %v, %d buffers still allocated", err, len(a.live))
	}
}

// slowPinner pins slowly, counting how many pins run at once, and fails
// the pin numbered fail (1-based; 0: none).
type slowPinner struct {
	countingPinner
	mu2         sync.Mutex
	now, most   int
	calls, fail int
}

func (p *slowPinner) Pin(n int64) (HostMemory, error) {
	p.mu2.Lock()
	p.calls++
	call := p.calls
	p.now++
	p.most = max(p.most, p.now)
	p.mu2.Unlock()
	time.Sleep(20 * time.Millisecond)
	p.mu2.Lock()
	p.now--
	p.mu2.Unlock()
	if call == p.fail {
		return nil, errors.New("no more")
	}
	return p.countingPinner.Pin(n)
}

// TestHostPoolPinsConcurrently: buffers taken from several goroutines are
// pinned at once (pinning runs outside the pool's lock), within the
// budget, and a failed pin gives its reservation back.
func TestHostPoolPinsConcurrently(t *testing.T) {
	pin := &slowPinner{fail: 3}
	p, err := NewHostPool(HostConfig{Budget: 8 * MiB, Pinner: pin, ReadLimits: limitsOf(Limits{-1, -1})})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var bufs []*HostBuf
	var fails int
	for range 6 {
		wg.Go(func() {
			b, ok, err := p.TryAcquire(1 * MiB)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				fails++
			case !ok:
				t.Errorf("TryAcquire refused within the budget")
			default:
				bufs = append(bufs, b)
			}
		})
	}
	wg.Wait()
	if pin.most < 2 {
		t.Errorf("at most %d pins at once: pinning is serialised", pin.most)
	}
	if fails != 1 || len(bufs) != 5 {
		t.Fatalf("%d failed, %d pinned; want 1 and 5", fails, len(bufs))
	}
	if s := p.Stats(); s.Pinned != 5*MiB || s.InUse != 5*MiB || s.Pins != 5 || pin.pinned != 5*MiB {
		t.Fatalf("stats %+v, pinner holds %d: the failed pin's reservation was not given back", s, pin.pinned)
	}
	for _, b := range bufs {
		b.Release()
	}
	if err := p.Close(); err != nil || pin.pinned != 0 {
		t.Fatalf("Close: %v, %d bytes still pinned", err, pin.pinned)
	}
}
