package engine

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/spill-ml/spill/kernels"
)

// The fixtures under testdata are tiny Hugging Face model directories
// written by genFixtures below (not by spill's exporter, and not copied
// from anywhere), in the forms transformers and the Hub produce that the
// exporter does not: a transformers 5 config.json (rope_parameters),
// BF16 shards with an index and a rotary inv_freq buffer for the Llama; a
// GPT-2 saved from GPT2Model (no "transformer." prefix) in F16 with the
// causal-mask buffers of older transformers. Regenerate them, and the
// golden losses, after a deliberate change with
//
//	go test ./engine -run TestHFFixtures -update-fixtures
var updateFixtures = flag.Bool("update-fixtures", false, "rewrite engine/testdata/hf-* and their golden losses")

const fixtureGolden = "testdata/hf-fixtures.golden.json"

// fixtureTensor is a tensor of a fixture, filled with normal values of
// std (or 1 + normal for a norm's weight).
type fixtureTensor struct {
	name  string
	shape []int
	std   float64
	ones  bool
}

func genFixture(t *testing.T, dir string, config map[string]any, ts []fixtureTensor, dtype string, shards int, seed uint64) {
	t.Helper()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	r := &rng{s: seed}
	var all []NamedTensor
	for _, ft := range ts {
		n := 1
		for _, d := range ft.shape {
			n *= d
		}
		v := make([]float32, n)
		r.fillNormal(v, ft.std)
		nt := NamedTensor{Name: ft.name, DType: dtype, Shape: ft.shape, Data: make([]byte, 2*n)}
		for i, f := range v {
			if ft.ones {
				f += 1
			}
			u := kernels.BF16FromF32(f)
			if dtype == "F16" {
				u = kernels.F16FromF32(f)
			}
			binary.LittleEndian.PutUint16(nt.Data[2*i:], u)
		}
		all = append(all, nt)
	}
	meta := map[string]string{"format": "pt"}
	if shards == 1 {
		if err := WriteSafetensors(filepath.Join(dir, HFWeightsFile), all, meta); err != nil {
			t.Fatal(err)
		}
	} else {
		weightMap := map[string]string{}
		per := (len(all) + shards - 1) / shards
		for k := 0; k < shards; k++ {
			name := fmt.Sprintf("model-%05d-of-%05d.safetensors", k+1, shards)
			part := all[k*per : min(len(all), (k+1)*per)]
			for _, x := range part {
				weightMap[x.Name] = name
			}
			if err := WriteSafetensors(filepath.Join(dir, name), part, meta); err != nil {
				t.Fatal(err)
			}
		}
		writeJSON(t, filepath.Join(dir, HFIndexFile), map[string]any{"metadata": map[string]any{"total_size": 0}, "weight_map": weightMap})
	}
	writeJSON(t, filepath.Join(dir, HFConfigFile), config)
}

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
}

