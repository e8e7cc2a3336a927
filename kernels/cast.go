package kernels

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Conversions between float32 and the 16-bit float formats. They are exact
// where the target can represent the value, round to nearest with ties to
// even otherwise, and treat special values the way x86 (F16C, AVX-512 BF16
// without DAZ) and CUDA's _rn intrinsics do:
//
//   - NaN stays NaN: the sign and the top payload bits are kept and the
//     result is a quiet NaN (a signaling NaN is quieted).
//   - ±Inf stays ±Inf; finite values too large for binary16 become ±Inf
//     (|x| ≥ 65520), as do values too large for bfloat16 after rounding.
//   - Subnormals are produced and consumed, never flushed to zero; values
//     below half the smallest subnormal round to a zero of the same sign.
//
// Widening (16 → 32 bits) is always exact.

// BF16FromF32 rounds f to bfloat16 (nearest even).
func BF16FromF32(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 { // NaN: keep sign and payload top, force quiet
		return uint16(b>>16) | 0x0040
	}
	// Adding 0x7fff plus the lowest kept bit rounds to nearest even; a carry
	// out of the mantissa bumps the exponent, up to Inf, which is correct.
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// F32FromBF16 widens a bfloat16 to float32 (exact; NaN payloads kept).
func F32FromBF16(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// F16FromF32 rounds f to IEEE binary16 (nearest even), producing
// subnormals, ±Inf on overflow and quiet NaNs.
func F16FromF32(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23) & 0xff
	mant := b & 0x7fffff
	if exp == 0xff {
		if mant != 0 {
			return sign | 0x7e00 | uint16(mant>>13)
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15 // biased binary16 exponent
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		// Subnormal (or zero) in binary16. |f| < 2^-25 always rounds to 0.
		if e < -10 {
			return sign
		}
		m := mant | 0x800000 // exp >= 102 here, so f is normal in float32
		shift := uint(14 - e)
		h := m >> shift
		rem := m & (1<<shift - 1)
		half := uint32(1) << (shift - 1)
		if rem > half || (rem == half && h&1 == 1) {
			h++ // may carry into the smallest normal: still correct
		}
		return sign | uint16(h)
	}
	h := uint32(e)<<10 | mant>>13
	rem := mant & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && h&1 == 1) {
		h++ // a carry into exponent 31 gives exactly Inf
	}
	return sign | uint16(h)
}

// F32FromF16 widens an IEEE binary16 to float32 (exact; a NaN stays NaN
// with its payload, quieted).
func F32FromF16(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f:
		if mant != 0 {
			return math.Float32frombits(sign | 0x7fc00000 | mant<<13)
		}
		return math.Float32frombits(sign | 0x7f800000)
	case exp == 0:
		if mant == 0 {
			return math.Float32frombits(sign)
		}
		// Subnormal: normalise. Value is mant * 2^-24.
		e := uint32(127 - 15 + 1)
		for mant&0x400 == 0 {
			mant <<= 1
			e--
		}
		return math.Float32frombits(sign | e<<23 | (mant&0x3ff)<<13)
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
}

// F16FromBF16 converts bfloat16 to binary16 (one rounding).
func F16FromBF16(h uint16) uint16 { return F16FromF32(F32FromBF16(h)) }

// BF16FromF16 converts binary16 to bfloat16 (one rounding).
func BF16FromF16(h uint16) uint16 { return BF16FromF32(F32FromF16(h)) }

// BF16FromF32s rounds src into dst; len(dst) must equal len(src).
func BF16FromF32s(dst []uint16, src []float32) {
	checkLen(len(dst), len(src))
	for i, f := range src {
		dst[i] = BF16FromF32(f)
	}
}

// F32FromBF16s widens src into dst; len(dst) must equal len(src).
func F32FromBF16s(dst []float32, src []uint16) {
	checkLen(len(dst), len(src))
	for i, h := range src {
		dst[i] = math.Float32frombits(uint32(h) << 16)
	}
}

// F16FromF32s rounds src into dst; len(dst) must equal len(src).
func F16FromF32s(dst []uint16, src []float32) {
	checkLen(len(dst), len(src))
	for i, f := range src {
		dst[i] = F16FromF32(f)
	}
}

// F32FromF16s widens src into dst; len(dst) must equal len(src).
func F32FromF16s(dst []float32, src []uint16) {
	checkLen(len(dst), len(src))
	for i, h := range src {
		dst[i] = F32FromF16(h)
	}
}

func checkLen(d, s int) {
	if d != s {
		panic(fmt.Sprintf("kernels: conversion of %d elements into %d", s, d))
	}
}

// ConvertBytes converts little-endian host data between float dtypes:
// src holds elements of dtype from, dst receives the same number of
// elements of dtype to (len(dst)/to.Size() must equal len(src)/from.Size()).
// Equal dtypes are a plain copy. It panics on a non-float dtype or a size
// mismatch. This is the host-side counterpart of Ops.Cast (checkpoints,
// exports).
func ConvertBytes(dst []byte, to DType, src []byte, from DType) {
	if !to.IsFloat() || !from.IsFloat() {
		panic(fmt.Sprintf("kernels: ConvertBytes from %v to %v: both must be float dtypes", from, to))
	}
	if len(src)%from.Size() != 0 || len(dst)%to.Size() != 0 || len(src)/from.Size() != len(dst)/to.Size() {
		panic(fmt.Sprintf("kernels: ConvertBytes %d bytes of %v into %d bytes of %v", len(src), from, len(dst), to))
	}
	if to == from {
		copy(dst, src)
		return
	}
	n := len(src) / from.Size()
	le := binary.LittleEndian
	for i := 0; i < n; i++ {
		var f float32
		switch from {
		case F32:
			f = math.Float32frombits(le.Uint32(src[4*i:]))
		case BF16:
			f = F32FromBF16(le.Uint16(src[2*i:]))
		case F16:
			f = F32FromF16(le.Uint16(src[2*i:]))
		}
		switch to {
		case F32:
			le.PutUint32(dst[4*i:], math.Float32bits(f))
		case BF16:
			le.PutUint16(dst[2*i:], BF16FromF32(f))
		case F16:
			le.PutUint16(dst[2*i:], F16FromF32(f))
		}
	}
}
