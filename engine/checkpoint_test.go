package engine

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/spill-ml/spill/dataset"
)

func testCheckpoint(step int) *Checkpoint {
	cfg := DefaultConfig()
	cfg.EnsureDefaults()
	w := float32(step)
	return &Checkpoint{
		State: TrainState{Step: step, Tokens: int64(step) * 512, Cursor: dataset.Cursor{Seed: 7, Epoch: 1, Position: int64(step) * 8},
			RNG: 0xdeadbeefcafef00d, LossScale: 65536, GoodSteps: 3, ConfigHash: cfg.Hash(), Config: cfg},
		Weights: []NamedTensor{F32Tensor("transformer.wte.weight", []int{2, 2}, []float32{w, 1, 2, 3})},
		Optim: []NamedTensor{
			F32Tensor("transformer.wte.weight.exp_avg", []int{2, 2}, []float32{0.1, 0.2, 0.3, w}),
			F32Tensor("transformer.wte.weight.exp_avg_sq", []int{2, 2}, []float32{1, 2, 3, 4}),
		},
	}
}

func TestCheckpointSaveLoadPrune(t *testing.T) {
	dir := t.TempDir()
	if p, err := LatestCheckpoint(filepath.Join(dir, "none")); p != "" || err != nil {
		t.Fatalf("LatestCheckpoint of missing dir = %q, %v", p, err)
	}
	var paths []string
	for _, step := range []int{10, 20, 30, 40} {
		p, err := SaveCheckpoint(dir, testCheckpoint(step), 2)
		if err != nil {
			t.Fatal(err)
		}
		if filepath.Base(p) != fmt.Sprintf("step-%08d", step) || p != CheckpointPath(dir, step) {
			t.Errorf("path %s", p)
		}
		paths = append(paths, p)
	}
	ents, _ := os.ReadDir(dir)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if !reflect.DeepEqual(names, []string{"step-00000030", "step-00000040"}) {
		t.Errorf("dir holds %v, want the last 2 checkpoints only", names)
	}
	latest, err := LatestCheckpoint(dir)
	if err != nil || latest != paths[3] {
		t.Fatalf("LatestCheckpoint = %q, %v", latest, err)
	}
	ck, err := LoadCheckpoint(latest)
	if err != nil {
		t.Fatal(err)
	}
	want := testCheckpoint(40)
	if ck.State.Step != 40 || ck.State.Cursor != want.State.Cursor || ck.State.RNG != want.State.RNG ||
		ck.State.ConfigHash != want.State.ConfigHash || ck.State.Config.Hash() != want.State.ConfigHash || len(ck.State.Files) != 2 {
		t.Errorf("state = %+v", ck.State)
	}
	if len(ck.Weights) != 1 || !bytes.Equal(ck.Weights[0].Data, want.Weights[0].Data) || len(ck.Optim) != 2 {
		t.Errorf("tensors = %+v / %+v", ck.Weights, ck.Optim)
	}
	// Saving the same step again replaces it.
	if _, err := SaveCheckpoint(dir, testCheckpoint(40), 2); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCheckpoint(latest); err != nil {
		t.Fatal(err)
	}
}

func TestCheckpointCorruption(t *testing.T) {
	dir := t.TempDir()
	p10, _ := SaveCheckpoint(dir, testCheckpoint(10), 0)
	p20, err := SaveCheckpoint(dir, testCheckpoint(20), 0)
	if err != nil {
		t.Fatal(err)
	}
	// A flipped byte in the model is refused, naming the file.
	model := filepath.Join(p20, CheckpointModelFile)
	data, _ := os.ReadFile(model)
	data[len(data)-1] ^= 1
	os.WriteFile(model, data, 0o644)
	if _, err := LoadCheckpoint(p20); err == nil || !strings.Contains(err.Error(), model) || !strings.Contains(err.Error(), "checksum") {
		t.Errorf("corrupted model: %v", err)
	}
	data[len(data)-1] ^= 1
	os.WriteFile(model, data, 0o644) // repaired
	// A truncated optimizer file likewise.
	optim := filepath.Join(p20, CheckpointOptimFile)
	data, _ = os.ReadFile(optim)
	os.WriteFile(optim, data[:len(data)/2], 0o644)
	if _, err := LoadCheckpoint(p20); err == nil || !strings.Contains(err.Error(), CheckpointOptimFile) {
		t.Errorf("truncated optimizer: %v", err)
	}
	// A missing file makes the checkpoint incomplete: Latest skips to the older one.
	os.Remove(optim)
	if l, err := LatestCheckpoint(dir); err != nil || l != p10 {
		t.Errorf("LatestCheckpoint with an incomplete newest = %q, %v; want %q", l, err, p10)
	}
	// A corrupt state.json is refused and skipped.
	state := filepath.Join(p10, CheckpointStateFile)
	os.WriteFile(state, []byte(`{"step": 10, "files": `), 0o644)
	if _, err := LoadCheckpoint(p10); err == nil || !strings.Contains(err.Error(), state) {
		t.Errorf("corrupt state: %v", err)
	}
	if l, err := LatestCheckpoint(dir); err != nil || l != "" {
		t.Errorf("LatestCheckpoint with none complete = %q, %v", l, err)
	}
	// Leftover temporary directories (a crash mid-save) are ignored and cleaned up.
	os.Mkdir(filepath.Join(dir, ".tmp-step-00000099-123"), 0o755)
	if _, err := SaveCheckpoint(dir, testCheckpoint(30), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, ".tmp-step-00000099-123")); err == nil {
		t.Error("stale temp dir not removed")
	}
}

func TestCheckResume(t *testing.T) {
	ck := testCheckpoint(100)
	cur := ck.State.Config
	cur.Steps = 1000 // raising steps is fine
	cur.CheckpointDir, cur.Metrics, cur.Threads = "elsewhere", "m.jsonl", 3
	if err := CheckResume(&ck.State, &cur); err != nil {
		t.Errorf("compatible resume refused: %v", err)
	}
	cur.LR *= 2
	cur.Batch = 16
	err := CheckResume(&ck.State, &cur)
	if err == nil || !strings.Contains(err.Error(), "lr: 0.001 -> 0.002") || !strings.Contains(err.Error(), "batch: 8 -> 16") {
		t.Errorf("incompatible resume: %v", err)
	}
	cur = ck.State.Config
	cur.Steps = 50
	if err := CheckResume(&ck.State, &cur); err == nil || !strings.Contains(err.Error(), "step 100") {
		t.Errorf("steps below checkpoint: %v", err)
	}
}
