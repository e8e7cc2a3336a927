package engine

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spill-ml/spill/dataset"
	"github.com/spill-ml/spill/kernels"
)

// hfCase is a model shape of the round-trip tests: its config, as a
// checkpoint holds it.
type hfCase struct {
	name string
	cfg  Config
}

func hfCases() []hfCase {
	gpt := DefaultConfig()
	gpt.Layers, gpt.Heads, gpt.Embd, gpt.Vocab, gpt.MaxSeq = 2, 2, 16, 40, 12
	llama := DefaultConfig()
	llama.Model = "llama-tiny"
	llama.Layers, llama.Heads, llama.Embd, llama.Vocab, llama.MaxSeq = 2, 4, 16, 40, 12
	llama.KVHeads, llama.FFN, llama.RoPETheta, llama.NormEps = 2, 24, 500000, 1e-5 // GQA
	llama.RoPEScaling = &RoPEScalingConfig{Type: RoPEScalingLlama3, Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 8}
	untied, tied := false, true
	llama.TieEmbeddings = &untied
	llamaTied := llama
	llamaTied.TieEmbeddings = &tied
	llamaTied.RoPEScaling = &RoPEScalingConfig{Type: RoPEScalingNone}
	var cs []hfCase
	for _, c := range []hfCase{{"gpt", gpt}, {"llama-gqa-untied", llama}, {"llama-tied", llamaTied}} {
		c.cfg.Precision, c.cfg.Batch, c.cfg.SeqLen, c.cfg.Threads = "fp32", 2, 8, 2
		c.cfg.EnsureDefaults()
		cs = append(cs, c)
	}
	return cs
}

