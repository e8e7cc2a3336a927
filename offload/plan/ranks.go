package plan

import (
	"errors"
	"fmt"
	"slices"

	"github.com/spill-ml/spill/kernels"
	"github.com/spill-ml/spill/offload"
)

// Several ranks. A data-parallel job runs one process per GPU, each with
// the same placement on its own Batch sequences; Plan plans one rank.
//
// Budgets. The device budget is each GPU's. Host memory and the disk tier
// are the node's, shared by the ranks on it: Request.Budgets.Host and
// .Disk are the node's and each rank plans for RankBudgets' share of
// them, the node's budget divided by the local ranks (rounded down). Each
// rank also keeps the profile's HostReserve for itself (its own CUDA
// context, pinned staging and loader), so a node of N ranks reserves N
// times it: conservative for the part of it that is the OS's.
//
// Sharding (ZeRO-1/2), as the engine shards (engine/zero.go). With Shard
// on, each rank holds, of every layer of np parameters whose optimizer
// state is on the host, kernels.ShardLen(np, Ranks) elements of it (the
// flat buffer padded to ShardLen*Ranks): both Adam moments, and the fp32
// master where it is a buffer of its own (mixed precision; in fp32 the
// master is the weights every rank needs whole, and a shard of it beside
// them would only add memory). Layers updated on the device or the disk
// tier are not sharded (all-reduced and updated whole on every rank).
// The compute-dtype weights and the gradients' landing buffers stay
// whole (the updated shards are all-gathered into them). A sharded
// layer's host AdamW is that of its shard. The device holds, besides,
// the collectives' buffers (Model.Comm; CommBytes: the padded buffer of
// the largest sharded layer the reduce-scatters and all-gathers go
// through). There is no delayed update under sharding, and no eager one:
// the host updates wait for the step's statistics, all-reduced after the
// last reduction (a layer's shards would otherwise be judged finite on
// some ranks and not on others), and the updated weights are all-gathered
// layer after layer once every update is done, before the next forward.
//
// Communication. Each rank reduces its compute-dtype gradients once per
// step, layer by layer as the last backward makes them final, on a comm
// queue of its own (engine/ddp.go): an all-reduce of n bytes takes
// 2(N-1)/N x n / Hardware.InterconnectRate(), a reduce-scatter (a
// sharded layer's) half that, and so does the all-gather of its updated
// weights after the updates, staged through the device (its shard up,
// the whole layer down). Each GPU has
// its own PCIe link (H2D, D2H as profiled), but the node's CPUs and disk
// are shared: each rank's host AdamW and disk run at 1/LocalRanks of the
// profile's rates (which are the whole node's). The backward
// of the earlier layers hides a layer's reduction, except where the
// compute queue waits for it: at the step's end (the last layers'), and
// at once for a layer whose optimizer is off the device, whose gradients
// are copied to the host right after the reduction.

// Sharding says whether the optimizer state is sharded across ranks.
type Sharding uint8

// Sharding choices.
const (
	// ShardAuto plans without sharding, and with it when the host is
	// short without (the plan needs the disk tier, or nothing fits), or
	// the device is (the plan is out of core): sharded wins when it fits
	// and is faster (by shardPreference where unsharded needs no disk).
	ShardAuto Sharding = iota
	ShardOff
	ShardOn
)

func (s Sharding) String() string { return [...]string{"auto", "off", "on"}[s] }

// ParseSharding parses "auto", "off" or "on".
func ParseSharding(v string) (Sharding, error) {
	for _, s := range []Sharding{ShardAuto, ShardOff, ShardOn} {
		if s.String() == v {
			return s, nil
		}
	}
	return 0, fmt.Errorf("plan: unknown optimizer sharding %q (want auto, on or off)", v)
}

// RankBudgets is one rank's share of a node's budgets when localRanks
// ranks run on the node: the device budget as it is (each rank has its
// GPU), the host and disk budgets divided by localRanks.
func RankBudgets(node offload.Budgets, localRanks int) offload.Budgets {
	if localRanks <= 1 {
		return node
	}
	n := int64(localRanks)
	return offload.Budgets{Device: node.Device, Host: node.Host / n, Disk: node.Disk / n}
}

