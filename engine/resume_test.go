package engine

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFindCheckpointSkipsIncomplete: a newest checkpoint with a truncated
// state.json, or with a file it lists missing, is skipped with a reason
// that names it, and the next older complete one is returned.
func TestFindCheckpointSkipsIncomplete(t *testing.T) {
	dir := t.TempDir()
	for _, step := range []int{10, 20, 30} {
		if _, err := SaveCheckpoint(dir, testCheckpoint(step), 0); err != nil {
			t.Fatal(err)
		}
	}
	st := filepath.Join(CheckpointPath(dir, 30), CheckpointStateFile)
	b, _ := os.ReadFile(st)
	os.WriteFile(st, b[:len(b)/2], 0o644)
	os.Remove(filepath.Join(CheckpointPath(dir, 20), CheckpointOptimFile))

	path, skipped, err := FindCheckpoint(dir)
	if err != nil || path != CheckpointPath(dir, 10) {
		t.Fatalf("FindCheckpoint = %q, %v; want step 10", path, err)
	}
	if len(skipped) != 2 || !strings.Contains(skipped[0].Error(), "step-00000030") || !strings.Contains(skipped[0].Error(), "corrupt state") ||
		!strings.Contains(skipped[1].Error(), "step-00000020") || !strings.Contains(skipped[1].Error(), CheckpointOptimFile) {
		t.Errorf("skipped = %v", skipped)
	}
	// ResolveResume warns once per skipped checkpoint and records the pick.
	cfg := DefaultConfig()
	cfg.CheckpointDir, cfg.Resume = dir, true
	var warned []error
	if err := ResolveResume(&cfg, func(err error) { warned = append(warned, err) }); err != nil || cfg.ResumeFrom != CheckpointPath(dir, 10) || len(warned) != 2 {
		t.Errorf("ResolveResume: %v, from %q, warnings %v", err, cfg.ResumeFrom, warned)
	}
	// An explicit ResumeFrom must be complete.
	cfg = DefaultConfig()
	cfg.ResumeFrom = CheckpointPath(dir, 20)
	if err := ResolveResume(&cfg, nil); err == nil || !strings.Contains(err.Error(), CheckpointOptimFile) {
		t.Errorf("resume from an incomplete checkpoint: %v", err)
	}
	// A corrupt file refused by LoadCheckpoint names an older checkpoint to resume from.
	os.WriteFile(filepath.Join(CheckpointPath(dir, 10), CheckpointModelFile), []byte("junk"), 0o644)
	SaveCheckpoint(dir, testCheckpoint(5), 0)
	if _, err := LoadCheckpoint(CheckpointPath(dir, 10)); err == nil || !strings.Contains(err.Error(), "--resume-from "+CheckpointPath(dir, 5)) {
		t.Errorf("corrupt checkpoint: %v", err)
	}
}

// TestResolveResumePinsWarmup: resuming with only a higher Steps keeps the
// checkpoint's derived warmup (steps/20), so the config still matches.
func TestResolveResumePinsWarmup(t *testing.T) {
	dir := t.TempDir()
	ck := testCheckpoint(200)
	ck.State.Config.Steps, ck.State.Config.Warmup = 200, 10
	ck.State.ConfigHash = ck.State.Config.Hash()
	if _, err := SaveCheckpoint(dir, ck, 0); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.CheckpointDir, cfg.Resume, cfg.Steps = dir, true, 250
	if err := ResolveResume(&cfg, nil); err != nil {
		t.Fatal(err)
	}
	cfg.EnsureDefaults()
	if cfg.Warmup != 10 {
		t.Fatalf("warmup %d, want the checkpoint's 10 (250/20 = 12)", cfg.Warmup)
	}
	if err := CheckResume(&ck.State, &cfg); err != nil {
		t.Errorf("extending the run: %v", err)
	}
	// A warmup the user gives is kept (and then refused if it differs).
	cfg = DefaultConfig()
	cfg.CheckpointDir, cfg.Resume, cfg.Steps, cfg.Warmup = dir, true, 250, 12
	ResolveResume(&cfg, nil)
	cfg.EnsureDefaults()
	if err := CheckResume(&ck.State, &cfg); err == nil || !strings.Contains(err.Error(), "warmup") {
		t.Errorf("explicit warmup 12: %v", err)
	}
}

// TestTruncateMetrics: the lines after the resumed checkpoint's step, and
// a line cut by a kill, are dropped; earlier lines are kept byte for byte.
func TestTruncateMetrics(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.jsonl")
	keep := `{"step":1,"loss":5}` + "\n" + `{"step":2,"loss":4}` + "\n"
	os.WriteFile(path, []byte(keep+`{"step":3,"loss":3}`+"\n"+`{"step":4,"lo`), 0o644)
	if err := TruncateMetrics(path, 2); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != keep {
		t.Errorf("after truncation: %q", b)
	}
	if err := TruncateMetrics(path, 5); err != nil { // nothing to cut
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != keep {
		t.Errorf("after a no-op truncation: %q", b)
	}
	if err := TruncateMetrics(filepath.Join(t.TempDir(), "none"), 3); err != nil {
		t.Errorf("missing file: %v", err)
	}
}

// TestReporterErr: Run stops at a lost metrics line; ReporterErr sees the
// JSONL reporter's error through MultiReporter.
func TestReporterErr(t *testing.T) {
	jr, err := NewJSONLReporter("/dev/full")
	if err != nil {
		t.Skip("no /dev/full:", err)
	}
	defer jr.Close()
	r := MultiReporter(ReporterFunc(func(StepMetrics) {}), jr)
	if ReporterErr(r) != nil {
		t.Fatal("error before any report")
	}
	r.Report(StepMetrics{Step: 1})
	if err := ReporterErr(r); err == nil || !strings.Contains(err.Error(), "/dev/full") || !errors.Is(err, jr.Err()) {
		t.Errorf("ReporterErr = %v", err)
	}
}
