package offload

import (
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/spill-ml/spill/kernels"
)

// Budgets are the bytes each tier may hold. Disk 0 means no disk tier.
type Budgets struct {
	Device, Host, Disk int64
}

// Request is what Plan plans for.
type Request struct {
	Model ModelShape
	// Batch is the number of sequences per optimizer step; it is split
	// into Accum micro-batches of MicroBatch sequences.
	Batch     int
	Precision Precision
	Budgets   Budgets
	// Hardware is the performance profile; the zero value means H200().
	Hardware Hardware
	// MaxPrefetch bounds the layers of weights fetched ahead. Default 4.
	MaxPrefetch int
	// Allow, if set, restricts the search to the placements it accepts:
	// those a trainer can execute, or those matching the user's overrides.
	// It sees every field of the candidate but Memory, StepTime, Busy and
	// Bottleneck.
	Allow func(p *Placement) bool
	// DevicePeak, if set, is the exact device memory a placement needs,
	// by class at the moment of the peak (a trainer's own schedule, e.g.
	// engine's): it replaces the planner's device estimate and no slack
	// is added to it. It sees the same fields as Allow and is called only
	// for allowed candidates.
	DevicePeak func(p *Placement) map[Class]int64
	// HostPeak, if set, is the exact host memory a placement's trainer
	// holds, by class: it replaces the planner's host estimate (the
	// profile's HostReserve is still added). Like DevicePeak it is called
	// only for allowed candidates.
	HostPeak func(p *Placement) map[Class]int64
	// DelayedUpdate: the host optimizer of step t runs during step t+1
	// (off the critical path), and the host holds a second compute-dtype
	// copy of the weights and of the gradients.
	DelayedUpdate bool
}

// ActPolicy is what a layer does with its saved activations.
type ActPolicy uint8

// Activation policies.
const (
	Keep      ActPolicy = iota // keep on the device until backward
	OffloadTo                  // copy to the host during forward, back for backward
	Recompute                  // keep only the input; rerun the forward in backward
)

func (a ActPolicy) String() string { return [...]string{"keep", "offload", "recompute"}[a] }

// MarshalText prints the policy by name in JSON.
func (a ActPolicy) MarshalText() ([]byte, error) { return []byte(a.String()), nil }

// LayerPlan is one layer's activation policy.
type LayerPlan struct {
	Name   string    `json:"name"`
	Params int64     `json:"params"`
	Policy ActPolicy `json:"activations"`
}

// TierUse is the predicted peak use of one tier.
type TierUse struct {
	Tier    Tier            `json:"tier"`
	Budget  int64           `json:"budget"`
	Peak    int64           `json:"peak"`
	ByClass map[Class]int64 `json:"by_class"`
	// Reserve is what the profile leaves to others; Slack the allowance
	// for allocator rounding and fragmentation (5% on the device).
	Reserve int64 `json:"reserve"`
	Slack   int64 `json:"slack"`
}

// Busy is the predicted time, in seconds per step, each resource is busy.
type Busy struct {
	Compute       float64 `json:"compute"`
	H2D           float64 `json:"h2d"`
	D2H           float64 `json:"d2h"`
	HostOptimizer float64 `json:"host_optimizer"`
	Disk          float64 `json:"disk"`
}

// Placement is a plan: where every tensor class lives, the activation
// policy and micro-batching, and the predicted peak memory and step time.
type Placement struct {
	Model      string    `json:"model"`
	Params     int64     `json:"params"`
	Precision  Precision `json:"precision"`
	SeqLen     int       `json:"seq_len"`
	Batch      int       `json:"batch"`
	MicroBatch int       `json:"micro_batch"`
	Accum      int       `json:"accum"`
	// Weights, Grads and Optimizer (master, adam_m, adam_v) are the tiers
	// holding each class's home copy. Weights not on the device are
	// streamed PrefetchDepth layers ahead; gradients on the host are sent
	// layer by layer as backward produces them.
	Weights       Tier `json:"weights"`
	Grads         Tier `json:"grads"`
	Optimizer     Tier `json:"optimizer"`
	PrefetchDepth int  `json:"prefetch_depth"`
	// Keep, Offload and Recompute count the layers of each activation
	// policy; Layers gives each layer's.
	Keep      int         `json:"act_keep"`
	Offload   int         `json:"act_offload"`
	Recompute int         `json:"act_recompute"`
	Layers    []LayerPlan `json:"layers"`
	// Memory is the predicted peak of device, host and disk, in that order.
	Memory []TierUse `json:"memory"`
	// StepTime is the predicted seconds per optimizer step.
	StepTime     float64  `json:"step_time_s"`
	TokensPerSec float64  `json:"tokens_per_s"`
	Busy         Busy     `json:"busy_s"`
	Bottleneck   string   `json:"bottleneck"`
	Hardware     Hardware `json:"hardware"`
}