// ShardParams is how many of a layer's np parameters' optimizer state a
// rank holds when it is sharded across ranks (kernels.ShardLen; np for
// ranks <= 1).
func ShardParams(np int64, ranks int) int64 {
	if ranks <= 1 {
		return np
	}
	return int64(kernels.ShardLen(int(np), ranks))
}

// AllReduceTime is the seconds an all-reduce of n bytes across ranks takes
// at bus bandwidth bw.
func AllReduceTime(n float64, ranks int, bw float64) float64 {
	if ranks <= 1 {
		return 0
	}
	N := float64(ranks)
	return 2 * (N - 1) / N * n / bw
}

// CommBytes is the device memory of a data-parallel rank's collectives
// when the layers of sharded parameters are sharded across ranks: the
// padded buffer the reduce-scatters and all-gathers go through, 4 bytes
// (fp32, for the gathers of the moments at a checkpoint) per element of
// the largest sharded layer padded to ShardLen*ranks; none unsharded.
// The engine's Model.Comm adds its small buffers and block rounding.
func CommBytes(ranks int, sharded []int64) int64 {
	var n int64
	for _, np := range sharded {
		n = max(n, ShardParams(np, ranks)*int64(ranks))
	}
	return 4 * n
}

// commBytes is the device memory of a rank's collectives with the
// optimizer tiers tiers (nil: all on the device), 0 for one rank.
func (pl *planner) commBytes(tiers []offload.Tier) int64 {
	if pl.ranks <= 1 {
		return 0
	}
	var sharded []int64
	if pl.shard > 1 {
		for i, t := range tiers {
			if t == offload.TierHost {
				sharded = append(sharded, pl.m.Layers[i].Params)
			}
		}
	}
	if pl.m.Comm != nil {
		return pl.m.Comm(pl.ranks, sharded)
	}
	return CommBytes(pl.ranks, sharded)
}

// anySharded reports whether any layer of the optimizer tiers tiers is
// sharded (its state on the host, Shard on).
func (pl *planner) anySharded(tiers []offload.Tier) bool {
	return pl.shard > 1 && slices.Contains(tiers, offload.TierHost)
}

// gatherTime is the all-gather of the sharded layers' updated weights at
// the step's end, one layer after the other (engine/zero.go): its
// seconds, and of them the interconnect's, the shards' copies up and the
// whole layers' copies down.
func (pl *planner) gatherTime(tiers []offload.Tier) (total, comm, h2d, d2h float64) {
	if pl.shard <= 1 {
		return 0, 0, 0, 0
	}
	bw := pl.hw.InterconnectRate()
	for i, t := range tiers {
		if t != offload.TierHost {
			continue
		}
		np := pl.m.Layers[i].Params
		n := float64(pl.s * np)
		c := AllReduceTime(n, pl.ranks, bw) / 2
		u := float64(pl.s*ShardParams(np, pl.shard)) / pl.hw.H2D
		d := n / pl.hw.D2H
		comm, h2d, d2h = comm+c, h2d+u, d2h+d
	}
	return comm + h2d + d2h, comm, h2d, d2h
}

// commTimeline is the last backward of c with the gradients' reductions:
// bwd(i) is layer i's backward, wait(i) says the compute queue waits for
// layer i's reduction at once, sharded(i) that it is a reduce-scatter
// (half an all-reduce's time). It returns when each layer's reduced
// gradients are ready, the reductions' busy time, and how much later the
// backward ends (both queues done) than it would without them.
func (pl *planner) commTimeline(bwd func(int) float64, wait, sharded func(int) bool) (ready []float64, busy, exposed float64) {
	n := len(pl.m.Layers)
	ready = make([]float64, n)
	bw := pl.hw.InterconnectRate()
	var t, q, sum float64
	for i := n - 1; i >= 0; i-- {
		b := bwd(i)
		t += b
		sum += b
		if pl.ranks <= 1 {
			ready[i] = t
			continue
		}
		r := AllReduceTime(float64(pl.s*pl.m.Layers[i].Params), pl.ranks, bw)
		if sharded(i) {
			r /= 2 // a reduce-scatter
		}
		busy += r
		q = max(q, t) + r
		ready[i] = q
		if wait(i) {
			t = q
		}
	}
	if pl.ranks <= 1 {
		return ready, 0, 0
	}
	return ready, busy, max(t, q) - sum
}

