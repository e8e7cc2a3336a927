package engine

import (
	"fmt"
	"math"

	"github.com/spill-ml/spill/dataset"
	"github.com/spill-ml/spill/kernels"
)

// gptPresets are the GPT family's shapes. The GPT-2 shapes (gpt2-124m,
// -350m, -774m) use a 1024-token context; the GPT-3 shapes (gpt2-1.3b,
// -2.7b, -6.7b) a 2048-token one. Every non-tiny preset pads the GPT-2
// vocabulary (50257) to 50304, a multiple of 128, as llm.c and nanoGPT do.
var gptPresets = []Preset{
	{Name: "tiny", Layers: 4, Heads: 4, Embd: 128, Vocab: 0, MaxSeq: 256, Steps: 200, LR: 1e-3},
	{Name: "gpt2-124m", Layers: 12, Heads: 12, Embd: 768, Vocab: 50304, MaxSeq: 1024, Steps: 5000, LR: 6e-4},
	{Name: "gpt2-350m", Layers: 24, Heads: 16, Embd: 1024, Vocab: 50304, MaxSeq: 1024, Steps: 5000, LR: 6e-4},
	{Name: "gpt2-774m", Layers: 36, Heads: 20, Embd: 1280, Vocab: 50304, MaxSeq: 1024, Steps: 5000, LR: 6e-4},
	{Name: "gpt2-1.5b", Layers: 48, Heads: 25, Embd: 1600, Vocab: 50304, MaxSeq: 1024, Steps: 5000, LR: 6e-4},
	{Name: "gpt2-1.3b", Layers: 24, Heads: 16, Embd: 2048, Vocab: 50304, MaxSeq: 2048, Steps: 5000, LR: 6e-4},
	{Name: "gpt2-2.7b", Layers: 32, Heads: 32, Embd: 2560, Vocab: 50304, MaxSeq: 2048, Steps: 5000, LR: 6e-4},
	{Name: "gpt2-6.7b", Layers: 32, Heads: 32, Embd: 4096, Vocab: 50304, MaxSeq: 2048, Steps: 5000, LR: 6e-4},
	{Name: "gpt2-13b", Layers: 40, Heads: 40, Embd: 5120, Vocab: 50304, MaxSeq: 2048, Steps: 5000, LR: 6e-4},
	{Name: "gpt2-30b", Layers: 48, Heads: 56, Embd: 7168, Vocab: 50304, MaxSeq: 2048, Steps: 5000, LR: 6e-4},
	{Name: "gpt2-70b", Layers: 80, Heads: 64, Embd: 8192, Vocab: 50304, MaxSeq: 2048, Steps: 5000, LR: 6e-4},
}

// gptFamily is GPT-2 (nanoGPT's GPT): learned position embeddings,
// pre-LN blocks with biases, a GELU MLP and the LM head tied to wte.
type gptFamily struct{}

func (gptFamily) Name() string          { return "gpt" }
func (gptFamily) Input() InputKind      { return InputTokens }
func (gptFamily) Presets() []Preset     { return gptPresets }
func (gptFamily) InPlaceResidual() bool { return true }
func (gptFamily) defaults(c *Config)    {}

func (gptFamily) checkBackend(kernels.Backend) error { return nil }

func (gptFamily) describe(m *Model) string {
	s := m.GPT
	return fmt.Sprintf("%s of width %d, %s, vocabulary %d", plural(s.Layers, "block"), s.Embd, plural(s.Heads, "head"), s.Vocab)
}

func (gptFamily) validate(c *Config, bad func(key, format string, args ...any)) {
	validateTokens(c, bad)
	llamaOnly(c, bad, "a GPT")
	if c.TieEmbeddings != nil && !*c.TieEmbeddings {
		bad("tie_embeddings", "a GPT's LM head is always tied to wte")
	}
}

