package engine

import (
	"unsafe"

	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spill-ml/spill/kernels"
	"github.com/spill-ml/spill/offload"
)

// TestPlannerHostBytesCoverTrainer: for placements with streamed or
// resident weights, offloaded or recomputed activations, the optimizer on
// host or disk and the delayed update, the host memory the plan predicts
// for the state is never below what the trainer holds (HostBytes) and
// within 15% of it, and OffloadHostBytes is the trainer's figure exactly.
func TestPlannerHostBytesCoverTrainer(t *testing.T) {
	for _, tc := range []struct {
		name   string
		dt     kernels.DType
		accum  int
		modify func(r *PlanRequest)
	}{
		{"streamed-recompute-fp32", kernels.F32, 1, func(r *PlanRequest) {
			r.Weights, r.Grads, r.Optimizer, r.Activations = offload.TierHost, offload.TierHost, offload.TierHost, "recompute"
		}},
		{"offload-acts-accum2-bf16", kernels.BF16, 2, func(r *PlanRequest) {
			r.Weights, r.Grads, r.Activations = offload.TierDevice, offload.TierHost, "offload"
		}},
		{"delayed-fp32", kernels.F32, 1, func(r *PlanRequest) {
			r.Weights, r.DelayedUpdate = offload.TierHost, true
		}},
		{"delayed-offload-bf16", kernels.BF16, 2, func(r *PlanRequest) {
			r.Activations, r.DelayedUpdate = "offload", true
		}},
		{"selective-bf16", kernels.BF16, 4, func(r *PlanRequest) {
			r.Activations = "recompute-selective"
		}},
		{"disk-optimizer-fp32", kernels.F32, 1, func(r *PlanRequest) {
			r.Optimizer, r.DiskDir, r.Budgets.Disk = offload.TierDisk, t.TempDir(), 1<<30
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := NewGPT(oocShape, tc.dt)
			if err != nil {
				t.Fatal(err)
			}
			req := PlanRequest{Name: "ooc", B: oocB, T: oocT, Accum: tc.accum, Hardware: CPUHardware(2),
				Budgets: offload.Budgets{Device: stateBytes(m) / 2, Host: 1 << 30}}
			tc.modify(&req)
			p, err := PlanTrainer(m, req)
			if err != nil {
				t.Fatal(err)
			}
			if p.Resident {
				t.Fatalf("plan is resident: %+v", p.Placement)
			}
			if req.Activations == "recompute-selective" && !p.Placement.Selective {
				t.Fatalf("not selective: %s", p.Placement.Summary())
			}
			if req.Activations == "offload" && p.Placement.Offload == 0 {
				t.Fatalf("no layer offloads its activations: %+v", p.Placement)
			}
			h := p.Placement.Memory[1]
			pred := h.Peak - h.Reserve - h.ByClass[offload.Workspace]
			to := oocOptions()
			to.B, to.Accum = p.B, p.Accum
			tr, err := NewOffloadTrainer(openCPU(t), m, to, p.Options)
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Close()
			got := tr.HostBytes()
			if pred < got || float64(pred) > 1.15*float64(got) {
				t.Errorf("planner predicts %d host bytes, the trainer holds %d: want held <= predicted <= 1.15 held", pred, got)
			}
			if exact := mustBytes(t)(OffloadHostBytes(m, p.B, oocT, p.Accum, p.Options)); exact != got {
				t.Errorf("OffloadHostBytes %d, trainer %d", exact, got)
			}
			if pinned, note := tr.HostPinning(); !pinned || !strings.Contains(note, "pinned in") {
				t.Errorf("host state not pinned: %q", note)
			}
			hs := tr.off.host
			var plain int64
			for _, b := range hs.plain {
				plain += int64(len(b.Bytes()))
			}
			nslabs := len(hs.slabs) + len(hs.plain)
			if s := hs.pool.Stats(); s.InUse+plain < got || s.InUse+plain > got+int64(nslabs)*(4<<10)+int64(len(m.Layers))*8*hostAlign {
				t.Errorf("pool holds %d bytes in use and %d in ordinary slabs for %d bytes of state in %d slabs", s.InUse, plain, got, nslabs)
			}
			if nslabs > int(got/hostSlab)+2*len(m.Layers) {
				t.Errorf("%d slabs for %d bytes", nslabs, got)
			}
			// What the copies use is pinned; the moments, which only the
			// host reads, are not.
			in := func(b []byte, mems ...[]byte) bool {
				p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
				for _, m := range mems {
					lo := uintptr(unsafe.Pointer(unsafe.SliceData(m)))
					if p >= lo && p+uintptr(len(b)) <= lo+uintptr(len(m)) {
						return true
					}
				}
				return false
			}
			var pinnedMem, plainMem [][]byte
			for _, b := range hs.slabs {
				pinnedMem = append(pinnedMem, b.Bytes())
			}
			for _, b := range hs.plain {
				plainMem = append(plainMem, b.Bytes())
			}
			for i, h := range hs.host {
				if h.grads != nil && !in(h.grads, pinnedMem...) {
					t.Errorf("layer %d: gradients not in pinned memory", i)
				}
				if h.weights != nil && !in(h.weights, pinnedMem...) {
					t.Errorf("layer %d: weights not in pinned memory", i)
				}
				if h.m != nil && (!in(h.m, plainMem...) || !in(h.v, plainMem...)) {
					t.Errorf("layer %d: moments not in ordinary memory", i)
				}
			}
		})
	}
}

