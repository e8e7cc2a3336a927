package engine

import (
	"encoding/binary"
	"fmt"
	"regexp"
	"sort"
	"strconv"
)

// Export formats.
const (
	// FormatNanoGPT writes nanoGPT's GPT state_dict names, fp32:
	//
	//	transformer.wte.weight              (V, C)
	//	transformer.wpe.weight              (maxT, C)
	//	transformer.h.{i}.ln_1.weight/bias  (C)
	//	transformer.h.{i}.attn.c_attn.weight (3C, C)   .bias (3C)
	//	transformer.h.{i}.attn.c_proj.weight (C, C)    .bias (C)
	//	transformer.h.{i}.ln_2.weight/bias  (C)
	//	transformer.h.{i}.mlp.c_fc.weight   (4C, C)    .bias (4C)
	//	transformer.h.{i}.mlp.c_proj.weight (C, 4C)    .bias (C)
	//	transformer.ln_f.weight/bias        (C)
	//	lm_head.weight                      (V, C), a copy of wte (tied)
	//
	// Linear weights are (out, in) as in torch.nn.Linear. nanoGPT's
	// state_dict holds lm_head.weight too (tied to wte), so it is written
	// and model.load_state_dict(sd) works with strict=True on a flash-
	// attention nanoGPT (one without the causal-mask "attn.bias" buffer).
	// spill's GELU is the tanh approximation while nanoGPT's nn.GELU() is
	// exact, so logits differ slightly (use nn.GELU(approximate="tanh")
	// for an exact match).
	// MLP models (Config.Model "mlp") are written under their own names,
	// layers.{i}.weight (out, in) and layers.{i}.bias (out), in this
	// format.
	FormatNanoGPT = "nanogpt"

	// FormatHF writes a Hugging Face model directory (ExportHF) that
	// transformers' AutoModelForCausalLM.from_pretrained loads: GPT models
	// as GPT2LMHeadModel, whose Conv1D layers store the four matrices of
	// every block as (in, out), the transpose of nanoGPT's (see
	// gpt_hf.go), Llama models as LlamaForCausalLM (llama_hf.go).
	// HF's GPT-2 uses the tanh approximation of GELU ("gelu_new"), as
	// spill does.
	FormatHF = "hf"
)

var blockParam = regexp.MustCompile(`^transformer\.h\.(\d+)\.(ln_1\.weight|ln_1\.bias|attn\.c_attn\.weight|attn\.c_attn\.bias|attn\.c_proj\.weight|attn\.c_proj\.bias|ln_2\.weight|ln_2\.bias|mlp\.c_fc\.weight|mlp\.c_fc\.bias|mlp\.c_proj\.weight|mlp\.c_proj\.bias)$`)

