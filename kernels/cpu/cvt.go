package cpu

import (
	"math"

	"github.com/spill-ml/spill/kernels"
)

// Slice conversions between float32 and the 16-bit formats, the kernels of
// view.load and view.store. The vector versions (cvt_amd64.s) give the
// same bits as these scalar loops, which use the reference conversions of
// package kernels; len(src) must be at least len(dst).

func bf16ToF32Go(dst []float32, src []uint16) {
	src = src[:len(dst)]
	for i, h := range src {
		dst[i] = math.Float32frombits(uint32(h) << 16)
	}
}

func f16ToF32Go(dst []float32, src []uint16) {
	src = src[:len(dst)]
	for i, h := range src {
		dst[i] = kernels.F32FromF16(h)
	}
}

func f32ToBF16Go(dst []uint16, src []float32) {
	src = src[:len(dst)]
	for i, x := range src {
		dst[i] = kernels.BF16FromF32(x)
	}
}

func f32ToF16Go(dst []uint16, src []float32) {
	src = src[:len(dst)]
	for i, x := range src {
		dst[i] = kernels.F16FromF32(x)
	}
}
