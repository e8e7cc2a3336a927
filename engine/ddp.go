package engine

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/spill-ml/spill/kernels"
	"github.com/spill-ml/spill/offload"
	"github.com/spill-ml/spill/stream"
)

// Data parallelism (DDP). A trainer given a communicator
// (TrainerOptions.Comm) is one of Size ranks that train one model on
// Size times the batch: each rank runs the step's program on its own
// micro-batches, and the ranks' gradients are summed before anything
// reads them, so every rank takes the same optimizer step, the one a
// single trainer of the global batch would take.
//
// The global batch. B, T and Accum are per rank (as with torchrun and
// PyTorch's DDP): a step trains on Size x Accum x B rows, and
// TokensPerStep counts all of them. The loss gradient of every rank is
// normalised by that global count (Pass.LossGrad), so the sum of the
// ranks' gradients is the gradient of the mean loss over the global
// batch: no division by Size afterwards.
//
// Gradients. As each layer's gradients become final for the step (the
// executor's final list: after its last backward, with the tied
// gradients added), the compute queue records an event and the comm
// queue, a queue of its own, waits for it and all-reduces them in place,
// then takes their sum of squares and finiteness flag from the reduced
// values. So the reduction of layer i overlaps the backward of layers
// i-1, ..., 0 on the compute queue. The compute queue waits for the comm
// queue once, at the step's last op, before the statistics are copied to
// the host and the device optimizer runs. A layer whose optimizer is on
// the host (or disk) has its final gradients copied to the host right
// after the op that finished them, so for such layers the compute queue
// waits for the reduction at once: correct, not overlapped (a dedicated
// eviction after the comm queue is the way to overlap them too).
//
// Statistics. The gradient norm and the non-finite flag come from the
// reduced gradients, which every rank holds bit for bit (an all-reduce
// hands every rank the same result), so clipping and the decision to
// skip a step on overflow are the same on every rank. The reported loss
// is the global mean: each rank's float64 sum of its losses is gathered
// (AllGather of the 8 bytes, exact) and the sums are added in rank order.
//
// Host-optimizer layers update identically on every rank: each holds the
// whole fp32 master and moments and runs the same AdamW on the same
// reduced gradients, unless TrainerOptions.ZeroStage shards that state
// 1/Size per rank (engine/zero.go: reduce-scatter of the gradients,
// all-gather of the updated weights, checkpoints that resume with any
// rank count).
// MicroLoss stays local to each rank; Evaluate is reduced over the ranks,
// and the initial weights are rank 0's (engine/ddp_sync.go).

// dataParallel is a trainer's side of the group: the communicator, the
// comm queue, and the small device buffers of the loss and handshake
// gathers.
type dataParallel struct {
	comm kernels.Comm
	s    *stream.Stream // the comm queue
	// send and recv are the device buffers of the gathers: fpBytes per
	// rank (the handshake; the loss uses the first 8).
	send, recv kernels.Tensor
	host       []byte // recv's host copy
	// zbuf is the padded device buffer of the sharded layers' collectives
	// (engine/zero.go), nil without sharding.
	zbuf    kernels.Buffer
	pending bool // collectives enqueued since the compute queue last waited
	// err is the first failure to order the queues during a program's
	// run (events fail only on a broken backend); runProgram returns it.
	err error
}

// fpBytes is the size of a rank's fingerprint in the handshake.
const fpBytes = 32

// worldSize is the number of ranks training together (1 without a Comm).
func (t *Trainer) worldSize() int {
	if t.opts.Comm == nil {
		return 1
	}
	return t.opts.Comm.Size()
}

