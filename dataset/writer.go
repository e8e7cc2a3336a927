package dataset

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sync/errgroup"
)

// WriterOptions configures Create. Zero fields take the documented defaults.
type WriterOptions struct {
	Schema Schema
	// ShardSize is the number of raw (uncompressed) data bytes per shard before the writer
	// rolls to a new shard; default DefaultShardSize (64 MiB). Shards end on sample
	// boundaries, so a bytes shard may exceed it by up to one record.
	ShardSize int64
	// ChunkSize is the number of raw bytes per checksummed chunk; default DefaultChunkSize
	// (1 MiB), at most MaxChunkSize. For records it is rounded down to whole records when a
	// record fits, so that no record straddles chunks; for tokens to whole tokens.
	ChunkSize int
	// Compression of each chunk: "none" (default) or "zstd". A zstd chunk that does not
	// shrink is stored raw.
	Compression Compression
	// Level is the zstd level 1..4 (klauspost speed levels: fastest, default, better,
	// best); default 3. Datasets are written once and read every epoch: on token data
	// level 3 scans about 1.15x faster than level 2 (BenchmarkScan, median of 5
	// interleaved runs) for about 1.8x the encoding time.
	Level int
	// Workers is the number of parallel compression workers; default GOMAXPROCS.
	Workers int
}

// withDefaults returns o with zero fields set to their defaults.
func (o WriterOptions) withDefaults() WriterOptions {
	if o.ShardSize == 0 {
		o.ShardSize = DefaultShardSize
	}
	if o.ChunkSize == 0 {
		o.ChunkSize = DefaultChunkSize
	}
	if o.Compression == "" {
		o.Compression = CompressionNone
	}
	if o.Level == 0 {
		o.Level = 3
	}
	if o.Workers == 0 {
		o.Workers = runtime.GOMAXPROCS(0)
	}
	return o
}

// Validate reports every problem of the options (after defaults) at once, or nil.
func (o WriterOptions) Validate() error {
	o = o.withDefaults()
	var errs []error
	if err := o.Schema.Validate(); err != nil {
		errs = append(errs, err)
	}
	if o.ShardSize < 1 {
		errs = append(errs, fmt.Errorf("dataset: shard size %d must be positive", o.ShardSize))
	}
	if o.ChunkSize < 4 || o.ChunkSize > MaxChunkSize {
		errs = append(errs, fmt.Errorf("dataset: chunk size %d out of range (4..%d)", o.ChunkSize, MaxChunkSize))
	}
	if o.Compression != CompressionNone && o.Compression != CompressionZstd {
		errs = append(errs, fmt.Errorf("dataset: compression %q: want none or zstd", o.Compression))
	}
	if o.Level < 1 || o.Level > 4 {
		errs = append(errs, fmt.Errorf("dataset: zstd level %d out of range (1..4)", o.Level))
	}
	if o.Workers < 1 {
		errs = append(errs, fmt.Errorf("dataset: workers %d must be positive", o.Workers))
	}
	return errors.Join(errs...)
}

// WriterStats are progress counters of a Writer.
type WriterStats struct {
	BytesIn     int64 // raw bytes accepted by Write/AppendRecord
	BytesStored int64 // chunk bytes written to shard files so far
	Samples     int64 // complete samples accepted so far
	Shards      int   // shard files finished so far
}

