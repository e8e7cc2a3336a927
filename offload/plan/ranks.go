package plan

import (
	"errors"
	"fmt"

	"github.com/spill-ml/spill/kernels"
	"github.com/spill-ml/spill/offload"
	"github.com/spill-ml/spill/offload/schedule"
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
// Sharding (ZeRO-1/2). With Shard on, each rank holds, of every layer of
// np parameters, kernels.ShardLen(np, Ranks) elements of the optimizer
// state (the flat buffer padded to ShardLen*Ranks, as the engine shards
// it): the fp32 master where it is a buffer of its own (mixed precision
// or a delayed update; in fp32 without one the master is the weights
// every rank needs whole) and both Adam moments, on whichever tier the
// layer's optimizer state is (device, host or disk, and the disk tier's
// buffers). The compute-dtype weights and the gradients' landing buffers
// stay whole (the updated shards are all-gathered into them). The host
// AdamW and the disk traffic of a layer are those of its shard.
//
// Communication. Each rank reduces its compute-dtype gradients once per
// step, layer by layer as the last backward makes them final, on a comm
// queue of its own (engine/ddp.go): an all-reduce of n bytes takes
// 2(N-1)/N x n / Hardware.InterconnectRate(), and a reduce-scatter plus
// the all-gather of the updated weights (sharded) the same. Each GPU has
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

// shardShape is sh with every layer's master and moments sharded across
// ranks (each moment MomentBytes, the master MasterBytes, in fp32 words).
func shardShape(sh []schedule.Layer, ranks int) []schedule.Layer {
	out := append([]schedule.Layer(nil), sh...)
	for i := range out {
		if out[i].MasterBytes > 0 {
			out[i].MasterBytes = 4 * ShardParams((out[i].MasterBytes+3)/4, ranks)
		}
		out[i].MomentBytes = 4 * ShardParams((out[i].MomentBytes+3)/4, ranks)
	}
	return out
}

// shardResident takes the optimizer state of the resident trainer's
// device bytes by (all layers') down to the shards of ranks.
func (pl *planner) shardResident(by map[offload.Class]int64) {
	var whole, shard int64
	for _, l := range pl.m.Layers {
		whole += 4 * l.Params
		shard += 4 * ShardParams(l.Params, pl.shard)
	}
	for _, cl := range []offload.Class{offload.Master, offload.AdamM, offload.AdamV} {
		if by[cl] > 0 {
			by[cl] -= whole - shard
		}
	}
}

// commTimeline is the last backward of c with the gradients' reductions:
// bwd(i) is layer i's backward, wait(i) says the compute queue waits for
// layer i's reduction at once. It returns when each layer's reduced
// gradients are ready, the reductions' busy time, and how much later the
// backward ends (both queues done) than it would without them.
func (pl *planner) commTimeline(bwd func(int) float64, wait func(int) bool) (ready []float64, busy, exposed float64) {
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
			p1.Data.ShardWhy = fmt.Sprintf("on: unsharded, the device is short of the whole optimizer state (%s, %.3f s a step; sharded %s, %.3f s)",
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
// sharded one adds an all-gather of the weights the model counts as free
// of extra time, and a dependence on every rank for the checkpoints).
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
