package engine

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"sync"

	"github.com/spill-ml/spill/dataset"
	"github.com/spill-ml/spill/kernels"
)

// llama3Scaling is the rope_scaling of Llama 3.1 (factor 8) and 3.2
// (factor 32): rope_type "llama3", low_freq_factor 1, high_freq_factor 4,
// original_max_position_embeddings 8192.
func llama3Scaling(factor float64) kernels.RoPEScaling {
	return kernels.RoPEScaling{Factor: factor, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 8192}
}

// llamaPresets are the Llama family's shapes, from the config.json of
// meta-llama's Hugging Face repositories (hidden_size, num_hidden_layers,
// num_attention_heads, num_key_value_heads, intermediate_size,
// vocab_size, max_position_embeddings, rope_theta, rope_scaling,
// rms_norm_eps, tie_word_embeddings). llama-tiny is a small shape of the
// same architecture (grouped-query attention, untied head) for CPU runs.
var llamaPresets = []Preset{
	{Name: "llama-tiny", Layers: 4, Heads: 4, KVHeads: 2, Embd: 128, FFN: 384, Vocab: 0, MaxSeq: 256,
		RoPE: kernels.RoPEConfig{Theta: 10000}, NormEps: 1e-5, Steps: 200, LR: 1e-3},
	{Name: "llama3.2-1b", Layers: 16, Heads: 32, KVHeads: 8, Embd: 2048, FFN: 8192, Vocab: 128256, MaxSeq: 131072,
		RoPE: kernels.RoPEConfig{Theta: 500000, Scaling: llama3Scaling(32)}, NormEps: 1e-5, Tied: true, Steps: 5000, LR: 3e-4},
	{Name: "llama3.2-3b", Layers: 28, Heads: 24, KVHeads: 8, Embd: 3072, FFN: 8192, Vocab: 128256, MaxSeq: 131072,
		RoPE: kernels.RoPEConfig{Theta: 500000, Scaling: llama3Scaling(32)}, NormEps: 1e-5, Tied: true, Steps: 5000, LR: 3e-4},
	{Name: "llama3.1-8b", Layers: 32, Heads: 32, KVHeads: 8, Embd: 4096, FFN: 14336, Vocab: 128256, MaxSeq: 131072,
		RoPE: kernels.RoPEConfig{Theta: 500000, Scaling: llama3Scaling(8)}, NormEps: 1e-5, Steps: 5000, LR: 3e-4},
	{Name: "llama2-7b", Layers: 32, Heads: 32, KVHeads: 32, Embd: 4096, FFN: 11008, Vocab: 32000, MaxSeq: 4096,
		RoPE: kernels.RoPEConfig{Theta: 10000}, NormEps: 1e-5, Steps: 5000, LR: 3e-4},
	{Name: "llama2-13b", Layers: 40, Heads: 40, KVHeads: 40, Embd: 5120, FFN: 13824, Vocab: 32000, MaxSeq: 4096,
		RoPE: kernels.RoPEConfig{Theta: 10000}, NormEps: 1e-5, Steps: 5000, LR: 3e-4},
}

// llamaFamily is Hugging Face's LlamaForCausalLM. Its layers run only on a
// backend that implements kernels.LlamaOps (the CPU and CUDA backends).
type llamaFamily struct{}

func (llamaFamily) Name() string          { return "llama" }
func (llamaFamily) Input() InputKind      { return InputTokens }
func (llamaFamily) Presets() []Preset     { return llamaPresets }
func (llamaFamily) InPlaceResidual() bool { return true }
func (llamaFamily) defaults(c *Config)    {}

