package offload

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"

	"github.com/spill-ml/spill/kernels"
)

// RawAllocator is the part of kernels.Backend that Cache builds on.
type RawAllocator interface {
	Alloc(n int64, tag string) (kernels.Buffer, error)
	Free(b kernels.Buffer)
}

// Size classes of the caching allocator. Requests are rounded up to
// blockAlign. Requests up to smallMax bytes are carved out of smallSegment
// segments; requests up to midMax out of midSegment segments; larger ones
// get a segment of their own rounded up to largeRound. A free block is split
// when what remains is at least blockAlign (small pool) or more than
// splitMin (large pool); a freed block merges with free neighbours of the
// same segment.
const (
	blockAlign   = 512
	smallMax     = 1 << 20
	smallSegment = 2 << 20
	midMax       = 10 << 20
	midSegment   = 20 << 20
	largeRound   = 2 << 20
	splitMin     = 1 << 20
)

// CacheConfig configures a Cache.
type CacheConfig struct {
	// Limit is the hard budget on reserved bytes (every segment taken from
	// the backend, in use or cached). 0 means no budget of the cache's own:
	// only the backend's applies.
	Limit int64
	// Hint, if set, is called when a request is refused and its result is
	// put in the BudgetError ("a plan that fits: ..."). It must not call
	// back into the Cache.
	Hint func(requested int64, class Class) string
	// Whole makes every block a whole segment of its own: requests are
	// rounded up to 512 bytes, never split or pooled, and a freed block is
	// reused only by a request of the same rounded size (Block.Buffer then
	// returns the backend buffer itself). Reserved memory is then exactly
	// what a schedule of allocations predicts, which suits small budgets
	// (a CPU backend simulating a device of a few MiB) and callers that
	// need whole backend buffers. Default false: size classes as above.
	Whole bool
}

// Cache is a caching allocator of device memory. It takes large segments
// from a RawAllocator, carves blocks out of them and keeps freed blocks for
// reuse, so steady-state training makes no backend allocations. The sum of
// its segments never exceeds the budget; when a new segment would, the
// cache first returns its wholly free segments to the backend.
//
// All methods are safe for concurrent use.
type Cache struct {
	raw  RawAllocator
	cfg  CacheConfig
	mu   sync.Mutex
	st   cacheState // guarded by mu
	hint func(int64, Class) string
}

type cacheState struct {
	small, large freeList
	segments     map[*segment]struct{}
	ordered      []pendingFree // FreeAfter blocks whose events have not passed
	nextSeg      int64
	stats        CacheStats
}

type pendingFree struct {
	b  *Block
	ev kernels.Event
}

type segment struct {
	id    int64
	buf   kernels.Buffer
	size  int64
	small bool
	class Class // class of the request that created it
	first *Block
}

// Block is memory handed out by Cache.Alloc: a range of a segment. The
// caller owns it until Free or FreeAfter.
type Block struct {
	seg        *segment
	off, size  int64 // byte range in the segment (size is rounded)
	req        int64 // requested bytes
	class      Class
	free       bool
	freeing    bool   // counted as freed, not yet reusable (FreeAfter)
	prev, next *Block // neighbours in the segment, by address
}

// Size is the number of bytes requested for the block.
func (b *Block) Size() int64 { return b.req }

// Class is the tensor class the block was allocated for.
func (b *Block) Class() Class { return b.class }

// Tensor returns a view of n elements of dtype dt at the start of the block.
// It panics if they do not fit in the requested size.
func (b *Block) Tensor(dt kernels.DType, n int) kernels.Tensor {
	if int64(n)*int64(dt.Size()) > b.req {
		panic(fmt.Sprintf("offload: tensor of %d %s does not fit in a block of %d bytes", n, dt, b.req))
	}
	return kernels.View(b.seg.buf, b.off, dt, n)
}

// Buffer returns the backend buffer when the block is a whole segment (as
// every block of a Whole cache is); it panics otherwise.
func (b *Block) Buffer() kernels.Buffer {
	if b.off != 0 || b.size != b.seg.size {
		panic("offload: Buffer of a block that is not a whole segment (use CacheConfig.Whole)")
	}
	return b.seg.buf
}