// TestOutOfCoreHostPool: with the state in the pinned pool (the default),
// when the pool would degrade (RLIMIT_MEMLOCK too small for mlocked
// memory) and when its budget is too small, the trainer keeps training bit
// for bit like the resident one; the last two keep (some of) the state in
// Go memory and say why.
func TestOutOfCoreHostPool(t *testing.T) {
	const steps = 2
	wantL, wantW := runResident(t, kernels.F32, steps)
	for _, tc := range []struct {
		name   string
		modify func(o *OffloadOptions)
		pinned bool
		note   string
	}{
		{"pinned", func(o *OffloadOptions) {}, true, "pinned in"},
		{"memlock-degraded", func(o *OffloadOptions) {
			o.HostPinner = offload.MmapPinner{Lock: true}
			o.HostLimits = func() (offload.Limits, error) { return offload.Limits{Memlock: 1 << 20, MemAvailable: -1}, nil }
		}, false, "RLIMIT_MEMLOCK"},
		{"budget-short", func(o *OffloadOptions) { o.HostBudget = 64 << 10 }, false, "in unpinned Go memory"},
		// A run's host budget far above what the system may pin (the
		// planner's default is most of MemAvailable) pins the state when
		// the state itself fits.
		{"budget-above-available", func(o *OffloadOptions) {
			o.HostBudget = 1 << 40
			o.HostLimits = func() (offload.Limits, error) { return offload.Limits{Memlock: -1, MemAvailable: 1 << 30}, nil }
		}, true, "pinned in"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := streamed()
			tc.modify(&o)
			tr, check := newOOC(t, kernels.F32, oocOptions(), o)
			pinned, note := tr.HostPinning()
			if pinned != tc.pinned || !strings.Contains(note, tc.note) {
				t.Errorf("HostPinning = %v, %q; want %v and a note containing %q", pinned, note, tc.pinned, tc.note)
			}
			gotL, gotW := trainSteps(t, tr, steps)
			check()
			sameRun(t, "resident", wantL, gotL, wantW, gotW)
		})
	}
}

