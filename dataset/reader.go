package dataset

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/edsrzf/mmap-go"
	"github.com/klauspost/compress/zstd"
)

// Dataset is an opened dataset: the manifest plus every shard file mapped read-only.
//
// Concurrency contract: every method is safe for concurrent use by any number of
// goroutines (each Sample call with its own dst), Close included. Close waits for Sample,
// ReadSample, Advise and Verify calls in progress to return, then unmaps the shards; a
// Verify in progress stops early with ErrClosed. After Close, Sample, ReadSample and
// Verify return ErrClosed, Advise does nothing, and the accessors keep working.
//
// Buffer lifetimes: for uncompressed datasets Sample returns a slice of the mapping (zero
// copy), valid only until Close: reading it after Close faults (SIGSEGV), so a reader
// that may race with Close must use ReadSample, which always copies into dst. The slice
// must not be written to (the mapping is read-only and a write faults). For zstd datasets
// the result of Sample aliases dst and is valid until dst is reused.
type Dataset struct {
	dir        string
	man        *Manifest
	sampleSize int
	compressed bool
	shards     []*shard
	firsts     []int64 // FirstSample of each shard, ascending
	cache      *chunkCache

	// life guards the mappings: readers hold it in read mode while they touch mapped
	// memory; Close takes it in write mode.
	life struct {
		sync.RWMutex
		closed bool
	}
	closing atomic.Bool // set when Close starts, so that a long Verify gives way
}

// OpenOptions configures OpenWithOptions. Zero fields take the documented defaults.
type OpenOptions struct {
	// ChunkCache is the number of decoded chunks a zstd dataset keeps in memory, shared
	// by all readers; each takes chunk_size bytes (1 MiB by default), and chunks in use by
	// readers may add one per concurrent Sample. Default 2*GOMAXPROCS+2. Ignored for
	// uncompressed datasets. More helps a shuffle whose samples come from more chunks
	// at once than the default holds.
	ChunkCache int
}

// withDefaults returns o with zero fields set to their defaults.
func (o OpenOptions) withDefaults() OpenOptions {
	if o.ChunkCache == 0 {
		o.ChunkCache = 2*runtime.GOMAXPROCS(0) + 2
	}
	return o
}

// Validate reports every problem of the options (after defaults) at once, or nil.
func (o OpenOptions) Validate() error {
	o = o.withDefaults()
	if o.ChunkCache < 1 {
		return fmt.Errorf("dataset: chunk cache %d must be positive", o.ChunkCache)
	}
	return nil
}

// shard is one mapped shard file.
type shard struct {
	idx      int
	path     string
	f        *os.File
	m        mmap.MMap
	l        *shardLayout
	first    int64
	verified []atomic.Uint64 // bit c set: chunk c's crc was checked and matched
}

// Open maps the dataset in dir and validates manifest + every shard header/footer against
// the file (magic, version, sizes, index checksum, agreement with the manifest). Chunk
// data is not read: chunk checksums are checked on first touch, or by Verify. Errors name
// the file, and for shard problems are a *ShardError.
func Open(dir string) (*Dataset, error) {
	return OpenWithOptions(dir, OpenOptions{})
}

// OpenWithOptions is Open with options (see OpenOptions).
func OpenWithOptions(dir string, opts OpenOptions) (*Dataset, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	man, err := ReadManifest(dir)
	if err != nil {
		return nil, err
	}
	d := &Dataset{dir: dir, man: man, sampleSize: man.Schema.SampleSize(),
		compressed: man.Compression == CompressionZstd}
	for i := range man.Shards {
		s, err := openShard(dir, i, man)
		if err != nil {
			d.Close()
			return nil, err
		}
		d.shards = append(d.shards, s)
		d.firsts = append(d.firsts, s.first)
	}
	if d.compressed {
		d.cache = newChunkCache(opts.ChunkCache)
	}
	return d, nil
}

