package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/spill-ml/spill/dataset"
	"github.com/spill-ml/spill/kernels"
	"github.com/spill-ml/spill/offload"
	"github.com/spill-ml/spill/offload/plan"
	"github.com/spill-ml/spill/offload/schedule"
	"github.com/spill-ml/spill/stream"
)

// ActOffloadSupported says whether NewOffloadTrainer executes the
// "offload" activation policy (activations copied to the host and back);
// when false, the planner is not offered it and OffloadTo placements are
// not chosen.
var ActOffloadSupported = true

// ShardedOptimizerSupported says whether the trainers shard the optimizer
// state across the ranks of a data-parallel job (ZeRO-1/2, engine/zero.go:
// the host tier's layers). When they do, a run of several ranks lets the
// planner decide (plan.ShardAuto, or on with zero_stage) and trains as it
// decided (newRunTrainer sets TrainerOptions.ZeroStage); when not, it
// plans with sharding off, and spill plan plans it only when asked
// (--shard-optimizer).
var ShardedOptimizerSupported = true

// PlanWorld is the data-parallel job a plan is for. The zero value is one
// process.
type PlanWorld struct {
	// Ranks is the world size, one process per GPU (0 or 1: one).
	Ranks int
	// LocalRanks is how many ranks share this node's host memory and disk
	// (0: all of them): the node's host and disk budgets (host_memory,
	// disk_memory, or what the system has free) are divided among them
	// (plan.RankBudgets).
	LocalRanks int
	// Shard says whether the optimizer state is sharded across the ranks.
	Shard plan.Sharding
}

// FLOPer is implemented by layers that know their forward FLOPs per
// token at sequence length T; a layer that does not is taken as two FLOPs
// per parameter (its matmuls).
type FLOPer interface {
	FwdFLOPs(T int) float64
}

// SelectiveRecomputer is implemented by layers with a selective
// checkpoint (offload.RecomputeSelective): the first SelectiveBytes(B, T)
// bytes of their activations, output first, hold what the rest of their
// forward cannot cheaply recompute (a block's attention output and
// log-sum-exp). With those bytes in place (the trainer copies them back),
// RecomputeSelective reruns the rest of the forward, SelectiveFLOPs(T) per
// token, and leaves the activations as Forward did, bit for bit.
type SelectiveRecomputer interface {
	SelectiveBytes(B, T int) int64
	SelectiveFLOPs(T int) float64
	RecomputeSelective(q kernels.Queue, p *Pass, i int)
}

// selectiveBytes is l's selective checkpoint for a B×T micro-batch, 0
// when it has none.
func selectiveBytes(l Layer, B, T int) int64 {
	if s, ok := l.(SelectiveRecomputer); ok {
		return s.SelectiveBytes(B, T)
	}
	return 0
}

// KernelEfficiencer is implemented by layers whose kernels run their
// FLOPs at a different speed from the GPT blocks the hardware profile's
// efficiency is fitted to (plan.Layer.Efficiency).
type KernelEfficiencer interface {
	KernelEfficiency() float64
}

func layerEfficiency(l Layer) float64 {
	if e, ok := l.(KernelEfficiencer); ok {
		return e.KernelEfficiency()
	}
	return 0
}

func layerFLOPs(l Layer, T int) float64 {
	if f, ok := l.(FLOPer); ok {
		return f.FwdFLOPs(T)
	}
	return 2 * float64(l.NumParams())
}

// ModelFLOPsPerToken is the model's training FLOPs per target: three
// times every layer's forward FLOPs (FLOPer; two per parameter for a
// layer that does not say): the matmuls, a tied head's through the
// embedding's parameters, and attention over a context of T (12·embd·T
// per GPT block, the accounting of the PaLM paper's model FLOPs
// utilisation); an embedding lookup costs none.
func ModelFLOPsPerToken(m *Model, T int) float64 {
	var f float64
	for _, l := range m.Layers {
		f += layerFLOPs(l, T)
	}
	return 3 * f
}

// PlanModel is m as the planner sees it when it trains on sequences of T
// positions (T is 1 for record models): every layer's parameters, FLOPs
// and tied layers, and exact sizes from the engine's own layouts (the
// programs' layers, the trainers' fixed buffers and the resident
// trainer's allocations). The layers between the first and the last are
// recomputable, as NewOffloadTrainer treats them.
func PlanModel(name string, m *Model, T int) plan.Model {
	pm := plan.Model{Name: name, Precision: PrecisionOf(m.DType), SeqLen: T}
	n := len(m.Layers)
	es := int64(m.DType.Size())
	for i, l := range m.Layers {
		pm.Layers = append(pm.Layers, plan.Layer{
			Name:         l.Name(),
			Params:       int64(l.NumParams()),
			ActBytes:     l.ActivationBytes(1, T),
			OutBytes:     int64(l.OutputElems(1, T)) * es,
			ScratchBytes: l.ScratchBytes(1, T),
			FwdFLOPs:     layerFLOPs(l, T),
			Efficiency:   layerEfficiency(l),
			Tied:         l.Tied(),
			Recomputable: i > 0 && i < n-1,
		})
		if s, ok := l.(SelectiveRecomputer); ok && i > 0 && i < n-1 {
			pm.Layers[i].SaveBytes = s.SelectiveBytes(1, T)
			pm.Layers[i].SelFLOPs = s.SelectiveFLOPs(T)
		}
	}
	o := OffloadOptions{}
	pm.Shape = func(mb int) []schedule.Layer { return programSpec(m, mb, T, 1, &o, true).Layers }
	pm.Fixed = func(mb, accum int) int64 { return offloadFixedBytes(m, mb, T, accum) }
	pm.Resident = func(mb int) map[offload.Class]int64 { return ResidentDeviceBytes(m, mb, T) }
	pm.Comm = dataParallelDeviceBytes
	return pm
}

