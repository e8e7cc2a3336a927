package engine

import (
	"context"
	"fmt"

	"github.com/spill-ml/spill/kernels"
	"github.com/spill-ml/spill/kernels/cpu"
	"github.com/spill-ml/spill/offload"
	"github.com/spill-ml/spill/offload/plan"
)

// ZeRO-2 style sharding of the host optimizer state (TrainerOptions.
// ZeroStage, Config zero_stage, DeepSpeed's zero_optimization.stage).
//
// Under it, each of the Size ranks of a data-parallel group owns the
// range kernels.ShardRange(np, Size, Rank) of the flat parameters of
// every layer whose optimizer state is on the host (TierHost): its Adam
// moments hold that range only, and so does its fp32 master where the
// master is a buffer of its own (a compute dtype other than fp32). Every
// rank keeps the whole compute-dtype weights (the fetches read them) and
// the whole gradient landing buffer (the evictions write it).
//
// fp32. The master is the weights buffer itself, held whole, as without
// sharding: each rank's AdamW updates its range of it in place and the
// all-gather fills in the other ranks' ranges. Only the moments are
// sharded: a rank holds 4·np + 8·np/Size bytes of a layer's optimizer
// state and weights, where a master shard beside whole weights would
// hold 4·np/Size more for nothing (the weights are the master's values,
// bit for bit). The planner counts the same (plan.HostStateRanks).
//
// A step:
//   - As a sharded layer's gradients become final, the comm queue copies
//     them into a padded device buffer (zbuf, ShardLen*Size elements of
//     the largest sharded layer), reduce-scatters it (ZeRO-2: no
//     all-reduce) and copies the rank's reduced range back into the
//     gradients, whose eviction takes it to the host. The rest of the
//     rank's gradient buffer holds its local, unreduced gradients, which
//     nothing reads.
//   - Statistics: the rank's sum of squares and non-finite flag of its
//     range go to the layer's stats; the layers that stay unsharded
//     (all-reduced) keep theirs on rank 0 and zero them on the others;
//     at the step's last op the stats are all-reduced. So every rank sees
//     the same global norm and overflow verdict.
//   - The host updates wait for that verdict (no eager updates under
//     sharding: a layer's shards would otherwise be judged finite on some
//     ranks and not on others). Each rank runs AdamW on its range, writing
//     the range of its compute-dtype weights; then every rank all-gathers
//     the updated weights through zbuf into its host weights buffer
//     before the step returns.
//
// What is not sharded in this first step: layers whose optimizer state is
// on the device (all-reduced and updated whole on every rank, as in plain
// data parallelism) and on the disk tier (likewise). Sharding needs
// immediate updates (no DelayedUpdate). The gather of the weights is not
// overlapped with the next step's forward, and on a GPU it stages
// through the device (shard up, gather, whole layer down): gathering into
// the device copy the next forward fetches is the next step.
//
// Bitwise: the fake communicator's reduce-scatter sums in the same rank
// order as its all-reduce and AdamW is elementwise, so without clipping
// the sharded run equals the unsharded data-parallel run bit for bit.
// With clipping the global norm is the rank-order sum of the shards'
// sums of squares instead of one sum over the whole layer, which rounds
// differently in the last bits: the clip coefficient (and so the
// weights) agree to about 1e-7 relative.
//
// Checkpoints hold whole tensors, whatever the rank count: saving gathers
// the sharded layers' master and moments (a collective: every rank calls
// CheckpointTensors, rank 0 writes), and restoring keeps each rank's range
// of every tensor it reads. So a run saved with N ranks resumes with M.

// zeroShard is the sharding of a trainer's host optimizer state: rank of
// size, or size 0 when off.
type zeroShard struct{ rank, size int }

// on reports whether sharding is on.
func (z zeroShard) on() bool { return z.size > 0 }

// shardOf is layer i's range of np parameters under o: the rank's range
// when the layer is sharded (optimizer on the host), else [0, np).
func (o *OffloadOptions) shardOf(i, np int) (lo, hi int) {
	if !o.sharded(i) {
		return 0, np
	}
	return kernels.ShardRange(np, o.zero.size, o.zero.rank)
}

// sharded reports whether layer i's optimizer state is sharded.
func (o *OffloadOptions) sharded(i int) bool {
	return o.zero.on() && o.optTier(i) == offload.TierHost
}

// shardCap is how many elements of layer i's np parameters a rank's
// sharded buffers are allocated with: kernels.ShardLen on every rank
// (the last ranks' ranges are shorter, or empty: padded, so that each
// rank holds what the planner counts), np when not sharded.
func (o *OffloadOptions) shardCap(i, np int) int {
	if !o.sharded(i) {
		return np
	}
	return kernels.ShardLen(np, o.zero.size)
}