// Slice returns a view of n elements of dtype dt at byte offset off within
// the block, for packing several tensors into one block (llm.c style: one
// allocation for all of a layer's parameters).
func (b *Block) Slice(off int64, dt kernels.DType, n int) kernels.Tensor {
	if off < 0 || off+int64(n)*int64(dt.Size()) > b.req {
		panic(fmt.Sprintf("offload: view [%d, %d) outside a block of %d bytes", off, off+int64(n)*int64(dt.Size()), b.req))
	}
	return kernels.View(b.seg.buf, b.off+off, dt, n)
}

// ClassStats are the statistics of one tensor class.
type ClassStats struct {
	Allocated int64 // bytes in live blocks (rounded sizes)
	Peak      int64 // high-water mark of Allocated
	Reserved  int64 // bytes of segments created for this class's requests
	Blocks    int64 // live blocks
	Allocs    int64 // successful Alloc calls
	Frees     int64
}

// CacheStats is a snapshot of a Cache's statistics.
type CacheStats struct {
	Limit int64 // the budget, 0 if none
	// Source names whose allocations these are in MemorySummary's title
	// ("" is the offload device cache).
	Source        string
	Allocated     int64 // bytes in live blocks (rounded sizes)
	Requested     int64 // bytes asked for by live blocks
	Reserved      int64 // bytes of all segments
	PeakAllocated int64
	PeakReserved  int64
	FreeBytes     int64 // Reserved - Allocated: cached, reusable
	LargestFree   int64 // the largest free block
	// Fragmentation is 1 - LargestFree/FreeBytes: 0 when the free memory
	// is one block (or there is none), near 1 when it is scattered in
	// pieces too small to serve a large request.
	Fragmentation float64

	Allocs, Frees                int64 // Alloc and Free calls that succeeded
	CacheHits                    int64 // allocations served without a new segment
	SegmentAllocs, SegmentFrees  int64 // backend Alloc and Free calls
	Splits, Merges               int64
	BudgetFailures               int64 // Alloc calls refused
	Segments, FreeBlocks, Blocks int   // current counts (Blocks: live)

	ByClass [numClasses]ClassStats
}

// NewCache returns a caching allocator over raw.
func NewCache(raw RawAllocator, cfg CacheConfig) *Cache {
	c := &Cache{raw: raw, cfg: cfg, hint: cfg.Hint}
	c.st.segments = map[*segment]struct{}{}
	c.st.stats.Limit = cfg.Limit
	return c
}

// SetHint replaces the planner hint used in budget errors.
func (c *Cache) SetHint(h func(requested int64, class Class) string) {
	c.mu.Lock()
	c.hint = h
	c.mu.Unlock()
}

func roundUp(n, to int64) int64 { return (n + to - 1) / to * to }

// Alloc returns a block of at least n bytes for a tensor of class cl. It
// fails with a *BudgetError (wrapping ErrBudget and kernels.ErrOutOfMemory)
// when neither the cache nor a new segment within the budget can serve it.
// The memory is not zeroed when it is reused.
func (c *Cache) Alloc(n int64, cl Class) (*Block, error) {
	if n <= 0 {
		return nil, fmt.Errorf("offload: alloc of %d bytes for %s", n, cl)
	}
	if cl >= numClasses {
		return nil, fmt.Errorf("offload: alloc for unknown %s", cl)
	}
	size := roundUp(n, blockAlign)
	small := size <= smallMax && !c.cfg.Whole

	c.mu.Lock()
	defer c.mu.Unlock()
	c.processOrderedLocked()
	fl := &c.st.large
	if small {
		fl = &c.st.small
	}
	take := func() *Block {
		if c.cfg.Whole {
			return fl.takeExact(size)
		}
		return fl.takeBestFit(size)
	}
	b := take()
	if b == nil && c.waitOrderedLocked(func(o *Block) bool { return !c.cfg.Whole || o.size == size }) {
		// A block freed in order is still in use: wait for it rather
		// than take new memory (as if it had been freed at once).
		b = take()
	}
	var seg *segment
	var err error
	if b == nil {
		seg, err = c.newSegmentLocked(size, small, cl)
		if seg == nil && c.waitOrderedLocked(nil) {
			// Over the budget: with every block freed in order back,
			// one may serve, or their segments make room.
			if b = take(); b == nil {
				seg, err = c.newSegmentLocked(size, small, cl)
			}
		}
	}
	switch {
	case b != nil:
		c.st.stats.CacheHits++
	case seg == nil:
		c.st.stats.BudgetFailures++
		return nil, c.budgetErrorLocked(n, cl, err)
	default:
		b = seg.first
	}
	if !c.cfg.Whole {
		c.splitLocked(b, size, fl)
	}
	b.free = false
	b.req = n
	b.class = cl
	s := &c.st.stats
	s.Allocs++
	s.Allocated += b.size
	s.Requested += n
	s.Blocks++
	s.PeakAllocated = max(s.PeakAllocated, s.Allocated)
	cs := &s.ByClass[cl]
	cs.Allocated += b.size
	cs.Peak = max(cs.Peak, cs.Allocated)
	cs.Blocks++
	cs.Allocs++
	return b, nil
}

