package engine

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"

	"github.com/spill-ml/spill/kernels"
	"github.com/spill-ml/spill/offload"
	"github.com/spill-ml/spill/stream"
)

// HostBatch is one micro-batch in host memory, in the layout the device
// tensors take: Input is B*T little-endian int32 token ids (GPT) or B*F
// float32 features (MLP); Targets is B*T int32 next tokens, B int32 class
// labels or B float32 regression targets.
type HostBatch struct {
	Input   []byte
	Targets []byte
}

// BatchSource produces micro-batches for a Trainer. Next fills hb (whose
// slices have the sizes the Trainer allocated) with the next micro-batch.
type BatchSource interface {
	Next(ctx context.Context, hb *HostBatch) error
}

// TrainerOptions are the hyper-parameters of a Trainer (from Config).
type TrainerOptions struct {
	B, T        int // micro-batch rows, positions per row (1 for records)
	Accum       int
	Schedule    LRSchedule
	WeightDecay float64
	Beta1       float64
	Beta2       float64
	Eps         float64
	GradClip    float64 // 0 = off
	LossScale   float64 // initial fp16 scale
	ScaleWindow int

	// Comm, if not nil, makes the trainer one rank of a data-parallel
	// group (engine/ddp.go): B, T and Accum are per rank, so the global
	// batch of a step is Comm.Size() x Accum x B rows, each rank reading
	// its own share (dataset.LoaderOptions.Rank/WorldSize). Every rank
	// must build its trainer with the same model and options; InitWeights
	// and LoadPretrained give every rank rank 0's weights, and
	// RestoreCheckpoint checks that every rank read the same checkpoint
	// (engine/ddp_sync.go).
	// The trainer does not close it.
	Comm kernels.Comm
	// ZeroStage, with a Comm, shards the host optimizer state over the
	// ranks as DeepSpeed's zero_optimization.stage does (engine/zero.go):
	// 0 (the default) keeps it whole on every rank; 1 and 2 both give
	// each rank 1/Size of the fp32 master weights and Adam moments of
	// every layer whose optimizer is in host RAM, reduce-scatter the
	// gradients and all-gather the updated weights (stage 2's traffic;
	// the gradient buffers stay whole, as the backward accumulates into
	// them). Layers whose optimizer is on the device or the disk tier are
	// not sharded. Ignored without a Comm.
	ZeroStage int
}

func trainerOptions(cfg *Config, B, T int) TrainerOptions {
	return TrainerOptions{
		B: B, T: T, Accum: cfg.Accum,
		Schedule:    LRSchedule{Peak: cfg.LR, Min: cfg.MinLR, Warmup: cfg.Warmup, Steps: cfg.Steps},
		WeightDecay: cfg.WeightDecay, Beta1: cfg.Beta1, Beta2: cfg.Beta2, Eps: cfg.Eps,
		GradClip: cfg.GradClip, LossScale: cfg.LossScale, ScaleWindow: cfg.ScaleWindow,
		ZeroStage: cfg.ZeroStage,
	}
}

// StepResult is what one optimizer step measured.
type StepResult struct {
	Loss      float64 // mean loss over the step's micro-batches
	LR        float64
	GradNorm  float64 // global norm before clipping (unscaled); NaN/Inf on overflow
	LossScale float64 // the scale the step ran with
	Skipped   bool
	// H2DBytes, D2HBytes and DiskBytes are the bytes an out-of-core
	// trainer moved host to device, device to host, and to and from the
	// disk tier during the step (0 for a resident trainer).
	H2DBytes, D2HBytes, DiskBytes int64
	// Speculation says whether the step's speculative host updates
	// (OffloadOptions.Speculate) were kept (the gradients were not
	// clipped) or dropped (they were redone after the norm); Unspeculated
	// when there were none.
	Speculation Speculation
}

// Speculation is what became of a step's speculative host updates.
type Speculation int8

const (
	Unspeculated Speculation = iota
	SpecKept
	SpecDropped
)

