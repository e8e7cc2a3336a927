//go:build cuda

package engine

import (
	"math"
	"testing"

	"github.com/spill-ml/spill/kernels"
)

// llamaCheckShape has grouped-query attention (4 query heads on 2
// key/value heads) of head size 64, the bf16 flash kernels' size, over 64
// positions, with the llama3 RoPE scaling.
var llamaCheckShape = LlamaShape{Layers: 2, Heads: 4, KVHeads: 2, Embd: 256, FFN: 384, Vocab: 96, MaxSeq: 64,
	RoPE:    kernels.RoPEConfig{Theta: 500000, Scaling: llama3Scaling(32)},
	NormEps: 1e-5}

func llamaCheckRun(t *testing.T, dev string, dt kernels.DType, steps int) ([]float64, [][]float32) {
	t.Helper()
	m, err := NewLlama(llamaCheckShape, dt)
	if err != nil {
		t.Fatal(err)
	}
	return checkRun(t, dev, m, steps)
}

// TestLlamaStepCUDA checks one whole training step of a Llama on the CUDA
// backend (its kernels.LlamaOps: RMSNorm, RoPE, SwiGLU, grouped-query
// attention) against the CPU backend, with the tolerances of
// TestGPTStepCUDA.
func TestLlamaStepCUDA(t *testing.T) {
	for _, c := range []struct {
		dt            kernels.DType
		lossTol, wTol float64
	}{{kernels.F32, 1e-5, 1e-4}, {kernels.BF16, 1e-2, 5e-2}} {
		wantL, wantW := llamaCheckRun(t, "cpu", c.dt, 1)
		gotL, gotW := llamaCheckRun(t, "cuda", c.dt, 1)
		if e := math.Abs(gotL[0]-wantL[0]) / wantL[0]; !(e <= c.lossTol) {
			t.Errorf("%v: loss %g on the GPU, %g on the CPU (relative error %.2g > %g)", c.dt, gotL[0], wantL[0], e, c.lossTol)
		}
		if e := relL2(gotW, wantW); !(e <= c.wTol) {
			t.Errorf("%v: master weights after one step differ by %.2g (relative L2) > %g", c.dt, e, c.wTol)
		}
	}
}

// TestLlamaLossTrajectoryCUDA: 10 bf16 steps of the Llama on the GPU track
// the CPU backend's within 2%, and both losses fall (as
// TestLossTrajectoryCUDA for the GPT).
func TestLlamaLossTrajectoryCUDA(t *testing.T) {
	const steps = 10
	want, _ := llamaCheckRun(t, "cpu", kernels.BF16, steps)
	got, _ := llamaCheckRun(t, "cuda", kernels.BF16, steps)
	for i := range want {
		if e := math.Abs(got[i]-want[i]) / want[i]; !(e <= 0.02) {
			t.Errorf("step %d: loss %.4f on the GPU, %.4f on the CPU", i, got[i], want[i])
		}
	}
	t.Logf("GPU %.4f ... CPU %.4f", got, want)
	for _, l := range [][]float64{want, got} {
		if !(l[steps-1] < l[0]-0.1) {
			t.Errorf("loss did not fall: %.4f", l)
		}
	}
}