// llamaOnly reports the Llama shape settings c sets for a model of
// another family (what).
func llamaOnly(c *Config, bad func(key, format string, args ...any), what string) {
	for _, f := range []struct {
		key string
		set bool
	}{{"kv_heads", c.KVHeads != 0}, {"ffn", c.FFN != 0}, {"rope_theta", c.RoPETheta != 0},
		{"rope_scaling", c.RoPEScaling != nil}, {"norm_eps", c.NormEps != 0}} {
		if f.set {
			bad(f.key, "only applies to Llama models, not to %s (model %q)", what, c.Model)
		}
	}
}

func (gptFamily) build(c *Config, s dataset.Schema, dt kernels.DType) (*Model, error) {
	return NewGPT(GPTShape{Layers: c.Layers, Heads: c.Heads, Embd: c.Embd, Vocab: c.Vocab, MaxSeq: c.MaxSeq}, dt)
}

// validateTokens is the config checks of a transformer over tokens.
func validateTokens(c *Config, bad func(key, format string, args ...any)) {
	if c.Heads > 0 && c.Embd > 0 && c.Embd%c.Heads != 0 {
		bad("embd", "%d is not divisible by heads (%d)", c.Embd, c.Heads)
	}
	if c.SeqLen > 0 && c.MaxSeq > 0 && c.SeqLen > c.MaxSeq {
		bad("seq_len", "%d exceeds the model's max_seq %d", c.SeqLen, c.MaxSeq)
	}
	if len(c.Hidden) > 0 {
		bad("hidden", "only applies to model \"mlp\"")
	}
}

// GPTShape is the shape of a GPT (nanoGPT's GPTConfig).
type GPTShape struct {
	Layers, Heads, Embd, Vocab, MaxSeq int
}

// Validate reports what is wrong with the shape.
func (s GPTShape) Validate() error {
	switch {
	case s.Layers <= 0 || s.Heads <= 0 || s.Embd <= 0 || s.Vocab <= 0 || s.MaxSeq <= 0:
		return fmt.Errorf("engine: GPT shape %+v: every dimension must be positive", s)
	case s.Embd%s.Heads != 0:
		return fmt.Errorf("engine: GPT shape: embd %d is not a multiple of heads %d", s.Embd, s.Heads)
	}
	return nil
}

// NewGPT builds the layer list of a GPT in compute dtype dt: layer 0 is the
// embedding (wte, wpe), layers 1..L the transformer blocks, layer L+1 the
// head (final layernorm and the LM head tied to wte, with the loss).
func NewGPT(s GPTShape, dt kernels.DType) (*Model, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	m := &Model{Family: gptFamily{}, DType: dt, GPT: s, Vocab: s.Vocab}
	emb := newEmbedding(s, dt)
	m.Layers = append(m.Layers, emb)
	for i := 0; i < s.Layers; i++ {
		m.Layers = append(m.Layers, newBlock(s, dt, i))
	}
	m.Layers = append(m.Layers, newHead(s, dt, emb.wte))
	return m, nil
}

// embedding is GPT layer 0: out(B,T,C) = wte[tokens] + wpe[t].
type embedding struct {
	s        GPTShape
	dt       kernels.DType
	specs    []ParamSpec
	n        int
	wte, wpe ParamSpec
}

func newEmbedding(s GPTShape, dt kernels.DType) *embedding {
	var b specBuilder
	e := &embedding{s: s, dt: dt}
	e.wte = b.add("transformer.wte.weight", InitNormal, 0.02, s.Vocab, s.Embd)
	e.wpe = b.add("transformer.wpe.weight", InitNormal, 0.02, s.MaxSeq, s.Embd)
	e.specs, e.n = b.specs, b.n
	return e
}

func (e *embedding) Name() string             { return "embedding" }
func (e *embedding) Params() []ParamSpec      { return e.specs }
func (e *embedding) NumParams() int           { return e.n }
func (e *embedding) Tied() []int              { return nil }
func (e *embedding) OutputElems(B, T int) int { return B * T * e.s.Embd }
func (e *embedding) ActivationBytes(B, T int) int64 {
	return align(int64(B*T*e.s.Embd) * int64(e.dt.Size()))
}
func (e *embedding) ScratchBytes(B, T int) int64 { return 0 }