// dataParallelDeviceBytes is what a trainer of a data-parallel job of
// ranks allocates on the device for its collectives (newDataParallel):
// the handshake's buffers and, when the layers of sharded parameters are
// sharded, zbuf (zeroBytes: plan.CommBytes), each rounded to the offload
// cache's blocks.
func dataParallelDeviceBytes(ranks int, sharded []int64) int64 {
	n := schedule.RoundBlock(fpBytes) + schedule.RoundBlock(fpBytes*int64(ranks))
	if z := plan.CommBytes(ranks, sharded); z > 0 {
		n += schedule.RoundBlock(z)
	}
	return n
}

// PrecisionOf is the planner's precision for a compute dtype.
func PrecisionOf(dt kernels.DType) offload.Precision {
	switch dt {
	case kernels.F32:
		return offload.FP32
	case kernels.F16:
		return offload.FP16
	}
	return offload.BF16
}

// CPUHardware is a rough performance profile of the CPU backend for the
// planner: it simulates a device in host memory, so copies run at memcpy
// speed, and it leaves no reserve (the budget is all the trainer's).
func CPUHardware(threads int) offload.Hardware {
	if threads <= 0 {
		threads = runtime.GOMAXPROCS(0)
	}
	t := float64(threads)
	return offload.Hardware{
		Name: fmt.Sprintf("cpu (%d threads)", threads),
		H2D:  5e9, D2H: 5e9, Duplex: 8e9,
		FLOPS16: 1e10 * t, FLOPS32: 1e10 * t, Efficiency: 0.8, HalfEfficiencyTokens: 64,
		DeviceBandwidth: 1e10, HostAdam: 1e8 * t,
		DiskRead: 1e9, DiskWrite: 5e8,
	}
}

// byteClasses sums tensors into classes.
type byteClasses map[offload.Class]int64

func (b byteClasses) total() int64 {
	var n int64
	for _, v := range b {
		n += v
	}
	return n
}

// ResidentDeviceBytes is what NewTrainer allocates on the device for m with
// micro-batches of B rows of T positions, by class: its resident program's
// persistent blocks (the whole training state, each layer's activations
// and the output gradients) plus its fixed buffers. A resident trainer
// allocates nothing else, whatever its accumulation, so this is its exact
// device peak.
func ResidentDeviceBytes(m *Model, B, T int) map[offload.Class]int64 {
	by, err := deviceBytes(m, B, T, 1, residentOptions(m, nil))
	if err != nil {
		panic(fmt.Sprintf("engine: compiling the resident program of a %d-layer model: %v", len(m.Layers), err))
	}
	return by
}

// ioBytes is the trainer's input, target and loss buffers for micro-batches
// micro-batches (with rounding to the offload cache's blocks when round).
func ioBytes(m *Model, B, T, micro int, round bool) int64 {
	r := func(n int64) int64 {
		n *= int64(micro)
		if round {
			return schedule.RoundBlock(n)
		}
		return n
	}
	if m.Family.Input() == InputTokens {
		n := int64(B) * int64(T) * 4
		return 3 * r(n) // input, targets, losses
	}
	F := int64(m.MLP.In)
	s := r(int64(B)*F*int64(m.DType.Size())) + r(4*int64(B)) + r(4*int64(B))
	if m.DType != kernels.F32 {
		s += r(int64(B) * F * 4)
	}
	return s
}

// offloadFixedBytes is what NewOffloadTrainer allocates besides its
// programs: scratch, the io buffers of accum micro-batches and the
// gradient statistics.
func offloadFixedBytes(m *Model, B, T, accum int) int64 { return fixedBytes(m, B, T, accum) }

// fixedBytes is what a trainer allocates besides its programs: scratch,
// the io buffers of slots micro-batches (ioSlots) and the gradient
// statistics.
func fixedBytes(m *Model, B, T, slots int) int64 {
	var scratch int64
	for _, l := range m.Layers {
		scratch = max(scratch, l.ScratchBytes(B, T))
	}
	return schedule.RoundBlock(scratch) + ioBytes(m, B, T, slots, true) + schedule.RoundBlock(8*int64(len(m.Layers)))
}

// OffloadDeviceBytes is the device peak of NewOffloadTrainer(be, m, to, o)
// by class, computed from its compiled programs without allocating: the
// same figure as the trainer's PredictedDevicePeak.
func OffloadDeviceBytes(m *Model, B, T, accum int, o OffloadOptions) (map[offload.Class]int64, error) {
	o.resident = false
	return deviceBytes(m, B, T, accum, o)
}

// deviceBytes is the device peak by class of the trainer of placement o:
// its programs' peak and its fixed buffers.
func deviceBytes(m *Model, B, T, accum int, o OffloadOptions) (map[offload.Class]int64, error) {
	o.Prefetch = max(o.Prefetch, 1)
	o.Group = min(max(o.Group, 1), accum)
	tp, tby, _, err := schedule.PeakOf(programSpec(m, B, T, accum, &o, true))
	if err != nil {
		return nil, err
	}
	ep, eby, _, err := schedule.PeakOf(programSpec(m, B, T, accum, &o, false))
	if err != nil {
		return nil, err
	}
	by := tby
	if ep > tp {
		by = eby
	}
	by[offload.Workspace] += fixedBytes(m, B, T, ioSlots(&o, accum))
	for k, v := range by {
		if v == 0 {
			delete(by, k)
		}
	}
	return by, nil
}

