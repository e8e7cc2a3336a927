package dataset

import (
	"errors"
	"fmt"
)

// Source is what the sampler and the Loader read samples from. *Dataset
// implements it; tests use in-memory fakes.
type Source interface {
	// Len is the number of samples.
	Len() int64
	// SampleSize is the byte size of every sample (fixed-size kinds only).
	SampleSize() int
	// Sample returns sample i. The result either aliases dst (which the
	// implementation writes into) or memory the source owns that stays
	// valid while the source is open. Sample must be safe for concurrent
	// use with distinct dst buffers.
	Sample(i int64, dst []byte) ([]byte, error)
}

// Advisor is an optional upgrade interface of a Source: Advise(from, to)
// hints that samples [from, to) will be read soon. The Loader calls it for
// every batch when the batch is scheduled, Prefetch batches ahead of the
// consumer. It must be cheap and safe for concurrent use with Sample.
type Advisor interface {
	Advise(from, to int64)
}

// Cursor is an exact position in a rank's infinite sequence of epochs. A
// training checkpoint stores it (as JSON) and hands it back as
// LoaderOptions.Start to resume with the very next sample.
//
// A Cursor is meaningful only for the same dataset length, Shuffle,
// WorldSize, KeepTail and BatchSize/DropLast settings it was produced
// under; Rank may differ only in that every rank stores its own Cursor (the
// Cursors of all ranks are equal unless KeepTail is set).
type Cursor struct {
	Seed     uint64 `json:"seed"`
	Epoch    int64  `json:"epoch"`
	Position int64  `json:"position"` // samples already delivered to this rank in Epoch
}

func (c Cursor) String() string {
	return fmt.Sprintf("seed %d epoch %d position %d", c.Seed, c.Epoch, c.Position)
}

// SamplerOptions configures a Sampler.
type SamplerOptions struct {
	// Shuffle selects a fresh pseudo-random order every epoch (see
	// Permutation); false reads samples in index order.
	Shuffle bool
	// Seed keys the shuffle. The same seed gives the same orders.
	Seed uint64
	// Rank and WorldSize split every epoch across data-parallel ranks.
	// WorldSize 0 means 1. 0 <= Rank < WorldSize.
	Rank, WorldSize int
	// KeepTail controls the N mod WorldSize samples left over when the
	// epoch's order is dealt out to ranks. By default (false) they are
	// dropped, so every rank gets exactly floor(N/WorldSize) samples per
	// epoch and ranks stay in lockstep (PyTorch DistributedSampler with
	// drop_last). Which samples are dropped changes every epoch when
	// shuffling. With KeepTail the first N mod WorldSize ranks get one
	// more sample, so each sample is seen exactly once per epoch: meant for
	// evaluation, where ranks do not synchronise on every step.
	KeepTail bool
	// BlockSamples, if positive, makes the shuffle block-local, for
	// compressed datasets whose random reads cost a chunk decode each: the
	// samples are cut into blocks of BlockSamples consecutive indices, the
	// blocks are shuffled, and the order is the full shuffle of the samples
	// of each window of WindowBlocks consecutive (shuffled) blocks. A batch
	// then touches about WindowBlocks blocks instead of BatchSize. Set it to
	// the samples per chunk, and make BlockSamples*WindowBlocks several
	// times BatchSize*WorldSize so that batches still mix many regions.
	// 0 (default): every epoch is a uniform shuffle of all samples.
	BlockSamples int64
	// WindowBlocks is the number of blocks shuffled together when
	// BlockSamples is set; default 16.
	WindowBlocks int64
}

// Sampler decides which sample a rank reads at each position of each epoch.
//
// Epoch e's global order is the Permutation of [0, N) for (Seed, e) (or the
// identity without Shuffle). Rank r takes the global positions r, r+W,
// r+2W, ... (W = WorldSize), so the ranks' sets within an epoch are disjoint
// and, apart from the dropped tail, cover [0, N). The assignment depends
// only on (N, options, epoch, position): never on timing or worker count.
// A Sampler is immutable and safe for concurrent use.
type Sampler struct {
	n    int64
	opts SamplerOptions
	per  int64 // samples per epoch for this rank
}