// Writer streams samples into a new dataset. Its methods, except Stats, must not be called
// concurrently. Either Commit or Abort must be called; after an error from Write or
// AppendRecord the writer has already removed its temporary directory and every later
// call returns that error.
//
// Memory stays bounded: at most about 2*Workers+3 chunks (raw plus compressed) are in
// flight, plus the record offset table of the current shard for bytes datasets (8 bytes
// per record).
//
// Durability: each finished shard file is fsynced and closed in the background (at most
// maxShardSyncs at a time, so the disk sets the pace) while the next shard is written;
// Commit waits for all of them before it writes manifest.json, and a failed sync fails
// the writer with an error naming the shard. Abort waits for them before removing the
// temporary directory.
type Writer struct {
	dir, tmp string
	unlock   func()      // releases the lock on tmp (see stale.go); nil once released
	stale    []StaleTemp // left by interrupted writers of dir, removed by Create
	opts     WriterOptions
	schema   Schema
	kind     uint8
	ts       int   // token size (tokens kind)
	chunkRaw int   // effective raw bytes per chunk
	shardRaw int64 // tokens/records: exact raw bytes of a full shard; bytes: roll threshold
	enc      *zstd.Encoder

	ctx     context.Context
	cancel  context.CancelCauseFunc
	workers errgroup.Group // compression, SetLimit(Workers)
	pending chan *chunkJob // in output order, read by the consumer
	free    chan *chunkJob // recycled chunk jobs (bounds memory)
	conDone chan struct{}
	conErr  error      // set by the consumer before conDone closes
	infos   []shardOut // written by the consumer, read after conDone
	// syncs fsyncs and closes finished shard files in the background, at most
	// maxShardSyncs at a time, so that the consumer writes the next shard while the
	// previous one goes to disk. Its Wait returns the first failure (naming the shard).
	syncs errgroup.Group

	// Producer state, owned by the caller's goroutine.
	cur         *chunkJob
	shardOpen   bool
	shardIdx    int
	shardFirst  int64 // global index of the current shard's first sample
	shardBytes  int64 // raw bytes in the current shard (tokens: including the repeated token)
	offsets     []uint64
	tail        [4]byte // last token written (tokens kind)
	doneSamples int64   // samples in finished shards
	in          int64
	err         error
	finished    bool

	bytesIn, bytesStored, samples atomic.Int64
	shards                        atomic.Int32
}

type jobKind uint8

const (
	jobChunk jobKind = iota
	jobShardStart
	jobShardEnd
)

type chunkJob struct {
	kind  jobKind
	raw   []byte // chunk: raw bytes
	comp  []byte // chunk: compression buffer, reused
	out   []byte // chunk: stored bytes (raw or comp)
	crc   uint32
	flags uint32
	done  chan struct{} // chunk: closed when out and crc are set

	// markers
	shard       int
	firstSample int64
	samples     int64
	rawBytes    int64
	offsets     []uint64
	drop        bool // shard end: the shard holds no sample; delete it
}

type shardOut struct {
	info   ShardInfo
	tokens int64
}

