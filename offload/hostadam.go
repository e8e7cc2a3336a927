package offload

import (
	"fmt"
	"unsafe"

	"github.com/spill-ml/spill/kernels"
	"github.com/spill-ml/spill/kernels/cpu"
)

// HostAdamW is the host optimizer: one AdamW step on layer state held in
// host memory, for placements whose optimizer state lives on the host or
// on disk (ZeRO-Offload's CPU Adam).
//
// It implements the contract of kernels.Ops.AdamW with the same arithmetic,
// operation for operation and rounding for rounding, as the CPU backend's
// kernel (kernels/cpu): the gradient (dtype gdt, converted exactly to
// float32) is multiplied by GradScale, the moments and the parameter are
// updated in float32, and the updated parameter is rounded to nearest even
// into out (dtype odt) when out is not nil. So a run whose optimizer runs
// here is bitwise identical to one whose optimizer runs on the CPU
// backend's device. param, m and v have the same length n; grad holds n
// elements of gdt and out, if not nil, n elements of odt.
//
// The arithmetic is the CPU backend's own (cpu.HostAdamW runs the kernel's
// code): vectorised, and parallel over GOMAXPROCS goroutines for a large
// layer.
func HostAdamW(param []float32, grad []byte, gdt kernels.DType, m, v []float32, out []byte, odt kernels.DType, p kernels.AdamWParams) error {
	if err := cpu.HostAdamW(param, grad, gdt, m, v, out, odt, p); err != nil {
		return fmt.Errorf("offload: %w", err)
	}
	return nil
}

// HostAdamWFrom is HostAdamW out of place: the step reads the master
// weights and moments from p0, m0 and v0, which it leaves unchanged, and
// writes the updated ones to param, m and v, with HostAdamW's bits. An
// out-of-core trainer runs it to update a layer ahead of knowing whether
// the step's gradients will be clipped, and drops the result when they
// are.
func HostAdamWFrom(param, m, v, p0, m0, v0 []float32, grad []byte, gdt kernels.DType, out []byte, odt kernels.DType, p kernels.AdamWParams) error {
	if err := cpu.HostAdamWFrom(param, m, v, p0, m0, v0, grad, gdt, out, odt, p); err != nil {
		return fmt.Errorf("offload: %w", err)
	}
	return nil
}

// F32s views host bytes (4-byte aligned, as every host buffer of this
// package and of NewF32Bytes is) as float32s.
func F32s(b []byte) []float32 {
	if len(b) == 0 {
		return nil
	}
	if uintptr(unsafe.Pointer(&b[0]))%4 != 0 {
		panic("offload: float32 view of unaligned host bytes")
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4)
}

func u16s(b []byte) []uint16 {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*uint16)(unsafe.Pointer(&b[0])), len(b)/2)
}

// NewF32Bytes returns n zeroed bytes of host memory, 8-byte aligned, so
// that F32s can view them.
func NewF32Bytes(n int64) []byte {
	w := make([]uint64, (n+7)/8)
	if len(w) == 0 {
		return []byte{}
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&w[0])), n)
}

// HostFinite reports whether every element of the host array b of float
// dtype dt is finite (neither NaN nor ±Inf), at memory speed on all cores
// (cpu.HostFinite).
func HostFinite(b []byte, dt kernels.DType) bool { return cpu.HostFinite(b, dt) }