func (llamaFamily) validate(c *Config, bad func(key, format string, args ...any)) {
	validateTokens(c, bad)
	if c.KVHeads < 0 {
		bad("kv_heads", "must be >= 0 (0 = the preset's), got %d", c.KVHeads)
	}
	if c.FFN < 0 {
		bad("ffn", "must be >= 0 (0 = the preset's), got %d", c.FFN)
	}
	if c.NormEps < 0 || math.IsNaN(c.NormEps) || math.IsInf(c.NormEps, 0) {
		bad("norm_eps", "must be a positive number (0 = the preset's), got %v", c.NormEps)
	}
	if c.RoPETheta < 0 || math.IsNaN(c.RoPETheta) || math.IsInf(c.RoPETheta, 0) {
		bad("rope_theta", "must be a positive number (0 = the preset's), got %v", c.RoPETheta)
	}
	if r := c.RoPEScaling; r != nil && r.Type != RoPEScalingNone && r.Type != RoPEScalingLlama3 {
		bad("rope_scaling", "rope_type %q is not supported (want %q or %q)", r.Type, RoPEScalingLlama3, RoPEScalingNone)
	}
	s, ok := llamaShapeOf(c)
	if !ok || c.Heads <= 0 || c.Embd <= 0 || c.Embd%c.Heads != 0 {
		return
	}
	if s.KVHeads > 0 && c.Heads%s.KVHeads != 0 {
		bad("heads", "%d is not a multiple of the key/value heads (%d)", c.Heads, s.KVHeads)
	}
	if hs := c.Embd / c.Heads; hs%2 != 0 {
		bad("heads", "head size embd/heads = %d must be even (rotary embeddings)", hs)
	} else if err := s.RoPE.Validate(hs); err != nil && c.RoPEScaling != nil {
		bad("rope_scaling", "%v", err)
	}
}

func (llamaFamily) build(c *Config, _ dataset.Schema, dt kernels.DType) (*Model, error) {
	s, ok := llamaShapeOf(c)
	if !ok {
		return nil, fmt.Errorf("engine: %q is no Llama preset", c.Model)
	}
	return NewLlama(s, dt)
}

// Values of RoPEScalingConfig.Type.
const (
	RoPEScalingLlama3 = "llama3" // Llama 3.1's frequency scaling
	RoPEScalingNone   = "none"   // none, overriding a preset's
)

// RoPEScalingConfig is Config.RoPEScaling, config.json's rope_scaling:
// Type "llama3" with its four parameters, or "none".
type RoPEScalingConfig struct {
	Type                 string  `toml:"rope_type" json:"rope_type"`
	Factor               float64 `toml:"factor,omitempty" json:"factor,omitempty"`
	LowFreqFactor        float64 `toml:"low_freq_factor,omitempty" json:"low_freq_factor,omitempty"`
	HighFreqFactor       float64 `toml:"high_freq_factor,omitempty" json:"high_freq_factor,omitempty"`
	OriginalMaxPositions int     `toml:"original_max_position_embeddings,omitempty" json:"original_max_position_embeddings,omitempty"`
}

// scaling is the kernels' form (the zero value for "none").
func (r RoPEScalingConfig) scaling() kernels.RoPEScaling {
	if r.Type != RoPEScalingLlama3 {
		return kernels.RoPEScaling{}
	}
	return kernels.RoPEScaling{Factor: r.Factor, LowFreqFactor: r.LowFreqFactor, HighFreqFactor: r.HighFreqFactor,
		OriginalMaxPositions: r.OriginalMaxPositions}
}

// llamaShapeOf is the shape c describes: its preset's, overridden by
// every field c sets. ok is false when c.Model is no Llama preset.
func llamaShapeOf(c *Config) (s LlamaShape, ok bool) {
	p, ok := LookupPreset(c.Model)
	if !ok || FamilyOf(c.Model).Name() != "llama" {
		return s, false
	}
	s = LlamaShape{Layers: c.Layers, Heads: c.Heads, KVHeads: p.KVHeads, Embd: c.Embd, FFN: p.FFN,
		Vocab: c.Vocab, MaxSeq: c.MaxSeq, RoPE: p.RoPE, NormEps: p.NormEps, Tied: p.Tied}
	if c.KVHeads > 0 {
		s.KVHeads = c.KVHeads
	}
	if c.FFN > 0 {
		s.FFN = c.FFN
	}
	if c.RoPETheta > 0 {
		s.RoPE.Theta = c.RoPETheta
	}
	if c.RoPEScaling != nil {
		s.RoPE.Scaling = c.RoPEScaling.scaling()
	}
	if c.NormEps > 0 {
		s.NormEps = c.NormEps
	}
	if c.TieEmbeddings != nil {
		s.Tied = *c.TieEmbeddings
	}
	return s, true
}

// LlamaShape is the shape of a Llama (the fields of transformers'
// LlamaConfig that spill uses). The head size is Embd/Heads.
type LlamaShape struct {
	Layers  int // num_hidden_layers
	Heads   int // num_attention_heads
	KVHeads int // num_key_value_heads: divides Heads
	Embd    int // hidden_size
	FFN     int // intermediate_size
	Vocab   int // vocab_size
	MaxSeq  int // max_position_embeddings
	RoPE    kernels.RoPEConfig
	NormEps float64 // rms_norm_eps
	Tied    bool    // tie_word_embeddings: the LM head is embed_tokens
}

