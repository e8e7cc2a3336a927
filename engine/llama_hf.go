package engine

import (
	"encoding/json"
	"regexp"
)

// The Llama family's checkpoints are transformers' LlamaForCausalLM
// state_dict, whose names and layouts spill's parameters already have
// (model.embed_tokens.weight, model.layers.{i}.self_attn.q_proj.weight,
// ..., model.norm.weight, lm_head.weight). transformers' q_proj and k_proj
// rows are in the order of its rotate_half rotary embedding (element i of
// a head paired with i+hs/2; Meta's original checkpoints pair 2i with
// 2i+1 and convert_llama_weights_to_hf permutes them), which is the
// convention of spill's RoPE kernels (kernels.LlamaOps.RoPEForward): the
// weights load and export unpermuted.

func (llamaFamily) hfArchitecture() (string, string) { return "LlamaForCausalLM", "llama" }

var llamaBuffer = regexp.MustCompile(`^model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq$`)

func (llamaFamily) layouts(m *Model) []extLayout {
	l := paramLayout(m, FormatHF, nil, nil)
	if m.Llama.Tied {
		l.Tied["lm_head.weight"] = "model.embed_tokens.weight"
	}
	l.Buffer = llamaBuffer.MatchString
	return []extLayout{l}
}

// ropeJSON is rope_scaling (transformers 4) or rope_parameters
// (transformers 5, which also holds rope_theta).
type ropeJSON struct {
	RopeType                      string   `json:"rope_type"`
	Type                          string   `json:"type"` // the older spelling of rope_type
	RopeTheta                     *float64 `json:"rope_theta"`
	Factor                        float64  `json:"factor"`
	LowFreqFactor                 float64  `json:"low_freq_factor"`
	HighFreqFactor                float64  `json:"high_freq_factor"`
	OriginalMaxPositionEmbeddings int      `json:"original_max_position_embeddings"`
}

func (llamaFamily) hfSettings(j *hfConfigJSON) []hfSetting {
	var out []hfSetting
	add := func(key, field string, v any) { out = append(out, hfSetting{field: field, key: key, value: v}) }
	req := func(key, field string) int {
		v, f := j.positiveInt(field)
		add(key, f, v)
		return v
	}
	req("layers", "num_hidden_layers")
	heads := req("heads", "num_attention_heads")
	C := req("embd", "hidden_size")
	req("ffn", "intermediate_size")
	req("vocab", "vocab_size")
	add("kv_heads", "num_key_value_heads", j.intOr("num_key_value_heads", heads))
	add("max_seq", "max_position_embeddings", j.intOr("max_position_embeddings", 2048))
	eps := j.floatOr("rms_norm_eps", 1e-6)
	if !(eps > 0) {
		j.fail("rms_norm_eps", "%v must be positive", eps)
	}
	add("norm_eps", "rms_norm_eps", eps)
	add("tie_embeddings", "tie_word_embeddings", j.boolOr("tie_word_embeddings", false))

	// rope_theta and rope_scaling (transformers 4), or rope_parameters
	// (transformers 5).
	theta := j.floatOr("rope_theta", 10000)
	field := "rope_scaling"
	var rj ropeJSON
	rp := j.raw("rope_parameters")
	if rp != nil {
		field = "rope_parameters"
		if err := json.Unmarshal(rp, &rj); err != nil {
			j.fail(field, "bad value %s: %v", rp, err)
		}
		if rj.RopeTheta != nil {
			theta = *rj.RopeTheta
		}
	} else if rs := j.raw("rope_scaling"); rs != nil {
		if err := json.Unmarshal(rs, &rj); err != nil {
			j.fail(field, "bad value %s: %v", rs, err)
		}
		if rj.RopeType == "" && rj.Type == "" {
			j.fail(field, "has no rope_type")
		}
	}
	if !(theta > 0) {
		j.fail("rope_theta", "%v must be positive", theta)
	}
	add("rope_theta", "rope_theta", theta)
	typ := rj.RopeType
	if typ == "" {
		typ = rj.Type
	}
	switch typ {
	case "", "default":
		add("rope_scaling", field, RoPEScalingConfig{Type: RoPEScalingNone})
	case RoPEScalingLlama3:
		add("rope_scaling", field, RoPEScalingConfig{Type: RoPEScalingLlama3, Factor: rj.Factor, LowFreqFactor: rj.LowFreqFactor,
			HighFreqFactor: rj.HighFreqFactor, OriginalMaxPositions: rj.OriginalMaxPositionEmbeddings})
	default:
		j.fail(field, "rope_type %q is not supported by spill (want default or llama3)", typ)
	}

	// What spill's Llama implements: SwiGLU, no biases, heads of
	// hidden_size/num_attention_heads.
	j.want("hidden_act", "silu", "silu")
	j.want("attention_bias", false, false)
	j.want("mlp_bias", false, false)
	if hd := j.intOr("head_dim", 0); hd != 0 && heads > 0 && hd*heads != C {
		j.fail("head_dim", "%d is not hidden_size/num_attention_heads = %d/%d (spill's heads are hidden_size/num_attention_heads wide)", hd, C, heads)
	}
	return out
}

func (llamaFamily) hfConfig(m *Model) map[string]any {
	s := m.Llama
	var scaling any // null: none
	if sc := s.RoPE.Scaling; !sc.IsZero() {
		scaling = map[string]any{
			"rope_type":                        RoPEScalingLlama3,
			"factor":                           sc.Factor,
			"low_freq_factor":                  sc.LowFreqFactor,
			"high_freq_factor":                 sc.HighFreqFactor,
			"original_max_position_embeddings": sc.OriginalMaxPositions,
		}
	}
	return map[string]any{
		"architectures":           []string{"LlamaForCausalLM"},
		"model_type":              "llama",
		"hidden_size":             s.Embd,
		"intermediate_size":       s.FFN,
		"num_hidden_layers":       s.Layers,
		"num_attention_heads":     s.Heads,
		"num_key_value_heads":     s.KVHeads,
		"head_dim":                s.headSize(),
		"hidden_act":              "silu",
		"max_position_embeddings": s.MaxSeq,
		"rms_norm_eps":            s.NormEps,
		"rope_theta":              s.RoPE.Theta,
		"rope_scaling":            scaling,
		"tie_word_embeddings":     s.Tied,
		"vocab_size":              s.Vocab,
		"attention_bias":          false,
		"attention_dropout":       0.0,
		"mlp_bias":                false,
		"initializer_range":       0.02,
		"pretraining_tp":          1,
		"use_cache":               true,
		"torch_dtype":             "float32",
	}
}
