// Package plan is spill's one planner: from a model's layers, the tier
// budgets and a hardware profile it chooses where every tensor class lives,
// the micro-batch, the order of the step (micro-batch-major, layer-major or
// groups between), the prefetch depth and each layer's activation policy,
// and predicts the step time. `spill plan`, `spill train` and library users
// call the same Plan.
//
// Memory is never estimated: the device peak of a candidate is the peak of
// its compiled program (offload/schedule) plus what the trainer allocates
// besides, and the host peak is counted tensor by tensor, so what Plan says
// fits is what the trainer allocates. Time comes from a model of the
// hardware (offload.Hardware): the compute at the micro-batch's GEMM
// efficiency, the transfers each order makes per step, and the part of the
// host optimizer that the order cannot hide behind the backward.
//
// Plan ranks every candidate by predicted time first (cheap) and then
// checks the fastest ones for fit, compiling their programs, until one
// fits; so a refusal is decided in bounded time, before anything is
// allocated.
package plan

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/spill-ml/spill/kernels"
	"github.com/spill-ml/spill/offload"
	"github.com/spill-ml/spill/offload/schedule"
)

// Layer is one layer of a Model as the planner sees it.
type Layer struct {
	Name string
	// Params is the number of parameters the layer owns.
	Params int64
	// ActBytes, OutBytes and ScratchBytes are the bytes per sequence of
	// the layer's saved activations, its output and its scratch space.
	// Model.Shape, when set, gives the exact sizes per micro-batch
	// instead.
	ActBytes, OutBytes, ScratchBytes int64
	// FwdFLOPs is the forward pass's floating-point operations per token;
	// the backward is taken as twice that.
	FwdFLOPs float64
	// Efficiency is the speed of the layer's kernels relative to the
	// hardware profile's Efficiency, which is fitted to GPT blocks (0
	// means 1): a layer whose elementwise work is not fused into its
	// matmuls runs its FLOPs slower.
	Efficiency float64
	// Tied lists layers whose weights this one reads (schedule.Layer).
	Tied []int
	// Recomputable says whether the activation policy may recompute or
	// offload this layer's activations (blocks, not the embedding or the
	// head).
	Recomputable bool
	// SaveBytes is the bytes per sequence of the layer's selective
	// checkpoint (schedule.Layer.SaveBytes) and SelFLOPs the forward
	// FLOPs per token its selective recompute reruns; 0 when it has none.
	// The planner offers offload.RecomputeSelective when every
	// recomputable layer has one.
	SaveBytes int64
	SelFLOPs  float64
}

// Model is what Plan plans for.
type Model struct {
	Name      string
	Precision offload.Precision
	SeqLen    int
	Layers    []Layer
	// Shape, if set, returns the layers' schedule sizes for micro-batches
	// of mb sequences exactly as the trainer allocates them (alignment
	// included); nil scales the per-sequence sizes.
	Shape func(mb int) []schedule.Layer
	// Fixed, if set, is the device memory an out-of-core trainer allocates
	// besides its programs' intervals (scratch, input and loss buffers of
	// accum micro-batches of mb sequences); nil: the largest ScratchBytes.
	Fixed func(mb, accum int) int64
	// Resident, if set, is the device memory by class of the trainer that
	// keeps everything on the device (optimizer included) at micro-batch
	// mb; nil counts weights, gradients, master, moments, every layer's
	// activations and the scratch.
	Resident func(mb int) map[offload.Class]int64
	// Comm, if set, is the device memory a rank of a data-parallel job of
	// ranks > 1 allocates for its collectives, sharded being the
	// parameter counts of the layers whose optimizer state it shards
	// (none: not sharded); nil: CommBytes.
	Comm func(ranks int, sharded []int64) int64
}

// Params is the model's parameter count.
func (m *Model) Params() int64 {
	var n int64
	for _, l := range m.Layers {
		n += l.Params
	}
	return n
}

