package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/spill-ml/spill/kernels"
	"github.com/spill-ml/spill/offload"
	"github.com/spill-ml/spill/offload/exec"
	"github.com/spill-ml/spill/offload/plan"
	"github.com/spill-ml/spill/offload/schedule"
	"github.com/spill-ml/spill/stream"
)

// OffloadOptions say where a Trainer keeps each class of layer state when
// it trains out of core (NewOffloadTrainer): the placement the step's
// program (offload/schedule) is compiled from. PlanTrainer chooses them.
type OffloadOptions struct {
	// Weights is the home of the compute-dtype weights: TierDevice keeps
	// them resident, TierHost streams them layer by layer, Prefetch
	// accesses ahead of the compute.
	Weights offload.Tier
	// Grads is the home of the gradients: TierDevice keeps them resident
	// for the whole step; TierHost sends each layer's to the host after
	// each run of backwards that accumulates into them (once per group of
	// micro-batches) and fetches them back for the next.
	Grads offload.Tier
	// Optimizer is where the fp32 master weights and the Adam moments live
	// and where AdamW runs: TierHost (in RAM) or TierDisk (the moments in
	// files under DiskDir, the master in RAM unless DiskMaster). The host
	// optimizer is offload.HostAdamW, bitwise identical to the CPU
	// backend's kernel.
	Optimizer offload.Tier
	// OptimizerTiers, if not nil, is each layer's optimizer tier and
	// overrides Optimizer: TierDevice keeps the layer's master and moments
	// on the device, with its weights and gradients, and updates them
	// there with the backend's AdamW once the step's gradients are final;
	// TierHost and TierDisk as Optimizer says. Not with DelayedUpdate.
	OptimizerTiers []offload.Tier
	// Prefetch is how many layer accesses ahead streamed tensors are
	// fetched (>= 1 when Weights or Grads stream). Default 1.
	Prefetch int
	// Activations is each layer's activation policy; nil keeps all.
	// Recompute keeps only the layer's output (the next layer's input)
	// and reruns its forward before its backward. OffloadTo copies the
	// layer's activations to host memory once the next layer's forward
	// has read them and fetches them back (Prefetch accesses ahead) for
	// the backward. Both are ignored for the first and last layer.
	Activations []offload.ActPolicy
	// Group is how many micro-batches run layer by layer together: 1
	// (the default) is micro-batch-major, the accumulation steps
	// layer-major (streamed weights cross once per group for the forward
	// and once for the backward, gradients leave once per group).
	Group int
	// DeviceBudget is the hard limit of the device cache in bytes; 0 means
	// only the backend's own limit applies.
	DeviceBudget int64
	// DiskDir and DiskBudget configure the disk tier (Optimizer TierDisk).
	DiskDir    string
	DiskBudget int64
	// DiskMaster keeps the fp32 master weights of the disk layers on disk
	// too, read ahead and written back with their moments (engine/
	// ooc_host.go); the host keeps their compute-dtype weights and
	// gradients only. Mixed precision or DelayedUpdate only
	// (plan.CanMasterOnDisk): in fp32 the master is the weights.
	DiskMaster bool
	// Recorder, if not nil, traces every op of the three streams and the
	// host optimizer.
	Recorder *stream.Recorder
	// DelayedUpdate runs the host optimizer of step t during the forward
	// and backward of step t+1 (DeepSpeed's delayed parameter update):
	// step t+1 computes on the weights of step t-1, one step stale, and
	// the update is off the critical path. The host keeps two copies of
	// the compute-dtype weights and of the gradients. Default off: every
	// step sees the weights of the previous update, as NewTrainer's do.
	DelayedUpdate bool
	// Speculate updates each host layer (optimizer on TierHost) during
	// the backward, as soon as its final gradients land, before the step's
	// gradient norm is known, assuming the gradients will not be clipped:
	// into a second copy of the layer's master, weights and moments
	// (HostAdamWFrom), which becomes the layer's state when the norm is
	// within the clip and the step not skipped (the bits of updating after
	// the norm), and is dropped otherwise (the layer is then updated after
	// the norm, as without it, and the next step does not speculate:
	// Trainer.clipped). It matters only when the updates wait for
	// the norm (clipping or fp16 loss scaling); the host holds the second
	// copy (plan.SpecState). Not with DelayedUpdate or a sharded
	// optimizer.
	Speculate bool
	// HostBudget is the budget of the host pool that holds the layer
	// state (master weights, moments, gradient and weight buffers,
	// offloaded activations) in pinned slabs; 0 means what the state
	// needs (OffloadHostBytes). The pool checks RLIMIT_MEMLOCK (when its
	// memory counts against it) and MemAvailable first: when it would
	// degrade, or the state does not fit its budget, the state is kept in
	// ordinary Go memory instead and HostPinning says why. When it
	// degrades, the copies of that state to and from the device pass
	// through the degraded pool's small ring of pinned staging buffers.
	HostBudget int64
	// HostPinner supplies the pinned memory; nil means the backend's own
	// allocator when it has one (kernels.PinnedAllocator, CUDA's
	// cuMemHostAlloc), else unlocked anonymous mappings off the Go heap
	// (offload.MmapPinner).
	HostPinner offload.Pinner
	// HostLimits, if set, replaces offload.ReadLimits (tests).
	HostLimits func() (offload.Limits, error)

	// zero is the sharding of the host optimizer state (engine/zero.go),
	// from TrainerOptions.ZeroStage and Comm.
	zero zeroShard

	// resident marks NewTrainer's placement: the program in which
	// everything is persistent (schedule.Spec.Resident), with the io
	// buffers of one micro-batch.
	resident bool
	// forward marks newForwardTrainer's: forward passes only, the host
	// holding the weights alone (eval_trainer.go).
	forward bool
}