// OffloadHostBytes is the host memory NewOffloadTrainer(be, m, to, o)
// holds for layer state and host slots, by class, computed without
// allocating: the same figure as the trainer's HostBytes (plan.HostState
// of the layers and the program's slots).
func OffloadHostBytes(m *Model, B, T, accum int, o OffloadOptions) (map[offload.Class]int64, error) {
	o.Prefetch = max(o.Prefetch, 1)
	o.Group = min(max(o.Group, 1), accum)
	p, err := schedule.Compile(programSpec(m, B, T, accum, &o, true))
	if err != nil {
		return nil, err
	}
	params := make([]int64, len(m.Layers))
	for i, l := range m.Layers {
		params[i] = int64(l.NumParams())
	}
	tiers := make([]offload.Tier, len(m.Layers))
	for i := range tiers {
		tiers[i] = o.optTier(i)
	}
	by := plan.HostStateRanks(params, int64(m.DType.Size()), m.DType != kernels.F32, o.DelayedUpdate, o.DiskMaster, tiers, plan.SlotBytes(p), o.zero.size)
	if o.Speculate {
		for cl, v := range plan.SpecState(params, int64(m.DType.Size()), m.DType != kernels.F32, tiers) {
			by[cl] += v
		}
	}
	return by, nil
}

// PlanRequest is what PlanTrainer plans for. Zero override fields leave the
// choice to the planner.
type PlanRequest struct {
	Name string // the model's name in the plan
	// B and Accum are the configured micro-batch and accumulation: a step
	// trains on B*Accum rows. The plan's micro-batch divides B.
	B, T, Accum int
	Budgets     offload.Budgets
	Hardware    offload.Hardware
	DiskDir     string // the disk tier's directory ("" = no disk tier)
	// Resident restricts the plan to the resident trainer (offload "none").
	Resident bool
	// Overrides: the tier of each class, the prefetch depth and the
	// activation policy of every recomputable layer ("keep", "recompute",
	// "recompute-full", "recompute-selective", "offload").
	Weights, Grads, Optimizer offload.Tier
	Prefetch                  int
	Activations               string
	// DelayedUpdate plans for OffloadOptions.DelayedUpdate: the resident
	// trainer is never chosen (it has no delayed update).
	DelayedUpdate bool
	// GlobalNorm: the step clips gradients or scales the loss, so the host
	// optimizer waits for the global norm (plan.Request.GlobalNorm).
	GlobalNorm bool
	// HostExtra is the run's host memory besides the layer state
	// (plan.Request.HostExtra; RunHostExtra).
	HostExtra int64
	// World is the data-parallel job: B, Accum and Budgets.Device are per
	// rank, Budgets.Host and Budgets.Disk the node's.
	World PlanWorld
}

// TrainerPlan is a placement and what the engine builds from it.
type TrainerPlan struct {
	Placement *offload.Placement
	// Resident: every class on the device, NewTrainer; else
	// NewOffloadTrainer with Options.
	Resident bool
	// B and Accum are the trainer's micro-batch and accumulation.
	B, Accum int
	Options  OffloadOptions
	// DevicePeak is the exact predicted device peak in bytes.
	DevicePeak int64
	// Lean is whether the model saves lean activations
	// (Model.SetLeanActivations): on for every plan that does not fit
	// the device as it is.
	Lean bool
	// HostNote, when not "", says that the system had less host memory
	// free than the configured budget and the plan needed, and that the
	// run was planned again for what is free (governHost).
	HostNote string
	// PlanTime is how long planning took (a run's start-up phase).
	PlanTime time.Duration
}

// PlanTrainer chooses how to train m within req's budgets with the one
// planner (offload/plan): the placement of every tensor class, the order
// of the step, the prefetch depth, the activation policy and the largest
// micro-batch (dividing req.B) that fits, with exact device peaks from
// the trainers' programs. Without overrides, the resident trainer at
// micro-batch req.B is chosen whenever it fits. It fails with the
// planner's *offload.InfeasibleError when nothing fits.
func PlanTrainer(m *Model, req PlanRequest) (*TrainerPlan, error) {
	if req.DelayedUpdate && req.Resident {
		return nil, errors.New("engine: plan: the resident trainer has no delayed update")
	}
	if !req.Resident && !req.DelayedUpdate && req.Weights == 0 && req.Grads == 0 && req.Optimizer == 0 && req.Prefetch == 0 && req.Activations == "" {
		r := req
		r.Resident = true
		if p, err := planTrainer(m, r); err == nil {
			return p, nil
		}
	}
	return planTrainer(m, req)
}

