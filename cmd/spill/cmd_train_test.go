package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spill-ml/spill/engine"
	"github.com/spill-ml/spill/kernels"
)

func TestTrainFlagsOverrideConfigFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "run.toml")
	os.WriteFile(file, []byte("model = \"gpt2-124m\"\nsteps = 300\nlr = 0.01\nbatch = 4\neval_every = 0\n"), 0o644)
	cfg, _, err := parseTrainArgs([]string{"--config", file, "--steps", "500", "--device-memory", "512MiB", "--grad-clip", "0", "--hidden", "8,4", "--model", "mlp"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Steps != 500 || cfg.DeviceMemory != 512<<20 || cfg.GradClip != 0 || cfg.Model != "mlp" || len(cfg.Hidden) != 2 || cfg.Hidden[1] != 4 {
		t.Errorf("flags not applied: %+v", cfg)
	}
	// Flags the user did not give leave the file's values alone.
	if cfg.LR != 0.01 || cfg.Batch != 4 || cfg.EvalEvery != 0 {
		t.Errorf("file values clobbered: lr %v batch %d eval_every %d", cfg.LR, cfg.Batch, cfg.EvalEvery)
	}
	// --gpu-mem-limit is --device-memory by another name.
	cfg, _, err = parseTrainArgs([]string{"--gpu-mem-limit", "3GiB"}, io.Discard)
	if err != nil || cfg.DeviceMemory != 3<<30 {
		t.Errorf("--gpu-mem-limit 3GiB: device memory %d, %v", cfg.DeviceMemory, err)
	}
	// Without a file: defaults, then the preset.
	cfg, _, err = parseTrainArgs([]string{"--model", "gpt2-350m"}, io.Discard)
	if err != nil || cfg.Layers != 24 || cfg.LR != 6e-4 || cfg.Seed != 1337 {
		t.Errorf("defaults: %+v, %v", cfg, err)
	}
}

func TestTrainUsageErrors(t *testing.T) {
	var errb bytes.Buffer
	code := runMain(context.Background(), []string{"train", "--model", "gpt9", "--batch", "-1", "--precision", "fp8"}, io.Discard, &errb)
	if code != exitUsage {
		t.Fatalf("exit %d, want %d", code, exitUsage)
	}
	for _, want := range []string{"model:", "batch:", "precision:"} {
		if !strings.Contains(errb.String(), want) {
			t.Errorf("stderr does not report %s:\n%s", want, errb.String())
		}
	}
	file := filepath.Join(t.TempDir(), "bad.toml")
	os.WriteFile(file, []byte("stepz = 3\n"), 0o644)
	errb.Reset()
	if code := runMain(context.Background(), []string{"train", "--config", file}, io.Discard, &errb); code != exitUsage || !strings.Contains(errb.String(), "stepz") {
		t.Errorf("unknown key: exit %d, %s", code, errb.String())
	}
	if code := runMain(context.Background(), []string{"train", "--device-memory", "lots"}, io.Discard, io.Discard); code != exitUsage {
		t.Errorf("bad --device-memory: exit %d", code)
	}
	if code := runMain(context.Background(), []string{"train", "extra"}, io.Discard, io.Discard); code != exitUsage {
		t.Errorf("positional argument: exit %d", code)
	}
	errb.Reset()
	if code := runMain(context.Background(), []string{"train", "--help"}, io.Discard, &errb); code != exitOK || !strings.Contains(errb.String(), "--resume") || !strings.Contains(errb.String(), "-device-memory") {
		t.Errorf("--help: exit %d\n%s", code, errb.String())
	}
}

func TestTrainPrintConfigRoundTrips(t *testing.T) {
	var out bytes.Buffer
	if code := runMain(context.Background(), []string{"train", "--print-config", "--steps", "77", "--seed", "9"}, &out, io.Discard); code != exitOK {
		t.Fatalf("exit %d", code)
	}
	file := filepath.Join(t.TempDir(), "printed.toml")
	os.WriteFile(file, out.Bytes(), 0o644)
	cfg, err := engine.LoadConfig(file)
	if err != nil {
		t.Fatalf("printed config does not load: %v\n%s", err, out.String())
	}
	if cfg.Steps != 77 || cfg.Seed != 9 {
		t.Errorf("printed config: %+v", cfg)
	}
}

// TestTrainMetricsWriteError: a metrics file that cannot be written (a full
// disk) fails the run with the path named; the run stops at the first lost
// line, and no "finished" summary appears on stdout.
func TestTrainMetricsWriteError(t *testing.T) {
	if _, err := os.Stat("/dev/full"); err != nil {
		t.Skip("no /dev/full")
	}
	var out, errb bytes.Buffer
	code := runMain(context.Background(), []string{"train", "--eval-every", "0", "--quiet", "--threads", "2",
		"--layers", "1", "--embd", "32", "--heads", "2", "--steps", "50", "--metrics", "/dev/full"}, &out, &errb)
	if code != exitFailure || !strings.Contains(errb.String(), "metrics /dev/full") {
		t.Fatalf("exit %d, stderr:\n%s", code, errb.String())
	}
	if strings.Contains(out.String(), "finished") {
		t.Errorf("a failed run printed a finished summary on stdout:\n%s", out.String())
	}
	if !strings.Contains(errb.String(), "failed at step 1 ") {
		t.Errorf("the run did not stop at the first lost line:\n%s", errb.String())
	}
}

// TestTrainZeroSettings: --batch 0 (and the like) is refused, not replaced
// by the default.
func TestTrainZeroSettings(t *testing.T) {
	for _, flag := range []string{"--batch", "--accum", "--eval-batches", "--checkpoint-every", "--keep-checkpoints"} {
		_, _, err := parseTrainArgs([]string{flag, "0"}, io.Discard)
		if err == nil || !strings.Contains(err.Error(), flag) {
			t.Errorf("%s 0: %v", flag, err)
		}
	}
	file := filepath.Join(t.TempDir(), "run.toml")
	os.WriteFile(file, []byte("batch = 0\n"), 0o644)
	if _, _, err := parseTrainArgs([]string{"--config", file}, io.Discard); err == nil || !strings.Contains(err.Error(), "batch") {
		t.Errorf("batch = 0 in a config file: %v", err)
	}
}

// TestTrainDeviceCUDAWithoutCUDA: --device cuda in a build without CUDA says
// how to build with it.
func TestTrainDeviceCUDAWithoutCUDA(t *testing.T) {
	if slices.Contains(kernels.Backends(), "cuda") {
		t.Skip("a cuda build")
	}
	var errb bytes.Buffer
	code := runMain(context.Background(), []string{"train", "--device", "cuda", "--steps", "1", "--quiet"}, io.Discard, &errb)
	if code != exitFailure || !strings.Contains(errb.String(), "rebuild with -tags cuda") {
		t.Errorf("exit %d: %s", code, errb.String())
	}
}

// TestTrainModelSummary: the log counts a GPT's blocks, not the embedding
// and head as layers.
func TestTrainModelSummary(t *testing.T) {
	var errb bytes.Buffer
	code := runMain(context.Background(), []string{"train", "--layers", "1", "--heads", "2", "--embd", "32", "--steps", "1",
		"--eval-every", "0", "--threads", "2", "--progress-every", "100"}, io.Discard, &errb)
	if code != exitOK || !strings.Contains(errb.String(), "model tiny: 1 block of width 32, 2 heads, vocabulary 257,") {
		t.Errorf("exit %d:\n%s", code, errb.String())
	}
}