func (o *OffloadOptions) validate(m *Model) error {
	var errs []error
	if o.Weights != offload.TierDevice && o.Weights != offload.TierHost {
		errs = append(errs, fmt.Errorf("weights on %s: want device or host", o.Weights))
	}
	if o.Grads != offload.TierDevice && o.Grads != offload.TierHost {
		errs = append(errs, fmt.Errorf("grads on %s: want device or host", o.Grads))
	}
	if o.OptimizerTiers == nil && o.Optimizer != offload.TierHost && o.Optimizer != offload.TierDisk {
		errs = append(errs, fmt.Errorf("optimizer on %s: want host or disk", o.Optimizer))
	}
	if o.OptimizerTiers != nil && len(o.OptimizerTiers) != len(m.Layers) {
		errs = append(errs, fmt.Errorf("%d optimizer tiers for %d layers", len(o.OptimizerTiers), len(m.Layers)))
	}
	var disk, dev bool
	for i := range m.Layers {
		switch t := o.optTier(i); t {
		case offload.TierDisk:
			disk = true
		case offload.TierDevice:
			dev = true
		case offload.TierHost:
		default:
			errs = append(errs, fmt.Errorf("layer %d's optimizer on %s: want device, host or disk", i, t))
		}
	}
	if disk && (o.DiskDir == "" || o.DiskBudget <= 0) {
		errs = append(errs, fmt.Errorf("optimizer on disk needs a disk directory and budget"))
	}
	if o.DiskMaster && !plan.CanMasterOnDisk(m.DType != kernels.F32, o.DelayedUpdate) {
		errs = append(errs, fmt.Errorf("master weights on disk need mixed precision or a delayed update (in fp32 the master is the weights)"))
	}
	if o.zero.on() && o.DelayedUpdate {
		errs = append(errs, fmt.Errorf("a sharded optimizer (zero_stage) needs immediate updates, not a delayed one"))
	}
	if o.Speculate && (o.DelayedUpdate || o.zero.on() || o.forward) {
		errs = append(errs, fmt.Errorf("a speculative update needs immediate, unsharded updates (not a delayed one, not a sharded optimizer)"))
	}
	if dev && o.DelayedUpdate {
		errs = append(errs, fmt.Errorf("a delayed update needs every layer's optimizer off the device"))
	}
	if o.Activations != nil && len(o.Activations) != len(m.Layers) {
		errs = append(errs, fmt.Errorf("%d activation policies for %d layers", len(o.Activations), len(m.Layers)))
	}
	if o.Prefetch < 0 || o.Group < 0 {
		errs = append(errs, fmt.Errorf("prefetch %d and group %d must be >= 0", o.Prefetch, o.Group))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("engine: offload options: %w", err)
	}
	return nil
}