func planTrainer(m *Model, req PlanRequest) (*TrainerPlan, error) {
	if req.B <= 0 || req.T <= 0 || req.Accum <= 0 {
		return nil, fmt.Errorf("engine: plan: batch %d, seq %d, accum %d must be positive", req.B, req.T, req.Accum)
	}
	switch req.Activations {
	case "", "keep", "recompute", "recompute-full", "recompute-selective":
	case "offload":
		if !ActOffloadSupported {
			return nil, errors.New("engine: plan: activations \"offload\" is not supported by the out-of-core trainer yet (use recompute)")
		}
	default:
		return nil, fmt.Errorf("engine: plan: unknown activation policy %q", req.Activations)
	}
	hasDisk := req.DiskDir != "" && req.Budgets.Disk > 0
	budgets := req.Budgets
	if !hasDisk {
		budgets.Disk = 0
	}
	allow := func(p *offload.Placement) bool {
		if req.B%p.MicroBatch != 0 || p.Weights == offload.TierDisk || p.Grads == offload.TierDisk {
			return false
		}
		resident := p.Optimizer == offload.TierDevice
		if req.Resident && (!resident || p.MicroBatch != req.B) {
			return false
		}
		if p.Offload > 0 && !ActOffloadSupported {
			return false
		}
		if (req.Weights != 0 && p.Weights != req.Weights) || (req.Grads != 0 && p.Grads != req.Grads) ||
			(req.Optimizer != 0 && p.Optimizer != req.Optimizer && (req.Optimizer != offload.TierHost || p.Optimizer != offload.TierDisk)) {
			return false
		}
		if req.Prefetch > 0 && !resident && p.PrefetchDepth != req.Prefetch {
			return false
		}
		switch req.Activations {
		case "keep":
			return p.Recompute+p.Offload == 0
		case "recompute":
			return p.Keep+p.Offload == 0
		case "recompute-full":
			return p.Keep+p.Offload == 0 && !p.Selective
		case "recompute-selective":
			return p.Keep+p.Offload == 0 && p.Selective
		case "offload":
			return p.Keep+p.Recompute == 0
		}
		return true
	}
	maxPrefetch := 2
	if req.Prefetch > maxPrefetch {
		maxPrefetch = req.Prefetch
	}
	pl, err := plan.Plan(plan.Request{
		Model: PlanModel(req.Name, m, req.T), Batch: req.B * req.Accum, Budgets: budgets, Hardware: req.Hardware,
		Allow: allow, DelayedUpdate: req.DelayedUpdate, MaxPrefetch: maxPrefetch, GlobalNorm: req.GlobalNorm,
		Optimizer: req.Optimizer, HostExtra: req.HostExtra,
		Ranks: req.World.Ranks, LocalRanks: req.World.LocalRanks, Shard: req.World.Shard,
	})
	if err != nil {
		return nil, err
	}
	if d := pl.Data; d != nil && !d.ShardOptimizer && !ShardedOptimizerSupported {
		d.ShardWhy = "off: the trainers do not shard the optimizer state yet (spill plan --shard-optimizer auto plans for it)"
	}
	tp := &TrainerPlan{Placement: pl, Resident: pl.Optimizer == offload.TierDevice, B: pl.MicroBatch, Accum: pl.Accum}
	tp.DevicePeak = pl.Memory[0].Peak - pl.Memory[0].Reserve
	if !tp.Resident {
		if d := pl.Data; d != nil {
			budgets = plan.RankBudgets(budgets, d.LocalRanks) // the trainer's pools are this rank's
		}
		tp.Options = optionsFor(pl, req, budgets)
	}
	return tp, nil
}

// optionsFor maps a placement to the out-of-core trainer's options.
func optionsFor(p *offload.Placement, req PlanRequest, b offload.Budgets) OffloadOptions {
	o := OffloadOptions{
		Weights: p.Weights, Grads: p.Grads, Optimizer: p.Optimizer, Group: p.Group,
		Prefetch: max(p.PrefetchDepth, 1), DeviceBudget: b.Device,
		DelayedUpdate: req.DelayedUpdate, HostBudget: b.Host, Speculate: p.SpeculativeUpdate,
	}
	if p.Optimizer == offload.TierDisk {
		o.DiskDir, o.DiskBudget, o.DiskMaster = req.DiskDir, b.Disk, p.MasterOnDisk
	}
	if p.OptimizerSplit() != p.Optimizer.String() {
		// Placed per layer (device, host, disk).
		o.OptimizerTiers = make([]offload.Tier, len(p.Layers))
		for i, l := range p.Layers {
			o.OptimizerTiers[i] = l.Optimizer
		}
	}
	o.Activations = make([]offload.ActPolicy, len(p.Layers))
	for i, l := range p.Layers {
		o.Activations[i] = l.Policy
	}
	return o
}

// MemoryError is a device budget failure of a run: the typed budget error
// (what was requested, what was held and by which class, and the plan that
// would fit) and the device memory summary at the time.
type MemoryError struct {
	Err     *offload.BudgetError
	Summary string
}

func (e *MemoryError) Error() string {
	if e.Summary == "" {
		return e.Err.Error()
	}
	return e.Err.Error() + "\n" + strings.TrimRight(e.Summary, "\n")
}

// Unwrap returns the budget error (which wraps offload.ErrBudget and
// kernels.ErrOutOfMemory).
func (e *MemoryError) Unwrap() error { return e.Err }

// tagClass maps the tag of a device buffer of the offload cache
// ("offload/<class>") to its tensor class.
func tagClass(tag string) offload.Class {
	if c, err := offload.ParseClass(strings.TrimPrefix(tag, "offload/")); err == nil {
		return c
	}
	return offload.Workspace
}

