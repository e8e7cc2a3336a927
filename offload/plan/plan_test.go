package plan

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/spill-ml/spill/offload"
	"github.com/spill-ml/spill/offload/schedule"
)

const GiB = int64(1) << 30

// hw is the H200 profile without a device reserve, as the engine plans
// (its budgets count only the trainer's own allocations).
func hw() offload.Hardware {
	h := offload.H200()
	h.DeviceReserve = 0
	return h
}

// gpt is a GPT-like model of L blocks of width C, vocabulary V, sequence
// T, with per-sequence sizes close to the engine's (bf16).
func gpt(L, C, V, T int) Model {
	c, v, t := int64(C), int64(V), int64(T)
	m := Model{Name: fmt.Sprintf("gpt-%dx%d", L, C), Precision: offload.BF16, SeqLen: T}
	m.Layers = append(m.Layers, Layer{Name: "embedding", Params: v*c + t*c, ActBytes: 2 * t * c, OutBytes: 2 * t * c})
	for i := 0; i < L; i++ {
		m.Layers = append(m.Layers, Layer{Name: fmt.Sprintf("h.%d", i), Params: 12*c*c + 13*c, ActBytes: 34 * t * c,
			OutBytes: 2 * t * c, ScratchBytes: 16 * t * c, FwdFLOPs: 24*float64(c*c) + 4*float64(t*c), Recomputable: true})
	}
	m.Layers = append(m.Layers, Layer{Name: "head", Params: 2 * c, ActBytes: 2*t*v + 2*t*c, ScratchBytes: 2 * t * v,
		FwdFLOPs: 2 * float64(v*c), Tied: []int{0}})
	return m
}

// check verifies a placement's internal consistency against req.
func check(t *testing.T, p *offload.Placement, req Request) {
	t.Helper()
	if p.MicroBatch*p.Accum != req.Batch || p.MicroBatch < 1 || p.Group < 1 || p.Group > p.Accum {
		t.Fatalf("micro-batch %d x %d in groups of %d for batch %d", p.MicroBatch, p.Accum, p.Group, req.Batch)
	}
	budgets := []int64{req.Budgets.Device, req.Budgets.Host, req.Budgets.Disk}
	for i, u := range p.Memory {
		if u.Peak > budgets[i] || u.Budget != budgets[i] {
			t.Fatalf("%s: predicted peak %d exceeds its budget %d", u.Tier, u.Peak, budgets[i])
		}
		var sum int64
		for _, n := range u.ByClass {
			sum += n
		}
		if sum+u.Reserve+u.Slack != u.Peak {
			t.Fatalf("%s: classes %d + reserve %d + slack %d != peak %d", u.Tier, sum, u.Reserve, u.Slack, u.Peak)
		}
	}
	if p.StepTime <= 0 || p.TokensPerSec <= 0 || p.Busy.Compute <= 0 {
		t.Fatalf("predictions %+v", p)
	}
}

// TestPlanDeviceExact: the device peak a plan reports is its compiled
// program's peak plus the fixed bytes, not an estimate.
func TestPlanDeviceExact(t *testing.T) {
	m := gpt(8, 512, 8192, 256)
	req := Request{Model: m, Batch: 16, Hardware: hw(), Budgets: offload.Budgets{Device: 200 << 20, Host: 64 * GiB}}
	p, err := Plan(req)
	if err != nil {
		t.Fatal(err)
	}
	check(t, p, req)
	if p.Optimizer == offload.TierDevice {
		t.Fatalf("200 MiB holds a resident %d-parameter model? %+v", p.Params, p.Summary())
	}
	pl := newPlanner(&req)
	c := &cand{w: p.Weights, g: p.Grads, o: p.Optimizer, mb: p.MicroBatch, grp: p.Group, depth: p.PrefetchDepth,
		rec: p.Recompute, off: p.Offload, ckptHost: p.CheckpointsOnHost, nDev: p.OptimizerLayers[0], nDisk: p.OptimizerLayers[2]}
	spec := pl.spec(c)
	prog, err := schedule.Compile(spec)
	if err != nil {
		t.Fatal(err)
	}
	train, _ := prog.Peak()
	spec.MicroBatches, spec.Group, spec.Acts, spec.Train = 1, 1, nil, false
	eval, err := schedule.Compile(spec)
	if err != nil {
		t.Fatal(err)
	}
	ep, _ := eval.Peak()
	want := max(train, ep) + pl.fixed(p.MicroBatch, p.Accum)
	if got := p.Memory[0].Peak; got != want {
		t.Errorf("device peak %d, the program's %d", got, want)
	}
}

