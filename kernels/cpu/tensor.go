package cpu

import (
	"fmt"
	"math/bits"
	"runtime"
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
		bf16ToF32(s, v.h[lo:hi])
		return s
	default:
		s = s[:hi-lo]
		f16ToF32(s, v.h[lo:hi])
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
		f32ToBF16(v.h[lo:lo+len(s)], s)
	default:
		f32ToF16(v.h[lo:lo+len(s)], s)
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

// Scratch buffers for converted operands are recycled across ops in one
// pool per size class, so that a request is served by a buffer of about its
// own size. (With a single pool any buffer at least as large served any
// request: a logits-sized scratch ended up as some row's buffer on a worker
// while the next logits op allocated a fresh one, and the idle large
// buffers in the pool kept the heap, and RSS, growing step after step.)
//
// The classes are 2^e·(4+j)/4 elements for j = 0..3: a buffer is at most
// 25% larger than its request. Classes of at least largeScratch elements
// are kept on free lists shared by all threads rather than in sync.Pools:
// a sync.Pool keeps a buffer put on one P out of reach of a Get on another
// P (its private slot), so each P could end up holding its own copy of a
// logits-sized buffer; with the shared lists the large buffers retained are
// at most those in use at once. Like a sync.Pool's, the lists are aged at
// every garbage collection: a buffer not taken again during a whole GC
// cycle is dropped (after a change of shapes, say).
const largeScratch = 1 << 18

var (
	scratchPools [4 * 64]sync.Pool
	largeFree    struct {
		sync.Mutex
		lists, victims [len(scratchPools)][][]float32
		cycles         int64 // GC cycles seen (ageLargeScratch calls)
	}
)

func init() { armScratchAging() }

// armScratchAging has ageLargeScratch run after the next garbage
// collection, and again after every one that follows.
func armScratchAging() {
	s := new([16]byte) // not a tiny allocation: its finalizer runs after the GC that frees it
	runtime.SetFinalizer(s, func(*[16]byte) {
		ageLargeScratch()
		armScratchAging()
	})
}

// ageLargeScratch drops the large buffers that stayed unused since the
// previous call and keeps the others one more cycle.
func ageLargeScratch() {
	largeFree.Lock()
	defer largeFree.Unlock()
	for c := range largeFree.lists {
		largeFree.victims[c] = largeFree.lists[c]
		largeFree.lists[c] = nil
	}
	largeFree.cycles++
}

// scratchClass returns the smallest class holding n elements (n >= 1) and
// its size.
func scratchClass(n int) (int, int) {
	if n <= 4 {
		return n - 1, n
	}
	e := bits.Len(uint(n-1)) - 3 // n-1 = 1jj·2^e + rest, e >= 0
	j := (n - 1) >> e            // in [4, 7]
	c := 4*e + j
	return c, (j + 1) << e
}

// scratchClassOf returns the largest class whose size is at most c (c >= 1).
func scratchClassOf(c int) int {
	if c <= 4 {
		return c - 1
	}
	e := bits.Len(uint(c)) - 3
	return 4*e + c>>e - 1
}

func getScratch(n int) []float32 {
	if n <= 0 {
		return nil
	}
	c, size := scratchClass(n)
	if size >= largeScratch {
		largeFree.Lock()
		s := pop(&largeFree.lists[c])
		if s == nil {
			s = pop(&largeFree.victims[c])
		}
		largeFree.Unlock()
		if s != nil {
			return s[:n]
		}
	} else if p, ok := scratchPools[c].Get().(*[]float32); ok {
		return (*p)[:n]
	}
	return make([]float32, n, size)
}

// pop takes the last buffer of a free list (nil if it is empty).
func pop(l *[][]float32) []float32 {
	k := len(*l)
	if k == 0 {
		return nil
	}
	s := (*l)[k-1]
	(*l)[k-1] = nil
	*l = (*l)[:k-1]
	return s
}

func putScratch(s []float32) {
	if cap(s) < 1024 {
		return
	}
	s = s[:cap(s)]
	c := scratchClassOf(cap(s))
	if cap(s) >= largeScratch {
		largeFree.Lock()
		largeFree.lists[c] = append(largeFree.lists[c], s)
		largeFree.Unlock()
		return
	}
	scratchPools[c].Put(&s)
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