func openShard(dir string, i int, man *Manifest) (_ *shard, err error) {
	info := man.Shards[i]
	path := filepath.Join(dir, info.Name)
	f, err := os.Open(path)
	if err != nil {
		return nil, shardErr(path, -1, -1, err)
	}
	s := &shard{idx: i, path: path, f: f, first: info.FirstSample}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	st, err := f.Stat()
	if err != nil {
		return nil, shardErr(path, -1, -1, err)
	}
	switch {
	case st.Size() < info.Size:
		return nil, shardErr(path, -1, st.Size(), truncatedf("file is %d bytes, manifest says %d", st.Size(), info.Size))
	case st.Size() > info.Size:
		return nil, shardErr(path, -1, info.Size, formatf("file is %d bytes, manifest says %d", st.Size(), info.Size))
	}
	if s.m, err = mmap.Map(f, mmap.RDONLY, 0); err != nil {
		return nil, shardErr(path, -1, -1, fmt.Errorf("mmap: %w", err))
	}
	if s.l, err = parseShard(s.m); err != nil {
		return nil, shardErr(path, -1, -1, err)
	}
	if err := checkAgainstManifest(s.l, i, man); err != nil {
		return nil, shardErr(path, -1, -1, err)
	}
	s.verified = make([]atomic.Uint64, (len(s.l.chunks)+63)/64)
	return s, nil
}

// checkAgainstManifest compares a parsed shard with its manifest entry and schema.
func checkAgainstManifest(l *shardLayout, i int, man *Manifest) error {
	info, sc := man.Shards[i], man.Schema
	h, t := l.hdr, l.trl
	comp := uint8(codeNone)
	if man.Compression == CompressionZstd {
		comp = codeZstd
	}
	bad := func(what string, file, manifest any) error {
		return formatf("%s is %v in the shard, %v in the manifest", what, file, manifest)
	}
	switch {
	case h.Kind != kindCode(sc.Kind):
		return bad("kind code", h.Kind, sc.Kind)
	case h.Compression != comp:
		return bad("compression code", h.Compression, man.Compression)
	case int(h.TokenSize) != sc.TokenSize():
		return bad("token size", h.TokenSize, sc.TokenSize())
	case int(h.SampleSize) != sc.SampleSize() || int(h.Stride) != sc.stride():
		return bad("sample size/stride", fmt.Sprint(h.SampleSize, "/", h.Stride), fmt.Sprint(sc.SampleSize(), "/", sc.stride()))
	case int(h.ChunkSize) != man.ChunkSize:
		return bad("chunk size", h.ChunkSize, man.ChunkSize)
	case int(h.ShardIndex) != i:
		return bad("shard index", h.ShardIndex, i)
	case int64(h.FirstSample) != info.FirstSample:
		return bad("first sample", h.FirstSample, info.FirstSample)
	case int64(t.Samples) != info.Samples:
		return bad("sample count", t.Samples, info.Samples)
	case int(t.Chunks) != info.Chunks:
		return bad("chunk count", t.Chunks, info.Chunks)
	case int64(t.RawBytes) != info.RawBytes:
		return bad("raw bytes", t.RawBytes, info.RawBytes)
	case int64(t.IndexOffset)-headerSize != info.StoredBytes:
		return bad("stored bytes", int64(t.IndexOffset)-headerSize, info.StoredBytes)
	}
	return nil
}

func (s *shard) close() error {
	var errs []error
	if s.m != nil {
		errs = append(errs, s.m.Unmap())
		s.m = nil
	}
	if s.f != nil {
		errs = append(errs, s.f.Close())
		s.f = nil
	}
	return errors.Join(errs...)
}

// Close waits for the Sample, ReadSample, Advise and Verify calls in progress, then unmaps
// and closes every shard. Slices of the mapping returned by Sample become invalid. Later
// calls of Close return nil.
func (d *Dataset) Close() error {
	d.closing.Store(true)
	d.life.Lock()
	defer d.life.Unlock()
	if d.life.closed {
		return nil
	}
	d.life.closed = true
	var errs []error
	for _, s := range d.shards {
		errs = append(errs, s.close())
	}
	d.shards = nil
	d.firsts = nil
	return errors.Join(errs...)
}