// masterOf is the range of layer i's np parameters that its host master
// buffer holds: the rank's range when the layer is sharded and its
// master is a buffer of its own (dt not fp32, or a delayed update),
// else [0, np) (in fp32 the master is the whole weights buffer).
func (o *OffloadOptions) masterOf(dt kernels.DType, i, np int) (lo, hi int) {
	if dt == kernels.F32 && !o.DelayedUpdate {
		return 0, np
	}
	return o.shardOf(i, np)
}

// zeroBytes is the size of zbuf: 4 bytes (fp32 for the gathers of the
// moments) per element of the largest sharded layer, padded
// (plan.CommBytes, which the planner counts).
func zeroBytes(m *Model, o *OffloadOptions) int64 {
	if !o.zero.on() {
		return 0
	}
	var sharded []int64
	for i, l := range m.Layers {
		if o.sharded(i) {
			sharded = append(sharded, int64(l.NumParams()))
		}
	}
	return plan.CommBytes(o.zero.size, sharded)
}

// reduceScatterGrads enqueues on the comm queue cq the reduce-scatter of
// layer j's gradients g and the statistics of the rank's range (see
// above).
func (t *Trainer) reduceScatterGrads(cq kernels.Queue, j int, g kernels.Tensor) {
	dp, be := t.dp, t.be
	size, rank := dp.comm.Size(), dp.comm.Rank()
	np := g.N
	L := kernels.ShardLen(np, size)
	lo, hi := kernels.ShardRange(np, size, rank)
	buf := kernels.View(dp.zbuf, 0, g.DType, L*size)
	be.CopyDevice(cq, buf.Slice(0, np), g)
	mine := buf.Slice(rank*L, L)
	dp.comm.ReduceScatter(cq, mine, buf)
	if hi == lo {
		be.Zero(cq, t.stats.Slice(2*j, 2))
		return
	}
	own := g.Slice(lo, hi-lo)
	be.CopyDevice(cq, own, mine.Slice(0, hi-lo))
	be.SumSquaresFinite(cq, t.stats.Slice(2*j, 2), own)
}

// reduceStats enqueues, after q's work so far, the all-reduce of the
// step's statistics on the comm queue (sharding only).
func (t *Trainer) reduceStats(q kernels.Queue) error {
	dp := t.dp
	ev, err := t.be.RecordEvent(q)
	if err == nil {
		err = dp.s.Wait(ev)
	}
	if err == nil {
		err = dp.s.Enqueue("all-reduce stats", func(cq kernels.Queue) {
			dp.comm.AllReduce(cq, t.stats, t.stats)
		})
	}
	dp.pending = true
	return err
}

// gatherWeights waits for the host updates and all-gathers the updated
// compute-dtype weights of every sharded layer into every rank's host
// weights buffer.
func (t *Trainer) gatherWeights(ctx context.Context) error {
	hs := t.off.host
	if err := hs.waitUpdates(); err != nil {
		return err
	}
	dt := t.model.DType
	es := dt.Size()
	for i, l := range t.model.Layers {
		if !hs.opts.sharded(i) {
			continue
		}
		w := hs.host[i].weights
		if err := t.gatherShard(ctx, dt, l.NumParams(), w[:l.NumParams()*es], hs.opts.shardSlice(w, i, l.NumParams(), es)); err != nil {
			return err
		}
	}
	return nil
}

// shardSlice is the rank's range of layer i's host buffer b of np
// elements of es bytes.
func (o *OffloadOptions) shardSlice(b []byte, i, np, es int) []byte {
	lo, hi := o.shardOf(i, np)
	return b[lo*es : hi*es]
}

// gatherShard all-gathers, through zbuf, the ranks' ranges (mine, this
// rank's) of a tensor of np elements of dt into dst (np elements), and
// waits for it.
func (t *Trainer) gatherShard(ctx context.Context, dt kernels.DType, np int, dst, mine []byte) error {
	dp, be := t.dp, t.be
	size, rank := dp.comm.Size(), dp.comm.Rank()
	L := kernels.ShardLen(np, size)
	buf := kernels.View(dp.zbuf, 0, dt, L*size)
	err := dp.s.Enqueue("all-gather shard", func(cq kernels.Queue) {
		if len(mine) > 0 {
			be.CopyToDevice(cq, buf.Slice(rank*L, len(mine)/dt.Size()), mine)
		}
		dp.comm.AllGather(cq, buf, buf.Slice(rank*L, L))
		be.CopyToHost(cq, dst, buf.Slice(0, np))
	})
	if err == nil {
		err = dp.s.Synchronize(ctx)
	}
	if err != nil {
		return fmt.Errorf("engine: data parallel, rank %d of %d: gathering a shard: %w", rank, size, err)
	}
	return nil
}

