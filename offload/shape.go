package offload

import (
	"fmt"
	"sort"
)

// Precision is the training precision.
type Precision string

// Precisions. Mixed precisions keep an fp32 master copy of the weights.
const (
	BF16 Precision = "bf16" // bf16 compute, fp32 master weights and Adam state
	FP16 Precision = "fp16" // fp16 compute with loss scaling, like bf16 otherwise
	FP32 Precision = "fp32" // fp32 throughout: the weights are the master
)

// ParsePrecision parses "bf16", "fp16" or "fp32".
func ParsePrecision(s string) (Precision, error) {
	switch Precision(s) {
	case BF16, FP16, FP32:
		return Precision(s), nil
	}
	return "", fmt.Errorf("offload: unknown precision %q (want bf16, fp16 or fp32)", s)
}

// elem is the size of one element in the compute dtype.
func (p Precision) elem() int64 {
	if p == FP32 {
		return 4
	}
	return 2
}

func (p Precision) mixed() bool { return p != FP32 }

// LayerShape is what the planner needs to know of one layer.
type LayerShape struct {
	Name string
	// Params is the number of parameters the layer owns.
	Params int64
	// ActElems and ActF32 are the activations the layer saves for the
	// backward pass, per token: elements in the compute dtype and fp32
	// elements (normalisation statistics, log-sum-exp).
	ActElems, ActF32 int64
	// CkptElems is what must be kept per token to recompute the layer
	// instead (its input), in the compute dtype.
	CkptElems int64
	// FwdFLOPs is the forward pass's floating-point operations per token;
	// backward is taken as twice that.
	FwdFLOPs float64
	// Recomputable is whether the activation policy may offload or
	// recompute this layer (transformer blocks); others keep theirs.
	Recomputable bool
	// ActBytes, CkptBytes and ScratchBytes, when not zero, are the exact
	// bytes per sequence of the layer's saved activations, of what
	// recomputation keeps of it (its output) and of the scratch space its
	// forward and backward need, as a trainer allocates them (engine's
	// PlanShape fills them from its layers). They replace the per-token
	// estimates above (rounded up to whole bytes per token).
	ActBytes, CkptBytes, ScratchBytes int64
}

// ModelShape is a model as the planner sees it.
type ModelShape struct {
	Name   string
	Layers []LayerShape
	SeqLen int // tokens per sequence
	// WorkElems is per-token scratch beyond the layers' activations (the
	// residual stream and its gradient), in the compute dtype.
	WorkElems int64
}

// Params is the total parameter count.
func (m ModelShape) Params() int64 {
	var n int64
	for _, l := range m.Layers {
		n += l.Params
	}
	return n
}

// GPT returns the shape of a GPT-2 style model (llm.c's layout): L blocks
// of width C with NH heads, vocabulary V, sequence length T, the
// embedding tied to the output head. Layer 0 is the embedding, layers
// 1..L the blocks, layer L+1 the final norm and the logits.
func GPT(name string, L, C, NH, V, T int) (ModelShape, error) {
	if L <= 0 || C <= 0 || NH <= 0 || V <= 0 || T <= 0 || C%NH != 0 {
		return ModelShape{}, fmt.Errorf("offload: bad GPT shape layers=%d embd=%d heads=%d vocab=%d seq=%d (all positive, embd divisible by heads)", L, C, NH, V, T)
	}
	c, v, t := int64(C), int64(V), int64(T)
	m := ModelShape{Name: name, SeqLen: T, WorkElems: 4 * c}
	m.Layers = append(m.Layers, LayerShape{Name: "embed", Params: v*c + t*c, ActElems: c, CkptElems: c})
	for i := 1; i <= L; i++ {
		m.Layers = append(m.Layers, LayerShape{
			Name:   fmt.Sprintf("block %d", i),
			Params: 12*c*c + 13*c,
			// ln1, qkv, attention out, residual2, ln2, fc, gelu, residual3
			ActElems:     16 * c,
			ActF32:       4 + int64(NH),
			CkptElems:    c,
			FwdFLOPs:     2*12*float64(c*c) + 4*float64(t*c),
			Recomputable: true,
		})
	}
	// The head: final layernorm and logits through the tied embedding.
	m.Layers = append(m.Layers, LayerShape{Name: "head", Params: 2 * c, ActElems: c + v, ActF32: 3,
		CkptElems: c, FwdFLOPs: 2 * float64(v*c)})
	return m, nil
}

// GPTDims are the dimensions of a named GPT shape.
type GPTDims struct{ Layers, Embd, Heads, Vocab, SeqLen int }

// Shapes is a small table of GPT-2 style shapes by name, from GPT-2 small
// to 70B-class (GPT-3 paper widths above 1.5B). Vocab is GPT-2's 50257
// padded to 50304, as llm.c does.
var Shapes = map[string]GPTDims{
	"gpt2":        {12, 768, 12, 50304, 1024},
	"gpt2-medium": {24, 1024, 16, 50304, 1024},
	"gpt2-large":  {36, 1280, 20, 50304, 1024},
	"gpt2-xl":     {48, 1600, 25, 50304, 1024},
	"gpt2-1.3b":   {24, 2048, 16, 50304, 1024},
	"gpt2-2.7b":   {32, 2560, 32, 50304, 1024},
	"gpt2-6.7b":   {32, 4096, 32, 50304, 1024},
	"gpt2-13b":    {40, 5120, 40, 50304, 1024},
	"gpt2-30b":    {48, 7168, 56, 50304, 1024},
	"gpt2-70b":    {80, 8192, 64, 50304, 1024},
}

// ModelAliases maps the engine's preset names (spill train --model) to the
// names of the same shapes in Shapes, so that spill plan and spill train
// accept both spellings. Names that are the same in both (gpt2-1.3b, ...)
// need no entry.
var ModelAliases = map[string]string{
	"gpt2-124m": "gpt2",
	"gpt2-350m": "gpt2-medium",
	"gpt2-774m": "gpt2-large",
	"gpt2-1.5b": "gpt2-xl",
}

// LookupShape returns the dimensions of a named shape, accepting the
// aliases of ModelAliases; name is the table's name for it.
func LookupShape(s string) (d GPTDims, name string, ok bool) {
	if a, isAlias := ModelAliases[s]; isAlias {
		s = a
	}
	d, ok = Shapes[s]
	return d, s, ok
}

// ShapeNames lists the names of Shapes, sorted by size.
func ShapeNames() []string {
	names := make([]string, 0, len(Shapes))
	for n := range Shapes {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool {
		a, b := Shapes[names[i]], Shapes[names[j]]
		return a.Layers*a.Embd*a.Embd < b.Layers*b.Embd*b.Embd
	})
	return names
}

// NamedGPT returns the shape of a named model with sequence length T (0
// for the table's).
func NamedGPT(name string, T int) (ModelShape, error) {
	d, name, ok := LookupShape(name)
	if !ok {
		return ModelShape{}, fmt.Errorf("offload: unknown model %q (known: %v)", name, ShapeNames())
	}
	if T == 0 {
		T = d.SeqLen
	}
	return GPT(name, d.Layers, d.Embd, d.Heads, d.Vocab, T)
}
