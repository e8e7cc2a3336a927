package engine

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/spill-ml/spill/kernels"
	"github.com/spill-ml/spill/offload"
)

// splitTiers puts the optimizer state of the first dev layers on the
// device, of the last disk layers on disk and of the others on the host.
func splitTiers(n, dev, disk int) []offload.Tier {
	t := make([]offload.Tier, n)
	for i := range t {
		switch {
		case i < dev:
			t[i] = offload.TierDevice
		case i >= n-disk:
			t[i] = offload.TierDisk
		default:
			t[i] = offload.TierHost
		}
	}
	return t
}

// newSplit is an out-of-core trainer of the test GPT whose optimizer
// state is split across device, host and disk as splitTiers says, under a
// device budget of exactly its predicted peak.
func newSplit(t *testing.T, to TrainerOptions, o OffloadOptions, dev, disk int) (*Trainer, kernels.Backend) {
	t.Helper()
	m := mustGPT(t)
	n := len(m.Layers)
	o.Optimizer, o.OptimizerTiers = offload.TierDisk, splitTiers(n, dev, disk)
	o.DiskDir, o.DiskBudget = t.TempDir(), 64<<20
	if o.Activations == nil {
		o.Activations = recomputeBlocks(m)
	}
	return newOffloadAtPeak(t, m, to, o)
}

// TestOptimizerSplitBitwiseFP32: a GPT whose optimizer state is split
// across the device (the first layers, updated by the backend's AdamW),
// the host (host AdamW) and the disk (read ahead and written back around
// the host AdamW) trains to the resident run's losses and weights bit for
// bit, with clipping (updates after the global norm) and without (eager
// host updates), streamed or resident weights; the device peak is the
// programs' to the byte and within the budget; the residency table puts
// each layer's state on its tier.
func TestOptimizerSplitBitwiseFP32(t *testing.T) {
	const steps = 3
	for _, tc := range []struct {
		name string
		clip float64
		o    OffloadOptions
	}{
		{"streamed-clip", 1, streamed()},
		{"streamed-eager-layer-major", 0, func() OffloadOptions { o := streamed(); o.Group = 2; return o }()},
		{"resident-weights-eager", 0, OffloadOptions{Weights: offload.TierDevice, Grads: offload.TierHost, Prefetch: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			to := oocOptions()
			to.GradClip = tc.clip
			wantL, wantW := runResidentWith(t, kernels.F32, to, steps)
			const dev, disk = 5, 6
			tr, be := newSplit(t, to, tc.o, dev, disk)
			gotL, gotW := trainSteps(t, tr, steps)
			sameRun(t, "resident", wantL, gotL, wantW, gotW)
			if err := tr.ResidencyErr(); err != nil {
				t.Errorf("residency table: %v", err)
			}
			cs := tr.Cache().Stats()
			if pred := tr.PredictedDevicePeak(); cs.PeakAllocated != pred || pred > tr.off.opts.DeviceBudget {
				t.Errorf("device peak %d, predicted %d, budget %d", cs.PeakAllocated, pred, tr.off.opts.DeviceBudget)
			}
			if ms := be.MemStats(); ms.Peak > tr.off.opts.DeviceBudget {
				t.Errorf("backend peak %d over the budget %d", ms.Peak, tr.off.opts.DeviceBudget)
			}
			if cs.ByClass[offload.AdamM].Allocated == 0 {
				t.Error("no Adam moments on the device")
			}
			n := len(tr.model.Layers)
			for _, r := range tr.Residency() {
				i := r.Key.Layer
				want := ""
				switch {
				case i < dev:
					want = "device"
				case r.Key.Class == offload.AdamM || r.Key.Class == offload.AdamV:
					want = map[bool]string{true: "disk", false: "host"}[i >= n-disk]
				default:
					continue
				}
				if r.InFlight || r.Valid.String() != want {
					t.Errorf("%s valid on %s (in flight %v), want %s", r.Key, r.Valid, r.InFlight, want)
				}
			}
			var want int64 // each disk layer's moments read and written once a step
			for _, l := range tr.model.Layers[n-disk:] {
				want += steps * 16 * int64(l.NumParams())
			}
			if got := tr.off.host.diskBytes(); got != want {
				t.Errorf("the disk tier moved %d bytes in %d steps, want %d", got, steps, want)
			}
			if tr.Step != steps {
				t.Errorf("Step %d after %d steps", tr.Step, steps)
			}
			// The device layers' masters were filled through a bounded
			// set of host buffers, dropped once they were set.
			if d := &tr.off.host.dev; d.stage != nil || d.staged != 0 {
				t.Errorf("staging buffers for the device masters kept after the initialisation (%d made)", d.staged)
			}
			b, stage := tr.off.host.stageBuf()
			if n := cap(stage); n < 1 || int64(n)*int64(len(b)) > max(devStageBytes, int64(len(b))) {
				t.Errorf("%d staging buffers of %d bytes: over the bound of %d", n, len(b), devStageBytes)
			}
			stage <- b
			tr.off.host.dropStage()
		})
	}
}

