package engine

import (
	"bytes"
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/spill-ml/spill/kernels"
	"github.com/spill-ml/spill/offload"
	"github.com/spill-ml/spill/offload/schedule"
)

// oocShape is a GPT deep enough that its weights, gradients and optimizer
// state are many times what one layer's working set needs.
var oocShape = GPTShape{Layers: 16, Heads: 2, Embd: 32, Vocab: 64, MaxSeq: 8}

const oocB, oocT, oocAccum = 1, 8, 2

func oocOptions() TrainerOptions {
	return TrainerOptions{
		B: oocB, T: oocT, Accum: oocAccum, Schedule: LRSchedule{Peak: 1e-2, Min: 1e-3, Warmup: 1, Steps: 4},
		WeightDecay: 0.1, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, GradClip: 1, LossScale: 1, ScaleWindow: 1000,
	}
}

// stateBytes is the bytes of weights, gradients, master and Adam moments.
func stateBytes(m *Model) int64 {
	s := int64(m.DType.Size())
	per := 2*s + 12 // weights + grads in compute dtype, master + m + v in fp32
	if m.DType == kernels.F32 {
		per = 16 // the weights are the master
	}
	return per * m.NumParams()
}

func oocFeed() *rowsFeed { return randomFeed(99, 6*oocB, oocT, oocB) }

// randomFeed is rows rows of T random token ids below 64 (inputs and
// targets), perBatch rows per micro-batch, from the seed.
func randomFeed(seed uint64, rows, T, perBatch int) *rowsFeed {
	r := &rng{s: seed}
	n := rows * T
	in, tg := make([]int32, n), make([]int32, n)
	for i := range in {
		in[i], tg[i] = int32(r.next()%64), int32(r.next()%64)
	}
	return &rowsFeed{in: in, tg: tg, T: T, perBatch: perBatch}
}

// trainSteps runs steps and returns the losses and final master weights.
func trainSteps(t *testing.T, tr *Trainer, steps int) ([]float64, [][]float32) {
	t.Helper()
	return trainFrom(t, tr, 7, oocFeed(), steps)
}

func recomputeBlocks(m *Model) []offload.ActPolicy {
	p := make([]offload.ActPolicy, len(m.Layers))
	for i := 1; i < len(p)-1; i++ {
		p[i] = offload.Recompute
	}
	return p
}

// newOOC returns an out-of-core trainer of the test GPT under a device
// budget of stateBytes/8 unless o.DeviceBudget is set (o.Activations
// defaults to recomputed blocks),
// and a check of the budget and of the predicted peak to run after use.
func newOOC(t *testing.T, dt kernels.DType, to TrainerOptions, o OffloadOptions) (*Trainer, func()) {
	t.Helper()
	m, err := NewGPT(oocShape, dt)
	if err != nil {
		t.Fatal(err)
	}
	return newOOCModel(t, m, to, o)
}

// newOOCModel is newOOC for a model of the caller's.
func newOOCModel(t *testing.T, m *Model, to TrainerOptions, o OffloadOptions) (*Trainer, func()) {
	t.Helper()
	dt := m.DType
	budget := stateBytes(m) / 8
	if o.DeviceBudget > 0 {
		budget = o.DeviceBudget
	}
	be, err := kernels.Open("cpu", kernels.Config{Threads: 2, MemoryLimit: budget})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	o.DeviceBudget = budget
	if o.Activations == nil {
		o.Activations = recomputeBlocks(m)
	}
	tr, err := NewOffloadTrainer(be, m, to, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tr.Close)
	check := func() {
		t.Helper()
		if err := tr.ResidencyErr(); err != nil {
			t.Errorf("residency table: %v", err)
		}
		ms := be.MemStats()
		if ms.Peak > budget {
			t.Errorf("device peak %d exceeds the budget %d", ms.Peak, budget)
		}
		cs := tr.Cache().Stats()
		pred := tr.PredictedDevicePeak()
		if pred < cs.PeakAllocated || float64(pred) > 1.15*float64(cs.PeakAllocated) {
			t.Errorf("predicted device peak %d, measured %d: want measured <= predicted <= 1.15 measured", pred, cs.PeakAllocated)
		}
		t.Logf("%v: state %s, budget %s, device peak %s (predicted %s), backend peak %s", dt,
			kernels.FormatBytes(stateBytes(m)), kernels.FormatBytes(budget), kernels.FormatBytes(cs.PeakAllocated),
			kernels.FormatBytes(pred), kernels.FormatBytes(ms.Peak))
	}
	return tr, check
}

