package engine

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spill-ml/spill/kernels"
)

func writeTOML(t *testing.T, s string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "train.toml")
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadConfig(t *testing.T) {
	p := writeTOML(t, `
model = "gpt2-124m"
steps = 1000
eval_every = 0
grad_clip = 0
device_memory = "512MiB"
hidden = []
`)
	cfg, err := LoadConfig(p)
	if err != nil {
		t.Fatal(err)
	}
	cfg.EnsureDefaults()
	if cfg.Model != "gpt2-124m" || cfg.Steps != 1000 || cfg.DeviceMemory != 512<<20 {
		t.Errorf("file values not applied: %+v", cfg)
	}
	// Explicit zeros that mean "off" stay off; unset keys keep defaults.
	if cfg.EvalEvery != 0 || cfg.GradClip != 0 || cfg.WeightDecay != 0.1 || cfg.Seed != 1337 {
		t.Errorf("defaults/zeros wrong: eval_every %d grad_clip %v weight_decay %v seed %d", cfg.EvalEvery, cfg.GradClip, cfg.WeightDecay, cfg.Seed)
	}
	// Preset-dependent defaults.
	if cfg.Layers != 12 || cfg.Heads != 12 || cfg.Embd != 768 || cfg.MaxSeq != 1024 || cfg.LR != 6e-4 ||
		cfg.MinLR != cfg.LR/10 || cfg.Warmup != 50 {
		t.Errorf("preset defaults: %+v", cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}

	// An integer device_memory works too.
	cfg, err = LoadConfig(writeTOML(t, "device_memory = 1024\n"))
	if err != nil || cfg.DeviceMemory != 1024 {
		t.Errorf("integer device_memory: %d, %v", cfg.DeviceMemory, err)
	}
}

func TestLoadConfigErrors(t *testing.T) {
	p := writeTOML(t, "model = \"tiny\"\nbatchsize = 4\n[optim]\nlr2 = 1\n")
	_, err := LoadConfig(p)
	if err == nil || !strings.Contains(err.Error(), "batchsize") || !strings.Contains(err.Error(), "optim") || !strings.Contains(err.Error(), p) {
		t.Errorf("unknown keys: %v", err)
	}
	_, err = LoadConfig(writeTOML(t, "steps = \"many\"\n"))
	if err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Errorf("type error: %v", err)
	}
	_, err = LoadConfig(writeTOML(t, "device_memory = \"lots\"\n"))
	if err == nil || !strings.Contains(err.Error(), "lots") {
		t.Errorf("bad byte size: %v", err)
	}
}

func TestDefaultConfigValid(t *testing.T) {
	c := DefaultConfig()
	c.EnsureDefaults()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.Steps != 200 || c.LR != 1e-3 || c.Warmup != 10 || c.MinLR != 1e-4 || c.Layers == 0 {
		t.Errorf("tiny defaults: %+v", c)
	}
	before := c
	c.EnsureDefaults()
	if c.Hash() != before.Hash() || c.Warmup != before.Warmup {
		t.Error("EnsureDefaults is not idempotent")
	}
	var z Config
	z.EnsureDefaults()
	if err := z.Validate(); err != nil {
		t.Errorf("zero config after EnsureDefaults: %v", err)
	}
}

func TestValidateReportsEverything(t *testing.T) {
	c := DefaultConfig()
	c.EnsureDefaults()
	c.Model = "gpt5"
	c.Batch = 0
	c.LR = -1
	c.Beta2 = 1
	c.Precision = "int4"
	c.Device = "tpu"
	c.Resume = true
	c.Embd, c.Heads = 100, 3
	c.EvalFraction = 1
	err := c.Validate()
	if err == nil {
		t.Fatal("no error")
	}
	for _, key := range []string{"model:", "batch:", "lr:", "beta2:", "precision:", "device:", "resume:", "embd:", "eval_fraction:"} {
		if !strings.Contains(err.Error(), key) {
			t.Errorf("error does not mention %s:\n%v", key, err)
		}
	}
	var joined interface{ Unwrap() []error }
	if !errors.As(err, &joined) || len(joined.Unwrap()) < 9 {
		t.Errorf("not one error per problem: %v", err)
	}
}

