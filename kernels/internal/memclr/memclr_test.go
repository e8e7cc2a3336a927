package memclr

import (
	"math/rand/v2"
	"testing"
)

// TestClear fills buffers around the chunk boundaries with random bytes
// and checks that Clear leaves every byte zero and touches nothing
// outside b.
func TestClear(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{0, 1, 7, chunk - 1, chunk, 2*chunk + 13, 5*chunk + 1} {
		buf := make([]byte, n+2)
		for i := range buf {
			buf[i] = byte(r.IntN(255) + 1)
		}
		before, after := buf[0], buf[n+1]
		Clear(buf[1 : n+1])
		for i, v := range buf[1 : n+1] {
			if v != 0 {
				t.Fatalf("n=%d: byte %d is %d after Clear", n, i, v)
			}
		}
		if buf[0] != before || buf[n+1] != after {
			t.Fatalf("n=%d: Clear wrote outside its buffer", n)
		}
	}
}

func BenchmarkClear(b *testing.B) {
	buf := make([]byte, 1<<30)
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		Clear(buf)
	}
}

// TestFault checks that Fault writes a zero at every multiple of page
// from b's start, parts and workers included, and nothing else: each page
// is touched once and a zero b stays zero.
func TestFault(t *testing.T) {
	for _, n := range []int{0, 1, page + 1, chunk - 1, 3*chunk + 5*page + 7} {
		buf := make([]byte, n+2)
		for i := range buf {
			buf[i] = 0xa5
		}
		Fault(buf[1 : n+1])
		for i, v := range buf[1 : n+1] {
			want := byte(0xa5)
			if i%page == 0 {
				want = 0
			}
			if v != want {
				t.Fatalf("n=%d: byte %d is %#x after Fault, want %#x", n, i, v, want)
			}
		}
		if buf[0] != 0xa5 || buf[n+1] != 0xa5 {
			t.Fatalf("n=%d: Fault wrote outside its buffer", n)
		}
	}
}
