//go:build cuda

package engine

import (
	"testing"

	"github.com/spill-ml/spill/kernels"
	_ "github.com/spill-ml/spill/kernels/cuda"
	"github.com/spill-ml/spill/offload"
)

// cudaShape is 16 blocks of width 128 (two heads of 64, the bf16 flash
// kernel's size) over 32 positions: 1/8 of its resident need leaves room
// for the CUDA backend's grow-only scratch workspace (1 MiB at least).
var cudaShape = GPTShape{Layers: 16, Heads: 2, Embd: 128, Vocab: 64, MaxSeq: 32}

// TestOutOfCoreCUDA trains cudaShape out of core on the CUDA backend
// under a memory limit of 1/8 of its resident need, for 3 steps,
// and compares it with the resident trainer on the same backend (see
// runDeviceCase for the checks): fp32 with the planner's placement, bf16
// with streamed weights and every block's activations offloaded to pinned
// host memory, and bf16 with streamed weights and every block recomputed
// selectively (the checkpoint copied back on the device).
//
// Tolerances: the out-of-core AdamW runs on the host (offload.HostAdamW)
// and the resident one on the GPU, so the master weights differ by
// rounding (FMA contraction, sqrt and division); the plan may also split
// the batch into smaller micro-batches, changing the order of the
// gradient sums. fp32: each step's loss within 1e-4 relative, the final
// master weights within 1e-3 (relative L2). bf16: a master weight one ulp
// apart can round to a different bf16 compute weight, so 2e-2 for both.
func TestOutOfCoreCUDA(t *testing.T) {
	t.Run("fp32-planned", func(t *testing.T) {
		runDeviceCase(t, deviceCase{device: "cuda", dt: kernels.F32, shape: cudaShape, reserve: 3 << 19, lossTol: 1e-4, weightTol: 1e-3})
	})
	t.Run("bf16-streamed-offload", func(t *testing.T) {
		runDeviceCase(t, deviceCase{device: "cuda", dt: kernels.BF16, shape: cudaShape, reserve: 3 << 19, weights: offload.TierHost, activations: "offload",
			lossTol: 2e-2, weightTol: 2e-2})
	})
	t.Run("bf16-streamed-selective", func(t *testing.T) {
		runDeviceCase(t, deviceCase{device: "cuda", dt: kernels.BF16, shape: cudaShape, reserve: 3 << 19, weights: offload.TierHost, activations: "recompute-selective",
			lossTol: 2e-2, weightTol: 2e-2})
	})
}