// weightsOf initialises a trainer of cfg's model from seed and returns its
// master weights.
func weightsOf(t *testing.T, cfg Config, seed uint64) []NamedTensor {
	t.Helper()
	m, err := BuildModel(&cfg, dataset.Schema{})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := NewTrainer(openCPU(t), m, trainerOptions(&cfg, 1, 4))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if err := tr.InitWeights(context.Background(), seed); err != nil {
		t.Fatal(err)
	}
	ws, _, err := tr.SaveTensors(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return ws
}

// loadWeights resolves cfg.InitFrom as spill train does, builds the model,
// loads the weights into a resident trainer, or an out-of-core one with
// every class on the host when ooc, and returns its master weights.
func loadWeights(t *testing.T, cfg Config, ooc bool) ([]NamedTensor, Config, error) {
	t.Helper()
	if err := ResolveInitFrom(&cfg); err != nil {
		return nil, cfg, err
	}
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, cfg, err
	}
	m, err := BuildModel(&cfg, dataset.Schema{})
	if err != nil {
		return nil, cfg, err
	}
	pre, err := openInitFrom(&cfg, m)
	if err != nil {
		return nil, cfg, err
	}
	defer pre.Close()
	be := openCPU(t)
	var tr *Trainer
	if ooc {
		tr, err = NewOffloadTrainer(be, m, trainerOptions(&cfg, 1, 4), streamed())
	} else {
		tr, err = NewTrainer(be, m, trainerOptions(&cfg, 1, 4))
	}
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if err := tr.LoadPretrained(context.Background(), pre); err != nil {
		t.Fatal(err)
	}
	ws, _, err := tr.SaveTensors(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return ws, cfg, nil
}

// sameWeights fails unless a and b hold the same tensors bit for bit.
func sameWeights(t *testing.T, what string, a, b []NamedTensor) {
	t.Helper()
	if len(a) != len(b) {
		t.Fatalf("%s: %d tensors, want %d", what, len(b), len(a))
	}
	for i := range a {
		if a[i].Name != b[i].Name || !sameShape(a[i].Shape, b[i].Shape) || string(a[i].Data) != string(b[i].Data) {
			t.Fatalf("%s: tensor %s %v differs from %s %v", what, b[i].Name, b[i].Shape, a[i].Name, a[i].Shape)
		}
	}
}

// TestInitFromRoundTrip: weights exported as a Hugging Face directory
// (single file and sharded) come back bit for bit through --init-from,
// the shape coming from config.json alone, into the resident and the
// out-of-core trainer; GPT (tied), Llama with GQA untied and tied.
func TestInitFromRoundTrip(t *testing.T) {
	for _, c := range hfCases() {
		t.Run(c.name, func(t *testing.T) {
			want := weightsOf(t, c.cfg, 7)
			dir := t.TempDir()
			single, sharded := filepath.Join(dir, "single"), filepath.Join(dir, "sharded")
			if err := ExportHF(want, c.cfg, single, HFExportOptions{}); err != nil {
				t.Fatal(err)
			}
			if err := ExportHF(want, c.cfg, sharded, HFExportOptions{ShardSize: 4096}); err != nil {
				t.Fatal(err)
			}
			shards, _ := filepath.Glob(filepath.Join(sharded, "model-*-of-*.safetensors"))
			if len(shards) < 3 || fileExists(filepath.Join(sharded, HFWeightsFile)) || !fileExists(filepath.Join(sharded, HFIndexFile)) {
				t.Fatalf("sharded export: %d shards %v", len(shards), shards)
			}
			for _, src := range []string{single, sharded} {
				for _, ooc := range []bool{false, true} {
					// Only what the user types: the shape is config.json's.
					cfg := DefaultConfig()
					cfg.InitFrom, cfg.Precision, cfg.Threads = src, "fp32", 2
					cfg.Batch, cfg.SeqLen = c.cfg.Batch, c.cfg.SeqLen
					got, rcfg, err := loadWeights(t, cfg, ooc)
					if err != nil {
						t.Fatal(err)
					}
					if rcfg.Model != c.cfg.Model || rcfg.Hash() != c.cfg.Hash() {
						t.Errorf("%s: resolved config differs from the exported one: %v", src, c.cfg.MathDiff(&rcfg))
					}
					sameWeights(t, filepath.Base(src), want, got)
				}
			}
		})
	}
}

// TestInitFromFiles: a nanoGPT file and an HF model.safetensors without
// its config.json load in the layout their shapes match, the shape coming
// from the settings; BF16 and F16 tensors are converted exactly.
func TestInitFromFiles(t *testing.T) {
	c := hfCases()[0]
	want := weightsOf(t, c.cfg, 3)
	dir := t.TempDir()
	nano := filepath.Join(dir, "nano.safetensors")
	if err := Export(want, c.cfg, nano, FormatNanoGPT); err != nil {
		t.Fatal(err)
	}
	hf := filepath.Join(dir, "hf")
	if err := ExportHF(want, c.cfg, hf, HFExportOptions{}); err != nil {
		t.Fatal(err)
	}
	bare := filepath.Join(dir, "bare")
	os.Mkdir(bare, 0o755)
	os.Rename(filepath.Join(hf, HFWeightsFile), filepath.Join(bare, HFWeightsFile))
	for _, path := range []string{nano, bare} {
		cfg := c.cfg
		cfg.InitFrom = path
		got, _, err := loadWeights(t, cfg, false)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		sameWeights(t, path, want, got)
	}

	// Half precision: every tensor of the nanoGPT file as BF16, then F16.
	ts, meta, err := ReadSafetensors(nano)
	if err != nil {
		t.Fatal(err)
	}
	for _, dt := range []string{"BF16", "F16"} {
		var half []NamedTensor
		rounded := map[string][]float32{}
		for _, x := range ts {
			v, _ := x.Float32s()
			h := NamedTensor{Name: x.Name, DType: dt, Shape: x.Shape, Data: make([]byte, 2*len(v))}
			r := make([]float32, len(v))
			for i, f := range v {
				var u uint16
				if dt == "BF16" {
					u = kernels.BF16FromF32(f)
					r[i] = kernels.F32FromBF16(u)
				} else {
					u = kernels.F16FromF32(f)
					r[i] = kernels.F32FromF16(u)
				}
				binary.LittleEndian.PutUint16(h.Data[2*i:], u)
			}
			half = append(half, h)
			rounded[x.Name] = r
		}
		path := filepath.Join(dir, dt+".safetensors")
		if err := WriteSafetensors(path, half, meta); err != nil {
			t.Fatal(err)
		}
		cfg := c.cfg
		cfg.InitFrom = path
		got, _, err := loadWeights(t, cfg, false)
		if err != nil {
			t.Fatalf("%s: %v", dt, err)
		}
		for _, g := range got {
			v, _ := g.Float32s()
			for i, f := range v {
				if math.Float32bits(f) != math.Float32bits(rounded[g.Name][i]) {
					t.Fatalf("%s %s[%d] = %v, want %v", dt, g.Name, i, f, rounded[g.Name][i])
				}
			}
		}
	}
}

// rewrite rewrites the safetensors file path with edit applied to its
// tensors.
func rewrite(t *testing.T, path string, edit func([]NamedTensor) []NamedTensor) {
	t.Helper()
	ts, meta, err := ReadSafetensors(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteSafetensors(path, edit(ts), meta); err != nil {
		t.Fatal(err)
	}
}

// TestInitFromErrors: a bad checkpoint is an error naming the tensor and
// the file, before anything is trained: Run returns no summary, writes no
// checkpoint and no metrics.
func TestInitFromErrors(t *testing.T) {
	c := hfCases()[1] // Llama, GQA
	want := weightsOf(t, c.cfg, 5)
	data := writeTokens(t, 40, 8, 400)
	// shardOf is the file of the index of dir that holds tensor.
	shardOf := func(dir, tensor string) string {
		var idx struct {
			WeightMap map[string]string `json:"weight_map"`
		}
		b, _ := os.ReadFile(filepath.Join(dir, HFIndexFile))
		if err := json.Unmarshal(b, &idx); err != nil || idx.WeightMap[tensor] == "" {
			t.Fatalf("no shard holds %s: %v", tensor, err)
		}
		return filepath.Join(dir, idx.WeightMap[tensor])
	}
	editIndex := func(dir string, edit func(wm map[string]any)) {
		idx := filepath.Join(dir, HFIndexFile)
		var m map[string]any
		b, _ := os.ReadFile(idx)
		json.Unmarshal(b, &m)
		edit(m["weight_map"].(map[string]any))
		b, _ = json.Marshal(m)
		os.WriteFile(idx, b, 0o644)
	}
	setEmbed := func(dir string, edit func(*NamedTensor)) {
		rewrite(t, shardOf(dir, "model.embed_tokens.weight"), func(ts []NamedTensor) []NamedTensor {
			for i := range ts {
				if ts[i].Name == "model.embed_tokens.weight" {
					edit(&ts[i])
				}
			}
			return ts
		})
	}
	const up1 = "model.layers.1.mlp.up_proj.weight"
	cases := []struct {
		name  string
		edit  func(dir string)
		wants []string
	}{
		{"tensor missing from its shard", func(dir string) {
			rewrite(t, shardOf(dir, up1), func(ts []NamedTensor) []NamedTensor {
				var out []NamedTensor
				for _, x := range ts {
					if x.Name != up1 {
						out = append(out, x)
					}
				}
				return out
			})
		}, []string{HFIndexFile, "maps tensor \"" + up1 + "\"", "does not hold it"}},
		{"tensor missing from the index", func(dir string) {
			editIndex(dir, func(wm map[string]any) { delete(wm, up1) })
		}, []string{"\"" + up1 + "\" is missing", HFIndexFile}},
		{"wrong shape", func(dir string) {
			setEmbed(dir, func(x *NamedTensor) { x.Shape = []int{x.Shape[1], x.Shape[0]} })
		}, []string{`"model.embed_tokens.weight"`, ".safetensors: shape [16 40]", "needs [40 16]"}},
		{"wrong dtype", func(dir string) {
			setEmbed(dir, func(x *NamedTensor) { x.DType = "I32" })
		}, []string{`"model.embed_tokens.weight"`, ".safetensors: dtype I32"}},
		{"truncated", func(dir string) {
			p := shardOf(dir, up1)
			st, _ := os.Stat(p)
			os.Truncate(p, st.Size()-10)
		}, []string{"model-0000", "truncated"}},
		{"stray tensor", func(dir string) {
			const bias = "model.layers.0.self_attn.q_proj.bias"
			p := shardOf(dir, up1)
			rewrite(t, p, func(ts []NamedTensor) []NamedTensor {
				return append(ts, F32Tensor(bias, []int{16}, make([]float32, 16)))
			})
			editIndex(dir, func(wm map[string]any) { wm[bias] = filepath.Base(p) })
		}, []string{`"model.layers.0.self_attn.q_proj.bias"`, "not a parameter"}},
		{"bad index", func(dir string) {
			os.WriteFile(filepath.Join(dir, HFIndexFile), []byte(`{"weight_map": {"model.norm.weight": "../x.safetensors"}}`), 0o644)
		}, []string{HFIndexFile, "model.norm.weight", "not a file name"}},
		{"unsupported config", func(dir string) {
			p := filepath.Join(dir, HFConfigFile)
			b, _ := os.ReadFile(p)
			os.WriteFile(p, []byte(strings.Replace(string(b), `"attention_bias": false`, `"attention_bias": true`, 1)), 0o644)
		}, []string{HFConfigFile, "attention_bias"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "m")
			if err := ExportHF(want, c.cfg, dir, HFExportOptions{ShardSize: 8000}); err != nil {
				t.Fatal(err)
			}
			if shards, _ := filepath.Glob(filepath.Join(dir, "model-*-of-*.safetensors")); len(shards) < 2 {
				t.Fatalf("want shards, have %v", shards)
			}
			tc.edit(dir)
			cfg := DefaultConfig()
			cfg.InitFrom, cfg.Data, cfg.Precision, cfg.Threads = dir, data, "fp32", 2
			cfg.Steps, cfg.Batch, cfg.SeqLen, cfg.EvalEvery = 2, 2, 8, 0
			cfg.CheckpointDir = filepath.Join(t.TempDir(), "ckpt")
			cfg.Metrics = filepath.Join(t.TempDir(), "metrics.jsonl")
			sum, err := Run(context.Background(), cfg, RunOptions{})
			if err == nil {
				t.Fatal("trained from a bad checkpoint")
			}
			t.Log(err)
			for _, w := range tc.wants {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not say %q:\n%v", w, err)
				}
			}
			if !strings.Contains(err.Error(), dir) {
				t.Errorf("error does not name the file in %s:\n%v", dir, err)
			}
			if sum != nil {
				t.Errorf("a summary of %d steps", sum.Steps)
			}
			if _, err := os.Stat(cfg.CheckpointDir); err == nil {
				t.Error("a checkpoint directory was written")
			}
			if st, err := os.Stat(cfg.Metrics); err == nil && st.Size() > 0 {
				t.Error("metrics were written")
			}
		})
	}
}

