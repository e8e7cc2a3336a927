package engine

import (
	"testing"

	"github.com/spill-ml/spill/kernels"
	"github.com/spill-ml/spill/offload/plan"
)

// sizeComm is a communicator of n ranks for runWorld, which asks only its
// size.
type sizeComm struct {
	kernels.Comm
	n int
}

func (c sizeComm) Size() int { return c.n }

// TestRunWorld: a rank plans for LOCAL_WORLD_SIZE ranks on its node
// (all of them when unset or nonsense), with the optimizer state sharded
// as the planner decides (on with zero_stage), off while the trainers
// cannot shard it; one process is PlanWorld{}.
func TestRunWorld(t *testing.T) {
	cfg0 := DefaultConfig()
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == "LOCAL_WORLD_SIZE" {
				return v
			}
			return ""
		}
	}
	if w := runWorld(&cfg0, nil, env("8")); w != (PlanWorld{}) {
		t.Fatalf("no comm: %+v", w)
	}
	if w := runWorld(&cfg0, sizeComm{n: 1}, env("1")); w != (PlanWorld{}) {
		t.Fatalf("one rank: %+v", w)
	}
	for v, local := range map[string]int{"4": 4, "": 0, "x": 0, "9": 0} {
		w := runWorld(&cfg0, sizeComm{n: 8}, env(v))
		if w.Ranks != 8 || w.LocalRanks != local || w.Shard != plan.ShardAuto {
			t.Errorf("LOCAL_WORLD_SIZE=%q: %+v", v, w)
		}
	}
	cfg2 := cfg0
	cfg2.ZeroStage = 2
	if w := runWorld(&cfg2, sizeComm{n: 8}, env("")); w.Shard != plan.ShardOn {
		t.Errorf("zero_stage 2: %+v", w)
	}
	ShardedOptimizerSupported = false
	defer func() { ShardedOptimizerSupported = true }()
	if w := runWorld(&cfg2, sizeComm{n: 8}, env("")); w.Shard != plan.ShardOff {
		t.Errorf("trainers that cannot shard: %+v", w)
	}
}

// TestChoosePlanPerRank: a rank of 4 on a node plans for a quarter of the
// node's host and disk budgets, and its out-of-core trainer's pools get
// that quarter.
func TestChoosePlanPerRank(t *testing.T) {
	m := mustGPT(t)
	cfg := rankPlanConfig(t, m)
	tp, _, err := choosePlanWorld(&cfg, "cpu", m, oocB, oocT, cfg.DeviceMemory, nil, PlanWorld{Ranks: 4, Shard: plan.ShardOff})
	if err != nil {
		t.Fatal(err)
	}
	p := tp.Placement
	if tp.Resident || p == nil || p.Data == nil || p.Data.LocalRanks != 4 || p.Data.NodeHost != 8<<30 {
		t.Fatalf("plan %+v", p)
	}
	if p.Memory[1].Budget != 2<<30 || p.Memory[2].Budget != 16<<20 || tp.Options.HostBudget != 2<<30 || tp.Options.DiskBudget != 0 && tp.Options.DiskBudget != 16<<20 {
		t.Fatalf("per-rank budgets: host %d disk %d, trainer's host %d disk %d", p.Memory[1].Budget, p.Memory[2].Budget,
			tp.Options.HostBudget, tp.Options.DiskBudget)
	}
	if p.Busy.Comm <= 0 {
		t.Fatalf("no all-reduce time: %+v", p.Busy)
	}
}