// residentBudgetError turns a resident trainer's out-of-memory error into a
// *MemoryError with the classes held and hint.
func residentBudgetError(oom *kernels.OOMError, ms kernels.MemStats, hint string) *MemoryError {
	be := &offload.BudgetError{
		Tier: offload.TierDevice, Class: tagClass(oom.Tag), Requested: oom.Requested, Limit: oom.Limit,
		Reserved: oom.Allocated, Allocated: oom.Allocated, ByClass: map[offload.Class]int64{}, Hint: hint,
	}
	for tag, n := range oom.ByTag {
		be.ByClass[tagClass(tag)] += n
	}
	return &MemoryError{Err: be, Summary: residentSummary(kernels.MemStats{Limit: oom.Limit, Allocated: oom.Allocated,
		Peak: ms.Peak, Allocs: ms.Allocs, Frees: ms.Frees, Failed: ms.Failed, ByTag: oom.ByTag})}
}

// residentSummary renders a backend's memory statistics as the offload
// cache's MemorySummary table, the buffer tags mapped to classes.
func residentSummary(ms kernels.MemStats) string {
	st := offload.CacheStats{Limit: ms.Limit, Allocated: ms.Allocated, Requested: ms.Allocated, Reserved: ms.Allocated,
		PeakAllocated: ms.Peak, PeakReserved: ms.Peak, Allocs: ms.Allocs, Frees: ms.Frees, BudgetFailures: ms.Failed,
		Source: "resident trainer (state allocated once; blocks not counted per class)"}
	for tag, n := range ms.ByTag {
		// The resident trainer allocates its state once and frees
		// nothing before Close: what a class holds is its peak.
		c := tagClass(tag)
		st.ByClass[c].Allocated += n
		st.ByClass[c].Reserved += n
		st.ByClass[c].Peak += n
	}
	return st.MemorySummary()
}

// deviceBudget is the device budget a run plans for: the configured one,
// else the backend's own limit (0: none).
func deviceBudget(cfg *Config, be kernels.Backend) int64 {
	if cfg.DeviceMemory > 0 {
		return cfg.DeviceMemory
	}
	return be.MemStats().Limit
}

// loaderBatches is how many batches the data loader of a run holds at
// most (dataset.LoaderOptions.Prefetch for the 2 workers Run starts).
const loaderBatches = 2*2 + 2

// RunHostExtra is the host memory a run of m (micro-batches of at most B
// rows of T positions, cfg.Accum of them a step) allocates besides the
// layers' state, for the planner to count (PlanRequest.HostExtra): the
// data loader's batches, the out-of-core trainer's batches of a step,
// and, when the run checkpoints, the one tensor a checkpoint streams
// through (the largest, in fp32) and the files' I/O buffers. The backend's
// own host memory (the CPU backend's pool, CUDA's pinned staging) is not
// counted: the hardware profile's HostReserve is for it.
func RunHostExtra(cfg *Config, m *Model, B, T int) int64 {
	row := ioBytes(m, 1, T, 1, false)
	n := int64(loaderBatches*B+B*max(cfg.Accum, 1)+B) * row
	if cfg.CheckpointDir != "" {
		var largest int64
		for _, l := range m.Layers {
			for _, ps := range l.Params() {
				largest = max(largest, 4*int64(ps.Elems()))
			}
		}
		n += largest + 2*safetensorsIOBuf
	}
	return n
}

// HostMargin is what the default host budget leaves of MemAvailable to
// the operating system, the page cache and the rest of the process: 5% of
// it, at least 2 GiB (the hardware profile's HostReserve comes on top).
func HostMargin(avail int64) int64 { return max(avail/20, 2<<30) }

// readHostLimits reads the system's memory limits (offload.ReadLimits;
// tests replace it).
var readHostLimits = offload.ReadLimits

// DefaultHostBudget is the host budget of a run with no host_memory:
// MemAvailable less HostMargin (8 GiB when MemAvailable is unknown).
func DefaultHostBudget() int64 {
	if lim, err := readHostLimits(); err == nil && lim.MemAvailable > 0 {
		return max(lim.MemAvailable-HostMargin(lim.MemAvailable), 1<<30)
	}
	return 8 << 30
}

// DefaultDiskDir is the disk tier's directory when disk_dir is not set:
// "offload" beside the checkpoints when there are any, else
// spill/offload in the user's cache directory.
func DefaultDiskDir(cfg *Config) string {
	if cfg.CheckpointDir != "" {
		return filepath.Join(cfg.CheckpointDir, "offload")
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "spill", "offload")
	}
	return filepath.Join(os.TempDir(), "spill-offload")
}

// diskFree is the free space of dir, or of its nearest existing parent.
func diskFree(dir string) (int64, error) {
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(d); err == nil {
			return offload.DiskFree(d)
		}
		if p := filepath.Dir(d); p == d {
			return 0, fmt.Errorf("engine: no existing directory above %s", dir)
		}
	}
}

