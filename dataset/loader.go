package dataset

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"golang.org/x/sync/errgroup"
)

// ErrLoaderClosed is returned by Loader.Next after Close.
var ErrLoaderClosed = errors.New("dataset: loader closed")

// LoaderOptions configures a Loader. Zero values take the documented
// defaults; NewLoader reports every invalid field at once.
type LoaderOptions struct {
	// BatchSize is the number of samples per batch. Required (> 0).
	BatchSize int
	// Shuffle, Seed, Rank, WorldSize and KeepTail choose the order of
	// samples and the share of this rank; see SamplerOptions.
	Shuffle         bool
	Seed            uint64
	Rank, WorldSize int
	KeepTail        bool
	// BlockSamples and WindowBlocks select a block-local shuffle for
	// compressed datasets; see SamplerOptions.
	BlockSamples, WindowBlocks int64
	// AdviseAll makes the Loader pass every sample to the source's Advise,
	// even isolated ones (shuffled order). By default only runs of at least
	// adviseMinRun consecutive indices are advised: one madvise per random
	// sample costs tens of microseconds on the planner goroutine when the
	// data is in the page cache, but it can pay off on a cold, slow disk.
	AdviseAll bool
	// DropLast skips the last batch of an epoch when it would hold fewer
	// than BatchSize samples. Without it that batch is short
	// (Batch.Samples < BatchSize). A batch never spans two epochs.
	DropLast bool
	// Workers is the number of goroutines gathering batches. Default
	// GOMAXPROCS. The batches delivered do not depend on it.
	Workers int
	// Prefetch is the number of batch buffers, i.e. the batches in flight
	// (being gathered, ready, or held by the caller). Default 2*Workers+2.
	// Must equal len(Buffers) when Buffers is set.
	Prefetch int
	// Buffers optionally supplies the batch buffers (for example pinned
	// host memory), each at least BatchSize*SampleSize bytes; their number
	// sets Prefetch. The Loader writes batches into them and never frees
	// them; they stay the caller's after Close. Default: the Loader
	// allocates Prefetch buffers on the Go heap.
	Buffers [][]byte
	// Start is where to begin: a Cursor taken from a Batch (normally from a
	// checkpoint). The zero Cursor means epoch 0, position 0. A non-zero
	// Start must carry the same Seed.
	Start Cursor
	// Epochs, if positive, ends the stream (Next returns io.EOF) when the
	// loader reaches epoch number Epochs, counted from epoch 0 and not
	// from Start, so a resumed run stops where the uninterrupted one would.
	// Zero means run forever, one epoch after another (training); 1 with
	// a zero Start gives a single-epoch (evaluation) loader.
	Epochs int64
}

// Batch is one batch of samples, valid until Release.
type Batch struct {
	// Data holds Samples samples back to back: sample k is
	// Data[k*SampleSize : (k+1)*SampleSize]. It lies in one of the batch
	// buffers and is overwritten after Release.
	Data []byte
	// Samples is the number of samples; BatchSize except possibly for the
	// last batch of an epoch without DropLast.
	Samples int
	// Indices are the dataset indices of the samples, in order.
	Indices []int64
	// Epoch is the epoch the samples belong to.
	Epoch int64
	// Cursor is the position right after this batch: resuming a Loader at
	// it continues with the next batch. Save it with the model state the
	// batch has been applied to.
	Cursor Cursor

	buf  []byte  // whole batch buffer
	idx  []int64 // cap BatchSize
	ord  []int32 // gather order: positions sorted by index
	done chan error
	held atomic.Bool
	l    *Loader
}

// Release hands the batch's buffer back to the Loader for reuse. The caller
// must not touch Data or Indices afterwards. Release is safe to call from
// any goroutine, also after Close; extra calls do nothing.
func (b *Batch) Release() {
	if b == nil || !b.held.CompareAndSwap(true, false) {
		return
	}
	b.l.held.Add(-1)
	b.l.free <- b // cannot block: free has room for every buffer
}

