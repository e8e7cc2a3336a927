package plan

import (
	"github.com/spill-ml/spill/offload"
	"github.com/spill-ml/spill/offload/schedule"
)

// The planner's time model: a candidate's step time from its compute,
// its copies (each overlapping the compute of its own phase and layer),
// the host optimizer, the disk and, with several ranks, the all-reduce.

// timeFLOPs is the forward FLOPs per token the time model charges l
// with: its FLOPs at the profile's rate divided by its efficiency.
func (l *Layer) timeFLOPs() float64 {
	if l.Efficiency > 0 {
		return l.FwdFLOPs / l.Efficiency
	}
	return l.FwdFLOPs
}

// selTimeFLOPs is timeFLOPs for the layer's selective recompute.
func (l *Layer) selTimeFLOPs() float64 {
	if l.Efficiency > 0 {
		return l.SelFLOPs / l.Efficiency
	}
	return l.SelFLOPs
}

// recTimeFLOPs is what the time model charges a recompute of l under
// policy pol (0 when pol does not recompute).
func (l *Layer) recTimeFLOPs(pol offload.ActPolicy) float64 {
	switch {
	case pol.Selective():
		return l.selTimeFLOPs()
	case pol.Recomputes():
		return l.timeFLOPs()
	}
	return 0
}

// ckptBytes is the size of l's checkpoint, selective or not.
func ckptBytes(l schedule.Layer, sel bool) int64 {
	if sel {
		return l.SaveBytes
	}
	return l.OutBytes
}

// timeOf predicts c's step time and busy times.
// SpecCost is the time of a speculative host update (out of place:
// offload.HostAdamWFrom) over the in-place one's, as measured on the H200
// box at 76e2260: 2.90e9 against 3.49e9 parameters/s over a 50M-parameter
// layer on 16 cores (BenchmarkHostAdamWFrom beside BenchmarkHostAdamW).
const SpecCost = 1.2