// planRanks is Plan for several ranks: per-rank budgets, and the
// optimizer state sharded or not as req.Shard says.
func planRanks(req Request) (*offload.Placement, error) {
	local := req.LocalRanks
	if local <= 0 || local > req.Ranks {
		local = req.Ranks
	}
	node := req.Budgets
	req.Budgets = RankBudgets(node, local)
	if req.Budgets.Host <= 0 {
		return nil, fmt.Errorf("plan: a host budget of %s shared by %d ranks leaves none to each", kernels.FormatBytes(node.Host), local)
	}
	run := func(shard bool) (*offload.Placement, error) {
		pl := newPlanner(&req)
		pl.local = local
		if shard {
			pl.shard = req.Ranks
		}
		p, err := pl.search()
		var ie *offload.InfeasibleError
		if errors.As(err, &ie) && ie.Closest != nil {
			p = ie.Closest
		}
		if p != nil && p.Data != nil {
			p.Data.LocalRanks, p.Data.NodeHost, p.Data.NodeDisk = local, node.Host, node.Disk
		}
		if err != nil {
			return nil, err
		}
		return p, err
	}
	if req.DelayedUpdate && req.Shard != ShardOff {
		if req.Shard == ShardOn {
			return nil, errors.New("plan: a sharded optimizer updates in step: it has no delayed update")
		}
		req.Shard = ShardOff
		p, err := run(false)
		if p != nil {
			p.Data.ShardWhy = "off: a delayed update is not sharded"
		}
		return p, err
	}
	switch req.Shard {
	case ShardOff:
		p, err := run(false)
		if p != nil {
			p.Data.ShardWhy = "off, as asked"
		}
		return p, err
	case ShardOn:
		p, err := run(true)
		if p != nil {
			p.Data.ShardWhy = "on, as asked"
		}
		return p, err
	}
	p0, err0 := run(false)
	if err0 == nil && p0.Optimizer == offload.TierDevice {
		p0.Data.ShardWhy = "off: every rank holds its whole training state on its device"
		return p0, nil
	}
	p1, err1 := run(true)
	if err0 == nil && p0.OptimizerLayers[2] == 0 {
		if err1 == nil && p1.StepTime*shardPreference < p0.StepTime {
			p1.Data.ShardWhy = fmt.Sprintf("on: out of core, each rank's host AdamW updates its shard only (unsharded %s, %.3f s a step; sharded %s, %.3f s)",
				p0.OptimizerSplit(), p0.StepTime, p1.OptimizerSplit(), p1.StepTime)
			return p1, nil
		}
		p0.Data.ShardWhy = "off: every rank holds its whole optimizer state without the disk tier, and sharded is not faster enough"
		return p0, nil
	}
	switch {
	case err1 != nil && err0 != nil:
		return nil, err0
	case err1 != nil:
		p0.Data.ShardWhy = fmt.Sprintf("off: sharded, no plan fits either (%v)", err1)
		return p0, nil
	case err0 != nil:
		p1.Data.ShardWhy = fmt.Sprintf("on: unsharded, %s", shortfallText(err0))
		return p1, nil
	case p1.StepTime < p0.StepTime:
		p1.Data.ShardWhy = fmt.Sprintf("on: unsharded, the host is short: the last %d layers' optimizer state would go to disk (%.3f s a step, sharded %.3f s)",
			p0.OptimizerLayers[2], p0.StepTime, p1.StepTime)
		return p1, nil
	}
	p0.Data.ShardWhy = fmt.Sprintf("off: sharded is no faster (%.3f s a step, unsharded %.3f s)", p1.StepTime, p0.StepTime)
	return p0, nil
}

// shardPreference is how much faster a sharded plan must be predicted to
// be to win over an unsharded one that fits without the disk tier (the
// sharded one depends on every rank for the checkpoints).
const shardPreference = 1.05

// shortfallText says what an infeasible plan lacked.
func shortfallText(err error) string {
	var ie *offload.InfeasibleError
	if !errors.As(err, &ie) || len(ie.Shortfalls) == 0 {
		return fmt.Sprintf("nothing fits: %v", err)
	}
	s := "nothing fits:"
	for i, f := range ie.Shortfalls {
		if i > 0 {
			s += ","
		}
		s += fmt.Sprintf(" the %s short by %s (needs %s of %s a rank)", f.Tier, kernels.FormatBytes(f.Need-f.Budget),
			kernels.FormatBytes(f.Need), kernels.FormatBytes(f.Budget))
	}
	return s
}