// splitLocked cuts b down to size and returns the rest to fl.
func (c *Cache) splitLocked(b *Block, size int64, fl *freeList) {
	rest := b.size - size
	if (b.seg.small && rest < blockAlign) || (!b.seg.small && rest <= splitMin) {
		return
	}
	nb := &Block{seg: b.seg, off: b.off + size, size: rest, free: true, prev: b, next: b.next}
	if b.next != nil {
		b.next.prev = nb
	}
	b.next = nb
	b.size = size
	fl.insert(nb)
	c.st.stats.Splits++
}

// newSegmentLocked takes a segment for a request of size bytes from the
// backend, first releasing cached segments if the budget requires it.
func (c *Cache) newSegmentLocked(size int64, small bool, cl Class) (*segment, error) {
	segSize := size
	switch {
	case c.cfg.Whole:
	case small:
		segSize = smallSegment
	case size <= midMax:
		segSize = midSegment
	default:
		segSize = roundUp(size, largeRound)
	}
	fits := func(n int64) bool { return c.cfg.Limit == 0 || c.st.stats.Reserved+n <= c.cfg.Limit }
	if !fits(segSize) {
		c.releaseFreeSegmentsLocked()
	}
	if !fits(segSize) && !small {
		segSize = size // an exact segment may still fit
	}
	if !fits(segSize) {
		return nil, nil
	}
	buf, err := c.raw.Alloc(segSize, "offload/"+cl.String())
	if err != nil && errors.Is(err, kernels.ErrOutOfMemory) {
		c.releaseFreeSegmentsLocked()
		buf, err = c.raw.Alloc(segSize, "offload/"+cl.String())
	}
	if err != nil {
		return nil, err
	}
	c.st.nextSeg++
	seg := &segment{id: c.st.nextSeg, buf: buf, size: segSize, small: small, class: cl}
	seg.first = &Block{seg: seg, size: segSize, free: true}
	c.st.segments[seg] = struct{}{}
	s := &c.st.stats
	s.SegmentAllocs++
	s.Segments++
	s.Reserved += segSize
	s.PeakReserved = max(s.PeakReserved, s.Reserved)
	s.ByClass[cl].Reserved += segSize
	return seg, nil
}

// releaseFreeSegmentsLocked returns every wholly free segment to the backend.
func (c *Cache) releaseFreeSegmentsLocked() {
	for seg := range c.st.segments {
		b := seg.first
		if !b.free || b.next != nil {
			continue
		}
		if seg.small {
			c.st.small.remove(b)
		} else {
			c.st.large.remove(b)
		}
		delete(c.st.segments, seg)
		c.raw.Free(seg.buf)
		s := &c.st.stats
		s.SegmentFrees++
		s.Segments--
		s.Reserved -= seg.size
		s.ByClass[seg.class].Reserved -= seg.size
	}
}