// runOOC trains the model out of core under a device budget of
// stateBytes/8 and checks the budget and the predicted peak.
func runOOC(t *testing.T, dt kernels.DType, o OffloadOptions, steps int) ([]float64, [][]float32) {
	t.Helper()
	return runOOCWith(t, dt, oocOptions(), o, steps)
}

func runOOCWith(t *testing.T, dt kernels.DType, to TrainerOptions, o OffloadOptions, steps int) ([]float64, [][]float32) {
	t.Helper()
	tr, check := newOOC(t, dt, to, o)
	losses, w := trainSteps(t, tr, steps)
	check()
	return losses, w
}

func runResident(t *testing.T, dt kernels.DType, steps int) ([]float64, [][]float32) {
	t.Helper()
	return runResidentWith(t, dt, oocOptions(), steps)
}

func runResidentWith(t *testing.T, dt kernels.DType, to TrainerOptions, steps int) ([]float64, [][]float32) {
	t.Helper()
	m, err := NewGPT(oocShape, dt)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := NewTrainer(openCPU(t), m, to)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	return trainSteps(t, tr, steps)
}

func streamed() OffloadOptions {
	return OffloadOptions{Weights: offload.TierHost, Grads: offload.TierHost, Optimizer: offload.TierHost, Prefetch: 1}
}

// TestOutOfCoreBitwiseFP32: a GPT whose state is 8x the device budget
// trains, streamed layer by layer with a host optimizer and recomputed
// activations, to the same losses and weights, bit for bit, as the
// resident run with no budget.
func TestOutOfCoreBitwiseFP32(t *testing.T) {
	const steps = 3
	wantL, wantW := runResident(t, kernels.F32, steps)
	for _, tc := range []struct {
		name string
		o    OffloadOptions
	}{
		{"stream", streamed()},
		{"stream-depth2", func() OffloadOptions { o := streamed(); o.Prefetch = 2; return o }()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gotL, gotW := runOOC(t, kernels.F32, tc.o, steps)
			for s := range wantL {
				if math.Float64bits(gotL[s]) != math.Float64bits(wantL[s]) {
					t.Errorf("step %d: loss %v, resident %v", s, gotL[s], wantL[s])
				}
			}
			for l := range wantW {
				for i := range wantW[l] {
					if math.Float32bits(gotW[l][i]) != math.Float32bits(wantW[l][i]) {
						t.Fatalf("layer %d param %d: %v, resident %v", l, i, gotW[l][i], wantW[l][i])
					}
				}
			}
		})
	}
}

// TestOutOfCoreBF16: the same in bf16 matches within tolerance.
func TestOutOfCoreBF16(t *testing.T) {
	const steps = 2
	wantL, wantW := runResident(t, kernels.BF16, steps)
	gotL, gotW := runOOC(t, kernels.BF16, streamed(), steps)
	for s := range wantL {
		if math.Abs(gotL[s]-wantL[s]) > 1e-3*math.Abs(wantL[s]) {
			t.Errorf("step %d: loss %v, resident %v", s, gotL[s], wantL[s])
		}
	}
	var maxd float64
	for l := range wantW {
		for i := range wantW[l] {
			maxd = max(maxd, math.Abs(float64(gotW[l][i]-wantW[l][i])))
		}
	}
	if maxd > 1e-3 {
		t.Errorf("weights differ from the resident run by up to %v", maxd)
	}
}