// Dir is the dataset directory given to Open.
func (d *Dataset) Dir() string { return d.dir }

// Manifest returns the parsed manifest. Callers must not modify it.
func (d *Dataset) Manifest() *Manifest { return d.man }

// Schema returns the dataset's schema.
func (d *Dataset) Schema() Schema { return d.man.Schema }

// Len is the number of samples.
func (d *Dataset) Len() int64 { return d.man.Samples }

// SampleSize is the byte size of every sample; 0 for bytes datasets.
func (d *Dataset) SampleSize() int { return d.sampleSize }

// locate returns the shard holding sample i and i's raw byte range within it.
func (d *Dataset) locate(i int64) (*shard, int64, int64, error) {
	if i < 0 || i >= d.man.Samples {
		return nil, 0, 0, fmt.Errorf("dataset: sample %d out of range [0, %d)", i, d.man.Samples)
	}
	s := d.shards[d.shardIndex(i)]
	j := i - s.first
	if s.l.offsets != nil {
		a, b := s.l.recordBounds(j)
		return s, a, b, nil
	}
	a := j * int64(s.l.hdr.Stride)
	return s, a, a + int64(d.sampleSize), nil
}

// shardIndex returns the index of the shard holding sample i (0 <= i < Len).
func (d *Dataset) shardIndex(i int64) int {
	lo, hi := 0, len(d.firsts) // invariant: firsts[lo] <= i < firsts[hi] (hi = len: +inf)
	for hi-lo > 1 {
		m := int(uint(lo+hi) >> 1)
		if d.firsts[m] <= i {
			lo = m
		} else {
			hi = m
		}
	}
	return lo
}

// acquire takes the read side of d.life; false (and no lock held) after Close.
func (d *Dataset) acquire() bool {
	d.life.RLock()
	if d.life.closed {
		d.life.RUnlock()
		return false
	}
	return true
}

// Sample returns sample i. For uncompressed shards the result aliases the mmap (zero copy;
// valid until Close; read-only). For compressed shards the bytes are written into dst
// (grown if too small) and the result aliases dst. Safe for concurrent use with distinct
// dst buffers. A checksum mismatch in any chunk the sample touches returns a *ShardError
// naming the shard file and chunk, every time that chunk is touched. After Close it
// returns ErrClosed.
func (d *Dataset) Sample(i int64, dst []byte) ([]byte, error) {
	if !d.acquire() {
		return nil, ErrClosed
	}
	got, err := d.sample(i, dst)
	d.life.RUnlock() // sample does not panic on any input (FuzzParseShard)
	return got, err
}

// ReadSample is Sample, except that the result always lies in dst (grown if too small),
// also for uncompressed datasets: it stays valid after Close. Use it where Close may race
// with readers.
func (d *Dataset) ReadSample(i int64, dst []byte) ([]byte, error) {
	if !d.acquire() {
		return nil, ErrClosed
	}
	defer d.life.RUnlock()
	got, err := d.sample(i, dst)
	if err != nil || d.compressed {
		return got, err
	}
	if cap(dst) < len(got) {
		dst = make([]byte, len(got))
	}
	dst = dst[:len(got)]
	copy(dst, got)
	return dst, nil
}