// Validate reports every problem of the shape at once.
func (s LlamaShape) Validate() error {
	var errs []error
	if s.Layers <= 0 || s.Heads <= 0 || s.KVHeads <= 0 || s.Embd <= 0 || s.FFN <= 0 || s.Vocab <= 0 || s.MaxSeq <= 0 {
		return fmt.Errorf("engine: Llama shape %+v: every dimension must be positive", s)
	}
	if s.Embd%s.Heads != 0 {
		errs = append(errs, fmt.Errorf("engine: Llama shape: hidden size %d is not a multiple of heads %d", s.Embd, s.Heads))
	} else if err := s.RoPE.Validate(s.Embd / s.Heads); err != nil {
		errs = append(errs, err)
	}
	if s.Heads%s.KVHeads != 0 {
		errs = append(errs, fmt.Errorf("engine: Llama shape: heads %d is not a multiple of key/value heads %d", s.Heads, s.KVHeads))
	}
	if !(s.NormEps > 0) {
		errs = append(errs, fmt.Errorf("engine: Llama shape: rms_norm_eps %v must be positive", s.NormEps))
	}
	return errors.Join(errs...)
}

// headSize is the width of one attention head.
func (s LlamaShape) headSize() int { return s.Embd / s.Heads }

// qkvWidth is the width of a token's packed q, k and v projections.
func (s LlamaShape) qkvWidth() int { return kernels.GQAWidth(s.Heads, s.KVHeads, s.headSize()) }

// NewLlama builds the layer list of a Llama in compute dtype dt: layer 0
// is the token embedding (model.embed_tokens), layers 1..L the decoder
// layers (model.layers.N), layer L+1 the head (model.norm, lm_head or the
// tied embedding, and the loss). Parameter names and layouts are
// transformers' (Linear weights (out, in)); the q, k and v projections of
// a layer are adjacent in its block, so that together they are the weight
// of one matmul into the packed qkv layout of kernels.LlamaOps.
func NewLlama(s LlamaShape, dt kernels.DType) (*Model, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	m := &Model{Family: llamaFamily{}, DType: dt, Llama: s, Vocab: s.Vocab}
	emb := newLlamaEmbedding(s, dt)
	m.Layers = append(m.Layers, emb)
	rope := &ropeTables{cfg: s.RoPE, hs: s.headSize()}
	for i := 0; i < s.Layers; i++ {
		m.Layers = append(m.Layers, newLlamaBlock(s, dt, i, rope))
	}
	m.Layers = append(m.Layers, newLlamaHead(s, dt, emb.wte))
	return m, nil
}

// llamaOps returns the backend's Llama kernels; a backend without them
// cannot run a Llama layer, which is a programming error by the time a
// layer runs (Run and NewTrainer check the backend first: CheckBackend).
func llamaOps(be kernels.Backend) kernels.LlamaOps {
	lo, ok := be.(kernels.LlamaOps)
	if !ok {
		panic(fmt.Sprintf("engine: the %s backend does not implement the Llama kernels (kernels.LlamaOps); Llama models run on the cpu and cuda backends", be.Name()))
	}
	return lo
}

func (llamaFamily) describe(m *Model) string {
	s := m.Llama
	return fmt.Sprintf("%s of width %d, %s (%d key/value), vocabulary %d", plural(s.Layers, "block"), s.Embd,
		plural(s.Heads, "head"), s.KVHeads, s.Vocab)
}

func (llamaFamily) checkBackend(be kernels.Backend) error {
	if _, ok := be.(kernels.LlamaOps); !ok {
		return fmt.Errorf("engine: the %s backend has no Llama kernels (kernels.LlamaOps); train Llama models with --device cpu or --device cuda", be.Name())
	}
	return nil
}

// ropeTables keeps the host cos/sin tables of a model's rotary embedding,
// one per sequence length and backend, built on first use and shared by
// its blocks. They are derived from the shape and never change, so a
// block copies its T rows into scratch before it rotates; the host bytes
// outlive every copy. Where the backend has pinned memory
// (kernels.PinnedAllocator) the table lives there: a copy from pageable
// memory makes the CUDA driver stage it synchronously, holding the queue
// until the device has caught up, at every block's forward and backward
// (4.6 ms each at llama3.2-1b, T 2048, on the H200: most of the queue's
// host time per step). The pinned tables go with the backend, at its
// Close.
type ropeTables struct {
	cfg kernels.RoPEConfig
	hs  int
	mu  sync.Mutex
	byT map[ropeKey][]byte
}

