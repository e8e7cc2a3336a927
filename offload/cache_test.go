package offload

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/spill-ml/spill/kernels"
)

// fakeBuf and fakeRaw stand in for a backend's device memory.
type fakeBuf struct {
	n   int64
	tag string
}

func (b *fakeBuf) Size() int64 { return b.n }
func (b *fakeBuf) Tag() string { return b.tag }

type fakeRaw struct {
	mu     sync.Mutex
	limit  int64
	held   int64
	peak   int64
	allocs int
	live   map[*fakeBuf]bool
}

func newFakeRaw(limit int64) *fakeRaw { return &fakeRaw{limit: limit, live: map[*fakeBuf]bool{}} }

func (r *fakeRaw) Alloc(n int64, tag string) (kernels.Buffer, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.limit > 0 && r.held+n > r.limit {
		return nil, &kernels.OOMError{Requested: n, Tag: tag, Allocated: r.held, Limit: r.limit}
	}
	b := &fakeBuf{n: n, tag: tag}
	r.live[b] = true
	r.held += n
	r.peak = max(r.peak, r.held)
	r.allocs++
	return b, nil
}

func (r *fakeRaw) Free(b kernels.Buffer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	fb := b.(*fakeBuf)
	if !r.live[fb] {
		panic("fakeRaw: double free")
	}
	delete(r.live, fb)
	r.held -= fb.n
}

const (
	KiB = int64(1) << 10
	MiB = int64(1) << 20
)

func mustAlloc(t *testing.T, c *Cache, n int64, cl Class) *Block {
	t.Helper()
	b, err := c.Alloc(n, cl)
	if err != nil {
		t.Fatalf("Alloc(%d, %s): %v", n, cl, err)
	}
	return b
}

func TestCacheSplitAndCoalesce(t *testing.T) {
	raw := newFakeRaw(0)
	c := NewCache(raw, CacheConfig{})
	a := mustAlloc(t, c, 100*KiB, Activations)
	b := mustAlloc(t, c, 200*KiB, Activations)
	d := mustAlloc(t, c, 300*KiB, Workspace)
	if raw.allocs != 1 {
		t.Fatalf("three small blocks took %d segments, want 1", raw.allocs)
	}
	if a.seg != b.seg || b.seg != d.seg || b.off != a.off+100*KiB || d.off != b.off+200*KiB {
		t.Fatalf("blocks not carved consecutively: offsets %d %d %d", a.off, b.off, d.off)
	}
	s := c.Stats()
	if s.Splits != 3 || s.Allocated != 600*KiB || s.Reserved != smallSegment {
		t.Fatalf("splits %d allocated %d reserved %d", s.Splits, s.Allocated, s.Reserved)
	}
	c.Free(b) // hole in the middle: two free blocks
	s = c.Stats()
	if s.FreeBlocks != 2 || s.Merges != 0 {
		t.Fatalf("after freeing the middle: %d free blocks, %d merges", s.FreeBlocks, s.Merges)
	}
	c.Free(a) // merges with the hole
	c.Free(d) // merges with both sides
	s = c.Stats()
	if s.FreeBlocks != 1 || s.LargestFree != smallSegment || s.Fragmentation != 0 || s.Merges != 3 {
		t.Fatalf("after freeing all: %d free blocks, largest %d, frag %v, merges %d", s.FreeBlocks, s.LargestFree, s.Fragmentation, s.Merges)
	}
	// The coalesced block serves a request of the whole segment.
	e := mustAlloc(t, c, smallMax, Weights)
	if raw.allocs != 1 || e.off != 0 {
		t.Fatalf("whole-segment request: %d backend allocs, offset %d", raw.allocs, e.off)
	}
}

func TestCacheReuseAndTensorViews(t *testing.T) {
	raw := newFakeRaw(0)
	c := NewCache(raw, CacheConfig{})
	a := mustAlloc(t, c, 64*MiB, Weights)
	c.Free(a)
	b := mustAlloc(t, c, 60*MiB, Weights) // served from the cache, rest split off
	s := c.Stats()
	if raw.allocs != 1 || s.CacheHits != 1 || s.Splits != 1 {
		t.Fatalf("backend allocs %d, hits %d, splits %d", raw.allocs, s.CacheHits, s.Splits)
	}
	x := b.Tensor(kernels.BF16, 1000)
	y := b.Slice(4096, kernels.F32, 10)
	if x.Buf != b.seg.buf || x.Off != b.off || y.Off != b.off+4096 || y.N != 10 {
		t.Fatalf("views %+v %+v", x, y)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("oversized view did not panic")
		}
	}()
	b.Tensor(kernels.F32, int(60*MiB/4)+1)
}