// sample is Sample without the Close guard; the caller holds d.life in read mode.
func (d *Dataset) sample(i int64, dst []byte) ([]byte, error) {
	s, a, b, err := d.locate(i)
	if err != nil {
		return nil, err
	}
	if a == b {
		return dst[:0], nil
	}
	cs := int64(s.l.hdr.ChunkSize)
	c0, c1 := int(a/cs), int((b-1)/cs)
	if !d.compressed {
		for c := c0; c <= c1; c++ {
			if err := s.checkChunk(c); err != nil {
				return nil, err
			}
		}
		return s.m[headerSize+a : headerSize+b : headerSize+b], nil
	}
	n := int(b - a)
	if cap(dst) < n {
		dst = make([]byte, n)
	}
	dst = dst[:n]
	out := dst
	for c := c0; c <= c1; c++ {
		lo, hi := max(a, int64(c)*cs)-int64(c)*cs, min(b, int64(c+1)*cs)-int64(c)*cs
		e := s.l.chunks[c]
		if e.Flags&chunkFlagZstd == 0 {
			if err := s.checkChunk(c); err != nil {
				return nil, err
			}
			out = out[copy(out, s.m[int64(e.Offset)+lo:int64(e.Offset)+hi]):]
			continue
		}
		ent, err := d.cache.get(chunkKey{int32(s.idx), int32(c)}, s.decodeChunk)
		if err != nil {
			return nil, err
		}
		out = out[copy(out, ent.buf[lo:hi]):]
		d.cache.release(ent)
	}
	return dst, nil
}

// checkChunk verifies chunk c's checksum the first time it is touched.
func (s *shard) checkChunk(c int) error {
	w, bit := &s.verified[c/64], uint64(1)<<(c%64)
	if w.Load()&bit != 0 {
		return nil
	}
	if err := s.checkCRC(c); err != nil {
		return err
	}
	w.Or(bit)
	return nil
}

func (s *shard) stored(c int) []byte {
	e := s.l.chunks[c]
	return s.m[e.Offset : e.Offset+uint64(e.StoredLen)]
}

func (s *shard) checkCRC(c int) error {
	e := s.l.chunks[c]
	if got := crc32c(s.stored(c)); got != e.CRC {
		return shardErr(s.path, c, int64(e.Offset), checksumf("stored %08x, computed %08x", e.CRC, got))
	}
	return nil
}

// decodeChunk checks chunk c and decodes it into dst (reusing its capacity).
func (s *shard) decodeChunk(c int, dst []byte) ([]byte, error) {
	if err := s.checkCRC(c); err != nil {
		return dst, err
	}
	e := s.l.chunks[c]
	n := int(e.RawLen)
	if e.Flags&chunkFlagZstd == 0 {
		return append(dst[:0], s.stored(c)...), nil
	}
	if cap(dst) < n {
		dst = make([]byte, 0, n)
	}
	out, err := zstdDecoder().DecodeAll(s.stored(c), dst[:0:n])
	if err == nil && len(out) != n {
		err = fmt.Errorf("decoded %d bytes, want %d", len(out), n)
	}
	if err != nil {
		return dst, shardErr(s.path, c, int64(e.Offset), formatWrap("zstd", err))
	}
	if &out[:1][0] == &dst[:1][0] {
		out = dst[:n] // keep dst's full capacity for the next, possibly larger, chunk
	}
	return out, nil
}

var (
	decOnce sync.Once
	dec     *zstd.Decoder
)

// zstdDecoderOptions configure the process-wide decoder: a pool of GOMAXPROCS block
// decoders, so that DecodeAll runs concurrently; output capped by cap(dst); no content
// checksum checks (the writer stores none, and every chunk has our crc32c); buffers kept
// between calls rather than freed (lowmem off). BenchmarkDecode compares the variants.
var zstdDecoderOptions = []zstd.DOption{
	zstd.WithDecoderConcurrency(0),
	zstd.WithDecoderMaxMemory(MaxChunkSize),
	zstd.WithDecodeAllCapLimit(true),
	zstd.IgnoreChecksum(true),
	zstd.WithDecoderLowmem(false),
}

// zstdDecoder is the process-wide decoder. Its DecodeAll is safe for concurrent use, so
// decoding allocates nothing after warm-up when dst has room.
func zstdDecoder() *zstd.Decoder {
	decOnce.Do(func() {
		var err error
		dec, err = zstd.NewReader(nil, zstdDecoderOptions...)
		if err != nil {
			panic("dataset: zstd decoder: " + err.Error()) // only on invalid options
		}
	})
	return dec
}