// ropeKey names one of ropeTables' tables: be is the backend of a pinned
// one, nil for Go memory (also where the backend's type is not comparable).
type ropeKey struct {
	be kernels.Backend
	T  int
}

func (r *ropeTables) get(be kernels.Backend, T int) []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	pa, ok := be.(kernels.PinnedAllocator)
	ok = ok && reflect.TypeOf(be).Comparable()
	key := ropeKey{T: T}
	if ok {
		key.be = be
	}
	if b, ok := r.byT[key]; ok {
		return b
	}
	if r.byT == nil {
		r.byT = map[ropeKey][]byte{}
	}
	b := f32Bytes(r.cfg.Table(T, r.hs))
	if ok {
		// Without pinned memory the copies still work, only slower.
		if pb, err := pa.AllocPinned(len(b)); err == nil {
			copy(pb, b)
			b = pb
		}
	}
	r.byT[key] = b
	return b
}

// llamaEmbedding is Llama layer 0: out(B,T,C) = embed_tokens[tokens].
type llamaEmbedding struct {
	s     LlamaShape
	dt    kernels.DType
	specs []ParamSpec
	n     int
	wte   ParamSpec
}

func newLlamaEmbedding(s LlamaShape, dt kernels.DType) *llamaEmbedding {
	var b specBuilder
	e := &llamaEmbedding{s: s, dt: dt}
	e.wte = b.add("model.embed_tokens.weight", InitNormal, 0.02, s.Vocab, s.Embd)
	e.specs, e.n = b.specs, b.n
	return e
}

func (e *llamaEmbedding) Name() string             { return "embed_tokens" }
func (e *llamaEmbedding) Params() []ParamSpec      { return e.specs }
func (e *llamaEmbedding) NumParams() int           { return e.n }
func (e *llamaEmbedding) Tied() []int              { return nil }
func (e *llamaEmbedding) OutputElems(B, T int) int { return B * T * e.s.Embd }
func (e *llamaEmbedding) ActivationBytes(B, T int) int64 {
	return align(int64(B*T*e.s.Embd) * int64(e.dt.Size()))
}

// ScratchBytes: a (T,C) block of zeros standing for the position table
// that the encoder ops add (a Llama has none; x + 0 is x).
func (e *llamaEmbedding) ScratchBytes(B, T int) int64 {
	return align(int64(T*e.s.Embd) * int64(e.dt.Size()))
}

// FwdFLOPs implements FLOPer: a lookup.
func (e *llamaEmbedding) FwdFLOPs(T int) float64 { return 0 }

func (e *llamaEmbedding) noPositions(p *Pass) kernels.Tensor {
	return kernels.View(p.Scratch, 0, e.dt, p.T*e.s.Embd)
}

func (e *llamaEmbedding) Forward(q kernels.Queue, p *Pass, i int) {
	zeros := e.noPositions(p)
	p.Ops.Zero(q, zeros)
	p.Ops.EncoderForward(q, p.Out(i), p.Input, param(p.Table.Layers[i].Weights, e.wte), zeros, p.B, p.T, e.s.Embd)
}

func (e *llamaEmbedding) Backward(q kernels.Queue, p *Pass, i int) {
	// The encoder's position gradient lands in scratch and is dropped.
	p.Ops.EncoderBackward(q, param(p.Table.Layers[i].Grads, e.wte), e.noPositions(p), p.DOut, p.Input, p.B, p.T, e.s.Embd)
}

// llamaBlock is one decoder layer (transformers' LlamaDecoderLayer):
//
//	x2  = x + o_proj(attn(rope(qkv_proj(input_layernorm(x)))))
//	out = x2 + down_proj(silu(gate_proj(h))·up_proj(h)),  h = post_attention_layernorm(x2)
type llamaBlock struct {
	s     LlamaShape
	dt    kernels.DType
	name  string
	specs []ParamSpec
	n     int
	rope  *ropeTables

	inNorm, q, k, v, o, postNorm, gate, up, down ParamSpec
}