// optTier is the tier of layer l's optimizer state.
func (o *OffloadOptions) optTier(l int) offload.Tier {
	if o.OptimizerTiers != nil {
		return o.OptimizerTiers[l]
	}
	return o.Optimizer
}

// programSpec is the schedule of m's training step (accum micro-batches
// of B rows of T positions) or, when !train, of one evaluation pass, under
// placement o.
func programSpec(m *Model, B, T, accum int, o *OffloadOptions, train bool) schedule.Spec {
	s := schedule.Spec{MicroBatches: accum, Group: o.Group, Weights: o.Weights, Grads: o.Grads,
		Acts: o.Activations, Prefetch: o.Prefetch, Train: train, Resident: o.resident,
		SharedDGrad: o.resident && m.Family.InPlaceResidual()}
	if !train {
		s.MicroBatches, s.Group, s.Acts = 1, 1, nil
	}
	if slices.Contains(o.OptimizerTiers, offload.TierDevice) {
		s.Optimizer = o.OptimizerTiers
	}
	es := int64(m.DType.Size())
	for _, l := range m.Layers {
		np := int64(l.NumParams())
		sl := schedule.Layer{
			ParamBytes:  np * es,
			ActBytes:    l.ActivationBytes(B, T),
			OutBytes:    int64(l.OutputElems(B, T)) * es,
			SaveBytes:   selectiveBytes(l, B, T),
			Tied:        l.Tied(),
			MomentBytes: 4 * np,
		}
		if m.DType != kernels.F32 {
			sl.MasterBytes = 4 * np
		}
		s.Layers = append(s.Layers, sl)
	}
	return s
}

// offloadState is a Trainer's machinery: the step's compiled programs,
// the executor that runs them, the host state and the device buffers
// outside the programs.
type offloadState struct {
	opts    OffloadOptions
	cache   *offload.Cache
	table   *offload.Table
	streams *stream.Set
	// h2d, d2h and opt are the compute queue under the names of the
	// trainer's own uploads, read-backs and device AdamW in traces.
	h2d, d2h, opt *stream.Stream
	exec          *exec.Executor
	host          *hostState
	train         *schedule.Program
	eval          *schedule.Program
	fixed         []*offload.Block
	// predicted device bytes of the fixed buffers
	fixedBytes int64
	// The io buffers: slots micro-batches' device input, targets and
	// losses (views of one buffer each; micro-batch k uses slot k %
	// slots), and the step's host batches, losses and gradient
	// statistics (page-locked where the backend can).
	slots        int
	in, tg, loss []kernels.Tensor
	hbs          []HostBatch
	evalHB       [1]HostBatch
	lossHost     []byte
	statBuf      []byte
	// batches are the host batches of the program being run, filled from
	// src (when not nil, with ctx) as the program reaches them; last is
	// the training program's last op; names are the trace names of the io
	// ops.
	batches []HostBatch
	src     BatchSource
	ctx     context.Context
	last    schedule.Op
	names   ioNames
	// dgrad is the gradient of each layer's output bound for the op
	// being enqueued.
	dgrad []kernels.Tensor
	// tiedBy lists, for each layer, the layers tied to it and the index
	// of their TiedGrads that accumulates its gradients.
	tiedBy [][][2]int
	// accessHook, if set, runs after each op of a program is enqueued and
	// the blocks around it freed and allocated (tests).
	accessHook func(j int)
}

// ioNames are the trace names of a trainer's io ops, per micro-batch, and
// of its device AdamW, per layer.
type ioNames struct{ upload, losses, adamw []string }

// Residency is a snapshot of an out-of-core trainer's residency table:
// where each tensor of each layer has a valid copy (nil for a resident
// trainer, whose tensors never move). Between steps activations have no
// entries; during a step each live one has.
func (t *Trainer) Residency() []offload.Residency {
	if t.off.opts.resident {
		return nil
	}
	return t.off.table.Snapshot()
}

// ResidencyErr is the first residency transition the table refused (a
// bookkeeping bug: the table no longer says where tensors are), or nil.
func (t *Trainer) ResidencyErr() error {
	t.off.host.mu.Lock()
	err := t.off.host.tabErr
	t.off.host.mu.Unlock()
	return errors.Join(t.off.exec.Err(), err)
}