// Advise hints the kernel that samples [from, to) will be read soon (madvise WILLNEED on
// the stored bytes). It is a no-op on unsupported platforms; out-of-range bounds are
// clamped.
func (d *Dataset) Advise(from, to int64) {
	from, to = max(from, 0), min(to, d.man.Samples)
	if from >= to || !d.acquire() {
		return
	}
	defer d.life.RUnlock()
	for k := d.shardIndex(from); k < len(d.shards) && d.shards[k].first < to; k++ {
		s := d.shards[k]
		n := s.l.trl.Samples
		if n == 0 {
			continue
		}
		j0 := max(from-s.first, 0)
		j1 := min(to-s.first, int64(n)) - 1
		_, a, _, _ := d.locate(s.first + j0)
		_, _, b, _ := d.locate(s.first + j1)
		if a >= b {
			continue
		}
		cs := int64(s.l.hdr.ChunkSize)
		e0, e1 := s.l.chunks[a/cs], s.l.chunks[(b-1)/cs]
		adviseWillNeed(s.m, int64(e0.Offset), int64(e1.Offset)+int64(e1.StoredLen))
	}
}

// Verify checks every chunk checksum (decoding zstd chunks to check their size) and the
// whole-file crc32c of every shard against the manifest. The first failure is returned as
// a *ShardError. progress, if not nil, is called after each chunk with stored bytes done
// and total. Verify honours ctx cancellation between chunks.
func (d *Dataset) Verify(ctx context.Context, progress func(done, total int64)) error {
	total, done := d.man.StoredBytes, int64(0)
	var scratch []byte
	for k := range d.man.Shards {
		var fileCRC uint32
		for c := 0; ; c++ {
			if err := ctx.Err(); err != nil {
				return err
			}
			// The Close guard is taken per chunk, so that Close waits at most one chunk
			// and progress runs without it.
			if d.closing.Load() || !d.acquire() {
				return ErrClosed
			}
			n, last, err := d.verifyStep(k, c, &fileCRC, &scratch)
			d.life.RUnlock()
			if err != nil {
				return err
			}
			if last {
				break
			}
			done += n
			if progress != nil {
				progress(done, total)
			}
		}
	}
	return nil
}

// verifyStep checks chunk c of shard k and adds it to the shard's file crc; at c = the
// chunk count it checks the file crc instead and reports last. It returns the chunk's
// stored bytes. The caller holds d.life in read mode.
func (d *Dataset) verifyStep(k, c int, fileCRC *uint32, scratch *[]byte) (n int64, last bool, err error) {
	s := d.shards[k]
	if c == 0 {
		*fileCRC = crc32Update(0, s.m[:headerSize])
	}
	if c == len(s.l.chunks) {
		crc := crc32Update(*fileCRC, s.m[s.l.trl.IndexOffset:])
		if want := d.man.Shards[k].CRC32C; crc != want {
			return 0, true, shardErr(s.path, -1, -1, checksumf("file crc32c %08x, manifest says %08x", crc, want))
		}
		return 0, true, nil
	}
	e := s.l.chunks[c]
	if d.compressed && e.Flags&chunkFlagZstd != 0 {
		if *scratch, err = s.decodeChunk(c, *scratch); err != nil {
			return 0, false, err
		}
	} else if err := s.checkCRC(c); err != nil {
		return 0, false, err
	}
	s.verified[c/64].Or(1 << (c % 64))
	*fileCRC = crc32Update(*fileCRC, s.stored(c))
	return int64(e.StoredLen), false, nil
}

// chunkCache is a small LRU of decoded chunks shared by a Dataset's readers. Entries are
// reference counted: an entry evicted while in use is recycled only when its last user
// releases it, so a returned buffer is never overwritten under a reader. At most max
// entries are cached; buffers in use by readers may add up to one per concurrent Sample.
// Entries and their buffers are recycled, so after warm-up get allocates nothing.
type chunkCache struct {
	max int
	mu  struct {
		sync.Mutex
		m      map[chunkKey]*cacheEntry
		lru    cacheEntry    // list sentinel: lru.next is the most recently used entry
		free   []*cacheEntry // evicted entries nobody uses, with their buffers
		loaded sync.Cond     // broadcast when a load finishes
	}
}

