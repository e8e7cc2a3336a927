package cuda

import (
	"fmt"
	"testing"
)

// TestSM90Grid checks sm90Grid's choices at the shapes the benchmarks and
// presets launch (on 132 multiprocessors, the H100's and H200's), worked
// out by hand from its cost model, and its bounds.
func TestSM90Grid(t *testing.T) {
	for _, c := range []struct {
		T, rows, keys, z, sms, perSM int
		want                         int
	}{
		// hs 128, T 1024, B·NH 256 (the attention sweep): 8 query blocks
		// of 2..9 work; one block a head takes all 8 (work 44) in two
		// rounds of the multiprocessors (88), as do 2 (4 × 22) and 4 (8 ×
		// 11): the largest wins (3 is 8 × 12: 96; 8 is 16 × 9: 144).
		{1024, 128, 128, 256, 132, 1, 4},
		// gpt2-124m (hs 64, 64-key tiles, B 16 × NH 12, two blocks per
		// multiprocessor): one block a head leaves 72 slots empty, so X >= 2;
		// 2 blocks a head (work 40 each, 384 blocks, 3 per multiprocessor):
		// 120, as 4 (6 × 20); the largest wins.
		{1024, 128, 64, 192, 132, 2, 4},
		// gpt2-2.7b T 2048 (hs 128, B 4 × NH 20): 80 heads of 16 query
		// blocks; 8 blocks a head (each 19 work: p and 15-p) in 5 rounds:
		// 95, where one block per query block (16) needs 10 rounds of 17.
		{2048, 128, 128, 80, 132, 1, 8},
		// Everything in one wave with one query block each: nothing to gain.
		{1000, 128, 128, 2, 132, 1, 8},
		{200, 128, 128, 4, 132, 1, 2},
		// One multiprocessor: all blocks in turn, so any X whose blocks
		// split a head's work evenly ties with one block a head (2 × 44):
		// 2 (4 × 22) and 4 (8 × 11); 8 is 16 × 9. Two query blocks (3 and
		// 2): one block a head (2 × 5) beats two (4 × 3).
		{1000, 128, 128, 2, 1, 1, 4},
		{200, 128, 128, 2, 1, 1, 1},
		{1, 128, 64, 3, 132, 2, 1},
		// No device figures: one block per query block.
		{1000, 64, 64, 2, 0, 1, 16},
		{0, 128, 128, 2, 132, 1, 1},
	} {
		name := fmt.Sprintf("T%d,rows%d,keys%d,z%d,sms%d,perSM%d", c.T, c.rows, c.keys, c.z, c.sms, c.perSM)
		if got := sm90Grid(c.T, c.rows, c.keys, c.z, c.sms, c.perSM); got != c.want {
			t.Errorf("%s: sm90Grid = %d, want %d", name, got, c.want)
		}
	}
	// Bounds: 1..nq, and never fewer blocks than resident slots when the
	// problem has that many query blocks.
	for _, T := range []int{1, 63, 127, 128, 129, 1000, 2048, 4097, 16384} {
		for _, z := range []int{1, 3, 32, 80, 256, 1024} {
			for _, perSM := range []int{1, 2} {
				nq := (T + 127) / 128
				X := sm90Grid(T, 128, 64, z, 132, perSM)
				if X < 1 || X > nq {
					t.Fatalf("T %d, z %d: sm90Grid = %d, outside 1..%d", T, z, X, nq)
				}
				if X < nq && X*z < 132*perSM {
					t.Errorf("T %d, z %d, perSM %d: sm90Grid = %d leaves slots empty", T, z, perSM, X)
				}
			}
		}
	}
}

// TestSM90GridAllocs checks that choosing the grid allocates nothing (it
// runs per forward launch).
func TestSM90GridAllocs(t *testing.T) {
	if n := testing.AllocsPerRun(100, func() { _ = sm90Grid(8192, 128, 128, 32, 132, 1) }); n != 0 {
		t.Errorf("sm90Grid: %v allocations per call", n)
	}
}

// TestSM90GridMemo checks that the memo gives sm90Grid's choice whatever
// the order of the shapes, and allocates nothing for a repeated one.
func TestSM90GridMemo(t *testing.T) {
	shapes := [][6]int{{1024, 128, 128, 256, 132, 1}, {8192, 128, 64, 32, 132, 2}, {1024, 128, 128, 256, 132, 1},
		{200, 128, 128, 2, 1, 1}, {200, 128, 128, 2, 3, 1}, {16384, 128, 128, 8, 132, 1}}
	for i, c := range append(shapes, shapes...) {
		if got, want := sm90GridMemo(c[0], c[1], c[2], c[3], c[4], c[5]), sm90Grid(c[0], c[1], c[2], c[3], c[4], c[5]); got != want {
			t.Errorf("call %d %v: sm90GridMemo = %d, sm90Grid = %d", i, c, got, want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { _ = sm90GridMemo(16384, 128, 128, 8, 132, 1) }); n != 0 {
		t.Errorf("sm90GridMemo, a repeated shape: %v allocations per call", n)
	}
}