// TestOutOfCoreDiskOptimizer: with the Adam moments on the disk tier the
// run matches the in-RAM one bit for bit, and a disk that refuses the
// files is a clear error.
func TestOutOfCoreDiskOptimizer(t *testing.T) {
	const steps = 2
	wantL, wantW := runOOC(t, kernels.F32, streamed(), steps)
	o := streamed()
	o.Optimizer, o.DiskDir, o.DiskBudget = offload.TierDisk, t.TempDir(), 64<<20
	gotL, gotW := runOOC(t, kernels.F32, o, steps)
	for s := range wantL {
		if math.Float64bits(gotL[s]) != math.Float64bits(wantL[s]) {
			t.Errorf("step %d: loss %v, in RAM %v", s, gotL[s], wantL[s])
		}
	}
	for l := range wantW {
		for i := range wantW[l] {
			if math.Float32bits(gotW[l][i]) != math.Float32bits(wantW[l][i]) {
				t.Fatalf("layer %d param %d: %v, in RAM %v", l, i, gotW[l][i], wantW[l][i])
			}
		}
	}

	m, err := NewGPT(oocShape, kernels.F32)
	if err != nil {
		t.Fatal(err)
	}
	o.DiskBudget = 1 << 10 // far too small
	_, err = NewOffloadTrainer(openCPU(t), m, oocOptions(), o)
	if !errors.Is(err, offload.ErrBudget) {
		t.Errorf("disk budget too small: got %v, want an offload.ErrBudget", err)
	}
}

// sameRun fails unless two runs' losses and weights are bitwise equal.
func sameRun(t *testing.T, what string, wantL, gotL []float64, wantW, gotW [][]float32) {
	t.Helper()
	for s := range wantL {
		if math.Float64bits(gotL[s]) != math.Float64bits(wantL[s]) {
			t.Errorf("step %d: loss %v, %s %v", s, gotL[s], what, wantL[s])
		}
	}
	for l := range wantW {
		for i := range wantW[l] {
			if math.Float32bits(gotW[l][i]) != math.Float32bits(wantW[l][i]) {
				t.Fatalf("layer %d param %d: %v, %s %v", l, i, gotW[l][i], what, wantW[l][i])
			}
		}
	}
}

// TestOutOfCoreEagerUpdate: without clipping (fp32), each layer's host
// AdamW starts as soon as its gradients land, during the backward of the
// layers before it, and the run still matches the resident one bit for
// bit.
func TestOutOfCoreEagerUpdate(t *testing.T) {
	const steps = 3
	to := oocOptions()
	to.GradClip = 0
	wantL, wantW := runResidentWith(t, kernels.F32, to, steps)
	m, err := NewGPT(oocShape, kernels.F32)
	if err != nil {
		t.Fatal(err)
	}
	resident := OffloadOptions{Weights: offload.TierDevice, Grads: offload.TierHost, Optimizer: offload.TierHost,
		DeviceBudget: stateBytes(m) / 3}
	for name, o := range map[string]OffloadOptions{"streamed": streamed(), "resident-weights": resident} {
		t.Run(name, func(t *testing.T) {
			tr, check := newOOC(t, kernels.F32, to, o)
			gotL, gotW := trainSteps(t, tr, steps)
			check()
			sameRun(t, "resident", wantL, gotL, wantW, gotW)
			if tr.off.host.launched != len(tr.model.Layers) {
				t.Errorf("%d layer updates started during the backward, want all %d", tr.off.host.launched, len(tr.model.Layers))
			}
			if tr.Step != steps {
				t.Errorf("Step %d after %d steps", tr.Step, steps)
			}
		})
	}
}