// HostPinning reports how an out-of-core trainer holds its host state:
// pinned is true when all of it is in the host pool's slabs (page-locked,
// or on the CPU backend anonymous mappings off the Go heap); note says what
// the pool decided and why. A trainer without host state (a resident one)
// returns false, "".
func (t *Trainer) HostPinning() (pinned bool, note string) {
	if t.off.host.bytes == 0 {
		return false, ""
	}
	return t.off.host.pinned, t.off.host.note
}

// NewOffloadTrainer returns a Trainer that keeps the model's state where o
// says and streams it through the device: the same steps, bitwise, as
// NewTrainer's on the CPU backend, within a device budget that need not
// hold the weights, gradients and optimizer state.
func NewOffloadTrainer(be kernels.Backend, m *Model, to TrainerOptions, o OffloadOptions) (t *Trainer, err error) {
	o.resident = false
	return newTrainer(be, m, to, o)
}

// newTrainer builds the trainer of placement o: NewTrainer's (resident)
// or NewOffloadTrainer's.
func newTrainer(be kernels.Backend, m *Model, to TrainerOptions, o OffloadOptions) (t *Trainer, err error) {
	if to.B <= 0 || to.T <= 0 || to.Accum <= 0 {
		return nil, fmt.Errorf("engine: trainer: batch %d, seq %d, accum %d must be positive", to.B, to.T, to.Accum)
	}
	if err := CheckBackend(be, m); err != nil {
		return nil, err
	}
	switch {
	case to.ZeroStage < 0 || to.ZeroStage > 2:
		return nil, fmt.Errorf("engine: trainer: ZeRO stage %d: want 0 (off), 1 or 2", to.ZeroStage)
	case to.ZeroStage > 0 && to.Comm != nil:
		o.zero = zeroShard{rank: to.Comm.Rank(), size: to.Comm.Size()}
	}
	if err := o.validate(m); err != nil {
		return nil, err
	}
	o.Prefetch = max(o.Prefetch, 1)
	o.Group = min(max(o.Group, 1), to.Accum)
	B, T, A := to.B, to.T, to.Accum
	st := &offloadState{opts: o, table: offload.NewTable(), slots: ioSlots(&o, A)}
	if st.train, err = schedule.Compile(programSpec(m, B, T, A, &o, !o.forward)); err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	if st.eval, err = schedule.Compile(programSpec(m, B, T, A, &o, false)); err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	st.last = st.train.Ops[len(st.train.Ops)-1]
	st.cache = offload.NewCache(be, offload.CacheConfig{Limit: o.DeviceBudget, Whole: true})
	t = &Trainer{be: be, model: m, opts: to, lossMul: 1, off: st}
	t.Scaler = NewLossScaler(m.DType, to.LossScale, to.ScaleWindow)
	defer func() {
		if err != nil {
			t.Close()
			t = nil
		}
	}()
	if st.streams, err = stream.NewSet(be, o.Recorder); err != nil {
		return t, err
	}
	t.q = st.streams.Compute.Queue()
	st.h2d = stream.Wrap(be, t.q, stream.H2D, o.Recorder)
	st.d2h = stream.Wrap(be, t.q, stream.D2H, o.Recorder)
	st.opt = stream.Wrap(be, t.q, stream.Optimizer, o.Recorder)
	n := len(m.Layers)
	t.st = &StateTable{Layers: make([]LayerState, n)}
	st.dgrad = make([]kernels.Tensor, n)
	st.tiedBy = make([][][2]int, n)
	for i, l := range m.Layers {
		for k, j := range l.Tied() {
			st.tiedBy[j] = append(st.tiedBy[j], [2]int{i, k})
		}
	}
	fixed := func(nb int64, cl offload.Class) kernels.Buffer {
		if err != nil {
			return nil
		}
		var b *offload.Block
		if b, err = st.cache.Alloc(max(nb, 1), cl); err != nil {
			return nil
		}
		st.fixed = append(st.fixed, b)
		st.fixedBytes += schedule.RoundBlock(nb)
		return b.Buffer()
	}
	tensor := func(nel int, dt kernels.DType) kernels.Tensor {
		b := fixed(int64(nel)*int64(dt.Size()), offload.Workspace)
		if b == nil {
			return kernels.Tensor{}
		}
		return kernels.View(b, 0, dt, nel)
	}
	p := &Pass{Ops: be, Model: m, Table: t.st, B: B, T: T}
	t.pass = p
	var scratch int64
	for _, l := range m.Layers {
		scratch = max(scratch, l.ScratchBytes(B, T))
	}
	p.Scratch = fixed(scratch, offload.Workspace)
	// The io buffers of slots micro-batches, split into views.
	S := st.slots
	all := func(nel int, dt kernels.DType) kernels.Tensor { return tensor(S*nel, dt) }
	t.allocIO(m, p, B, T, all)
	per := func(x kernels.Tensor) []kernels.Tensor {
		var v []kernels.Tensor
		if x.IsZero() {
			return nil
		}
		for k := range S {
			v = append(v, x.Slice(k*(x.N/S), x.N/S))
		}
		return v
	}
	st.in, st.tg, st.loss = per(p.Input), per(p.Targets), per(p.Losses)
	if !t.feat32.IsZero() {
		t.feat32 = t.feat32.Slice(0, t.feat32.N/S)
	}
	t.stats = tensor(2*n, kernels.F32)
	if to.Comm != nil && err == nil {
		// Its buffers come from tensor: a failed allocation is err below.
		var e error
		if t.dp, e = newDataParallel(be, to.Comm, o.Recorder, tensor, zeroBytes(m, &o)); e != nil {
			return t, e
		}
	}
	if err != nil {
		return t, fmt.Errorf("engine: allocating trainer buffers: %w", err)
	}
	st.bindIO(p, 0)
	// Host state, in pinned slabs when they fit.
	slots := append(append([]int64(nil), st.train.HostSlots...), st.eval.HostSlots...)
	if st.host, err = newHostState(be, m, &st.opts, st.table, slots); err != nil {
		return t, err
	}
	var copier exec.Copier
	if st.host.stage != nil {
		copier = st.host.stage
	}
	q := exec.Queues{Compute: st.streams.Compute, H2D: st.streams.H2D, D2H: st.streams.D2H}
	cfg := exec.Config{Backend: be, Queues: q, Cache: st.cache, Table: st.table, Copier: copier, HostAlloc: st.host.slotAlloc}
	if !o.resident {
		cfg.AfterOp = func(j int) {
			if st.accessHook != nil {
				st.accessHook(j)
			}
		}
	}
	if st.exec, err = exec.New(cfg, st.train, st.eval); err != nil {
		return t, err
	}
	if err = st.host.attachDevice(be, t.q, st.exec); err != nil {
		return t, err
	}
	inBytes, tgBytes := st.in[0].N*4, int(st.tg[0].Bytes()) // int32 tokens or float32 features
	st.hbs = make([]HostBatch, A)
	for k := range st.hbs {
		b, err := t.hostBytes(inBytes + tgBytes)
		if err != nil {
			return t, err
		}
		st.hbs[k] = HostBatch{Input: b[:inBytes:inBytes], Targets: b[inBytes:]}
		st.names.upload = append(st.names.upload, fmt.Sprintf("upload micro-batch %d", k))
		st.names.losses = append(st.names.losses, fmt.Sprintf("losses micro-batch %d", k))
	}
	for _, l := range m.Layers {
		st.names.adamw = append(st.names.adamw, "adamw "+l.Name())
	}
	t.hb = HostBatch{Input: make([]byte, inBytes), Targets: make([]byte, tgBytes)}
	if st.lossHost, err = t.hostBytes(A * int(st.loss[0].Bytes())); err != nil {
		return t, err
	}
	if st.statBuf, err = t.hostBytes(8 * n); err != nil {
		return t, err
	}
	if t.dp != nil {
		if err = t.handshake(context.Background()); err != nil {
			return t, err
		}
	}
	return t, nil
}