// FwdFLOPs implements FLOPer: a lookup.
func (e *embedding) FwdFLOPs(T int) float64 { return 0 }

func (e *embedding) Forward(q kernels.Queue, p *Pass, i int) {
	w := p.Table.Layers[i].Weights
	p.Ops.EncoderForward(q, p.Out(i), p.Input, param(w, e.wte), param(w, e.wpe), p.B, p.T, e.s.Embd)
}

func (e *embedding) Backward(q kernels.Queue, p *Pass, i int) {
	g := p.Table.Layers[i].Grads
	p.Ops.EncoderBackward(q, param(g, e.wte), param(g, e.wpe), p.DOut, p.Input, p.B, p.T, e.s.Embd)
}

// block is one pre-LN transformer block:
//
//	x2  = x + attn(ln_1(x))
//	out = x2 + mlp(ln_2(x2)),  mlp(h) = c_proj(gelu(c_fc(h)))
type block struct {
	s     GPTShape
	dt    kernels.DType
	name  string
	specs []ParamSpec
	n     int

	ln1w, ln1b, attnW, attnB, projW, projB, ln2w, ln2b, fcW, fcB, fcProjW, fcProjB ParamSpec
	// lean: the block saves neither its layer norms' outputs nor the
	// GELU's; the backward recomputes them (three elementwise passes)
	// from what it keeps. 6C of 16C activation elements per token less,
	// bitwise the same results (see SetLeanActivations).
	lean bool
}

// SetLean implements leanLayer.
func (k *block) SetLean(on bool) { k.lean = on }

func newBlock(s GPTShape, dt kernels.DType, idx int) *block {
	C := s.Embd
	pre := fmt.Sprintf("transformer.h.%d.", idx)
	res := 0.02 / math.Sqrt(2*float64(s.Layers))
	k := &block{s: s, dt: dt, name: fmt.Sprintf("h.%d", idx)}
	var b specBuilder
	k.ln1w = b.add(pre+"ln_1.weight", InitOnes, 0, C)
	k.ln1b = b.add(pre+"ln_1.bias", InitZeros, 0, C)
	k.attnW = b.add(pre+"attn.c_attn.weight", InitNormal, 0.02, 3*C, C)
	k.attnB = b.add(pre+"attn.c_attn.bias", InitZeros, 0, 3*C)
	k.projW = b.add(pre+"attn.c_proj.weight", InitNormal, res, C, C)
	k.projB = b.add(pre+"attn.c_proj.bias", InitZeros, 0, C)
	k.ln2w = b.add(pre+"ln_2.weight", InitOnes, 0, C)
	k.ln2b = b.add(pre+"ln_2.bias", InitZeros, 0, C)
	k.fcW = b.add(pre+"mlp.c_fc.weight", InitNormal, 0.02, 4*C, C)
	k.fcB = b.add(pre+"mlp.c_fc.bias", InitZeros, 0, 4*C)
	k.fcProjW = b.add(pre+"mlp.c_proj.weight", InitNormal, res, C, 4*C)
	k.fcProjB = b.add(pre+"mlp.c_proj.bias", InitZeros, 0, C)
	k.specs, k.n = b.specs, b.n
	return k
}

