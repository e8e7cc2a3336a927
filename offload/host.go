package offload

import (
	"context"
	"fmt"
	"sync"

	"golang.org/x/sync/semaphore"

	"github.com/spill-ml/spill/kernels"
)

// HostMemory is a block of host memory suitable as the source or
// destination of an asynchronous device copy.
type HostMemory interface {
	// Bytes is the memory; it stays valid until Free.
	Bytes() []byte
	// Free releases the memory. It is called exactly once.
	Free() error
}

// Pinner supplies page-locked host memory. The CPU backend uses
// MmapPinner (anonymous mappings off the Go heap); the CUDA backend supplies
// one backed by cuMemHostAlloc or cuMemHostRegister.
type Pinner interface {
	// Pin returns n bytes of page-locked, zeroed memory.
	Pin(n int64) (HostMemory, error)
	// CountsAgainstMemlock reports whether pinned bytes count against
	// RLIMIT_MEMLOCK (true for mlock, false for memory the driver pins).
	CountsAgainstMemlock() bool
}

// Limits are the operating system's limits on pinning host memory.
type Limits struct {
	// Memlock is the RLIMIT_MEMLOCK soft limit in bytes (`ulimit -l`), or
	// -1 when unlimited or unknown.
	Memlock int64
	// MemAvailable is MemAvailable from /proc/meminfo in bytes, or -1 when
	// unknown.
	MemAvailable int64
}

// HostConfig configures a HostPool. Zero fields take the defaults given.
type HostConfig struct {
	// Budget is the most host memory the pool pins, in bytes. Required.
	Budget int64
	// StagingSize is the size of one buffer of the ring the pool degrades
	// to when Budget cannot be pinned. Default 64 MiB.
	StagingSize int64
	// MinStaging is the fewest staging buffers a degraded pool accepts
	// (double buffering needs 2). Default 2.
	MinStaging int
	// AvailableFraction is the share of MemAvailable the pool may pin.
	// Default 0.8: pinning all of it invites the out-of-memory killer.
	AvailableFraction float64
	// Pinner supplies the memory. Default MmapPinner{Lock: true}.
	Pinner Pinner
	// ReadLimits reads the system's limits. Default ReadLimits; tests
	// inject their own.
	ReadLimits func() (Limits, error)
}

// HostDecision records how much the pool decided to pin and why.
type HostDecision struct {
	Requested int64 // HostConfig.Budget
	Granted   int64 // bytes the pool will pin at most
	// Degraded is true when the pool is a ring of StagingBuffers buffers of
	// StagingSize bytes each instead of Requested bytes: Acquire then
	// serves requests of at most StagingSize, one buffer each.
	Degraded       bool
	StagingBuffers int
	StagingSize    int64
	Limits         Limits
	Reason         string
}

func (d HostDecision) String() string {
	if !d.Degraded {
		return fmt.Sprintf("host pool: pinning up to %s (%s)", kernels.FormatBytes(d.Granted), d.Reason)
	}
	return fmt.Sprintf("host pool: degraded to %d staging buffers of %s (%s of %s requested): %s",
		d.StagingBuffers, kernels.FormatBytes(d.StagingSize), kernels.FormatBytes(d.Granted),
		kernels.FormatBytes(d.Requested), d.Reason)
}

const minStagingSize = 64 << 10

// maxStaging is the most staging buffers a degraded pool pins.
const maxStaging = 8

func (cfg *HostConfig) ensureDefaults() {
	if cfg.StagingSize <= 0 {
		cfg.StagingSize = 64 << 20
	}
	if cfg.MinStaging <= 0 {
		cfg.MinStaging = 2
	}
	if cfg.AvailableFraction <= 0 || cfg.AvailableFraction > 1 {
		cfg.AvailableFraction = 0.8
	}
	if cfg.Pinner == nil {
		cfg.Pinner = MmapPinner{Lock: true}
	}
	if cfg.ReadLimits == nil {
		cfg.ReadLimits = ReadLimits
	}
}

