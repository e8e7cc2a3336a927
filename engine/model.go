package engine

import "github.com/spill-ml/spill/kernels"

// Layer is the unit of a model that the engine runs and that the offload
// scheduler moves between device, host and disk: a GPT's embedding, each
// transformer block and the head; each dense layer of an MLP.
//
// A model is an explicit list of layers (Model.Layers). A training
// micro-batch runs Forward for layers 0..n-1 in order, then Backward for
// n-1..0; evaluation runs only the forwards. The optimizer then updates each
// layer's parameters independently. Between two of those calls nothing of
// layer i is needed except its saved activations, so a scheduler may fetch
// a layer's weights just before its Forward or Backward and drop them (or
// write back its gradients) just after.
//
// A Layer holds no tensors and no state: only its shape. Everything it
// computes on lives in the StateTable, indexed by layer, and is handed to it
// through the Pass:
//
//   - Its parameters are ONE contiguous block of NumParams elements, the
//     tensors of Params at their Offset: the compute-dtype weights, the fp32
//     master copy, the gradients and the Adam moments of layer i are each a
//     single Tensor in StateTable.Layers[i] with this layout.
//   - Its saved activations are ONE Buffer of ActivationBytes(B, T) bytes
//     (StateTable.Layers[i].Acts), written by Forward and read by Backward
//     (and by the next layer's Forward/Backward, which take their input from
//     the first OutputElems(B, T) elements of it: see Pass.In and Pass.Out).
//   - Temporaries live in the Pass's Scratch buffer, shared by all layers,
//     of at least ScratchBytes(B, T) bytes; they do not survive the call.
//
// Before Forward(q, p, i) runs, the scheduler must make resident: the
// weights of layer i and of every layer in Tied(), the activations of
// layer i (allocated) and the output of layer i-1 (p.In(i)). Before
// Backward(q, p, i): the same, plus the gradients of layer i and its
// TiedGrads (Backward accumulates into them). All work is enqueued on q;
// the calls return before it runs.
type Layer interface {
	// Name identifies the layer in logs and traces ("h.3", "wte", "head").
	Name() string
	// Params lists the layer's parameter tensors, in block order.
	Params() []ParamSpec
	// NumParams is the number of elements of the parameter block.
	NumParams() int
	// Tied lists other layers whose parameters this layer reads; its
	// Backward accumulates their gradients into its own TiedGrads (one
	// per tied layer, in this order), which the trainer adds to the tied
	// layers' gradients once per step, after the last backward (so the
	// sum is the same in every order of layers and micro-batches). The
	// GPT head uses the embedding's wte.
	Tied() []int
	// OutputElems is the number of elements (compute dtype) of the layer's
	// output for a micro-batch of B rows of T positions (T is 1 for
	// record models); 0 for the last layer, whose output is the losses.
	OutputElems(B, T int) int
	// ActivationBytes is the size of the layer's saved activations,
	// output included, for a B×T micro-batch.
	ActivationBytes(B, T int) int64
	// ScratchBytes is the scratch space Forward and Backward need.
	ScratchBytes(B, T int) int64
	// Forward computes p.Out(i) from p.In(i) and saves what Backward needs
	// in the layer's activations. The last layer writes p.Losses.
	Forward(q kernels.Queue, p *Pass, i int)
	// Backward reads p.DOut (the gradient of the loss w.r.t. p.Out(i);
	// unused by the last layer, which starts from the losses scaled by
	// p.LossGrad), overwrites p.DIn with the gradient w.r.t. p.In(i)
	// (skipped by layer 0) and accumulates into the gradients of layer i
	// and its TiedGrads.
	Backward(q kernels.Queue, p *Pass, i int)
}

// LayerState is everything a layer computes on, kept out of the Layer so
// that a scheduler can move it. Each field is one allocation or a view of a
// whole one (see Layer). Zero Tensors/nil Buffers are absent: grads,
// master and moments exist only for training.
type LayerState struct {
	Weights kernels.Tensor // NumParams elements, compute dtype ("weights")
	Master  kernels.Tensor // fp32 master copy ("master"); the same Tensor as Weights in fp32 runs
	Grads   kernels.Tensor // compute dtype ("grads")
	M, V    kernels.Tensor // AdamW moments, fp32 ("optim")
	Acts    kernels.Buffer // saved activations ("activations")
	// TiedGrads are the gradients Backward accumulates for the layers of
	// Tied(), each laid out as that layer's block ("grads").
	TiedGrads []kernels.Tensor
}

