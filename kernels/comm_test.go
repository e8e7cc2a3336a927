package kernels

import "testing"

func TestShardRangeCoversOnce(t *testing.T) {
	for n := range 40 {
		for size := 1; size <= 9; size++ {
			l := ShardLen(n, size)
			if l*size < n || (l-1)*size >= n && n > 0 {
				t.Fatalf("ShardLen(%d, %d) = %d: not the least padding", n, size, l)
			}
			next := 0
			for r := range size {
				lo, hi := ShardRange(n, size, r)
				if lo != next || hi < lo || hi-lo > l {
					t.Fatalf("n=%d size=%d: rank %d owns [%d, %d), want it to start at %d with at most %d", n, size, r, lo, hi, next, l)
				}
				if hi-lo < l && hi != n {
					t.Fatalf("n=%d size=%d: rank %d owns %d < %d before the end", n, size, r, hi-lo, l)
				}
				next = hi
			}
			if next != n {
				t.Fatalf("n=%d size=%d: ranks cover [0, %d)", n, size, next)
			}
		}
	}
	if lo, hi := ShardRange(10, 4, 3); lo != 9 || hi != 10 {
		t.Fatalf("ShardRange(10, 4, 3) = [%d, %d), want [9, 10)", lo, hi)
	}
	if lo, hi := ShardRange(2, 4, 3); lo != 2 || hi != 2 {
		t.Fatalf("ShardRange(2, 4, 3) = [%d, %d), want the empty [2, 2)", lo, hi)
	}
}