// TestPlanMoreMemoryNeverSlower: a larger device or host budget never
// predicts a slower step (the search is fastest-first over the same
// candidates).
func TestPlanMoreMemoryNeverSlower(t *testing.T) {
	m := gpt(12, 768, 16384, 512)
	prev := 0.0
	for _, dev := range []int64{GiB / 2, GiB, 2 * GiB, 4 * GiB, 16 * GiB} {
		req := Request{Model: m, Batch: 16, Hardware: hw(), Budgets: offload.Budgets{Device: dev, Host: 64 * GiB}}
		p, err := Plan(req)
		if err != nil {
			t.Fatalf("device %d: %v", dev, err)
		}
		check(t, p, req)
		if prev > 0 && p.StepTime > prev*(1+1e-9) {
			t.Errorf("device %d GiB: %.4f s, slower than %.4f s with less", dev>>20, p.StepTime, prev)
		}
		prev = p.StepTime
	}
}

// TestPlanPrefersLayerMajorWhenStreaming: with weights streamed and many
// micro-batches, streaming them once per group beats once per
// micro-batch, so the plan is layer-major (in groups); with room for
// everything it is resident and micro-batch-major.
func TestPlanPrefersLayerMajorWhenStreaming(t *testing.T) {
	m := gpt(16, 1024, 16384, 512)
	req := Request{Model: m, Batch: 32, Hardware: hw(), Budgets: offload.Budgets{Device: GiB, Host: 64 * GiB},
		Allow: func(p *offload.Placement) bool { return p.Weights == offload.TierHost }}
	p, err := Plan(req)
	if err != nil {
		t.Fatal(err)
	}
	check(t, p, req)
	if p.Accum > 1 && p.Group == 1 {
		t.Errorf("streamed weights, %d micro-batches, micro-batch-major: %s", p.Accum, p.Summary())
	}
	req = Request{Model: m, Batch: 8, Hardware: hw(), Budgets: offload.Budgets{Device: 200 * GiB, Host: 64 * GiB}}
	if p, err = Plan(req); err != nil {
		t.Fatal(err)
	}
	if p.Optimizer != offload.TierDevice || p.Order() != "micro-batch-major" {
		t.Errorf("roomy device: %s", p.Summary())
	}
	if len(p.Alternatives) == 0 {
		t.Error("no alternatives explained")
	}
}

// TestPlanInfeasibleExplained: when nothing fits, the error names every
// short tier with what it needs, says what would fit, and wraps
// offload.ErrInfeasible.
func TestPlanInfeasibleExplained(t *testing.T) {
	m := gpt(24, 2048, 50304, 1024)
	req := Request{Model: m, Batch: 8, Hardware: hw(), Budgets: offload.Budgets{Device: 8 * GiB, Host: 8 * GiB}}
	_, err := Plan(req)
	var ie *offload.InfeasibleError
	if !errors.As(err, &ie) || !errors.Is(err, offload.ErrInfeasible) {
		t.Fatalf("error %v", err)
	}
	msg := err.Error()
	for _, want := range []string{"host short by", "it would fit with a host budget of", "there is no disk tier"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q: %s", want, msg)
		}
	}
	for _, s := range ie.Shortfalls {
		if s.Tier == offload.TierDevice {
			t.Errorf("blames the device: %s", msg)
		}
	}
}

