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
