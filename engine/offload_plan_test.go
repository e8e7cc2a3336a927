package engine

import (
	"context"
	"errors"
	"maps"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spill-ml/spill/kernels"
	"github.com/spill-ml/spill/offload"
)

// TestOffloadDeviceBytesExact: the predictor the planner uses gives the
// out-of-core trainer's own PredictedDevicePeak for every placement, and
// ResidentDeviceBytes what NewTrainer allocates, without building them.
func TestOffloadDeviceBytesExact(t *testing.T) {
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
		m, err := NewGPT(oocShape, dt)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range []OffloadOptions{
			streamed(),
			{Weights: offload.TierDevice, Grads: offload.TierHost, Optimizer: offload.TierHost, Prefetch: 2},
			{Weights: offload.TierHost, Grads: offload.TierDevice, Optimizer: offload.TierHost, Prefetch: 3, Activations: recomputeBlocks(m)},
			{Weights: offload.TierDevice, Grads: offload.TierDevice, Optimizer: offload.TierHost},
		} {
			be := openCPU(t)
			tr, err := NewOffloadTrainer(be, m, oocOptions(), o)
			if err != nil {
				t.Fatal(err)
			}
			got := mustBytes(t)(OffloadDeviceBytes(m, oocB, oocT, oocAccum, o))
			if want := tr.PredictedDevicePeak(); got != want {
				t.Errorf("%v %+v: OffloadDeviceBytes %d, trainer predicts %d", dt, o, got, want)
			}
			tr.Close()
		}
		be := openCPU(t)
		tr, err := NewTrainer(be, m, oocOptions())
		if err != nil {
			t.Fatal(err)
		}
		if got, want := byteClasses(ResidentDeviceBytes(m, oocB, oocT)).total(), be.MemStats().Allocated; got != want {
			t.Errorf("%v: ResidentDeviceBytes %d, NewTrainer allocated %d", dt, got, want)
		}
		tr.Close()
	}
}

// TestPlanTrainerFitsAndExplains: under 1/8 of the resident state the plan
// streams, its exact peak fits, overrides are honoured, and an impossible
// budget is an InfeasibleError.
func TestPlanTrainerFitsAndExplains(t *testing.T) {
	m, err := NewGPT(oocShape, kernels.F32)
	if err != nil {
		t.Fatal(err)
	}
	res := byteClasses(ResidentDeviceBytes(m, 2, oocT)).total()
	req := PlanRequest{Name: "ooc", B: 2, T: oocT, Accum: 1, Hardware: CPUHardware(2),
		Budgets: offload.Budgets{Device: res / 8, Host: 1 << 30}}
	p, err := PlanTrainer(m, req)
	if err != nil {
		t.Fatal(err)
	}
	if p.Resident || p.DevicePeak > req.Budgets.Device || p.Placement.Memory[0].Peak != p.DevicePeak || p.B*p.Accum != 2 {
		t.Fatalf("plan %+v (peak %d, budget %d)", p.Placement, p.DevicePeak, req.Budgets.Device)
	}
	// Roomy: resident at the full micro-batch.
	req.Budgets.Device = 2 * res
	if p, err = PlanTrainer(m, req); err != nil || !p.Resident || p.B != 2 {
		t.Fatalf("roomy plan %+v, %v", p, err)
	}
	// Overrides constrain the choice.
	req.Weights, req.Activations, req.Prefetch = offload.TierHost, "keep", 2
	if p, err = PlanTrainer(m, req); err != nil || p.Options.Weights != offload.TierHost || p.Options.Prefetch != 2 || p.Placement.Recompute != 0 {
		t.Fatalf("override plan %+v, %v", p, err)
	}
	req = PlanRequest{Name: "ooc", B: 2, T: oocT, Accum: 1, Hardware: CPUHardware(2), Budgets: offload.Budgets{Device: 4 << 10, Host: 1 << 30}}
	var ie *offload.InfeasibleError
	if _, err = PlanTrainer(m, req); !errors.As(err, &ie) || len(ie.Shortfalls) == 0 || ie.Shortfalls[0].Tier != offload.TierDevice {
		t.Fatalf("tiny budget: %v", err)
	}
}