// planRequest is the PlanRequest of a run on a device of kind device
// ("cpu" or "cuda").
func planRequest(cfg *Config, device string, B, T int, budget int64) PlanRequest {
	req := PlanRequest{Name: cfg.Model, B: B, T: T, Accum: cfg.Accum, DiskDir: cfg.DiskDir,
		Resident: cfg.Offload == OffloadNone, Prefetch: cfg.Prefetch, Activations: cfg.Activations,
		DelayedUpdate: cfg.DelayedUpdate, GlobalNorm: cfg.GradClip > 0 || cfg.Precision == "fp16"}
	req.Budgets.Device = budget
	req.Budgets.Host = cfg.HostMemory
	if req.Budgets.Host == 0 {
		req.Budgets.Host = DefaultHostBudget()
	}
	if req.DiskDir == "" {
		req.DiskDir = DefaultDiskDir(cfg)
	}
	req.Budgets.Disk = cfg.DiskMemory
	if req.Budgets.Disk == 0 {
		if free, err := diskFree(req.DiskDir); err == nil {
			req.Budgets.Disk = free / 10 * 9
		}
	}
	tier := func(s string) offload.Tier {
		var t offload.Tier
		if s != "" {
			_ = t.UnmarshalText([]byte(s)) // Validate checked the name
		}
		return t
	}
	req.Weights, req.Grads, req.Optimizer = tier(cfg.OffloadWeights), tier(cfg.OffloadGrads), tier(cfg.OffloadOptimizer)
	if device == "cpu" {
		req.Hardware = CPUHardware(cfg.Threads)
	} else {
		req.Hardware = offload.H200()
		// The budget is the backend's limit too, and the CUDA backend takes
		// its own workspaces (cuBLASLt, attention scratch) from it: a plan
		// that left it 4 MiB failed on the H200 (2026-12-03).
		req.Hardware.DeviceReserve = 256 << 20
	}
	return req
}

// planHint is the hint of a budget error: the plan that would fit.
func planHint(m *Model, req PlanRequest) string {
	req.Resident = false
	req.Weights, req.Grads, req.Optimizer, req.Prefetch, req.Activations = 0, 0, 0, 0, ""
	p, err := PlanTrainer(m, req)
	if err != nil {
		return fmt.Sprintf("no plan fits either: %v", err)
	}
	if p.Resident {
		return fmt.Sprintf("a plan that fits: resident with micro-batch %d x %d accumulation steps", p.B, p.Accum)
	}
	return p.Placement.Hint() + " (run with offload = auto)"
}

// hasOverrides reports whether cfg pins any placement choice.
func (c *Config) hasOverrides() bool {
	return c.OffloadWeights != "" || c.OffloadGrads != "" || c.OffloadOptimizer != "" || c.Prefetch != 0 || c.Activations != "" ||
		c.DelayedUpdate
}

// choosePlan decides how a run of m trains on a device of kind device
// under budget (0: none), with the hardware profile hw (nil: the
// device's default): resident, as without a budget, when the state
// fits the budget (or offload is "none"), else as PlanTrainer plans. It
// allocates nothing: a plan that cannot fit is refused here. The plan has
// B and Accum set to what the trainer uses and DevicePeak to its exact
// device peak. spill train (newRunTrainer) and spill plan (PlanConfig)
// both decide here.
func choosePlan(cfg *Config, device string, m *Model, B, T int, budget int64, hw *offload.Hardware) (*TrainerPlan, PlanRequest, error) {
	return choosePlanWorld(cfg, device, m, B, T, budget, hw, PlanWorld{})
}

// choosePlanWorld is choosePlan for one rank of the job w: the device
// budget is each GPU's, the host and disk budgets the node's, shared by
// w's local ranks.
func choosePlanWorld(cfg *Config, device string, m *Model, B, T int, budget int64, hw *offload.Hardware, w PlanWorld) (*TrainerPlan, PlanRequest, error) {
	residentPeak := byteClasses(ResidentDeviceBytes(m, B, T)).total()
	req := planRequest(cfg, device, B, T, budget)
	req.World = w
	req.HostExtra = RunHostExtra(cfg, m, B, T)
	if hw != nil {
		req.Hardware = *hw
	}
	if cfg.Offload == OffloadNone || (!cfg.hasOverrides() && (budget == 0 || residentPeak <= budget)) {
		tp := &TrainerPlan{Resident: true, B: B, Accum: cfg.Accum, DevicePeak: residentPeak}
		if budget > 0 {
			r := req
			r.Resident = true
			if p, err := PlanTrainer(m, r); err == nil {
				tp.Placement = p.Placement
			}
		}
		return tp, req, nil
	}
	r := req
	if budget <= 0 {
		// Overrides without a device budget: plan as if the device were
		// unbounded and leave the cache without a limit.
		r.Budgets.Device = 1 << 60
	}
	// A model that does not fit as it is saves lean activations: a few
	// elementwise passes of recomputation cost less than the layers the
	// memory would otherwise recompute whole or send over PCIe.
	lean := m.SetLeanActivations(budget > 0)
	tp, err := PlanTrainer(m, r)
	if err != nil {
		m.SetLeanActivations(false)
		return nil, req, fmt.Errorf("engine: planning for a device budget of %s: %w", kernels.FormatBytes(budget), err)
	}
	tp.Lean = lean && budget > 0
	if tp.Lean && tp.Placement != nil {
		tp.Placement.Notes = append(tp.Placement.Notes, "lean: blocks save no layer-norm or GELU outputs; the backward recomputes them")
	}
	delayedAlternative(m, r, tp)
	if budget <= 0 {
		tp.Options.DeviceBudget = 0
	}
	return tp, req, nil
}