// Trainer runs training steps of a Model on a backend. It owns the
// model's StateTable and the pass buffers. Methods are for one goroutine.
//
// Every trainer runs the same machinery: the step's program compiled from
// a placement (offload/schedule), run by one executor (offload/exec) over
// the model's layers, with the host state and optimizers of ooc_host.go.
// NewTrainer's placement keeps everything on the device (the resident
// program: no transfer, allocation or free during a step);
// NewOffloadTrainer's streams what OffloadOptions say. The step semantics
// (loss scaling, clipping, skipping a step whose gradients overflow) are
// written once, in TrainStep.
type Trainer struct {
	be    kernels.Backend
	q     kernels.Queue // the compute queue
	model *Model
	opts  TrainerOptions
	st    *StateTable
	pass  *Pass

	// Step is the number of optimizer steps taken (skipped ones included).
	Step   int
	Scaler LossScaler

	feat32  kernels.Tensor // F32 staging for features in non-fp32 MLP runs
	stats   kernels.Tensor // F32 [sum of squares, non-finite flag] per layer
	hb      HostBatch      // Evaluate's micro-batch
	nLoss   int            // losses per micro-batch
	lossMul float64        // reported loss = lossMul * mean(losses)
	pinned  [][]byte       // page-locked host memory (hostBytes)

	// off is the machinery: programs, executor, host state.
	off *offloadState
	// dp is the data-parallel side (engine/ddp.go), nil without a Comm.
	dp *dataParallel
	// clipped says the last step's gradients were clipped or skipped: the
	// next step does not speculate (norms change slowly, and a dropped
	// speculation only adds host memory traffic to the backward).
	clipped bool

	// gradHook, if set, runs (on the compute queue's driver) once layers'
	// gradients are final for the step, before their statistics are
	// taken (tests inject overflows with it).
	gradHook func(step int)
}

// allocIO lays out with tensor the pass's input, targets and losses (and the
// F32 staging of the features of a non-fp32 MLP), and sets nLoss and lossMul.
func (t *Trainer) allocIO(m *Model, p *Pass, B, T int, tensor func(n int, dt kernels.DType) kernels.Tensor) {
	switch m.Family.Input() {
	case InputTokens:
		t.nLoss = B * T
		p.Input = tensor(B*T, kernels.I32)
		p.Targets = tensor(B*T, kernels.I32)
	default:
		t.nLoss = B
		F := m.MLP.In
		p.Input = tensor(B*F, m.DType)
		if m.DType != kernels.F32 {
			t.feat32 = tensor(B*F, kernels.F32)
		}
		if m.MLP.Task == TaskRegression {
			p.Targets = tensor(B, kernels.F32)
			t.lossMul = 2 // MSEForward gives (p-t)²/2; report the mean squared error
		} else {
			p.Targets = tensor(B, kernels.I32)
		}
	}
	p.Losses = tensor(t.nLoss, kernels.F32)
}

// residentOptions is the placement of NewTrainer: every layer's weights,
// gradients, master and moments on the device, every activation kept, one
// micro-batch at a time.
func residentOptions(m *Model, rec *stream.Recorder) OffloadOptions {
	tiers := make([]offload.Tier, len(m.Layers))
	for i := range tiers {
		tiers[i] = offload.TierDevice
	}
	return OffloadOptions{Weights: offload.TierDevice, Grads: offload.TierDevice, OptimizerTiers: tiers,
		Prefetch: 1, Group: 1, Recorder: rec, resident: true}
}

// NewTrainer allocates the model's training state and pass buffers on be,
// all resident on the device: the program in which everything is
// persistent. The weights are zero until InitWeights or LoadCheckpoint.
func NewTrainer(be kernels.Backend, m *Model, o TrainerOptions) (*Trainer, error) {
	return newTrainer(be, m, o, residentOptions(m, nil))
}

// hostBytes returns n bytes of host memory for copies: page-locked when the
// backend offers it (copies from it are truly asynchronous), else Go memory.
func (t *Trainer) hostBytes(n int) ([]byte, error) {
	pa, ok := t.be.(kernels.PinnedAllocator)
	if !ok {
		return make([]byte, n), nil
	}
	b, err := pa.AllocPinned(n)
	if err != nil {
		return nil, fmt.Errorf("engine: pinned staging of %s: %w", kernels.FormatBytes(int64(n)), err)
	}
	t.pinned = append(t.pinned, b)
	return b, nil
}

