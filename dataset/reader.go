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
// Concurrency contract: Sample, Advise, Verify and the accessors are safe for concurrent
// use by any number of goroutines (each Sample call with its own dst). Close must not run
// concurrently with any other method, and no method may be called after Close.
//
// Buffer lifetimes: for uncompressed datasets Sample returns a slice of the mapping (zero
// copy), valid until Close; it must not be written to (the mapping is read-only and a write
// faults). For zstd datasets the result aliases dst and is valid until dst is reused.
type Dataset struct {
	dir        string
	man        *Manifest
	sampleSize int
	compressed bool
	shards     []*shard
	firsts     []int64 // FirstSample of each shard, ascending
	cache      *chunkCache
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
		d.cache = newChunkCache(2*runtime.GOMAXPROCS(0) + 2)
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

// Close unmaps and closes every shard. Slices returned by Sample become invalid.
func (d *Dataset) Close() error {
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
	if d.shards == nil {
		return nil, 0, 0, errors.New("dataset: use of closed dataset")
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

// Sample returns sample i. For uncompressed shards the result aliases the mmap (zero copy;
// valid until Close; read-only). For compressed shards the bytes are written into dst
// (grown if too small) and the result aliases dst. Safe for concurrent use with distinct
// dst buffers. A checksum mismatch in any chunk the sample touches returns a *ShardError
// naming the shard file and chunk, every time that chunk is touched.
func (d *Dataset) Sample(i int64, dst []byte) ([]byte, error) {
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
		return shardErr(s.path, c, int64(e.Offset), fmt.Errorf("%w: stored %08x, computed %08x", ErrChecksum, e.CRC, got))
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
		return dst, shardErr(s.path, c, int64(e.Offset), fmt.Errorf("%w: zstd: %v", ErrFormat, err))
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

// zstdDecoder is the process-wide decoder. Its DecodeAll is safe for concurrent use and
// keeps a pool of GOMAXPROCS block decoders, so decoding allocates nothing after warm-up
// when dst has room. Output is capped by cap(dst) (WithDecodeAllCapLimit).
func zstdDecoder() *zstd.Decoder {
	decOnce.Do(func() {
		var err error
		dec, err = zstd.NewReader(nil,
			zstd.WithDecoderConcurrency(0),
			zstd.WithDecoderMaxMemory(MaxChunkSize),
			zstd.WithDecodeAllCapLimit(true))
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
	if from >= to || d.shards == nil {
		return
	}
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
	for k, s := range d.shards {
		fileCRC := crc32Update(0, s.m[:headerSize])
		for c, e := range s.l.chunks {
			if err := ctx.Err(); err != nil {
				return err
			}
			if d.compressed && e.Flags&chunkFlagZstd != 0 {
				var err error
				if scratch, err = s.decodeChunk(c, scratch); err != nil {
					return err
				}
			} else if err := s.checkCRC(c); err != nil {
				return err
			}
			s.verified[c/64].Or(1 << (c % 64))
			fileCRC = crc32Update(fileCRC, s.stored(c))
			done += int64(e.StoredLen)
			if progress != nil {
				progress(done, total)
			}
		}
		fileCRC = crc32Update(fileCRC, s.m[s.l.trl.IndexOffset:])
		if want := d.man.Shards[k].CRC32C; fileCRC != want {
			return shardErr(s.path, -1, -1, fmt.Errorf("%w: file crc32c %08x, manifest says %08x", ErrChecksum, fileCRC, want))
		}
	}
	return nil
}

// chunkCache is a small LRU of decoded chunks shared by a Dataset's readers. Entries are
// reference counted: an entry evicted while in use is recycled only when its last user
// releases it, so a returned buffer is never overwritten under a reader. At most max
// entries are cached; buffers in use by readers may add up to one per concurrent Sample.
type chunkCache struct {
	max int
	mu  struct {
		sync.Mutex
		m     map[chunkKey]*cacheEntry
		clock uint64
		free  [][]byte
	}
}

type chunkKey struct{ shard, chunk int32 }

type cacheEntry struct {
	key   chunkKey
	buf   []byte
	err   error
	ready chan struct{} // closed when buf/err are set
	// guarded by chunkCache.mu
	refs    int
	evicted bool
	used    uint64
}

func newChunkCache(max int) *chunkCache {
	c := &chunkCache{max: max}
	c.mu.m = make(map[chunkKey]*cacheEntry, max+1)
	return c
}

// get returns the decoded chunk for key, loading it with load on a miss (one load per
// key at a time). The caller must release a successful result.
func (c *chunkCache) get(key chunkKey, load func(chunk int, dst []byte) ([]byte, error)) (*cacheEntry, error) {
	c.mu.Lock()
	c.mu.clock++
	if e, ok := c.mu.m[key]; ok {
		e.refs++
		e.used = c.mu.clock
		c.mu.Unlock()
		<-e.ready
		if e.err != nil {
			err := e.err
			c.release(e)
			return nil, err
		}
		return e, nil
	}
	e := &cacheEntry{key: key, ready: make(chan struct{}), refs: 1, used: c.mu.clock}
	c.mu.m[key] = e
	if len(c.mu.m) > c.max {
		c.evictLocked()
	}
	var buf []byte
	if n := len(c.mu.free); n > 0 {
		buf, c.mu.free = c.mu.free[n-1], c.mu.free[:n-1]
	}
	c.mu.Unlock()

	buf, err := load(int(key.chunk), buf)

	c.mu.Lock()
	e.buf, e.err = buf, err
	if err != nil && c.mu.m[key] == e {
		delete(c.mu.m, key) // a corrupted chunk is re-checked (and reported) on every touch
		e.evicted = true
	}
	c.mu.Unlock()
	close(e.ready)
	if err != nil {
		c.release(e)
		return nil, err
	}
	return e, nil
}

// evictLocked drops the least recently used entry.
func (c *chunkCache) evictLocked() {
	var old *cacheEntry
	for _, e := range c.mu.m {
		if old == nil || e.used < old.used {
			old = e
		}
	}
	delete(c.mu.m, old.key)
	old.evicted = true
	if old.refs == 0 {
		c.recycleLocked(old)
	}
}

func (c *chunkCache) recycleLocked(e *cacheEntry) {
	if e.buf != nil && len(c.mu.free) < c.max {
		c.mu.free = append(c.mu.free, e.buf[:0])
	}
	e.buf = nil
}

// release drops a reference taken by get.
func (c *chunkCache) release(e *cacheEntry) {
	c.mu.Lock()
	e.refs--
	if e.refs == 0 && e.evicted {
		c.recycleLocked(e)
	}
	c.mu.Unlock()
}