type chunkKey struct{ shard, chunk int32 }

type cacheEntry struct {
	key chunkKey
	buf []byte // written only by the loader while loading; read-only after
	// guarded by chunkCache.mu
	err        error
	loading    bool
	refs       int
	evicted    bool // not in the map and the list
	prev, next *cacheEntry
}

func newChunkCache(max int) *chunkCache {
	c := &chunkCache{max: max}
	c.mu.m = make(map[chunkKey]*cacheEntry, max+1)
	c.mu.lru.prev, c.mu.lru.next = &c.mu.lru, &c.mu.lru
	c.mu.loaded.L = &c.mu.Mutex
	return c
}

// get returns the decoded chunk for key, loading it with load on a miss (one load per
// key at a time; other readers of the key wait for it). The caller must release a
// successful result.
func (c *chunkCache) get(key chunkKey, load func(chunk int, dst []byte) ([]byte, error)) (*cacheEntry, error) {
	c.mu.Lock()
	if e, ok := c.mu.m[key]; ok {
		e.refs++
		c.unlinkLocked(e)
		c.pushFrontLocked(e)
		for e.loading {
			c.mu.loaded.Wait()
		}
		if e.err != nil {
			err := e.err
			c.releaseLocked(e)
			c.mu.Unlock()
			return nil, err
		}
		c.mu.Unlock()
		return e, nil
	}
	var e *cacheEntry
	if n := len(c.mu.free); n > 0 {
		e, c.mu.free = c.mu.free[n-1], c.mu.free[:n-1]
		*e = cacheEntry{buf: e.buf[:0]}
	} else {
		e = &cacheEntry{}
	}
	e.key, e.loading, e.refs = key, true, 1
	c.mu.m[key] = e
	c.pushFrontLocked(e)
	if len(c.mu.m) > c.max {
		c.evictLocked(c.mu.lru.prev) // not e: max >= 1 and e is at the front
	}
	buf := e.buf
	c.mu.Unlock()

	buf, err := load(int(key.chunk), buf)

	c.mu.Lock()
	defer c.mu.Unlock()
	e.buf, e.err, e.loading = buf, err, false
	c.mu.loaded.Broadcast()
	if err != nil {
		if !e.evicted {
			c.evictLocked(e) // a corrupted chunk is re-checked (and reported) on every touch
		}
		c.releaseLocked(e)
		return nil, err
	}
	return e, nil
}

func (c *chunkCache) pushFrontLocked(e *cacheEntry) {
	e.prev, e.next = &c.mu.lru, c.mu.lru.next
	e.prev.next, e.next.prev = e, e
}

func (c *chunkCache) unlinkLocked(e *cacheEntry) {
	e.prev.next, e.next.prev = e.next, e.prev
	e.prev, e.next = nil, nil
}

// evictLocked removes e from the map and the list; it is recycled now if unused, else by
// its last release.
func (c *chunkCache) evictLocked(e *cacheEntry) {
	delete(c.mu.m, e.key)
	c.unlinkLocked(e)
	e.evicted = true
	if e.refs == 0 {
		c.recycleLocked(e)
	}
}

func (c *chunkCache) recycleLocked(e *cacheEntry) {
	if len(c.mu.free) < c.max {
		e.err = nil
		c.mu.free = append(c.mu.free, e)
	}
}

// release drops a reference taken by get.
func (c *chunkCache) release(e *cacheEntry) {
	c.mu.Lock()
	c.releaseLocked(e)
	c.mu.Unlock()
}

func (c *chunkCache) releaseLocked(e *cacheEntry) {
	e.refs--
	if e.refs == 0 && e.evicted {
		c.recycleLocked(e)
	}
}
