package cuda

import "sync/atomic"

// sm90Grid is gridDim.x for a pipelined Hopper forward (flash_fwd_sm90p of
// kernels/flashattn_sm90.cu), whose blocks may each take several query
// blocks of their head in turn: T query rows in blocks of rows, key tiles
// of bk, z heads (gridDim.y), on a device of sms multiprocessors that
// keep perSM such blocks resident each. It is the X in 1..nq (nq =
// ceil(T/rows): one query block per block, as the kernels were launched
// before they could take more) of least estimated time, among those that
// give every resident slot a block (X·z >= sms·perSM; nq when none does):
// ceil(X·z/sms), the blocks of the busiest multiprocessor, times the work
// of X's busiest block, counted in key tiles plus one per query block (its
// first and last steps and its output). Block x of X takes, in round r,
// the query block at position r·X+x (r even) or r·X+X-1-x (r odd) of the
// query blocks sorted longest first, as the kernel does. Ties go to the
// larger X: more of a head's query blocks run at once, which should let
// them share its K and V in L2 (not measured). On the H100 at head size
// 128, T 1024, B·NH 256, the three tied X of 1, 2 and 4 took 0.288, 0.251
// and 0.243 ms; tools/bench/results/attn_persist_h100.json has the sweep
// over X that this rule fits at all eight shapes timed. The model
// overrates one query block a block (X = nq), whose short blocks the
// hardware packs as they finish. sms <= 0 gives nq. No allocation; O(nq²)
// steps.
func sm90Grid(T, rows, bk, z, sms, perSM int) int {
	if T <= 0 || rows <= 0 || bk <= 0 {
		return 1
	}
	nq := (T + rows - 1) / rows
	if sms <= 0 || z <= 0 {
		return nq
	}
	// work is the cost of the query block at position p (sorted longest
	// first): its key tiles, plus one.
	work := func(p int) int {
		q := (nq - 1 - p) * rows
		return (min(q+rows, T)-1)/bk + 2
	}
	best, bestCost := nq, -1
	for X := 1; X <= nq; X++ {
		if X < nq && X*z < sms*max(perSM, 1) {
			continue
		}
		busiest := 0
		for x := 0; x < X; x++ {
			w := 0
			for r := 0; ; r++ {
				p := r*X + x
				if r&1 == 1 {
					p = r*X + X - 1 - x
				}
				if p >= nq {
					break
				}
				w += work(p)
			}
			busiest = max(busiest, w)
		}
		cost := (X*z + sms - 1) / sms * busiest
		if bestCost < 0 || cost <= bestCost {
			best, bestCost = X, cost
		}
	}
	return best
}

// sm90GridKey is what sm90Grid's choice depends on.
type sm90GridKey struct{ T, rows, bk, z, sms, perSM int }

// sm90GridChoice is sm90Grid's choice x for arguments k.
type sm90GridChoice struct {
	k sm90GridKey
	x int
}

// sm90GridLast is a one-entry memo of sm90Grid: a training step launches
// the forward at one shape per layer, so the last choice is almost always
// the next one's.
var sm90GridLast atomic.Pointer[sm90GridChoice]

// sm90GridMemo is sm90Grid through sm90GridLast: O(1), no allocation, when
// the arguments are the last call's (O(nq²) and one small allocation when
// not). Safe for concurrent use.
func sm90GridMemo(T, rows, bk, z, sms, perSM int) int {
	k := sm90GridKey{T, rows, bk, z, sms, perSM}
	if m := sm90GridLast.Load(); m != nil && m.k == k {
		return m.x
	}
	x := sm90Grid(T, rows, bk, z, sms, perSM)
	sm90GridLast.Store(&sm90GridChoice{k, x})
	return x
}