func TestCacheBudgetNeverExceeded(t *testing.T) {
	const limit = 96 * MiB
	raw := newFakeRaw(0)
	c := NewCache(raw, CacheConfig{Limit: limit})
	rng := rand.New(rand.NewPCG(1, 2))
	var live []*Block
	fails := 0
	for i := 0; i < 3000; i++ {
		if len(live) > 0 && rng.IntN(3) == 0 {
			j := rng.IntN(len(live))
			c.Free(live[j])
			live[j] = live[len(live)-1]
			live = live[:len(live)-1]
		} else {
			var n int64
			switch rng.IntN(3) {
			case 0:
				n = 1 + rng.Int64N(smallMax)
			case 1:
				n = smallMax + rng.Int64N(midMax)
			default:
				n = midMax + rng.Int64N(40*MiB)
			}
			b, err := c.Alloc(n, Class(rng.IntN(int(numClasses))))
			if err != nil {
				var be *BudgetError
				if !errors.As(err, &be) || !errors.Is(err, ErrBudget) || !errors.Is(err, kernels.ErrOutOfMemory) {
					t.Fatalf("alloc error %v is not a budget error", err)
				}
				fails++
			} else {
				live = append(live, b)
			}
		}
		if raw.held > limit {
			t.Fatalf("step %d: backend holds %d > budget %d", i, raw.held, limit)
		}
		if s := c.Stats(); s.Reserved != raw.held || s.Allocated > s.Reserved {
			t.Fatalf("step %d: reserved %d, backend %d, allocated %d", i, s.Reserved, raw.held, s.Allocated)
		}
	}
	if fails == 0 {
		t.Fatal("random workload never hit the budget; the test is not testing it")
	}
	for _, b := range live {
		c.Free(b)
	}
	s := c.Stats()
	if s.Allocated != 0 || s.Requested != 0 || s.Blocks != 0 || s.PeakReserved > limit || s.BudgetFailures != int64(fails) {
		t.Fatalf("after freeing everything: %+v", s)
	}
	var sum int64
	for _, cs := range s.ByClass {
		sum += cs.Reserved
		if cs.Allocated != 0 || cs.Blocks != 0 {
			t.Fatalf("class stats not back to zero: %+v", cs)
		}
	}
	if sum != s.Reserved {
		t.Fatalf("per-class reserved sums to %d, total %d", sum, s.Reserved)
	}
	c.EmptyCache()
	if raw.held != 0 || c.Stats().Segments != 0 {
		t.Fatalf("EmptyCache left %d bytes", raw.held)
	}
}

func TestCacheReleasesCachedSegmentsUnderPressure(t *testing.T) {
	raw := newFakeRaw(0)
	c := NewCache(raw, CacheConfig{Limit: 40 * MiB})
	c.Free(mustAlloc(t, c, 30*MiB, Activations))
	b := mustAlloc(t, c, 36*MiB, Activations) // the cached 30 MiB cannot serve it
	if s := c.Stats(); s.SegmentFrees != 1 || s.Reserved != 36*MiB || b.Size() != 36*MiB {
		t.Fatalf("stats %+v", s)
	}
	// The backend's own budget: the cache retries after releasing, then
	// reports the backend's error as the cause.
	raw2 := newFakeRaw(24 * MiB)
	c2 := NewCache(raw2, CacheConfig{})
	c2.Free(mustAlloc(t, c2, 16*MiB, Workspace))
	mustAlloc(t, c2, 22*MiB, Workspace)
	_, err := c2.Alloc(4*MiB, Grads)
	var oom *kernels.OOMError
	var be *BudgetError
	if !errors.As(err, &oom) || !errors.As(err, &be) || be.Limit != 24*MiB {
		t.Fatalf("backend refusal: %v", err)
	}
}

func TestCacheFragmentation(t *testing.T) {
	c := NewCache(newFakeRaw(0), CacheConfig{})
	var bs []*Block
	for i := 0; i < 16; i++ {
		bs = append(bs, mustAlloc(t, c, 64*KiB, Activations))
	}
	for i := 0; i < 16; i += 2 {
		c.Free(bs[i])
	}
	s := c.Stats()
	// 8 holes of 64 KiB plus the 1 MiB tail of the 2 MiB segment.
	wantFree := smallSegment - 8*64*KiB
	if s.FreeBytes != wantFree || s.LargestFree != smallSegment-16*64*KiB || s.FreeBlocks != 9 {
		t.Fatalf("free %d largest %d blocks %d", s.FreeBytes, s.LargestFree, s.FreeBlocks)
	}
	want := 1 - float64(s.LargestFree)/float64(wantFree)
	if s.Fragmentation != want || s.Fragmentation <= 0 {
		t.Fatalf("fragmentation %v, want %v", s.Fragmentation, want)
	}
}

func TestBudgetErrorText(t *testing.T) {
	c := NewCache(newFakeRaw(0), CacheConfig{
		Limit: 64 * MiB,
		Hint:  func(n int64, cl Class) string { return "plan: weights on host would fit" },
	})
	mustAlloc(t, c, 40*MiB, Weights)
	mustAlloc(t, c, 12*MiB, AdamM)
	_, err := c.Alloc(30*MiB, Activations)
	if err == nil {
		t.Fatal("over-budget alloc succeeded")
	}
	msg := err.Error()
	for _, want := range []string{"device budget exceeded", "30.0 MiB for activations", "of 64.0 MiB reserved",
		"weights 40.0 MiB", "adam_m 12.0 MiB", "plan: weights on host would fit"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q lacks %q", msg, want)
		}
	}
	if _, err := c.Alloc(0, Weights); err == nil || errors.Is(err, ErrBudget) {
		t.Errorf("zero-byte alloc: %v", err)
	}
}