// Request is what Plan plans for.
type Request struct {
	Model Model
	// Batch is the number of sequences per optimizer step; it is split
	// into Accum micro-batches of MicroBatch sequences.
	Batch   int
	Budgets offload.Budgets
	// Hardware is the performance profile; the zero value means
	// offload.H200().
	Hardware offload.Hardware
	// MaxPrefetch bounds the prefetch depth tried. Default 2.
	MaxPrefetch int
	// Allow, if set, restricts the search to the placements it accepts
	// (the user's overrides, or what a trainer executes). It sees every
	// field of the candidate but the predictions.
	Allow func(p *offload.Placement) bool
	// DelayedUpdate: the host optimizer of step t runs during step t+1
	// (off the critical path), and the host holds a second compute-dtype
	// copy of the weights and of the gradients.
	DelayedUpdate bool
	// GlobalNorm says the host optimizer waits for the step's global
	// gradient norm (gradient clipping, fp16 loss scaling): the updates
	// start after the last backward, in layer order, and overlap only the
	// next step's first forward; without it each layer's update starts as
	// soon as its gradients are final, during the last group's backward.
	GlobalNorm bool
	// NoSpeculation turns the speculative update off: with GlobalNorm the
	// planner otherwise lets the host updates run during the backward,
	// before the norm is known, into a second copy of the host state,
	// when the host budget has room for it (Placement.SpeculativeUpdate).
	NoSpeculation bool
	// Deadline bounds the search: past it, the fastest candidates checked
	// so far decide (default 2 s).
	Deadline time.Duration
	// HostExtra is the host memory an out-of-core run allocates besides
	// the layers' state (HostState): the data loader's and the step's
	// batches, the checkpoints' buffers. It is counted as the host's
	// workspace, so that the host budget bounds all of the run's large
	// allocations.
	HostExtra int64
	// Optimizer, if not 0, pins every layer's optimizer state to one
	// tier (device: the resident trainer; host: off the device, the last
	// layers' on disk when the host budget is short); 0 lets the planner split it per
	// layer: on the device for as many of the first layers as the device
	// has room for after the weights, gradients and activations, on the
	// host for the next ones while the host budget lasts, on disk for the
	// rest.
	Optimizer offload.Tier
	// MaxDeviceOptimizerLayers, if positive, bounds how many of the first
	// layers' optimizer state a split puts on the device (a run that
	// keeps device memory free for something else, or that replays a
	// measured placement).
	MaxDeviceOptimizerLayers int
	// Ranks is the world size of a data-parallel job, one process per
	// GPU (0 or 1: one process). Batch and the plan are each rank's;
	// Budgets.Device is each GPU's, Budgets.Host and Budgets.Disk the
	// node's, of which each rank plans for RankBudgets' share (ranks.go).
	Ranks int
	// LocalRanks is how many of the ranks share a node's host memory and
	// disk (0: all of them, one node).
	LocalRanks int
	// Shard says whether each rank holds 1/Ranks of the optimizer state
	// (ZeRO-1/2; ShardAuto: the planner decides and says why). It
	// matters only with Ranks > 1.
	Shard Sharding
}

// cand is one point of the search space.
type cand struct {
	w, g, o  offload.Tier
	mb, grp  int // micro-batch and micro-batches per group
	depth    int
	rec, off int  // recomputable layers recomputed (the first rec) and offloaded (the next off)
	ckptHost bool // the recomputed layers keep their checkpoints on the host
	sel      bool // the recomputed layers recompute selectively
	spec     bool // the host updates run speculatively (canSpec, and the host has room)
	noSpec   bool // speculation was tried and predicted no faster
	// nDev and nDisk count the layers whose optimizer state is on the
	// device (the first nDev) and on disk (the last nDisk); the others'
	// is on the host. Out-of-core candidates only.
	nDev, nDisk int
	// mdisk: the disk layers keep their master weights on disk too
	// (CanMasterOnDisk).
	mdisk bool

	p        *offload.Placement
	step     float64
	commExp  float64 // the gradients' reductions the backward does not hide (ranks.go)
	busy     offload.Busy
	host     [offload.NumClasses]int64
	disk     [offload.NumClasses]int64
	estDev   int64                   // estimated device peak, dev included
	est0     int64                   // the same with no optimizer state on the device
	devBy    map[offload.Class]int64 // exact, once checked
	devPeak  int64
	fitsHost bool
}