// Hint is a one-line summary for budget errors.
func (p *Placement) Hint() string {
	return fmt.Sprintf("a plan that fits: weights on %s, grads on %s, optimizer on %s, micro-batch %d x %d, activations keep %d / offload %d / recompute %d",
		p.Weights, p.Grads, p.Optimizer, p.MicroBatch, p.Accum, p.Keep, p.Offload, p.Recompute)
}

// ErrInfeasible is wrapped by the error Plan returns when no placement fits.
var ErrInfeasible = errors.New("offload: no placement fits the budgets")

// Shortfall is how much a tier is short.
type Shortfall struct {
	Tier         Tier
	Need, Budget int64
}

// InfeasibleError explains why no placement fits: the shortfalls of the
// placement that came closest.
type InfeasibleError struct {
	Shortfalls []Shortfall
	NoDisk     bool       // there was no disk tier
	Closest    *Placement // the placement that came closest, with its predicted peaks
}

func (e *InfeasibleError) Error() string {
	var b strings.Builder
	b.WriteString("offload: no placement fits the budgets: ")
	for i, s := range e.Shortfalls {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s short by %s (needs %s, budget %s)", s.Tier, kernels.FormatBytes(s.Need-s.Budget),
			kernels.FormatBytes(s.Need), kernels.FormatBytes(s.Budget))
	}
	if p := e.Closest; p != nil {
		fmt.Fprintf(&b, ", even with weights on %s, grads on %s, optimizer on %s, micro-batch %d and activations keep %d / offload %d / recompute %d",
			p.Weights, p.Grads, p.Optimizer, p.MicroBatch, p.Keep, p.Offload, p.Recompute)
	}
	if e.NoDisk {
		b.WriteString("; there is no disk tier: a disk budget could hold the weights and optimizer state")
	}
	return b.String()
}

func (e *InfeasibleError) Unwrap() error { return ErrInfeasible }

// planner holds what one Plan call precomputes.
type planner struct {
	req  Request
	hw   Hardware
	s    int64 // compute element size
	P    int64
	Pmax int64
	T    int64
	// over recomputable layers, in order: prefix sums per token
	rec                    []int // indexes of recomputable layers
	actPre, ckptPre        []int64
	flopPre                []float64
	fixedAct, maxAct       int64 // per token
	maxCkpt                int64
	allFlops               float64
	nLayers                int
	masterBytes, stateSize int64
}

const deviceSlack = 0.05
const hostStaging = 2 * 64 << 20

// Plan chooses the placement of every tensor class, the prefetch depth,
// each layer's activation policy and the micro-batch size for req, and
// predicts peak memory per tier and the step time. It enumerates every
// placement and returns the fastest one that fits all budgets (among
// equally fast ones, the largest micro-batch), so a larger budget never
// predicts a slower step. When none fits, the error is an
// *InfeasibleError saying which tier is short by how much.
func Plan(req Request) (*Placement, error) {
	if req.Hardware == (Hardware{}) {
		req.Hardware = H200()
	}
	if err := req.Hardware.Validate(); err != nil {
		return nil, err
	}
	if req.MaxPrefetch <= 0 {
		req.MaxPrefetch = 4
	}
	if req.Batch <= 0 {
		return nil, fmt.Errorf("offload: batch %d must be positive", req.Batch)
	}
	if _, err := ParsePrecision(string(req.Precision)); err != nil {
		return nil, err
	}
	if len(req.Model.Layers) == 0 || req.Model.SeqLen <= 0 {
		return nil, fmt.Errorf("offload: model %q has no layers or no sequence length", req.Model.Name)
	}
	if req.Budgets.Device <= 0 || req.Budgets.Host <= 0 || req.Budgets.Disk < 0 {
		return nil, fmt.Errorf("offload: device and host budgets must be positive, disk not negative (got %+v)", req.Budgets)
	}
	pl := newPlanner(req)
	return pl.search()
}