func newLlamaBlock(s LlamaShape, dt kernels.DType, idx int, rope *ropeTables) *llamaBlock {
	C, hs := s.Embd, s.headSize()
	pre := fmt.Sprintf("model.layers.%d.", idx)
	k := &llamaBlock{s: s, dt: dt, name: fmt.Sprintf("layers.%d", idx), rope: rope}
	var b specBuilder
	k.inNorm = b.add(pre+"input_layernorm.weight", InitOnes, 0, C)
	// q, k and v back to back: rows of one ((NH+2·NKV)·hs, C) weight.
	k.q = b.add(pre+"self_attn.q_proj.weight", InitNormal, 0.02, s.Heads*hs, C)
	k.k = b.add(pre+"self_attn.k_proj.weight", InitNormal, 0.02, s.KVHeads*hs, C)
	k.v = b.add(pre+"self_attn.v_proj.weight", InitNormal, 0.02, s.KVHeads*hs, C)
	k.o = b.add(pre+"self_attn.o_proj.weight", InitNormal, 0.02, C, s.Heads*hs)
	k.postNorm = b.add(pre+"post_attention_layernorm.weight", InitOnes, 0, C)
	k.gate = b.add(pre+"mlp.gate_proj.weight", InitNormal, 0.02, s.FFN, C)
	k.up = b.add(pre+"mlp.up_proj.weight", InitNormal, 0.02, s.FFN, C)
	k.down = b.add(pre+"mlp.down_proj.weight", InitNormal, 0.02, C, s.FFN)
	k.specs, k.n = b.specs, b.n
	return k
}

// qkv is the view of the stacked q, k and v projections in a block t.
func (k *llamaBlock) qkv(t kernels.Tensor) kernels.Tensor {
	return t.Slice(k.q.Offset, k.s.qkvWidth()*k.s.Embd)
}

// llamaBlockActs are a block's saved activations.
type llamaBlockActs struct {
	out   kernels.Tensor // (BT,C) first: the block's output
	ln1   kernels.Tensor // (BT,C) input_layernorm(x)
	rstd1 kernels.Tensor // (BT) f32
	qkv   kernels.Tensor // (BT,W) after RoPE, W = (NH+2·NKV)·hs
	atty  kernels.Tensor // (BT,NH·hs)
	lse   kernels.Tensor // (B,NH,T) f32
	res2  kernels.Tensor // (BT,C) residual after attention
	ln2   kernels.Tensor // (BT,C)
	rstd2 kernels.Tensor // (BT) f32
	gate  kernels.Tensor // (BT,FFN)
	up    kernels.Tensor // (BT,FFN)
	h     kernels.Tensor // (BT,FFN) silu(gate)·up
	// save is the size of the selective checkpoint (out, rstd1, atty and
	// lse: the start of the layout).
	save int64
	size int64
}

func (k *llamaBlock) acts(buf kernels.Buffer, B, T int) llamaBlockActs {
	BT, C, F := B*T, k.s.Embd, k.s.FFN
	a := scratchAlloc{buf: buf}
	var r llamaBlockActs
	r.out = a.take(k.dt, BT*C)
	r.rstd1 = a.take(kernels.F32, BT)
	r.atty = a.take(k.dt, BT*k.s.Heads*k.s.headSize())
	r.lse = a.take(kernels.F32, B*k.s.Heads*T)
	r.save = a.off
	r.ln1 = a.take(k.dt, BT*C)
	r.qkv = a.take(k.dt, BT*k.s.qkvWidth())
	r.res2 = a.take(k.dt, BT*C)
	r.ln2 = a.take(k.dt, BT*C)
	r.rstd2 = a.take(kernels.F32, BT)
	r.gate = a.take(k.dt, BT*F)
	r.up = a.take(k.dt, BT*F)
	r.h = a.take(k.dt, BT*F)
	r.size = a.off
	return r
}

// llamaBlockScratch is the RoPE table and the backward's temporaries.
type llamaBlockScratch struct {
	table            kernels.Tensor // (T,hs) f32
	dh, dgate, dup   kernels.Tensor // (BT,FFN)
	dln, datty, dqkv kernels.Tensor // (BT,C), (BT,NH·hs), (BT,W)
	size             int64
}