// TestPlanRefusesQuickly: a model far too large for its budgets is
// refused within the deadline, however large.
func TestPlanRefusesQuickly(t *testing.T) {
	m := gpt(80, 8192, 50304, 2048)
	req := Request{Model: m, Batch: 64, Hardware: hw(), Budgets: offload.Budgets{Device: 8 * GiB, Host: 16 * GiB, Disk: 100 * GiB},
		Deadline: 500 * time.Millisecond}
	start := time.Now()
	_, err := Plan(req)
	if !errors.Is(err, offload.ErrInfeasible) {
		t.Fatalf("error %v", err)
	}
	// Generous: the deadline plus the candidate enumeration on a loaded
	// CI machine. The benchmark below measures it.
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("refusal took %v", d)
	}
}

func TestPlanRejectsBadRequests(t *testing.T) {
	m := gpt(2, 64, 100, 16)
	for _, req := range []Request{
		{Model: m, Batch: 0, Hardware: hw(), Budgets: offload.Budgets{Device: GiB, Host: GiB}},
		{Model: m, Batch: 1, Hardware: hw(), Budgets: offload.Budgets{Device: 0, Host: GiB}},
		{Model: Model{Name: "empty", Precision: offload.BF16, SeqLen: 4}, Batch: 1, Hardware: hw(), Budgets: offload.Budgets{Device: GiB, Host: GiB}},
		{Model: Model{Name: "bad", Precision: "int4", SeqLen: 4, Layers: m.Layers}, Batch: 1, Hardware: hw(), Budgets: offload.Budgets{Device: GiB, Host: GiB}},
		{Model: m, Batch: 1, Hardware: hw(), Budgets: offload.Budgets{Device: GiB, Host: GiB}, Allow: func(*offload.Placement) bool { return false }},
	} {
		if _, err := Plan(req); err == nil {
			t.Errorf("Plan(%+v) did not fail", req.Budgets)
		}
	}
}

// TestPlanDelayedUpdate: a delayed update is never resident and hides the
// host optimizer behind the step, so it predicts a step no slower than
// the synchronous plan of the same placement.
func TestPlanDelayedUpdate(t *testing.T) {
	m := gpt(12, 1024, 16384, 512)
	b := offload.Budgets{Device: 2 * GiB, Host: 64 * GiB}
	// The synchronous plan with the optimizer on the host only (a delayed
	// update keeps none on the device).
	sync, err := Plan(Request{Model: m, Batch: 16, Budgets: b, Optimizer: offload.TierHost})
	if err != nil {
		t.Fatal(err)
	}
	same := func(p *offload.Placement) bool {
		return p.Weights == sync.Weights && p.Grads == sync.Grads && p.MicroBatch == sync.MicroBatch && p.Group == sync.Group &&
			p.Recompute == sync.Recompute && p.Offload == sync.Offload && p.PrefetchDepth == sync.PrefetchDepth
	}
	del, err := Plan(Request{Model: m, Batch: 16, Budgets: b, DelayedUpdate: true, Allow: same})
	if err != nil {
		t.Fatal(err)
	}
	if del.Optimizer == offload.TierDevice || del.StepTime > sync.StepTime*(1+1e-9) {
		t.Errorf("delayed %s %.4f s, synchronous %.4f s", del.Optimizer, del.StepTime, sync.StepTime)
	}
	if del.Memory[1].ByClass[offload.Weights] <= sync.Memory[1].ByClass[offload.Weights] {
		t.Error("delayed update holds no second copy of the weights")
	}
}

