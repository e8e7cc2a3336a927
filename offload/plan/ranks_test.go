package plan

import (
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/spill-ml/spill/kernels"
	"github.com/spill-ml/spill/offload"
)

// TestHostStateSharded: a rank's optimizer bytes of a host layer are
// kernels.ShardLen of its parameters, ceil-divided per layer; the disk
// layers' (on disk and in the disk tier's buffers), the weights and the
// gradients stay whole, and so does the master of fp32 without a delayed
// update (it is the weights).
func TestHostStateSharded(t *testing.T) {
	params := []int64{10, 7, 1, 33, 5}
	tiers := []offload.Tier{offload.TierDevice, offload.TierHost, offload.TierHost, offload.TierDisk, offload.TierDisk}
	const N = 4
	sl := func(np int64) int64 { return int64(kernels.ShardLen(int(np), N)) }
	// bf16, masters of the disk layers on disk.
	by := HostStateRanks(params, 2, true, false, true, tiers, nil, N)
	hostOpt := sl(7) + sl(1)                       // 2 + 1
	buf := int64(min(2, DiskBuffers)) * max(33, 5) // 2 buffers of 33
	want := map[offload.Class]int64{
		offload.Master:  4*hostOpt + 4*buf,
		offload.AdamM:   4*hostOpt + 4*buf,
		offload.AdamV:   4*hostOpt + 4*buf,
		offload.Weights: 2 * (7 + 1 + 33 + 5),
		offload.Grads:   2 * (7 + 1 + 33 + 5),
	}
	if !reflect.DeepEqual(by, want) {
		t.Fatalf("host state sharded 4 ways = %v, want %v", by, want)
	}
	if hostOpt != 3 || buf != 66 {
		t.Fatalf("ShardLen: %d %d", hostOpt, buf)
	}
	disk := DiskState(params, true, tiers)
	d := int64(4 * (33 + 5))
	if want := (map[offload.Class]int64{offload.Master: d, offload.AdamM: d, offload.AdamV: d}); !reflect.DeepEqual(disk, want) {
		t.Fatalf("disk state = %v, want %v", disk, want)
	}
	// fp32 without a delayed update: the master is the whole weights.
	by = HostStateRanks(params[1:3], 4, false, false, false, nil, nil, N)
	if by[offload.Master] != 4*8 || by[offload.AdamM] != 4*(sl(7)+sl(1)) || by[offload.Weights] != 0 {
		t.Fatalf("fp32 sharded host state %v", by)
	}
	// One rank is HostState.
	if a, b := HostStateRanks(params, 2, true, true, true, tiers, nil, 1), HostState(params, 2, true, true, true, tiers, nil); !reflect.DeepEqual(a, b) {
		t.Fatalf("HostStateRanks(1) %v != HostState %v", a, b)
	}
}

// TestPlanOneRankUnchanged: Ranks 1 (or 0) plans exactly as before, with
// no data-parallel section.
func TestPlanOneRankUnchanged(t *testing.T) {
	m := gpt(8, 512, 8192, 256)
	req := Request{Model: m, Batch: 16, Hardware: hw(), Budgets: offload.Budgets{Device: 200 << 20, Host: 64 * GiB}}
	p0, err := Plan(req)
	if err != nil {
		t.Fatal(err)
	}
	req.Ranks, req.LocalRanks, req.Shard = 1, 1, ShardOn
	p1, err := Plan(req)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(p0, p1) || p1.Data != nil || p1.Busy.Comm != 0 {
		t.Fatalf("one rank plans differently:\n%+v\n%+v", p0, p1)
	}
}

// rankReq is a 1.2B-parameter model on 8 ranks of one node, its devices
// too small for the resident trainer.
func rankReq(nodeHost, disk int64) Request {
	return Request{Model: gpt(24, 2048, 32000, 1024), Batch: 8, Hardware: hw(), Ranks: 8,
		Budgets: offload.Budgets{Device: 4 * GiB, Host: nodeHost, Disk: disk}}
}