// ExportTensors converts fp32 master weights (spill's names, see the
// package's parameter naming) to nanoGPT's single-file format and returns
// the tensors to write and the header metadata. cfg gives the model kind
// and the head count; the other dimensions are read from the weights and
// checked against cfg where it states them. FormatHF is a directory:
// ExportHF.
func ExportTensors(weights []NamedTensor, cfg Config, format string) ([]NamedTensor, map[string]string, error) {
	if format == "" {
		format = FormatNanoGPT
	}
	if format == FormatHF {
		return nil, nil, fmt.Errorf("export: format %q is a directory (config.json and safetensors): use ExportHF", format)
	}
	if format != FormatNanoGPT {
		return nil, nil, fmt.Errorf("export: unknown format %q (want %q or %q)", format, FormatNanoGPT, FormatHF)
	}
	for _, w := range weights {
		if w.DType != "F32" {
			return nil, nil, fmt.Errorf("export: tensor %q is %s, want F32 master weights", w.Name, w.DType)
		}
	}
	meta := map[string]string{"format": "pt", "spill_format": format, "spill_model": cfg.Model}
	if f := cfg.Family(); f.Name() == "llama" {
		return nil, nil, fmt.Errorf("export: model %s: nanoGPT has no %s models; export with --format %s", cfg.Model, f.Name(), FormatHF)
	}
	if cfg.Model == ModelMLP {
		return weights, meta, nil
	}

	byName := make(map[string]NamedTensor, len(weights))
	for _, w := range weights {
		byName[w.Name] = w
	}
	wte, ok := byName["transformer.wte.weight"]
	if !ok {
		return nil, nil, fmt.Errorf("export: no transformer.wte.weight among %d tensors: not a GPT checkpoint", len(weights))
	}
	C := cfg.Embd
	if C <= 0 {
		return nil, nil, fmt.Errorf("export: the config does not state embd")
	}
	elems := func(t NamedTensor) int { return len(t.Data) / 4 }
	if elems(wte)%C != 0 {
		return nil, nil, fmt.Errorf("export: transformer.wte.weight has %d elements, not a multiple of embd %d", elems(wte), C)
	}
	V := elems(wte) / C
	wpe := byName["transformer.wpe.weight"]
	maxT := elems(wpe) / C
	if cfg.Vocab > 0 && cfg.Vocab != V {
		return nil, nil, fmt.Errorf("export: transformer.wte.weight has %d rows but the config's vocab is %d", V, cfg.Vocab)
	}
	L := 0
	for name := range byName {
		if m := blockParam.FindStringSubmatch(name); m != nil {
			i, _ := strconv.Atoi(m[1])
			L = max(L, i+1)
		}
	}
	if cfg.Layers > 0 && cfg.Layers != L {
		return nil, nil, fmt.Errorf("export: the weights have %d blocks but the config's layers is %d", L, cfg.Layers)
	}

	// Expected (out, in) shapes in spill's layout.
	shapes := map[string][]int{
		"transformer.wte.weight":  {V, C},
		"transformer.wpe.weight":  {maxT, C},
		"transformer.ln_f.weight": {C},
		"transformer.ln_f.bias":   {C},
	}
	perBlock := map[string][]int{
		"ln_1.weight": {C}, "ln_1.bias": {C},
		"attn.c_attn.weight": {3 * C, C}, "attn.c_attn.bias": {3 * C},
		"attn.c_proj.weight": {C, C}, "attn.c_proj.bias": {C},
		"ln_2.weight": {C}, "ln_2.bias": {C},
		"mlp.c_fc.weight": {4 * C, C}, "mlp.c_fc.bias": {4 * C},
		"mlp.c_proj.weight": {C, 4 * C}, "mlp.c_proj.bias": {C},
	}
	for i := 0; i < L; i++ {
		for k, s := range perBlock {
			shapes[fmt.Sprintf("transformer.h.%d.%s", i, k)] = s
		}
	}
	var out []NamedTensor
	for name, shape := range shapes {
		t, ok := byName[name]
		if !ok {
			return nil, nil, fmt.Errorf("export: missing tensor %q", name)
		}
		want := 1
		for _, d := range shape {
			want *= d
		}
		if elems(t) != want || len(t.Data)%4 != 0 {
			return nil, nil, fmt.Errorf("export: tensor %q has %d elements, want %v = %d", name, elems(t), shape, want)
		}
		out = append(out, NamedTensor{Name: name, DType: "F32", Shape: append([]int(nil), shape...), Data: t.Data})
	}
	for name := range byName {
		if _, ok := shapes[name]; !ok && name != "lm_head.weight" {
			return nil, nil, fmt.Errorf("export: unexpected tensor %q in a GPT checkpoint", name)
		}
	}
	out = append(out, NamedTensor{Name: "lm_head.weight", DType: "F32", Shape: []int{V, C}, Data: wte.Data})
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })

	heads := cfg.Heads
	meta["n_layer"] = strconv.Itoa(L)
	meta["n_head"] = strconv.Itoa(heads)
	meta["n_embd"] = strconv.Itoa(C)
	meta["vocab_size"] = strconv.Itoa(V)
	meta["n_positions"] = strconv.Itoa(maxT)
	return out, meta, nil
}

// Export writes fp32 master weights to path (atomically) in format:
// FormatNanoGPT ("nanogpt", the default when format is ""), one
// safetensors file, or FormatHF ("hf"), a Hugging Face model directory
// (ExportHF with the default options). See those constants for the names
// and layouts.
func Export(weights []NamedTensor, cfg Config, path, format string) error {
	if format == FormatHF {
		return ExportHF(weights, cfg, path, HFExportOptions{})
	}
	ts, meta, err := ExportTensors(weights, cfg, format)
	if err != nil {
		return err
	}
	return WriteSafetensors(path, ts, meta)
}

// transposeF32 returns the (cols, rows) transpose of a row-major
// (rows, cols) float32 matrix held as little-endian bytes.
func transposeF32(src []byte, rows, cols int) []byte {
	dst := make([]byte, len(src))
	for r := 0; r < rows; r++ {
		for c := 0; c < cols; c++ {
			v := binary.LittleEndian.Uint32(src[4*(r*cols+c):])
			binary.LittleEndian.PutUint32(dst[4*(c*rows+r):], v)
		}
	}
	return dst
}