func (k *llamaBlock) scratch(buf kernels.Buffer, B, T int) llamaBlockScratch {
	BT, F := B*T, k.s.FFN
	a := scratchAlloc{buf: buf}
	var r llamaBlockScratch
	r.table = a.take(kernels.F32, T*k.s.headSize())
	r.dh = a.take(k.dt, BT*F)
	r.dgate = a.take(k.dt, BT*F)
	r.dup = a.take(k.dt, BT*F)
	r.dln = a.take(k.dt, BT*k.s.Embd)
	r.datty = a.take(k.dt, BT*k.s.Heads*k.s.headSize())
	r.dqkv = a.take(k.dt, BT*k.s.qkvWidth())
	r.size = a.off
	return r
}

func (k *llamaBlock) Name() string        { return k.name }
func (k *llamaBlock) Params() []ParamSpec { return k.specs }
func (k *llamaBlock) NumParams() int      { return k.n }
func (k *llamaBlock) Tied() []int         { return nil }

// FwdFLOPs implements FLOPer: two per parameter (the matmuls) and
// attention's 4·T·NH·hs (scores and the weighted sum over the query heads,
// counted as if not causal, as for the GPT).
func (k *llamaBlock) FwdFLOPs(T int) float64 {
	return 2*float64(k.n) + 4*float64(T)*float64(k.s.Heads*k.s.headSize())
}

// KernelEfficiency implements KernelEfficiencer: a Llama block's RMSNorms,
// rotary embeddings and SwiGLU run as kernels of their own (a GPT block's
// GELU is fused into its GEMM), and its step ran at 0.87-0.90 of the
// GPT-fitted rate on the H200 (llama3.1-8b and llama2-13b at T 2048,
// engine/testdata/h200).
func (k *llamaBlock) KernelEfficiency() float64 { return 0.88 }

func (k *llamaBlock) OutputElems(B, T int) int       { return B * T * k.s.Embd }
func (k *llamaBlock) ActivationBytes(B, T int) int64 { return k.acts(nil, B, T).size }
func (k *llamaBlock) ScratchBytes(B, T int) int64    { return k.scratch(nil, B, T).size }

// loadTable copies the RoPE table of T positions into scratch.
func (k *llamaBlock) loadTable(q kernels.Queue, p *Pass, s llamaBlockScratch) {
	p.Ops.CopyToDevice(q, s.table, k.rope.get(p.Ops, p.T))
}

func (k *llamaBlock) Forward(q kernels.Queue, p *Pass, i int) { k.forward(q, p, i, false) }

// SelectiveBytes implements SelectiveRecomputer.
func (k *llamaBlock) SelectiveBytes(B, T int) int64 { return k.acts(nil, B, T).save }

// SelectiveFLOPs implements SelectiveRecomputer: the q/k/v, o, gate and
// up projections, not the attention or the down projection.
func (k *llamaBlock) SelectiveFLOPs(T int) float64 {
	C, W, A, F := float64(k.s.Embd), float64(k.s.qkvWidth()), float64(k.s.Heads*k.s.headSize()), float64(k.s.FFN)
	return 2 * (C*W + A*C + 2*C*F)
}

// RecomputeSelective implements SelectiveRecomputer: with the selective
// checkpoint in place, the rest of what Forward saves, by Forward's
// kernels on the same inputs (the same bits), without the attention or
// the output.
func (k *llamaBlock) RecomputeSelective(q kernels.Queue, p *Pass, i int) { k.forward(q, p, i, true) }

// forward is Forward, or with selective the part of it that
// RecomputeSelective reruns.
func (k *llamaBlock) forward(q kernels.Queue, p *Pass, i int, selective bool) {
	o, lo, w := p.Ops, llamaOps(p.Ops), p.Table.Layers[i].Weights
	B, T, C, NH, NKV, hs, F := p.B, p.T, k.s.Embd, k.s.Heads, k.s.KVHeads, k.s.headSize(), k.s.FFN
	BT, W := B*T, k.s.qkvWidth()
	a := k.acts(p.Table.Layers[i].Acts, B, T)
	s := k.scratch(p.Scratch, B, T)
	x := p.In(i)
	eps := float32(k.s.NormEps)

	k.loadTable(q, p, s)
	lo.RMSNormForward(q, a.ln1, a.rstd1, x, param(w, k.inNorm), BT, C, eps)
	o.MatmulForward(q, a.qkv, a.ln1, k.qkv(w), kernels.Tensor{}, BT, C, W)
	lo.RoPEForward(q, a.qkv, a.qkv, s.table, B, T, NH, NKV, hs)
	if !selective {
		lo.GQAttentionForward(q, a.atty, a.lse, a.qkv, B, T, NH, NKV, hs)
	}
	// As in the GPT block, the projections write into the residual stream
	// and add its input (in the GEMM's epilogue where the backend can).
	kernels.MatmulForwardResidual(o, q, a.res2, a.atty, param(w, k.o), kernels.Tensor{}, x, BT, NH*hs, C)

	lo.RMSNormForward(q, a.ln2, a.rstd2, a.res2, param(w, k.postNorm), BT, C, eps)
	o.MatmulForward(q, a.gate, a.ln2, param(w, k.gate), kernels.Tensor{}, BT, C, F)
	o.MatmulForward(q, a.up, a.ln2, param(w, k.up), kernels.Tensor{}, BT, C, F)
	lo.SwiGLUForward(q, a.h, a.gate, a.up, BT*F)
	if !selective {
		kernels.MatmulForwardResidual(o, q, a.out, a.h, param(w, k.down), kernels.Tensor{}, a.res2, BT, F, C)
	}
}

