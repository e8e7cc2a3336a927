package engine

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// fakeGPTWeights builds spill-layout weights whose values encode their
// position: element k of a tensor is k + offset.
func fakeGPTWeights(L, C, V, T int) []NamedTensor {
	var ws []NamedTensor
	add := func(name string, shape ...int) {
		n := 1
		for _, d := range shape {
			n *= d
		}
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(i) + float32(len(ws))*0.5
		}
		ws = append(ws, F32Tensor(name, shape, v))
	}
	add("transformer.wte.weight", V, C)
	add("transformer.wpe.weight", T, C)
	for i := 0; i < L; i++ {
		p := fmt.Sprintf("transformer.h.%d.", i)
		add(p+"ln_1.weight", C)
		add(p+"ln_1.bias", C)
		add(p+"attn.c_attn.weight", 3*C, C)
		add(p+"attn.c_attn.bias", 3*C)
		add(p+"attn.c_proj.weight", C, C)
		add(p+"attn.c_proj.bias", C)
		add(p+"ln_2.weight", C)
		add(p+"ln_2.bias", C)
		add(p+"mlp.c_fc.weight", 4*C, C)
		add(p+"mlp.c_fc.bias", 4*C)
		add(p+"mlp.c_proj.weight", C, 4*C)
		add(p+"mlp.c_proj.bias", C)
	}
	add("transformer.ln_f.weight", C)
	add("transformer.ln_f.bias", C)
	return ws
}

func TestExportFormats(t *testing.T) {
	const L, C, V, T = 2, 4, 11, 8
	ws := fakeGPTWeights(L, C, V, T)
	cfg := DefaultConfig()
	cfg.Layers, cfg.Heads, cfg.Embd, cfg.Vocab, cfg.MaxSeq = L, 2, C, V, T
	src := map[string]NamedTensor{}
	for _, w := range ws {
		src[w.Name] = w
	}
	dir := t.TempDir()
	for _, format := range []string{FormatNanoGPT, FormatHF} {
		path := filepath.Join(dir, format+".safetensors")
		if err := Export(ws, cfg, path, format); err != nil {
			t.Fatal(err)
		}
		file, want := path, len(ws)+1
		if format == FormatHF {
			// A directory; the tied lm_head is left out.
			file, want = filepath.Join(path, HFWeightsFile), len(ws)
		}
		got, meta, err := ReadSafetensors(file)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != want {
			t.Errorf("%s: %d tensors, want %d", format, len(got), want)
		}
		if meta["format"] != "pt" || (format == FormatNanoGPT && (meta["n_layer"] != "2" || meta["n_embd"] != "4" || meta["vocab_size"] != "11" || meta["n_positions"] != "8" || meta["n_head"] != "2")) {
			t.Errorf("%s: meta %v", format, meta)
		}
		for _, g := range got {
			if g.DType != "F32" {
				t.Errorf("%s %s: dtype %s", format, g.Name, g.DType)
			}
			srcName := g.Name
			if g.Name == "lm_head.weight" {
				srcName = "transformer.wte.weight"
			}
			s, ok := src[srcName]
			if !ok {
				t.Errorf("%s: unexpected tensor %s", format, g.Name)
				continue
			}
			sv, _ := s.Float32s()
			gv, _ := g.Float32s()
			linear := strings.HasSuffix(g.Name, "c_attn.weight") || strings.HasSuffix(g.Name, "c_proj.weight") || strings.HasSuffix(g.Name, "c_fc.weight")
			if format == FormatHF && linear {
				// (out, in) in spill, (in, out) in HF's Conv1D.
				if len(g.Shape) != 2 || g.Shape[0] != s.Shape[1] || g.Shape[1] != s.Shape[0] {
					t.Errorf("hf %s: shape %v, source %v", g.Name, g.Shape, s.Shape)
					continue
				}
				out, in := s.Shape[0], s.Shape[1]
				for o := 0; o < out; o++ {
					for i := 0; i < in; i++ {
						if gv[i*out+o] != sv[o*in+i] {
							t.Fatalf("hf %s[%d][%d] = %v, want source[%d][%d] = %v", g.Name, i, o, gv[i*out+o], o, i, sv[o*in+i])
						}
					}
				}
				continue
			}
			if !reflect.DeepEqual(g.Shape, s.Shape) || !reflect.DeepEqual(gv, sv) {
				t.Errorf("%s %s: shape %v vs %v or values differ", format, g.Name, g.Shape, s.Shape)
			}
		}
	}
	// Documented HF shapes for C=4.
	got, _, _ := ReadSafetensors(filepath.Join(dir, "hf.safetensors", HFWeightsFile))
	shapes := map[string][]int{}
	for _, g := range got {
		shapes[g.Name] = g.Shape
	}
	for name, want := range map[string][]int{
		"transformer.h.1.attn.c_attn.weight": {4, 12}, "transformer.h.1.attn.c_proj.weight": {4, 4},
		"transformer.h.0.mlp.c_fc.weight": {4, 16}, "transformer.h.0.mlp.c_proj.weight": {16, 4},
		"transformer.h.0.attn.c_attn.bias": {12}, "transformer.wpe.weight": {8, 4},
	} {
		if !reflect.DeepEqual(shapes[name], want) {
			t.Errorf("hf %s: shape %v, want %v", name, shapes[name], want)
		}
	}
}

func TestExportRejects(t *testing.T) {
	const L, C, V, T = 1, 4, 5, 3
	cfg := DefaultConfig()
	cfg.Embd, cfg.Heads = C, 2
	path := filepath.Join(t.TempDir(), "x.safetensors")
	if err := Export(fakeGPTWeights(L, C, V, T), cfg, path, "onnx"); err == nil || !strings.Contains(err.Error(), "onnx") {
		t.Errorf("unknown format: %v", err)
	}
	ws := fakeGPTWeights(L, C, V, T)
	ws = append(ws[:3], ws[4:]...) // drop ln_1.bias of block 0
	if err := Export(ws, cfg, path, FormatNanoGPT); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("missing tensor: %v", err)
	}
	full := cfg
	full.Layers, full.Vocab, full.MaxSeq = L, V, T
	if err := Export(ws, full, path, FormatHF); err == nil || !strings.Contains(err.Error(), `"transformer.h.0.ln_1.bias"`) {
		t.Errorf("hf, missing tensor: %v", err)
	}
	cfg.Layers = 3
	if err := Export(fakeGPTWeights(L, C, V, T), cfg, path, FormatNanoGPT); err == nil || !strings.Contains(err.Error(), "layers") {
		t.Errorf("layer mismatch: %v", err)
	}
	full.Layers = 3
	if err := Export(fakeGPTWeights(L, C, V, T), full, path, FormatHF); err == nil || !strings.Contains(err.Error(), `"transformer.h.2.ln_1.weight"`) {
		t.Errorf("hf, layer mismatch: %v", err)
	}
	if _, err := os.Stat(path); err == nil {
		t.Errorf("a failed export left %s", path)
	}
	mlp := DefaultConfig()
	mlp.Model = ModelMLP
	if err := Export([]NamedTensor{F32Tensor("layers.0.weight", []int{2, 3}, make([]float32, 6))}, mlp, path, FormatHF); err == nil {
		t.Error("hf export of an MLP accepted")
	}
	if err := Export([]NamedTensor{F32Tensor("layers.0.weight", []int{2, 3}, make([]float32, 6))}, mlp, path, ""); err != nil {
		t.Errorf("MLP export: %v", err)
	}
}