// blockActs are a block's saved activations (llm.c's per-layer
// activations, without the T×T attention matrix: attention saves lse).
// The output comes first and the attention's output and lse next: that
// start is the block's selective checkpoint (RecomputeSelective).
type blockActs struct {
	out     kernels.Tensor // (BT,C) first: the block's output
	ln1     kernels.Tensor // (BT,C)
	ln1Mean kernels.Tensor // (BT) f32
	ln1Rstd kernels.Tensor // (BT) f32
	qkv     kernels.Tensor // (BT,3C)
	atty    kernels.Tensor // (BT,C)
	lse     kernels.Tensor // (B,NH,T) f32
	res2    kernels.Tensor // (BT,C) residual after attention
	ln2     kernels.Tensor // (BT,C)
	ln2Mean kernels.Tensor // (BT) f32
	ln2Rstd kernels.Tensor // (BT) f32
	fch     kernels.Tensor // (BT,4C)
	fchGelu kernels.Tensor // (BT,4C)
	// save is the size of the selective checkpoint: out, ln_1's
	// statistics, atty and lse.
	save int64
	size int64
}

func (k *block) acts(buf kernels.Buffer, B, T int) blockActs {
	BT, C := B*T, k.s.Embd
	a := scratchAlloc{buf: buf}
	var r blockActs
	r.out = a.take(k.dt, BT*C)
	r.ln1Mean = a.take(kernels.F32, BT)
	r.ln1Rstd = a.take(kernels.F32, BT)
	r.atty = a.take(k.dt, BT*C)
	r.lse = a.take(kernels.F32, B*k.s.Heads*T)
	r.save = a.off
	if !k.lean {
		r.ln1 = a.take(k.dt, BT*C)
	}
	r.qkv = a.take(k.dt, BT*3*C)
	r.res2 = a.take(k.dt, BT*C)
	if !k.lean {
		r.ln2 = a.take(k.dt, BT*C)
	}
	r.ln2Mean = a.take(kernels.F32, BT)
	r.ln2Rstd = a.take(kernels.F32, BT)
	r.fch = a.take(k.dt, BT*4*C)
	if !k.lean {
		r.fchGelu = a.take(k.dt, BT*4*C)
	}
	r.size = a.off
	return r
}

// leanActs fills in the activations a lean block does not save with areas
// of its scratch (the forward's a4 and c1, which its backward reuses only
// after it has recomputed into them).
func (k *block) leanActs(a *blockActs, buf kernels.Buffer, B, T int) {
	if !k.lean {
		return
	}
	a4, _, c1, _, _ := k.scratch(buf, B, T)
	a.ln1, a.ln2, a.fchGelu = c1, c1, a4
}

// blockScratch: two (BT,4C) and two (BT,C) areas.
func (k *block) scratch(buf kernels.Buffer, B, T int) (a4, b4, c1, c2 kernels.Tensor, size int64) {
	BT, C := B*T, k.s.Embd
	a := scratchAlloc{buf: buf}
	a4 = a.take(k.dt, BT*4*C)
	b4 = a.take(k.dt, BT*4*C)
	c1 = a.take(k.dt, BT*C)
	c2 = a.take(k.dt, BT*C)
	return a4, b4, c1, c2, a.off
}

func (k *block) Name() string        { return k.name }
func (k *block) Params() []ParamSpec { return k.specs }
func (k *block) NumParams() int      { return k.n }
func (k *block) Tied() []int         { return nil }

// FwdFLOPs implements FLOPer: two per parameter (the matmuls) and
// attention's 4*T*C (scores and the weighted sum, counted as if not
// causal, as nanoGPT and PaLM count).
func (k *block) FwdFLOPs(T int) float64         { return 2*float64(k.n) + 4*float64(T)*float64(k.s.Embd) }
func (k *block) OutputElems(B, T int) int       { return B * T * k.s.Embd }
func (k *block) ActivationBytes(B, T int) int64 { return k.acts(nil, B, T).size }
func (k *block) ScratchBytes(B, T int) int64 {
	_, _, _, _, n := k.scratch(nil, B, T)
	return n
}

// SelectiveBytes implements SelectiveRecomputer.
func (k *block) SelectiveBytes(B, T int) int64 { return k.acts(nil, B, T).save }

// SelectiveFLOPs implements SelectiveRecomputer: the c_attn, attention
// c_proj and c_fc matmuls, not the attention or the MLP's c_proj.
func (k *block) SelectiveFLOPs(T int) float64 {
	C := float64(k.s.Embd)
	return 2 * (3*C*C + C*C + 4*C*C)
}