type fakeEvent struct {
	mu   sync.Mutex
	done bool
}

func (e *fakeEvent) Synchronize(ctx context.Context) error { return nil }
func (e *fakeEvent) Done() bool                            { e.mu.Lock(); defer e.mu.Unlock(); return e.done }
func (e *fakeEvent) set()                                  { e.mu.Lock(); e.done = true; e.mu.Unlock() }

func TestMemorySummary(t *testing.T) {
	c := NewCache(newFakeRaw(0), CacheConfig{Limit: 1 << 30})
	w := mustAlloc(t, c, 100*MiB, Weights)
	mustAlloc(t, c, 3*MiB, Activations)
	c.Free(w)
	sum := c.MemorySummary()
	for _, want := range []string{"budget 1.0 GiB", "weights", "activations", "peak reserved", "fragmentation", "100.0 MiB"} {
		if !strings.Contains(sum, want) {
			t.Errorf("summary lacks %q:\n%s", want, sum)
		}
	}
	if strings.Contains(sum, "adam_v") {
		t.Errorf("summary lists an unused class:\n%s", sum)
	}
}

func TestCacheConcurrent(t *testing.T) {
	raw := newFakeRaw(0)
	c := NewCache(raw, CacheConfig{Limit: 256 * MiB})
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				b, err := c.Alloc(int64(1+(i*g)%5)*MiB, Class(g))
				if err == nil {
					c.Free(b)
				}
			}
		}(g)
	}
	wg.Wait()
	if s := c.Stats(); s.Blocks != 0 || s.Allocs != s.Frees || s.Allocs == 0 {
		t.Fatalf("concurrent use: %+v", s)
	}
	if err := c.Close(); err != nil || raw.held != 0 {
		t.Fatalf("Close: %v, backend holds %d", err, raw.held)
	}
}

func BenchmarkCacheAllocFree(b *testing.B) {
	c := NewCache(newFakeRaw(0), CacheConfig{Limit: 1 << 30})
	sizes := []int64{4 * KiB, 300 * KiB, 3 * MiB, 48 * MiB}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		blk, err := c.Alloc(sizes[i%len(sizes)], Activations)
		if err != nil {
			b.Fatal(err)
		}
		c.Free(blk)
	}
}

// syncEvent is a fakeEvent that passes when it is waited for, counting
// the waits.
type syncEvent struct {
	fakeEvent
	waits int
}

func (e *syncEvent) Synchronize(ctx context.Context) error { e.waits++; e.set(); return nil }

// TestCacheFreeAfter: a block freed in order counts as freed at once
// (the peak follows the program), is reused by an allocation of its size
// after a wait for its event rather than new memory, and an allocation
// over the budget waits for all such blocks and makes room from them.
func TestCacheFreeAfter(t *testing.T) {
	c := NewCache(newFakeRaw(0), CacheConfig{Whole: true, Limit: 3 * MiB})
	a := mustAlloc(t, c, 1*MiB, Activations)
	b := mustAlloc(t, c, 2*MiB, Weights)
	evA, evB := &syncEvent{}, &syncEvent{}
	c.FreeAfter(a, evA)
	if s := c.Stats(); s.Allocated != 2*MiB || s.Reserved != 3*MiB {
		t.Fatalf("after FreeAfter: allocated %d, reserved %d; want 2 MiB, 3 MiB", s.Allocated, s.Reserved)
	}
	a2 := mustAlloc(t, c, 1*MiB, Activations) // waits for a's event and reuses it
	if s := c.Stats(); evA.waits != 1 || s.CacheHits != 1 || s.Reserved != 3*MiB {
		t.Fatalf("same-size allocation: %d waits, %d cache hits, reserved %d", evA.waits, s.CacheHits, s.Reserved)
	}
	// A passed event needs no wait.
	done := &syncEvent{}
	done.set()
	c.FreeAfter(a2, done)
	a3 := mustAlloc(t, c, 1*MiB, Activations)
	if done.waits != 0 {
		t.Fatalf("waited %d times for a passed event", done.waits)
	}
	// Over the budget: b and a3 freed in order, a 3 MiB block needs their
	// memory back.
	c.FreeAfter(b, evB)
	evA3 := &syncEvent{}
	c.FreeAfter(a3, evA3)
	big := mustAlloc(t, c, 3*MiB, Workspace)
	if s := c.Stats(); evB.waits != 1 || evA3.waits != 1 || s.Reserved != 3*MiB || s.Allocated != 3*MiB {
		t.Fatalf("over-budget allocation: waits %d, %d; reserved %d, allocated %d", evB.waits, evA3.waits, s.Reserved, s.Allocated)
	}
	c.Free(big)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}
