//go:build cuda

package engine

import (
	"testing"

	"github.com/spill-ml/spill/kernels"
)

// TestDataParallelWorldSize1CUDA: world size 1 through the real NCCL path
// (a communicator of one rank on the GPU) trains bit for bit as the
// single-GPU trainer does.
func TestDataParallelWorldSize1CUDA(t *testing.T) {
	checkWorldSize1(t, func() kernels.Backend {
		be, err := kernels.Open("cuda", kernels.Config{})
		if err != nil {
			t.Skipf("cuda: %v", err)
		}
		t.Cleanup(func() { be.Close() })
		return be
	})
}
