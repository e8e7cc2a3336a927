package engine

import (
	"fmt"
	"sort"

	"github.com/spill-ml/spill/dataset"
	"github.com/spill-ml/spill/kernels"
)

// InputKind is what the first layer of a model reads and what the last
// layer's targets are.
type InputKind uint8

const (
	// InputTokens: token ids (B·T, I32) and next-token targets (B·T,
	// I32), from a tokens dataset.
	InputTokens InputKind = iota
	// InputFeatures: one record per row (T = 1) of features (B·F, compute
	// dtype) and a label (B, I32 or F32), from a records dataset.
	InputFeatures
)

// Family is a model architecture: GPT-2 (gpt.go), Llama (llama.go) and
// the MLP (mlp.go). A family owns its presets (one table, looked up through
// the registry by LookupPreset), builds its layers (whose names are the
// tensor names of its checkpoints and whose FwdFLOPs, see FLOPer, give the
// model FLOPs), and says what its input is. Nothing outside the family's
// file switches on which family a model is; code that differs by input
// asks Input.
//
// The config hooks are unexported: families live in package engine.
type Family interface {
	// Name is the family's name ("gpt", "llama", "mlp").
	Name() string
	// Input is what the model reads.
	Input() InputKind
	// Presets lists the family's named shapes.
	Presets() []Preset
	// InPlaceResidual reports whether the family's layers accept the
	// same buffer as Pass.DOut and Pass.DIn (a residual stream whose
	// gradient a block updates in place), so that the resident trainer
	// needs one activation-gradient buffer instead of two.
	InPlaceResidual() bool

	// defaults fills the family's zero Config fields beyond the preset's
	// shape (EnsureDefaults has applied the preset).
	defaults(c *Config)
	// validate reports the family's problems with c through bad.
	validate(c *Config, bad func(key, format string, args ...any))
	// build builds the model c describes over data of schema s (after
	// the dataset-derived fields have been filled) in compute dtype dt.
	build(c *Config, s dataset.Schema, dt kernels.DType) (*Model, error)
	// checkBackend reports why be cannot run the family's layers (nil
	// if it can).
	checkBackend(be kernels.Backend) error
	// describe is m's shape for the log ("4 blocks of width 128, ...").
	describe(m *Model) string

	// hfArchitecture is the transformers class and model_type of the
	// family's models ("GPT2LMHeadModel", "gpt2"); "" for a family that
	// has none (it cannot load a config.json or export to --format hf).
	hfArchitecture() (arch, modelType string)
	// hfSettings maps a config.json of the family to spill's shape
	// settings, recording in j every field it cannot take (a value
	// spill does not implement, a missing field).
	hfSettings(j *hfConfigJSON) []hfSetting
	// hfConfig is the config.json of m, for transformers'
	// from_pretrained (nil for a family without an architecture).
	hfConfig(m *Model) map[string]any
	// layouts lists the checkpoint layouts of m's parameters that the
	// family reads, Hugging Face's first (the one --format hf writes,
	// when the family has an architecture).
	layouts(m *Model) []extLayout
}

// plural is "1 block", "4 blocks".
func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// CheckBackend reports whether be can run m's layers: a Llama needs a
// backend with kernels.LlamaOps. NewTrainer and Run check it before they
// allocate anything.
func CheckBackend(be kernels.Backend, m *Model) error { return m.Family.checkBackend(be) }

// families is the registry, in the order PresetNames lists them.
var families = []Family{gptFamily{}, llamaFamily{}, mlpFamily{}}

// presetIndex maps every preset name to its preset and family.
var presetIndex = func() map[string]presetEntry {
	idx := map[string]presetEntry{}
	for _, f := range families {
		for _, p := range f.Presets() {
			if _, dup := idx[p.Name]; dup {
				panic(fmt.Sprintf("engine: preset %q is defined twice", p.Name))
			}
			idx[p.Name] = presetEntry{p, f}
		}
	}
	return idx
}()

type presetEntry struct {
	p Preset
	f Family
}

// Families lists the registered model families.
func Families() []Family { return append([]Family(nil), families...) }

// FamilyOf is the family of the model called name (a preset or an alias
// of one). A name that is no preset is a GPT of the shape the config
// states (Layers, Heads, ...): spill plan and the tests use such shapes.
func FamilyOf(name string) Family {
	if e, ok := presetIndex[CanonicalModel(name)]; ok {
		return e.f
	}
	return gptFamily{}
}

// Preset is a named model shape of a family. The GPT fields (Layers,
// Heads, Embd, Vocab, MaxSeq) are those Config can override; the Llama
// fields are the preset's alone. A family without a fixed shape (the MLP)
// leaves them zero.
type Preset struct {
	Name   string
	Layers int // transformer blocks
	Heads  int // attention heads; Embd must divide by it
	Embd   int // channels (C)
	Vocab  int // 0: take the vocabulary from the dataset schema
	MaxSeq int // longest sequence (rows of wpe; max_position_embeddings)

	// Llama only.
	KVHeads int                // key/value heads (num_key_value_heads); divides Heads
	FFN     int                // intermediate_size of the SwiGLU MLP
	RoPE    kernels.RoPEConfig // rope_theta and rope_scaling
	NormEps float64            // rms_norm_eps
	Tied    bool               // tie_word_embeddings

	// Training defaults: the steps and peak learning rate of a run that
	// does not set them.
	Steps int
	LR    float64
}

// LookupPreset returns the preset called name or one of its aliases
// ("gpt2" is gpt2-124m, ...), of any family.
func LookupPreset(name string) (Preset, bool) {
	e, ok := presetIndex[CanonicalModel(name)]
	return e.p, ok
}

// CanonicalModel is the engine's name for a model name: the preset's own
// name for an alias of it, name otherwise.
func CanonicalModel(name string) string {
	if a, ok := aliases[name]; ok {
		return a
	}
	return name
}

// PresetNames lists the presets, family by family in registry order, each
// family's sorted ("mlp" last).
func PresetNames() []string {
	var names []string
	for _, f := range families {
		var fn []string
		for _, p := range f.Presets() {
			fn = append(fn, p.Name)
		}
		sort.Strings(fn)
		names = append(names, fn...)
	}
	return names
}