// ioSlots is how many micro-batches' io buffers a trainer of placement o
// keeps on the device: one for the resident program (its micro-batches
// run one after the other), every micro-batch's out of core.
func ioSlots(o *OffloadOptions, accum int) int {
	if o.resident {
		return 1
	}
	return accum
}

// bindIO points the pass's input, targets and losses at micro-batch k's
// slot.
func (st *offloadState) bindIO(p *Pass, k int) {
	k %= st.slots
	p.Input, p.Targets, p.Losses = st.in[k], st.tg[k], st.loss[k]
}

// runProgram runs program p once over the host batches (one per
// micro-batch of p), filled from src when it is not nil: each just before
// its micro-batch's first forward is enqueued, so that the host reads a
// micro-batch while the device computes the one before. The batches'
// uploads, the losses' read-back and, for a training program, the
// gradient statistics' read-back are part of the program's run: when it
// returns they are on the host.
func (t *Trainer) runProgram(ctx context.Context, p *schedule.Program, batches []HostBatch, src BatchSource) error {
	st := t.off
	st.batches, st.src, st.ctx = batches, src, ctx
	defer func() { st.batches, st.src, st.ctx = nil, nil, nil }()
	t.pass.LossGrad = float32(t.lossMul * t.Scaler.Scale / float64(t.TokensPerStep()))
	if p.Spec.Train {
		t.be.Zero(t.q, t.stats)
	}
	err := st.exec.Run(ctx, p, (*oocModel)(t), st.host)
	if dp := t.dp; dp != nil {
		// The compute queue waited for the comm queue at the last op;
		// after a failure, the comm queue must be idle too before the
		// next run reuses the buffers.
		err = errors.Join(err, dp.err)
		if e := dp.s.Synchronize(context.Background()); e != nil && err == nil {
			err = fmt.Errorf("engine: data parallel, rank %d of %d: %w", dp.comm.Rank(), dp.comm.Size(), e)
		}
		dp.err, dp.pending = nil, false
	}
	return err
}

