package engine

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math"
	"sort"

	"github.com/spill-ml/spill/dataset"
	"github.com/spill-ml/spill/kernels"
)

// What every rank of a data-parallel group must agree on besides the
// gradients (engine/ddp.go): the weights it starts from, the evaluation
// it reports, and, on a resume with another rank count, where the data
// continues.
//
// Initial weights. InitWeights and LoadPretrained fill the weights on
// rank 0 only and broadcast them, layer by layer, to every rank (as
// PyTorch's DDP broadcasts the parameters at construction): ranks given
// different seeds, or a rank whose copy of the pretrained file differs,
// still start from rank 0's weights, bit for bit. A resume does not
// broadcast (every rank reads the checkpoint; the moments would have to
// travel too): RestoreCheckpoint compares a digest of what each rank
// loaded (the SHA-256 of every file, checked as it was read, and the
// step) and fails on every rank, naming those that differ, when they do
// not agree.
//
// Evaluation. Evaluate is a collective under data parallelism: each rank
// evaluates its n micro-batches and every rank returns the mean over all
// ranks' n·Size micro-batches (see Trainer.Evaluate for the rounding).
//
// Resume with another world size: RemapCursor.

// bcastChunk is the number of fp32 values the weights' broadcast moves
// per collective, through a device buffer of bcastChunk·4 bytes (4 MiB)
// allocated for the broadcast and freed after it.
const bcastChunk = 1 << 20

// setMasters is hostState.setMasters for any trainer: without a
// communicator, fill runs for every layer (spread over the cores); with
// one, fill runs on rank 0 only, and each layer's master is broadcast
// from rank 0 before the trainer stores it (layer after layer: the
// collectives are in the same order on every rank).
func (t *Trainer) setMasters(ctx context.Context, fill func(i int, master []float32)) error {
	hs := t.off.host
	if t.dp == nil {
		return hs.setMasters(fill)
	}
	if err := hs.waitUpdates(); err != nil {
		return err
	}
	largest := 0
	for _, l := range t.model.Layers {
		largest = max(largest, l.NumParams())
	}
	n := min(largest, bcastChunk)
	buf, err := t.be.Alloc(4*int64(n), "weights broadcast")
	if err != nil {
		return fmt.Errorf("engine: data parallel, rank %d of %d: broadcasting the initial weights: %w", t.dp.comm.Rank(), t.dp.comm.Size(), err)
	}
	defer t.be.Free(buf)
	tensor := kernels.View(buf, 0, kernels.F32, n)
	defer hs.dropStage()
	for i := range t.model.Layers {
		var berr error
		err := hs.setMaster(i, func(m []float32) {
			if t.dp.comm.Rank() == 0 {
				fill(i, m)
			}
			berr = t.broadcastF32(ctx, tensor, m)
		})
		if err = errors.Join(berr, err); err != nil {
			return err
		}
	}
	return nil
}

// broadcastF32 overwrites x on every rank with rank 0's x, in chunks of
// buf's size (a collective: every rank calls it with the same len(x)).
func (t *Trainer) broadcastF32(ctx context.Context, buf kernels.Tensor, x []float32) error {
	dp := t.dp
	for lo := 0; lo < len(x); lo += buf.N {
		part := x[lo:min(lo+buf.N, len(x))]
		dev := buf.Slice(0, len(part))
		b := f32Bytes(part) // x's memory on a little-endian host
		err := dp.s.Enqueue("broadcast weights", func(q kernels.Queue) {
			t.be.CopyToDevice(q, dev, b)
			dp.comm.Broadcast(q, dev, dev, 0)
			t.be.CopyToHost(q, b, dev)
		})
		if err == nil {
			err = dp.s.Synchronize(ctx)
		}
		if err != nil {
			return fmt.Errorf("engine: data parallel, rank %d of %d: broadcasting the initial weights: %w", dp.comm.Rank(), dp.comm.Size(), err)
		}
		if !littleEndian { // b was a copy
			copy(part, bytesF32(b))
		}
	}
	return nil
}

// checkSameCheckpoint fails, on every rank, unless every rank restored
// the same checkpoint: the same step and the same files (their SHA-256,
// which RestoreCheckpoint checked as it read them). A no-op without a
// communicator.
func (t *Trainer) checkSameCheckpoint(ctx context.Context, st *TrainState) error {
	if t.dp == nil {
		return nil
	}
	h := sha256.New()
	fmt.Fprintf(h, "step %d", st.Step)
	names := make([]string, 0, len(st.Files))
	for name := range st.Files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		fmt.Fprintf(h, " %s:%s", name, st.Files[name])
	}
	var mine [fpBytes]byte
	copy(mine[:], h.Sum(nil))
	all, err := t.gather(ctx, mine[:])
	if err != nil {
		return err
	}
	var bad []int
	for r := range t.dp.comm.Size() {
		if string(all[r*fpBytes:(r+1)*fpBytes]) != string(all[:fpBytes]) {
			bad = append(bad, r)
		}
	}
	if bad != nil {
		return fmt.Errorf("engine: data parallel, rank %d of %d: the ranks resumed from different checkpoints "+
			"(ranks %v differ from rank 0 in the step or the files' checksums; this rank resumed step %d): "+
			"every rank must read the same checkpoint directory", t.dp.comm.Rank(), t.dp.comm.Size(), bad, st.Step)
	}
	return nil
}

// RemapCursor returns where a run whose loader was at c, sharded over
// from ranks, continues when sharded over to ranks.
//
// The sampler (dataset.Sampler) deals epoch e's global order out
// round-robin: rank r reads global positions r, r+W, r+2W, ..., and a
// Cursor counts the positions one rank has read (every rank's is the
// same: the tail is dropped). So c covers exactly the first
// c.Position·from global positions of epoch c.Epoch, whichever the
// ranks, and the global order itself depends only on the seed and the
// epoch. A group of to ranks continues exactly there, reading every
// sample the old group had not and none twice, when it starts at
// position c.Position·from/to: possible when to divides
// c.Position·from, refused otherwise with an error naming both world
// sizes. (The rest of the epoch may also include samples that the old
// group would have dropped as its tail: the new group's tail is
// smaller or larger.)
//
// from or to below 1 count as 1 (a checkpoint written before the world
// size was recorded was written by one rank or by a group that stored
// its own cursors: the caller says which).
func RemapCursor(c dataset.Cursor, from, to int) (dataset.Cursor, error) {
	from, to = max(from, 1), max(to, 1)
	if from == to {
		return c, nil
	}
	g := c.Position * int64(from)
	if g%int64(to) != 0 {
		return c, fmt.Errorf("engine: cannot resume at WORLD_SIZE %d a run saved at WORLD_SIZE %d: "+
			"%d ranks had read %d samples each of epoch %d (%d in all), which %d ranks cannot share equally "+
			"(the data would repeat or skip samples); resume with %d ranks or with a world size that divides %d",
			to, from, from, c.Position, c.Epoch, g, to, from, g)
	}
	c.Position = g / int64(to)
	return c, nil
}

// reduceMean returns the mean of n·Size values over the group, given
// this rank's float64 sum of its n: the ranks' sums added in rank order
// (globalLoss). Without a communicator, sum/n.
func (t *Trainer) reduceMean(ctx context.Context, sum float64, n int) (float64, error) {
	all, err := t.globalLoss(ctx, sum)
	if err != nil {
		return math.NaN(), err
	}
	return all / float64(n*t.worldSize()), nil
}
