package engine

import "sort"

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

// presets lists the built-in model shapes by name: the one table that
// spill train, spill plan and the planner use. "mlp" is not a GPT preset:
// its shape comes from Config.Hidden and the dataset.
var presets = map[string]Preset{
	"tiny":      {Name: "tiny", Layers: 4, Heads: 4, Embd: 128, Vocab: 0, MaxSeq: 256},
	"gpt2-124m": {Name: "gpt2-124m", Layers: 12, Heads: 12, Embd: 768, Vocab: 50304, MaxSeq: 1024},
	"gpt2-350m": {Name: "gpt2-350m", Layers: 24, Heads: 16, Embd: 1024, Vocab: 50304, MaxSeq: 1024},
	"gpt2-774m": {Name: "gpt2-774m", Layers: 36, Heads: 20, Embd: 1280, Vocab: 50304, MaxSeq: 1024},
	"gpt2-1.5b": {Name: "gpt2-1.5b", Layers: 48, Heads: 25, Embd: 1600, Vocab: 50304, MaxSeq: 1024},
	"gpt2-1.3b": {Name: "gpt2-1.3b", Layers: 24, Heads: 16, Embd: 2048, Vocab: 50304, MaxSeq: 2048},
	"gpt2-2.7b": {Name: "gpt2-2.7b", Layers: 32, Heads: 32, Embd: 2560, Vocab: 50304, MaxSeq: 2048},
	"gpt2-6.7b": {Name: "gpt2-6.7b", Layers: 32, Heads: 32, Embd: 4096, Vocab: 50304, MaxSeq: 2048},
	"gpt2-13b":  {Name: "gpt2-13b", Layers: 40, Heads: 40, Embd: 5120, Vocab: 50304, MaxSeq: 2048},
	"gpt2-30b":  {Name: "gpt2-30b", Layers: 48, Heads: 56, Embd: 7168, Vocab: 50304, MaxSeq: 2048},
	"gpt2-70b":  {Name: "gpt2-70b", Layers: 80, Heads: 64, Embd: 8192, Vocab: 50304, MaxSeq: 2048},
}

// aliases are other names of presets: Hugging Face's GPT-2 names.
var aliases = map[string]string{
	"gpt2":        "gpt2-124m",
	"gpt2-medium": "gpt2-350m",
	"gpt2-large":  "gpt2-774m",
	"gpt2-xl":     "gpt2-1.5b",
}

// TinyVocab is the vocabulary of the tiny preset when the dataset schema
// does not state one: the byte-level tokenizer's 257 ids.
const TinyVocab = 257

// LookupPreset returns the GPT preset called name or one of its aliases
// ("gpt2" is gpt2-124m, ...).
func LookupPreset(name string) (Preset, bool) {
	p, ok := presets[CanonicalModel(name)]
	return p, ok
}

// CanonicalModel is the engine's name for a model name: the preset's own
// name for an alias of it, name otherwise.
func CanonicalModel(name string) string {
	if a, ok := aliases[name]; ok {
		return a
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