// PredictedDevicePeak is the device memory the trainer holds at most (live
// blocks, as offload.CacheStats.PeakAllocated counts them), computed from
// its programs before they run.
func (t *Trainer) PredictedDevicePeak() int64 {
	tp, _ := t.off.train.Peak()
	ep, _ := t.off.eval.Peak()
	return t.off.fixedBytes + max(tp, ep)
}

// Cache is the trainer's device cache: every device block it holds.
func (t *Trainer) Cache() *offload.Cache { return t.off.cache }

// HostBytes is the host memory an out-of-core trainer holds for layer
// state and offloaded activations (0 for a resident one).
func (t *Trainer) HostBytes() int64 { return t.off.host.bytes }

func (st *offloadState) close() {
	if st.host != nil {
		for i := range st.host.host {
			<-st.host.host[i].done
		}
	}
	if st.streams != nil {
		_ = st.streams.Synchronize(context.Background())
		for _, s := range []*stream.Stream{st.h2d, st.d2h, st.opt} {
			if s != nil {
				s.Close()
			}
		}
		st.streams.Close()
	}
	if st.exec != nil {
		st.exec.Close()
	}
	for _, b := range st.fixed {
		st.cache.Free(b)
	}
	st.fixed = nil
	if st.cache != nil {
		_ = st.cache.Close()
	}
	// No copy or update uses the host state any more.
	if st.host != nil {
		st.host.close()
	}
}

// oocModel runs the trainer's layers for the executor.
type oocModel Trainer

// Bind implements exec.Model: the block becomes the layer's tensor of
// its class in the state table (the gradient of a layer's output in
// dgrad).
func (mt *oocModel) Bind(iv *schedule.Interval, b kernels.Buffer) {
	t := (*Trainer)(mt)
	m := t.model
	ls := &t.st.Layers[iv.Layer]
	switch iv.Class {
	case schedule.Weights:
		ls.Weights = kernels.View(b, 0, m.DType, m.Layers[iv.Layer].NumParams())
	case schedule.Grads:
		ls.Grads = kernels.View(b, 0, m.DType, m.Layers[iv.Layer].NumParams())
	case schedule.Acts, schedule.Ckpt:
		ls.Acts = b
	case schedule.DGrad:
		t.off.dgrad[iv.Layer] = kernels.View(b, 0, m.DType, m.Layers[iv.Layer].OutputElems(t.pass.B, t.pass.T))
	case schedule.TGrads:
		if ls.TiedGrads == nil {
			ls.TiedGrads = make([]kernels.Tensor, len(m.Layers[iv.Layer].Tied()))
		}
		j := slices.Index(m.Layers[iv.Layer].Tied(), iv.Of)
		ls.TiedGrads[j] = kernels.View(b, 0, m.DType, m.Layers[iv.Of].NumParams())
	}
}