// Create starts a new dataset in dir (which must not exist or be empty). Nothing is visible
// under dir's final name until Commit succeeds: on Abort or error nothing is left behind.
// ctx governs the writer's background work until Commit or Abort.
func Create(ctx context.Context, dir string, opts WriterOptions) (*Writer, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	dir = filepath.Clean(dir)
	if ents, err := os.ReadDir(dir); err == nil && len(ents) > 0 {
		return nil, fmt.Errorf("dataset: create %s: directory exists and is not empty", dir)
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("dataset: create %s: %w", dir, err)
	}
	parent, base := filepath.Split(dir)
	if parent == "" {
		parent = "."
	}
	stale, err := RemoveStaleTemps(dir)
	if err != nil {
		return nil, fmt.Errorf("dataset: create %s: %w", dir, err)
	}
	tmp, err := os.MkdirTemp(parent, "."+base+".tmp-")
	if err != nil {
		return nil, fmt.Errorf("dataset: create %s: %w", dir, err)
	}
	s := opts.Schema
	w := &Writer{dir: dir, tmp: tmp, unlock: lockDir(tmp), stale: stale, opts: opts, schema: s, kind: kindCode(s.Kind), ts: s.TokenSize()}
	w.chunkRaw = opts.ChunkSize
	switch s.Kind {
	case KindTokens:
		w.chunkRaw -= w.chunkRaw % w.ts
		per := max(1, (opts.ShardSize/int64(w.ts)-1)/int64(s.SeqLen))
		w.shardRaw = (per*int64(s.SeqLen) + 1) * int64(w.ts)
	case KindRecords:
		ss := s.SampleSize()
		if ss <= w.chunkRaw {
			w.chunkRaw -= w.chunkRaw % ss
		} else {
			w.chunkRaw -= w.chunkRaw % 4
		}
		w.shardRaw = max(1, opts.ShardSize/int64(ss)) * int64(ss)
	case KindBytes:
		w.shardRaw = opts.ShardSize
	}
	if opts.Compression == CompressionZstd {
		w.enc, err = zstd.NewWriter(nil,
			zstd.WithEncoderLevel(zstd.EncoderLevel(opts.Level)),
			zstd.WithEncoderConcurrency(opts.Workers),
			zstd.WithEncoderCRC(false))
		if err != nil {
			w.releaseLock()
			os.RemoveAll(tmp)
			return nil, fmt.Errorf("dataset: create %s: %w", dir, err)
		}
	}
	w.ctx, w.cancel = context.WithCancelCause(ctx)
	w.workers.SetLimit(opts.Workers)
	w.syncs.SetLimit(maxShardSyncs)
	nbuf := 2*opts.Workers + 2
	w.free = make(chan *chunkJob, nbuf)
	for range nbuf {
		w.free <- &chunkJob{kind: jobChunk}
	}
	w.pending = make(chan *chunkJob, nbuf+4)
	w.conDone = make(chan struct{})
	go w.consume()
	return w, nil
}

// Stats is safe to call concurrently (atomics) for progress reporting.
func (w *Writer) Stats() WriterStats {
	return WriterStats{
		BytesIn:     w.bytesIn.Load(),
		BytesStored: w.bytesStored.Load(),
		Samples:     w.samples.Load(),
		Shards:      int(w.shards.Load()),
	}
}

// Write appends raw little-endian sample data. For tokens: any number of whole tokens (a
// stream; a token may be split across calls). For records: any bytes; the total must be a
// multiple of SampleSize at Commit. Not allowed for bytes datasets (use AppendRecord).
func (w *Writer) Write(p []byte) (int, error) {
	if err := w.usable(); err != nil {
		return 0, err
	}
	if w.kind == codeBytes {
		return 0, errors.New("dataset: Write on a bytes dataset; use AppendRecord")
	}
	if err := w.writeStream(p); err != nil {
		return 0, w.fail(err)
	}
	return len(p), nil
}

// AppendRecord appends one variable-length record (bytes kind) or one whole record of
// SampleSize bytes (records kind). Not allowed for token datasets.
func (w *Writer) AppendRecord(rec []byte) error {
	if err := w.usable(); err != nil {
		return err
	}
	switch w.kind {
	case codeTokens:
		return errors.New("dataset: AppendRecord on a tokens dataset; use Write")
	case codeRecords:
		ss := int64(w.schema.SampleSize())
		if int64(len(rec)) != ss || w.in%ss != 0 {
			return fmt.Errorf("dataset: AppendRecord: record of %d bytes at stream offset %d, want whole records of %d bytes", len(rec), w.in, ss)
		}
		return w.fail(w.writeStream(rec))
	}
	if !w.shardOpen {
		if err := w.startShard(); err != nil {
			return w.fail(err)
		}
	}
	if err := w.appendRaw(rec); err != nil {
		return w.fail(err)
	}
	w.shardBytes += int64(len(rec))
	w.offsets = append(w.offsets, uint64(w.shardBytes))
	w.samples.Add(1)
	if w.shardBytes >= w.shardRaw {
		return w.fail(w.endShard(false))
	}
	return nil
}

func (w *Writer) usable() error {
	if w.err != nil {
		return w.err
	}
	if w.finished {
		return errors.New("dataset: writer already committed or aborted")
	}
	return nil
}