func newPlanner(req Request) *planner {
	pl := &planner{req: req, hw: req.Hardware, s: req.Precision.elem(), T: int64(req.Model.SeqLen), nLayers: len(req.Model.Layers)}
	pl.actPre, pl.ckptPre, pl.flopPre = []int64{0}, []int64{0}, []float64{0}
	for i, l := range req.Model.Layers {
		pl.P += l.Params
		pl.Pmax = max(pl.Pmax, l.Params)
		act := l.ActElems*pl.s + l.ActF32*4
		if l.ActBytes > 0 {
			act = ceilDiv(l.ActBytes, pl.T)
		}
		ckpt := l.CkptElems * pl.s
		if l.CkptBytes > 0 {
			ckpt = ceilDiv(l.CkptBytes, pl.T)
		}
		pl.maxAct = max(pl.maxAct, act)
		pl.allFlops += l.FwdFLOPs
		if !l.Recomputable {
			pl.fixedAct += act
			continue
		}
		pl.rec = append(pl.rec, i)
		pl.maxCkpt = max(pl.maxCkpt, ckpt)
		pl.actPre = append(pl.actPre, pl.actPre[len(pl.actPre)-1]+act)
		pl.ckptPre = append(pl.ckptPre, pl.ckptPre[len(pl.ckptPre)-1]+ckpt)
		pl.flopPre = append(pl.flopPre, pl.flopPre[len(pl.flopPre)-1]+l.FwdFLOPs)
	}
	return pl
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// choice is one point of the search space.
type choice struct {
	w, g, o   Tier
	mb, depth int
	rec, off  int // recomputable layers recomputed (the first rec) and offloaded (the next off)
}

// eval is a choice's predicted memory and time.
type eval struct {
	by          [3][numClasses]int64 // device, host, disk
	peak, slack [3]int64
	busy        Busy
	step        float64
	exact       bool // the device row is Request.DevicePeak's: no slack
}

func (pl *planner) master(c choice) int64 {
	if pl.req.Precision.mixed() || c.o != c.w {
		return 4
	}
	return 0
}

func (pl *planner) evaluate(c choice, perMB perMB) eval {
	s, P, m := pl.s, pl.P, int64(c.mb)*pl.T
	R := len(pl.rec)
	keep := R - c.rec - c.off
	actKeep := pl.actPre[R] - pl.actPre[c.rec+c.off]
	actOff := pl.actPre[c.rec+c.off] - pl.actPre[c.rec]
	ckpt := pl.ckptPre[c.rec]
	mstr := pl.master(c)
	_ = keep

	var ev eval
	dev, host, disk := &ev.by[0], &ev.by[1], &ev.by[2]
	place := func(cl Class, t Tier, n int64) { ev.by[t-TierDevice][cl] += n }
	// weights
	if c.w == TierDevice {
		dev[Weights] = s * P
	} else {
		dev[Weights] = int64(c.depth+1) * s * pl.Pmax
		place(Weights, c.w, s*P)
		if c.w == TierDisk {
			host[Weights] += 2 * int64(c.depth+1) * s * pl.Pmax
		}
	}
	// gradients
	if c.g == TierDevice {
		dev[Grads] = s * P
		if c.o != TierDevice {
			host[Grads] = s * P // landing buffer for the host optimizer
		}
	} else {
		dev[Grads] = 2 * s * pl.Pmax
		if c.mb < pl.req.Batch {
			host[Grads] = 4 * P // fp32 accumulation across micro-batches
		} else {
			host[Grads] = 2 * s * pl.Pmax // consumed layer by layer by the optimizer
		}
	}
	// optimizer state
	place(Master, c.o, mstr*P)
	place(AdamM, c.o, 4*P)
	place(AdamV, c.o, 4*P)
	if c.o == TierDisk { // read-ahead and write-behind of two layers
		host[Master] += 2 * mstr * pl.Pmax
		host[AdamM] += 2 * 4 * pl.Pmax
		host[AdamV] += 2 * 4 * pl.Pmax
	}
	if pl.req.DelayedUpdate && c.o != TierDevice {
		host[Weights] += s * P // the update in flight writes the other copy
		host[Grads] += s * P
	}
	// activations, for one micro-batch of m tokens
	a := (pl.fixedAct + actKeep + ckpt) * m
	if c.off > 0 {
		a += 2 * pl.maxAct * m // staging: one going out, one coming back
		host[Activations] = actOff * m
	}
	if c.rec > 0 {
		a += pl.maxAct * m // the layer being recomputed
	}
	dev[Activations] = a
	dev[Workspace] = (pl.req.Model.WorkElems*s+4)*m + pl.maxAct*m // gradients of one layer's activations
	host[Workspace] = hostStaging

	_ = disk
	pl.peaks(&ev)

	// time per micro-batch
	hw := pl.hw
	rate := perMB.rate
	tc := float64(m) * (3*pl.allFlops + pl.flopPre[c.rec]) / rate
	h2dB := float64(actOff*m) + perMB.wStream
	d2hB := float64(actOff * m)
	if c.g == TierHost {
		d2hB += float64(s * P)
	}
	diskRB := 0.0
	if c.w == TierDisk {
		diskRB = perMB.wStream
	}
	tmb := max(tc, h2dB/hw.H2D, d2hB/hw.D2H, (h2dB+d2hB)/hw.Duplex, diskRB/hw.DiskRead)
	if c.w != TierDevice {
		tmb += perMB.stall / float64(c.depth)
	}
	A := float64(pl.req.Batch / c.mb)

	// the optimizer step
	var opt, optH2D, optD2H, optDisk float64
	if c.o == TierDevice {
		opt = float64(P) * float64(2*(mstr+8)+2*s) / hw.DeviceBandwidth
		ev.busy.Compute += opt
		ev.step = A*tmb + opt
	} else {
		ev.busy.HostOptimizer = float64(P) / hw.HostAdam
		if c.g == TierDevice {
			optD2H = float64(s*P) / hw.D2H
		}
		if c.w == TierDevice {
			optH2D = float64(s*P) / hw.H2D
		}
		if c.o == TierDisk {
			st := float64((mstr + 8) * P)
			optDisk += st/hw.DiskRead + st/hw.DiskWrite
		}
		if c.w == TierDisk {
			optDisk += float64(s*P) / hw.DiskWrite
		}
		phase := max(ev.busy.HostOptimizer, optD2H, optH2D, optDisk)
		// Layer-wise: a layer's update starts when its gradients are final
		// in the last micro-batch's backward (two thirds of it).
		exposed := max(phase-tmb*2/3, phase/float64(pl.nLayers))
		if pl.req.DelayedUpdate {
			// The update runs during the next step's micro-batches.
			exposed = max(phase-A*tmb, 0)
		}
		ev.step = A*tmb + exposed
	}
	ev.busy.Compute += A * tc
	ev.busy.H2D = A*h2dB/hw.H2D + optH2D
	ev.busy.D2H = A*d2hB/hw.D2H + optD2H
	ev.busy.Disk = A*diskRB/hw.DiskRead + optDisk
	return ev
}

func (pl *planner) budgets() [3]int64 {
	b := pl.req.Budgets
	return [3]int64{b.Device, b.Host, b.Disk}
}

func (pl *planner) reserves() [3]int64 { return [3]int64{pl.hw.DeviceReserve, pl.hw.HostReserve, 0} }

// peaks sums each tier's classes and adds slack and reserve.
func (pl *planner) peaks(ev *eval) {
	res := pl.reserves()
	for t := range ev.by {
		var sum int64
		for _, n := range ev.by[t] {
			sum += n
		}
		if t == 0 {
			ev.slack[t] = 0
			if !ev.exact {
				ev.slack[t] = int64(math.Ceil(float64(sum) * deviceSlack))
			}
		}
		ev.peak[t] = sum + ev.slack[t] + res[t]
	}
}

// use is tier t's TierUse in ev.
func (pl *planner) use(ev *eval, t int) TierUse {
	u := TierUse{Tier: tierOrder[t], Budget: pl.budgets()[t], Peak: ev.peak[t], Reserve: pl.reserves()[t],
		Slack: ev.slack[t], ByClass: map[Class]int64{}}
	for cl, n := range ev.by[t] {
		if n != 0 {
			u.ByClass[Class(cl)] = n
		}
	}
	return u
}

// perMB is what depends only on the micro-batch and the weights' tier.
type perMB struct {
	rate    float64 // achieved FLOP/s
	wStream float64 // bytes of weights streamed per micro-batch
	stall   float64 // exposed fetch time at depth 1
}

func (pl *planner) perMB(w Tier, mb int) perMB {
	hw := pl.hw
	peak := hw.FLOPS16
	if pl.req.Precision == FP32 {
		peak = hw.FLOPS32
	}
	m := float64(int64(mb) * pl.T)
	r := perMB{rate: peak * hw.Efficiency * m / (m + hw.HalfEfficiencyTokens)}
	if w == TierDevice {
		return r
	}
	r.wStream = 2 * float64(pl.s*pl.P) // forward and backward
	bw := hw.H2D
	if w == TierDisk {
		bw = min(bw, hw.DiskRead)
	}
	// Fetching in lockstep with compute loses sum(max(f,c)) - max(sum f, sum c);
	// prefetching d layers ahead hides all but 1/d of it, and of the
	// first layer's fetch.
	var sumMax, sumF, sumC float64
	for _, l := range pl.req.Model.Layers {
		f := 2 * float64(pl.s*l.Params) / bw
		c := 3 * m * l.FwdFLOPs / r.rate
		sumMax += max(f, c)
		sumF += f
		sumC += c
	}
	r.stall = sumMax - max(sumF, sumC) + 2*float64(pl.s*pl.Pmax)/bw
	return r
}

func (ev *eval) fits(budget [3]int64) bool {
	return ev.peak[0] <= budget[0] && ev.peak[1] <= budget[1] && ev.peak[2] <= budget[2]
}

// shortfall is the summed relative shortfall over tiers (0 if it fits).
func (ev *eval) shortfall(budget [3]int64) float64 {
	var f float64
	for t, p := range ev.peak {
		if p > budget[t] {
			f += float64(p-budget[t]) / float64(max(budget[t], 1<<20))
		}
	}
	return f
}

var tierOrder = []Tier{TierDevice, TierHost, TierDisk}

func (pl *planner) search() (*Placement, error) {
	var (
		best, closest      choice
		bestEv, closestEv  eval
		found, haveClosest bool
		R                  = len(pl.rec)
		budget             = pl.budgets()
	)
	for mb := pl.req.Batch; mb >= 1; mb-- {
		if pl.req.Batch%mb != 0 {
			continue
		}
		for _, w := range tierOrder {
			pm := pl.perMB(w, mb)
			for _, g := range tierOrder[:2] {
				for _, o := range tierOrder {
					if o == TierDevice && (g != TierDevice || w != TierDevice) {
						continue
					}
					depths := []int{0}
					if w != TierDevice {
						depths = depths[:0]
						for d := 1; d <= pl.req.MaxPrefetch; d++ {
							depths = append(depths, d)
						}
					}
					for _, depth := range depths {
						for rec := 0; rec <= R; rec++ {
							for off := 0; rec+off <= R; off++ {
								c := choice{w, g, o, mb, depth, rec, off}
								ev := pl.evaluate(c, pm)
								if !pl.refine(c, &ev) {
									continue
								}
								if !ev.fits(budget) {
									if sf := ev.shortfall(budget); !haveClosest || sf < closestEv.shortfall(budget) {
										closest, closestEv, haveClosest = c, ev, true
									}
									continue
								}
								if !found || ev.step < bestEv.step*(1-1e-9) {
									best, bestEv, found = c, ev, true
								}
							}
						}
					}
				}
			}
		}
	}
	if !found {
		e := &InfeasibleError{Closest: pl.plan(closest, closestEv), NoDisk: budget[2] == 0}
		for t, p := range closestEv.peak {
			if p > budget[t] {
				e.Shortfalls = append(e.Shortfalls, Shortfall{Tier: tierOrder[t], Need: p, Budget: budget[t]})
			}
		}
		return nil, e
	}
	return pl.plan(best, bestEv), nil
}

// refine applies Request.Allow and Request.DevicePeak to a candidate; it
// reports false when Allow rejects it.
func (pl *planner) refine(c choice, ev *eval) bool {
	if pl.req.Allow == nil && pl.req.DevicePeak == nil && pl.req.HostPeak == nil {
		return true
	}
	p := pl.candidate(c)
	if pl.req.Allow != nil && !pl.req.Allow(p) {
		return false
	}
	if pl.req.DevicePeak != nil {
		ev.by[0] = [numClasses]int64{}
		for cl, n := range pl.req.DevicePeak(p) {
			if cl < numClasses {
				ev.by[0][cl] = n
			}
		}
		ev.exact = true
	}
	if pl.req.HostPeak != nil {
		ev.by[1] = [numClasses]int64{}
		for cl, n := range pl.req.HostPeak(p) {
			if cl < numClasses {
				ev.by[1][cl] = n
			}
		}
	}
	if pl.req.DevicePeak != nil || pl.req.HostPeak != nil {
		pl.peaks(ev)
	}
	return true
}

// candidate is the placement of choice c without its predictions.
func (pl *planner) candidate(c choice) *Placement {
	m := pl.req.Model
	p := &Placement{
		Model: m.Name, Params: pl.P, Precision: pl.req.Precision, SeqLen: m.SeqLen,
		Batch: pl.req.Batch, MicroBatch: c.mb, Accum: pl.req.Batch / c.mb,
		Weights: c.w, Grads: c.g, Optimizer: c.o, PrefetchDepth: c.depth,
		Recompute: c.rec, Offload: c.off, Keep: len(pl.rec) - c.rec - c.off, Hardware: pl.hw,
	}
	j := 0
	for _, l := range m.Layers {
		lp := LayerPlan{Name: l.Name, Params: l.Params, Policy: Keep}
		if l.Recomputable {
			switch {
			case j < c.rec:
				lp.Policy = Recompute
			case j < c.rec+c.off:
				lp.Policy = OffloadTo
			}
			j++
		}
		p.Layers = append(p.Layers, lp)
	}
	return p
}

func (pl *planner) plan(c choice, ev eval) *Placement {
	p := pl.candidate(c)
	p.Memory = []TierUse{pl.use(&ev, 0), pl.use(&ev, 1), pl.use(&ev, 2)}
	p.StepTime, p.Busy = ev.step, ev.busy
	p.TokensPerSec = float64(pl.req.Batch) * float64(p.SeqLen) / ev.step
	b := ev.busy
	p.Bottleneck = "compute"
	top := b.Compute
	for _, r := range []struct {
		name string
		v    float64
	}{{"h2d", b.H2D}, {"d2h", b.D2H}, {"host optimizer", b.HostOptimizer}, {"disk", b.Disk}} {
		if r.v > top {
			p.Bottleneck, top = r.name, r.v
		}
	}
	return p
}

// UnmarshalText parses a policy name.
func (a *ActPolicy) UnmarshalText(b []byte) error {
	for _, p := range []ActPolicy{Keep, OffloadTo, Recompute} {
		if p.String() == string(b) {
			*a = p
			return nil
		}
	}
	return fmt.Errorf("offload: unknown activation policy %q", b)
}