// Run implements exec.Model.
func (mt *oocModel) Run(q kernels.Queue, op schedule.Op, final []int) {
	t := (*Trainer)(mt)
	st, p, m := t.off, t.pass, t.model
	st.bindIO(p, op.MB)
	i := op.Layer
	l := m.Layers[i]
	switch op.Kind {
	case schedule.Recompute:
		if st.opts.Activations[i].Selective() {
			l.(SelectiveRecomputer).RecomputeSelective(q, p, i)
		} else {
			l.Forward(q, p, i)
		}
	case schedule.Forward:
		l.Forward(q, p, i)
	case schedule.Backward:
		p.DOut, p.DIn = kernels.Tensor{}, kernels.Tensor{}
		if i < len(m.Layers)-1 {
			p.DOut = st.dgrad[i]
		}
		if i > 0 {
			p.DIn = st.dgrad[i-1]
		}
		l.Backward(q, p, i)
		p.DOut, p.DIn = kernels.Tensor{}, kernels.Tensor{}
	}
	for _, j := range final {
		// The tied gradients end with the layer's last backward: added
		// once per step, in the same order whatever the schedule.
		for _, tb := range st.tiedBy[j] {
			t.be.Add(q, t.st.Layers[j].Grads, t.st.Layers[tb[0]].TiedGrads[tb[1]])
		}
	}
	if len(final) > 0 && t.gradHook != nil {
		t.gradHook(t.Step)
	}
	switch {
	case len(final) > 0 && t.dp != nil:
		// Summed over the ranks on the comm queue, statistics included
		// (engine/ddp.go).
		t.reduceGrads(q, final)
	default:
		for _, j := range final {
			g := t.st.Layers[j].Grads
			t.be.SumSquaresFinite(q, t.stats.Slice(2*j, 2), g)
		}
	}
	if op == st.last { // a training program's: every layer's are taken
		if t.dp != nil {
			var err error
			if st.opts.zero.on() {
				err = t.reduceStats(q) // engine/zero.go
			}
			if err == nil {
				err = t.waitComm(q)
			}
			if err != nil && t.dp.err == nil {
				t.dp.err = err
			}
		}
		t.be.CopyToHost(q, st.statBuf, t.stats) // every layer's are taken
	}
}

// Feed implements exec.Feeder: micro-batch k is read from the source and
// its input and targets go to its io slot before its first forward. (Its
// host batch's last upload, a step ago, has passed: every Run ends with
// the queues idle.)
func (mt *oocModel) Feed(op schedule.Op) error {
	t := (*Trainer)(mt)
	st := t.off
	if op.Kind != schedule.Forward || op.Layer != 0 {
		return nil
	}
	if st.src != nil {
		if err := st.src.Next(st.ctx, &st.batches[op.MB]); err != nil {
			return err
		}
	}
	st.bindIO(t.pass, op.MB)
	return st.h2d.Enqueue(st.names.upload[op.MB], func(q kernels.Queue) { t.upload(q, &st.batches[op.MB]) })
}

// Drain implements exec.Feeder: micro-batch k's losses go to the host
// once its last forward has written them.
func (mt *oocModel) Drain(op schedule.Op) error {
	t := (*Trainer)(mt)
	st := t.off
	if op.Kind != schedule.Forward || op.Layer != len(t.model.Layers)-1 {
		return nil
	}
	st.bindIO(t.pass, op.MB)
	nb := int(st.loss[0].Bytes())
	return st.d2h.Enqueue(st.names.losses[op.MB], func(q kernels.Queue) {
		t.be.CopyToHost(q, st.lossHost[op.MB*nb:(op.MB+1)*nb], t.pass.Losses)
	})
}

// LayerName implements exec.Model.
func (mt *oocModel) LayerName(l int) string { return mt.model.Layers[l].Name() }