// fail makes err sticky and cleans up; nil passes through.
func (w *Writer) fail(err error) error {
	if err == nil {
		return nil
	}
	w.err = err
	w.shutdown()
	os.RemoveAll(w.tmp)
	return err
}

// writeStream feeds tokens or records data, cutting shards at w.shardRaw raw bytes.
func (w *Writer) writeStream(p []byte) error {
	for len(p) > 0 {
		if !w.shardOpen {
			if err := w.startShard(); err != nil {
				return err
			}
			if w.kind == codeTokens && w.shardIdx > 0 {
				// Repeat the previous shard's last token so windows never straddle shards.
				if err := w.appendRaw(w.tail[:w.ts]); err != nil {
					return err
				}
				w.shardBytes = int64(w.ts)
			}
		}
		n := int(min(int64(len(p)), w.shardRaw-w.shardBytes))
		if err := w.appendRaw(p[:n]); err != nil {
			return err
		}
		w.in += int64(n)
		w.bytesIn.Store(w.in)
		w.shardBytes += int64(n)
		if w.kind == codeTokens {
			w.pushTail(p[:n])
		}
		w.samples.Store(w.doneSamples + w.shardSamples())
		p = p[n:]
		if w.shardBytes == w.shardRaw {
			if err := w.endShard(false); err != nil {
				return err
			}
		}
	}
	return nil
}

// pushTail keeps the last w.ts bytes of the token stream in w.tail.
func (w *Writer) pushTail(p []byte) {
	if len(p) >= w.ts {
		copy(w.tail[:w.ts], p[len(p)-w.ts:])
		return
	}
	copy(w.tail[:], w.tail[len(p):w.ts])
	copy(w.tail[w.ts-len(p):w.ts], p)
}

// shardSamples is the number of complete samples in the current shard.
func (w *Writer) shardSamples() int64 {
	switch w.kind {
	case codeTokens:
		toks := w.shardBytes / int64(w.ts)
		if toks < int64(w.schema.SeqLen)+1 {
			return 0
		}
		return (toks - 1) / int64(w.schema.SeqLen)
	case codeRecords:
		return w.shardBytes / int64(w.schema.SampleSize())
	}
	return int64(len(w.offsets) - 1)
}

func (w *Writer) send(j *chunkJob) error {
	select {
	case w.pending <- j:
		return nil
	case <-w.ctx.Done():
		return context.Cause(w.ctx)
	}
}

func (w *Writer) startShard() error {
	w.shardOpen = true
	w.shardBytes = 0
	w.shardFirst = w.doneSamples
	if w.kind == codeBytes {
		w.offsets = append(make([]uint64, 0, 1024), 0)
	}
	return w.send(&chunkJob{kind: jobShardStart, shard: w.shardIdx, firstSample: w.shardFirst})
}

// endShard flushes the current chunk and closes the shard. final marks the last shard,
// which is dropped when it holds no complete sample.
func (w *Writer) endShard(final bool) error {
	if err := w.flushChunk(); err != nil {
		return err
	}
	n := w.shardSamples()
	drop := final && n == 0
	end := &chunkJob{kind: jobShardEnd, shard: w.shardIdx, firstSample: w.shardFirst, samples: n,
		rawBytes: w.shardBytes, offsets: w.offsets, drop: drop}
	w.offsets = nil
	w.shardOpen = false
	w.shardIdx++
	w.doneSamples += n
	w.samples.Store(w.doneSamples)
	return w.send(end)
}

// appendRaw copies p into chunks, handing each full chunk to the pipeline.
func (w *Writer) appendRaw(p []byte) error {
	for len(p) > 0 {
		if w.cur == nil {
			select {
			case j := <-w.free:
				if cap(j.raw) < w.chunkRaw {
					j.raw = make([]byte, 0, w.chunkRaw)
				}
				j.raw = j.raw[:0]
				w.cur = j
			case <-w.ctx.Done():
				return context.Cause(w.ctx)
			}
		}
		n := copy(w.cur.raw[len(w.cur.raw):w.chunkRaw], p)
		w.cur.raw = w.cur.raw[:len(w.cur.raw)+n]
		p = p[n:]
		if len(w.cur.raw) == w.chunkRaw {
			if err := w.flushChunk(); err != nil {
				return err
			}
		}
	}
	return nil
}

