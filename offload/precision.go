package offload

import "fmt"

// Precision is the training precision.
type Precision string

// Precisions. Mixed precisions keep an fp32 master copy of the weights.
const (
	BF16 Precision = "bf16" // bf16 compute, fp32 master weights and Adam state
	FP16 Precision = "fp16" // fp16 compute with loss scaling, like bf16 otherwise
	FP32 Precision = "fp32" // fp32 throughout: the weights are the master
)

// ParsePrecision parses "bf16", "fp16" or "fp32".
func ParsePrecision(s string) (Precision, error) {
	switch Precision(s) {
	case BF16, FP16, FP32:
		return Precision(s), nil
	}
	return "", fmt.Errorf("offload: unknown precision %q (want bf16, fp16 or fp32)", s)
}

// Elem is the size of one element in the compute dtype.
func (p Precision) Elem() int64 {
	if p == FP32 {
		return 4
	}
	return 2
}

// Mixed reports whether the precision keeps an fp32 master copy.
func (p Precision) Mixed() bool { return p != FP32 }