// newDataParallel creates the comm queue and, with tensor, the device
// buffers of the gathers.
// zbytes > 0 adds zbuf, of that many bytes.
func newDataParallel(be kernels.Backend, comm kernels.Comm, rec *stream.Recorder, tensor func(int, kernels.DType) kernels.Tensor, zbytes int64) (*dataParallel, error) {
	s, err := stream.New(be, "comm", stream.Comm, rec)
	if err != nil {
		return nil, fmt.Errorf("engine: data parallel: %w", err)
	}
	n := comm.Size()
	dp := &dataParallel{comm: comm, s: s, send: tensor(fpBytes, kernels.U8), recv: tensor(fpBytes*n, kernels.U8),
		host: make([]byte, fpBytes*n)}
	if zbytes > 0 {
		dp.zbuf = tensor(int(zbytes), kernels.U8).Buf
	}
	return dp, nil
}

func (dp *dataParallel) close() {
	if dp != nil && dp.s != nil {
		_ = dp.s.Synchronize(context.Background())
		dp.s.Close()
	}
}

// gather all-gathers the first n bytes of msg (n <= fpBytes) from every
// rank and returns them, rank after rank, n bytes each. It waits for the
// comm queue.
func (t *Trainer) gather(ctx context.Context, msg []byte) ([]byte, error) {
	dp := t.dp
	n := len(msg)
	size := dp.comm.Size()
	send, recv := dp.send.Slice(0, n), dp.recv.Slice(0, n*size)
	err := dp.s.Enqueue("gather", func(q kernels.Queue) {
		t.be.CopyToDevice(q, send, msg)
		dp.comm.AllGather(q, recv, send)
		t.be.CopyToHost(q, dp.host[:n*size], recv)
	})
	if err != nil {
		return nil, err
	}
	if err := dp.s.Synchronize(ctx); err != nil {
		return nil, fmt.Errorf("engine: data parallel, rank %d of %d: %w", dp.comm.Rank(), size, err)
	}
	return dp.host[:n*size], nil
}

// handshake checks that every rank trains the same model with the same
// options, so that a rank built differently fails here, on every rank,
// instead of desynchronising (or hanging) the collectives of the steps.
// Every rank gathers the same fixed-size fingerprint: a mismatch cannot
// hang even on NCCL.
func (t *Trainer) handshake(ctx context.Context) error {
	fp := t.fingerprint()
	all, err := t.gather(ctx, fp[:])
	if err != nil {
		return err
	}
	me := t.dp.comm.Rank()
	var bad []error
	for r := range t.dp.comm.Size() {
		other := all[r*fpBytes : (r+1)*fpBytes]
		if string(other) != string(fp[:]) {
			bad = append(bad, fmt.Errorf("rank %d trains %s", r, describeFingerprint(other)))
		}
	}
	if bad != nil {
		return fmt.Errorf("engine: data parallel, rank %d of %d: the ranks train different models or options "+
			"(every rank must build the same model with the same batch, precision and optimizer settings): "+
			"this rank trains %s; %w", me, t.dp.comm.Size(), describeFingerprint(fp[:]), errors.Join(bad...))
	}
	return nil
}

// fingerprint is what the handshake compares: the number of layers and
// of parameters, the micro-batch, and a hash of everything else that
// must agree (each layer's name and size, the dtype, the accumulation,
// the optimizer and loss scaling settings).
func (t *Trainer) fingerprint() [fpBytes]byte {
	m, o := t.model, t.opts
	h := sha256.New()
	fmt.Fprintf(h, "%s %v B%d T%d A%d", m.Family, m.DType, o.B, o.T, o.Accum)
	var np int64
	for _, l := range m.Layers {
		np += int64(l.NumParams())
		fmt.Fprintf(h, " %s:%d:%v", l.Name(), l.NumParams(), l.Tied())
	}
	fmt.Fprintf(h, " %+v wd%v b%v,%v eps%v clip%v scale%v/%d", o.Schedule, o.WeightDecay, o.Beta1, o.Beta2, o.Eps,
		o.GradClip, o.LossScale, o.ScaleWindow)
	if o.ZeroStage > 0 { // only when set: unsharded fingerprints are unchanged
		fmt.Fprintf(h, " zero%d", o.ZeroStage)
	}
	var fp [fpBytes]byte
	le := binary.LittleEndian
	le.PutUint32(fp[0:], uint32(len(m.Layers)))
	le.PutUint64(fp[4:], uint64(np))
	le.PutUint32(fp[12:], uint32(o.B))
	le.PutUint32(fp[16:], uint32(o.T))
	copy(fp[20:], h.Sum(nil))
	return fp
}