// TestOutOfCoreEagerNonFinite: an eager update (no clipping) never
// applies non-finite gradients, nor does a speculative one (clipping,
// OffloadOptions.Speculate), which the step drops: the step reports
// Skipped and the layers keep their weights.
func TestOutOfCoreEagerNonFinite(t *testing.T) {
	eager := oocOptions()
	eager.GradClip = 0
	spec := streamed()
	spec.Speculate = true
	for _, tc := range []struct {
		name string
		to   TrainerOptions
		o    OffloadOptions
		want Speculation
	}{
		{"eager", eager, streamed(), Unspeculated},
		{"speculative", oocOptions(), spec, SpecDropped},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, check := newOOC(t, kernels.F32, tc.to, tc.o)
			ctx := context.Background()
			if err := tr.InitWeights(ctx, 7); err != nil {
				t.Fatal(err)
			}
			// A NaN in layer 0's wpe row 0 makes the loss, and with it every
			// gradient, NaN.
			before, err := tr.MasterWeights(ctx)
			if err != nil {
				t.Fatal(err)
			}
			before[0][tr.model.Layers[0].Params()[1].Offset] = float32(math.NaN())
			if err := tr.setLayerMaster(ctx, 0, f32Bytes(before[0])); err != nil {
				t.Fatal(err)
			}
			r, err := tr.TrainStep(ctx, oocFeed())
			if err != nil {
				t.Fatal(err)
			}
			if !r.Skipped || !math.IsInf(r.GradNorm, 1) || tr.Step != 1 || r.Speculation != tc.want {
				t.Errorf("step with NaN gradients: skipped %v, grad norm %v, Step %d, speculation %d (want %d)", r.Skipped, r.GradNorm, tr.Step, r.Speculation, tc.want)
			}
			if hs := tr.off.host; tc.o.Speculate && (hs.specKept != 0 || hs.specDropped == 0) {
				t.Errorf("%d speculative updates kept, %d dropped: want none kept, some dropped", hs.specKept, hs.specDropped)
			}
			after, err := tr.MasterWeights(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for l := range after {
				for i := range after[l] {
					if math.Float32bits(after[l][i]) != math.Float32bits(before[l][i]) {
						t.Fatalf("layer %d param %d changed from %v to %v by a non-finite update", l, i, before[l][i], after[l][i])
					}
				}
			}
			check()
		})
	}
}

// TestOutOfCoreOffloadActivations: activations copied to the host after
// the forward and fetched back for the backward give the resident run's
// losses and weights bit for bit, alone and mixed with recompute.
func TestOutOfCoreOffloadActivations(t *testing.T) {
	const steps = 2
	wantL, wantW := runResident(t, kernels.F32, steps)
	for _, tc := range []struct {
		name  string
		every int // every layer offloads when 1; alternate with recompute when 2
		depth int
	}{{"offload", 1, 1}, {"mixed-depth2", 2, 2}} {
		t.Run(tc.name, func(t *testing.T) {
			o := streamed()
			o.Prefetch = tc.depth
			o.Activations = make([]offload.ActPolicy, oocShape.Layers+2)
			for i := range o.Activations {
				o.Activations[i] = offload.OffloadTo
				if tc.every == 2 && i%2 == 0 {
					o.Activations[i] = offload.Recompute
				}
			}
			tr, check := newOOC(t, kernels.F32, oocOptions(), o)
			gotL, gotW := trainSteps(t, tr, steps)
			check()
			sameRun(t, "resident", wantL, gotL, wantW, gotW)
			var offloaded int
			for _, iv := range tr.off.train.Intervals {
				if iv.Class == schedule.Acts && iv.Evict {
					offloaded++
				}
			}
			if offloaded == 0 {
				t.Error("no activations were offloaded")
			}
		})
	}
}