func (k *llamaBlock) Backward(q kernels.Queue, p *Pass, i int) {
	o, lo := p.Ops, llamaOps(p.Ops)
	st := p.Table.Layers[i]
	w, g := st.Weights, st.Grads
	B, T, C, NH, NKV, hs, F := p.B, p.T, k.s.Embd, k.s.Heads, k.s.KVHeads, k.s.headSize(), k.s.FFN
	BT, W := B*T, k.s.qkvWidth()
	a := k.acts(st.Acts, B, T)
	s := k.scratch(p.Scratch, B, T)
	x := p.In(i)
	dx := p.DIn // accumulates d(res2), then d(x)

	k.loadTable(q, p, s)
	// MLP branch: the residual passes d(out) through (already in place
	// when DIn is DOut).
	if !sameView(dx, p.DOut) {
		o.CopyDevice(q, dx, p.DOut)
	}
	kernels.MatmulBackwardSet(o, q, s.dh, param(g, k.down), kernels.Tensor{}, p.DOut, a.h, param(w, k.down), BT, F, C)
	o.Zero(q, s.dgate)
	o.Zero(q, s.dup)
	lo.SwiGLUBackward(q, s.dgate, s.dup, s.dh, a.gate, a.up, BT*F)
	kernels.MatmulBackwardSet(o, q, s.dln, param(g, k.gate), kernels.Tensor{}, s.dgate, a.ln2, param(w, k.gate), BT, C, F)
	o.MatmulBackward(q, s.dln, param(g, k.up), kernels.Tensor{}, s.dup, a.ln2, param(w, k.up), BT, C, F)
	lo.RMSNormBackward(q, dx, param(g, k.postNorm), s.dln, a.res2, param(w, k.postNorm), a.rstd2, BT, C)

	// Attention branch: dx holds d(res2), which is also d(o_proj output).
	kernels.MatmulBackwardSet(o, q, s.datty, param(g, k.o), kernels.Tensor{}, dx, a.atty, param(w, k.o), BT, NH*hs, C)
	o.Zero(q, s.dqkv)
	lo.GQAttentionBackward(q, s.dqkv, s.datty, a.qkv, a.atty, a.lse, B, T, NH, NKV, hs)
	lo.RoPEBackwardSet(q, s.dqkv, s.dqkv, s.table, B, T, NH, NKV, hs)
	kernels.MatmulBackwardSet(o, q, s.dln, k.qkv(g), kernels.Tensor{}, s.dqkv, a.ln1, k.qkv(w), BT, C, W)
	lo.RMSNormBackward(q, dx, param(g, k.inNorm), s.dln, x, param(w, k.inNorm), a.rstd1, BT, C)
}

// llamaHead is the last Llama layer: model.norm, the logits through
// lm_head.weight (or, tied, the embedding of layer 0) and the
// cross-entropy losses.
type llamaHead struct {
	s     LlamaShape
	dt    kernels.DType
	specs []ParamSpec
	n     int
	norm  ParamSpec
	lm    ParamSpec // in this block, or in layer 0's when tied
}

func newLlamaHead(s LlamaShape, dt kernels.DType, wte ParamSpec) *llamaHead {
	var b specBuilder
	h := &llamaHead{s: s, dt: dt, lm: wte}
	h.norm = b.add("model.norm.weight", InitOnes, 0, s.Embd)
	if !s.Tied {
		h.lm = b.add("lm_head.weight", InitNormal, 0.02, s.Vocab, s.Embd)
	}
	h.specs, h.n = b.specs, b.n
	return h
}