// delayedAlternative adds to an out-of-core plan chosen without
// --delayed-update the best plan with it, when that is faster: the
// opt-in a user would reach for (DeepSpeed's delayed parameter update),
// with what it costs (weights one step stale).
func delayedAlternative(m *Model, r PlanRequest, tp *TrainerPlan) {
	if tp.Resident || tp.Placement == nil || r.DelayedUpdate || r.Resident || r.Optimizer == offload.TierDevice || r.World.Ranks > 1 {
		return
	}
	r.DelayedUpdate = true
	d, err := PlanTrainer(m, r)
	if err != nil || d.Placement == nil || d.Placement.StepTime >= 0.97*tp.Placement.StepTime {
		return
	}
	p := tp.Placement
	p.Alternatives = append(p.Alternatives, offload.Alternative{
		Family:   "with --delayed-update",
		Summary:  d.Placement.Summary(),
		StepTime: d.Placement.StepTime,
		Why: fmt.Sprintf("%.0f%% faster, but not chosen: an opt-in that changes the math (each step's host optimizer runs during the next, the weights one step stale)",
			100*(1-d.Placement.StepTime/p.StepTime)),
	})
}

// governHost is the host-memory governor of a run, applied to the plan
// choosePlan made before anything is allocated. The plan counts every
// large host allocation of the run (the layers' state, the disk tier's
// buffers, the batches, the checkpoints' buffers: RunHostExtra) and its
// hardware reserve; what the system can give the run is MemAvailable, read
// now, less HostMargin for the operating system and the page cache. When
// the plan needs more than that (a host_memory above what is free now),
// governHost says so in the plan's HostNote and plans again for what is
// left, moving optimizer state to disk where there is a disk tier; when
// nothing fits that, it refuses the run, naming both figures and the
// planner's shortfalls. A resident plan keeps nothing of the model on the
// host and is left as it is.
func governHost(cfg *Config, device string, m *Model, B, T int, budget int64, tp *TrainerPlan, req PlanRequest) (*TrainerPlan, PlanRequest, error) {
	if tp.Resident || tp.Placement == nil {
		return tp, req, nil
	}
	lim, err := readHostLimits()
	if err != nil || lim.MemAvailable <= 0 {
		return tp, req, nil // unknown: the configured budget stands
	}
	margin := HostMargin(lim.MemAvailable)
	left := lim.MemAvailable - margin
	// A rank of several on the node has its share of what is left, as
	// its plan has its share of the node's budget.
	need := tp.Placement.Memory[1].Peak
	if d := tp.Placement.Data; d != nil && d.LocalRanks > 1 {
		need *= int64(d.LocalRanks)
	}
	if need <= left {
		return tp, req, nil
	}
	why := fmt.Sprintf("host memory: MemAvailable is %s; less %s for the system and the page cache, %s is left for this run, and the plan for a host budget of %s needs %s",
		kernels.FormatBytes(lim.MemAvailable), kernels.FormatBytes(margin), kernels.FormatBytes(max(left, 0)),
		kernels.FormatBytes(req.Budgets.Host), kernels.FormatBytes(need))
	if left <= 0 {
		return nil, req, fmt.Errorf("engine: %s: nothing is left to plan for", why)
	}
	c := *cfg
	c.HostMemory = left
	tp2, req2, err := choosePlanWorld(&c, device, m, B, T, budget, &req.Hardware, req.World)
	if err != nil {
		return nil, req, fmt.Errorf("engine: %s; planning again for %s: %w", why, kernels.FormatBytes(left), err)
	}
	tp2.HostNote = why + "; planned again for " + kernels.FormatBytes(left)
	if tp2.Placement != nil {
		tp2.Placement.Notes = append(tp2.Placement.Notes, tp2.HostNote)
	}
	return tp2, req2, nil
}

// newRunTrainer builds the trainer of the plan choosePlan decides (and
// governHost checks). rec, if not nil, is the out-of-core trainer's
// recorder (OffloadOptions.Recorder); comm, if not nil, makes it a rank
// of a data-parallel job (TrainerOptions.Comm). The plan is per rank.
func newRunTrainer(cfg *Config, be kernels.Backend, m *Model, B, T int, rec *stream.Recorder, comm kernels.Comm) (*Trainer, *TrainerPlan, error) {
	t0 := time.Now()
	budget := deviceBudget(cfg, be)
	tp, req, err := choosePlanWorld(cfg, be.Name(), m, B, T, budget, nil, runWorld(cfg, comm, os.Getenv))
	if err != nil {
		return nil, nil, err
	}
	if tp, req, err = governHost(cfg, be.Name(), m, B, T, budget, tp, req); err != nil {
		return nil, nil, err
	}
	tp.PlanTime = time.Since(t0)
	to := trainerOptions(cfg, tp.B, T)
	to.Accum = tp.Accum
	to.Comm = comm
	to.ZeroStage = zeroStage(cfg, tp)
	if tp.Resident {
		tr, err := newTrainer(be, m, to, residentOptions(m, rec))
		if err != nil {
			var oom *kernels.OOMError
			if errors.As(err, &oom) {
				ms := be.MemStats()
				return nil, nil, residentBudgetError(oom, ms, planHint(m, req))
			}
			return nil, nil, err
		}
		return tr, tp, nil
	}
	tp.Options.Recorder = rec
	if tp.Options.HostLimits == nil {
		tp.Options.HostLimits = readHostLimits // the pool reads what the governor read
	}
	tr, err := NewOffloadTrainer(be, m, to, tp.Options)
	if err != nil {
		return nil, nil, err
	}
	hint := tp.Placement.Hint()
	tr.Cache().SetHint(func(int64, offload.Class) string { return "planned: " + hint })
	return tr, tp, nil
}