func TestHash(t *testing.T) {
	a := DefaultConfig()
	a.EnsureDefaults()
	b := a
	b.Steps, b.CheckpointDir, b.Metrics, b.Device, b.DeviceMemory, b.Threads, b.Resume = 5000, "x", "y", "cuda", 1<<30, 2, true
	if a.Hash() != b.Hash() {
		t.Error("hash depends on fields that do not define the math")
	}
	if d := a.MathDiff(&b); len(d) != 0 {
		t.Errorf("MathDiff = %v", d)
	}
	for name, mut := range map[string]func(*Config){
		"seed":   func(c *Config) { c.Seed++ },
		"lr":     func(c *Config) { c.LR *= 1.0000001 },
		"layers": func(c *Config) { c.Layers++ },
		"hidden": func(c *Config) { c.Hidden = []int{3} },
		"batch":  func(c *Config) { c.Batch++ },
	} {
		c := a
		mut(&c)
		if c.Hash() == a.Hash() {
			t.Errorf("changing %s keeps the hash", name)
		}
		if d := a.MathDiff(&c); len(d) != 1 || !strings.HasPrefix(d[0], name+":") {
			t.Errorf("MathDiff after changing %s = %v", name, d)
		}
	}
	if len(a.Hash()) != 64 {
		t.Errorf("hash %q is not hex sha256", a.Hash())
	}
}

func TestParseByteSize(t *testing.T) {
	for in, want := range map[string]int64{"512MiB": 512 << 20, "1.5 GB": 1500000000, "2gib": 2 << 30, "4096": 4096, "10B": 10, "1k": 1024, "16G": 16 << 30, "16GB": 16e9} {
		got, err := kernels.ParseBytes(in)
		if err != nil || got != want {
			t.Errorf("kernels.ParseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "MiB", "-1MiB", "1 XB", "1e400", "NaN"} {
		if _, err := kernels.ParseBytes(in); err == nil {
			t.Errorf("kernels.ParseBytes(%q): no error", in)
		}
	}
	if s := kernels.FormatBytes(512 << 20); s != "512.0 MiB" {
		t.Errorf("kernels.FormatBytes = %q", s)
	}
}

func TestConfigTOMLRoundTrip(t *testing.T) {
	c := DefaultConfig()
	c.Model = "mlp"
	c.EnsureDefaults()
	var b strings.Builder
	if err := c.WriteTOML(&b); err != nil {
		t.Fatal(err)
	}
	back, err := LoadConfig(writeTOML(t, b.String()))
	if err != nil {
		t.Fatalf("%v\n%s", err, b.String())
	}
	if back.Hash() != c.Hash() || back.Device != c.Device {
		t.Errorf("round trip changed the config:\n%s", b.String())
	}
}

// TestDeviceAuto: the default device is auto, which validates and opens the
// CPU backend in a build without the CUDA backend (with it, see
// kernels/cuda); a named device opens exactly that backend.
func TestDeviceAuto(t *testing.T) {
	c := DefaultConfig()
	c.EnsureDefaults()
	if c.Device != DeviceAuto {
		t.Fatalf("default device %q, want %q", c.Device, DeviceAuto)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("auto does not validate: %v", err)
	}
	want := "cpu"
	if slices.Contains(kernels.Backends(), "cuda") {
		want = "cuda"
	}
	be, note, err := OpenDevice(DeviceAuto, kernels.Config{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	if be.Name() != want && note == "" {
		t.Errorf("auto opened %q without a note, want %q", be.Name(), want)
	}
	if _, _, err := OpenDevice("tpu", kernels.Config{}); err == nil {
		t.Error("OpenDevice(tpu) succeeded")
	}
}