// NewSampler returns the sampler of a dataset of n samples.
func NewSampler(n int64, opts SamplerOptions) (*Sampler, error) {
	if opts.WorldSize == 0 {
		opts.WorldSize = 1
	}
	var errs []error
	if n < 0 {
		errs = append(errs, fmt.Errorf("dataset: sampler: negative sample count %d", n))
	}
	if opts.WorldSize < 0 {
		errs = append(errs, fmt.Errorf("dataset: sampler: WorldSize %d must be positive", opts.WorldSize))
	} else if opts.Rank < 0 || opts.Rank >= opts.WorldSize {
		errs = append(errs, fmt.Errorf("dataset: sampler: Rank %d out of range [0, %d)", opts.Rank, opts.WorldSize))
	}
	if opts.BlockSamples < 0 || opts.WindowBlocks < 0 {
		errs = append(errs, fmt.Errorf("dataset: sampler: BlockSamples %d and WindowBlocks %d must not be negative", opts.BlockSamples, opts.WindowBlocks))
	}
	if opts.BlockSamples > 0 && opts.WindowBlocks == 0 {
		opts.WindowBlocks = 16
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	w, r := int64(opts.WorldSize), int64(opts.Rank)
	per := n / w
	if opts.KeepTail && r < n%w {
		per++
	}
	return &Sampler{n: n, opts: opts, per: per}, nil
}

// Len is the dataset length the sampler was built for.
func (s *Sampler) Len() int64 { return s.n }

// EpochLen is the number of samples this rank reads per epoch.
func (s *Sampler) EpochLen() int64 { return s.per }

// Order returns this rank's order for one epoch.
func (s *Sampler) Order(epoch int64) EpochOrder {
	o := EpochOrder{per: s.per, rank: int64(s.opts.Rank), world: int64(s.opts.WorldSize)}
	switch {
	case !s.opts.Shuffle:
		o.perm = IdentityPermutation(uint64(s.n))
	case s.opts.BlockSamples > 0:
		o.block = newBlockShuffle(s.n, s.opts.BlockSamples, s.opts.WindowBlocks, s.opts.Seed, epoch)
	default:
		o.perm = NewPermutation(uint64(s.n), s.opts.Seed, epoch)
	}
	return o
}

// EpochOrder is one rank's order of samples in one epoch; a small value
// that computes each index on demand.
type EpochOrder struct {
	perm             Permutation
	block            blockShuffle // used instead of perm when block.k > 0
	per, rank, world int64
}

// Len is the number of samples in the epoch for this rank.
func (o EpochOrder) Len() int64 { return o.per }

// At returns the sample index at position pos (0 <= pos < Len()).
func (o EpochOrder) At(pos int64) int64 {
	if pos < 0 || pos >= o.per {
		panic("dataset: EpochOrder.At position out of range")
	}
	g := pos*o.world + o.rank
	if o.block.k > 0 {
		return o.block.At(g)
	}
	return int64(o.perm.At(uint64(g)))
}

// blockShuffle is the block-local order of one epoch (see
// SamplerOptions.BlockSamples), a bijection of [0, n):
//
// Pad n up to nb whole blocks of k samples, D = nb*k. Position p lies in
// window w = p / (g*k) at offset o; window w holds the shuffled block slots
// [w*g, w*g+gw) (gw = g except for a short last window). A per-window
// Permutation maps o to slot s and in-block offset q, the epoch's block
// Permutation maps slot w*g+s to block b, and p goes to b*k+q. Windows
// partition both the positions and the block slots, and each step is a
// bijection, so this is a permutation of [0, D); cycle walking (as in
// Permutation) restricts it to [0, n). Only the last block is padded, so
// at most k-1 positions per epoch walk (and leave their window's blocks).
type blockShuffle struct {
	n, k, g, nb int64
	blocks      Permutation
	seed        uint64
	epoch       int64
}

func newBlockShuffle(n, k, g int64, seed uint64, epoch int64) blockShuffle {
	nb := (n + k - 1) / k
	return blockShuffle{n: n, k: k, g: g, nb: nb, seed: seed, epoch: epoch,
		blocks: NewPermutation(uint64(nb), seed, epoch)}
}

// At is the sample at global position p.
func (b blockShuffle) At(p int64) int64 {
	x := b.apply(p)
	for x >= b.n {
		x = b.apply(x)
	}
	return x
}

func (b blockShuffle) apply(p int64) int64 {
	size := b.g * b.k
	w, o := p/size, p%size
	gw := min(b.g, b.nb-w*b.g)
	// Each window's shuffle is keyed by (seed, window), mixed apart from the
	// block permutation's key. Deriving it costs a few multiplications.
	wperm := NewPermutation(uint64(gw*b.k), b.seed^mix64(uint64(w)+0x5851f42d4c957f2d), b.epoch)
	op := int64(wperm.At(uint64(o)))
	s, q := op/b.k, op%b.k
	return int64(b.blocks.At(uint64(w*b.g+s)))*b.k + q
}