func describeFingerprint(fp []byte) string {
	le := binary.LittleEndian
	return fmt.Sprintf("%d layers, %d parameters, micro-batch %dx%d, settings %x",
		le.Uint32(fp[0:]), le.Uint64(fp[4:]), le.Uint32(fp[12:]), le.Uint32(fp[16:]), fp[20:26])
}

// reduceGrads enqueues, for the layers in final (whose gradients the op
// just enqueued on q made final), the all-reduce of their gradients and
// their statistics on the comm queue, after q's work so far. A layer
// whose gradients leave for the host next makes q wait for it.
func (t *Trainer) reduceGrads(q kernels.Queue, final []int) {
	dp := t.dp
	be := t.be
	ev, err := be.RecordEvent(q)
	if err == nil {
		err = dp.s.Wait(ev)
	}
	if err == nil {
		err = dp.s.Enqueue("all-reduce grads", func(cq kernels.Queue) {
			o := &t.off.opts
			var whole []int // all-reduced: the layers that are not sharded
			for _, j := range final {
				if !o.sharded(j) {
					whole = append(whole, j)
				}
			}
			if len(whole) > 1 {
				dp.comm.GroupStart(cq)
			}
			for _, j := range whole {
				g := t.st.Layers[j].Grads
				dp.comm.AllReduce(cq, g, g)
			}
			if len(whole) > 1 {
				dp.comm.GroupEnd(cq)
			}
			for _, j := range whole {
				if o.zero.on() && dp.comm.Rank() != 0 {
					// The stats are all-reduced at the step's end: rank
					// 0's stand for every rank's (engine/zero.go).
					be.Zero(cq, t.stats.Slice(2*j, 2))
					continue
				}
				g := t.st.Layers[j].Grads
				be.SumSquaresFinite(cq, t.stats.Slice(2*j, 2), g)
			}
			for _, j := range final {
				if o.sharded(j) { // one after the other: they share zbuf
					t.reduceScatterGrads(cq, j, t.st.Layers[j].Grads)
				}
			}
		})
	}
	dp.pending = true
	wait := false
	for _, j := range final {
		wait = wait || t.off.host.tier[j] != offload.TierDevice
	}
	if err == nil && wait {
		err = t.waitComm(q)
	}
	if err != nil && dp.err == nil {
		dp.err = fmt.Errorf("engine: data parallel: ordering the comm queue: %w", err)
	}
}

// waitComm makes q wait for the collectives enqueued so far.
func (t *Trainer) waitComm(q kernels.Queue) error {
	dp := t.dp
	if !dp.pending {
		return nil
	}
	ev, err := dp.s.Record()
	if err != nil {
		return err
	}
	dp.pending = false
	return t.be.WaitEvent(q, ev)
}

// globalLoss returns the sum of the losses of every rank, given this
// rank's: the float64 sums are gathered exactly and added in rank order.
func (t *Trainer) globalLoss(ctx context.Context, local float64) (float64, error) {
	if t.dp == nil {
		return local, nil
	}
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], math.Float64bits(local))
	all, err := t.gather(ctx, b[:])
	if err != nil {
		return 0, err
	}
	var sum float64
	for r := range t.dp.comm.Size() {
		x := math.Float64frombits(binary.LittleEndian.Uint64(all[8*r:]))
		if r == 0 {
			sum = x
		} else {
			sum += x
		}
	}
	return sum, nil
}