func (pl *planner) timeOf(c *cand) {
	hw, s, P := pl.hw, float64(pl.s), float64(pl.P)
	A := pl.req.Batch / c.mb
	ngroups := (A + c.grp - 1) / c.grp
	peak := hw.FLOPS16
	if pl.m.Precision == offload.FP32 {
		peak = hw.FLOPS32
	}
	tok := float64(int64(c.mb) * pl.T)
	rate := peak * hw.Efficiency * tok / (tok + hw.HalfEfficiencyTokens)
	recFlops := pl.recFlops[c.rec]
	if c.sel {
		recFlops = pl.selFlops[c.rec]
	}
	tcMB := tok * (3*pl.allFlops + recFlops) / rate
	nl := float64(len(pl.m.Layers))
	fwdOps, bwdOps := float64(A)*nl, float64(A)*(nl+float64(c.rec))
	compute := float64(A)*tcMB + (fwdOps+bwdOps)*hw.OpOverhead
	tiers := pl.optTiers(c)
	// Layers whose optimizer state is on the device keep their weights
	// and gradients there: only the others' stream.
	var Pdev float64
	for i := 0; i < c.nDev; i++ {
		Pdev += float64(pl.m.Layers[i].Params)
	}
	Poff := P - Pdev
	// Transfers per step.
	var actOff float64
	sh := pl.shape(c.mb)
	for j, i := range pl.rec {
		if j >= c.rec && j < c.rec+c.off {
			actOff += float64(sh[i].ActBytes)
		}
	}
	if c.ckptHost {
		for j, i := range pl.rec {
			if j < c.rec {
				actOff += float64(ckptBytes(sh[i], c.sel))
			}
		}
	}
	// The step runs in phases: each group's forward, then its backward
	// (with the recomputation). A copy overlaps the compute of its own
	// phase only: activations go out during the forward and come back
	// during the backward, where the ops they belong to are (an op cannot
	// run far ahead of its copies: the device memory is the budget's).
	// The groups are alike, so the phases of the step add up to the
	// sums below, each taken as the slowest of its compute and copies.
	ng := float64(ngroups)
	fwdC := float64(A)*tok*pl.allFlops/rate + fwdOps*hw.OpOverhead
	bwdC := compute - fwdC
	h2dF, d2hF := 0.0, float64(A)*actOff // activations (and checkpoints) out
	h2dB, d2hB := float64(A)*actOff, 0.0 // and back
	if c.w == offload.TierHost {
		h2dF += ng * s * Poff
		h2dB += ng * s * Poff
	}
	if c.g == offload.TierHost {
		d2hB += ng * s * Poff
		h2dB += (ng - 1) * s * Poff
	}
	h2d, d2h := h2dF+h2dB, d2hF+d2hB
	var optH2D, optD2H float64
	if c.o != offload.TierDevice {
		if c.g == offload.TierDevice {
			optD2H = s * Poff / hw.D2H
		}
		if c.w == offload.TierDevice {
			optH2D = s * Poff / hw.H2D
		}
	}
	phase := func(comp, in, out float64) float64 {
		return max(comp, in/hw.H2D, out/hw.D2H, (in+out)/hw.Duplex)
	}
	// Activations cross PCIe in lockstep with their own layer's ops: an
	// op cannot run far ahead of its copies (the device memory is the
	// budget's), so a layer whose activations take longer to copy than
	// its ops take to compute holds the compute back by the difference.
	var exF, exB float64
	for i, pol := range pl.policies(c) {
		var b float64
		switch {
		case pol == offload.OffloadTo:
			b = float64(sh[i].ActBytes)
		case pol.CkptOnHost():
			b = float64(ckptBytes(sh[i], pol.Selective()))
		default:
			continue
		}
		ly := &pl.m.Layers[i]
		f := float64(A) * (tok*ly.timeFLOPs()/rate + hw.OpOverhead)
		bw := 2 * f
		if pol.Recomputes() {
			bw += float64(A) * (tok*ly.recTimeFLOPs(pol)/rate + hw.OpOverhead)
		}
		exF += max(0, float64(A)*b/hw.D2H-f)
		exB += max(0, float64(A)*b/hw.H2D-bw)
	}
	core := phase(fwdC+exF, h2dF, d2hF) + phase(bwdC+exB, h2dB, d2hB)
	if c.w == offload.TierHost {
		// Fetching in lockstep with compute loses what a layer's fetch
		// exceeds its compute by; prefetching d layers ahead hides all but
		// 1/d of it, once per group and direction.
		var sumMax, sumF, sumC float64
		for i, l := range pl.m.Layers {
			f := float64(l.Params) * s / hw.H2D
			if i < c.nDev {
				f = 0
			}
			cc := float64(c.grp) * tok * 3 * l.timeFLOPs() / rate
			sumMax += max(f, cc/3) + max(f, 2*cc/3)
			sumF += 2 * f
			sumC += cc
		}
		core += ng * (sumMax - max(sumF, sumC)) / float64(c.depth)
	}
	c.busy = offload.Busy{Compute: compute, H2D: h2d/hw.H2D + optH2D, D2H: d2h/hw.D2H + optD2H}
	devOpt := func(np float64) float64 { return np * float64(2*(pl.masterBytes()+8)+2*pl.s) / hw.DeviceBandwidth }
	// Each rank updates its shard of the host layers' optimizer state,
	// and the whole of the device and disk layers' (ranks.go).
	sharded := func(i int) bool { return pl.shard > 1 && tiers != nil && tiers[i] == offload.TierHost }
	Pupd, PdevUpd := P, Pdev
	// The last group's backward and the next step's first forward, layer
	// by layer.
	n := len(pl.m.Layers)
	pols := pl.policies(c)
	G := float64(min(c.grp, A))
	fwd := func(i int) float64 { return G * tok * pl.m.Layers[i].timeFLOPs() / rate }
	bwd := func(i int) float64 {
		return 2*fwd(i) + G*tok*pl.m.Layers[i].recTimeFLOPs(pols[i])/rate
	}
	// The gradients' reductions across ranks during the last backward:
	// when each layer's are ready and how much later the backward ends.
	ready, commBusy, commExp := pl.commTimeline(bwd, func(i int) bool { return tiers != nil && tiers[i] != offload.TierDevice }, sharded)
	c.busy.Comm, c.commExp = commBusy, commExp
	if c.o == offload.TierDevice {
		opt := devOpt(Pupd)
		c.busy.Compute += opt
		c.step = core + commExp + opt
		return
	}
	// The device AdamW of the first layers runs on the compute queue
	// after the backward.
	dev := devOpt(PdevUpd)
	c.busy.Compute += dev
	// The host optimizer updates one layer after the other, each once its
	// gradients are final (and reduced across ranks; or, with GlobalNorm,
	// once the step's norm is known, in layer order); layer l's next
	// forward waits for layer l's update. Each layer's update takes the
	// host AdamW's time, or the disk's (its moments read and written,
	// pipelined with the other layers' updates) or its gradients' and
	// weights' copies when those are longer.
	u := make([]float64, n)
	var U, disk float64
	adam, dr, dw := hw.HostAdam, hw.DiskRead, hw.DiskWrite
	if pl.local > 1 {
		L := float64(pl.local)
		adam, dr, dw = adam/L, dr/L, dw/L
	}
	for i, l := range pl.m.Layers {
		if tiers[i] == offload.TierDevice {
			continue
		}
		np := float64(l.Params)
		op := np
		if sharded(i) {
			op = float64(ShardParams(l.Params, pl.shard))
		}
		a := op / adam
		if c.spec {
			a *= SpecCost
		}
		U += a
		x := a
		if c.g == offload.TierDevice {
			x = max(x, s*np/hw.D2H)
		}
		if c.w == offload.TierDevice {
			x = max(x, s*np/hw.H2D)
		}
		if tiers[i] == offload.TierDisk {
			b := 8.0 // the moments, read and written
			if c.mdisk {
				b += 4 // and the master
			}
			d := b*op/dr + b*op/dw
			disk += d
			x = max(x, d)
		}
		u[i] = x
	}
	c.busy.HostOptimizer, c.busy.Disk = U, disk
	var exposed float64
	if pl.req.DelayedUpdate {
		var phase float64
		for _, x := range u {
			phase += x
		}
		exposed = max(phase-compute, 0)
	} else {
		done := make([]float64, n)
		var tb float64
		// Sharded, the updates wait for the step's statistics, all-reduced
		// after the last reduction, as GlobalNorm's (no eager updates).
		// Speculative updates start as eager ones do (when the norm
		// then says the gradients are clipped they are redone after it:
		// not modelled, the first steps of a run).
		if (!pl.req.GlobalNorm || c.spec) && !pl.anySharded(tiers) {
			var q float64
			for i := n - 1; i >= 0; i-- {
				tb += bwd(i)
				if tiers[i] != offload.TierDevice {
					q = max(q, ready[i]) + u[i]
					done[i] = q
				}
			}
			tb += commExp
		} else {
			for i := range n {
				tb += bwd(i)
			}
			tb += commExp
			q := tb
			for i := range n {
				if tiers[i] != offload.TierDevice {
					q += u[i]
					done[i] = q
				}
			}
		}
		tf := tb + dev
		start, sumF := tf, 0.0
		if g, gc, h2d, d2h := pl.gatherTime(tiers); g > 0 {
			// The updated weights are all-gathered once every update is
			// done, before the step returns (engine/zero.go).
			for i := range n {
				if tiers[i] != offload.TierDevice {
					tf = max(tf, done[i])
				}
			}
			tf += g
			c.busy.Comm += gc
			c.busy.H2D += h2d
			c.busy.D2H += d2h
		}
		for i := range n {
			if tiers[i] != offload.TierDevice {
				tf = max(tf, done[i])
			}
			tf += fwd(i)
			sumF += fwd(i)
		}
		exposed = tf - start - sumF
	}
	c.step = core + dev + commExp + exposed
}
