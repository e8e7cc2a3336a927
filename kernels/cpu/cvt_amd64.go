//go:build amd64 && !purego

package cpu

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// useAVX2Cvt enables the AVX2 bfloat16 conversions; useF16C the F16C
// binary16 ones (VCVTPH2PS, VCVTPS2PH with round to nearest even), whose
// special cases (NaN quieting and payload, subnormals, overflow to Inf) are
// those of kernels.F16FromF32 and kernels.F32FromF16.
var (
	useAVX2Cvt = cpu.X86.HasAVX2
	useF16C    = cpu.X86.HasAVX && hasF16C()
)

func hasF16C() bool {
	_, _, ecx, _ := cpuid(1, 0)
	return ecx&(1<<29) != 0
}

//go:noescape
func cpuid(eaxArg, ecxArg uint32) (eax, ebx, ecx, edx uint32)

// The vector kernels convert n elements, n a positive multiple of 8.

//go:noescape
func bf16ToF32AVX2(dst *float32, src *uint16, n int)

//go:noescape
func f32ToBF16AVX2(dst *uint16, src *float32, n int)

//go:noescape
func f16ToF32F16C(dst *float32, src *uint16, n int)

//go:noescape
func f32ToF16F16C(dst *uint16, src *float32, n int)

func bf16ToF32(dst []float32, src []uint16) {
	src = src[:len(dst)]
	if k := len(dst) &^ 7; useAVX2Cvt && k > 0 {
		bf16ToF32AVX2(unsafe.SliceData(dst), unsafe.SliceData(src), k)
		dst, src = dst[k:], src[k:]
	}
	bf16ToF32Go(dst, src)
}

func f16ToF32(dst []float32, src []uint16) {
	src = src[:len(dst)]
	if k := len(dst) &^ 7; useF16C && k > 0 {
		f16ToF32F16C(unsafe.SliceData(dst), unsafe.SliceData(src), k)
		dst, src = dst[k:], src[k:]
	}
	f16ToF32Go(dst, src)
}

func f32ToBF16(dst []uint16, src []float32) {
	src = src[:len(dst)]
	if k := len(dst) &^ 7; useAVX2Cvt && k > 0 {
		f32ToBF16AVX2(unsafe.SliceData(dst), unsafe.SliceData(src), k)
		dst, src = dst[k:], src[k:]
	}
	f32ToBF16Go(dst, src)
}

func f32ToF16(dst []uint16, src []float32) {
	src = src[:len(dst)]
	if k := len(dst) &^ 7; useF16C && k > 0 {
		f32ToF16F16C(unsafe.SliceData(dst), unsafe.SliceData(src), k)
		dst, src = dst[k:], src[k:]
	}
	f32ToF16Go(dst, src)
}