// TestOutOfCoreDelayedUpdate: with DelayedUpdate the first step matches
// the synchronous run (nothing to delay yet), the second already differs
// (it computes on stale weights), the loss still goes down, and streamed
// and device-resident weights give the same run bit for bit.
func TestOutOfCoreDelayedUpdate(t *testing.T) {
	const steps = 9
	to := oocOptions()
	to.Schedule = LRSchedule{Peak: 3e-3, Min: 3e-3, Warmup: 0, Steps: steps}
	syncL, _ := runOOCWith(t, kernels.F32, to, streamed(), 2)
	m, err := NewGPT(oocShape, kernels.F32)
	if err != nil {
		t.Fatal(err)
	}
	resident := OffloadOptions{Weights: offload.TierDevice, Grads: offload.TierHost, Optimizer: offload.TierHost,
		DeviceBudget: stateBytes(m) / 3}
	var firstL []float64
	var firstW [][]float32
	for _, o := range []OffloadOptions{streamed(), resident} {
		t.Run(o.Weights.String()+"-weights", func(t *testing.T) {
			o.DelayedUpdate = true
			gotL, gotW := runOOCWith(t, kernels.F32, to, o, steps)
			if firstL == nil {
				firstL, firstW = gotL, gotW
			} else {
				// Where the weights live changes nothing.
				sameRun(t, "streamed", firstL, gotL, firstW, gotW)
			}
			if math.Float64bits(gotL[0]) != math.Float64bits(syncL[0]) {
				t.Errorf("step 0: loss %v, synchronous %v", gotL[0], syncL[0])
			}
			if gotL[1] == syncL[1] {
				t.Errorf("step 1: loss %v equals the synchronous run's: the update was not delayed", gotL[1])
			}
			// The feed cycles every 3 steps: compare the same batches.
			first, last := gotL[0]+gotL[1]+gotL[2], gotL[6]+gotL[7]+gotL[8]
			if !(last < first) {
				t.Errorf("delayed update does not converge: losses %v", gotL)
			}
		})
	}
}