// TestConfigOffloadValidation: the placement options are validated all at
// once, byte sizes with units load from TOML, and none of them changes the
// resume hash.
func TestConfigOffloadValidation(t *testing.T) {
	c := DefaultConfig()
	c.Offload, c.OffloadWeights, c.OffloadGrads, c.OffloadOptimizer = "sometimes", "nvme", "disk", "disk"
	c.Prefetch, c.Activations, c.HostMemory, c.DiskMemory = -1, "drop", -5, 1<<30
	c.EnsureDefaults()
	err := c.Validate()
	for _, key := range []string{"offload:", "offload_weights:", "offload_grads:", "offload_optimizer:", "prefetch:", "activations:", "host_memory:", "disk_memory:"} {
		if err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("Validate does not report %s: %v", key, err)
		}
	}
	c = DefaultConfig()
	c.Offload, c.OffloadWeights, c.Activations = OffloadNone, "host", "recompute"
	c.EnsureDefaults()
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "conflicts with offload = none") {
		t.Errorf("none with overrides: %v", err)
	}
	base := DefaultConfig()
	base.EnsureDefaults()
	if err := base.Validate(); err != nil || base.Offload != OffloadAuto {
		t.Fatalf("defaults: offload %q, %v", base.Offload, err)
	}
	placed := base
	placed.OffloadWeights, placed.OffloadGrads, placed.OffloadOptimizer, placed.Prefetch = "host", "host", "disk", 3
	placed.Activations, placed.HostMemory, placed.DiskDir, placed.DiskMemory, placed.Offload = "recompute", 1<<30, "/tmp", 1<<30, OffloadAuto
	if err := placed.Validate(); err != nil {
		t.Fatalf("valid placement: %v", err)
	}
	if base.Hash() != placed.Hash() || len(base.MathDiff(&placed)) != 0 {
		t.Errorf("placement options change the resume hash: %v", base.MathDiff(&placed))
	}
	file := filepath.Join(t.TempDir(), "run.toml")
	os.WriteFile(file, []byte("host_memory = \"2GiB\"\ndisk_memory = 1024\ndisk_dir = \"/tmp\"\noffload = \"none\"\n"), 0o644)
	lc, err := LoadConfig(file)
	if err != nil || lc.HostMemory != 2<<30 || lc.DiskMemory != 1024 || lc.Offload != OffloadNone {
		t.Errorf("LoadConfig: %+v, %v", lc, err)
	}
	// Both spellings of a model name are the same preset.
	a := DefaultConfig()
	a.Model = "gpt2"
	a.EnsureDefaults()
	if a.Model != "gpt2-124m" || a.Layers != 12 {
		t.Errorf("alias gpt2: model %q, %d layers", a.Model, a.Layers)
	}
	if p, ok := LookupPreset("gpt2-xl"); !ok || p.Layers != 48 || p.Embd != 1600 {
		t.Errorf("planner-only shape gpt2-xl: %+v %v", p, ok)
	}
}

// runLosses runs cfg and returns the losses of its steps by step number.
func runLosses(t *testing.T, cfg Config) (map[int]float64, *Summary) {
	t.Helper()
	losses := map[int]float64{}
	sum, err := Run(context.Background(), cfg, RunOptions{Reporter: ReporterFunc(func(m StepMetrics) { losses[m.Step] = m.Loss })})
	if err != nil {
		t.Fatal(err)
	}
	return losses, sum
}

// TestRunResumeAcrossPlacementFP32: a run checkpointed while training out
// of core under a small budget and resumed resident (a different placement,
// the same micro-batch) continues bit for bit in fp32, and the budgeted
// half kept its plan: peak within the budget, predicted = measured.
func TestRunResumeAcrossPlacementFP32(t *testing.T) {
	data := writeTokens(t, 32, 16, 4000)
	cfg := tinyConfig(data)
	cfg.Layers, cfg.Steps, cfg.CheckpointEvery, cfg.Warmup = 4, 4, 2, 1
	want, full := runLosses(t, cfg)
	resident := full.PeakDeviceBytes

	cfg.CheckpointDir = t.TempDir()
	cfg.Steps = 2
	cfg.DeviceMemory = resident * 3 / 4
	cfg.OffloadWeights, cfg.OffloadGrads = "host", "host"
	_, half := runLosses(t, cfg)
	if half.Plan == nil || half.Plan.Resident || half.Plan.B != cfg.Batch {
		t.Fatalf("budgeted half: plan %+v, want out of core at micro-batch %d", half.Plan, cfg.Batch)
	}
	if half.PeakDeviceBytes > cfg.DeviceMemory || half.PredictedDevicePeak < half.MeasuredDevicePeak ||
		float64(half.PredictedDevicePeak) > 1.15*float64(half.MeasuredDevicePeak) {
		t.Errorf("budget %d: backend peak %d, predicted %d, measured %d", cfg.DeviceMemory, half.PeakDeviceBytes,
			half.PredictedDevicePeak, half.MeasuredDevicePeak)
	}
	cfg.Steps, cfg.Resume, cfg.DeviceMemory = 4, true, 0
	cfg.OffloadWeights, cfg.OffloadGrads = "", ""
	got, _ := runLosses(t, cfg)
	for _, s := range []int{3, 4} {
		if math.Float64bits(got[s]) != math.Float64bits(want[s]) {
			t.Errorf("step %d: resumed loss %v, uninterrupted %v", s, got[s], want[s])
		}
	}
}

// TestRunSamplesStepTraces: without a trace file, a run out of core times
// the second step and every tenth after it, and only those: their metrics
// carry the breakdown (the exposed transfer time), the summary their
// mean; a resident run times none.
func TestRunSamplesStepTraces(t *testing.T) {
	data := writeTokens(t, 32, 16, 4000)
	cfg := tinyConfig(data)
	cfg.Layers, cfg.Steps, cfg.Warmup = 4, 13, 1
	for _, ooc := range []bool{true, false} {
		c := cfg
		if ooc {
			c.OffloadWeights, c.OffloadGrads = "host", "host"
		}
		traced := map[int]bool{}
		sum, err := Run(context.Background(), c, RunOptions{Reporter: ReporterFunc(func(m StepMetrics) {
			if m.Trace != nil {
				traced[m.Step] = m.Trace.Wall > 0
			}
		})})
		if err != nil {
			t.Fatal(err)
		}
		want := map[int]bool{}
		if ooc {
			want = map[int]bool{2: true, 12: true}
		}
		if !maps.Equal(traced, want) {
			t.Errorf("out of core %v: timed steps %v, want %v", ooc, traced, want)
		}
		if got := sum.MeanTrace != nil; got != ooc || len(sum.Breakdowns) != len(want) || sum.Trace != "" {
			t.Errorf("out of core %v: summary mean trace %v, %d breakdowns, trace file %q", ooc, sum.MeanTrace, len(sum.Breakdowns), sum.Trace)
		}
	}
}
