package engine

import (
	"cmp"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spill-ml/spill/dataset"
	"github.com/spill-ml/spill/offload"
	"github.com/spill-ml/spill/offload/plan"
)

// h200Runs is testdata/h200/measured.json: the step times measured on the
// H200 (tools/bench/ooc_h200.sh) of runs whose plans (spill train
// --plan-json) lie beside it.
type h200Runs struct {
	Date, Commit string
	Runs         map[string]struct {
		Measured float64 `json:"measured_step_time_s"`
		Command  string  `json:"command"`
		// Commit and Date, when set, are the run's (else the file's);
		// Vocab is the data's vocabulary (default 50304).
		Commit, Date string
		Vocab        int
	}
}

// nearSplit: the optimizer split of the planner today and of the measured
// run differ by at most one layer on the device (the exact peak that
// decides it moves with the planner's accounting of small buffers).
func nearSplit(a, b [3]int) bool {
	return a[2] == b[2] && a[0]-b[0] <= 1 && b[0]-a[0] <= 1
}

// TestTimeModelH200 holds the planner's time model to the step times the
// H200 measured: for each run, the planner predicts the step time of the
// very placement that run trained with (the same micro-batch, order,
// tiers, optimizer split and activation policies, under the same budgets,
// with the default H200 profile), and the prediction must be within
// timeModelTolerance of the measurement. A run whose copies could not
// overlap its compute (activation offload: 2.57 s measured where a model
// that let the whole step's copies hide behind its whole compute said
// 1.31 s) is what this guards against.
func TestTimeModelH200(t *testing.T) {
	const timeModelTolerance = 0.15
	data, err := os.ReadFile(filepath.Join("testdata", "h200", "measured.json"))
	if err != nil {
		t.Fatal(err)
	}
	var runs h200Runs
	if err := json.Unmarshal(data, &runs); err != nil {
		t.Fatal(err)
	}
	if len(runs.Runs) == 0 {
		t.Fatal("no measured runs")
	}
	for name, run := range runs.Runs {
		t.Run(name, func(t *testing.T) {
			raw, err := os.ReadFile(filepath.Join("testdata", "h200", name+".plan.json"))
			if err != nil {
				t.Fatal(err)
			}
			var want offload.Placement
			if err := json.Unmarshal(raw, &want); err != nil {
				t.Fatal(err)
			}
			cfg := DefaultConfig()
			cfg.Model, cfg.SeqLen, cfg.Vocab = want.Model, want.SeqLen, cmp.Or(run.Vocab, 50304)
			cfg.EnsureDefaults()
			m, err := BuildModel(&cfg, dataset.Schema{Kind: dataset.KindTokens, SeqLen: want.SeqLen, VocabSize: cfg.Vocab})
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range want.Notes {
				if strings.HasPrefix(n, "lean:") {
					m.SetLeanActivations(true)
				}
			}
			if m.NumParams() != want.Params {
				t.Fatalf("model %s has %d parameters, the run's %d", want.Model, m.NumParams(), want.Params)
			}
			same := func(p *offload.Placement) bool {
				return p.MicroBatch == want.MicroBatch && p.Group == want.Group && p.Weights == want.Weights &&
					p.Grads == want.Grads && p.Optimizer == want.Optimizer &&
					p.Keep == want.Keep && p.Offload == want.Offload && p.Recompute == want.Recompute &&
					p.CheckpointsOnHost == want.CheckpointsOnHost && p.Selective == want.Selective && p.SpeculativeUpdate == want.SpeculativeUpdate && (p.Optimizer == offload.TierDevice || p.PrefetchDepth == want.PrefetchDepth)
			}
			// The run's split of the optimizer state: none on the device
			// pins it off the device; otherwise at most the run's first
			// layers (the planner puts as many there as fit, and a later
			// compiler may leave room for more).
			var optTier offload.Tier
			if want.Optimizer != offload.TierDevice && want.OptimizerLayers[0] == 0 {
				optTier = offload.TierHost
			}
			hw := offload.H200()
			hw.DeviceReserve = 256 << 20 // as planRequest sets it for CUDA
			var budgets offload.Budgets
			budgets.Device, budgets.Host, budgets.Disk = want.Memory[0].Budget, want.Memory[1].Budget, want.Memory[2].Budget
			got, err := plan.Plan(plan.Request{Model: PlanModel(want.Model, m, want.SeqLen), Batch: want.Batch,
				Budgets: budgets, Hardware: hw, Allow: same, GlobalNorm: true, NoSpeculation: !want.SpeculativeUpdate, HostExtra: want.Memory[1].ByClass[offload.Workspace],
				Optimizer: optTier, MaxDeviceOptimizerLayers: want.OptimizerLayers[0]})
			if err != nil {
				t.Fatalf("the planner cannot place the run's placement: %v", err)
			}
			if !nearSplit(got.OptimizerLayers, want.OptimizerLayers) {
				t.Fatalf("the planner splits the optimizer state %v, the run %v", got.OptimizerLayers, want.OptimizerLayers)
			}
			r := got.StepTime / run.Measured
			t.Logf("%s: predicted %.3f s, measured %.3f s (%.2fx); %s", name, got.StepTime, run.Measured, r, got.Summary())
			if r < 1-timeModelTolerance || r > 1+timeModelTolerance {
				t.Errorf("predicted step %.3f s is %.2fx the %.3f s measured on the H200 (%s, commit %s): outside ±%.0f%%",
					got.StepTime, r, run.Measured, cmp.Or(run.Date, runs.Date), cmp.Or(run.Commit, runs.Commit), 100*timeModelTolerance)
			}
		})
	}
}