// TestOutOfCoreEvaluate: evaluation streams the weights through the eval
// schedule and gives the resident trainer's loss bit for bit.
func TestOutOfCoreEvaluate(t *testing.T) {
	ctx := context.Background()
	eval := func(tr *Trainer) float64 {
		t.Helper()
		trainSteps(t, tr, 2)
		l, err := tr.Evaluate(ctx, oocFeed(), 3)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	m, err := NewGPT(oocShape, kernels.F32)
	if err != nil {
		t.Fatal(err)
	}
	res, err := NewTrainer(openCPU(t), m, oocOptions())
	if err != nil {
		t.Fatal(err)
	}
	defer res.Close()
	want := eval(res)
	tr, check := newOOC(t, kernels.F32, oocOptions(), streamed())
	got := eval(tr)
	check()
	if math.Float64bits(got) != math.Float64bits(want) {
		t.Errorf("out-of-core eval loss %v, resident %v", got, want)
	}
}

// TestOutOfCoreDiskWriteFailure: when a write of the optimizer's disk
// tier fails mid-run, the error names the file and the cause, and the
// checkpoint saved before is intact.
func TestOutOfCoreDiskWriteFailure(t *testing.T) {
	ctx := context.Background()
	diskDir, ckDir := t.TempDir(), t.TempDir()
	o := streamed()
	o.Optimizer, o.DiskDir, o.DiskBudget = offload.TierDisk, diskDir, 64<<20
	tr, check := newOOC(t, kernels.F32, oocOptions(), o)
	trainSteps(t, tr, 1)
	w, opt, err := tr.SaveTensors(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.EnsureDefaults()
	ck := &Checkpoint{State: TrainState{Step: tr.Step, ConfigHash: cfg.Hash(), Config: cfg}, Weights: w, Optim: opt}
	path, err := SaveCheckpoint(ckDir, ck, 0)
	if err != nil {
		t.Fatal(err)
	}
	// The disk fills up: every write of layer 5's second moment fails.
	bad := offload.Key{Layer: 5, Class: offload.AdamV}
	badFile := filepath.Join(diskDir, bad.FileName())
	tr.off.host.storeHook = func(k offload.Key) error {
		if k == bad {
			return &os.PathError{Op: "write", Path: badFile, Err: syscall.ENOSPC}
		}
		return nil
	}
	feed := oocFeed()
	var stepErr error
	for s := 0; s < 3 && stepErr == nil; s++ {
		_, stepErr = tr.TrainStep(ctx, feed)
	}
	if stepErr == nil {
		_, _, stepErr = tr.SaveTensors(ctx)
	}
	if stepErr == nil || !errors.Is(stepErr, syscall.ENOSPC) || !strings.Contains(stepErr.Error(), badFile) ||
		!strings.Contains(stepErr.Error(), tr.model.Layers[5].Name()) {
		t.Fatalf("after a failed write: error %v, want one naming %s, layer %s and ENOSPC", stepErr, badFile, tr.model.Layers[5].Name())
	}
	check()
	got, err := LoadCheckpoint(path)
	if err != nil {
		t.Fatalf("the checkpoint saved before the failure: %v", err)
	}
	if got.State.Step != 1 || len(got.Weights) != len(w) || len(got.Optim) != len(opt) {
		t.Fatalf("checkpoint holds step %d, %d weights, %d moments", got.State.Step, len(got.Weights), len(got.Optim))
	}
	saved := map[string][]byte{}
	for _, x := range append(w, opt...) {
		saved[x.Name] = x.Data
	}
	for _, x := range append(got.Weights, got.Optim...) {
		if !bytes.Equal(saved[x.Name], x.Data) {
			t.Fatalf("checkpoint tensor %s differs from what was saved", x.Name)
		}
	}
}

// TestOutOfCoreResidencyTable: the residency table records every class of
// every layer and follows the executor. During each access every tensor
// the table places on the device has a live cache block of its class;
// offloaded activations and recompute checkpoints appear and go. After each
// step nothing is in flight, no activation is recorded, the master and
// the moments are where the options put them, streamed weights and
// gradients are on the host only, resident gradients on the device and the
// host, and the host bytes of the table are the trainer's HostBytes.
func TestOutOfCoreResidencyTable(t *testing.T) {
	offloadActs := func(o OffloadOptions) OffloadOptions {
		o.Activations = make([]offload.ActPolicy, oocShape.Layers+2)
		for i := range o.Activations {
			o.Activations[i] = offload.OffloadTo
			if i%2 == 0 {
				o.Activations[i] = offload.Recompute
			}
		}
		return o
	}
	for _, tc := range []struct {
		name string
		o    func(t *testing.T) OffloadOptions
	}{
		{"stream", func(*testing.T) OffloadOptions { return streamed() }},
		{"offload-depth2", func(*testing.T) OffloadOptions { o := offloadActs(streamed()); o.Prefetch = 2; return o }},
		{"disk", func(t *testing.T) OffloadOptions {
			o := streamed()
			o.Optimizer, o.DiskDir, o.DiskBudget = offload.TierDisk, t.TempDir(), 64<<20
			return o
		}},
		{"resident", func(*testing.T) OffloadOptions {
			o := streamed()
			o.Weights, o.Grads = offload.TierDevice, offload.TierDevice
			o.DeviceBudget = 4 * stateBytes(mustGPT(t))
			return o
		}},
		{"delayed", func(*testing.T) OffloadOptions { o := streamed(); o.DelayedUpdate = true; return o }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.o(t)
			tr, _ := newOOC(t, kernels.F32, oocOptions(), o)
			st := tr.off
			n := len(tr.model.Layers)
			var sawHostActs, sawCkpt, sawDevice bool
			st.accessHook = func(j int) {
				dev := map[offload.Class]int64{}
				for _, r := range st.table.Snapshot() {
					if r.Key.Class == offload.Activations && r.Valid.Has(offload.TierHost) {
						sawHostActs = true
					}
					if r.Key.Part == offload.PartCheckpoint {
						sawCkpt = true
					}
					if r.Valid.Has(offload.TierDevice) || (r.InFlight && r.Moving.To == offload.TierDevice) {
						dev[r.Key.Class] += schedule.RoundBlock(r.Bytes)
						sawDevice = true
					}
				}
				cs := st.cache.Stats()
				for cl, b := range dev {
					if got := cs.ByClass[cl].Allocated; b > got {
						t.Fatalf("access %d: the table has %d bytes of %s on the device, the cache %d", j, b, cl, got)
					}
				}
			}
			ctx := context.Background()
			if err := tr.InitWeights(ctx, 7); err != nil {
				t.Fatal(err)
			}
			feed := oocFeed()
			for step := 0; step < 3; step++ {
				if _, err := tr.TrainStep(ctx, feed); err != nil {
					t.Fatal(err)
				}
				if err := st.host.waitUpdates(); err != nil {
					t.Fatal(err)
				}
				if err := tr.ResidencyErr(); err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
				snap := tr.Residency()
				if len(snap) != 5*n {
					t.Fatalf("step %d: %d entries, want 5 classes of %d layers: %v", step, len(snap), n, snap)
				}
				host := map[offload.Class]int64{}
				for _, r := range snap {
					want := "host"
					switch r.Key.Class {
					case offload.AdamM, offload.AdamV:
						if o.Optimizer == offload.TierDisk {
							want = "disk"
						}
					case offload.Grads:
						if o.Grads == offload.TierDevice {
							want = "device+host"
						}
					case offload.Activations:
						t.Fatalf("step %d: %s still recorded after the step", step, r.Key)
					}
					if r.InFlight || r.Valid.String() != want {
						t.Fatalf("step %d: %s valid on %s (in flight %v), want %s", step, r.Key, r.Valid, r.InFlight, want)
					}
					if r.Valid.Has(offload.TierHost) {
						host[r.Key.Class] += r.Bytes
					}
				}
				// fp32 without DelayedUpdate: the weights are the master's memory.
				var total int64
				for cl, b := range host {
					if cl != offload.Weights || o.DelayedUpdate {
						total += b
					}
				}
				// Outside the table: one activation buffer per offloading
				// layer, and the spare weights and gradients of DelayedUpdate.
				var extra int64
				for _, n := range st.train.HostSlots {
					extra += 4 * ((n + 3) / 4)
				}
				if o.DelayedUpdate {
					extra += host[offload.Weights] + host[offload.Grads]
				}
				var maxDisk int64 // the disk tier's buffers
				for i, l := range tr.model.Layers {
					if st.host.tier[i] == offload.TierDisk {
						maxDisk = max(maxDisk, int64(l.NumParams()))
					}
				}
				extra += int64(len(st.host.bufs)) * 8 * maxDisk
				if got := tr.HostBytes(); got != total+extra {
					t.Errorf("step %d: host bytes %d, the table's %d + %d outside it", step, got, total, extra)
				}
				cs := st.cache.Stats()
				var devGrads int64
				for _, r := range snap {
					if r.Key.Class == offload.Grads && r.Valid.Has(offload.TierDevice) {
						devGrads += schedule.RoundBlock(r.Bytes)
					}
				}
				for _, iv := range st.train.Intervals { // the head's tied gradients: not in the table
					if iv.Class == schedule.TGrads && iv.Persistent {
						devGrads += schedule.RoundBlock(iv.Bytes)
					}
				}
				if want := cs.ByClass[offload.Grads].Allocated; devGrads != want {
					t.Errorf("step %d: table has %d bytes of gradients on the device, the cache %d", step, devGrads, want)
				}
				if o.Weights == offload.TierHost && cs.ByClass[offload.Weights].Allocated != 0 {
					t.Errorf("step %d: %d bytes of streamed weights left on the device", step, cs.ByClass[offload.Weights].Allocated)
				}
			}
			if !sawDevice {
				t.Error("the table never placed a tensor on the device")
			}
			if !sawCkpt {
				t.Error("no recompute checkpoint was recorded")
			}
			if o.Activations != nil && !sawHostActs {
				t.Error("no offloaded activations were recorded on the host")
			}
		})
	}
}

func mustGPT(t *testing.T) *Model {
	t.Helper()
	m, err := NewGPT(oocShape, kernels.F32)
	if err != nil {
		t.Fatal(err)
	}
	return m
}