// Loader delivers batches from a Source in a deterministic order (see
// Sampler), gathering them ahead of the consumer with Workers goroutines
// into a fixed set of reused buffers.
//
// Pipeline: a planner goroutine takes a free buffer, assigns it the next
// batch's indices and its Cursor, calls the source's Advise (if it is an
// Advisor) for the batch, and queues it both to the workers and to the
// delivery queue. A worker copies the samples into the buffer and signals
// the batch done. Next takes batches from the delivery queue in planning
// order and waits for each to be done, so batches come out in order
// whatever the number of workers. After warm-up no step allocates.
//
// Next is for one consumer goroutine; Release may be called from any.
type Loader struct {
	src     Source
	adv     Advisor
	read    func(i int64, dst []byte) ([]byte, error) // src.ReadSample if it has one, else src.Sample
	sampler *Sampler
	opts    LoaderOptions
	ss      int // sample size
	nbuf    int

	ctx    context.Context
	cancel context.CancelCauseFunc
	g      *errgroup.Group

	free  chan *Batch // buffers nobody uses
	jobs  chan *Batch // planned, to be gathered
	order chan *Batch // planned, in delivery order

	held    atomic.Int32 // batches delivered and not yet released
	closed  atomic.Bool
	pending *Batch // taken from order, not yet done (consumer-owned)
	err     error  // sticky error of Next (consumer-owned)

	closeOnce sync.Once
}