// Plan chooses the fastest placement of req's model that fits the budgets
// (among equally fast ones, the largest micro-batch). When none fits, the
// error is an *offload.InfeasibleError saying which tier is short by how
// much, for the candidate that came closest.
func Plan(req Request) (*offload.Placement, error) {
	if req.Hardware == (offload.Hardware{}) {
		req.Hardware = offload.H200()
	}
	if err := req.Hardware.Validate(); err != nil {
		return nil, err
	}
	if req.MaxPrefetch <= 0 {
		req.MaxPrefetch = 2
	}
	if req.Deadline <= 0 {
		req.Deadline = 2 * time.Second
	}
	m := &req.Model
	if req.Batch <= 0 {
		return nil, fmt.Errorf("plan: batch %d must be positive", req.Batch)
	}
	if _, err := offload.ParsePrecision(string(m.Precision)); err != nil {
		return nil, err
	}
	if len(m.Layers) == 0 || m.SeqLen <= 0 {
		return nil, fmt.Errorf("plan: model %q has no layers or no sequence length", m.Name)
	}
	if req.Budgets.Device <= 0 || req.Budgets.Host <= 0 || req.Budgets.Disk < 0 {
		return nil, fmt.Errorf("plan: device and host budgets must be positive, disk not negative (got %+v)", req.Budgets)
	}
	if req.Ranks > 1 {
		return planRanks(req)
	}
	pl := newPlanner(&req)
	return pl.search()
}

type planner struct {
	req       *Request
	m         *Model
	hw        offload.Hardware
	s         int64 // compute element size
	P, Pmax   int64
	T         int64
	rec       []int // recomputable layers
	allFlops  float64
	recFlops  []float64 // prefix sums over rec
	selFlops  []float64 // prefix sums over rec of the selective recompute
	canSel    bool      // every recomputable layer has a selective checkpoint
	shapes    map[int][]schedule.Layer
	peakCache map[peakKey]peakVal
	start     time.Time
	// ranks is the world size (1: one process); shard is the number of
	// ranks the optimizer state is sharded across (1: not sharded).
	ranks, shard int
	// local is how many ranks share the node's host and disk: each has
	// 1/local of the host AdamW's rate and of the disk's (ranks.go).
	local int
}

type peakKey struct {
	w, g                      offload.Tier
	mb, grp, depth, r, o, dev int
	disk                      int // the sharded layers' collectives' buffer depends on it
	ckptHost, sel             bool
}

type peakVal struct {
	peak int64
	by   map[offload.Class]int64
	err  error
}

func newPlanner(req *Request) *planner {
	m := &req.Model
	pl := &planner{req: req, m: m, hw: req.Hardware, s: m.Precision.Elem(), T: int64(m.SeqLen),
		shapes: map[int][]schedule.Layer{}, peakCache: map[peakKey]peakVal{}, start: time.Now(), ranks: max(req.Ranks, 1), shard: 1, local: 1}
	pl.recFlops, pl.selFlops = []float64{0}, []float64{0}
	pl.canSel = true
	for i, l := range m.Layers {
		pl.P += l.Params
		pl.Pmax = max(pl.Pmax, l.Params)
		pl.allFlops += l.timeFLOPs()
		if l.Recomputable {
			pl.rec = append(pl.rec, i)
			pl.recFlops = append(pl.recFlops, pl.recFlops[len(pl.recFlops)-1]+l.timeFLOPs())
			pl.selFlops = append(pl.selFlops, pl.selFlops[len(pl.selFlops)-1]+l.selTimeFLOPs())
			pl.canSel = pl.canSel && l.SaveBytes > 0 && l.SelFLOPs > 0
		}
	}
	pl.canSel = pl.canSel && len(pl.rec) > 0
	return pl
}