// gatherOptim returns whole copies of sharded layer i's master, m and v,
// gathered from every rank (a collective: every rank must call it for
// the same layers in the same order).
func (t *Trainer) gatherOptim(ctx context.Context, i int) (master, m, v []byte, err error) {
	hs := t.off.host
	if err := hs.waitUpdates(); err != nil {
		return nil, nil, nil, err
	}
	h := &hs.host[i]
	np := t.model.Layers[i].NumParams()
	var out [3][]byte
	for k, mine := range [3][]byte{h.master, h.m, h.v} {
		out[k] = offload.NewF32Bytes(4 * int64(np))
		if k == ckptMaster && len(mine) == 4*np {
			copy(out[k], mine) // an fp32 master: whole, and gathered already
			continue
		}
		if err := t.gatherShard(ctx, kernels.F32, np, out[k], mine); err != nil {
			return nil, nil, nil, err
		}
	}
	return out[0], out[1], out[2], nil
}

// layerOptim is hostState.optim, gathered for a sharded layer.
func (t *Trainer) layerOptim(ctx context.Context, i int) (master, m, v []byte, err error) {
	if t.off.opts.sharded(i) {
		return t.gatherOptim(ctx, i)
	}
	return t.off.host.optim(ctx, i)
}

// ShardsOptimizer reports whether the trainer shards its host optimizer
// state over the ranks (TrainerOptions.ZeroStage): a checkpoint is then
// a collective that every rank takes part in.
func (t *Trainer) ShardsOptimizer() bool { return t.off != nil && t.off.opts.zero.on() }

// OptimizerHostBytes is the host memory of the fp32 master weights and
// Adam moments this rank holds (the layers whose optimizer state is in
// host RAM): about 1/Size of the model's under sharding, except for an
// fp32 master, which is the weights, held whole on every rank.
func (t *Trainer) OptimizerHostBytes() int64 {
	var n int64
	for i := range t.off.host.host {
		h := &t.off.host.host[i] // not a copy: an update in flight writes its other fields
		if h.m != nil {          // host tier (the disk tier's moments are in files)
			n += int64(len(h.master) + len(h.m) + len(h.v))
		}
	}
	return n
}

// setShardMaster is setMaster for a sharded layer: fill writes the whole
// master in a scratch; the layer keeps the rank's range of it and the
// whole compute-dtype copy.
func (hs *hostState) setShardMaster(i int, fill func(master []float32)) error {
	h := &hs.host[i]
	np := hs.m.Layers[i].NumParams()
	full := make([]float32, np)
	fill(full)
	lo, hi := hs.opts.masterOf(hs.m.DType, i, np)
	copy(offload.F32s(h.master), full[lo:hi]) // in fp32, the weights too
	hs.setWeights(h.weights, full)
	return hs.markHostModified(i)
}

// setShardTensor is setTensor for a sharded layer: data is parameter ps's
// whole tensor of kind; the layer keeps the part in the rank's range (and,
// for the master, the whole compute-dtype copy).
func (hs *hostState) setShardTensor(i, kind int, ps ParamSpec, data []byte) error {
	h := &hs.host[i]
	np := hs.m.Layers[i].NumParams()
	s0, s1 := hs.opts.shardOf(i, np)
	if kind == ckptMaster {
		s0, s1 = hs.opts.masterOf(hs.m.DType, i, np)
	}
	lo, hi := max(ps.Offset, s0), min(ps.Offset+ps.Elems(), s1)
	if lo < hi {
		dst := [3][]byte{h.master, h.m, h.v}[kind]
		copy(dst[4*(lo-s0):4*(hi-s0)], data[4*(lo-ps.Offset):4*(hi-ps.Offset)])
	}
	if kind != ckptMaster {
		return nil
	}
	es := hs.m.DType.Size()
	w := h.weights[ps.Offset*es : (ps.Offset+ps.Elems())*es]
	if hs.m.DType == kernels.F32 {
		copy(w, data) // data may be unaligned: no float view
	} else {
		hs.setWeights(w, bytesF32(data))
	}
	return hs.markHostModified(i)
}

// setWeights stores the fp32 values x as the compute-dtype weights w,
// rounded as the device Cast rounds.
func (hs *hostState) setWeights(w []byte, x []float32) {
	if hs.m.DType == kernels.F32 {
		copy(offload.F32s(w), x)
		return
	}
	cpu.StoreF32(w, hs.m.DType, x)
}
