package engine

import (
	"fmt"
	"io"
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
	elems := func(t NamedTensor) int { return int(tensorBytes(t) / 4) }
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
		if elems(t) != want || tensorBytes(t)%4 != 0 {
			return nil, nil, fmt.Errorf("export: tensor %q has %d elements, want %v = %d", name, elems(t), shape, want)
		}
		out = append(out, NamedTensor{Name: name, DType: "F32", Shape: append([]int(nil), shape...), Data: t.Data, Fill: t.Fill})
	}
	for name := range byName {
		if _, ok := shapes[name]; !ok && name != "lm_head.weight" {
			return nil, nil, fmt.Errorf("export: unexpected tensor %q in a GPT checkpoint", name)
		}
	}
	out = append(out, NamedTensor{Name: "lm_head.weight", DType: "F32", Shape: []int{V, C}, Data: wte.Data, Fill: wte.Fill})
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

// tensorBytes is the size of a tensor's data: len(Data), or for a
// tensor filled on demand (Data nil, Fill set) the size its shape and
// dtype give (0 for an unknown dtype or an overflowing shape).
func tensorBytes(t NamedTensor) int64 {
	if t.Data != nil || t.Fill == nil {
		return int64(len(t.Data))
	}
	n, err := shapeBytes(t.Shape, safetensorsDTypeSize[t.DType])
	if err != nil {
		return 0
	}
	return n
}

// transposeBuf is the size of the buffer writeTransposedF32 writes
// through.
const transposeBuf = 256 << 10

// writeTransposedF32 writes to w the (cols, rows) transpose of a
// row-major (rows, cols) float32 matrix held as little-endian bytes in
// src, through *buf (grown to at most transposeBuf bytes, kept for the
// next call): whole rows of the transpose at a time when they fit, else
// pieces of one row.
func writeTransposedF32(w io.Writer, src []byte, rows, cols int, reuse *[]byte) error {
	if rows*cols == 0 {
		return nil
	}
	seg := min(rows, transposeBuf/4)    // elements of a transposed row per piece
	blk := max(1, transposeBuf/(4*seg)) // transposed rows per piece (1 when seg < rows)
	if n := 4 * min(blk, cols) * seg; cap(*reuse) < n {
		*reuse = make([]byte, max(n, min(transposeBuf, 2*cap(*reuse))))
	}
	buf := (*reuse)[:cap(*reuse)]
	for c0 := 0; c0 < cols; c0 += blk {
		nc := min(blk, cols-c0)
		for r0 := 0; r0 < rows; r0 += seg {
			nr := min(seg, rows-r0)
			for r := 0; r < nr; r++ {
				s := src[4*((r0+r)*cols+c0):]
				for c := 0; c < nc; c++ {
					copy(buf[4*(c*nr+r):4*(c*nr+r)+4], s[4*c:4*c+4])
				}
			}
			if _, err := w.Write(buf[:4*nc*nr]); err != nil {
				return err
			}
		}
	}
	return nil
}
