package engine

import (
	"fmt"

	"github.com/spill-ml/spill/kernels"
)

// ComputeDType maps Config.Precision to the dtype of weights, activations
// and gradients. Master weights and Adam moments are always fp32.
func ComputeDType(precision string) (kernels.DType, error) {
	switch precision {
	case "", "bf16":
		return kernels.BF16, nil
	case "fp16":
		return kernels.F16, nil
	case "fp32":
		return kernels.F32, nil
	}
	return 0, fmt.Errorf("engine: precision %q (want bf16, fp16 or fp32)", precision)
}

// LossScaler is dynamic loss scaling for fp16: the loss gradient is
// multiplied by Scale so small gradients survive fp16; a step whose
// gradients overflow is skipped and halves Scale; Window good steps in a
// row double it. Disabled (bf16, fp32), Scale stays 1 and overflowing
// steps are still skipped but change nothing else.
type LossScaler struct {
	Enabled bool
	Scale   float64
	Good    int // overflow-free steps since the last change of Scale
	Window  int
}

// NewLossScaler returns the scaler for a compute dtype.
func NewLossScaler(dt kernels.DType, initial float64, window int) LossScaler {
	if dt != kernels.F16 {
		return LossScaler{Scale: 1, Window: window}
	}
	return LossScaler{Enabled: true, Scale: initial, Window: window}
}

// Update records the outcome of a step and reports whether the step must
// be skipped (its gradients were not finite).
func (s *LossScaler) Update(overflow bool) (skip bool) {
	if overflow {
		if s.Enabled {
			s.Scale = max(s.Scale/2, 1)
			s.Good = 0
		}
		return true
	}
	if s.Enabled {
		s.Good++
		if s.Window > 0 && s.Good >= s.Window {
			s.Scale *= 2
			s.Good = 0
		}
	}
	return false
}
