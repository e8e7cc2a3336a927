package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/spill-ml/spill/kernels"
	"github.com/spill-ml/spill/offload"
)

// TestOutOfCoreOrdersBitwiseFP32: micro-batch-major, layer-major and mixed
// schedules, with streamed or resident weights and gradients and every
// activation policy, train to the resident run's losses and weights bit
// for bit in fp32, with accumulation 1, 3 and 8, and the device peak never
// exceeds the budget.
func TestOutOfCoreOrdersBitwiseFP32(t *testing.T) {
	const steps = 2
	for _, accum := range []int{1, 3, 8} {
		to := oocOptions()
		to.Accum = accum
		wantL, wantW := runResidentWith(t, kernels.F32, to, steps)
		m := mustGPT(t)
		groups := []int{1, accum}
		if accum == 8 {
			groups = append(groups, 3) // groups of 3, 3 and 2
		}
		for _, group := range groups {
			for _, pol := range []offload.ActPolicy{offload.Recompute, offload.Keep, offload.OffloadTo, offload.RecomputeHost,
				offload.RecomputeSelective, offload.RecomputeSelectiveHost} {
				for _, tier := range []offload.Tier{offload.TierHost, offload.TierDevice} {
					if accum == 1 && group > 1 {
						continue
					}
					name := fmt.Sprintf("accum%d/group%d/%s/%s", accum, group, pol, tier)
					t.Run(name, func(t *testing.T) {
						o := streamed()
						o.Group, o.Weights, o.Grads = group, tier, tier
						o.Activations = make([]offload.ActPolicy, len(m.Layers))
						for i := range o.Activations {
							o.Activations[i] = pol
						}
						o.DeviceBudget = stateBytes(m) / 8
						if pol != offload.Recompute || tier == offload.TierDevice {
							o.DeviceBudget = 3 * stateBytes(m) / 2
						}
						gotL, gotW := runOOCWith(t, kernels.F32, to, o, steps)
						sameRun(t, "resident", wantL, gotL, wantW, gotW)
					})
				}
			}
		}
	}
}

// TestLayerMajorTrafficPerStep: with streamed weights and gradients and
// recomputed activations, a layer-major step moves the same bytes between
// host and device whatever the accumulation (weights in twice, gradients
// out once per step), while a micro-batch-major step's traffic grows with
// it; and the step's metrics report it.
func TestLayerMajorTrafficPerStep(t *testing.T) {
	m := mustGPT(t)
	wbytes := 4 * m.NumParams()
	var first StepResult
	for i, accum := range []int{1, 3, 8} {
		to := oocOptions()
		to.Accum = accum
		for _, group := range []int{accum, 1} {
			o := streamed()
			o.Group = group
			tr, check := newOOC(t, kernels.F32, to, o)
			ctx := context.Background()
			if err := tr.InitWeights(ctx, 7); err != nil {
				t.Fatal(err)
			}
			r, err := tr.TrainStep(ctx, oocFeed())
			if err != nil {
				t.Fatal(err)
			}
			if err := tr.off.host.waitUpdates(); err != nil {
				t.Fatal(err)
			}
			check()
			switch {
			case group == 1 && accum > 1:
				if r.H2DBytes <= first.H2DBytes || r.D2HBytes <= first.D2HBytes {
					t.Errorf("micro-batch-major, accum %d: %d bytes in, %d out; layer-major moved %d, %d", accum,
						r.H2DBytes, r.D2HBytes, first.H2DBytes, first.D2HBytes)
				}
			case i == 0 && group == accum:
				first = r
				// Weights twice (the head's tied embedding a few times
				// more), gradients out once (the embedding's twice).
				if r.H2DBytes < 2*wbytes || r.H2DBytes > 3*wbytes || r.D2HBytes < wbytes || r.D2HBytes > 2*wbytes {
					t.Errorf("accum 1: %d bytes in, %d out for %d bytes of weights", r.H2DBytes, r.D2HBytes, wbytes)
				}
			case group == accum:
				if r.H2DBytes != first.H2DBytes || r.D2HBytes != first.D2HBytes {
					t.Errorf("layer-major, accum %d: %d bytes in, %d out; with accum 1: %d, %d", accum,
						r.H2DBytes, r.D2HBytes, first.H2DBytes, first.D2HBytes)
				}
			}
			tr.Close()
		}
	}
	if math.IsNaN(first.Loss) {
		t.Fatal("no loss")
	}
}

// TestRefusedBeforeAllocation: a run whose state fits no tier is refused
// by the planner before the trainer allocates anything, naming what is
// short and what would fit, disk tier included.
func TestRefusedBeforeAllocation(t *testing.T) {
	m := mustGPT(t)
	be := openCPU(t)
	cfg := DefaultConfig()
	cfg.Model, cfg.Layers, cfg.Heads, cfg.Embd, cfg.Vocab, cfg.MaxSeq = "custom", oocShape.Layers, oocShape.Heads, oocShape.Embd, oocShape.Vocab, oocShape.MaxSeq
	cfg.DeviceMemory, cfg.HostMemory = 64<<10, 64<<10
	cfg.DiskDir, cfg.DiskMemory = t.TempDir(), 64<<10
	_, _, err := newRunTrainer(&cfg, be, m, oocB, oocT, nil, nil)
	var ie *offload.InfeasibleError
	if !errors.As(err, &ie) {
		t.Fatalf("error %v, want an *offload.InfeasibleError", err)
	}
	for _, want := range []string{"host short by", "disk short by", "it would fit with"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
	if ms := be.MemStats(); ms.Allocs != 0 {
		t.Errorf("%d device allocations before the refusal", ms.Allocs)
	}
}

// TestGradientsStreamed: Gradients of a trainer that streams its weights
// and gradients through a small device, layer-major, are the resident
// trainer's, bit for bit, and update nothing.
func TestGradientsStreamed(t *testing.T) {
	ctx := context.Background()
	m, err := NewGPT(oocShape, kernels.F32)
	if err != nil {
		t.Fatal(err)
	}
	to := oocOptions()
	res, err := NewTrainer(openCPU(t), m, to)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Close()
	o := streamed()
	o.Group = 2
	ooc, check := newOOCModel(t, m, to, o)
	for _, tr := range []*Trainer{res, ooc} {
		if err := tr.InitWeights(ctx, 3); err != nil {
			t.Fatal(err)
		}
	}
	wl, wg, err := res.Gradients(ctx, oocFeed())
	if err != nil {
		t.Fatal(err)
	}
	before, _ := ooc.MasterWeights(ctx)
	gl, gg, err := ooc.Gradients(ctx, oocFeed())
	if err != nil {
		t.Fatal(err)
	}
	check()
	if math.Float64bits(gl) != math.Float64bits(wl) {
		t.Errorf("loss %v, resident %v", gl, wl)
	}
	for l := range wg {
		for i := range wg[l] {
			if math.Float32bits(gg[l][i]) != math.Float32bits(wg[l][i]) {
				t.Fatalf("layer %d gradient %d: %v, resident %v", l, i, gg[l][i], wg[l][i])
			}
		}
	}
	after, _ := ooc.MasterWeights(ctx)
	for l := range before {
		for i := range before[l] {
			if math.Float32bits(after[l][i]) != math.Float32bits(before[l][i]) {
				t.Fatalf("Gradients changed layer %d weight %d", l, i)
			}
		}
	}
	if ooc.Step != 0 {
		t.Errorf("step %d after Gradients", ooc.Step)
	}
}
