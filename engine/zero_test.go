package engine

import (
	"fmt"
	"math"
	"testing"

	"github.com/spill-ml/spill/kernels"
	"github.com/spill-ml/spill/offload"
)

// zeroOffload is the placement of the sharding tests: weights on the
// device, gradients evicted to the host, every layer's optimizer on the
// host (all sharded), or with the first layer's on the device (not
// sharded, all-reduced).
func zeroOffload(mixed bool) *OffloadOptions {
	tiers := []offload.Tier{offload.TierHost, offload.TierHost, offload.TierHost, offload.TierHost}
	if mixed {
		tiers[0] = offload.TierDevice
	}
	return &OffloadOptions{Weights: offload.TierDevice, Grads: offload.TierHost, OptimizerTiers: tiers}
}

func zeroSameWeights(t *testing.T, what string, got, want [][]float32) {
	t.Helper()
	for l := range want {
		for i := range want[l] {
			if math.Float32bits(got[l][i]) != math.Float32bits(want[l][i]) {
				t.Fatalf("%s: layer %d weight %d: %v, want %v", what, l, i, got[l][i], want[l][i])
			}
		}
	}
}

// TestZeroMatchesDataParallel trains the tiny fp32 GPT on 2 and 3 fake
// ranks with the host optimizer state sharded (ZeroStage 2) and wants
// every rank to end with the same weights and losses, bit for bit, equal
// to the unsharded data-parallel run's: bitwise without clipping (the
// fake's reduce-scatter sums in the same rank order as its all-reduce,
// and AdamW is elementwise); with clipping the global norm is the sum of
// the shards' sums of squares, which rounds differently from one sum per
// layer, so the weights agree to 1e-6 relative (L2) and the losses to
// 1e-6. Each rank holds its range of the Adam moments and the whole fp32
// master, which is the weights (engine/zero.go): 4·np + 8·(its range)
// bytes per host layer, exactly.
func TestZeroMatchesDataParallel(t *testing.T) {
	for _, c := range []struct {
		ranks int
		clip  float64
		mixed bool
	}{{2, 0, false}, {3, 0, false}, {3, 0, true}, {2, 1, false}, {3, 1, true}} {
		t.Run(fmt.Sprintf("ranks%d-clip%v-mixed%v", c.ranks, c.clip, c.mixed), func(t *testing.T) {
			base := ddpCase{ranks: c.ranks, accum: 2, steps: 3, clip: c.clip, offload: zeroOffload(c.mixed)}
			in, tg := randomRows(base.steps * base.ranks * base.accum * ddpB * ddpT)
			build := func(int) *Model { return tinyGPT(t, kernels.F32) }
			want := runRanks(t, base, in, tg, build)
			sh := base
			sh.zero = 2
			got := runRanks(t, sh, in, tg, build)
			for r := range got {
				if want[r].err != nil || got[r].err != nil {
					t.Fatalf("rank %d: unsharded: %v; sharded: %v", r, want[r].err, got[r].err)
				}
			}
			for r, x := range got {
				if r > 0 {
					zeroSameWeights(t, fmt.Sprintf("sharded rank %d vs rank 0", r), x.weights, got[0].weights)
				}
				for s := range x.losses {
					if c.clip == 0 && x.losses[s] != want[0].losses[s] ||
						math.Abs(x.losses[s]-want[0].losses[s]) > 1e-6*want[0].losses[s] {
						t.Errorf("rank %d step %d: loss %v sharded, %v unsharded", r, s, x.losses[s], want[0].losses[s])
					}
				}
			}
			if c.clip == 0 {
				zeroSameWeights(t, "sharded vs unsharded", got[0].weights, want[0].weights)
			} else if d := relL2(got[0].weights, want[0].weights); d > 1e-6 || math.IsNaN(d) {
				t.Errorf("sharded weights differ from the unsharded run's by %.3g (relative L2)", d)
			} else {
				t.Logf("with clipping: %.3g relative L2 from the unsharded run", d)
			}
			// Optimizer state per rank: the whole fp32 master (the
			// weights) and the rank's range of m and v, per host layer.
			m := tinyGPT(t, kernels.F32)
			for r, x := range got {
				var need int64
				for i, l := range m.Layers {
					if !c.mixed || i > 0 {
						lo, hi := kernels.ShardRange(l.NumParams(), c.ranks, r)
						need += 4*int64(l.NumParams()) + 8*int64(hi-lo)
					}
				}
				if x.optBytes != need {
					t.Errorf("rank %d holds %d bytes of optimizer state, want %d", r, x.optBytes, need)
				}
			}
			full := want[0].optBytes
			t.Logf("optimizer state per rank: %v bytes of %d", func() []int64 {
				var b []int64
				for _, x := range got {
					b = append(b, x.optBytes)
				}
				return b
			}(), full)
		})
	}
}
