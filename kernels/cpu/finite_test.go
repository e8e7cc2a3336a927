package cpu

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/spill-ml/spill/kernels"
)

// finiteRef is HostFinite one element at a time.
func finiteRef(b []byte, dt kernels.DType) bool {
	for i := 0; i+dt.Size() <= len(b); i += dt.Size() {
		switch dt {
		case kernels.F32:
			if binary.LittleEndian.Uint32(b[i:])&0x7f800000 == 0x7f800000 {
				return false
			}
		case kernels.F16:
			if binary.LittleEndian.Uint16(b[i:])&0x7c00 == 0x7c00 {
				return false
			}
		default:
			if binary.LittleEndian.Uint16(b[i:])&0x7f80 == 0x7f80 {
				return false
			}
		}
	}
	return true
}

// TestHostFinite plants one NaN or Inf (or none) in arrays of random
// finite values, of lengths around the word, the unrolled loop and the
// parallel chunk, at the edges and at random places: the word-wide scan
// must agree with the element-wise one. The finite values include the
// largest finite ones of each dtype, whose exponent is one short of all ones.
func TestHostFinite(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	type spec struct {
		dt            kernels.DType
		exp, top, bad uint64 // exponent mask, largest finite, a NaN/Inf
	}
	for _, s := range []spec{
		{kernels.F32, 0x7f800000, 0x7f7fffff, 0x7f800000},
		{kernels.BF16, 0x7f80, 0x7f7f, 0x7fc0},
		{kernels.F16, 0x7c00, 0x7bff, 0xfc00},
	} {
		es := s.dt.Size()
		for _, n := range []int{0, 1, 3, 4, 5, 7, 16, 33, 1000, 2*finiteChunk/es + 3, 3*finiteChunk/es - 1} {
			b := make([]byte, n*es)
			put := func(i int, x uint64) {
				if es == 4 {
					binary.LittleEndian.PutUint32(b[i*es:], uint32(x))
				} else {
					binary.LittleEndian.PutUint16(b[i*es:], uint16(x))
				}
			}
			fill := func() {
				for i := range n {
					x := r.Uint64() &^ s.exp // exponent never all ones
					if r.IntN(4) == 0 {
						x = s.top | uint64(r.IntN(2))<<(8*es-1) // ±largest finite
					}
					put(i, x)
				}
			}
			at := []int{-1}
			if n > 0 {
				at = append(at, 0, n-1, n/2, r.IntN(n))
				if c := finiteChunk / es; n > c {
					at = append(at, c-1, c)
				}
			}
			for _, i := range at {
				fill()
				if i >= 0 {
					bad := s.bad | uint64(r.IntN(2))<<(8*es-1)
					put(i, bad)
				}
				want := finiteRef(b, s.dt)
				if want != (i < 0) {
					t.Fatalf("%v: reference says %v with the bad value at %d", s.dt, want, i)
				}
				if got := HostFinite(b, s.dt); got != want {
					t.Errorf("%v, %d elements, non-finite at %d: HostFinite = %v, want %v", s.dt, n, i, got, want)
				}
			}
		}
	}
}

func BenchmarkHostFinite(b *testing.B) {
	buf := make([]byte, 256<<20)
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		if !HostFinite(buf, kernels.BF16) {
			b.Fatal("zeros are finite")
		}
	}
}