// shape is the layers' schedule sizes at micro-batch mb.
func (pl *planner) shape(mb int) []schedule.Layer {
	if s, ok := pl.shapes[mb]; ok {
		return s
	}
	var s []schedule.Layer
	if pl.m.Shape != nil {
		s = pl.m.Shape(mb)
	} else {
		for i, l := range pl.m.Layers {
			out := l.OutBytes * int64(mb)
			if i == len(pl.m.Layers)-1 {
				out = 0
			}
			s = append(s, schedule.Layer{ParamBytes: l.Params * pl.s, ActBytes: l.ActBytes * int64(mb), OutBytes: out,
				SaveBytes: l.SaveBytes * int64(mb), Tied: l.Tied,
				MasterBytes: l.Params * pl.masterBytes(), MomentBytes: 4 * l.Params})
		}
	}
	pl.shapes[mb] = s
	return s
}

func (pl *planner) fixed(mb, accum int) int64 {
	if pl.m.Fixed != nil {
		return pl.m.Fixed(mb, accum)
	}
	var sc int64
	for _, l := range pl.m.Layers {
		sc = max(sc, l.ScratchBytes*int64(mb))
	}
	return sc
}

// policies is the activation policy of every layer of c.
func (pl *planner) policies(c *cand) []offload.ActPolicy {
	a := make([]offload.ActPolicy, len(pl.m.Layers))
	for j, i := range pl.rec {
		switch {
		case j < c.rec && c.ckptHost && c.sel:
			a[i] = offload.RecomputeSelectiveHost
		case j < c.rec && c.ckptHost:
			a[i] = offload.RecomputeHost
		case j < c.rec && c.sel:
			a[i] = offload.RecomputeSelective
		case j < c.rec:
			a[i] = offload.Recompute
		case j < c.rec+c.off:
			a[i] = offload.OffloadTo
		}
	}
	return a
}

// Spec is the training program of a placement: what the trainer runs.
func (pl *planner) spec(c *cand) schedule.Spec {
	s := schedule.Spec{Layers: pl.shape(c.mb), MicroBatches: pl.req.Batch / c.mb, Group: c.grp,
		Weights: c.w, Grads: c.g, Acts: pl.policies(c), Prefetch: c.depth, Train: true}
	if c.nDev > 0 {
		s.Optimizer = pl.optTiers(c)
	}
	return s
}

// candidates enumerates the search space.
func (pl *planner) candidates() []*cand {
	var out []*cand
	R := len(pl.rec)
	// Activation policies on a grid: recompute the first r and offload
	// the next o of the recomputable layers.
	grid := func() [][2]int {
		steps := []int{0, R / 4, R / 2, 3 * R / 4, R}
		seen := map[[2]int]bool{}
		var g [][2]int
		for _, r := range steps {
			for _, o := range steps {
				if r+o <= R && !seen[[2]int{r, o}] {
					seen[[2]int{r, o}] = true
					g = append(g, [2]int{r, o})
				}
			}
		}
		return g
	}()
	tiers := []offload.Tier{offload.TierDevice, offload.TierHost}
	sels := []bool{false}
	if pl.canSel {
		sels = append(sels, true)
	}
	for mb := pl.req.Batch; mb >= 1; mb-- {
		if pl.req.Batch%mb != 0 {
			continue
		}
		A := pl.req.Batch / mb
		groups := []int{1}
		for g := 2; g < A; g *= 2 {
			groups = append(groups, g)
		}
		if A > 1 {
			groups = append(groups, A)
		}
		// Everything on the device: the resident trainer.
		if pin := pl.req.Optimizer; pin == 0 || pin == offload.TierDevice {
			out = append(out, &cand{w: offload.TierDevice, g: offload.TierDevice, o: offload.TierDevice, mb: mb, grp: 1, depth: 0})
		}
		for _, w := range tiers {
			for _, g := range tiers {
				// The optimizer on the host, or on the host and disk (as
				// little on disk as the host budget allows); and on the
				// device for the first layers where there is room.
				for _, o := range []offload.Tier{offload.TierHost, offload.TierDisk} {
					if o == offload.TierDisk && pl.req.Budgets.Disk == 0 {
						continue
					}
					// Pinned to the host, the overflow may go to disk.
					if pin := pl.req.Optimizer; pin != 0 && pin != o && (pin != offload.TierHost || o != offload.TierDisk) {
						continue
					}
					depths := []int{1}
					if w == offload.TierHost || g == offload.TierHost {
						depths = depths[:0]
						for d := 1; d <= pl.req.MaxPrefetch; d++ {
							depths = append(depths, d)
						}
					}
					// On disk, the moments alone or the master weights
					// too (they save the host 4 bytes a parameter and
					// cost the disk as much again).
					mdisks := []bool{false}
					if o == offload.TierDisk && CanMasterOnDisk(pl.m.Precision.Mixed(), pl.req.DelayedUpdate) {
						mdisks = append(mdisks, true)
					}
					for _, grp := range groups {
						for _, d := range depths {
							for _, ro := range grid {
								for _, md := range mdisks {
									for _, sel := range sels {
										if sel && ro[0] == 0 {
											continue
										}
										out = append(out, &cand{w: w, g: g, o: o, mb: mb, grp: grp, depth: d, rec: ro[0], off: ro[1], mdisk: md, sel: sel})
										if ro[0] > 0 && grp > 1 {
											out = append(out, &cand{w: w, g: g, o: o, mb: mb, grp: grp, depth: d, rec: ro[0], off: ro[1], ckptHost: true, mdisk: md, sel: sel})
										}
									}
								}
							}
						}
					}
				}
			}
		}
	}
	return out
}