// flushChunk sends the current chunk (if any) for compression and ordered output.
func (w *Writer) flushChunk() error {
	j := w.cur
	if j == nil || len(j.raw) == 0 {
		return nil
	}
	w.cur = nil
	j.done = make(chan struct{})
	if err := w.send(j); err != nil {
		return err
	}
	w.workers.Go(func() error {
		defer close(j.done)
		j.out, j.flags = j.raw, 0
		if w.enc != nil {
			j.comp = w.enc.EncodeAll(j.raw, j.comp[:0])
			if len(j.comp) < len(j.raw) {
				j.out, j.flags = j.comp, chunkFlagZstd
			}
		}
		j.crc = crc32c(j.out)
		return nil
	})
	return nil
}

// consume writes jobs in order. It runs until pending is closed or the context ends.
func (w *Writer) consume() {
	defer close(w.conDone)
	var sw *shardFile
	defer func() {
		if sw != nil {
			sw.f.Close()
		}
	}()
	for j := range w.pending {
		var err error
		switch j.kind {
		case jobShardStart:
			sw, err = w.openShard(j)
		case jobChunk:
			select {
			case <-j.done:
			case <-w.ctx.Done():
				w.conErr = context.Cause(w.ctx)
				return
			}
			err = sw.writeChunk(j)
			if err == nil {
				w.bytesStored.Add(int64(len(j.out)))
				j.out = nil
				w.free <- j // cannot block: free has room for every job
			}
		case jobShardEnd:
			var out shardOut
			out, err = sw.finish(j)
			if err == nil && !j.drop {
				w.infos = append(w.infos, out)
				w.shards.Add(1)
				f, path := sw.f, sw.path
				// Blocks while maxShardSyncs syncs are in flight: the disk sets the pace.
				w.syncs.Go(func() error {
					err := syncClose(f, path)
					if err != nil {
						w.cancel(err) // stop the pipeline early; Commit reports err
					}
					return err
				})
			}
			sw = nil
		}
		if err == nil {
			err = context.Cause(w.ctx)
		}
		if err != nil {
			w.conErr = err
			w.cancel(err)
			return
		}
	}
}

// shardFile is a shard being written by the consumer.
type shardFile struct {
	w       *Writer
	name    string
	path    string
	f       *os.File
	pos     int64
	crc     uint32
	entries []chunkEntry
	stored  int64
}

func shardName(i int) string { return fmt.Sprintf("shard-%05d.spl", i) }

func (w *Writer) openShard(j *chunkJob) (*shardFile, error) {
	name := shardName(j.shard)
	sw := &shardFile{w: w, name: name, path: filepath.Join(w.tmp, name)}
	f, err := os.OpenFile(sw.path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, fmt.Errorf("dataset: %w", err)
	}
	sw.f = f
	ss := w.schema.SampleSize()
	h := shardHeader{Kind: w.kind, TokenSize: uint8(w.ts), ChunkSize: uint32(w.chunkRaw),
		SampleSize: uint32(ss), Stride: uint32(w.schema.stride()),
		ShardIndex: uint32(j.shard), FirstSample: uint64(j.firstSample)}
	if w.enc != nil {
		h.Compression = codeZstd
	}
	return sw, sw.write(h.encode())
}

func (sw *shardFile) write(b []byte) error {
	if _, err := sw.f.Write(b); err != nil {
		return fmt.Errorf("dataset: write %s: %w", sw.path, err)
	}
	sw.crc = crc32Update(sw.crc, b)
	sw.pos += int64(len(b))
	return nil
}

