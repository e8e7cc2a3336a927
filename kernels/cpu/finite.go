package cpu

import (
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/spill-ml/spill/kernels"
)

// finiteChunk is the number of bytes a HostFinite goroutine claims at a
// time; an array of fewer than 2 chunks is scanned by the caller alone.
const finiteChunk = 4 << 20

// HostFinite reports whether every element of the host array b of float
// dtype dt (F32, BF16 or F16) is finite: neither NaN nor ±Inf. It reads b
// eight bytes at a time (a NaN or Inf is an exponent field of all ones,
// found in every lane of a word at once) and, for a large array, on all
// cores: it runs at memory speed. b must be aligned to the element size.
func HostFinite(b []byte, dt kernels.DType) bool {
	// The exponent masks of a word's lanes; a lane equal to its mask is
	// not finite. With the sign bit cleared each lane is below its top
	// bit, so (lane^mask) - 1 sets the top bit only when the lane equals
	// the mask (or a lower lane borrowed: only above a lane that did).
	var mask, one, top uint64
	switch dt {
	case kernels.F32:
		mask, one, top = 0x7f800000_7f800000, 0x00000001_00000001, 0x80000000_80000000
	case kernels.F16:
		mask, one, top = 0x7c00_7c00_7c00_7c00, 0x0001_0001_0001_0001, 0x8000_8000_8000_8000
	default:
		mask, one, top = 0x7f80_7f80_7f80_7f80, 0x0001_0001_0001_0001, 0x8000_8000_8000_8000
	}
	scan := func(p []byte) bool {
		n := len(p) / 8
		var bad uint64
		if n > 0 {
			w := unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(p))), n)
			for i := 0; i+4 <= n; i += 4 {
				bad |= ((w[i] & mask) ^ mask - one) | ((w[i+1] & mask) ^ mask - one) |
					((w[i+2] & mask) ^ mask - one) | ((w[i+3] & mask) ^ mask - one)
				bad &= top
				if bad != 0 {
					return false
				}
			}
			for i := n &^ 3; i < n; i++ {
				bad |= ((w[i] & mask) ^ mask) - one
			}
			if bad&top != 0 {
				return false
			}
		}
		// The tail of fewer than 8 bytes, one element at a time.
		for i := n * 8; i+dt.Size() <= len(p); i += dt.Size() {
			var x, m uint64
			if dt == kernels.F32 {
				x, m = uint64(*(*uint32)(unsafe.Pointer(&p[i]))), mask&0xffffffff
			} else {
				x, m = uint64(*(*uint16)(unsafe.Pointer(&p[i]))), mask&0xffff
			}
			if x&m == m {
				return false
			}
		}
		return true
	}
	if len(b) < 2*finiteChunk || runtime.GOMAXPROCS(0) == 1 {
		return scan(b)
	}
	chunks := int64((len(b) + finiteChunk - 1) / finiteChunk)
	var next atomic.Int64
	var bad atomic.Bool
	work := func() {
		for !bad.Load() {
			k := next.Add(1) - 1
			if k >= chunks {
				return
			}
			lo := int(k) * finiteChunk
			if !scan(b[lo:min(lo+finiteChunk, len(b))]) {
				bad.Store(true)
			}
			runtime.Gosched() // as HostAdamW's workers
		}
	}
	var wg sync.WaitGroup
	for range min(int64(hostHelpers(runtime.GOMAXPROCS(0))), chunks-1) {
		wg.Go(work)
	}
	work()
	wg.Wait()
	return !bad.Load()
}