// placement is c as an offload.Placement without predictions.
func (pl *planner) placement(c *cand) *offload.Placement {
	m := pl.m
	p := &offload.Placement{
		Model: m.Name, Params: pl.P, Precision: m.Precision, SeqLen: m.SeqLen,
		Batch: pl.req.Batch, MicroBatch: c.mb, Accum: pl.req.Batch / c.mb, Group: c.grp,
		Weights: c.w, Grads: c.g, Optimizer: c.o, PrefetchDepth: c.depth,
		Recompute: c.rec, Offload: c.off, Keep: len(pl.rec) - c.rec - c.off, Hardware: pl.hw,
		CheckpointsOnHost: c.ckptHost && c.rec > 0,
		Selective:         c.sel && c.rec > 0,
		SpeculativeUpdate: c.spec,
	}
	pols := pl.policies(c)
	tiers := pl.optTiers(c)
	for i, l := range m.Layers {
		lp := offload.LayerPlan{Name: l.Name, Params: l.Params, Policy: pols[i], Optimizer: offload.TierDevice}
		if tiers != nil {
			lp.Optimizer = tiers[i]
		}
		p.Layers = append(p.Layers, lp)
	}
	if c.o != offload.TierDevice {
		p.Optimizer = offload.TierHost
		if c.nDisk > 0 {
			p.Optimizer = offload.TierDisk
		}
		p.OptimizerLayers = [3]int{c.nDev, len(m.Layers) - c.nDev - c.nDisk, c.nDisk}
		p.MasterOnDisk = c.nDisk > 0 && c.mdisk
		p.OptimizerWhy = pl.optimizerWhy(c)
	}
	return p
}

func (pl *planner) budgets() [3]int64 {
	b := pl.req.Budgets
	return [3]int64{b.Device, b.Host, b.Disk}
}

func (pl *planner) reserves() [3]int64 {
	return [3]int64{pl.hw.DeviceReserve, pl.hw.HostReserve, 0}
}

// peaks is c's predicted peak per tier (device exact when known, else the
// estimate), with the reserves.
func (pl *planner) peaks(c *cand) [3]int64 {
	res := pl.reserves()
	dev := c.estDev
	if c.devBy != nil {
		dev = c.devPeak
	}
	var host, disk int64
	for _, n := range c.host {
		host += n
	}
	for _, n := range c.disk {
		disk += n
	}
	if c.o == offload.TierDevice {
		res[1] = 0 // nothing of the model on the host
	}
	return [3]int64{dev + res[0], host + res[1], disk}
}