func (sw *shardFile) writeChunk(j *chunkJob) error {
	sw.entries = append(sw.entries, chunkEntry{Offset: uint64(sw.pos), StoredLen: uint32(len(j.out)),
		RawLen: uint32(len(j.raw)), CRC: j.crc, Flags: j.flags})
	sw.stored += int64(len(j.out))
	return sw.write(j.out)
}

// finish writes the index and trailer (or removes the file when the shard is dropped).
// The caller syncs and closes a kept file with syncClose; on error finish closes it.
func (sw *shardFile) finish(j *chunkJob) (out shardOut, err error) {
	if j.drop {
		sw.f.Close()
		return out, os.Remove(sw.path)
	}
	defer func() {
		if err != nil {
			sw.f.Close()
		}
	}()
	index := make([]byte, 8*len(j.offsets)+chunkEntrySize*len(sw.entries))
	for i, o := range j.offsets {
		putUint64(index[8*i:], o)
	}
	for i := range sw.entries {
		sw.entries[i].put(index[8*len(j.offsets)+chunkEntrySize*i:])
	}
	t := shardTrailer{Chunks: uint32(len(sw.entries)), Samples: uint64(j.samples), RawBytes: uint64(j.rawBytes),
		IndexOffset: uint64(sw.pos), IndexCRC: crc32c(index)}
	if err := sw.write(index); err != nil {
		return out, err
	}
	if err := sw.write(t.encode()); err != nil {
		return out, err
	}
	out.info = ShardInfo{Name: sw.name, Size: sw.pos, FirstSample: j.firstSample, Samples: j.samples,
		Chunks: len(sw.entries), RawBytes: j.rawBytes, StoredBytes: sw.stored, CRC32C: sw.crc}
	if ts := int64(sw.w.ts); ts > 0 {
		out.tokens = j.rawBytes / ts
	}
	return out, nil
}

// maxShardSyncs is the number of finished shard files fsynced in the background at once.
// Measured (tools/bench/results/convert.json): syncing in the background overlaps the
// disk with the writing of the next shard; starting writeback early per chunk with
// sync_file_range(SYNC_FILE_RANGE_WRITE) was slower than this, so it is not used.
const maxShardSyncs = 2

// syncFile is f.Sync; tests replace it to inject failures or observe the order of syncs.
var syncFile = (*os.File).Sync