// TestInitFromSettings: config.json sets the model and shape; a setting
// that disagrees with it is an error naming the field and the flag; a
// model of another family is refused unless it is the default.
func TestInitFromSettings(t *testing.T) {
	c := hfCases()[1]
	dir := filepath.Join(t.TempDir(), "m")
	if err := ExportHF(weightsOf(t, c.cfg, 1), c.cfg, dir, HFExportOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.InitFrom, cfg.Layers, cfg.KVHeads = dir, 3, 4
	err := ResolveInitFrom(&cfg)
	for _, w := range []string{"num_hidden_layers = 2", "layers (--layers) is 3", "num_key_value_heads = 2", "kv_heads (config file) is 4", HFConfigFile} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("mismatch error does not say %q: %v", w, err)
		}
	}
	cfg = DefaultConfig()
	cfg.InitFrom, cfg.Model = dir, "gpt2-124m"
	if err := ResolveInitFrom(&cfg); err == nil || !strings.Contains(err.Error(), "LlamaForCausalLM") || !strings.Contains(err.Error(), "--model") {
		t.Errorf("a GPT preset over a Llama checkpoint: %v", err)
	}
	cfg = DefaultConfig()
	cfg.InitFrom, cfg.Model, cfg.Heads = dir, "llama3.2-1b", 4
	if err := ResolveInitFrom(&cfg); err != nil || cfg.Model != "llama3.2-1b" || cfg.Layers != 2 || cfg.FFN != 24 {
		t.Errorf("a Llama preset: %v, %+v", err, cfg)
	}
	cfg.EnsureDefaults()
	if s, _ := llamaShapeOf(&cfg); s.RoPE.Scaling.Factor != 8 || s.RoPE.Scaling.OriginalMaxPositions != 8 || s.Tied {
		t.Errorf("the preset's RoPE or tying leaked into the shape: %+v", s)
	}
	cfg.Resume, cfg.CheckpointDir = true, t.TempDir()
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "init_from: conflicts with resume") {
		t.Errorf("init_from with resume: %v", err)
	}
}

// TestInitFromNamesPreset: a config.json with a preset's shape names the
// model after that preset (Llama-3.2-1B's is llama3.2-1b); another shape
// keeps the family's first preset for its training defaults only.
func TestInitFromNamesPreset(t *testing.T) {
	for _, tc := range []struct {
		layers int
		want   string
	}{{16, "llama3.2-1b"}, {3, "llama-tiny"}} {
		dir := t.TempDir()
		cfgJSON := fmt.Sprintf(`{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
			"intermediate_size": 8192, "num_hidden_layers": %d, "num_attention_heads": 32, "num_key_value_heads": 8,
			"vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
			"rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
			"original_max_position_embeddings": 8192}, "tie_word_embeddings": true, "hidden_act": "silu"}`, tc.layers)
		if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfgJSON), 0o644); err != nil {
			t.Fatal(err)
		}
		c := Config{InitFrom: dir}
		if err := ResolveInitFrom(&c); err != nil {
			t.Fatalf("%d layers: %v", tc.layers, err)
		}
		if c.Model != tc.want || c.Layers != tc.layers {
			t.Errorf("%d layers: model %q with %d layers, want %q", tc.layers, c.Model, c.Layers, tc.want)
		}
	}
}