// TestConfigDelayedUpdate: delayed_update loads from TOML, changes the
// resume hash (it changes the math), conflicts with a resident-only run,
// and a run with it trains out of core even without a device budget.
func TestConfigDelayedUpdate(t *testing.T) {
	base := DefaultConfig()
	base.EnsureDefaults()
	d := base
	d.DelayedUpdate = true
	if err := d.Validate(); err != nil {
		t.Fatal(err)
	}
	if base.Hash() == d.Hash() || len(base.MathDiff(&d)) != 1 || !strings.HasPrefix(base.MathDiff(&d)[0], "delayed_update:") {
		t.Errorf("delayed_update does not change the resume hash: %v", base.MathDiff(&d))
	}
	d.Offload = OffloadNone
	if err := d.Validate(); err == nil || !strings.Contains(err.Error(), "delayed_update") {
		t.Errorf("delayed_update with offload = none: %v", err)
	}
	file := filepath.Join(t.TempDir(), "run.toml")
	if err := os.WriteFile(file, []byte("delayed_update = true\nactivations = \"offload\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	lc, err := LoadConfig(file)
	if err != nil || !lc.DelayedUpdate || lc.Activations != "offload" {
		t.Fatalf("LoadConfig: %+v, %v", lc, err)
	}

	data := writeTokens(t, 32, 16, 4000)
	cfg := tinyConfig(data)
	cfg.Layers, cfg.Steps, cfg.Warmup = 4, 3, 1
	cfg.DelayedUpdate, cfg.Activations = true, "offload"
	losses, sum := runLosses(t, cfg)
	if sum.Plan == nil || sum.Plan.Resident || !sum.Plan.Options.DelayedUpdate || sum.Plan.Placement.Offload == 0 {
		t.Fatalf("plan %+v, want out of core with the delayed update and offloaded activations", sum.Plan)
	}
	if len(losses) != 3 || sum.HostBytes == 0 || sum.PredictedHostBytes < sum.HostBytes || sum.HostPinning == "" {
		t.Errorf("losses %v, host bytes %d predicted %d, pinning %q", losses, sum.HostBytes, sum.PredictedHostBytes, sum.HostPinning)
	}
}

// TestOutOfCoreStagingRing: when the pool degrades (MemAvailable far below
// the state), the state stays in Go memory and every copy of it to and
// from the device passes through the pool's small ring of staging buffers:
// the run, with offloaded activations, is the resident one bit for bit, and
// the ring is within the pinned budget the pool granted.
func TestOutOfCoreStagingRing(t *testing.T) {
	const steps = 2
	wantL, wantW := runResident(t, kernels.F32, steps)
	o := streamed()
	o.Activations = make([]offload.ActPolicy, oocShape.Layers+2)
	for i := range o.Activations {
		o.Activations[i] = offload.OffloadTo
	}
	o.HostPinner = offload.MmapPinner{}
	o.HostLimits = func() (offload.Limits, error) { return offload.Limits{Memlock: -1, MemAvailable: 170 << 10}, nil }
	tr, check := newOOC(t, kernels.F32, oocOptions(), o)
	pinned, note := tr.HostPinning()
	if pinned || !strings.Contains(note, "staging buffers") {
		t.Fatalf("HostPinning = %v, %q; want unpinned state copied through the staging ring", pinned, note)
	}
	r := tr.off.host.stage
	if r == nil || r.Bytes() > 170<<10 {
		t.Fatalf("staging ring %v; want one within the 170 KiB available", r)
	}
	gotL, gotW := trainSteps(t, tr, steps)
	check()
	sameRun(t, "resident", wantL, gotL, wantW, gotW)
	// Per step at least: every layer's weights in, gradients out.
	if want := int64(steps * 2 * len(tr.model.Layers)); r.Chunks < want {
		t.Errorf("%d chunks went through the staging ring, want at least %d", r.Chunks, want)
	}
}

// mustBytes returns the total of a byte count by class, failing t on error.
func mustBytes(t *testing.T) func(map[offload.Class]int64, error) int64 {
	return func(by map[offload.Class]int64, err error) int64 {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return byteClasses(by).total()
	}
}