// Close frees the trainer's device memory (after synchronizing).
func (t *Trainer) Close() {
	if t.dp != nil {
		t.dp.close() // before the buffers its collectives use are freed
		t.dp = nil
	}
	if t.off != nil {
		t.off.close()
		t.off, t.st = nil, nil // the state table held views of the cache's blocks
	}
	if pa, ok := t.be.(kernels.PinnedAllocator); ok {
		for _, b := range t.pinned {
			_ = pa.FreePinned(b)
		}
	}
	t.pinned = nil
}

// Model is the trained model.
func (t *Trainer) Model() *Model { return t.model }

// State is the model's per-layer state table.
func (t *Trainer) State() *StateTable { return t.st }

// TokensPerStep is the number of targets one optimizer step trains on:
// over every rank of a data-parallel group.
func (t *Trainer) TokensPerStep() int64 { return t.localTokens() * int64(t.worldSize()) }

// localTokens is the number of targets this rank trains on per step.
func (t *Trainer) localTokens() int64 { return int64(t.nLoss) * int64(t.opts.Accum) }

// InitWeights initialises every layer deterministically from seed (GPT-2
// init for GPTs) into the master weights and the compute copy, the layers
// spread over the cores. Under data parallelism it is a collective: rank
// 0 initialises from its seed and broadcasts the weights, so every rank
// starts from rank 0's whatever seed it was given (engine/ddp_sync.go).
func (t *Trainer) InitWeights(ctx context.Context, seed uint64) error {
	return t.setMasters(ctx, func(i int, master []float32) {
		InitParams(master, t.model.Layers[i].Params(), seed)
	})
}

// setLayerMaster sets layer i's fp32 master weights from data (and
// derives the compute copy).
func (t *Trainer) setLayerMaster(ctx context.Context, i int, data []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return t.off.host.setMaster(i, func(m []float32) { copy(m, bytesF32(data)) })
}

// upload enqueues the copy of a host micro-batch to the pass's input and
// targets on q.
func (t *Trainer) upload(q kernels.Queue, hb *HostBatch) {
	p := t.pass
	switch {
	case t.model.Family.Input() == InputTokens || t.model.DType == kernels.F32:
		t.be.CopyToDevice(q, p.Input, hb.Input)
	default:
		t.be.CopyToDevice(q, t.feat32, hb.Input)
		t.be.Cast(q, p.Input, t.feat32)
	}
	t.be.CopyToDevice(q, p.Targets, hb.Targets)
}

// MicroLoss runs a forward pass on hb and returns its mean loss.
func (t *Trainer) MicroLoss(ctx context.Context, hb *HostBatch) (float64, error) {
	st := t.off
	if err := st.host.waitUpdates(); err != nil {
		return 0, err
	}
	st.evalHB[0] = *hb
	err := t.runProgram(ctx, st.eval, st.evalHB[:], nil)
	st.evalHB[0] = HostBatch{}
	if err != nil {
		return 0, err
	}
	return t.sumLosses(st.lossHost) / float64(t.nLoss), nil
}

