package engine

import (
	"regexp"
	"strings"
)

// The GPT family's checkpoints: Hugging Face's GPT2LMHeadModel and
// nanoGPT's GPT. Both use spill's parameter names (transformer.wte.weight,
// transformer.h.{i}.attn.c_attn.weight, ...); they differ in the layout of
// the four matrices of each block. nanoGPT's are nn.Linear weights,
// (out, in) as spill stores them; GPT-2's are Conv1D weights, (in, out):
//
//	attn.c_attn.weight (C, 3C)   attn.c_proj.weight (C, C)
//	mlp.c_fc.weight    (C, 4C)   mlp.c_proj.weight  (4C, C)
//
// A checkpoint with a config.json is Hugging Face's. One without is read
// in the layout its shapes match: c_attn.weight (3C, C) is nanoGPT's,
// (C, 3C) GPT-2's (only the square c_proj could be either, and the layout
// is chosen for the whole file, never per tensor).

func (gptFamily) hfArchitecture() (string, string) { return "GPT2LMHeadModel", "gpt2" }

// gptBuffer matches the causal-mask buffers older transformers and
// nanoGPT without flash attention saved.
var gptBuffer = regexp.MustCompile(`^(transformer\.)?h\.\d+\.attn\.(bias|masked_bias)$`)

func (gptFamily) layouts(m *Model) []extLayout {
	// GPT-2 saved from GPT2Model (as openai-community/gpt2 on the Hub)
	// has no "transformer." prefix.
	unprefixed := func(n string) (string, []string) {
		if s, ok := strings.CutPrefix(n, "transformer."); ok {
			return n, []string{s}
		}
		return n, nil
	}
	linear := func(ps ParamSpec) bool { return blockParam.MatchString(ps.Name) }
	hf := paramLayout(m, FormatHF, unprefixed, linear)
	nano := paramLayout(m, FormatNanoGPT, nil, nil)
	for _, l := range []*extLayout{&hf, &nano} {
		l.Tied["lm_head.weight"] = "transformer.wte.weight"
		l.Buffer = gptBuffer.MatchString
	}
	return []extLayout{hf, nano}
}

func (gptFamily) hfSettings(j *hfConfigJSON) []hfSetting {
	var out []hfSetting
	add := func(key string, names ...string) int {
		v, f := j.positiveInt(names...)
		out = append(out, hfSetting{field: f, key: key, value: v})
		return v
	}
	add("layers", "n_layer")
	add("heads", "n_head")
	C := add("embd", "n_embd")
	add("vocab", "vocab_size")
	add("max_seq", "n_positions", "n_ctx")
	// What spill's GPT implements: tanh GELU, layernorm eps 1e-5, a 4C
	// MLP, 1/sqrt(hs) attention, a tied head, no cross-attention.
	j.want("activation_function", "gelu_new", "gelu_new", "gelu_pytorch_tanh")
	if eps := j.floatOr("layer_norm_epsilon", 1e-5); eps != 1e-5 {
		j.fail("layer_norm_epsilon", "%v is not supported by spill (its layernorm uses 1e-5)", eps)
	}
	if inner := j.intOr("n_inner", 0); inner != 0 && inner != 4*C {
		j.fail("n_inner", "%d is not supported by spill (the MLP is 4 x n_embd = %d wide)", inner, 4*C)
	}
	j.want("scale_attn_weights", true, true)
	j.want("scale_attn_by_inverse_layer_idx", false, false)
	j.want("add_cross_attention", false, false)
	j.want("tie_word_embeddings", true, true)
	return out
}

func (gptFamily) hfConfig(m *Model) map[string]any {
	s := m.GPT
	return map[string]any{
		"architectures":                   []string{"GPT2LMHeadModel"},
		"model_type":                      "gpt2",
		"n_layer":                         s.Layers,
		"n_head":                          s.Heads,
		"n_embd":                          s.Embd,
		"vocab_size":                      s.Vocab,
		"n_positions":                     s.MaxSeq,
		"n_ctx":                           s.MaxSeq,
		"n_inner":                         nil,
		"activation_function":             "gelu_new",
		"layer_norm_epsilon":              1e-5,
		"initializer_range":               0.02,
		"scale_attn_weights":              true,
		"scale_attn_by_inverse_layer_idx": false,
		"reorder_and_upcast_attn":         false,
		"tie_word_embeddings":             true,
		// spill trains without dropout; so does the exported model.
		"resid_pdrop": 0.0,
		"embd_pdrop":  0.0,
		"attn_pdrop":  0.0,
		"use_cache":   true,
		"torch_dtype": "float32",
	}
}