// TestPlanRanksHostShare: each rank plans for its share of the node's
// host memory; the gradients' reduction is in the step time.
func TestPlanRanksHostShare(t *testing.T) {
	req := rankReq(1024*GiB, 0)
	req.Shard = ShardOff
	p, err := Plan(req)
	if err != nil {
		t.Fatal(err)
	}
	if p.Data == nil || p.Data.Ranks != 8 || p.Data.LocalRanks != 8 || p.Data.NodeHost != 1024*GiB || p.Data.ShardOptimizer {
		t.Fatalf("data parallel %+v", p.Data)
	}
	if p.Memory[1].Budget != 128*GiB {
		t.Fatalf("per-rank host budget %d, want 128 GiB", p.Memory[1].Budget)
	}
	grad := float64(2 * p.Params)
	want := 2 * 7.0 / 8 * grad / offload.DefaultInterconnect
	if math.Abs(p.Busy.Comm-want) > 1e-9*want || p.Data.CommExposed <= 0 || p.Data.CommExposed > p.Busy.Comm+1e-12 {
		t.Fatalf("comm busy %v (want %v), exposed %v", p.Busy.Comm, want, p.Data.CommExposed)
	}
	one := req
	one.Ranks = 1
	one.Budgets.Host = 128 * GiB
	p1, err := Plan(one)
	if err != nil {
		t.Fatal(err)
	}
	if p.StepTime < p1.StepTime || math.Abs(p.TokensPerSec-8*float64(p.Batch*p.SeqLen)/p.StepTime) > 1e-6*p.TokensPerSec {
		t.Fatalf("8 ranks: step %v (one rank %v), tokens/s %v", p.StepTime, p1.StepTime, p.TokensPerSec)
	}
	// Two nodes of 4: each rank gets a quarter of its node's.
	req.LocalRanks = 4
	req.Budgets.Host = 256 * GiB
	if p, err = Plan(req); err != nil || p.Memory[1].Budget != 64*GiB {
		t.Fatalf("4 local ranks: %v, host budget %v", err, p)
	}
}

// TestPlanShardsWhenHostShort: with the host too short for every rank's
// whole optimizer state the planner shards it and says why; with room, it
// does not.
func TestPlanShardsWhenHostShort(t *testing.T) {
	// Unsharded a rank needs ~19 GB of host; sharded ~7 GB; the share is
	// 16 GiB less the 4 GiB reserve.
	p, err := Plan(rankReq(128*GiB, 0))
	if err != nil {
		t.Fatal(err)
	}
	if !p.Data.ShardOptimizer || !strings.Contains(p.Data.ShardWhy, "on: unsharded, nothing fits: the host short by") {
		t.Fatalf("no disk: shard %v: %s", p.Data.ShardOptimizer, p.Data.ShardWhy)
	}
	// The host bytes are the shards'.
	var opt int64
	for _, l := range p.Layers {
		if l.Optimizer == offload.TierHost {
			opt += 4 * ShardParams(l.Params, 8)
		}
	}
	if got := p.Memory[1].ByClass[offload.AdamM]; got != opt {
		t.Fatalf("host adam_m %d, want the shards' %d", got, opt)
	}
	// With a disk tier, unsharded fits by moving layers to disk: sharding
	// fits on the host and is faster.
	p, err = Plan(rankReq(128*GiB, 8*1024*GiB))
	if err != nil {
		t.Fatal(err)
	}
	if !p.Data.ShardOptimizer || p.OptimizerLayers[2] != 0 || !strings.Contains(p.Data.ShardWhy, "the host is short") {
		t.Fatalf("with disk: shard %v, layers %v: %s", p.Data.ShardOptimizer, p.OptimizerLayers, p.Data.ShardWhy)
	}
	// A device roomy enough for the resident trainer: no sharding.
	req := rankReq(1024*GiB, 0)
	req.Budgets.Device = 64 * GiB
	p, err = Plan(req)
	if err != nil {
		t.Fatal(err)
	}
	if p.Optimizer != offload.TierDevice || p.Data.ShardOptimizer || !strings.HasPrefix(p.Data.ShardWhy, "off:") {
		t.Fatalf("roomy host: shard %v: %s", p.Data.ShardOptimizer, p.Data.ShardWhy)
	}
	// Sharding off, as asked: refused, naming the per-rank host budget.
	req = rankReq(128*GiB, 0)
	req.Shard = ShardOff
	var ie *offload.InfeasibleError
	if _, err := Plan(req); err == nil || !strings.Contains(err.Error(), "host short by") {
		t.Fatalf("unsharded with 16 GiB a rank: %v", err)
	} else if !asInfeasible(err, &ie) || ie.Closest == nil || ie.Closest.Data == nil || ie.Closest.Data.NodeHost != 128*GiB {
		t.Fatalf("refusal without the per-rank view: %v", err)
	}
}