func BenchmarkPlanGPT13B(b *testing.B) {
	m := gpt(24, 2048, 50304, 1024)
	for b.Loop() {
		if _, err := Plan(Request{Model: m, Batch: 64, Hardware: hw(), Budgets: offload.Budgets{Device: 8 * GiB, Host: 110 * GiB}}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkPlanRefusal70B(b *testing.B) {
	m := gpt(80, 8192, 50304, 2048)
	for b.Loop() {
		if _, err := Plan(Request{Model: m, Batch: 64, Hardware: hw(), Budgets: offload.Budgets{Device: 8 * GiB, Host: 16 * GiB, Disk: 100 * GiB}}); err == nil {
			b.Fatal("a 70B model fit 8+16 GiB")
		}
	}
}

// hostNeed is the host bytes of m's state out of core with every layer's
// optimizer on the host (bf16: master, weights, grads, moments).
func hostNeed(m Model) int64 { return m.Params() * (4 + 2 + 2 + 8) }

// TestPlanSplitsOptimizer: when the host cannot hold the optimizer state
// and the device has room beside the weights, gradients and activations,
// the plan splits it: the first layers on the device, the next on the
// host, the last on disk, within every budget and faster than with none on
// the device; the device peak is the compiled program's; the plan says why.
func TestPlanSplitsOptimizer(t *testing.T) {
	m := gpt(16, 1024, 16384, 512)
	b := offload.Budgets{Device: 2 * GiB, Host: hostNeed(m)*35/100 + hw().HostReserve, Disk: 64 * GiB}
	req := Request{Model: m, Batch: 8, Hardware: hw(), Budgets: b}
	p, err := Plan(req)
	if err != nil {
		t.Fatal(err)
	}
	check(t, p, req)
	n := p.OptimizerLayers
	if n[0] == 0 || n[1] == 0 || n[2] == 0 || n[0]+n[1]+n[2] != len(m.Layers) || p.Optimizer != offload.TierDisk {
		t.Fatalf("split %v (optimizer %s): want layers on device, host and disk: %s", n, p.Optimizer, p.Summary())
	}
	var diskParams int64
	for i, l := range p.Layers {
		want := offload.TierHost
		switch {
		case i < n[0]:
			want = offload.TierDevice
		case i >= len(p.Layers)-n[2]:
			want = offload.TierDisk
			diskParams += l.Params
		}
		if l.Optimizer != want {
			t.Fatalf("layer %d's optimizer on %s, want %s (split %v)", i, l.Optimizer, want, n)
		}
	}
	if got := p.Memory[2].ByClass[offload.AdamM] + p.Memory[2].ByClass[offload.AdamV]; got != 8*diskParams {
		t.Errorf("disk holds %d bytes of moments, the disk layers have %d", got, 8*diskParams)
	}
	if p.Memory[0].ByClass[offload.AdamM] == 0 || p.Memory[0].ByClass[offload.Master] == 0 {
		t.Errorf("device peak by class %v: no optimizer state", p.Memory[0].ByClass)
	}
	for _, w := range []string{"on the device", "on the host", "on disk"} {
		if !strings.Contains(p.OptimizerWhy, w) {
			t.Errorf("why %q does not say %q", p.OptimizerWhy, w)
		}
	}
	// The device peak is the compiled program's, split included.
	pl := newPlanner(&req)
	c := &cand{w: p.Weights, g: p.Grads, o: p.Optimizer, mb: p.MicroBatch, grp: p.Group, depth: p.PrefetchDepth,
		rec: p.Recompute, off: p.Offload, ckptHost: p.CheckpointsOnHost, nDev: n[0], nDisk: n[2], mdisk: p.MasterOnDisk}
	prog, err := schedule.Compile(pl.spec(c))
	if err != nil {
		t.Fatal(err)
	}
	if train, _ := prog.Peak(); p.Memory[0].Peak < train+pl.fixed(p.MicroBatch, p.Accum) {
		t.Errorf("device peak %d below the program's %d", p.Memory[0].Peak, train)
	}
	// The same placement with none of it on the device: more on disk and
	// a slower step.
	pl.timeOf(c)
	none := *c
	none.nDev = 0
	pl.hostDisk(&none)
	pl.timeOf(&none)
	if none.nDisk <= n[2] || none.step <= c.step || math.Abs(c.step-p.StepTime) > 1e-9*p.StepTime {
		t.Errorf("none on the device: %d layers on disk, %.4f s; split: %d on disk, %.4f s (plan %.4f s)",
			none.nDisk, none.step, n[2], c.step, p.StepTime)
	}
	// A roomier host takes layers off the disk.
	b.Host += hostNeed(m) / 5
	roomy, err := Plan(Request{Model: m, Batch: 8, Hardware: hw(), Budgets: b})
	if err != nil {
		t.Fatal(err)
	}
	if roomy.OptimizerLayers[2] >= n[2] {
		t.Errorf("a larger host budget keeps %d layers on disk (was %d)", roomy.OptimizerLayers[2], n[2])
	}
}

// TestPlanRefusesEveryTierShort: when device, host and disk together
// cannot hold the state, the refusal names each short tier with what it
// needs.
func TestPlanRefusesEveryTierShort(t *testing.T) {
	m := gpt(16, 1024, 16384, 512)
	req := Request{Model: m, Batch: 8, Hardware: hw(),
		Budgets: offload.Budgets{Device: 256 << 20, Host: hostNeed(m)/4 + hw().HostReserve, Disk: hostNeed(m) / 8}}
	_, err := Plan(req)
	var ie *offload.InfeasibleError
	if !errors.As(err, &ie) {
		t.Fatalf("error %v", err)
	}
	short := map[offload.Tier]bool{}
	for _, s := range ie.Shortfalls {
		short[s.Tier] = s.Need > s.Budget
	}
	if !short[offload.TierHost] || !short[offload.TierDisk] {
		t.Errorf("shortfalls %+v: want host and disk", ie.Shortfalls)
	}
	for _, w := range []string{"host short by", "disk short by", "a disk budget of"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error lacks %q: %v", w, err)
		}
	}
}

// Pinned off the device (Optimizer host), the optimizer state still
// overflows to disk when the host budget is short, and none of it is on
// the device.
func TestPlanHostPinOverflowsToDisk(t *testing.T) {
	m := gpt(16, 1024, 16384, 512)
	b := offload.Budgets{Device: 2 * GiB, Host: hostNeed(m)*60/100 + hw().HostReserve, Disk: 64 * GiB}
	req := Request{Model: m, Batch: 8, Hardware: hw(), Budgets: b, Optimizer: offload.TierHost}
	p, err := Plan(req)
	if err != nil {
		t.Fatal(err)
	}
	check(t, p, req)
	n := p.OptimizerLayers
	if n[0] != 0 || n[1] == 0 || n[2] == 0 || p.Optimizer != offload.TierDisk {
		t.Fatalf("split %v (optimizer %s): want none on the device, layers on host and disk: %s", n, p.Optimizer, p.Summary())
	}
	if !strings.Contains(p.OptimizerWhy, "as pinned") || !strings.Contains(p.OptimizerWhy, "on disk") {
		t.Errorf("why %q", p.OptimizerWhy)
	}
	// With the host budget enough, nothing goes to disk.
	req.Budgets.Host = 2*hostNeed(m) + hw().HostReserve
	if p, err = Plan(req); err != nil {
		t.Fatal(err)
	}
	if n := p.OptimizerLayers; n[0] != 0 || n[2] != 0 || p.Optimizer != offload.TierHost {
		t.Fatalf("split %v (optimizer %s) with host enough: want all on the host", n, p.Optimizer)
	}
}

// TestPlanMaxDeviceOptimizerLayers: the cap bounds the device's share of
// the split (the rest goes to the host), and the plan still fits.
func TestPlanMaxDeviceOptimizerLayers(t *testing.T) {
	m := gpt(16, 1024, 16384, 512)
	b := offload.Budgets{Device: 2 * GiB, Host: 64 * GiB}
	req := Request{Model: m, Batch: 8, Hardware: hw(), Budgets: b}
	free, err := Plan(req)
	if err != nil {
		t.Fatal(err)
	}
	if free.OptimizerLayers[0] < 2 {
		t.Fatalf("uncapped split %v: want at least 2 layers on the device for the cap to bind", free.OptimizerLayers)
	}
	req.MaxDeviceOptimizerLayers = 1
	p, err := Plan(req)
	if err != nil {
		t.Fatal(err)
	}
	check(t, p, req)
	if n := p.OptimizerLayers; n[0] != 1 || n[0]+n[1]+n[2] != len(m.Layers) {
		t.Errorf("capped at 1, split %v (uncapped %v)", n, free.OptimizerLayers)
	}
}

// TestHostSlotsMatchProgram: for every candidate whose activations or
// checkpoints go to the host (whole or selective checkpoints, offloaded
// activations), the host bytes the planner counts for their slots without
// compiling are those of the compiled program's slots.
func TestHostSlotsMatchProgram(t *testing.T) {
	m := gpt(6, 64, 128, 32)
	for i := range m.Layers {
		if m.Layers[i].Recomputable {
			m.Layers[i].SaveBytes, m.Layers[i].SelFLOPs = 5*32*64, 16*64*64
		}
	}
	req := Request{Model: m, Batch: 8, Budgets: offload.Budgets{Device: GiB, Host: GiB}, Hardware: hw(), MaxPrefetch: 1}
	pl := newPlanner(&req)
	var n, sel int
	for _, c := range pl.candidates() {
		if c.o == offload.TierDevice || !(c.ckptHost && c.rec > 0 || c.off > 0) {
			continue
		}
		pl.hostDisk(c)
		p, err := schedule.Compile(pl.spec(c))
		if err != nil {
			t.Fatal(err)
		}
		if want, got := SlotBytes(p)[offload.Activations], c.host[offload.Activations]; got != want {
			t.Fatalf("%s (selective %v, checkpoints on host %v): planner counts %d bytes of activation slots, the program has %d",
				pl.placement(c).Summary(), c.sel, c.ckptHost, got, want)
		}
		n++
		if c.sel && c.ckptHost {
			sel++
		}
	}
	if n == 0 || sel == 0 {
		t.Fatalf("%d candidates with host slots, %d of them selective: want some of each", n, sel)
	}
}

// TestWhySelective: when the plan recomputes, "why not" names the other
// way to recompute (whole-block against selective) for the same
// placement, with its predicted time and why it lost.
func TestWhySelective(t *testing.T) {
	m := gpt(24, 2048, 50304, 1024)
	for i := range m.Layers {
		if m.Layers[i].Recomputable {
			m.Layers[i].SaveBytes = 2*1024*2048 + 2*1024*2048 + 8*1024
			m.Layers[i].SelFLOPs = 16 * 2048 * 2048
		}
	}
	req := Request{Model: m, Batch: 64, Budgets: offload.Budgets{Device: 8 * GiB, Host: 100 * GiB}, Hardware: hw()}
	p, err := Plan(req)
	if err != nil {
		t.Fatal(err)
	}
	if p.Recompute == 0 {
		t.Fatalf("the plan does not recompute: %s", p.Summary())
	}
	want := "selective recomputation"
	if p.Selective {
		want = "whole-block recomputation"
	}
	for _, a := range p.Alternatives {
		if a.Family != want {
			continue
		}
		if a.StepTime < p.StepTime || a.Why == "" || strings.Contains(a.Summary, " selective") == p.Selective {
			t.Fatalf("%s: %.3f s (%s: %s) against the plan's %.3f s (%s)", want, a.StepTime, a.Summary, a.Why, p.StepTime, p.Summary())
		}
		return
	}
	t.Fatalf("no %q among the alternatives of %s", want, p.Summary())
}

// TestPlanSpeculativeUpdate: with the global norm to wait for, the
// planner makes the host updates speculative when the host has room for
// the second copy (counted in the host peak, as SpecState says), which
// predicts them hidden as eager ones are; not when the host is short of
// it, nor with NoSpeculation, a delayed update or no norm to wait for;
// and not when it predicts no gain (few sequences a step: the host
// optimizer bounds the step).
func TestPlanSpeculativeUpdate(t *testing.T) {
	m := gpt(12, 1024, 16384, 512)
	b := offload.Budgets{Device: 2 * GiB, Host: 64 * GiB}
	keep := func(p *offload.Placement) func(*offload.Placement) bool {
		return func(q *offload.Placement) bool {
			return q.Weights == p.Weights && q.Grads == p.Grads && q.MicroBatch == p.MicroBatch && q.Group == p.Group &&
				q.Recompute == p.Recompute && q.Offload == p.Offload && q.PrefetchDepth == p.PrefetchDepth && q.Selective == p.Selective &&
				q.CheckpointsOnHost == p.CheckpointsOnHost && q.Optimizer == p.Optimizer
		}
	}
	req := Request{Model: m, Batch: 128, Budgets: b, Hardware: hw(), GlobalNorm: true, Optimizer: offload.TierHost}
	spec, err := Plan(req)
	if err != nil {
		t.Fatal(err)
	}
	check(t, spec, req)
	if !spec.SpeculativeUpdate {
		t.Fatalf("roomy host: not speculative: %s", spec.Summary())
	}
	var said bool
	for _, a := range spec.Alternatives {
		if strings.Contains(a.Family, "host updates after the norm") {
			said = a.StepTime >= spec.StepTime && strings.Contains(a.Why, "more host memory")
		}
	}
	if !said {
		t.Errorf("the plan's alternatives do not say what speculation buys and costs: %+v", spec.Alternatives)
	}
	off := req
	off.NoSpeculation, off.Allow = true, keep(spec)
	plain, err := Plan(off)
	if err != nil {
		t.Fatal(err)
	}
	if plain.SpeculativeUpdate {
		t.Fatal("NoSpeculation: speculative")
	}
	params, tiers := make([]int64, len(spec.Layers)), make([]offload.Tier, len(spec.Layers))
	for i, l := range spec.Layers {
		params[i], tiers[i] = l.Params, l.Optimizer
	}
	extra := SpecState(params, 2, true, tiers)
	var sum int64
	for cl, v := range extra {
		sum += v
		if got := spec.Memory[1].ByClass[cl] - plain.Memory[1].ByClass[cl]; got != v {
			t.Errorf("%s: the speculative plan holds %d more host bytes, SpecState says %d", cl, got, v)
		}
	}
	if sum == 0 || spec.StepTime > plain.StepTime {
		t.Errorf("second copy %d bytes; step %.4f s speculative, %.4f s not", sum, spec.StepTime, plain.StepTime)
	}
	eager := req
	eager.GlobalNorm, eager.Allow = false, keep(spec)
	if p, err := Plan(eager); err != nil || p.SpeculativeUpdate || p.StepTime > spec.StepTime*(1+1e-9) {
		t.Errorf("no norm to wait for: %v; want at most the speculative plan's time %.4f s (its updates cost SpecCost more), not speculative", err, spec.StepTime)
	}
	short := req
	short.Allow = keep(spec)
	short.Budgets.Host = plain.Memory[1].Peak + sum/2
	if p, err := Plan(short); err != nil || p.SpeculativeUpdate {
		t.Errorf("host short of the second copy: %v, speculative %v", err, p != nil && p.SpeculativeUpdate)
	}
	few := req
	few.Batch = 8
	if p, err := Plan(few); err != nil || p.SpeculativeUpdate {
		t.Errorf("8 sequences a step: %v, speculative %v", err, p != nil && p.SpeculativeUpdate)
	}
	del := req
	del.DelayedUpdate = true
	if p, err := Plan(del); err != nil || p.SpeculativeUpdate {
		t.Errorf("delayed update: %v, speculative %v", err, p != nil && p.SpeculativeUpdate)
	}
}