// DecideHost works out what a pool with cfg would pin, from the limits it
// reads. It fails only when not even MinStaging small buffers fit.
func DecideHost(cfg HostConfig) (HostDecision, error) {
	cfg.ensureDefaults()
	if cfg.Budget <= 0 {
		return HostDecision{}, fmt.Errorf("offload: host pool budget %d must be positive", cfg.Budget)
	}
	d := HostDecision{Requested: cfg.Budget, Granted: cfg.Budget, Reason: "within limits"}
	lim, err := cfg.ReadLimits()
	if err != nil {
		lim = Limits{Memlock: -1, MemAvailable: -1}
		d.Reason = fmt.Sprintf("limits unknown (%v)", err)
	}
	d.Limits = lim
	allowed, why := cfg.Budget, ""
	if lim.MemAvailable >= 0 {
		if a := int64(float64(lim.MemAvailable) * cfg.AvailableFraction); a < allowed {
			allowed = a
			why = fmt.Sprintf("MemAvailable is %s and the pool may pin %.0f%% of it",
				kernels.FormatBytes(lim.MemAvailable), 100*cfg.AvailableFraction)
		}
	}
	if cfg.Pinner.CountsAgainstMemlock() && lim.Memlock >= 0 && lim.Memlock < allowed {
		allowed = lim.Memlock
		why = fmt.Sprintf("RLIMIT_MEMLOCK is %s (raise it with `ulimit -l` or limits.conf memlock)",
			kernels.FormatBytes(lim.Memlock))
	}
	if allowed >= cfg.Budget {
		return d, nil
	}
	size := cfg.StagingSize
	if allowed/size < int64(cfg.MinStaging) {
		size = allowed / int64(cfg.MinStaging) &^ (4<<10 - 1)
	}
	if size < minStagingSize {
		return d, fmt.Errorf("offload: cannot pin %d staging buffers of %s: %s",
			cfg.MinStaging, kernels.FormatBytes(minStagingSize), why)
	}
	// A ring is for copies in flight: a few buffers each way keep both
	// directions busy; more would only pin memory nothing uses.
	n := min(allowed/size, maxStaging)
	d.Degraded, d.StagingBuffers, d.StagingSize = true, int(n), size
	d.Granted = n * size
	d.Reason = why
	return d, nil
}

// HostPool hands out pinned host buffers under a byte budget. Freed buffers
// are kept for reuse (pinning is slow); the pinned total never exceeds the
// granted budget. When the system cannot pin the budget, the pool degrades
// to a ring of staging buffers (see HostDecision) instead of getting the
// process killed.
//
// All methods are safe for concurrent use.
type HostPool struct {
	dec    HostDecision
	pinner Pinner
	sem    *semaphore.Weighted
	mu     struct {
		sync.Mutex
		cache  map[int64][]HostMemory // free pinned memory by size
		pinned int64                  // bytes pinned (in use and cached)
		inUse  int64
		peak   int64
		pins   int64
		closed bool
	}
}

// HostBuf is a buffer from HostPool.Acquire, owned by the caller until
// Release.
type HostBuf struct {
	p    *HostPool
	mem  HostMemory
	n    int64
	cost int64
}

// Bytes is the buffer: exactly the n bytes asked for. It is not zeroed on
// reuse and stops being valid at Release.
func (b *HostBuf) Bytes() []byte { return b.mem.Bytes()[:b.n] }