// StateTable holds the per-layer state of a model, indexed by layer. It is
// the only place where layer tensors live: the trainer binds each entry
// to the blocks its step program (offload/schedule) holds for the op being
// enqueued.
type StateTable struct {
	Layers []LayerState
}

// Model is a list of layers of one compute dtype.
type Model struct {
	Family Family // the architecture that built it
	DType  kernels.DType
	Layers []Layer
	// Vocab is the vocabulary of a model over tokens (Family.Input
	// InputTokens); 0 otherwise.
	Vocab int
	// The shape, in the field of the model's family.
	GPT   GPTShape
	Llama LlamaShape
	MLP   MLPShape
	// Lean is whether the layers save lean activations
	// (SetLeanActivations).
	Lean bool
}

// leanLayer is a layer that can save fewer activations and recompute the
// rest in its backward, with the same results bit for bit.
type leanLayer interface{ SetLean(on bool) }

// SetLeanActivations makes every layer that can (GPT blocks: layer norms
// and GELU, as Megatron's selective recomputation and llm.c's -r 2) save
// only what its backward cannot cheaply recompute, or, with on false, all
// of it. It changes ActivationBytes, not the results. It reports whether
// any layer can; the planner turns it on when the model does not fit.
func (m *Model) SetLeanActivations(on bool) bool {
	any := false
	for _, l := range m.Layers {
		if ll, ok := l.(leanLayer); ok {
			ll.SetLean(on)
			any = true
		}
	}
	m.Lean = on && any
	return any
}

// NumParams is the number of parameters of the model.
func (m *Model) NumParams() int64 {
	var n int64
	for _, l := range m.Layers {
		n += int64(l.NumParams())
	}
	return n
}

// Pass is the context of one forward/backward pass over a micro-batch. The
// engine owns it; layers read their inputs from it and write their outputs
// into it.
type Pass struct {
	Ops   kernels.Backend
	Model *Model
	Table *StateTable
	B, T  int // micro-batch rows and positions per row (T = 1 for records)

	// Input is layer 0's input: token ids (B*T, I32) for a GPT, features
	// (B*F, compute dtype) for an MLP.
	Input kernels.Tensor
	// Targets are the last layer's targets: next tokens (B*T, I32),
	// class labels (B, I32) or regression targets (B, F32).
	Targets kernels.Tensor
	// Losses (F32) receives the per-target losses of the last layer.
	Losses kernels.Tensor
	// LossGrad is the factor of d(sum of Losses) that the last layer's
	// Backward starts from: lossScale / (targets in the whole optimizer step).
	LossGrad float32
	// DOut and DIn are the gradients of the current layer's output and
	// input during Backward (compute dtype), bound by the trainer; the
	// same tensor for the layers of a family with InPlaceResidual in a
	// resident trainer.
	DOut, DIn kernels.Tensor
	// Scratch is shared temporary space, at least the largest ScratchBytes.
	Scratch kernels.Buffer
}

// Out is the output of layer i: the first OutputElems elements of its
// activations, in compute dtype.
func (p *Pass) Out(i int) kernels.Tensor {
	n := p.Model.Layers[i].OutputElems(p.B, p.T)
	return kernels.View(p.Table.Layers[i].Acts, 0, p.Model.DType, n)
}

// In is the input of layer i: p.Input for layer 0, else Out(i-1).
func (p *Pass) In(i int) kernels.Tensor {
	if i == 0 {
		return p.Input
	}
	return p.Out(i - 1)
}

// scratchAlloc lays out consecutive, 256-byte aligned views of a buffer.
type scratchAlloc struct {
	buf kernels.Buffer
	off int64
}

// take returns the next n elements of dtype dt; with a nil buffer it only
// measures (and returns the zero Tensor), so one layout function serves for
// sizing and for viewing.
func (s *scratchAlloc) take(dt kernels.DType, n int) kernels.Tensor {
	var t kernels.Tensor
	if s.buf != nil {
		t = kernels.View(s.buf, s.off, dt, n)
	}
	s.off += align(int64(n) * int64(dt.Size()))
	return t
}

func align(n int64) int64 { return (n + 255) &^ 255 }

// param returns the view of spec in a layer block t.
func param(t kernels.Tensor, s ParamSpec) kernels.Tensor {
	return t.Slice(s.Offset, s.Elems())
}

// paramOr returns the view of spec in t, or the zero Tensor if t is absent.
func paramOr(t kernels.Tensor, s ParamSpec) kernels.Tensor {
	if t.IsZero() {
		return t
	}
	return param(t, s)
}
