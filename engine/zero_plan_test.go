package engine

import (
	"context"
	"fmt"
	"testing"

	"github.com/spill-ml/spill/kernels"
	"github.com/spill-ml/spill/offload"
	"github.com/spill-ml/spill/offload/plan"
)

// TestZeroPlanMatchesTrainers plans a rank of a job of 3 on one node
// through the run's path (choosePlanWorld, zeroStage), sharded and not,
// in fp32 and bf16, and builds every rank's out-of-core trainer from the
// plan on fake ranks: each rank holds exactly the host bytes and has
// exactly the device peak the plan predicts (the last rank's shorter
// range is padded to ShardLen), and the ranks train two steps together.
func TestZeroPlanMatchesTrainers(t *testing.T) {
	const ranks = 3
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
		for _, shard := range []plan.Sharding{plan.ShardOff, plan.ShardOn} {
			t.Run(fmt.Sprintf("%s-shard-%s", dt, shard), func(t *testing.T) {
				build := func() *Model {
					m, err := NewGPT(oocShape, dt)
					if err != nil {
						t.Fatal(err)
					}
					return m
				}
				m := build()
				cfg := rankPlanConfig(t, m)
				tp, _, err := choosePlanWorld(&cfg, "cpu", m, oocB, oocT, cfg.DeviceMemory, nil, PlanWorld{Ranks: ranks, Shard: shard})
				if err != nil {
					t.Fatal(err)
				}
				p := tp.Placement
				if tp.Resident || p.Data == nil || p.Data.ShardOptimizer != (shard == plan.ShardOn) || p.OptimizerLayers[1] == 0 {
					t.Fatalf("plan %s, data %+v", p.Summary(), p.Data)
				}
				stage := zeroStage(&cfg, tp)
				if (stage == 2) != (shard == plan.ShardOn) {
					t.Fatalf("zero stage %d for sharding %s", stage, shard)
				}
				h := p.Memory[1]
				wantHost := h.Peak - h.Reserve - h.ByClass[offload.Workspace]
				t.Logf("%s; host %d, device %d", p.Summary(), wantHost, tp.DevicePeak)

				type result struct {
					host, dev int64
					losses    []float64
					err       error
				}
				res := make([]result, ranks)
				eachRank(t, ranks, func(ctx context.Context, r int, be kernels.Backend, id []byte) {
					res[r].err = func() error {
						comm, err := be.(kernels.CommOpener).OpenComm(ctx, id, r, ranks)
						if err != nil {
							return err
						}
						defer comm.Close()
						mr := m
						if r > 0 {
							mr = build()
							mr.SetLeanActivations(tp.Lean)
						}
						to := trainerOptions(&cfg, tp.B, oocT)
						to.Accum, to.Comm, to.ZeroStage = tp.Accum, comm, stage
						tr, err := NewOffloadTrainer(be, mr, to, tp.Options)
						if err != nil {
							return err
						}
						defer tr.Close()
						res[r].host, res[r].dev = tr.HostBytes(), tr.PredictedDevicePeak()
						if err := tr.InitWeights(ctx, 7); err != nil {
							return err
						}
						feed := oocFeed()
						for range 2 {
							sr, err := tr.TrainStep(ctx, feed)
							if err != nil {
								return err
							}
							res[r].losses = append(res[r].losses, sr.Loss)
						}
						return nil
					}()
				})
				for r, x := range res {
					if x.err != nil {
						t.Fatalf("rank %d: %v", r, x.err)
					}
					if x.host != wantHost {
						t.Errorf("rank %d holds %d host bytes, the plan %d", r, x.host, wantHost)
					}
					if x.dev != tp.DevicePeak {
						t.Errorf("rank %d: device peak %d, the plan %d", r, x.dev, tp.DevicePeak)
					}
					if r > 0 && fmt.Sprint(x.losses) != fmt.Sprint(res[0].losses) {
						t.Errorf("rank %d losses %v, rank 0 %v", r, x.losses, res[0].losses)
					}
				}
			})
		}
	}
}