// TrainStep runs one optimizer step: Accum micro-batches from src, loss
// scaling, global-norm clipping and AdamW. On an error (ctx cancelled, bad
// data) before the update, the weights and Step are unchanged; the update
// itself is not interruptible.
//
// The host reads each micro-batch from src just before it enqueues the
// micro-batch's forward, while the device computes the one before, and
// waits for the device once per step, when the step's program has run, and reads the losses and the gradient statistics that the
// program copied back. The AdamW of the layers whose optimizer state is
// on the device is enqueued and not waited for, so the host prepares the
// next step's batches while it runs; an error it hits is returned by the
// next call that waits on the queue (the next TrainStep, a read of the
// weights, Close).
//
// Without gradient clipping, fp16 loss scaling or DelayedUpdate, each
// host-optimizer layer's AdamW starts as soon as its final gradients have
// landed on the host, overlapped with the backward of the layers before
// it (ZeRO-Offload); the arithmetic is the same. Such an eager update
// checks its layer's gradients first and leaves a layer whose gradients
// are not finite unchanged, but it cannot wait for the other layers'
// verdict: a step with non-finite gradients reports Skipped, yet the
// host layers whose gradients were finite have been updated. Otherwise
// the host updates wait for the global norm, which is ready when the last
// backward is done (each layer's sum of squares is taken on the device as
// its gradients become final), and start in layer order, the order the
// next forward fetches them in; unless they are speculative
// (OffloadOptions.Speculate): each then starts as an eager one does, into
// a second copy of its layer's state, which the step keeps when the norm
// says the gradients are not clipped and drops otherwise, updating the
// layer after the norm as without speculation. The arithmetic is the same
// either way. A step after one whose gradients were clipped (or skipped)
// does not speculate.
func (t *Trainer) TrainStep(ctx context.Context, src BatchSource) (StepResult, error) {
	if t.off.opts.forward {
		return StepResult{}, errForwardOnly
	}
	st := t.off
	hs := st.host
	o := t.opts
	r := StepResult{LR: o.Schedule.At(t.Step), LossScale: t.Scaler.Scale}
	hp := kernels.AdamWParams{
		LR: float32(r.LR), Beta1: float32(o.Beta1), Beta2: float32(o.Beta2), Eps: float32(o.Eps),
		Step: t.Step + 1, WeightDecay: float32(o.WeightDecay),
	}
	hs.eager, hs.spec = nil, nil
	unclipped := hp
	unclipped.GradScale = float32(1 / r.LossScale)
	switch {
	case o.GradClip <= 0 && !t.Scaler.Enabled && !st.opts.DelayedUpdate && !st.opts.zero.on():
		hs.eager = &unclipped
	case st.opts.Speculate && !t.clipped:
		hs.spec = &unclipped
	}
	tr0, disk0 := st.exec.Traffic(), hs.diskBytes()
	eager, spec := hs.eager != nil, hs.spec != nil
	hs.launched = 0
	err := t.runProgram(ctx, st.train, st.hbs, src)
	hs.eager, hs.spec = nil, nil
	if spec && err != nil {
		hs.settleSpec(false)
	}
	if hs.launched > 0 {
		// Updates have started: the step counts, whatever happens next.
		t.Step++
	}
	if err != nil {
		return r, err
	}
	if eager && hs.launched == 0 {
		t.Step++ // every layer is updated on the device
	}
	if st.opts.DelayedUpdate {
		// The update of the last step ran during this one.
		if err := hs.waitUpdates(); err != nil {
			return r, err
		}
	}
	loss, sumsq, overflow, err := t.stepStats(ctx)
	if err != nil {
		if spec {
			hs.settleSpec(false)
		}
		return r, err
	}
	r.Loss = loss
	r.GradNorm = math.Sqrt(sumsq) / t.Scaler.Scale
	if overflow {
		r.GradNorm = math.Inf(1)
	}
	r.Skipped = t.Scaler.Update(overflow)
	tr := st.exec.Traffic()
	r.H2DBytes, r.D2HBytes = tr.H2D-tr0.H2D, tr.D2H-tr0.D2H
	r.DiskBytes = hs.diskBytes() - disk0 // of the updates finished so far
	coef := 1.0
	if o.GradClip > 0 && r.GradNorm > o.GradClip {
		coef = o.GradClip / r.GradNorm
	}
	hp.GradScale = float32(coef / r.LossScale)
	t.clipped = r.Skipped || hp != unclipped
	if !r.Skipped {
		// The layers whose optimizer state is on the device, on the
		// compute queue before the next step's forward.
		if err := hs.updateDevice(st.opt, st.names.adamw, hp); err != nil {
			return r, err
		}
	}
	if eager { // the host updates are running
		return r, nil
	}
	t.Step++
	// The speculative updates are the step's when the gradients were
	// not clipped (the same parameters, bit for bit) and the step counts.
	if spec {
		hs.settleSpec(!t.clipped)
		r.Speculation = SpecDropped
		if !t.clipped {
			r.Speculation = SpecKept
		}
	}
	if r.Skipped {
		return r, nil
	}
	for i := range hs.host {
		// A layer this step speculated for and kept is updated. (Without
		// speculation this step, launchUpdate applies an earlier kept
		// update first.)
		if !spec || !hs.host[i].keep {
			hs.launchUpdate(ctx, i, hp, false)
		}
	}
	if st.opts.zero.on() {
		// Every rank updated its range: gather the weights (engine/zero.go).
		return r, t.gatherWeights(ctx)
	}
	return r, nil
}

