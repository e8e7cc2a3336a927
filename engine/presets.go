package engine

// Each family's presets are in its file (gptPresets in gpt.go, llamaPresets
// in llama.go, the MLP's in mlp.go) and are looked up through the registry
// (family.go: LookupPreset, FamilyOf, PresetNames).

// aliases are other names of presets: Hugging Face's GPT-2 names.
var aliases = map[string]string{
	"gpt2":        "gpt2-124m",
	"gpt2-medium": "gpt2-350m",
	"gpt2-large":  "gpt2-774m",
	"gpt2-xl":     "gpt2-1.5b",
}

// TinyVocab is the vocabulary of the tiny presets when the dataset schema
// does not state one: the byte-level tokenizer's 257 ids.
const TinyVocab = 257

// GPTParams is the number of parameters of a GPT of the given shape (the
// tied LM head counted once).
func GPTParams(layers, embd, vocab, maxSeq int) int64 {
	C := int64(embd)
	block := 2*C + 3*C*C + 3*C + C*C + C + 2*C + 4*C*C + 4*C + 4*C*C + C
	return int64(vocab)*C + int64(maxSeq)*C + int64(layers)*block + 2*C
}
