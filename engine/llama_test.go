package engine

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/spill-ml/spill/dataset"
	"github.com/spill-ml/spill/kernels"
	"github.com/spill-ml/spill/offload"
)

// gradLlama is a Llama small enough for finite differences, with grouped
// query heads (4 query heads on 2 key/value heads) and the llama3 RoPE
// scaling over a short original context, so that every frequency band
// (kept, divided, interpolated) is used.
func gradLlama(tied bool) LlamaShape {
	return LlamaShape{Layers: 2, Heads: 4, KVHeads: 2, Embd: 16, FFN: 24, Vocab: 13, MaxSeq: 8,
		RoPE:    kernels.RoPEConfig{Theta: 10000, Scaling: kernels.RoPEScaling{Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 16}},
		NormEps: 1e-5, Tied: tied}
}

// TestLlamaGradientCheck: the analytic gradients of a whole tiny Llama,
// tied and untied head, match central finite differences of its loss
// (taken in float64 from fp32 losses, as the GPT's check does).
func TestLlamaGradientCheck(t *testing.T) {
	for _, tied := range []bool{false, true} {
		t.Run(fmt.Sprintf("tied=%v", tied), func(t *testing.T) {
			m, err := NewLlama(gradLlama(tied), kernels.F32)
			if err != nil {
				t.Fatal(err)
			}
			tr, feed := gradCheckTrainer(t, m)
			// A step of 2e-3: the tied embedding enters the loss twice
			// (input and logits), and at these order-one weights the
			// O(h²) error of a 1e-2 step is some 5% on its largest
			// gradients.
			gradCheckStep(t, tr, feed, 2e-3)
		})
	}
}

