package engine

import (
	"sort"

	"github.com/spill-ml/spill/offload"
)

// Preset is a named GPT shape. The GPT-2 shapes (gpt2-124m, -350m, -774m)
// use a 1024-token context; the GPT-3 shapes (gpt2-1.3b, -2.7b, -6.7b) a
// 2048-token one. Every non-tiny preset pads the GPT-2 vocabulary (50257) to
// 50304, a multiple of 128, as llm.c and nanoGPT do.
type Preset struct {
	Name   string
	Layers int // transformer blocks
	Heads  int // attention heads; Embd must divide by it
	Embd   int // channels (C)
	Vocab  int // 0: take the vocabulary from the dataset schema
	MaxSeq int // longest sequence (rows of wpe)
}

// presets lists the built-in model shapes by name. "mlp" is not a GPT
// preset: its shape comes from Config.Hidden and the dataset.
var presets = map[string]Preset{
	"tiny":      {Name: "tiny", Layers: 4, Heads: 4, Embd: 128, Vocab: 0, MaxSeq: 256},
	"gpt2-124m": {Name: "gpt2-124m", Layers: 12, Heads: 12, Embd: 768, Vocab: 50304, MaxSeq: 1024},
	"gpt2-350m": {Name: "gpt2-350m", Layers: 24, Heads: 16, Embd: 1024, Vocab: 50304, MaxSeq: 1024},
	"gpt2-774m": {Name: "gpt2-774m", Layers: 36, Heads: 20, Embd: 1280, Vocab: 50304, MaxSeq: 1024},
	"gpt2-1.3b": {Name: "gpt2-1.3b", Layers: 24, Heads: 16, Embd: 2048, Vocab: 50304, MaxSeq: 2048},
	"gpt2-2.7b": {Name: "gpt2-2.7b", Layers: 32, Heads: 32, Embd: 2560, Vocab: 50304, MaxSeq: 2048},
	"gpt2-6.7b": {Name: "gpt2-6.7b", Layers: 32, Heads: 32, Embd: 4096, Vocab: 50304, MaxSeq: 2048},
}

// TinyVocab is the vocabulary of the tiny preset when the dataset schema
// does not state one: the byte-level tokenizer's 257 ids.
const TinyVocab = 257

// LookupPreset returns the GPT preset called name. The planner's shape
// names are accepted too (offload.Shapes: "gpt2" is gpt2-124m, ...; shapes
// with no preset of their own, such as gpt2-xl or gpt2-13b, become presets
// with the table's dimensions), so that spill plan and spill train take the
// same names.
func LookupPreset(name string) (Preset, bool) {
	name = CanonicalModel(name)
	if p, ok := presets[name]; ok {
		return p, ok
	}
	if d, ok := offload.Shapes[name]; ok {
		return Preset{Name: name, Layers: d.Layers, Heads: d.Heads, Embd: d.Embd, Vocab: d.Vocab, MaxSeq: d.SeqLen}, true
	}
	return Preset{}, false
}

// CanonicalModel is the engine's name for a model name: a preset's own
// name for an alias of it in offload.ModelAliases, name otherwise.
func CanonicalModel(name string) string {
	if _, ok := presets[name]; ok {
		return name
	}
	for alias, shape := range offload.ModelAliases {
		if shape == name {
			if _, ok := presets[alias]; ok {
				return alias
			}
		}
	}
	return name
}

// PresetNames lists the GPT presets, sorted, followed by "mlp".
func PresetNames() []string {
	names := make([]string, 0, len(presets)+1)
	for n := range presets {
		names = append(names, n)
	}
	sort.Strings(names)
	return append(names, "mlp")
}

// GPTParams is the number of parameters of a GPT of the given shape (the
// tied LM head counted once).
func GPTParams(layers, embd, vocab, maxSeq int) int64 {
	C := int64(embd)
	block := 2*C + 3*C*C + 3*C + C*C + C + 2*C + 4*C*C + 4*C + 4*C*C + C
	return int64(vocab)*C + int64(maxSeq)*C + int64(layers)*block + 2*C
}