// RecomputeSelective implements SelectiveRecomputer: with the selective
// checkpoint in place, the rest of what Forward saves (qkv, res2, ln_2's
// statistics, fch and, not lean, the layer norms' and GELU's outputs) by
// Forward's kernels on the same inputs: the same bits. It neither runs
// the attention nor writes the output.
func (k *block) RecomputeSelective(q kernels.Queue, p *Pass, i int) { k.forward(q, p, i, true) }

func (k *block) Forward(q kernels.Queue, p *Pass, i int) { k.forward(q, p, i, false) }

// forward is Forward, or with selective the part of it that
// RecomputeSelective reruns.
func (k *block) forward(q kernels.Queue, p *Pass, i int, selective bool) {
	o, w := p.Ops, p.Table.Layers[i].Weights
	B, T, C, NH := p.B, p.T, k.s.Embd, k.s.Heads
	BT := B * T
	a := k.acts(p.Table.Layers[i].Acts, B, T)
	k.leanActs(&a, p.Scratch, B, T)
	x := p.In(i)

	o.LayerNormForward(q, a.ln1, a.ln1Mean, a.ln1Rstd, x, param(w, k.ln1w), param(w, k.ln1b), BT, C)
	o.MatmulForward(q, a.qkv, a.ln1, param(w, k.attnW), param(w, k.attnB), BT, C, 3*C)
	if !selective {
		o.AttentionForward(q, a.atty, a.lse, a.qkv, B, T, C, NH)
	}
	// The projections write straight into the residual stream and add
	// their input: in the GEMM's epilogue where the backend can (rounded
	// once), else a GEMM and an add in place (x + proj rounds as proj + x).
	kernels.MatmulForwardResidual(o, q, a.res2, a.atty, param(w, k.projW), param(w, k.projB), x, BT, C, C)

	o.LayerNormForward(q, a.ln2, a.ln2Mean, a.ln2Rstd, a.res2, param(w, k.ln2w), param(w, k.ln2b), BT, C)
	if gm, ok := o.(kernels.GeluMatmuler); ok {
		gm.MatmulGeluForward(q, a.fchGelu, a.fch, a.ln2, param(w, k.fcW), param(w, k.fcB), BT, C, 4*C)
	} else {
		o.MatmulForward(q, a.fch, a.ln2, param(w, k.fcW), param(w, k.fcB), BT, C, 4*C)
		o.GeluForward(q, a.fchGelu, a.fch, BT*4*C)
	}
	if !selective {
		kernels.MatmulForwardResidual(o, q, a.out, a.fchGelu, param(w, k.fcProjW), param(w, k.fcProjB), a.res2, BT, 4*C, C)
	}
}