// stepStats reads, from what the step's program copied back, the step's
// mean loss, the global sum of squares of the gradients (the layers'
// sums added in layer order) and whether any was not finite. The loss is
// summed in float64 micro-batch by micro-batch, in order, and over the
// ranks of a data-parallel group in rank order (the gather of the ranks'
// sums is what can fail: ctx done, a collective failing).
func (t *Trainer) stepStats(ctx context.Context) (loss, sumsq float64, nonFinite bool, err error) {
	st := t.off
	var sum float64
	for k := range st.hbs {
		sum += t.sumLosses(st.lossHost[4*k*t.nLoss:])
	}
	if sum, err = t.globalLoss(ctx, sum); err != nil {
		return 0, 0, false, err
	}
	loss = sum / float64(t.TokensPerStep())
	var ss float32
	for i := range t.model.Layers {
		ss += math.Float32frombits(binary.LittleEndian.Uint32(st.statBuf[8*i:]))
		nonFinite = nonFinite || math.Float32frombits(binary.LittleEndian.Uint32(st.statBuf[8*i+4:])) != 0
	}
	sumsq = float64(ss)
	return loss, sumsq, nonFinite || math.IsNaN(sumsq) || math.IsInf(sumsq, 0), nil
}

// sumLosses is lossMul times the float64 sum of the nLoss F32 losses at
// the start of b.
func (t *Trainer) sumLosses(b []byte) float64 {
	var sum float64
	for i := 0; i < t.nLoss; i++ {
		sum += float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
	}
	return sum * t.lossMul
}

// Gradients computes the fp32 gradients of the mean loss over Accum
// micro-batches from src without updating anything, for gradient checks:
// one []float32 per layer, laid out as the layer's block.
func (t *Trainer) Gradients(ctx context.Context, src BatchSource) (loss float64, grads [][]float32, err error) {
	if t.off.opts.forward {
		return 0, nil, errForwardOnly
	}
	if t.model.DType != kernels.F32 {
		return 0, nil, fmt.Errorf("engine: Gradients needs an fp32 model")
	}
	st := t.off
	hs := st.host
	if err := hs.waitUpdates(); err != nil {
		return 0, nil, err
	}
	hs.eager = nil // no update
	if err := t.runProgram(ctx, st.train, st.hbs, src); err != nil {
		return 0, nil, err
	}
	if loss, _, _, err = t.stepStats(ctx); err != nil {
		return 0, nil, err
	}
	for i, l := range t.model.Layers {
		var b []byte
		if hs.tier[i] == offload.TierDevice {
			b = make([]byte, 4*l.NumParams())
			t.be.CopyToHost(t.q, b, hs.devLayer(i).grads)
			if err := t.q.Synchronize(ctx); err != nil {
				return 0, nil, err
			}
		} else {
			b = hs.host[i].grads // landed: the program's run waited for every queue
		}
		v := bytesF32(b)
		for j := range v {
			v[j] /= float32(t.Scaler.Scale)
		}
		grads = append(grads, v)
	}
	return loss, grads, nil
}

// MasterWeights returns the fp32 master weights of every layer as host
// floats (block layout).
func (t *Trainer) MasterWeights(ctx context.Context) ([][]float32, error) {
	var out [][]float32
	for i := range t.model.Layers {
		b, _, _, err := t.layerOptim(ctx, i)
		if err != nil {
			return nil, err
		}
		out = append(out, bytesF32(b))
	}
	return out, nil
}

// f32Bytes is v as little-endian bytes: v's own memory on a
// little-endian host (no copy: the caller must not change v while the
// bytes are used), a copy elsewhere.
func f32Bytes(v []float32) []byte {
	if littleEndian && len(v) > 0 {
		return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), 4*len(v))
	}
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

// littleEndian reports the host's byte order.
var littleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

func bytesF32(b []byte) []float32 {
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}

