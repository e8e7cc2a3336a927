package engine

import (
	"math"
	"testing"

	"github.com/spill-ml/spill/kernels"
	"github.com/spill-ml/spill/offload"
)

// deviceCase is one out-of-core run compared with the resident trainer on
// the same backend (engine/offload_cuda_test.go runs it on "cuda").
type deviceCase struct {
	device string
	dt     kernels.DType
	shape  GPTShape
	// reserve is left out of the plan's device budget for the backend's
	// own workspaces (besides 1/8 of the limit).
	reserve int64
	// plan overrides ("" / 0: the planner's choice under the budget).
	weights     offload.Tier
	activations string
	// lossTol and weightTol are the largest relative differences of each
	// step's loss and of the final master weights (L2 norm) accepted.
	lossTol, weightTol float64
}

// deviceShape is a small GPT: 16 blocks of width 64 over 32 positions, deep
// enough that 3/32 of its resident need holds one block's working set.
var deviceShape = GPTShape{Layers: 16, Heads: 1, Embd: 64, Vocab: 64, MaxSeq: 32}

const deviceB, deviceT, deviceAccum, deviceSteps = 2, 32, 2, 3

func deviceOptions() TrainerOptions {
	return TrainerOptions{
		B: deviceB, T: deviceT, Accum: deviceAccum, Schedule: LRSchedule{Peak: 1e-2, Min: 1e-3, Warmup: 1, Steps: deviceSteps},
		WeightDecay: 0.1, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, GradClip: 1, LossScale: 1, ScaleWindow: 1000,
	}
}

// deviceFeed is deviceSteps steps of random tokens, perBatch rows at a time.
func deviceFeed(perBatch int) *rowsFeed {
	return randomFeed(5, deviceSteps*deviceB*deviceAccum, deviceT, perBatch)
}

// trainOn runs deviceSteps steps of tr on the device feed and returns the
// losses and the final master weights.
func trainOn(t *testing.T, tr *Trainer, perBatch int) ([]float64, [][]float32) {
	t.Helper()
	return trainFrom(t, tr, 11, deviceFeed(perBatch), deviceSteps)
}

// runDeviceCase trains the device GPT resident with no budget, then out of
// core on a fresh backend whose memory limit is 1/8 of the resident need
// (the trainer plans for 7/8 of that less c.reserve, leaving the rest to
// the backend's own workspaces), and checks: the backend's peak within the limit, the
// predicted device peak at or above the measured one and within 15%, the
// host state pinned, and losses and weights within c's tolerances.
func runDeviceCase(t *testing.T, c deviceCase) {
	m, err := NewGPT(c.shape, c.dt)
	if err != nil {
		t.Fatal(err)
	}
	resident := byteClasses(ResidentDeviceBytes(m, deviceB, deviceT)).total()
	var wantL []float64
	var wantW [][]float32
	func() {
		be, err := kernels.Open(c.device, kernels.Config{Threads: 2})
		if err != nil {
			t.Fatal(err)
		}
		defer be.Close()
		tr, err := NewTrainer(be, m, deviceOptions())
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		wantL, wantW = trainOn(t, tr, deviceB)
	}()

	limit := resident / 8
	be, err := kernels.Open(c.device, kernels.Config{Threads: 2, MemoryLimit: limit})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	hw := CPUHardware(2)
	if c.device != "cpu" {
		hw = offload.H200()
		hw.DeviceReserve, hw.HostReserve = 0, 0
	}
	req := PlanRequest{Name: "device", B: deviceB, T: deviceT, Accum: deviceAccum, Hardware: hw,
		Budgets: offload.Budgets{Device: limit - limit/8 - c.reserve, Host: 1 << 30}, Weights: c.weights, Activations: c.activations}
	p, err := PlanTrainer(m, req)
	if err != nil {
		t.Fatalf("plan for %s of %s resident: %v", kernels.FormatBytes(req.Budgets.Device), kernels.FormatBytes(resident), err)
	}
	if p.Resident {
		t.Fatalf("plan is resident under 1/8 of the resident need: %+v", p.Placement)
	}
	to := deviceOptions()
	to.B, to.Accum = p.B, p.Accum
	tr, err := NewOffloadTrainer(be, m, to, p.Options)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	gotL, gotW := trainOn(t, tr, p.B)

	ms := be.MemStats()
	if ms.Peak > limit {
		t.Errorf("backend peak %d exceeds the limit %d", ms.Peak, limit)
	}
	pred, meas := tr.PredictedDevicePeak(), tr.Cache().Stats().PeakAllocated
	if pred != p.DevicePeak || pred < meas || float64(pred) > 1.15*float64(meas) {
		t.Errorf("predicted device peak %d (plan %d), measured %d: want measured <= predicted <= 1.15 measured", pred, p.DevicePeak, meas)
	}
	if pinned, note := tr.HostPinning(); !pinned {
		t.Errorf("host state not pinned: %s", note)
	}
	t.Logf("%s %v: resident %s, limit %s, plan %s, micro-batch %d x %d, device peak %s (predicted %s), backend peak %s",
		c.device, c.dt, kernels.FormatBytes(resident), kernels.FormatBytes(limit), p.Placement.Hint(), p.B, p.Accum,
		kernels.FormatBytes(meas), kernels.FormatBytes(pred), kernels.FormatBytes(ms.Peak))
	var worst float64
	for s := range wantL {
		d := math.Abs(gotL[s] - wantL[s])
		worst = max(worst, d/math.Abs(wantL[s]))
		if !(d <= c.lossTol*math.Abs(wantL[s])) {
			t.Errorf("step %d: loss %v out of core, %v resident (relative difference %.2g > %.2g)", s, gotL[s], wantL[s],
				d/math.Abs(wantL[s]), c.lossTol)
		}
	}
	rel := relL2(gotW, wantW)
	if !(rel <= c.weightTol) {
		t.Errorf("master weights differ from the resident run's by %.3g (relative L2) > %.2g", rel, c.weightTol)
	}
	t.Logf("largest relative loss difference %.3g (tolerance %.2g), master weights %.3g (tolerance %.2g)",
		worst, c.lossTol, rel, c.weightTol)
}

// TestOutOfCoreMatchesResidentCPU is runDeviceCase on the CPU backend,
// where the host AdamW is the CPU kernel's arithmetic: fp32 with the
// planner's micro-batch matches to rounding of the accumulation order.
func TestOutOfCoreMatchesResidentCPU(t *testing.T) {
	runDeviceCase(t, deviceCase{device: "cpu", dt: kernels.F32, shape: deviceShape, lossTol: 1e-5, weightTol: 1e-5})
	runDeviceCase(t, deviceCase{device: "cpu", dt: kernels.BF16, shape: deviceShape, weights: offload.TierHost,
		activations: "offload", lossTol: 1e-2, weightTol: 1e-2})
	runDeviceCase(t, deviceCase{device: "cpu", dt: kernels.BF16, shape: deviceShape, weights: offload.TierHost,
		activations: "recompute-selective", lossTol: 1e-2, weightTol: 1e-2})
}

// relL2 is |a-b|/|b| over all tensors.
func relL2(a, b [][]float32) float64 {
	var d, n float64
	for i := range b {
		for j := range b[i] {
			e := float64(a[i][j]) - float64(b[i][j])
			d += e * e
			n += float64(b[i][j]) * float64(b[i][j])
		}
	}
	return math.Sqrt(d / n)
}