func (k *block) Backward(q kernels.Queue, p *Pass, i int) {
	o := p.Ops
	st := p.Table.Layers[i]
	w, g := st.Weights, st.Grads
	B, T, C, NH := p.B, p.T, k.s.Embd, k.s.Heads
	BT := B * T
	a := k.acts(st.Acts, B, T)
	s4a, s4b, s1a, s1b, _ := k.scratch(p.Scratch, B, T)
	x := p.In(i)
	dx := p.DIn // accumulates d(res2), then d(x)

	// MLP branch: out = res2 + c_proj(gelu(c_fc(ln_2(res2)))). The residual
	// passes d(out) through unchanged; when the engine hands the block the
	// same buffer as DOut and DIn (one residual gradient stream updated in
	// place) it is already there, else it is copied.
	if !sameView(dx, p.DOut) {
		o.CopyDevice(q, dx, p.DOut)
	}
	// The scratch gradients are written, not accumulated (the *Set forms:
	// Zero and the op where the backend has no overwriting form). A lean
	// block first recomputes what it did not save, with the forward's
	// kernels on the same inputs: the same bits.
	dGelu := s4a.Slice(0, BT*4*C)
	fchGelu := a.fchGelu
	if k.lean {
		fchGelu = s4b.Slice(0, BT*4*C)
		o.GeluForward(q, fchGelu, a.fch, BT*4*C)
	}
	var dfch kernels.Tensor
	if gm, ok := o.(kernels.GeluMatmuler); ok {
		// The GELU's backward fused into the projection's: d(fch) straight
		// into s4a (s4b may hold the recomputed GELU, its input).
		dfch = dGelu
		gm.MatmulBackwardGeluSet(q, dfch, param(g, k.fcProjW), param(g, k.fcProjB), p.DOut, fchGelu, param(w, k.fcProjW), a.fch, BT, 4*C, C)
	} else {
		kernels.MatmulBackwardSet(o, q, dGelu, param(g, k.fcProjW), param(g, k.fcProjB), p.DOut, fchGelu, param(w, k.fcProjW), BT, 4*C, C)
		dfch = s4b.Slice(0, BT*4*C)
		kernels.GeluBackwardSet(o, q, dfch, a.fch, dGelu, BT*4*C)
	}
	ln2 := a.ln2
	if k.lean {
		ln2 = s1b // free until datty
		o.LayerNormForward(q, ln2, a.ln2Mean, a.ln2Rstd, a.res2, param(w, k.ln2w), param(w, k.ln2b), BT, C)
	}
	dln2 := s1a
	kernels.MatmulBackwardSet(o, q, dln2, param(g, k.fcW), param(g, k.fcB), dfch, ln2, param(w, k.fcW), BT, C, 4*C)
	o.LayerNormBackward(q, dx, param(g, k.ln2w), param(g, k.ln2b), dln2, a.res2, param(w, k.ln2w), a.ln2Mean, a.ln2Rstd, BT, C)

	// Attention branch: res2 = x + c_proj(attn(c_attn(ln_1(x)))); dx now
	// holds d(res2), which is also d(c_proj output).
	datty := s1b
	kernels.MatmulBackwardSet(o, q, datty, param(g, k.projW), param(g, k.projB), dx, a.atty, param(w, k.projW), BT, C, C)
	dqkv := s4a.Slice(0, BT*3*C)
	kernels.AttentionBackwardSet(o, q, dqkv, datty, a.qkv, a.atty, a.lse, B, T, C, NH)
	ln1 := a.ln1
	if k.lean {
		ln1 = s4b.Slice(0, BT*C) // dfch (or the recomputed GELU) is spent
		o.LayerNormForward(q, ln1, a.ln1Mean, a.ln1Rstd, x, param(w, k.ln1w), param(w, k.ln1b), BT, C)
	}
	dln1 := s1a
	kernels.MatmulBackwardSet(o, q, dln1, param(g, k.attnW), param(g, k.attnB), dqkv, ln1, param(w, k.attnW), BT, C, 3*C)
	o.LayerNormBackward(q, dx, param(g, k.ln1w), param(g, k.ln1b), dln1, x, param(w, k.ln1w), a.ln1Mean, a.ln1Rstd, BT, C)
}

// sameView reports whether a and b are the same elements of the same buffer.
func sameView(a, b kernels.Tensor) bool {
	return a.Buf == b.Buf && a.Off == b.Off && a.DType == b.DType && a.N == b.N
}

// head is the last GPT layer: ln_f, logits = ln_f(x)·wteᵀ (tied to the
// embedding's wte, layer 0) and the cross-entropy losses.
type head struct {
	s     GPTShape
	dt    kernels.DType
	specs []ParamSpec
	n     int
	lnw   ParamSpec
	lnb   ParamSpec
	wte   ParamSpec // in layer 0's block
}