type llamaHeadActs struct {
	lnf, rstd, logits kernels.Tensor
	size              int64
}

func (h *llamaHead) acts(buf kernels.Buffer, B, T int) llamaHeadActs {
	BT := B * T
	a := scratchAlloc{buf: buf}
	var r llamaHeadActs
	r.lnf = a.take(h.dt, BT*h.s.Embd)
	r.rstd = a.take(kernels.F32, BT)
	r.logits = a.take(h.dt, BT*h.s.Vocab)
	r.size = a.off
	return r
}

func (h *llamaHead) scratch(buf kernels.Buffer, B, T int) (dlogits, dlnf kernels.Tensor, size int64) {
	return headScratch(buf, h.dt, B*T, h.s.Vocab, h.s.Embd)
}

func (h *llamaHead) Name() string        { return "head" }
func (h *llamaHead) Params() []ParamSpec { return h.specs }
func (h *llamaHead) NumParams() int      { return h.n }

// Tied is the embedding (layer 0) when the head is tied to it.
func (h *llamaHead) Tied() []int {
	if h.s.Tied {
		return []int{0}
	}
	return nil
}

// FwdFLOPs implements FLOPer: the logits.
func (h *llamaHead) FwdFLOPs(T int) float64         { return 2 * float64(h.s.Vocab) * float64(h.s.Embd) }
func (h *llamaHead) OutputElems(B, T int) int       { return 0 }
func (h *llamaHead) ActivationBytes(B, T int) int64 { return h.acts(nil, B, T).size }
func (h *llamaHead) ScratchBytes(B, T int) int64 {
	_, _, n := h.scratch(nil, B, T)
	return n
}

// lmWeights is the LM head's weight block (with h.lm's offset in it):
// layer 0's when tied, this layer's otherwise.
func (h *llamaHead) lmWeights(p *Pass, i int) kernels.Tensor {
	if h.s.Tied {
		return p.Table.Layers[0].Weights
	}
	return p.Table.Layers[i].Weights
}

func (h *llamaHead) Forward(q kernels.Queue, p *Pass, i int) {
	o, lo, w := p.Ops, llamaOps(p.Ops), p.Table.Layers[i].Weights
	BT, C, V := p.B*p.T, h.s.Embd, h.s.Vocab
	a := h.acts(p.Table.Layers[i].Acts, p.B, p.T)
	lo.RMSNormForward(q, a.lnf, a.rstd, p.In(i), param(w, h.norm), BT, C, float32(h.s.NormEps))
	o.MatmulForward(q, a.logits, a.lnf, param(h.lmWeights(p, i), h.lm), kernels.Tensor{}, BT, C, V)
	o.CrossEntropyForward(q, p.Losses, a.logits, p.Targets, BT, V)
}

func (h *llamaHead) Backward(q kernels.Queue, p *Pass, i int) {
	o, lo := p.Ops, llamaOps(p.Ops)
	st := p.Table.Layers[i]
	BT, C, V := p.B*p.T, h.s.Embd, h.s.Vocab
	a := h.acts(st.Acts, p.B, p.T)
	dlogits, dlnf, _ := h.scratch(p.Scratch, p.B, p.T)
	kernels.CrossEntropyBackwardSet(o, q, dlogits, a.logits, p.Targets, BT, V, p.LossGrad)
	dlm := st.Grads
	if h.s.Tied {
		dlm = st.TiedGrads[0]
	}
	kernels.MatmulBackwardSet(o, q, dlnf, param(dlm, h.lm), kernels.Tensor{}, dlogits, a.lnf, param(h.lmWeights(p, i), h.lm), BT, C, V)
	o.Zero(q, p.DIn)
	lo.RMSNormBackward(q, p.DIn, param(st.Grads, h.norm), dlnf, p.In(i), param(st.Weights, h.norm), a.rstd, BT, C)
}

// LlamaParams is the number of parameters of a Llama of shape s (a tied
// head counted once).
func LlamaParams(s LlamaShape) int64 {
	C, hs := int64(s.Embd), int64(s.headSize())
	block := 2*C + int64(s.qkvWidth())*C + C*int64(s.Heads)*hs + 3*C*int64(s.FFN)
	n := int64(s.Vocab)*C + int64(s.Layers)*block + C
	if !s.Tied {
		n += int64(s.Vocab) * C
	}
	return n
}
