package dataset

import (
	"math"
	"testing"
)

// checkPermutation fails unless p maps [0, n) onto [0, n) one to one.
func checkPermutation(t *testing.T, p Permutation, n uint64) {
	t.Helper()
	if p.Len() != n {
		t.Fatalf("Len = %d, want %d", p.Len(), n)
	}
	seen := make([]bool, n)
	for i := range n {
		v := p.At(i)
		if v >= n {
			t.Fatalf("n=%d: At(%d) = %d out of range", n, i, v)
		}
		if seen[v] {
			t.Fatalf("n=%d: value %d produced twice (second time at %d)", n, v, i)
		}
		seen[v] = true
	}
}

func TestPermutationIsBijection(t *testing.T) {
	sizes := []uint64{1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 100, 255, 256, 257, 1000, 4097, 65535, 65537}
	for _, n := range sizes {
		for _, seed := range []uint64{0, 1, 0xdeadbeef} {
			for _, epoch := range []int64{0, 1, 99} {
				checkPermutation(t, NewPermutation(n, seed, epoch), n)
			}
		}
		checkPermutation(t, IdentityPermutation(n), n)
	}
}

func TestPermutationLargeDomain(t *testing.T) {
	// A huge n must not need memory or long walks: spot-check range and
	// determinism, and that nearby positions are scattered.
	const n = 1<<40 + 3
	p := NewPermutation(n, 7, 3)
	q := NewPermutation(n, 7, 3)
	var prev uint64
	var adjacent int
	for i := uint64(0); i < 2000; i++ {
		v := p.At(i)
		if v >= n {
			t.Fatalf("At(%d) = %d out of range", i, v)
		}
		if v != q.At(i) {
			t.Fatalf("At(%d) not deterministic", i)
		}
		if i > 0 && (v == prev+1 || prev == v+1) {
			adjacent++
		}
		prev = v
	}
	if adjacent > 5 {
		t.Fatalf("%d of 2000 consecutive positions map to adjacent values: not shuffled", adjacent)
	}
}

func TestPermutationDeterministicAndKeyed(t *testing.T) {
	const n = 1000
	order := func(seed uint64, epoch int64) []uint64 {
		p := NewPermutation(n, seed, epoch)
		out := make([]uint64, n)
		for i := range out {
			out[i] = p.At(uint64(i))
		}
		return out
	}
	same := func(a, b []uint64) int {
		k := 0
		for i := range a {
			if a[i] == b[i] {
				k++
			}
		}
		return k
	}
	a := order(42, 0)
	if got := same(a, order(42, 0)); got != n {
		t.Fatalf("same seed and epoch: only %d of %d positions agree", got, n)
	}
	// Unrelated permutations agree on about one position on average.
	for _, other := range [][]uint64{order(42, 1), order(43, 0), order(0, 0)} {
		if got := same(a, other); got > 10 {
			t.Fatalf("different key: %d of %d positions agree, want about 1", got, n)
		}
	}
	identity := 0
	for i, v := range a {
		if uint64(i) == v {
			identity++
		}
	}
	if identity > 10 {
		t.Fatalf("%d fixed points, want about 1", identity)
	}
}

func TestPermutationUniform(t *testing.T) {
	// Over many keys, position i should hold value j about equally often
	// for every (i, j). A chi-square statistic over the n*n cells checks it;
	// the keys are fixed, so the test is deterministic.
	const n, trials = 8, 8000
	var counts [n][n]float64
	for k := range trials {
		p := NewPermutation(n, uint64(k), 0)
		for i := range uint64(n) {
			counts[i][p.At(i)]++
		}
	}
	exp := float64(trials) / n
	chi := 0.0
	for i := range n {
		for j := range n {
			d := counts[i][j] - exp
			chi += d * d / exp
		}
	}
	// (n-1)^2 = 49 degrees of freedom: mean 49, sd about 10. 100 is far out
	// in the tail for a good shuffle and far below what a biased one gives.
	if chi > 100 || math.IsNaN(chi) {
		t.Fatalf("chi-square %.1f over %d cells: positions are not uniformly distributed: %v", chi, n*n, counts)
	}
}

func TestPermutationAtPanicsOutOfRange(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("At(n) did not panic")
		}
	}()
	NewPermutation(5, 1, 1).At(5)
}