// NewHostPool decides how much to pin (DecideHost) and returns the pool. In
// degraded mode the staging ring is pinned up front.
func NewHostPool(cfg HostConfig) (*HostPool, error) {
	cfg.ensureDefaults()
	d, err := DecideHost(cfg)
	if err != nil {
		return nil, err
	}
	p := &HostPool{dec: d, pinner: cfg.Pinner, sem: semaphore.NewWeighted(d.Granted)}
	p.mu.cache = map[int64][]HostMemory{}
	if d.Degraded {
		for i := 0; i < d.StagingBuffers; i++ {
			m, err := p.pinner.Pin(d.StagingSize)
			if err != nil {
				p.Close()
				return nil, fmt.Errorf("offload: pinning staging buffer %d of %d: %w", i+1, d.StagingBuffers, err)
			}
			p.mu.cache[d.StagingSize] = append(p.mu.cache[d.StagingSize], m)
			p.mu.pinned += d.StagingSize
			p.mu.pins++
		}
	}
	return p, nil
}

// Decision reports what the pool decided to pin and why.
func (p *HostPool) Decision() HostDecision { return p.dec }

// Acquire returns a pinned buffer of n bytes, waiting while the budget is
// used by other buffers. It returns ctx.Err() if ctx is done first, and a
// *BudgetError at once if n can never fit (larger than the budget, or than
// a staging buffer of a degraded pool).
func (p *HostPool) Acquire(ctx context.Context, n int64) (*HostBuf, error) {
	cost := roundUp(n, 4<<10)
	limit := p.dec.Granted
	if p.dec.Degraded {
		cost, limit = p.dec.StagingSize, p.dec.StagingSize
	}
	if n <= 0 || roundUp(n, 4<<10) > limit {
		if n <= 0 {
			return nil, fmt.Errorf("offload: host buffer of %d bytes", n)
		}
		return nil, p.budgetError(n)
	}
	if err := p.sem.Acquire(ctx, cost); err != nil {
		return nil, err
	}
	mem, err := p.take(cost)
	if err != nil {
		p.sem.Release(cost)
		return nil, err
	}
	return &HostBuf{p: p, mem: mem, n: n, cost: cost}, nil
}

// TryAcquire is Acquire without waiting: it returns ok false when the
// budget is taken by other buffers now.
func (p *HostPool) TryAcquire(n int64) (b *HostBuf, ok bool, err error) {
	cost := roundUp(n, 4<<10)
	limit := p.dec.Granted
	if p.dec.Degraded {
		cost, limit = p.dec.StagingSize, p.dec.StagingSize
	}
	if n <= 0 {
		return nil, false, fmt.Errorf("offload: host buffer of %d bytes", n)
	}
	if roundUp(n, 4<<10) > limit {
		return nil, false, p.budgetError(n)
	}
	if !p.sem.TryAcquire(cost) {
		return nil, false, nil
	}
	mem, err := p.take(cost)
	if err != nil {
		p.sem.Release(cost)
		return nil, false, err
	}
	return &HostBuf{p: p, mem: mem, n: n, cost: cost}, true, nil
}

func (p *HostPool) budgetError(n int64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := &BudgetError{Tier: TierHost, Class: Workspace, Requested: n, Limit: p.dec.Granted,
		Reserved: p.mu.pinned, Allocated: p.mu.inUse}
	if p.dec.Degraded {
		e.Hint = fmt.Sprintf("the pool is degraded to staging buffers of %s: %s; copy in chunks",
			kernels.FormatBytes(p.dec.StagingSize), p.dec.Reason)
	}
	return e
}

