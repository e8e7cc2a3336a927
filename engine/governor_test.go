package engine

import (
	"errors"
	"strings"
	"testing"

	"github.com/spill-ml/spill/kernels"
	"github.com/spill-ml/spill/offload"
	"github.com/spill-ml/spill/offload/plan"
)

// withMemAvailable makes the run read avail as MemAvailable until the test
// ends.
func withMemAvailable(t *testing.T, avail int64) {
	t.Helper()
	old := readHostLimits
	readHostLimits = func() (offload.Limits, error) { return offload.Limits{Memlock: -1, MemAvailable: avail}, nil }
	t.Cleanup(func() { readHostLimits = old })
}

// TestHostGovernor: a run configured with more host memory than the
// system has free (MemAvailable, injected) says so and is planned again
// for what is free less the margin, before anything is allocated: the
// optimizer state of the last layers moves to disk, the trainer holds
// exactly the host bytes planned, all of the run's planned host memory
// stays within what was free, and it trains bit for bit as the resident
// run. With almost nothing free, the run is refused with both figures
// and the planner's shortfall, before any allocation.
// specBytes is the host memory of p's speculative update (plan.SpecState).
func specBytes(m *Model, p *offload.Placement) int64 {
	if !p.SpeculativeUpdate {
		return 0
	}
	params, tiers := make([]int64, len(p.Layers)), make([]offload.Tier, len(p.Layers))
	for i, l := range p.Layers {
		params[i], tiers[i] = l.Params, l.Optimizer
	}
	var n int64
	for _, v := range plan.SpecState(params, int64(m.DType.Size()), m.DType != kernels.F32, tiers) {
		n += v
	}
	return n
}

func TestHostGovernor(t *testing.T) {
	m := mustGPT(t)
	cfg := DefaultConfig()
	cfg.Model, cfg.Layers, cfg.Heads, cfg.Embd, cfg.Vocab, cfg.MaxSeq = "custom", oocShape.Layers, oocShape.Heads, oocShape.Embd, oocShape.Vocab, oocShape.MaxSeq
	cfg.Accum, cfg.GradClip = oocAccum, 1
	cfg.DeviceMemory, cfg.HostMemory = stateBytes(m)/2, 1<<40
	cfg.DiskDir, cfg.DiskMemory = t.TempDir(), 64<<20

	// Plenty free: the configured budget stands.
	withMemAvailable(t, 1<<50)
	tp, _, err := choosePlan(&cfg, "cpu", m, oocB, oocT, cfg.DeviceMemory, nil)
	if err != nil {
		t.Fatal(err)
	}
	if tp.Resident || tp.Placement.OptimizerLayers[2] != 0 {
		t.Fatalf("with a roomy host: plan %s", tp.Placement.Summary())
	}
	// What the plan needs without the speculative update's second copy,
	// which the planner drops first when the host is short.
	need := tp.Placement.Memory[1].Peak - specBytes(m, tp.Placement)

	// 60% of that free after the margin: planned again, with disk.
	left := need * 6 / 10
	withMemAvailable(t, left+HostMargin(left+2<<30))
	be, err := kernels.Open("cpu", kernels.Config{Threads: 2, MemoryLimit: cfg.DeviceMemory})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	tr, tp, err := newRunTrainer(&cfg, be, m, oocB, oocT, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	t.Logf("%s; %s", tp.HostNote, tp.Placement.Summary())
	if !strings.Contains(tp.HostNote, "MemAvailable is") || !strings.Contains(tp.HostNote, "planned again for "+kernels.FormatBytes(left)) {
		t.Errorf("host note %q", tp.HostNote)
	}
	h := tp.Placement.Memory[1]
	if tp.Placement.OptimizerLayers[2] == 0 || h.Peak > left || h.Budget != left {
		t.Errorf("planned again: %s, host peak %d, budget %d, left %d", tp.Placement.Summary(), h.Peak, h.Budget, left)
	}
	if got, want := tr.HostBytes(), h.Peak-h.Reserve-h.ByClass[offload.Workspace]; got != want {
		t.Errorf("the trainer holds %d host bytes, the plan %d", got, want)
	}
	if h.ByClass[offload.Workspace] != RunHostExtra(&cfg, m, oocB, oocT) {
		t.Errorf("host workspace %d, the run's extra %d", h.ByClass[offload.Workspace], RunHostExtra(&cfg, m, oocB, oocT))
	}
	gotL, gotW := trainSteps(t, tr, 2)
	res, err := NewTrainer(openCPU(t), mustGPT(t), tr.opts)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Close()
	wantL, wantW := trainSteps(t, res, 2)
	sameRun(t, "resident", wantL, gotL, wantW, gotW)

	// Almost nothing free: refused before allocating, saying why.
	withMemAvailable(t, 2<<30+16<<10)
	be2, err := kernels.Open("cpu", kernels.Config{Threads: 2, MemoryLimit: cfg.DeviceMemory})
	if err != nil {
		t.Fatal(err)
	}
	defer be2.Close()
	_, _, err = newRunTrainer(&cfg, be2, m, oocB, oocT, nil, nil)
	var ie *offload.InfeasibleError
	if !errors.As(err, &ie) {
		t.Fatalf("error %v, want an *offload.InfeasibleError", err)
	}
	for _, w := range []string{"MemAvailable is 2.0 GiB", "16.0 KiB is left for this run", "host short by"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("refusal lacks %q: %v", w, err)
		}
	}
	if ms := be2.MemStats(); ms.Allocs != 0 {
		t.Errorf("%d device allocations before the refusal", ms.Allocs)
	}
}
