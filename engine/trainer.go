package engine

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"

	"github.com/spill-ml/spill/kernels"
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
}

func trainerOptions(cfg *Config, B, T int) TrainerOptions {
	return TrainerOptions{
		B: B, T: T, Accum: cfg.Accum,
		Schedule:    LRSchedule{Peak: cfg.LR, Min: cfg.MinLR, Warmup: cfg.Warmup, Steps: cfg.Steps},
		WeightDecay: cfg.WeightDecay, Beta1: cfg.Beta1, Beta2: cfg.Beta2, Eps: cfg.Eps,
		GradClip: cfg.GradClip, LossScale: cfg.LossScale, ScaleWindow: cfg.ScaleWindow,
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
}

// Trainer runs training steps of a Model on a backend. It owns the
// model's StateTable and the pass buffers. Methods are for one goroutine.
type Trainer struct {
	be    kernels.Backend
	q     kernels.Queue
	model *Model
	opts  TrainerOptions
	st    *StateTable
	pass  *Pass

	// Step is the number of optimizer steps taken (skipped ones included).
	Step   int
	Scaler LossScaler

	ioBufs   []kernels.Buffer
	feat32   kernels.Tensor // F32 staging for features in non-fp32 MLP runs
	stats    kernels.Tensor // F32 [sum of squares, non-finite flag]
	hb       HostBatch
	lossHost []byte
	nLoss    int     // losses per micro-batch
	lossMul  float64 // reported loss = lossMul * mean(losses)

	// Resident path only (NewTrainer): one host synchronization per step.
	// stepHost receives, by copies enqueued behind each forward pass, the
	// losses of every micro-batch of a step (micro-batch k at bytes
	// [4*k*nLoss, 4*(k+1)*nLoss)) and then the two gradient statistics;
	// nothing waits for them until stepStats. Micro-batches are staged
	// through the two-slot ring, each slot reused only after the event
	// recorded behind its previous upload has passed.
	stepHost []byte
	ring     [2]HostBatch
	ringEv   [2]kernels.Event
	pinned   [][]byte // page-locked blocks behind ring and stepHost

	// off is the out-of-core machinery (NewOffloadTrainer), nil when the
	// whole state is resident on the device.
	off *offloadState

	// trace, if not nil, times the resident trainer's ops (traceResident).
	trace *residentTrace

	// gradHook, if set, runs after the gradients of a step are complete
	// and before they are checked (tests inject overflows with it).
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

// NewTrainer allocates the model's training state and pass buffers on be.
// The weights are zero until InitWeights or LoadCheckpoint.
func NewTrainer(be kernels.Backend, m *Model, o TrainerOptions) (*Trainer, error) {
	if o.B <= 0 || o.T <= 0 || o.Accum <= 0 {
		return nil, fmt.Errorf("engine: trainer: batch %d, seq %d, accum %d must be positive", o.B, o.T, o.Accum)
	}
	if err := CheckBackend(be, m); err != nil {
		return nil, err
	}
	st, pass, err := AllocState(be, m, StateOptions{Train: true, B: o.B, T: o.T})
	if err != nil {
		return nil, err
	}
	t := &Trainer{be: be, q: be.DefaultQueue(), model: m, opts: o, st: st, pass: pass, lossMul: 1}
	t.Scaler = NewLossScaler(m.DType, o.LossScale, o.ScaleWindow)
	tensor := func(n int, dt kernels.DType) kernels.Tensor {
		if err != nil {
			return kernels.Tensor{}
		}
		var b kernels.Buffer
		b, err = be.Alloc(int64(n)*int64(dt.Size()), "io")
		if err != nil {
			return kernels.Tensor{}
		}
		t.ioBufs = append(t.ioBufs, b)
		return kernels.View(b, 0, dt, n)
	}
	t.allocIO(m, pass, o.B, o.T, tensor)
	t.stats = tensor(2, kernels.F32)
	if err != nil {
		t.Close()
		return nil, fmt.Errorf("engine: allocating trainer buffers: %w", err)
	}
	inBytes := pass.Input.N * 4 // int32 tokens or float32 features
	tgBytes := int(pass.Targets.Bytes())
	t.hb = HostBatch{Input: make([]byte, inBytes), Targets: make([]byte, tgBytes)}
	t.lossHost = make([]byte, pass.Losses.Bytes())
	for k := range t.ring {
		b, err := t.hostBytes(inBytes + tgBytes)
		if err != nil {
			t.Close()
			return nil, err
		}
		t.ring[k] = HostBatch{Input: b[:inBytes:inBytes], Targets: b[inBytes:]}
	}
	if t.stepHost, err = t.hostBytes(o.Accum*int(pass.Losses.Bytes()) + int(t.stats.Bytes())); err != nil {
		t.Close()
		return nil, err
	}
	return t, nil
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
	if t.off != nil {
		t.off.close()
		t.off, t.st = nil, nil // the state table held views of the cache's blocks
		return
	}
	if t.st == nil {
		return
	}
	_ = t.q.Synchronize(context.Background())
	if t.trace != nil {
		t.trace.close()
		t.trace = nil
	}
	FreeState(t.be, t.st, t.pass)
	for _, b := range t.ioBufs {
		t.be.Free(b)
	}
	t.ioBufs = nil
	if pa, ok := t.be.(kernels.PinnedAllocator); ok {
		for _, b := range t.pinned {
			_ = pa.FreePinned(b)
		}
	}
	t.pinned, t.ring, t.ringEv, t.stepHost = nil, [2]HostBatch{}, [2]kernels.Event{}, nil
	t.st = nil
}

// Model is the trained model.
func (t *Trainer) Model() *Model { return t.model }

// State is the model's per-layer state table.
func (t *Trainer) State() *StateTable { return t.st }

// TokensPerStep is the number of targets one optimizer step trains on.
func (t *Trainer) TokensPerStep() int64 { return int64(t.nLoss) * int64(t.opts.Accum) }

// InitWeights initialises every layer deterministically from seed (GPT-2
// init for GPTs) into the master weights and the compute copy.
func (t *Trainer) InitWeights(ctx context.Context, seed uint64) error {
	if t.off != nil {
		// In place in the host state, the layers spread over the cores.
		return t.off.host.setMasters(func(i int, master []float32) {
			InitParams(master, t.model.Layers[i].Params(), seed)
		})
	}
	for i, l := range t.model.Layers {
		vals := make([]float32, l.NumParams())
		InitParams(vals, l.Params(), seed)
		if err := t.setLayerMaster(ctx, i, f32Bytes(vals)); err != nil {
			return err
		}
	}
	return nil
}

// setLayerMaster uploads a whole layer's fp32 master weights and derives
// the compute copy.
func (t *Trainer) setLayerMaster(ctx context.Context, i int, data []byte) error {
	if t.off != nil {
		return t.off.host.setMaster(i, func(m []float32) { copy(m, bytesF32(data)) })
	}
	s := t.st.Layers[i]
	t.be.CopyToDevice(t.q, s.Master, data)
	if s.Weights.Buf != s.Master.Buf {
		t.be.Cast(t.q, s.Weights, s.Master)
	}
	return t.q.Synchronize(ctx) // data must outlive the copy
}

// upload copies a host micro-batch to the device.
func (t *Trainer) upload(hb *HostBatch) {
	p := t.pass
	switch {
	case t.model.Family.Input() == InputTokens || t.model.DType == kernels.F32:
		t.be.CopyToDevice(t.q, p.Input, hb.Input)
	default:
		t.be.CopyToDevice(t.q, t.feat32, hb.Input)
		t.be.Cast(t.q, p.Input, t.feat32)
	}
	t.be.CopyToDevice(t.q, p.Targets, hb.Targets)
}

// forward runs the model on the uploaded micro-batch and returns the sum
// of its losses (times lossMul).
func (t *Trainer) forward(ctx context.Context) (float64, error) {
	t.model.Forward(t.q, t.pass)
	t.be.CopyToHost(t.q, t.lossHost, t.pass.Losses)
	if err := t.q.Synchronize(ctx); err != nil {
		return 0, err
	}
	return t.sumLosses(t.lossHost), nil
}

// MicroLoss runs a forward pass on hb and returns its mean loss.
func (t *Trainer) MicroLoss(ctx context.Context, hb *HostBatch) (float64, error) {
	if t.off != nil {
		return t.offloadMicroLoss(ctx, hb)
	}
	t.upload(hb)
	s, err := t.forward(ctx)
	return s / float64(t.nLoss), err
}

func (t *Trainer) zeroGrads() {
	for _, s := range t.st.Layers {
		t.be.Zero(t.q, s.Grads)
		for _, g := range s.TiedGrads {
			t.be.Zero(t.q, g)
		}
	}
}

// accumulate enqueues forward and backward over Accum micro-batches from
// src, leaving the (loss-scaled) gradients in the state table, and a copy
// of micro-batch k's losses to its place in stepHost. It does not wait for
// the device: the host only waits, before reusing a ring slot, for the
// upload made from it two micro-batches earlier. stepStats reads the
// results.
func (t *Trainer) accumulate(ctx context.Context, src BatchSource) error {
	t.zeroGrads()
	t.pass.LossGrad = float32(t.lossMul * t.Scaler.Scale / float64(t.TokensPerStep()))
	for k := 0; k < t.opts.Accum; k++ {
		slot := k % len(t.ring)
		if ev := t.ringEv[slot]; ev != nil {
			// The slot's previous upload must have been copied before Next
			// overwrites it (host memory handed to a copy stays unchanged).
			if err := ev.Synchronize(ctx); err != nil {
				return err
			}
			t.ringEv[slot] = nil
		}
		hb := &t.ring[slot]
		if err := src.Next(ctx, hb); err != nil {
			return err
		}
		if t.trace != nil {
			if err := t.tracedMicroBatch(k, slot, hb); err != nil {
				return err
			}
			continue
		}
		t.upload(hb)
		ev, err := t.be.RecordEvent(t.q)
		if err != nil {
			return err
		}
		t.ringEv[slot] = ev
		t.model.Forward(t.q, t.pass)
		nb := int(t.pass.Losses.Bytes())
		t.be.CopyToHost(t.q, t.stepHost[k*nb:(k+1)*nb], t.pass.Losses)
		t.model.Backward(t.q, t.pass)
	}
	if t.trace != nil {
		return t.trace.compute.Enqueue("merge tied gradients", func(q kernels.Queue) { t.model.mergeTied(q, t.be, t.st, -1) })
	}
	t.model.mergeTied(t.q, t.be, t.st, -1)
	return nil
}

// stepStats waits for the work accumulate enqueued and returns, from one
// read-back and one synchronization, the step's mean loss and, if grads,
// the global sum of squares of the gradients and whether any was not
// finite. The loss is summed on the host in float64 micro-batch by
// micro-batch, in order, exactly as a per-micro-batch read-back would.
func (t *Trainer) stepStats(ctx context.Context, grads bool) (loss, sumsq float64, nonFinite bool, err error) {
	nl := t.opts.Accum * int(t.pass.Losses.Bytes())
	if grads && t.trace != nil {
		if err := t.trace.compute.Enqueue("gradient statistics", func(kernels.Queue) { t.gradStats(nl) }); err != nil {
			return 0, 0, false, err
		}
	} else if grads {
		t.gradStats(nl)
	}
	if err := t.q.Synchronize(ctx); err != nil {
		return 0, 0, false, err
	}
	var sum float64
	for k := 0; k < t.opts.Accum; k++ {
		sum += t.sumLosses(t.stepHost[4*k*t.nLoss:])
	}
	loss = sum / float64(t.TokensPerStep())
	if !grads {
		return loss, 0, false, nil
	}
	ss := float64(math.Float32frombits(binary.LittleEndian.Uint32(t.stepHost[nl:])))
	flag := math.Float32frombits(binary.LittleEndian.Uint32(t.stepHost[nl+4:]))
	return loss, ss, flag != 0 || math.IsNaN(ss) || math.IsInf(ss, 0), nil
}

// gradStats enqueues the global sum of squares and non-finite flag of the
// gradients and their copy to stepHost[nl:].
func (t *Trainer) gradStats(nl int) {
	t.be.Zero(t.q, t.stats)
	for _, s := range t.st.Layers {
		t.be.SumSquares(t.q, t.stats.Slice(0, 1), s.Grads)
		t.be.CheckFinite(t.q, t.stats.Slice(1, 1), s.Grads)
	}
	t.be.CopyToHost(t.q, t.stepHost[nl:], t.stats)
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

// TrainStep runs one optimizer step: Accum micro-batches from src, loss
// scaling, global-norm clipping and AdamW. On an error (ctx cancelled, bad
// data) before the update, the weights and Step are unchanged; the update
// itself is not interruptible.
//
// On the resident path the host waits for the device once per step, to
// read the losses and gradient statistics together; the AdamW update is
// enqueued and not waited for, so the host prepares the next step's
// batches while it runs. An error the update hits is returned by the next
// call that waits on the queue (the next TrainStep, a read of the weights,
// Close).
func (t *Trainer) TrainStep(ctx context.Context, src BatchSource) (StepResult, error) {
	if t.off != nil {
		return t.offloadStep(ctx, src)
	}
	o := t.opts
	r := StepResult{LR: o.Schedule.At(t.Step), LossScale: t.Scaler.Scale}
	if err := t.accumulate(ctx, src); err != nil {
		return r, err
	}
	if t.gradHook != nil {
		t.gradHook(t.Step)
	}
	loss, sumsq, overflow, err := t.stepStats(ctx, true)
	if err != nil {
		return r, err
	}
	r.Loss = loss
	r.GradNorm = math.Sqrt(sumsq) / t.Scaler.Scale
	if overflow {
		r.GradNorm = math.Inf(1)
	}
	if r.Skipped = t.Scaler.Update(overflow); r.Skipped {
		t.Step++
		return r, nil
	}
	coef := 1.0
	if o.GradClip > 0 && r.GradNorm > o.GradClip {
		coef = o.GradClip / r.GradNorm
	}
	t.Step++
	for i, l := range t.model.Layers {
		if t.trace != nil {
			if err := t.trace.opt.Enqueue("adamw "+l.Name(), func(kernels.Queue) { t.adamWLayer(i, l, r, coef) }); err != nil {
				return r, err
			}
			continue
		}
		t.adamWLayer(i, l, r, coef)
	}
	return r, nil
}

// adamWLayer enqueues the AdamW update of layer i.
func (t *Trainer) adamWLayer(i int, l Layer, r StepResult, coef float64) {
	o := t.opts
	s := t.st.Layers[i]
	for _, ps := range l.Params() {
		p := kernels.AdamWParams{
			LR: float32(r.LR), Beta1: float32(o.Beta1), Beta2: float32(o.Beta2), Eps: float32(o.Eps),
			Step: t.Step, GradScale: float32(coef / r.LossScale),
		}
		if ps.Decay {
			p.WeightDecay = float32(o.WeightDecay)
		}
		out := kernels.Tensor{}
		if s.Weights.Buf != s.Master.Buf {
			out = param(s.Weights, ps)
		}
		t.be.AdamW(t.q, param(s.Master, ps), param(s.Grads, ps), param(s.M, ps), param(s.V, ps), out, p)
	}
}

// Gradients computes the fp32 gradients of the mean loss over Accum
// micro-batches from src without updating anything, for gradient checks:
// one []float32 per layer, laid out as the layer's block.
func (t *Trainer) Gradients(ctx context.Context, src BatchSource) (loss float64, grads [][]float32, err error) {
	if t.off != nil {
		return 0, nil, fmt.Errorf("engine: Gradients needs a resident trainer")
	}
	if err = t.accumulate(ctx, src); err != nil {
		return 0, nil, err
	}
	if loss, _, _, err = t.stepStats(ctx, false); err != nil {
		return 0, nil, err
	}
	for _, s := range t.st.Layers {
		b := make([]byte, s.Grads.N*4)
		g := s.Grads
		if g.DType != kernels.F32 {
			return 0, nil, fmt.Errorf("engine: Gradients needs an fp32 model")
		}
		t.be.CopyToHost(t.q, b, g)
		if err := t.q.Synchronize(ctx); err != nil {
			return 0, nil, err
		}
		v := bytesF32(b)
		for j := range v {
			v[j] /= float32(t.Scaler.Scale)
		}
		grads = append(grads, v)
	}
	return loss, grads, nil
}

// layerHost copies tensor x of a layer (F32) to the host.
func (t *Trainer) layerHost(ctx context.Context, x kernels.Tensor) ([]byte, error) {
	b := make([]byte, x.Bytes())
	t.be.CopyToHost(t.q, b, x)
	return b, t.q.Synchronize(ctx)
}

// MasterWeights returns the fp32 master weights of every layer as host
// floats (block layout).
func (t *Trainer) MasterWeights(ctx context.Context) ([][]float32, error) {
	var out [][]float32
	if t.off != nil {
		for i := range t.model.Layers {
			b, _, _, err := t.off.host.optim(ctx, i)
			if err != nil {
				return nil, err
			}
			out = append(out, bytesF32(b))
		}
		return out, nil
	}
	for _, s := range t.st.Layers {
		b, err := t.layerHost(ctx, s.Master)
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
	return sum / float64(n), nil
}

// SaveTensors copies the fp32 master weights and the Adam moments to the
// host as checkpoint tensors: weights under their nanoGPT names, moments
// as "<name>.exp_avg" and "<name>.exp_avg_sq".
func (t *Trainer) SaveTensors(ctx context.Context) (weights, optim []NamedTensor, err error) {
	for i, l := range t.model.Layers {
		s := t.st.Layers[i]
		var host [3][]byte
		if t.off != nil {
			if host[0], host[1], host[2], err = t.off.host.optim(ctx, i); err != nil {
				return nil, nil, err
			}
		} else {
			for j, x := range []kernels.Tensor{s.Master, s.M, s.V} {
				if host[j], err = t.layerHost(ctx, x); err != nil {
					return nil, nil, err
				}
			}
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
		s := t.st.Layers[i]
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
		if optim != nil && t.off != nil {
			if err := t.off.host.setOptim(ctx, i, host[1], host[2]); err != nil {
				return err
			}
		} else if optim != nil {
			t.be.CopyToDevice(t.q, s.M, host[1])
			t.be.CopyToDevice(t.q, s.V, host[2])
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