// TestLlamaPresetShapes: the real presets have the published parameter
// counts of their checkpoints, Hugging Face's tensor names and layouts, and
// the head tied exactly where the config says so.
func TestLlamaPresetShapes(t *testing.T) {
	for _, c := range []struct {
		name   string
		params int64
	}{
		{"llama3.2-1b", 1_235_814_400},
		{"llama3.2-3b", 3_212_749_824},
		{"llama3.1-8b", 8_030_261_248},
		{"llama2-7b", 6_738_415_616},
		{"llama2-13b", 13_015_864_320},
	} {
		cfg := DefaultConfig()
		cfg.Model = c.name
		cfg.EnsureDefaults()
		if err := cfg.Validate(); err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if f := cfg.Family(); f.Name() != "llama" || f.Input() != InputTokens {
			t.Errorf("%s: family %s", c.name, f.Name())
		}
		p, _ := LookupPreset(c.name)
		cfg.Vocab = p.Vocab
		m, err := BuildModel(&cfg, tokenSchema(p.Vocab))
		if err != nil {
			t.Fatal(err)
		}
		if got := m.NumParams(); got != c.params || LlamaParams(m.Llama) != c.params {
			t.Errorf("%s: %d parameters (LlamaParams %d), want %d", c.name, got, LlamaParams(m.Llama), c.params)
		}
		// Model FLOPs: 6 per parameter of the blocks (their norms
		// counted too, as for the GPT) and of the LM head (the tied
		// embedding's when tied; the lookup costs none), and 3·4·T·C per
		// layer for attention.
		const T = 2048
		vc := int64(p.Vocab) * int64(p.Embd)
		matmul := c.params - vc - int64(p.Embd) // less the lookup and the final norm
		if p.Tied {
			matmul += vc
		}
		wantF := 6*float64(matmul) + 12*float64(T)*float64(p.Embd)*float64(p.Layers)
		if got := ModelFLOPsPerToken(m, T); math.Abs(got-wantF) > 1e-9*wantF {
			t.Errorf("%s: %.6g model FLOPs per token, want %.6g", c.name, got, wantF)
		}
		head := m.Layers[len(m.Layers)-1]
		if tied := len(head.Tied()) == 1; tied != p.Tied {
			t.Errorf("%s: head tied %v, preset %v", c.name, tied, p.Tied)
		}
		names := map[string][]int{}
		for _, l := range m.Layers {
			for _, ps := range l.Params() {
				names[ps.Name] = ps.Shape
			}
		}
		C, hs, L := p.Embd, p.Embd/p.Heads, p.Layers-1
		want := map[string][]int{
			"model.embed_tokens.weight":                                       {p.Vocab, C},
			fmt.Sprintf("model.layers.%d.input_layernorm.weight", L):          {C},
			fmt.Sprintf("model.layers.%d.self_attn.q_proj.weight", L):         {p.Heads * hs, C},
			fmt.Sprintf("model.layers.%d.self_attn.k_proj.weight", L):         {p.KVHeads * hs, C},
			fmt.Sprintf("model.layers.%d.self_attn.v_proj.weight", L):         {p.KVHeads * hs, C},
			fmt.Sprintf("model.layers.%d.self_attn.o_proj.weight", L):         {C, p.Heads * hs},
			fmt.Sprintf("model.layers.%d.post_attention_layernorm.weight", L): {C},
			fmt.Sprintf("model.layers.%d.mlp.gate_proj.weight", L):            {p.FFN, C},
			fmt.Sprintf("model.layers.%d.mlp.up_proj.weight", L):              {p.FFN, C},
			fmt.Sprintf("model.layers.%d.mlp.down_proj.weight", L):            {C, p.FFN},
			"model.norm.weight": {C},
		}
		if !p.Tied {
			want["lm_head.weight"] = []int{p.Vocab, C}
		} else if _, ok := names["lm_head.weight"]; ok {
			t.Errorf("%s: tied model has an lm_head.weight", c.name)
		}
		for n, s := range want {
			if fmt.Sprint(names[n]) != fmt.Sprint(s) {
				t.Errorf("%s: %s has shape %v, want %v", c.name, n, names[n], s)
			}
		}
		if len(names) != 2+9*p.Layers+boolInt(!p.Tied) {
			t.Errorf("%s: %d tensors", c.name, len(names))
		}
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// oocLlama is a Llama deep enough that its state is many times one
// layer's working set.
var oocLlama = LlamaShape{Layers: 12, Heads: 4, KVHeads: 2, Embd: 32, FFN: 48, Vocab: 64, MaxSeq: 8,
	RoPE: kernels.RoPEConfig{Theta: 10000}, NormEps: 1e-5}

// TestLlamaOutOfCoreBitwiseFP32: a tiny Llama (tied and untied) trained
// out of core, weights and gradients streamed from the host, activations
// recomputed, layer-major (one group of all micro-batches), reaches the
// resident run's losses and weights bit for bit in fp32 under a device
// budget of the planned peak, under a sixth of its state; and so do
// blocks that recompute selectively (checkpoints on the device and on the
// host) beside whole recomputes.
func TestLlamaOutOfCoreBitwiseFP32(t *testing.T) {
	const steps = 2
	for _, c := range []struct {
		tied, selective bool
	}{{false, false}, {true, false}, {false, true}} {
		tied := c.tied
		t.Run(fmt.Sprintf("tied=%v/selective=%v", tied, c.selective), func(t *testing.T) {
			s := oocLlama
			s.Tied = tied
			to := oocOptions()
			to.Accum = 3
			m, err := NewLlama(s, kernels.F32)
			if err != nil {
				t.Fatal(err)
			}
			tr, err := NewTrainer(openCPU(t), m, to)
			if err != nil {
				t.Fatal(err)
			}
			wantL, wantW := trainSteps(t, tr, steps)
			tr.Close()

			m, _ = NewLlama(s, kernels.F32)
			o := streamed()
			o.Group, o.Activations = to.Accum, recomputeBlocks(m)
			if c.selective {
				for i := 1; i < len(m.Layers)-1; i++ {
					o.Activations[i] = []offload.ActPolicy{offload.RecomputeSelective, offload.Recompute, offload.RecomputeSelectiveHost}[i%3]
				}
			}
			by, err := OffloadDeviceBytes(m, oocB, oocT, to.Accum, o)
			if err != nil {
				t.Fatal(err)
			}
			var need int64
			for _, n := range by {
				need += n
			}
			// The budget is the planned peak, which must be well under the
			// state for the run to be out of core.
			budget := need
			if !c.selective && budget > stateBytes(m)/6 {
				t.Fatalf("planned device peak %d is more than a sixth of the state (%d bytes)", need, stateBytes(m))
			}
			be, err := kernels.Open("cpu", kernels.Config{Threads: 2, MemoryLimit: budget})
			if err != nil {
				t.Fatal(err)
			}
			defer be.Close()
			o.DeviceBudget = budget
			otr, err := NewOffloadTrainer(be, m, to, o)
			if err != nil {
				t.Fatal(err)
			}
			defer otr.Close()
			gotL, gotW := trainSteps(t, otr, steps)
			if err := otr.ResidencyErr(); err != nil {
				t.Errorf("residency table: %v", err)
			}
			if pk := be.MemStats().Peak; pk > budget {
				t.Errorf("device peak %d exceeds the budget %d", pk, budget)
			}
			sameRun(t, "resident", wantL, gotL, wantW, gotW)
		})
	}
}

// TestLlamaRunLossFalls trains llama-tiny (the preset, at a shorter
// sequence) on the embedded corpus: the loss starts near ln(257) and falls.
func TestLlamaRunLossFalls(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	t.Setenv("HOME", t.TempDir())
	cfg := DefaultConfig()
	cfg.Model = "llama-tiny"
	cfg.SeqLen, cfg.Batch, cfg.Steps, cfg.Warmup = 64, 4, 30, 3
	cfg.LR, cfg.EvalEvery, cfg.Threads = 3e-3, 0, 2
	var log stepLog
	sum, err := Run(context.Background(), cfg, RunOptions{Reporter: &log})
	if err != nil {
		t.Fatal(err)
	}
	if len(log.m) != cfg.Steps {
		t.Fatalf("%d steps, want %d", len(log.m), cfg.Steps)
	}
	if math.Abs(sum.FirstLoss-math.Log(257)) > 0.5 {
		t.Errorf("first loss %.3f, want about ln(257) = %.3f", sum.FirstLoss, math.Log(257))
	}
	if sum.LastLoss > 0.75*sum.FirstLoss {
		t.Errorf("loss %.3f -> %.3f: did not fall below 75%%", sum.FirstLoss, sum.LastLoss)
	}
}

// withoutLlamaOps hides the CPU backend's Llama kernels.
type withoutLlamaOps struct{ kernels.Backend }

// TestLlamaNeedsLlamaOps: a backend without kernels.LlamaOps is refused
// before anything is allocated, with an error that says why.
func TestLlamaNeedsLlamaOps(t *testing.T) {
	be := withoutLlamaOps{openCPU(t)}
	m, err := NewLlama(gradLlama(false), kernels.F32)
	if err != nil {
		t.Fatal(err)
	}
	_, err = NewTrainer(be, m, TrainerOptions{B: 1, T: 4, Accum: 1, LossScale: 1})
	if err == nil || !strings.Contains(err.Error(), "LlamaOps") {
		t.Fatalf("error %v, want one naming kernels.LlamaOps", err)
	}
	if n := be.MemStats().Allocs; n != 0 {
		t.Errorf("%d allocations before the refusal", n)
	}
	gm, _ := NewGPT(GPTShape{Layers: 1, Heads: 2, Embd: 8, Vocab: 13, MaxSeq: 8}, kernels.F32)
	if err := CheckBackend(be, gm); err != nil {
		t.Errorf("a GPT needs no Llama kernels: %v", err)
	}
}

// TestFamilyRegistry: every preset name belongs to one family, the
// families' inputs are what their models read, and the Llama config
// checks catch head counts the preset's key/value heads do not divide.
func TestFamilyRegistry(t *testing.T) {
	for name, want := range map[string]string{"tiny": "gpt", "gpt2": "gpt", "gpt2-70b": "gpt", "llama-tiny": "llama",
		"llama2-13b": "llama", "mlp": "mlp", "custom": "gpt"} {
		if got := FamilyOf(name).Name(); got != want {
			t.Errorf("FamilyOf(%q) = %s, want %s", name, got, want)
		}
	}
	seen := map[string]bool{}
	for _, n := range PresetNames() {
		if seen[n] {
			t.Errorf("preset %s listed twice", n)
		}
		seen[n] = true
		if _, ok := LookupPreset(n); !ok {
			t.Errorf("listed preset %s does not look up", n)
		}
	}
	if names := PresetNames(); names[len(names)-1] != "mlp" || !seen["llama3.1-8b"] {
		t.Errorf("preset names %v", names)
	}
	cfg := DefaultConfig()
	cfg.Model, cfg.Heads, cfg.Embd = "llama-tiny", 3, 96
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "key/value heads") {
		t.Errorf("3 heads over 2 key/value heads: %v", err)
	}
	cfg = DefaultConfig()
	cfg.Model = "llama-tiny"
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil || cfg.Layers != 4 || cfg.Steps != 200 {
		t.Errorf("llama-tiny defaults: %d layers, %d steps, %v", cfg.Layers, cfg.Steps, err)
	}
	if _, _, err := ExportTensors(nil, cfg, FormatNanoGPT); err == nil || !strings.Contains(err.Error(), "--format hf") {
		t.Errorf("exporting a Llama as nanoGPT: %v", err)
	}
}

func tokenSchema(vocab int) dataset.Schema {
	return dataset.Schema{Kind: dataset.KindTokens, TokenDType: "uint32", SeqLen: 2048, VocabSize: vocab}
}
