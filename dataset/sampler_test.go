package dataset

import (
	"slices"
	"strings"
	"testing"
)

func TestSamplerRanksPartitionEpoch(t *testing.T) {
	for _, n := range []int64{1, 10, 11, 17, 100} {
		for _, w := range []int{1, 2, 3, 4, 7} {
			for _, keepTail := range []bool{false, true} {
				for _, mode := range []SamplerOptions{{}, {Shuffle: true}, {Shuffle: true, BlockSamples: 3, WindowBlocks: 2}} {
					for epoch := range int64(3) {
						owner := make(map[int64]int)
						for r := range w {
							so := mode
							so.Seed, so.Rank, so.WorldSize, so.KeepTail = 5, r, w, keepTail
							s, err := NewSampler(n, so)
							if err != nil {
								t.Fatal(err)
							}
							want := n / int64(w)
							if keepTail && int64(r) < n%int64(w) {
								want++
							}
							if s.EpochLen() != want {
								t.Fatalf("n=%d w=%d r=%d keepTail=%v: EpochLen %d, want %d", n, w, r, keepTail, s.EpochLen(), want)
							}
							o := s.Order(epoch)
							for pos := range o.Len() {
								i := o.At(pos)
								if i < 0 || i >= n {
									t.Fatalf("index %d out of range", i)
								}
								if prev, dup := owner[i]; dup {
									t.Fatalf("n=%d w=%d epoch %d: sample %d given to rank %d and rank %d", n, w, epoch, i, prev, r)
								}
								owner[i] = r
							}
						}
						want := n - n%int64(w)
						if keepTail {
							want = n
						}
						if int64(len(owner)) != want {
							t.Fatalf("n=%d w=%d keepTail=%v: %d samples covered, want %d", n, w, keepTail, len(owner), want)
						}
					}
				}
			}
		}
	}
}

func TestSamplerDroppedTailVariesAcrossEpochs(t *testing.T) {
	// n=11 over 4 ranks drops 3 samples per epoch; with shuffling they must
	// not always be the same three.
	const n, w = 11, 4
	dropped := func(epoch int64) map[int64]bool {
		left := make(map[int64]bool)
		for i := range int64(n) {
			left[i] = true
		}
		for r := range w {
			s, err := NewSampler(n, SamplerOptions{Shuffle: true, Seed: 1, Rank: r, WorldSize: w})
			if err != nil {
				t.Fatal(err)
			}
			o := s.Order(epoch)
			for pos := range o.Len() {
				delete(left, o.At(pos))
			}
		}
		if len(left) != n%w {
			t.Fatalf("epoch %d: %d samples dropped, want %d", epoch, len(left), n%w)
		}
		return left
	}
	first := dropped(0)
	for e := int64(1); e < 10; e++ {
		for i := range dropped(e) {
			if !first[i] {
				return
			}
		}
	}
	t.Fatal("the same samples are dropped in 10 epochs")
}

func TestSamplerUnshuffledIsStrided(t *testing.T) {
	s, err := NewSampler(10, SamplerOptions{Rank: 1, WorldSize: 3})
	if err != nil {
		t.Fatal(err)
	}
	o := s.Order(4)
	var got []int64
	for pos := range o.Len() {
		got = append(got, o.At(pos))
	}
	want := []int64{1, 4, 7}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("rank 1 of 3 unshuffled: %v, want %v", got, want)
	}
}

func TestSamplerOptionErrors(t *testing.T) {
	for _, tc := range []struct {
		n    int64
		opts SamplerOptions
		want string
	}{
		{-1, SamplerOptions{}, "negative sample count"},
		{10, SamplerOptions{WorldSize: -2}, "WorldSize -2"},
		{10, SamplerOptions{Rank: 2, WorldSize: 2}, "Rank 2 out of range"},
		{10, SamplerOptions{Rank: -1}, "Rank -1 out of range"},
	} {
		_, err := NewSampler(tc.n, tc.opts)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewSampler(%d, %+v) = %v, want error containing %q", tc.n, tc.opts, err, tc.want)
		}
	}
}

func TestBlockShuffle(t *testing.T) {
	for _, tc := range []struct{ n, k, g int64 }{{1, 1, 1}, {10, 3, 2}, {100, 7, 4}, {1000, 16, 16}, {1001, 10, 3}, {64, 64, 16}} {
		var orders [][]int64
		for epoch := range int64(3) {
			s, err := NewSampler(tc.n, SamplerOptions{Shuffle: true, Seed: 11, BlockSamples: tc.k, WindowBlocks: tc.g})
			if err != nil {
				t.Fatal(err)
			}
			o := s.Order(epoch)
			seen := make([]bool, tc.n)
			var order []int64
			for pos := range o.Len() {
				i := o.At(pos)
				if i < 0 || i >= tc.n || seen[i] {
					t.Fatalf("%+v epoch %d: position %d gives %d: not a permutation", tc, epoch, pos, i)
				}
				seen[i] = true
				order = append(order, i)
			}
			// Locality: each window of g*k positions draws on its g blocks,
			// plus one more for each of the (at most k-1) padding values that
			// cycle walking replaces.
			win := tc.g * tc.k
			pad := (tc.n+tc.k-1)/tc.k*tc.k - tc.n
			for w0 := int64(0); w0 < tc.n; w0 += win {
				blocks := map[int64]bool{}
				for _, i := range order[w0:min(w0+win, tc.n)] {
					blocks[i/tc.k] = true
				}
				if int64(len(blocks)) > tc.g+pad {
					t.Fatalf("%+v: window at %d touches %d blocks, want at most %d", tc, w0, len(blocks), tc.g+pad)
				}
			}
			orders = append(orders, order)
		}
		if tc.n >= 100 && (slices.Equal(orders[0], orders[1]) || slices.Equal(orders[1], orders[2])) {
			t.Fatalf("%+v: epochs repeat their order", tc)
		}
	}
}