func asInfeasible(err error, ie **offload.InfeasibleError) bool {
	e, ok := err.(*offload.InfeasibleError)
	*ie = e
	return ok
}

func TestAllReduceTime(t *testing.T) {
	if AllReduceTime(1e9, 1, 1e9) != 0 || AllReduceTime(1e9, 2, 1e9) != 1 || AllReduceTime(8e9, 8, 1e9) != 14 {
		t.Fatal("2(N-1)/N x bytes / bus bandwidth")
	}
	if b := RankBudgets(offload.Budgets{Device: 5, Host: 10, Disk: 7}, 3); b != (offload.Budgets{Device: 5, Host: 3, Disk: 2}) {
		t.Fatalf("RankBudgets %+v", b)
	}
}

// TestPlanShardsNoDevice: the engine shards only the host tier, so the
// resident trainer gains nothing from sharding; a device too small for
// it is not helped by a shard either, and what a sharded plan keeps on
// the device is the unsharded plan's and the collectives' padded buffer.
func TestPlanShardsNoDevice(t *testing.T) {
	req := rankReq(1024*GiB, 0)
	req.Budgets.Device = 16 * GiB
	req.Shard = ShardOn
	p, err := Plan(req)
	if err != nil {
		t.Fatal(err)
	}
	if p.Optimizer == offload.TierDevice {
		t.Fatalf("sharded resident plan %s: the engine does not shard the device", p.Summary())
	}
	req.Shard = ShardOff
	p0, err := Plan(req)
	if err != nil {
		t.Fatal(err)
	}
	for _, cl := range []offload.Class{offload.Master, offload.AdamM, offload.AdamV} {
		if p.Memory[0].ByClass[cl] != p0.Memory[0].ByClass[cl] && p.Summary() == p0.Summary() {
			t.Errorf("device %s: sharded %d, unsharded %d", cl, p.Memory[0].ByClass[cl], p0.Memory[0].ByClass[cl])
		}
	}
	var sharded []int64
	for _, l := range p.Layers {
		if l.Optimizer == offload.TierHost {
			sharded = append(sharded, l.Params)
		}
	}
	if cb := CommBytes(8, sharded); cb == 0 || CommBytes(8, nil) != 0 {
		t.Fatalf("collectives' buffer %d", cb)
	}
}

// TestPlanShardedNotEager: sharded, the host updates wait for the step's
// statistics and the weights' all-gather follows them: a sharded plan's
// step is no shorter than the same placement's with GlobalNorm, and the
// interconnect carries the all-gather besides the reduce-scatters.
func TestPlanShardedNotEager(t *testing.T) {
	req := rankReq(1024*GiB, 0)
	req.Optimizer = offload.TierHost
	req.Shard = ShardOn
	p, err := Plan(req)
	if err != nil {
		t.Fatal(err)
	}
	var bytes float64
	for _, l := range p.Layers {
		if l.Optimizer == offload.TierHost {
			bytes += 2 * float64(l.Params)
		}
	}
	rs := AllReduceTime(bytes, 8, offload.DefaultInterconnect) / 2
	if want := 2 * rs; math.Abs(p.Busy.Comm-want) > 1e-9*want {
		t.Fatalf("comm busy %v, want reduce-scatters and all-gathers %v", p.Busy.Comm, want)
	}
	g := req
	g.GlobalNorm = true
	pg, err := Plan(g)
	if err != nil {
		t.Fatal(err)
	}
	if pg.Summary() == p.Summary() && math.Abs(pg.StepTime-p.StepTime) > 1e-9*p.StepTime {
		t.Fatalf("sharded step %v, with GlobalNorm %v: sharded updates are not eager either way", p.StepTime, pg.StepTime)
	}
	d := req
	d.DelayedUpdate = true
	if _, err := Plan(d); err == nil {
		t.Fatal("sharded with a delayed update: planned")
	}
	d.Shard = ShardAuto
	if p, err := Plan(d); err != nil || p.Data.ShardOptimizer {
		t.Fatalf("auto with a delayed update: %v, %+v", err, p)
	}
}