func newHead(s GPTShape, dt kernels.DType, wte ParamSpec) *head {
	var b specBuilder
	h := &head{s: s, dt: dt, wte: wte}
	h.lnw = b.add("transformer.ln_f.weight", InitOnes, 0, s.Embd)
	h.lnb = b.add("transformer.ln_f.bias", InitZeros, 0, s.Embd)
	h.specs, h.n = b.specs, b.n
	return h
}

type headActs struct {
	lnf, mean, rstd, logits kernels.Tensor
	size                    int64
}

func (h *head) acts(buf kernels.Buffer, B, T int) headActs {
	BT := B * T
	a := scratchAlloc{buf: buf}
	var r headActs
	r.lnf = a.take(h.dt, BT*h.s.Embd)
	r.mean = a.take(kernels.F32, BT)
	r.rstd = a.take(kernels.F32, BT)
	r.logits = a.take(h.dt, BT*h.s.Vocab)
	r.size = a.off
	return r
}

func (h *head) scratch(buf kernels.Buffer, B, T int) (dlogits, dlnf kernels.Tensor, size int64) {
	return headScratch(buf, h.dt, B*T, h.s.Vocab, h.s.Embd)
}

// headScratch lays out an LM head's backward scratch (GPT and Llama):
// the gradients of the BT×V logits and of the BT×C normalised input.
func headScratch(buf kernels.Buffer, dt kernels.DType, BT, V, C int) (dlogits, dlnf kernels.Tensor, size int64) {
	a := scratchAlloc{buf: buf}
	dlogits = a.take(dt, BT*V)
	dlnf = a.take(dt, BT*C)
	return dlogits, dlnf, a.off
}

func (h *head) Name() string        { return "head" }
func (h *head) Params() []ParamSpec { return h.specs }
func (h *head) NumParams() int      { return h.n }
func (h *head) Tied() []int         { return []int{0} }

// FwdFLOPs implements FLOPer: the logits through the tied embedding.
func (h *head) FwdFLOPs(T int) float64         { return 2 * float64(h.s.Vocab) * float64(h.s.Embd) }
func (h *head) OutputElems(B, T int) int       { return 0 }
func (h *head) ActivationBytes(B, T int) int64 { return h.acts(nil, B, T).size }
func (h *head) ScratchBytes(B, T int) int64 {
	_, _, n := h.scratch(nil, B, T)
	return n
}

func (h *head) Forward(q kernels.Queue, p *Pass, i int) {
	o, w := p.Ops, p.Table.Layers[i].Weights
	BT, C, V := p.B*p.T, h.s.Embd, h.s.Vocab
	a := h.acts(p.Table.Layers[i].Acts, p.B, p.T)
	o.LayerNormForward(q, a.lnf, a.mean, a.rstd, p.In(i), param(w, h.lnw), param(w, h.lnb), BT, C)
	o.MatmulForward(q, a.logits, a.lnf, param(p.Table.Layers[0].Weights, h.wte), kernels.Tensor{}, BT, C, V)
	o.CrossEntropyForward(q, p.Losses, a.logits, p.Targets, BT, V)
}

func (h *head) Backward(q kernels.Queue, p *Pass, i int) {
	o := p.Ops
	st := p.Table.Layers[i]
	BT, C, V := p.B*p.T, h.s.Embd, h.s.Vocab
	a := h.acts(st.Acts, p.B, p.T)
	dlogits, dlnf, _ := h.scratch(p.Scratch, p.B, p.T)
	kernels.CrossEntropyBackwardSet(o, q, dlogits, a.logits, p.Targets, BT, V, p.LossGrad)
	emb := p.Table.Layers[0]
	kernels.MatmulBackwardSet(o, q, dlnf, param(st.TiedGrads[0], h.wte), kernels.Tensor{}, dlogits, a.lnf, param(emb.Weights, h.wte), BT, C, V)
	o.Zero(q, p.DIn)
	o.LayerNormBackward(q, p.DIn, param(st.Grads, h.lnw), param(st.Grads, h.lnb), dlnf, p.In(i), param(st.Weights, h.lnw), a.mean, a.rstd, BT, C)
}