// shortfall is the bytes by which the tiers are short together: the
// optimizer state can move between them, so the candidate that comes
// closest is the one short by the least in all.
func shortfall(peak, budget [3]int64) float64 {
	var f float64
	for t := range peak {
		if peak[t] > budget[t] {
			f += float64(peak[t] - budget[t])
		}
	}
	return f
}

func (pl *planner) search() (*offload.Placement, error) {
	budget := pl.budgets()
	all := pl.candidates()
	var cs []*cand
	for _, c := range all {
		if pl.req.DelayedUpdate && c.o == offload.TierDevice {
			continue
		}
		// The split of the optimizer state: as many first layers on the
		// device as the estimate leaves room for (checkFit redoes it with
		// the exact peak), as few last layers on disk as the host needs.
		c.est0 = pl.estimate(c)
		c.nDev = pl.maxDev(c, c.est0)
		c.estDev = c.est0 + pl.devAddAll(c)
		pl.hostDisk(c)
		if c.o == offload.TierDisk && c.nDisk == 0 {
			continue // the same as on the host
		}
		c.p = pl.placement(c)
		if pl.req.Allow != nil && !pl.req.Allow(c.p) {
			continue
		}
		pl.timeOf(c)
		pl.specOrNot(c)
		if c.o == offload.TierDevice { // exact without compiling
			c.devPeak, c.devBy, _ = pl.devicePeak(c)
		}
		cs = append(cs, c)
	}
	if len(cs) == 0 {
		return nil, errors.New("plan: the overrides allow no placement")
	}
	// Fastest first; among equally fast ones the largest micro-batch. The
	// resident trainer is preferred to an out-of-core one less than 1%
	// faster (the out-of-core one with the optimizer state of all its
	// layers but one on the device is only that much faster).
	rank := func(c *cand) float64 {
		if c.o == offload.TierDevice {
			return c.step / residentPreference
		}
		return c.step
	}
	sort.SliceStable(cs, func(i, j int) bool {
		if a, b := rank(cs[i]), rank(cs[j]); math.Abs(a-b) > 1e-9*max(a, b) {
			return a < b
		}
		return cs[i].mb > cs[j].mb
	})
	var best, closest *cand
	closestF := math.Inf(1)
	var tried []*cand
	for _, c := range cs {
		// Checking a candidate may change its prediction (the exact peak
		// moves its optimizer split): once one fits, the candidates
		// ranked up to recheckSlack behind it are checked too, and the
		// fastest of them wins.
		if best != nil && rank(c) > rank(best)*recheckSlack {
			break
		}
		pk := pl.peaks(c)
		// Host and disk are exact already; the device is checked by
		// compiling the program, unless the estimate is far over.
		if pk[1] <= budget[1] && pk[2] <= budget[2] && float64(pk[0]) <= 1.3*float64(budget[0]) {
			if time.Since(pl.start) > pl.req.Deadline && (closest != nil || best != nil) {
				break
			}
			if err := pl.checkFit(c); err != nil {
				continue
			}
			pk = pl.peaks(c)
			tried = append(tried, c)
		}
		if pk[0] <= budget[0] && pk[1] <= budget[1] && pk[2] <= budget[2] && c.devBy != nil {
			if best == nil || rank(c) < rank(best) {
				best = c
			}
			continue
		}
		// The closest miss explains a refusal: among out-of-core
		// candidates when there are any (a resident one only says the
		// device is too small, which the budget says already).
		f := shortfall(pk, budget)
		if c.o == offload.TierDevice {
			f += 1e30
		}
		if budget[2] > 0 && c.nDisk == 0 {
			// With a disk tier, the refusal names the disk's shortfall
			// too: a candidate that leaves it unused may be short by
			// less in all (the disk tier's buffers take host memory),
			// but says nothing of what the disk would need.
			f += 1e20
		}
		if f < closestF {
			closest, closestF = c, f
		}
	}
	if best == nil {
		e := &offload.InfeasibleError{NoDisk: budget[2] == 0}
		if closest != nil {
			e.Closest = pl.finish(closest)
			pk := pl.peaks(closest)
			for t, p := range pk {
				if p > budget[t] {
					e.Shortfalls = append(e.Shortfalls, offload.Shortfall{Tier: tierOrder[t], Need: p, Budget: budget[t]})
				}
			}
		}
		return nil, e
	}
	p := pl.finish(best)
	p.Alternatives = pl.alternatives(best, cs, budget)
	return p, nil
}

