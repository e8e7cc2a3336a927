//go:build !amd64 || purego

package cpu

func bf16ToF32(dst []float32, src []uint16) { bf16ToF32Go(dst, src) }
func f16ToF32(dst []float32, src []uint16)  { f16ToF32Go(dst, src) }
func f32ToBF16(dst []uint16, src []float32) { f32ToBF16Go(dst, src) }
func f32ToF16(dst []uint16, src []float32)  { f32ToF16Go(dst, src) }