// runWorld is the PlanWorld of a rank of comm's job (one process without
// comm): the node's ranks are LOCAL_WORLD_SIZE (spill train
// --nproc-per-node and torchrun set it), else all of them; the optimizer
// state is sharded only where the trainers can (ShardedOptimizerSupported):
// as the planner decides, or always with zero_stage 1 or 2.
func runWorld(cfg *Config, comm kernels.Comm, getenv func(string) string) PlanWorld {
	if comm == nil || comm.Size() <= 1 {
		return PlanWorld{}
	}
	w := PlanWorld{Ranks: comm.Size(), Shard: plan.ShardOff}
	if n, err := strconv.Atoi(strings.TrimSpace(getenv("LOCAL_WORLD_SIZE"))); err == nil && n > 0 && n <= w.Ranks {
		w.LocalRanks = n
	}
	switch {
	case !ShardedOptimizerSupported:
	case cfg.ZeroStage > 0:
		w.Shard = plan.ShardOn
	default:
		w.Shard = plan.ShardAuto
	}
	return w
}

// zeroStage is the trainer's ZeroStage for plan tp: the configured stage
// (2 when the planner chose to shard with zero_stage unset) when the plan
// shards the optimizer state, else 0. The plan and the trainer agree on
// every rank: they all plan alike.
func zeroStage(cfg *Config, tp *TrainerPlan) int {
	if tp.Placement == nil || tp.Placement.Data == nil || !tp.Placement.Data.ShardOptimizer {
		return 0
	}
	if cfg.ZeroStage > 0 {
		return cfg.ZeroStage
	}
	return 2
}

// PlanConfig plans the run cfg describes exactly as Run would on a device
// of kind device ("cpu" or "cuda") whose memory is deviceLimit bytes (used
// when cfg.DeviceMemory is 0), without opening a device and reading no
// more of the data than its schema; hw, if not nil, replaces the
// hardware profile. It returns the plan Run would train with (spill plan
// prints it). Without data, a full-size GPT preset is planned for token
// sequences of seq_len (default: the model's context).
func PlanConfig(ctx context.Context, cfg Config, device string, deviceLimit int64, hw *offload.Hardware) (*TrainerPlan, *Model, error) {
	return PlanConfigWorld(ctx, cfg, device, deviceLimit, hw, PlanWorld{})
}

// PlanConfigWorld is PlanConfig for one rank of the data-parallel job w
// (spill plan --nproc-per-node): the plan is per rank, its host and disk
// budgets its share of the node's. The cpu device trains one process.
func PlanConfigWorld(ctx context.Context, cfg Config, device string, deviceLimit int64, hw *offload.Hardware, w PlanWorld) (*TrainerPlan, *Model, error) {
	if w.Ranks > 1 && device == "cpu" {
		return nil, nil, fmt.Errorf("engine: plan: %d ranks: data-parallel training needs the cuda device (NCCL); the cpu backend trains one process", w.Ranks)
	}
	if err := ResolveInitFrom(&cfg); err != nil {
		return nil, nil, err
	}
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, nil, err
	}
	var schema dataset.Schema
	p, ok := LookupPreset(cfg.Model)
	if cfg.Data == "" && ((ok && p.Vocab != 0) || (cfg.InitFrom != "" && cfg.Vocab > 0)) {
		// No data for a full-size preset or a checkpoint's shape: plan
		// for token sequences of seq_len (default the model's context).
		if cfg.Vocab == 0 {
			cfg.Vocab = p.Vocab
		}
		if cfg.SeqLen == 0 {
			cfg.SeqLen = cfg.MaxSeq
		}
		if cfg.SeqLen > cfg.MaxSeq {
			return nil, nil, fmt.Errorf("engine: seq_len %d exceeds max_seq %d", cfg.SeqLen, cfg.MaxSeq)
		}
		schema = dataset.Schema{Kind: dataset.KindTokens, SeqLen: cfg.SeqLen, VocabSize: cfg.Vocab}
	} else {
		dataDir, err := dataDirOrDefault(ctx, cfg.Data)
		if err != nil {
			return nil, nil, err
		}
		ds, err := dataset.Open(dataDir)
		if err != nil {
			return nil, nil, err
		}
		defer ds.Close()
		if err := resolveData(&cfg, ds, dataDir); err != nil {
			return nil, nil, err
		}
		schema = ds.Schema()
	}
	m, err := BuildModel(&cfg, schema)
	if err != nil {
		return nil, nil, err
	}
	B, T := cfg.Batch, cfg.SeqLen
	if !cfg.tokens() {
		T = 1
	}
	budget := cfg.DeviceMemory
	if budget == 0 {
		budget = deviceLimit
	}
	tp, _, err := choosePlanWorld(&cfg, device, m, B, T, budget, hw, w)
	return tp, m, err
}

// measuredDevicePeak is the device memory the trainer has held at most:
// the offload cache's peak of live blocks, or the backend's peak.
func measuredDevicePeak(tr *Trainer, be kernels.Backend) int64 {
	if c := tr.Cache(); c != nil {
		return c.Stats().PeakAllocated
	}
	return be.MemStats().Peak
}

// memorySummary is the device memory summary of a trainer.
func memorySummary(tr *Trainer, be kernels.Backend) string {
	if c := tr.Cache(); c != nil {
		return c.MemorySummary()
	}
	return residentSummary(be.MemStats())
}

// relErr is (predicted - measured) / measured, 0 when either is unknown.
func relErr(predicted, measured float64) float64 {
	if predicted <= 0 || measured <= 0 {
		return 0
	}
	return (predicted - measured) / measured
}