// specOrNot keeps c's speculative update only when it predicts a faster
// step than updating after the norm (the out-of-place update costs
// SpecCost; with few sequences per step the host optimizer bounds the
// step and the earlier start does not pay for it).
func (pl *planner) specOrNot(c *cand) {
	if !c.spec {
		return
	}
	if alt := pl.withoutSpec(c); alt.step <= c.step {
		*c = alt
	}
}

// withoutSpec is c with the host updates after the norm: its host memory,
// placement and time.
func (pl *planner) withoutSpec(c *cand) cand {
	alt := *c
	alt.noSpec = true
	pl.hostDisk(&alt)
	pl.timeOf(&alt)
	alt.p = pl.placement(&alt)
	return alt
}

// checkFit compiles c's programs for its exact device peak. An
// out-of-core candidate first compiles them with no optimizer state on
// the device and moves as many first layers' to the device as the exact
// peak leaves room for (at least as many as the estimate did, when the
// estimate was above), redoing the host and disk split and the time.
func (pl *planner) checkFit(c *cand) error {
	if pl.maxDev(c, 0) > 0 {
		base := *c
		base.nDev = 0
		peak0, _, err := pl.devicePeak(&base)
		if err != nil {
			return err
		}
		if k := pl.maxDev(c, peak0); k != c.nDev {
			c.nDev = k
			pl.hostDisk(c)
			c.p = pl.placement(c)
			pl.timeOf(c)
			pl.specOrNot(c)
		}
	}
	peak, by, err := pl.devicePeak(c)
	if err != nil {
		return err
	}
	c.devBy, c.devPeak = by, peak
	return nil
}

// recheckSlack is how far behind the first candidate that fits (as ranked
// before checking) the search goes on checking for a faster one.
const recheckSlack = 1.1

// residentPreference is how much faster an out-of-core placement must be
// predicted to be to win over the resident trainer.
const residentPreference = 1.01

var tierOrder = []offload.Tier{offload.TierDevice, offload.TierHost, offload.TierDisk}

// finish fills c's placement with its predictions.
func (pl *planner) finish(c *cand) *offload.Placement {
	p := c.p
	pk := pl.peaks(c)
	res := pl.reserves()
	if c.o == offload.TierDevice {
		res[1] = 0
	}
	dev := c.devBy
	if dev == nil {
		dev = map[offload.Class]int64{offload.Workspace: c.estDev}
	}
	by := [3]map[offload.Class]int64{dev, {}, {}}
	for cl, n := range c.host {
		if n != 0 {
			by[1][offload.Class(cl)] = n
		}
	}
	for cl, n := range c.disk {
		if n != 0 {
			by[2][offload.Class(cl)] = n
		}
	}
	budget := pl.budgets()
	p.Memory = nil
	for t := range 3 {
		u := offload.TierUse{Tier: tierOrder[t], Budget: budget[t], Peak: pk[t], Reserve: res[t], ByClass: map[offload.Class]int64{}}
		for cl, n := range by[t] {
			if n != 0 {
				u.ByClass[cl] = n
			}
		}
		p.Memory = append(p.Memory, u)
	}
	p.StepTime, p.Busy = c.step, c.busy
	p.TokensPerSec = float64(pl.req.Batch) * float64(p.SeqLen) / c.step
	if pl.ranks > 1 {
		p.TokensPerSec *= float64(pl.ranks) // the job's
		p.Data = &offload.DataParallel{Ranks: pl.ranks, ShardOptimizer: pl.shard > 1, GradBytes: pl.s * pl.P,
			Interconnect: pl.hw.InterconnectRate(), CommExposed: c.commExp}
		p.Hardware.Interconnect = pl.hw.InterconnectRate()
	}
	b := c.busy
	p.Bottleneck = "compute"
	top := b.Compute
	for _, r := range []struct {
		name string
		v    float64
	}{{"h2d", b.H2D}, {"d2h", b.D2H}, {"host optimizer", b.HostOptimizer}, {"disk", b.Disk}, {"comm", b.Comm}} {
		if r.v > top {
			p.Bottleneck, top = r.name, r.v
		}
	}
	return p
}