// TestOptimizerSplitCheckpoint: the tensors a split trainer saves are the
// resident trainer's bit for bit (master and moments from each tier), and
// loading them into a fresh split trainer gives them back.
func TestOptimizerSplitCheckpoint(t *testing.T) {
	ctx := context.Background()
	to := oocOptions()
	m := mustGPT(t)
	res, err := NewTrainer(openCPU(t), m, to)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Close()
	trainSteps(t, res, 2)
	wantW, wantO, err := res.SaveTensors(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tr, _ := newSplit(t, to, streamed(), 4, 4)
	trainSteps(t, tr, 2)
	same := func(what string, w, o []NamedTensor) {
		t.Helper()
		for i, x := range append(append([]NamedTensor(nil), wantW...), wantO...) {
			y := append(append([]NamedTensor(nil), w...), o...)[i]
			if x.Name != y.Name || string(x.Data) != string(y.Data) {
				t.Fatalf("%s: tensor %s differs from the resident trainer's", what, x.Name)
			}
		}
	}
	gotW, gotO, err := tr.SaveTensors(ctx)
	if err != nil {
		t.Fatal(err)
	}
	same("saved", gotW, gotO)
	fresh, _ := newSplit(t, to, streamed(), 4, 4)
	if err := fresh.LoadTensors(ctx, wantW, wantO); err != nil {
		t.Fatal(err)
	}
	gotW, gotO, err = fresh.SaveTensors(ctx)
	if err != nil {
		t.Fatal(err)
	}
	same("loaded", gotW, gotO)
	w, _ := fresh.MasterWeights(ctx)
	if math.Float32bits(w[0][0]) != math.Float32bits(bytesF32(wantW[0].Data)[0]) {
		t.Error("MasterWeights of a device layer differ from what was loaded")
	}
}

// TestPlanTrainerSplitsOptimizer: when the host cannot hold the test
// GPT's optimizer state, the planner splits it across device, host and
// disk; the trainer built from the plan stays within the device budget
// with the predicted peak to the byte and trains bit for bit as the
// resident run; with the disk budget too small as well, the planner
// refuses and names what is short.
func TestPlanTrainerSplitsOptimizer(t *testing.T) {
	m := mustGPT(t)
	to := oocOptions()
	all, err := OffloadHostBytes(m, to.B, to.T, to.Accum, streamed())
	if err != nil {
		t.Fatal(err)
	}
	req := PlanRequest{Name: "split", B: to.B, T: to.T, Accum: to.Accum, Hardware: CPUHardware(2), DiskDir: t.TempDir(),
		GlobalNorm: true, Budgets: offload.Budgets{Device: stateBytes(m) / 2, Host: byteClasses(all).total() * 6 / 10, Disk: 64 << 20}}
	tp, err := PlanTrainer(m, req)
	if err != nil {
		t.Fatal(err)
	}
	n := tp.Placement.OptimizerLayers
	if tp.Resident || n[0] == 0 || n[1] == 0 || n[2] == 0 || len(tp.Options.OptimizerTiers) != len(m.Layers) {
		t.Fatalf("plan %s: want the optimizer split across device, host and disk", tp.Placement.Summary())
	}
	t.Logf("plan: %s; %s", tp.Placement.Summary(), tp.Placement.OptimizerWhy)
	be, err := kernels.Open("cpu", kernels.Config{Threads: 2, MemoryLimit: req.Budgets.Device})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	to.B, to.Accum = tp.B, tp.Accum
	tr, err := NewOffloadTrainer(be, m, to, tp.Options)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if got := tr.HostBytes(); got > req.Budgets.Host {
		t.Errorf("host bytes %d over the budget %d", got, req.Budgets.Host)
	}
	gotL, gotW := trainSteps(t, tr, 2)
	wantL, wantW := runResidentWith(t, kernels.F32, to, 2)
	sameRun(t, "resident", wantL, gotL, wantW, gotW)
	if peak := tr.Cache().Stats().PeakAllocated; peak != tp.DevicePeak || peak > req.Budgets.Device {
		t.Errorf("device peak %d, planned %d, budget %d", peak, tp.DevicePeak, req.Budgets.Device)
	}

	req.Budgets.Disk = 4 << 10
	_, err = PlanTrainer(m, req)
	var ie *offload.InfeasibleError
	if !errors.As(err, &ie) || len(ie.Shortfalls) == 0 {
		t.Fatalf("disk too small as well: %v", err)
	}
	for _, s := range ie.Shortfalls {
		if s.Need <= s.Budget || !strings.Contains(err.Error(), s.Tier.String()+" short by "+kernels.FormatBytes(s.Need-s.Budget)) {
			t.Errorf("shortfall %+v not named: %v", s, err)
		}
	}
}
