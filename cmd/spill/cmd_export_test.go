package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spill-ml/spill/engine"
)

// saveTinyCheckpoint writes a checkpoint of a 1-block GPT with C=4, V=7.
func saveTinyCheckpoint(t *testing.T, root string, step int) string {
	t.Helper()
	const C, V, T = 4, 7, 5
	var ws []engine.NamedTensor
	add := func(name string, shape ...int) {
		n := 1
		for _, d := range shape {
			n *= d
		}
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(i)
		}
		ws = append(ws, engine.F32Tensor(name, shape, v))
	}
	add("transformer.wte.weight", V, C)
	add("transformer.wpe.weight", T, C)
	for _, p := range []struct {
		n string
		s []int
	}{{"ln_1.weight", []int{C}}, {"ln_1.bias", []int{C}}, {"attn.c_attn.weight", []int{3 * C, C}}, {"attn.c_attn.bias", []int{3 * C}},
		{"attn.c_proj.weight", []int{C, C}}, {"attn.c_proj.bias", []int{C}}, {"ln_2.weight", []int{C}}, {"ln_2.bias", []int{C}},
		{"mlp.c_fc.weight", []int{4 * C, C}}, {"mlp.c_fc.bias", []int{4 * C}}, {"mlp.c_proj.weight", []int{C, 4 * C}}, {"mlp.c_proj.bias", []int{C}}} {
		add("transformer.h.0."+p.n, p.s...)
	}
	add("transformer.ln_f.weight", C)
	add("transformer.ln_f.bias", C)
	cfg := engine.DefaultConfig()
	cfg.Layers, cfg.Heads, cfg.Embd, cfg.Vocab, cfg.MaxSeq = 1, 2, C, V, T
	cfg.EnsureDefaults()
	p, err := engine.SaveCheckpoint(root, &engine.Checkpoint{
		State:   engine.TrainState{Step: step, Config: cfg, ConfigHash: cfg.Hash()},
		Weights: ws,
	}, 0)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestExportCommand(t *testing.T) {
	root := t.TempDir()
	older := saveTinyCheckpoint(t, root, 10)
	newest := saveTinyCheckpoint(t, root, 20)
	// --from also takes one step directory (it looked for step-* inside it).
	stepOut := filepath.Join(t.TempDir(), "step.safetensors")
	var so bytes.Buffer
	if code := runMain(context.Background(), []string{"export", "--from", older, "--out", stepOut}, &so, os.Stderr); code != exitOK || !strings.Contains(so.String(), older) {
		t.Fatalf("--from a step directory: exit %d: %s", code, so.String())
	}
	hfDir := filepath.Join(t.TempDir(), "gpt2-hf")
	var stdout bytes.Buffer
	if code := runMain(context.Background(), []string{"export", "--from", root, "--out", hfDir, "--format", "hf"}, &stdout, os.Stderr); code != exitOK {
		t.Fatalf("exit %d", code)
	}
	if !strings.Contains(stdout.String(), newest) {
		t.Errorf("did not export the newest checkpoint: %s", stdout.String())
	}
	ts, meta, err := engine.ReadSafetensors(filepath.Join(hfDir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	shapes := map[string]string{}
	for _, x := range ts {
		shapes[x.Name] = fmt.Sprint(x.Shape)
	}
	// 16 tensors: the tied lm_head is left out, as save_pretrained does.
	if len(ts) != 16 || shapes["transformer.h.0.attn.c_attn.weight"] != "[4 12]" || shapes["transformer.h.0.mlp.c_proj.weight"] != "[16 4]" ||
		shapes["lm_head.weight"] != "" || meta["format"] != "pt" {
		t.Errorf("hf export: %v %v", shapes, meta)
	}
	if cj, err := os.ReadFile(filepath.Join(hfDir, "config.json")); err != nil || !strings.Contains(string(cj), `"GPT2LMHeadModel"`) || !strings.Contains(string(cj), `"n_layer": 1`) {
		t.Errorf("config.json: %v\n%s", err, cj)
	}
	// The directory exists now: a second export refuses to mix into it.
	if code := runMain(context.Background(), []string{"export", "--from", root, "--out", hfDir, "--format", "hf"}, io.Discard, io.Discard); code != exitFailure {
		t.Errorf("export over a non-empty directory: exit %d", code)
	}
	// Sharded: 1 KB per file splits the 1.6 KB model.
	sharded := filepath.Join(t.TempDir(), "sharded")
	if code := runMain(context.Background(), []string{"export", "--from", root, "--out", sharded, "--format", "hf", "--shard-size", "1KB"}, io.Discard, os.Stderr); code != exitOK {
		t.Fatalf("sharded: exit %d", code)
	}
	if _, err := os.Stat(filepath.Join(sharded, "model.safetensors.index.json")); err != nil {
		t.Errorf("sharded export has no index: %v", err)
	}
	out := filepath.Join(t.TempDir(), "model.safetensors")
	// nanogpt from an explicit checkpoint keeps (out, in).
	if code := runMain(context.Background(), []string{"export", "--checkpoint", newest, "--out", out}, io.Discard, os.Stderr); code != exitOK {
		t.Fatalf("exit %d", code)
	}
	ts, _, _ = engine.ReadSafetensors(out)
	for _, x := range ts {
		if x.Name == "transformer.h.0.attn.c_attn.weight" && fmt.Sprint(x.Shape) != "[12 4]" {
			t.Errorf("nanogpt c_attn shape %v", x.Shape)
		}
	}
}

func TestExportCommandErrors(t *testing.T) {
	root := t.TempDir()
	p := saveTinyCheckpoint(t, root, 10)
	out := filepath.Join(t.TempDir(), "m.safetensors")
	run := func(args ...string) (int, string) {
		var errb bytes.Buffer
		code := runMain(context.Background(), append([]string{"export"}, args...), io.Discard, &errb)
		return code, errb.String()
	}
	for _, args := range [][]string{
		{"--out", out},
		{"--from", root, "--checkpoint", p, "--out", out},
		{"--from", root},
		{"--from", root, "--out", out, "--format", "onnx"},
	} {
		if code, _ := run(args...); code != exitUsage {
			t.Errorf("%v: exit %d, want %d", args, code, exitUsage)
		}
	}
	if code, msg := run("--from", t.TempDir(), "--out", out); code != exitFailure || !strings.Contains(msg, "no complete checkpoint") {
		t.Errorf("empty root: exit %d %s", code, msg)
	}
	// A corrupted checkpoint is refused, naming the file; nothing is written.
	model := filepath.Join(p, engine.CheckpointModelFile)
	data, _ := os.ReadFile(model)
	os.WriteFile(model, data[:len(data)-3], 0o644)
	if code, msg := run("--checkpoint", p, "--out", out); code != exitFailure || !strings.Contains(msg, model) {
		t.Errorf("corrupt checkpoint: exit %d %s", code, msg)
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("output written from a corrupt checkpoint")
	}
}
