package cpu

import (
	"fmt"
	"math"
	"sync"
	"unsafe"

	"github.com/spill-ml/spill/kernels"
)

// view is a float tensor resolved for the kernels: f for F32, h for BF16
// and F16. It is built at enqueue time, so bad operands panic there.
type view struct {
	dt kernels.DType
	n  int
	f  []float32
	h  []uint16
}

// fview resolves t as a float operand of at least n elements (the first n
// are used).
func fview(op, name string, t kernels.Tensor, n int) view {
	if t.IsZero() {
		panic(fmt.Sprintf("kernels/cpu: %s: %s is absent", op, name))
	}
	if !t.DType.IsFloat() {
		panic(fmt.Sprintf("kernels/cpu: %s: %s has dtype %v, want f32, bf16 or f16", op, name, t.DType))
	}
	if t.N < n {
		panic(fmt.Sprintf("kernels/cpu: %s: %s has %d elements, needs %d", op, name, t.N, n))
	}
	t.N = n
	v := view{dt: t.DType, n: n}
	if t.DType == kernels.F32 {
		v.f = f32s(t)
	} else {
		v.h = u16s(t)
	}
	return v
}

// optview is fview for an optional operand: ok is false for the zero Tensor.
func optview(op, name string, t kernels.Tensor, n int) (v view, ok bool) {
	if t.IsZero() {
		return view{}, false
	}
	return fview(op, name, t, n), true
}

// f32view resolves t as an F32-only operand of at least n elements.
func f32view(op, name string, t kernels.Tensor, n int) []float32 {
	if t.IsZero() {
		panic(fmt.Sprintf("kernels/cpu: %s: %s is absent", op, name))
	}
	if t.DType != kernels.F32 {
		panic(fmt.Sprintf("kernels/cpu: %s: %s has dtype %v, want f32", op, name, t.DType))
	}
	if t.N < n {
		panic(fmt.Sprintf("kernels/cpu: %s: %s has %d elements, needs %d", op, name, t.N, n))
	}
	t.N = n
	return f32s(t)
}

// i32view resolves t as an I32 operand of at least n elements.
func i32view(op, name string, t kernels.Tensor, n int) []int32 {
	if t.IsZero() || t.DType != kernels.I32 {
		panic(fmt.Sprintf("kernels/cpu: %s: %s must be an i32 tensor (got %v)", op, name, t.DType))
	}
	if t.N < n {
		panic(fmt.Sprintf("kernels/cpu: %s: %s has %d elements, needs %d", op, name, t.N, n))
	}
	t.N = n
	return i32s(t)
}

func dims(op string, ds ...int) {
	for _, d := range ds {
		if d <= 0 {
			panic(fmt.Sprintf("kernels/cpu: %s: dimensions %v must be positive", op, ds))
		}
	}
}

// load returns elements [lo, hi) as float32: the tensor's own memory for
// F32, else converted into s (len(s) >= hi-lo).
func (v view) load(lo, hi int, s []float32) []float32 {
	switch v.dt {
	case kernels.F32:
		return v.f[lo:hi:hi]
	case kernels.BF16:
		s = s[:hi-lo]
		for i, h := range v.h[lo:hi] {
			s[i] = math.Float32frombits(uint32(h) << 16)
		}
		return s
	default:
		s = s[:hi-lo]
		for i, h := range v.h[lo:hi] {
			s[i] = kernels.F32FromF16(h)
		}
		return s
	}
}

// store rounds s into elements [lo, lo+len(s)). For F32 it is a no-op
// when s is the tensor's own memory (as returned by load).
func (v view) store(lo int, s []float32) {
	if len(s) == 0 {
		return
	}
	switch v.dt {
	case kernels.F32:
		d := v.f[lo : lo+len(s)]
		if unsafe.SliceData(d) != unsafe.SliceData(s) {
			copy(d, s)
		}
	case kernels.BF16:
		d := v.h[lo : lo+len(s)]
		for i, x := range s {
			d[i] = kernels.BF16FromF32(x)
		}
	default:
		d := v.h[lo : lo+len(s)]
		for i, x := range s {
			d[i] = kernels.F16FromF32(x)
		}
	}
}

func (v view) at(i int) float32 {
	switch v.dt {
	case kernels.F32:
		return v.f[i]
	case kernels.BF16:
		return kernels.F32FromBF16(v.h[i])
	default:
		return kernels.F32FromF16(v.h[i])
	}
}

func (v view) set(i int, x float32) {
	switch v.dt {
	case kernels.F32:
		v.f[i] = x
	case kernels.BF16:
		v.h[i] = kernels.BF16FromF32(x)
	default:
		v.h[i] = kernels.F16FromF32(x)
	}
}

// scratch buffers for converted operands, recycled across ops.
var scratchPool sync.Pool

func getScratch(n int) []float32 {
	if p, ok := scratchPool.Get().(*[]float32); ok && cap(*p) >= n {
		s := (*p)[:n]
		return s
	}
	return make([]float32, n)
}

func putScratch(s []float32) {
	if cap(s) >= 1024 {
		scratchPool.Put(&s)
	}
}

// input returns the whole of v as float32 (no copy for F32) and a release
// function.
func (b *Backend) input(v view) ([]float32, func()) {
	if v.dt == kernels.F32 {
		return v.f, func() {}
	}
	s := getScratch(v.n)
	b.pool.parallel(v.n, 1<<14, func(lo, hi int) { v.load(lo, hi, s[lo:hi]) })
	return s, func() { putScratch(s) }
}

// output returns a float32 array standing for the whole of v and a commit
// function that rounds it back into v (once). With accumulate, the array
// starts with v's values, else its contents are undefined.
func (b *Backend) output(v view, accumulate bool) ([]float32, func()) {
	if v.dt == kernels.F32 {
		return v.f, func() {}
	}
	s := getScratch(v.n)
	if accumulate {
		b.pool.parallel(v.n, 1<<14, func(lo, hi int) { v.load(lo, hi, s[lo:hi]) })
	}
	return s, func() {
		b.pool.parallel(v.n, 1<<14, func(lo, hi int) { v.store(lo, s[lo:hi]) })
		putScratch(s)
	}
}