// alternatives says why best won: the fastest candidate of each other
// family (resident, weights and gradients on the device, streamed
// micro-batch-major, streamed layer-major), with its predicted time and
// what it lacked.
func (pl *planner) alternatives(best *cand, cs []*cand, budget [3]int64) []offload.Alternative {
	family := func(c *cand) string {
		switch {
		case c.o == offload.TierDevice:
			return "everything on the device"
		case c.w == offload.TierDevice && c.g == offload.TierDevice:
			return "weights and gradients on the device, optimizer on the host"
		case c.grp == 1:
			return "streamed, micro-batch-major"
		default:
			return "streamed, layer-major (groups of micro-batches)"
		}
	}
	// pick is the fastest candidate that match accepts and that fits
	// (checking a bounded number), else the fastest it accepts.
	pick := func(match func(*cand) bool) *cand {
		var first *cand
		checked := 0
		for _, d := range cs {
			if !match(d) {
				continue
			}
			if first == nil {
				first = d
			}
			if checked >= 32 {
				break
			}
			pk := pl.peaks(d)
			if pk[1] > budget[1] || pk[2] > budget[2] || float64(pk[0]) > 1.3*float64(budget[0]) {
				continue
			}
			checked++
			if d.devBy == nil {
				if err := pl.checkFit(d); err != nil {
					continue
				}
			}
			if pk = pl.peaks(d); pk[0] <= budget[0] {
				return d
			}
		}
		return first
	}
	alt := func(f string, c *cand) offload.Alternative {
		a := offload.Alternative{Family: f, Summary: c.p.Summary(), StepTime: c.step}
		pk := pl.peaks(c)
		var short []string
		for t, p := range pk {
			if p > budget[t] {
				short = append(short, fmt.Sprintf("%s short by %s", tierOrder[t], kernels.FormatBytes(p-budget[t])))
			}
		}
		switch {
		case len(short) > 0:
			a.Why = "does not fit: " + strings.Join(short, ", ")
			if c.devBy == nil {
				a.Why += " (estimated)"
			}
		default:
			a.Why = fmt.Sprintf("fits, but %.0f%% slower", 100*(c.step/best.step-1))
		}
		return a
	}
	seen := map[string]bool{family(best): true}
	var out []offload.Alternative
	for _, c := range cs {
		f := family(c)
		if seen[f] {
			continue
		}
		seen[f] = true
		out = append(out, alt(f, pick(func(d *cand) bool { return family(d) == f })))
	}
	// The other way to recompute: the same placement with whole-block
	// recomputation instead of selective checkpoints, or the reverse.
	if best.rec > 0 && pl.canSel {
		f := "selective recomputation"
		if best.sel {
			f = "whole-block recomputation"
		}
		same := func(c *cand) bool {
			return c.sel != best.sel && c.w == best.w && c.g == best.g && c.o == best.o && c.mb == best.mb && c.grp == best.grp &&
				c.depth == best.depth && c.rec == best.rec && c.off == best.off && c.ckptHost == best.ckptHost && c.mdisk == best.mdisk
		}
		if c := pick(same); c != nil {
			out = append(out, alt(f, c))
		}
	}
	// The same placement with the host updates after the norm, when the
	// best speculates.
	if best.spec {
		c := pl.withoutSpec(best)
		a := alt("the same placement with the host updates after the norm (no speculation)", &c)
		var more int64
		for cl := range best.host {
			more += best.host[cl] - c.host[cl]
		}
		a.Why += fmt.Sprintf("; speculation takes %s more host memory", kernels.FormatBytes(more))
		out = append(out, a)
	}
	return out
}