// syncClose makes a finished file durable and closes it. Errors name the file.
func syncClose(f *os.File, path string) error {
	if err := syncFile(f); err != nil {
		f.Close()
		return fmt.Errorf("dataset: sync %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("dataset: close %s: %w", path, err)
	}
	return nil
}

// shutdown stops the pipeline and waits for it. Safe to call more than once.
// SetLabelClasses records the class names of a records dataset's int32
// labels in the manifest (Schema.LabelClasses), for labels converted from
// strings as they are met. Call it before Commit.
func (w *Writer) SetLabelClasses(names []string) error {
	if err := w.usable(); err != nil {
		return err
	}
	if w.schema.Kind != KindRecords || w.schema.LabelDType != "int32" {
		return fmt.Errorf("dataset: label classes need a records dataset with int32 labels, not %s", w.schema.Kind)
	}
	w.schema.LabelClasses = append([]string(nil), names...)
	return nil
}

// StaleTemps returns the temporary directories that interrupted writers of
// the same dataset had left and that Create removed.
func (w *Writer) StaleTemps() []StaleTemp { return w.stale }

// releaseLock drops the lock on the temporary directory (idempotent).
func (w *Writer) releaseLock() {
	if w.unlock != nil {
		w.unlock()
		w.unlock = nil
	}
}

func (w *Writer) shutdown() {
	defer w.releaseLock()
	if w.finished {
		return
	}
	w.finished = true
	w.cancel(errAborted)
	close(w.pending)
	<-w.conDone
	w.workers.Wait()
	w.syncs.Wait() // no file may still be open when the caller removes the directory
	if w.enc != nil {
		w.enc.Close()
	}
}

var errAborted = errors.New("dataset: writer aborted")

// Abort discards everything written: the temporary directory is removed and nothing
// appears under the target name. Safe to call after an error or more than once.
func (w *Writer) Abort() error {
	if w.finished && w.err == nil && w.tmp == "" {
		return nil // committed
	}
	w.shutdown()
	if w.err == nil {
		w.err = errAborted
	}
	if err := os.RemoveAll(w.tmp); err != nil {
		return fmt.Errorf("dataset: abort: %w", err)
	}
	return nil
}

// Commit flushes the last chunk and shard, waits for all shard files to be synced, writes
// manifest.json last, renames the temporary directory to the target name and syncs the
// parent directory. On error nothing is left behind.
func (w *Writer) Commit(ctx context.Context) (m *Manifest, err error) {
	if err := w.usable(); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			w.err = err
			w.shutdown()
			os.RemoveAll(w.tmp)
		}
		w.releaseLock()
	}()
	stop := context.AfterFunc(ctx, func() { w.cancel(context.Cause(ctx)) })
	defer stop()
	if ss := int64(w.schema.SampleSize()); w.kind == codeRecords && w.in%ss != 0 {
		return nil, fmt.Errorf("dataset: commit: %d bytes written is not a whole number of %d-byte records", w.in, ss)
	}
	if w.kind == codeTokens && w.in%int64(w.ts) != 0 {
		return nil, fmt.Errorf("dataset: commit: %d bytes written is not a whole number of %d-byte tokens", w.in, w.ts)
	}
	if w.shardOpen {
		if err := w.endShard(true); err != nil {
			return nil, err
		}
	}
	w.finished = true
	close(w.pending)
	<-w.conDone
	w.workers.Wait()
	syncErr := w.syncs.Wait() // every shard is durable before the manifest is written
	if w.enc != nil {
		w.enc.Close()
	}
	if w.conErr != nil {
		return nil, w.conErr
	}
	if syncErr != nil {
		return nil, syncErr
	}
	if err := context.Cause(w.ctx); err != nil {
		return nil, err
	}
	m = &Manifest{Format: manifestFormat, FormatVersion: FormatVersion, Schema: w.schema,
		Compression: w.opts.Compression, ChunkSize: w.chunkRaw, ShardSize: w.opts.ShardSize,
		Created: time.Now().UTC().Format(time.RFC3339), Shards: []ShardInfo{}}
	for i, o := range w.infos {
		m.Shards = append(m.Shards, o.info)
		m.Samples += o.info.Samples
		m.RawBytes += o.info.RawBytes
		m.StoredBytes += o.info.StoredBytes
		m.Tokens += o.tokens
		if i > 0 && o.tokens > 0 {
			m.Tokens-- // the repeated boundary token
		}
	}
	if err := writeManifest(w.tmp, m); err != nil {
		return nil, err
	}
	if err := syncDir(w.tmp); err != nil {
		return nil, err
	}
	// os.Rename refuses to replace a directory: remove the (empty) target first. Remove
	// fails on a non-empty directory, so nothing of anyone else's is lost.
	if err := os.Remove(w.dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("dataset: commit: %w", err)
	}
	if err := os.Rename(w.tmp, w.dir); err != nil {
		return nil, fmt.Errorf("dataset: commit: %w", err)
	}
	w.tmp = ""
	w.cancel(errAborted) // release the context
	if err := syncDir(filepath.Dir(w.dir)); err != nil {
		return nil, err // the dataset is in place; only durability of the rename is unknown
	}
	return m, nil
}

func writeManifest(dir string, m *Manifest) error {
	data, err := marshalManifest(m)
	if err != nil {
		return err
	}
	path := filepath.Join(dir, ManifestName)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("dataset: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("dataset: write %s: %w", path, err)
	}
	return syncClose(f, path)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("dataset: sync dir: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("dataset: sync dir %s: %w", dir, err)
	}
	return nil
}
