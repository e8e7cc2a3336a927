package offload

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/spill-ml/spill/kernels"
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
func HostAdamW(param []float32, grad []byte, gdt kernels.DType, m, v []float32, out []byte, odt kernels.DType, p kernels.AdamWParams) error {
	n := len(param)
	if len(m) != n || len(v) != n || len(grad) != n*gdt.Size() || (out != nil && len(out) != n*odt.Size()) {
		return fmt.Errorf("offload: host AdamW: %d params with %d grad bytes (%v), %d/%d moments, %d out bytes (%v)",
			n, len(grad), gdt, len(m), len(v), len(out), odt)
	}
	if !gdt.IsFloat() || (out != nil && !odt.IsFloat()) {
		return fmt.Errorf("offload: host AdamW: grad %v and out %v must be float dtypes", gdt, odt)
	}
	if p.Step < 1 {
		return fmt.Errorf("offload: host AdamW: step %d, want >= 1 (1-based)", p.Step)
	}
	gs := p.GradScale
	if gs == 0 {
		gs = 1
	}
	b1, b2 := p.Beta1, p.Beta2
	omb1, omb2 := 1-b1, 1-b2
	ic1 := float32(1 / (1 - math.Pow(float64(b1), float64(p.Step))))
	ic2 := float32(1 / (1 - math.Pow(float64(b2), float64(p.Step))))
	lr, eps, wd := p.LR, p.Eps, p.WeightDecay
	const chunk = 256
	var ga [chunk]float32
	for lo := 0; lo < n; lo += chunk {
		hi := min(lo+chunk, n)
		g := loadF32(grad, gdt, lo, hi, ga[:])
		ps, ms, vs := param[lo:hi], m[lo:hi], v[lo:hi]
		for i := range ps {
			gi := g[i] * gs
			mi := b1*ms[i] + omb1*gi
			vi := b2*vs[i] + omb2*(gi*gi)
			ms[i], vs[i] = mi, vi
			den := float32(math.Sqrt(float64(vi*ic2))) + eps
			upd := (mi*ic1)/den + wd*ps[i]
			ps[i] -= lr * upd
		}
		if out != nil {
			storeF32(out, odt, lo, ps)
		}
	}
	return nil
}

// loadF32 returns elements [lo, hi) of the host array b of dtype dt as
// float32, converting into s when dt is not F32.
func loadF32(b []byte, dt kernels.DType, lo, hi int, s []float32) []float32 {
	switch dt {
	case kernels.F32:
		return F32s(b)[lo:hi]
	case kernels.BF16:
		h := u16s(b)[lo:hi]
		for i, x := range h {
			s[i] = kernels.F32FromBF16(x)
		}
	default:
		h := u16s(b)[lo:hi]
		for i, x := range h {
			s[i] = kernels.F32FromF16(x)
		}
	}
	return s[:hi-lo]
}

// storeF32 rounds s into elements [lo, lo+len(s)) of the host array b.
func storeF32(b []byte, dt kernels.DType, lo int, s []float32) {
	switch dt {
	case kernels.F32:
		copy(F32s(b)[lo:], s)
	case kernels.BF16:
		h := u16s(b)[lo : lo+len(s)]
		for i, x := range s {
			h[i] = kernels.BF16FromF32(x)
		}
	default:
		h := u16s(b)[lo : lo+len(s)]
		for i, x := range s {
			h[i] = kernels.F16FromF32(x)
		}
	}
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
// dtype dt is finite (neither NaN nor ±Inf).
func HostFinite(b []byte, dt kernels.DType) bool {
	if dt == kernels.F32 {
		for _, x := range F32s(b) {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				return false
			}
		}
		return true
	}
	// bf16 and fp16: the exponent field all ones.
	mask := uint16(0x7f80)
	if dt == kernels.F16 {
		mask = 0x7c00
	}
	for _, h := range u16s(b) {
		if h&mask == mask {
			return false
		}
	}
	return true
}
