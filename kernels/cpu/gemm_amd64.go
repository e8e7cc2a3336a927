//go:build amd64 && !purego

package cpu

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

var useAVX2 = cpu.X86.HasAVX2 && cpu.X86.HasFMA

// kern6x16 is the AVX2/FMA micro-kernel (gemm_amd64.s), same contract as
// kernelGo for a full tile.
//
//go:noescape
func kern6x16(k int, a, b, c *float32, ldc int)

func kernel(k int, a, b, c []float32, ldc int) {
	if useAVX2 && k > 0 {
		_ = a[k*mr-1]
		_ = b[k*nr-1]
		_ = c[(mr-1)*ldc+nr-1]
		kern6x16(k, unsafe.SliceData(a), unsafe.SliceData(b), unsafe.SliceData(c), ldc)
		return
	}
	kernelGo(k, a, b, c, ldc)
}