// NewLoader starts a Loader over src. The pipeline runs until Close, the
// end of the last epoch, or ctx's cancellation; Close must be called in
// every case to release it, and before src is closed: workers read ahead
// from src until Close returns.
func NewLoader(ctx context.Context, src Source, opts LoaderOptions) (*Loader, error) {
	ss := src.SampleSize()
	n := src.Len()
	if opts.Workers == 0 {
		opts.Workers = runtime.GOMAXPROCS(0)
	}
	if opts.Prefetch == 0 {
		if opts.Buffers != nil {
			opts.Prefetch = len(opts.Buffers)
		} else {
			opts.Prefetch = 2*opts.Workers + 2
		}
	}
	var errs []error
	if ss <= 0 {
		errs = append(errs, fmt.Errorf("dataset: loader: source has no fixed sample size (got %d); variable-length datasets cannot be batched", ss))
	}
	if opts.BatchSize <= 0 {
		errs = append(errs, fmt.Errorf("dataset: loader: BatchSize %d must be positive", opts.BatchSize))
	}
	if opts.Workers < 0 {
		errs = append(errs, fmt.Errorf("dataset: loader: Workers %d must not be negative", opts.Workers))
	}
	if opts.Prefetch < 1 {
		errs = append(errs, fmt.Errorf("dataset: loader: Prefetch %d must be at least 1", opts.Prefetch))
	}
	if opts.Buffers != nil && opts.Prefetch != len(opts.Buffers) {
		errs = append(errs, fmt.Errorf("dataset: loader: Prefetch %d differs from the %d Buffers given", opts.Prefetch, len(opts.Buffers)))
	}
	if ss > 0 && opts.BatchSize > 0 {
		for i, b := range opts.Buffers {
			if len(b) < opts.BatchSize*ss {
				errs = append(errs, fmt.Errorf("dataset: loader: Buffers[%d] has %d bytes, a batch needs %d (BatchSize %d x sample size %d)",
					i, len(b), opts.BatchSize*ss, opts.BatchSize, ss))
			}
		}
	}
	if opts.Epochs < 0 {
		errs = append(errs, fmt.Errorf("dataset: loader: Epochs %d must not be negative", opts.Epochs))
	}
	if opts.Start != (Cursor{}) && opts.Start.Seed != opts.Seed {
		errs = append(errs, fmt.Errorf("dataset: loader: Start cursor has seed %d but Seed is %d", opts.Start.Seed, opts.Seed))
	}
	if opts.Start.Epoch < 0 || opts.Start.Position < 0 {
		errs = append(errs, fmt.Errorf("dataset: loader: invalid Start cursor (%v)", opts.Start))
	}
	sampler, err := NewSampler(n, SamplerOptions{
		Shuffle: opts.Shuffle, Seed: opts.Seed, Rank: opts.Rank, WorldSize: opts.WorldSize, KeepTail: opts.KeepTail,
		BlockSamples: opts.BlockSamples, WindowBlocks: opts.WindowBlocks,
	})
	if err != nil {
		errs = append(errs, err)
	} else if opts.BatchSize > 0 {
		per := sampler.EpochLen()
		if per == 0 || (opts.DropLast && per < int64(opts.BatchSize)) {
			errs = append(errs, fmt.Errorf("dataset: loader: %d samples give rank %d of %d only %d samples per epoch, not one batch of %d",
				n, sampler.opts.Rank, sampler.opts.WorldSize, per, opts.BatchSize))
		}
		if opts.Start.Position > per {
			errs = append(errs, fmt.Errorf("dataset: loader: Start position %d is past the end of the epoch (%d samples per epoch for this rank)",
				opts.Start.Position, per))
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	opts.WorldSize = sampler.opts.WorldSize
	opts.Start.Seed = opts.Seed

	l := &Loader{
		src:     src,
		sampler: sampler,
		opts:    opts,
		ss:      ss,
		nbuf:    opts.Prefetch,
		free:    make(chan *Batch, opts.Prefetch),
		jobs:    make(chan *Batch, opts.Prefetch),
		order:   make(chan *Batch, opts.Prefetch),
	}
	l.adv, _ = src.(Advisor)
	// A source with ReadSample (Dataset) copies into the slot while it holds its Close
	// guard, so a Close racing with the workers fails them (ErrClosed) instead of
	// leaving them to copy from unmapped memory.
	l.read = src.Sample
	if r, ok := src.(interface {
		ReadSample(i int64, dst []byte) ([]byte, error)
	}); ok {
		l.read = r.ReadSample
	}
	for i := range l.nbuf {
		b := &Batch{idx: make([]int64, opts.BatchSize), ord: make([]int32, opts.BatchSize), done: make(chan error, 1), l: l}
		if opts.Buffers != nil {
			b.buf = opts.Buffers[i][:opts.BatchSize*ss]
		} else {
			b.buf = make([]byte, opts.BatchSize*ss)
		}
		l.free <- b
	}
	cctx, cancel := context.WithCancelCause(ctx)
	l.cancel = cancel
	l.g, l.ctx = errgroup.WithContext(cctx)
	l.g.Go(func() error { return l.plan(l.ctx) })
	for range opts.Workers {
		l.g.Go(func() error { return l.work(l.ctx) })
	}
	return l, nil
}

// EpochLen is the number of samples this rank reads per epoch.
func (l *Loader) EpochLen() int64 { return l.sampler.EpochLen() }

// BatchesPerEpoch is the number of batches this rank gets per epoch.
func (l *Loader) BatchesPerEpoch() int64 {
	per, b := l.sampler.EpochLen(), int64(l.opts.BatchSize)
	if l.opts.DropLast {
		return per / b
	}
	return (per + b - 1) / b
}

// next normalises a position: the end of an epoch (or, with DropLast, a
// remainder too short for a batch) is the start of the next one.
func (l *Loader) next(c Cursor) Cursor {
	per := l.sampler.EpochLen()
	if c.Position >= per || (l.opts.DropLast && per-c.Position < int64(l.opts.BatchSize)) {
		return Cursor{Seed: c.Seed, Epoch: c.Epoch + 1}
	}
	return c
}

// plan assigns batches to free buffers in order; see Loader.
func (l *Loader) plan(ctx context.Context) error {
	c := l.next(l.opts.Start)
	per := l.sampler.EpochLen()
	bs := int64(l.opts.BatchSize)
	order := l.sampler.Order(c.Epoch)
	for {
		if l.opts.Epochs > 0 && c.Epoch >= l.opts.Epochs {
			close(l.jobs)
			close(l.order)
			return nil
		}
		var b *Batch
		select {
		case b = <-l.free:
		case <-ctx.Done():
			return nil
		}
		k := min(bs, per-c.Position)
		b.Indices = b.idx[:k]
		for j := range k {
			b.Indices[j] = order.At(c.Position + j)
		}
		b.Samples = int(k)
		b.Data = b.buf[:int(k)*l.ss]
		b.Epoch = c.Epoch
		c = l.next(Cursor{Seed: c.Seed, Epoch: c.Epoch, Position: c.Position + k})
		b.Cursor = c
		if c.Epoch != b.Epoch {
			order = l.sampler.Order(c.Epoch)
		}
		if l.adv != nil {
			minRun := adviseMinRun
			if l.opts.AdviseAll {
				minRun = 1
			}
			advise(l.adv, b.Indices, minRun)
		}
		select {
		case l.order <- b:
		case <-ctx.Done():
			return nil
		}
		select {
		case l.jobs <- b:
		case <-ctx.Done():
			return nil
		}
	}
}

// adviseMinRun is the shortest run of consecutive indices the Loader
// advises by default (see LoaderOptions.AdviseAll).
const adviseMinRun = 8

// advise passes the batch's indices to a as maximal runs of consecutive
// indices (one call per batch when reading in order), skipping runs shorter
// than minRun.
func advise(a Advisor, idx []int64, minRun int) {
	for i := 0; i < len(idx); {
		j := i + 1
		for j < len(idx) && idx[j] == idx[j-1]+1 {
			j++
		}
		if j-i >= minRun {
			a.Advise(idx[i], idx[j-1]+1)
		}
		i = j
	}
}

// work gathers planned batches until the plan ends or ctx is done.
func (l *Loader) work(ctx context.Context) error {
	for {
		select {
		case b, ok := <-l.jobs:
			if !ok {
				return nil
			}
			b.done <- l.gather(ctx, b) // cannot block: done has room for the one result
		case <-ctx.Done():
			return nil
		}
	}
}

// gather copies b's samples into its buffer. It reads them in index
// order: samples that share a compressed chunk are then read one after the
// other, so the source's chunk cache decodes each chunk once per batch, and
// mapped pages are touched in file order.
func (l *Loader) gather(ctx context.Context, b *Batch) error {
	ss := l.ss
	idx := b.Indices
	ord := b.ord[:len(idx)]
	for k := range ord {
		ord[k] = int32(k)
	}
	slices.SortFunc(ord, func(x, y int32) int { return cmp.Compare(idx[x], idx[y]) })
	for n, o := range ord {
		if n%64 == 63 && ctx.Err() != nil {
			return context.Cause(ctx)
		}
		k := int(o)
		i := idx[k]
		slot := b.Data[k*ss : (k+1)*ss : (k+1)*ss]
		got, err := l.read(i, slot)
		if err != nil {
			return fmt.Errorf("dataset: loader: sample %d (epoch %d): %w", i, b.Epoch, err)
		}
		if len(got) != ss {
			return fmt.Errorf("dataset: loader: sample %d has %d bytes, want %d", i, len(got), ss)
		}
		if &got[0] != &slot[0] {
			copy(slot, got)
		}
	}
	return nil
}

// Next returns the next batch, in order. The caller owns it until Release
// and may hold up to Prefetch-1 batches while calling Next again. At the
// end of the last epoch (LoaderOptions.Epochs) Next returns io.EOF. An error
// from the source (for example a *ShardError, wrapped with the sample
// index; the smallest failing index of the batch) is returned when its batch is due and then by every later call;
// so are io.EOF and ErrLoaderClosed. If ctx is done Next returns its error
// and the loader stays usable.
func (l *Loader) Next(ctx context.Context) (*Batch, error) {
	if l.err != nil {
		return nil, l.err
	}
	if l.closed.Load() {
		l.err = ErrLoaderClosed
		return nil, l.err
	}
	if l.pending == nil {
		if h := int(l.held.Load()); h >= l.nbuf {
			return nil, fmt.Errorf("dataset: loader: all %d batch buffers are held by the caller; Release one before calling Next", h)
		}
		select {
		case b, ok := <-l.order:
			if !ok {
				l.err = io.EOF
				return nil, l.err
			}
			l.pending = b
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		case <-l.ctx.Done():
			return nil, l.stopped()
		}
	}
	b := l.pending
	select {
	case err := <-b.done:
		l.pending = nil
		if err != nil {
			l.err = err
			l.free <- b // cannot block
			return nil, err
		}
		l.held.Add(1)
		b.held.Store(true)
		return b, nil
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	case <-l.ctx.Done():
		return nil, l.stopped()
	}
}

// stopped records and returns why the pipeline stopped early.
func (l *Loader) stopped() error {
	l.err = context.Cause(l.ctx)
	if l.err == nil {
		l.err = ErrLoaderClosed
	}
	return l.err
}

// Close stops the pipeline and waits for its goroutines to exit. Batches
// the caller still holds stay readable (their buffers are not reused).
// Close is idempotent and always returns nil (the error result is kept for
// io.Closer).
func (l *Loader) Close() error {
	l.closeOnce.Do(func() {
		l.closed.Store(true)
		l.cancel(ErrLoaderClosed)
		_ = l.g.Wait() // the goroutines only stop on cancellation or the end of the plan
	})
	return nil
}