// genFixtures writes both fixtures.
func genFixtures(t *testing.T) {
	const C, L, V, F, NH, NKV = 32, 2, 64, 64, 4, 2
	hs := C / NH
	var lt []fixtureTensor
	lt = append(lt, fixtureTensor{name: "model.embed_tokens.weight", shape: []int{V, C}, std: 0.5})
	for i := 0; i < L; i++ {
		p := fmt.Sprintf("model.layers.%d.", i)
		lt = append(lt,
			fixtureTensor{name: p + "input_layernorm.weight", shape: []int{C}, std: 0.1, ones: true},
			fixtureTensor{name: p + "self_attn.q_proj.weight", shape: []int{NH * hs, C}, std: 0.2},
			fixtureTensor{name: p + "self_attn.k_proj.weight", shape: []int{NKV * hs, C}, std: 0.2},
			fixtureTensor{name: p + "self_attn.v_proj.weight", shape: []int{NKV * hs, C}, std: 0.2},
			fixtureTensor{name: p + "self_attn.o_proj.weight", shape: []int{C, NH * hs}, std: 0.2},
			fixtureTensor{name: p + "self_attn.rotary_emb.inv_freq", shape: []int{hs / 2}, std: 1},
			fixtureTensor{name: p + "post_attention_layernorm.weight", shape: []int{C}, std: 0.1, ones: true},
			fixtureTensor{name: p + "mlp.gate_proj.weight", shape: []int{F, C}, std: 0.2},
			fixtureTensor{name: p + "mlp.up_proj.weight", shape: []int{F, C}, std: 0.2},
			fixtureTensor{name: p + "mlp.down_proj.weight", shape: []int{C, F}, std: 0.2})
	}
	lt = append(lt, fixtureTensor{name: "model.norm.weight", shape: []int{C}, std: 0.1, ones: true},
		fixtureTensor{name: "lm_head.weight", shape: []int{V, C}, std: 0.3})
	genFixture(t, "testdata/hf-tiny-llama", map[string]any{
		"architectures": []string{"LlamaForCausalLM"}, "model_type": "llama", "hidden_size": C, "intermediate_size": F,
		"num_hidden_layers": L, "num_attention_heads": NH, "num_key_value_heads": NKV, "head_dim": hs, "hidden_act": "silu",
		"max_position_embeddings": 64, "rms_norm_eps": 1e-5, "tie_word_embeddings": false, "vocab_size": V,
		"attention_bias": false, "mlp_bias": false, "dtype": "bfloat16",
		"rope_parameters": map[string]any{"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
			"high_freq_factor": 4.0, "original_max_position_embeddings": 16},
	}, lt, "BF16", 3, 101)

	var gt []fixtureTensor
	gt = append(gt, fixtureTensor{name: "wte.weight", shape: []int{V, C}, std: 0.5}, fixtureTensor{name: "wpe.weight", shape: []int{64, C}, std: 0.1})
	for i := 0; i < L; i++ {
		p := fmt.Sprintf("h.%d.", i)
		gt = append(gt,
			fixtureTensor{name: p + "ln_1.weight", shape: []int{C}, std: 0.1, ones: true},
			fixtureTensor{name: p + "ln_1.bias", shape: []int{C}, std: 0.1},
			fixtureTensor{name: p + "attn.bias", shape: []int{1, 1, 64, 64}, std: 0},
			fixtureTensor{name: p + "attn.c_attn.weight", shape: []int{C, 3 * C}, std: 0.2}, // Conv1D: (in, out)
			fixtureTensor{name: p + "attn.c_attn.bias", shape: []int{3 * C}, std: 0.1},
			fixtureTensor{name: p + "attn.c_proj.weight", shape: []int{C, C}, std: 0.2},
			fixtureTensor{name: p + "attn.c_proj.bias", shape: []int{C}, std: 0.1},
			fixtureTensor{name: p + "ln_2.weight", shape: []int{C}, std: 0.1, ones: true},
			fixtureTensor{name: p + "ln_2.bias", shape: []int{C}, std: 0.1},
			fixtureTensor{name: p + "mlp.c_fc.weight", shape: []int{C, 4 * C}, std: 0.2},
			fixtureTensor{name: p + "mlp.c_fc.bias", shape: []int{4 * C}, std: 0.1},
			fixtureTensor{name: p + "mlp.c_proj.weight", shape: []int{4 * C, C}, std: 0.1},
			fixtureTensor{name: p + "mlp.c_proj.bias", shape: []int{C}, std: 0.1})
	}
	gt = append(gt, fixtureTensor{name: "ln_f.weight", shape: []int{C}, std: 0.1, ones: true}, fixtureTensor{name: "ln_f.bias", shape: []int{C}, std: 0.1})
	genFixture(t, "testdata/hf-tiny-gpt2", map[string]any{
		"architectures": []string{"GPT2LMHeadModel"}, "model_type": "gpt2", "n_embd": C, "n_layer": L, "n_head": NH,
		"vocab_size": V, "n_positions": 64, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
	}, gt, "F16", 1, 202)
}

// TestHFFixtures loads the fixtures with --init-from, only the directory
// given, and evaluates them on fixed batches: the losses are the golden
// ones (spill's own, recorded by -update-fixtures; the GPU script
// tools/bench/llama_h200.sh checks spill's losses against transformers').
func TestHFFixtures(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	if *updateFixtures {
		genFixtures(t)
	}
	data := writeTokens(t, 64, 16, 200)
	losses := map[string]float64{}
	for _, name := range []string{"hf-tiny-llama", "hf-tiny-gpt2"} {
		cfg := DefaultConfig()
		cfg.InitFrom, cfg.Data = filepath.Join("testdata", name), data
		cfg.Precision, cfg.Threads, cfg.Device = "fp32", 2, "cpu"
		cfg.Batch, cfg.EvalBatches = 2, 3
		res, err := Eval(context.Background(), cfg, nil)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		losses[name] = res.Loss
		t.Logf("%s: loss %.7f (%s; %s)", name, res.Loss, res.Model, res.Weights)
	}
	if *updateFixtures {
		writeJSON(t, fixtureGolden, losses)
		return
	}
	b, err := os.ReadFile(fixtureGolden)
	if err != nil {
		t.Fatal(err)
	}
	var golden map[string]float64
	if err := json.Unmarshal(b, &golden); err != nil {
		t.Fatal(err)
	}
	names := make([]string, 0, len(losses))
	for n := range losses {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if g := golden[n]; !(math.Abs(losses[n]-g) <= 1e-5*math.Abs(g)) {
			t.Errorf("%s: loss %.7f, golden %.7f", n, losses[n], g)
		}
	}
}