func (c *Cache) budgetErrorLocked(n int64, cl Class, cause error) error {
	s := &c.st.stats
	e := &BudgetError{
		Tier: TierDevice, Class: cl, Requested: n, Limit: c.cfg.Limit,
		Reserved: s.Reserved, Allocated: s.Allocated, ByClass: map[Class]int64{},
		LargestFree: max(c.st.small.largest(), c.st.large.largest()), Cause: cause,
	}
	var oom *kernels.OOMError
	if e.Limit == 0 && errors.As(cause, &oom) {
		e.Limit = oom.Limit
	}
	for i, cs := range s.ByClass {
		if cs.Allocated > 0 {
			e.ByClass[Class(i)] = cs.Allocated
		}
	}
	if c.hint != nil {
		e.Hint = c.hint(n, cl)
	}
	return e
}

// Free returns b to the cache. The caller must ensure that no queued work
// still uses it (see FreeAfter). Freeing a block twice panics.
func (c *Cache) Free(b *Block) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.freeLocked(b)
}

// FreeAfter frees b as of now for the cache's accounting (its
// statistics, and so the peak, follow the order of the frees and
// allocations), while its memory is reused only once ev has passed: an
// allocation that finds no free block waits for such a block (of its
// size, in Whole mode) before it takes new memory, and for all of them
// before it fails on the budget. A caller that frees in a program's
// order so gets the program's peak without waiting for the device at
// every free.
func (c *Cache) FreeAfter(b *Block, ev kernels.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ev == nil {
		c.freeLocked(b)
		return
	}
	// Not asked whether ev has passed (a query of the device per free):
	// the next allocation asks, oldest first.
	c.accountFreeLocked(b)
	c.st.ordered = append(c.st.ordered, pendingFree{b, ev})
}

// waitOrderedLocked returns to the free lists a FreeAfter block that
// match accepts, one whose event has passed if there is one, else the
// oldest after waiting for it, or, with match nil, all of them after
// waiting for each; it reports whether there was one.
func (c *Cache) waitOrderedLocked(match func(*Block) bool) bool {
	if match != nil {
		for i, o := range c.st.ordered {
			if match(o.b) && o.ev.Done() {
				c.insertFreeLocked(o.b)
				c.st.ordered = slices.Delete(c.st.ordered, i, i+1)
				return true
			}
		}
	}
	for i, o := range c.st.ordered {
		if match != nil && !match(o.b) {
			continue
		}
		if match == nil {
			for _, o := range c.st.ordered {
				_ = o.ev.Synchronize(context.Background()) // a failed queue fails its own next call
				c.insertFreeLocked(o.b)
			}
			clear(c.st.ordered)
			c.st.ordered = c.st.ordered[:0]
			return true
		}
		_ = o.ev.Synchronize(context.Background())
		c.insertFreeLocked(o.b)
		c.st.ordered = slices.Delete(c.st.ordered, i, i+1)
		return true
	}
	return false
}

// processOrderedLocked returns the FreeAfter blocks whose events have
// passed to the free lists, oldest first, up to the first that has not
// (one query of the device for a block still in use).
func (c *Cache) processOrderedLocked() {
	n := 0
	for _, o := range c.st.ordered {
		if !o.ev.Done() {
			break
		}
		c.insertFreeLocked(o.b)
		n++
	}
	if n > 0 {
		c.st.ordered = slices.Delete(c.st.ordered, 0, n)
	}
}

func (c *Cache) freeLocked(b *Block) {
	c.accountFreeLocked(b)
	c.insertFreeLocked(b)
}

// accountFreeLocked counts b as freed in the statistics.
func (c *Cache) accountFreeLocked(b *Block) {
	if b.free || b.freeing {
		panic("offload: block freed twice")
	}
	b.freeing = true
	s := &c.st.stats
	s.Frees++
	s.Allocated -= b.size
	s.Requested -= b.req
	s.Blocks--
	cs := &s.ByClass[b.class]
	cs.Allocated -= b.size
	cs.Blocks--
	cs.Frees++
}

