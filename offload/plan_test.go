package offload

import (
	"errors"
	"math"
	"strings"
	"testing"
)

const GiB = int64(1) << 30

func gpt(t *testing.T, name string) ModelShape {
	t.Helper()
	m, err := NamedGPT(name, 0)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestGPTParams(t *testing.T) {
	m, err := GPT("gpt2", 12, 768, 12, 50257, 1024)
	if err != nil {
		t.Fatal(err)
	}
	// llm.c's GPT-2 124M checkpoint has 124,439,808 parameters.
	if m.Params() != 124439808 || len(m.Layers) != 14 {
		t.Fatalf("params %d, layers %d", m.Params(), len(m.Layers))
	}
	if _, err := GPT("bad", 2, 100, 3, 10, 10); err == nil {
		t.Fatal("width not divisible by heads accepted")
	}
	if _, err := NamedGPT("gpt5", 0); err == nil || !strings.Contains(err.Error(), "gpt2-xl") {
		t.Fatalf("unknown name: %v", err)
	}
}

// checkPlan verifies a placement's internal consistency.
func checkPlan(t *testing.T, p *Placement, req Request) {
	t.Helper()
	if p.MicroBatch*p.Accum != req.Batch || p.MicroBatch < 1 {
		t.Fatalf("micro-batch %d x %d != batch %d", p.MicroBatch, p.Accum, req.Batch)
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
	if p.Keep+p.Offload+p.Recompute != len(req.Model.Layers)-2 {
		t.Fatalf("activation policy covers %d blocks", p.Keep+p.Offload+p.Recompute)
	}
	b := p.Busy
	top := max(b.Compute, b.H2D, b.D2H, b.HostOptimizer, b.Disk)
	named := map[string]float64{"compute": b.Compute, "h2d": b.H2D, "d2h": b.D2H, "host optimizer": b.HostOptimizer, "disk": b.Disk}
	if named[p.Bottleneck] != top {
		t.Fatalf("bottleneck %q is not the busiest resource: %+v", p.Bottleneck, b)
	}
	if p.StepTime < top*(1-1e-9) {
		t.Fatalf("step %v shorter than its busiest resource %v", p.StepTime, top)
	}
	if p.Optimizer == TierDevice && (p.Weights != TierDevice || p.Grads != TierDevice) {
		t.Fatalf("device optimizer with weights on %s, grads on %s", p.Weights, p.Grads)
	}
}

func TestPlanMoreDeviceMemoryNeverSlower(t *testing.T) {
	cases := []struct {
		model string
		batch int
		host  int64
		disk  int64
		prec  Precision
	}{
		{"gpt2-xl", 8, 64 * GiB, 0, BF16},
		{"gpt2-1.3b", 4, 48 * GiB, 0, FP32},
		{"gpt2-6.7b", 4, 48 * GiB, 512 * GiB, BF16},
	}
	for _, c := range cases {
		m := gpt(t, c.model)
		prev := math.Inf(1)
		feasible := false
		for dev := 4 * GiB; dev <= 144*GiB; dev += 10 * GiB {
			req := Request{Model: m, Batch: c.batch, Precision: c.prec, Budgets: Budgets{Device: dev, Host: c.host, Disk: c.disk}}
			p, err := Plan(req)
			if err != nil {
				if feasible {
					t.Fatalf("%s: feasible at a smaller device budget, not at %d GiB: %v", c.model, dev/GiB, err)
				}
				if !errors.Is(err, ErrInfeasible) {
					t.Fatalf("%s at %d GiB: %v", c.model, dev/GiB, err)
				}
				continue
			}
			feasible = true
			checkPlan(t, p, req)
			if p.StepTime > prev*(1+1e-6) {
				t.Fatalf("%s: %d GiB of device predicts %.4fs, slower than %.4fs with less", c.model, dev/GiB, p.StepTime, prev)
			}
			prev = p.StepTime
		}
		if !feasible {
			t.Fatalf("%s: never feasible", c.model)
		}
	}
}

func TestPlanMoreHostMemoryNeverSlower(t *testing.T) {
	m := gpt(t, "gpt2-1.3b")
	prev := math.Inf(1)
	for host := 8 * GiB; host <= 128*GiB; host += 12 * GiB {
		req := Request{Model: m, Batch: 8, Precision: BF16, Budgets: Budgets{Device: 12 * GiB, Host: host, Disk: 256 * GiB}}
		p, err := Plan(req)
		if err != nil {
			continue
		}
		checkPlan(t, p, req)
		if p.StepTime > prev*(1+1e-6) {
			t.Fatalf("%d GiB of host predicts %.4fs, slower than %.4fs", host/GiB, p.StepTime, prev)
		}
		prev = p.StepTime
	}
	if math.IsInf(prev, 1) {
		t.Fatal("never feasible")
	}
}

func TestPlanPlacesByPressure(t *testing.T) {
	m := gpt(t, "gpt2")
	// Everything fits: nothing leaves the device, the largest micro-batch is used.
	p, err := Plan(Request{Model: m, Batch: 8, Precision: BF16, Budgets: Budgets{Device: 80 * GiB, Host: 64 * GiB}})
	if err != nil {
		t.Fatal(err)
	}
	if p.Weights != TierDevice || p.Optimizer != TierDevice || p.MicroBatch != 8 || p.Keep != 12 {
		t.Fatalf("roomy device: %s", p.Hint())
	}
	// A big model on a small device must stream something.
	big := gpt(t, "gpt2-6.7b")
	req := Request{Model: big, Batch: 8, Precision: BF16, Budgets: Budgets{Device: 16 * GiB, Host: 120 * GiB, Disk: 1 << 40}}
	p, err = Plan(req)
	if err != nil {
		t.Fatal(err)
	}
	checkPlan(t, p, req)
	if p.Optimizer == TierDevice {
		t.Fatalf("6.7B optimizer state placed on a 16 GiB device: %s", p.Hint())
	}
	if !strings.Contains(p.Hint(), "micro-batch") {
		t.Fatalf("hint %q", p.Hint())
	}
}

func TestPlanInfeasibleExplained(t *testing.T) {
	m := gpt(t, "gpt2-13b")
	_, err := Plan(Request{Model: m, Batch: 4, Precision: BF16, Budgets: Budgets{Device: 2 * GiB, Host: 16 * GiB}})
	var ie *InfeasibleError
	if !errors.As(err, &ie) || !errors.Is(err, ErrInfeasible) {
		t.Fatalf("got %v, want an InfeasibleError", err)
	}
	if len(ie.Shortfalls) == 0 || ie.Closest == nil || !ie.NoDisk {
		t.Fatalf("explanation %+v", ie)
	}
	for _, s := range ie.Shortfalls {
		if s.Need <= s.Budget {
			t.Fatalf("shortfall %+v is not short", s)
		}
	}
	msg := err.Error()
	for _, want := range []string{"device short by", "host short by", "budget 2.0 GiB", "micro-batch", "no disk tier"} {
		if !strings.Contains(msg, want) {
			t.Errorf("%q lacks %q", msg, want)
		}
	}
	// With a disk tier only the device remains short.
	_, err = Plan(Request{Model: m, Batch: 4, Precision: BF16, Budgets: Budgets{Device: 2 * GiB, Host: 16 * GiB, Disk: 2 << 40}})
	if !errors.As(err, &ie) || len(ie.Shortfalls) != 1 || ie.Shortfalls[0].Tier != TierDevice {
		t.Fatalf("with a disk: %v", err)
	}
}

func TestPlanRejectsBadRequests(t *testing.T) {
	m := gpt(t, "gpt2")
	ok := Budgets{Device: GiB, Host: GiB}
	for _, req := range []Request{
		{Model: m, Batch: 0, Precision: BF16, Budgets: ok},
		{Model: m, Batch: 1, Precision: "int4", Budgets: ok},
		{Model: m, Batch: 1, Precision: BF16, Budgets: Budgets{Device: 0, Host: GiB}},
		{Model: ModelShape{}, Batch: 1, Precision: BF16, Budgets: ok},
		{Model: m, Batch: 1, Precision: BF16, Budgets: ok, Hardware: Hardware{Name: "broken", H2D: 1}},
	} {
		if _, err := Plan(req); err == nil || errors.Is(err, ErrInfeasible) {
			t.Errorf("request %+v: %v", req.Budgets, err)
		}
	}
}

func TestParseBytes(t *testing.T) {
	for s, want := range map[string]int64{"80GiB": 80 << 30, "512MiB": 512 << 20, "1.5TB": 1.5e12, "64G": 64 << 30, "4096": 4096, " 2 KiB": 2048} {
		if got, err := ParseBytes(s); err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", s, got, err, want)
		}
	}
	for _, s := range []string{"", "GiB", "10 parsecs", "-1G"} {
		if _, err := ParseBytes(s); err == nil {
			t.Errorf("ParseBytes(%q) accepted", s)
		}
	}
}

// TestPlanDelayedUpdate: the delayed update costs each host-optimizer
// placement a second compute-dtype copy of the weights and of the
// gradients in host memory, and never predicts a slower step.
func TestPlanDelayedUpdate(t *testing.T) {
	m := gpt(t, "gpt2-1.3b")
	allow := func(p *Placement) bool {
		return p.Weights == TierHost && p.Grads == TierHost && p.Optimizer == TierHost && p.MicroBatch == 8
	}
	req := Request{Model: m, Batch: 8, Precision: BF16, Budgets: Budgets{Device: 12 * GiB, Host: 128 * GiB}, Allow: allow}
	sync, err := Plan(req)
	if err != nil {
		t.Fatal(err)
	}
	req.DelayedUpdate = true
	delayed, err := Plan(req)
	if err != nil {
		t.Fatal(err)
	}
	checkPlan(t, delayed, req)
	sh, dh := sync.Memory[1], delayed.Memory[1]
	s := int64(2) * m.Params()
	if dh.ByClass[Weights]-sh.ByClass[Weights] != s || dh.ByClass[Grads]-sh.ByClass[Grads] != s {
		t.Errorf("host weights %d -> %d, grads %d -> %d: want +%d each", sh.ByClass[Weights], dh.ByClass[Weights],
			sh.ByClass[Grads], dh.ByClass[Grads], s)
	}
	if delayed.StepTime > sync.StepTime*(1+1e-9) {
		t.Errorf("delayed update predicts %.4fs, slower than %.4fs", delayed.StepTime, sync.StepTime)
	}
}