// Evaluate returns the mean loss over n micro-batches from src (forward
// passes only; gradients and weights are untouched).
//
// Under data parallelism it is a collective (every rank calls it with the
// same n) and every rank returns the same value: the mean over the n·Size
// micro-batches of all ranks, each rank reading its own from its src.
// Exactly: each rank sums its micro-batches' mean losses in float64 in
// order, the ranks' sums are added in rank order and divided by n·Size.
// Each micro-batch's mean is bitwise what one rank gets on the same rows
// and weights, so this equals a one-rank Evaluate of the n·Size
// micro-batches in rank order (rank 0's n, then rank 1's, ...) up to the
// association of those float64 additions: bitwise for n = 1, else within
// a few units in the last place of float64 (relative 1e-15 for small
// n·Size).
func (t *Trainer) Evaluate(ctx context.Context, src BatchSource, n int) (float64, error) {
	var sum float64
	for k := 0; k < n; k++ {
		if err := src.Next(ctx, &t.hb); err != nil {
			return 0, err
		}
		l, err := t.MicroLoss(ctx, &t.hb)
		if err != nil {
			return 0, err
		}
		sum += l
	}
	return t.reduceMean(ctx, sum, n)
}

// SaveTensors copies the fp32 master weights and the Adam moments to the
// host as checkpoint tensors: weights under their nanoGPT names, moments
// as "<name>.exp_avg" and "<name>.exp_avg_sq".
func (t *Trainer) SaveTensors(ctx context.Context) (weights, optim []NamedTensor, err error) {
	for i, l := range t.model.Layers {
		var host [3][]byte
		if host[0], host[1], host[2], err = t.layerOptim(ctx, i); err != nil {
			return nil, nil, err
		}
		for _, ps := range l.Params() {
			lo, hi := 4*ps.Offset, 4*(ps.Offset+ps.Elems())
			shape := append([]int(nil), ps.Shape...)
			weights = append(weights, NamedTensor{Name: ps.Name, DType: "F32", Shape: shape, Data: host[0][lo:hi]})
			optim = append(optim,
				NamedTensor{Name: ps.Name + ".exp_avg", DType: "F32", Shape: shape, Data: host[1][lo:hi]},
				NamedTensor{Name: ps.Name + ".exp_avg_sq", DType: "F32", Shape: shape, Data: host[2][lo:hi]})
		}
	}
	return weights, optim, nil
}

// LoadTensors restores what SaveTensors saved: the master weights (and
// from them the compute copy) and, if optim is not nil, the Adam moments.
// Every parameter must be present with its exact shape.
func (t *Trainer) LoadTensors(ctx context.Context, weights, optim []NamedTensor) error {
	defer t.off.host.dropStage() // the device layers' masters pass through it
	byName := make(map[string]*NamedTensor, len(weights)+len(optim))
	for _, ts := range [][]NamedTensor{weights, optim} {
		for i := range ts {
			byName[ts[i].Name] = &ts[i]
		}
	}
	get := func(ps ParamSpec, name string) ([]byte, error) {
		nt := byName[name]
		if nt == nil {
			return nil, fmt.Errorf("tensor %q missing", name)
		}
		if nt.DType != "F32" || !sameShape(nt.Shape, ps.Shape) || len(nt.Data) != 4*ps.Elems() {
			return nil, fmt.Errorf("tensor %q is %s %v, the model needs F32 %v", name, nt.DType, nt.Shape, ps.Shape)
		}
		return nt.Data, nil
	}
	for i, l := range t.model.Layers {
		var host [3][]byte
		for j := range host {
			host[j] = make([]byte, 4*l.NumParams())
		}
		for _, ps := range l.Params() {
			for j, suffix := range []string{"", ".exp_avg", ".exp_avg_sq"} {
				if j > 0 && optim == nil {
					continue
				}
				d, err := get(ps, ps.Name+suffix)
				if err != nil {
					return err
				}
				copy(host[j][4*ps.Offset:], d)
			}
		}
		if optim != nil {
			if err := t.off.host.setOptim(ctx, i, host[1], host[2]); err != nil {
				return err
			}
		}
		if err := t.setLayerMaster(ctx, i, host[0]); err != nil {
			return err
		}
	}
	return nil
}

func sameShape(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