// take returns pinned memory of size bytes, from the cache or newly pinned
// after evicting cached memory of other sizes. The semaphore guarantees
// that in-use memory plus size fits the budget.
func (p *HostPool) take(size int64) (HostMemory, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mu.closed {
		return nil, fmt.Errorf("offload: host pool is closed")
	}
	p.mu.inUse += size
	p.mu.peak = max(p.mu.peak, p.mu.inUse)
	if l := p.mu.cache[size]; len(l) > 0 {
		m := l[len(l)-1]
		p.mu.cache[size] = l[:len(l)-1]
		return m, nil
	}
	for sz, l := range p.mu.cache {
		if p.mu.pinned+size <= p.dec.Granted {
			break
		}
		for _, m := range l {
			m.Free()
			p.mu.pinned -= sz
		}
		delete(p.mu.cache, sz)
	}
	// Pinning is slow (the pages are faulted in and locked, a GB or two a
	// second): it runs outside the lock, so that several buffers are
	// pinned at once. The budget is held for it meanwhile.
	p.mu.pinned += size
	p.mu.pins++
	p.mu.Unlock()
	m, err := p.pinner.Pin(size)
	p.mu.Lock()
	if err != nil {
		p.mu.inUse -= size
		p.mu.pinned -= size
		p.mu.pins--
		return nil, fmt.Errorf("offload: pinning %s of host memory: %w", kernels.FormatBytes(size), err)
	}
	return m, nil
}

// Release returns the buffer to the pool. The caller must ensure no queued
// copy still uses it.
func (b *HostBuf) Release() {
	p := b.p
	if p == nil {
		panic("offload: host buffer released twice")
	}
	b.p = nil
	p.mu.Lock()
	p.mu.inUse -= b.cost
	if p.mu.closed {
		b.mem.Free()
		p.mu.pinned -= b.cost
	} else {
		p.mu.cache[b.cost] = append(p.mu.cache[b.cost], b.mem)
	}
	p.mu.Unlock()
	p.sem.Release(b.cost)
}

// HostStats is a snapshot of a HostPool's use.
type HostStats struct {
	Granted int64 // the budget in force
	Pinned  int64 // bytes pinned now, in use or cached
	InUse   int64 // bytes held by unreleased buffers
	Peak    int64 // high-water mark of InUse
	Pins    int64 // calls to the Pinner
}

// Stats returns a snapshot of the pool's use.
func (p *HostPool) Stats() HostStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return HostStats{Granted: p.dec.Granted, Pinned: p.mu.pinned, InUse: p.mu.inUse, Peak: p.mu.peak, Pins: p.mu.pins}
}

// Close frees the cached memory; buffers still acquired are freed at
// their Release.
func (p *HostPool) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mu.closed = true
	var first error
	for sz, l := range p.mu.cache {
		for _, m := range l {
			if err := m.Free(); err != nil && first == nil {
				first = err
			}
			p.mu.pinned -= sz
		}
	}
	clear(p.mu.cache)
	return first
}

// AllocatorPinner is the Pinner of a backend that allocates page-locked
// memory itself (kernels.PinnedAllocator, e.g. CUDA's cuMemHostAlloc). The
// driver pins it: it does not count against RLIMIT_MEMLOCK.
type AllocatorPinner struct{ A kernels.PinnedAllocator }

type allocatorMem struct {
	a kernels.PinnedAllocator
	b []byte
}

func (m *allocatorMem) Bytes() []byte { return m.b }

func (m *allocatorMem) Free() error {
	if m.b == nil {
		return fmt.Errorf("offload: host memory freed twice")
	}
	b := m.b
	m.b = nil
	return m.a.FreePinned(b)
}

// Pin allocates n bytes from the backend.
func (p AllocatorPinner) Pin(n int64) (HostMemory, error) {
	b, err := p.A.AllocPinned(int(n))
	if err != nil {
		return nil, err
	}
	return &allocatorMem{a: p.A, b: b}, nil
}

// CountsAgainstMemlock is false: the driver pins the memory.
func (p AllocatorPinner) CountsAgainstMemlock() bool { return false }

// PinnerFor is the Pinner of backend be: its own allocator when it has
// one (kernels.PinnedAllocator), else anonymous mappings off the Go heap
// (MmapPinner) locked into RAM when lock is set.
func PinnerFor(be kernels.Backend, lock bool) Pinner {
	if a, ok := be.(kernels.PinnedAllocator); ok {
		return AllocatorPinner{A: a}
	}
	return MmapPinner{Lock: lock}
}