// insertFreeLocked returns b, counted as freed, to its free list, merged
// with its free neighbours.
func (c *Cache) insertFreeLocked(b *Block) {
	b.freeing = false
	s := &c.st.stats
	fl := &c.st.large
	if b.seg.small {
		fl = &c.st.small
	}
	b.free = true
	b.req = 0
	if p := b.prev; p != nil && p.free {
		fl.remove(p)
		p.size += b.size
		p.next = b.next
		if b.next != nil {
			b.next.prev = p
		}
		b = p
		s.Merges++
	}
	if nx := b.next; nx != nil && nx.free {
		fl.remove(nx)
		b.size += nx.size
		b.next = nx.next
		if nx.next != nil {
			nx.next.prev = b
		}
		s.Merges++
	}
	fl.insert(b)
}

// EmptyCache returns every wholly free segment to the backend (after
// completing FreeAfter calls whose events have passed).
func (c *Cache) EmptyCache() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.processOrderedLocked()
	c.releaseFreeSegmentsLocked()
}

// ResetPeak sets the peaks (overall and per class) to the current values.
func (c *Cache) ResetPeak() {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := &c.st.stats
	s.PeakAllocated, s.PeakReserved = s.Allocated, s.Reserved
	for i := range s.ByClass {
		s.ByClass[i].Peak = s.ByClass[i].Allocated
	}
}

// Stats returns a snapshot of the statistics.
func (c *Cache) Stats() CacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.st.stats
	s.FreeBytes = s.Reserved - s.Allocated
	s.LargestFree = max(c.st.small.largest(), c.st.large.largest())
	s.FreeBlocks = len(c.st.small.blocks) + len(c.st.large.blocks)
	if s.FreeBytes > 0 {
		s.Fragmentation = 1 - float64(s.LargestFree)/float64(s.FreeBytes)
	}
	return s
}

// Close returns every segment to the backend. Blocks still live become
// invalid; Close reports how many there were.
func (c *Cache) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	live := c.st.stats.Blocks
	for seg := range c.st.segments {
		c.raw.Free(seg.buf)
	}
	c.st = cacheState{segments: map[*segment]struct{}{}}
	c.st.stats.Limit = c.cfg.Limit
	if live > 0 {
		return fmt.Errorf("offload: cache closed with %d blocks still allocated", live)
	}
	return nil
}

// freeList holds free blocks sorted by (size, segment, offset) for best fit.
type freeList struct{ blocks []*Block }

func less(a, b *Block) bool {
	if a.size != b.size {
		return a.size < b.size
	}
	if a.seg.id != b.seg.id {
		return a.seg.id < b.seg.id
	}
	return a.off < b.off
}

func (f *freeList) search(b *Block) int {
	return sort.Search(len(f.blocks), func(i int) bool { return !less(f.blocks[i], b) })
}

func (f *freeList) insert(b *Block) {
	i := f.search(b)
	f.blocks = append(f.blocks, nil)
	copy(f.blocks[i+1:], f.blocks[i:])
	f.blocks[i] = b
}

func (f *freeList) remove(b *Block) {
	i := f.search(b)
	if i == len(f.blocks) || f.blocks[i] != b {
		panic("offload: free list corrupted")
	}
	f.blocks = append(f.blocks[:i], f.blocks[i+1:]...)
}

// takeExact removes and returns a free block of exactly size bytes.
func (f *freeList) takeExact(size int64) *Block {
	i := sort.Search(len(f.blocks), func(i int) bool { return f.blocks[i].size >= size })
	if i == len(f.blocks) || f.blocks[i].size != size {
		return nil
	}
	b := f.blocks[i]
	f.blocks = append(f.blocks[:i], f.blocks[i+1:]...)
	return b
}

// takeBestFit removes and returns the smallest free block of at least size.
func (f *freeList) takeBestFit(size int64) *Block {
	i := sort.Search(len(f.blocks), func(i int) bool { return f.blocks[i].size >= size })
	if i == len(f.blocks) {
		return nil
	}
	b := f.blocks[i]
	f.blocks = append(f.blocks[:i], f.blocks[i+1:]...)
	return b
}

func (f *freeList) largest() int64 {
	if len(f.blocks) == 0 {
		return 0
	}
	return f.blocks[len(f.blocks)-1].size
}
