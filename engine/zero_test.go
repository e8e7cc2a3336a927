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
// 1e-6. Each rank holds about 1/N of the optimizer state: the ranks'
// bytes add up to the unsharded rank's, and none holds more than its
// ceil(np/N) share per layer.
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
			var sum int64
			for r, x := range got {
				sum += x.optBytes
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
			// Optimizer state per rank: 12 bytes per parameter of the
			// host layers (master, m, v), split over the ranks.
			full := want[0].optBytes
			if sum != full {
				t.Errorf("the ranks hold %d bytes of optimizer state together, the unsharded rank %d", sum, full)
			}
			m := tinyGPT(t, kernels.F32)
			var ceil int64
			for i, l := range m.Layers {
				if !c.mixed || i > 0 {
					ceil += 12 * int64(kernels.ShardLen(l.NumParams(), c.ranks))
				}
			}
			for r, x := range got {
				if x.optBytes > ceil {
					t.Errorf("rank %d holds %d bytes of optimizer state, want about %d/%d (at most %d)", r, x.optBytes, full, c.ranks, ceil)
				}
			}
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
