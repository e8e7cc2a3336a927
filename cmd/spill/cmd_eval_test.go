package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestInitFromFlags: --init-from takes the model and shape from
// config.json (--print-config shows them), a flag that disagrees is an
// error naming both, and spill eval reports the loss of fixed batches,
// the same twice.
func TestInitFromFlags(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	llama := filepath.Join("..", "..", "engine", "testdata", "hf-tiny-llama")
	var out, errb bytes.Buffer
	if code := runMain(context.Background(), []string{"train", "--init-from", llama, "--print-config"}, &out, &errb); code != exitOK {
		t.Fatalf("print-config: exit %d: %s", code, errb.String())
	}
	for _, want := range []string{`model = "llama-tiny"`, "layers = 2", "kv_heads = 2", "ffn = 64", "tie_embeddings = false", `rope_type = "llama3"`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("--print-config lacks %q:\n%s", want, out.String())
		}
	}
	errb.Reset()
	if code := runMain(context.Background(), []string{"train", "--init-from", llama, "--layers", "3", "--print-config"}, io.Discard, &errb); code == exitOK ||
		!strings.Contains(errb.String(), "num_hidden_layers = 2") || !strings.Contains(errb.String(), "--layers") {
		t.Errorf("--layers 3 over a 2-layer config.json: exit %d: %s", code, errb.String())
	}

	// 5 sequences of 16 tokens below the fixture's vocabulary of 64.
	bin := filepath.Join(t.TempDir(), "tokens.bin")
	raw := make([]byte, 2*(5*16+1))
	for i := 0; i < len(raw)/2; i++ {
		binary.LittleEndian.PutUint16(raw[2*i:], uint16((i*7+3)%64))
	}
	os.WriteFile(bin, raw, 0o644)
	data := filepath.Join(t.TempDir(), "data")
	if code := runMain(context.Background(), []string{"convert", "--out", data, "--seq-len", "16", "--vocab", "64", bin}, io.Discard, os.Stderr); code != exitOK {
		t.Fatalf("convert: exit %d", code)
	}
	var losses []float64
	for k := 0; k < 2; k++ {
		js := filepath.Join(t.TempDir(), "loss.json")
		args := []string{"eval", "--init-from", llama, "--data", data, "--batch", "2", "--eval-batches", "2", "--precision", "fp32", "--device", "cpu", "--quiet", "--json", js}
		out.Reset()
		if code := runMain(context.Background(), args, &out, os.Stderr); code != exitOK {
			t.Fatalf("eval: exit %d", code)
		}
		var res struct {
			Loss    float64 `json:"loss"`
			Rows    int     `json:"rows"`
			SeqLen  int     `json:"seq_len"`
			Batches int     `json:"batches"`
		}
		b, _ := os.ReadFile(js)
		if err := json.Unmarshal(b, &res); err != nil || res.Rows != 2 || res.SeqLen != 16 || res.Batches != 2 || !(res.Loss > 0) {
			t.Fatalf("eval --json: %v %s", err, b)
		}
		if !strings.HasPrefix(out.String(), "loss ") {
			t.Errorf("eval output: %s", out.String())
		}
		losses = append(losses, res.Loss)
	}
	if losses[0] != losses[1] {
		t.Errorf("two evaluations of the same batches: %v", losses)
	}
}
