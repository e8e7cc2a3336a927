package cpu

import (
	"math"
	"unsafe"

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

// StoreF32 rounds src to nearest even into dst, len(src) elements of dtype
// dt (BF16, F16 or F32) in little-endian bytes, vectorised where the
// processor allows; the bits are those of kernels.BF16FromF32 and
// kernels.F16FromF32 (the CPU backend's Cast).
func StoreF32(dst []byte, dt kernels.DType, src []float32) {
	n := len(src)
	switch dt {
	case kernels.F32:
		copy(dst[:4*n], unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(src))), 4*n))
	case kernels.BF16:
		f32ToBF16(unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(dst[:2*n]))), n), src)
	case kernels.F16:
		f32ToF16(unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(dst[:2*n]))), n), src)
	default:
		panic("kernels/cpu: StoreF32 into " + dt.String())
	}
}
