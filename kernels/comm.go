package kernels

import (
	"context"
	"errors"
	"fmt"
)

// Comm is one rank's handle on a communicator: a group of Size ranks, each
// a process (or, on the CPU backend's in-process fake, a goroutine) with
// its own Backend, that run collectives together. It is the interface the
// data-parallel engine is written against; kernels/cuda implements it on
// NCCL, kernels/cpu with real reductions between ranks of one process.
//
// Collectives follow the rules of every method that takes a Queue: they
// only enqueue the work on q (a queue of the rank's own backend) and
// return; errors of the enqueued work are sticky on q and come back from
// its next Synchronize; misuse (mismatched sizes or dtypes, a tensor of
// another backend) panics at enqueue time.
//
// Ordering. Every rank must enqueue the same collectives, with the same
// sizes, dtypes and roots, in the same order (counted over all of its
// queues together); a collective completes only when every rank has
// reached it. A rank that issues them in another order, or never, makes
// the others wait forever on NCCL (the fake reports the mismatch as an
// error instead). Use Queue.Synchronize with a deadline to notice a rank
// that has gone, and Abort to give up.
//
// Operands. The tensors must stay valid until q has passed the collective
// (as for copies). dst and src have the same dtype; they must not overlap
// except in the in-place forms named on each method.
//
// Reductions sum. Floating-point dtypes only (F32, BF16, F16); the order
// of the additions is the implementation's: NCCL's depends on its
// algorithm and rounds 16-bit partial sums on each hop, the CPU fake adds
// in rank order 0, 1, ..., Size-1 in float32 and rounds once. So results
// agree across implementations to rounding, and are bitwise reproducible
// run to run on one implementation and topology. AllGather and Broadcast
// copy bytes and take any dtype.
//
// Uneven sizes. ReduceScatter and AllGather need a length that divides by
// Size; to shard n elements, pad the flat buffer to ShardLen(n, Size)*Size
// elements (the padding is reduced and gathered like the rest and then
// ignored) and give rank r the range ShardRange(n, Size, r).
//
// A Comm is safe for concurrent use by several goroutines, but the order
// of collectives enqueued concurrently is whatever order the calls take,
// which must still match on every rank: in practice one goroutine per rank
// enqueues them.
type Comm interface {
	// Rank is this rank's index, 0 <= Rank < Size.
	Rank() int
	// Size is the number of ranks.
	Size() int

	// AllReduce enqueues dst(N) = Σ_ranks src(N). dst may be src (in place).
	AllReduce(q Queue, dst, src Tensor)
	// ReduceScatter enqueues dst(N) = block Rank of Σ_ranks src(Size*N):
	// rank r receives elements [r*N, (r+1)*N) of the sum. In place when
	// dst is src.Slice(Rank*N, N).
	ReduceScatter(q Queue, dst, src Tensor)
	// AllGather enqueues dst(Size*N) = the src(N) of ranks 0, 1, ...,
	// Size-1 one after the other. In place when src is dst.Slice(Rank*N, N).
	AllGather(q Queue, dst, src Tensor)
	// Broadcast enqueues dst(N) = src(N) of rank root on every rank. src is
	// read only on root (other ranks may pass the zero Tensor); dst may be
	// src on root.
	Broadcast(q Queue, dst, src Tensor, root int)

	// GroupStart and GroupEnd bracket collectives that are to be issued as
	// one group (ncclGroupStart/ncclGroupEnd): NCCL launches them together
	// at GroupEnd, which lets several collectives proceed at once and is
	// required where one rank's collectives could otherwise wait on each
	// other. Every collective between them must be on q (and of this
	// Comm); work other than this Comm's collectives enqueued on q in
	// between may run before the group. Groups do not nest.
	GroupStart(q Queue)
	GroupEnd(q Queue)

	// Abort makes this rank's pending and future collectives fail instead
	// of waiting (ncclCommAbort), so that a rank whose peer has gone can
	// stop. Queues that ran a collective must not be used for more
	// collectives afterwards; Close is still needed.
	Abort() error
	// Close releases the communicator. The caller must ensure that no
	// queue still has a collective of this Comm pending (Synchronize them
	// first, or Abort). Close after Abort, or twice, is allowed.
	Close() error
}

// CommOpener is implemented by backends whose ranks can form a
// communicator. The engine uses it through a type assertion on a Backend:
//
//	id, err := opener.NewCommID()                // on rank 0
//	// ... send id to every rank (engine/internal/dist's rendezvous) ...
//	comm, err := opener.OpenComm(ctx, id, rank, size)
type CommOpener interface {
	// NewCommID returns a fresh identifier of a communicator (NCCL's
	// unique id: opaque bytes, at most MaxCommIDBytes) that rank 0
	// creates and sends to every rank.
	NewCommID() ([]byte, error)
	// OpenComm joins the communicator id as rank (0 <= rank < size). It
	// blocks until all size ranks have joined, ctx is done, or it fails.
	OpenComm(ctx context.Context, id []byte, rank, size int) (Comm, error)
}

// MaxCommIDBytes bounds the length of a communicator id (NCCL's are 128
// bytes), so that a rendezvous can refuse garbage.
const MaxCommIDBytes = 4096

// ErrCommAborted is wrapped by the errors of collectives that fail
// because their communicator was aborted (on this rank or, on the CPU
// fake, on another).
var ErrCommAborted = errors.New("kernels: communicator aborted")

// ShardLen is the number of elements each of size ranks owns when n
// elements are sharded evenly: ceil(n/size). The padded length is
// ShardLen(n, size)*size.
func ShardLen(n, size int) int {
	if n < 0 || size <= 0 {
		panic(fmt.Sprintf("kernels: ShardLen(%d, %d)", n, size))
	}
	return (n + size - 1) / size
}

// ShardRange is the range [lo, hi) of the n real elements that rank owns:
// [rank*L, min((rank+1)*L, n)) with L = ShardLen(n, size). The first ranks
// own L elements each, a later one fewer, the last ones possibly none
// (hi == lo); the padding past n is nobody's.
func ShardRange(n, size, rank int) (lo, hi int) {
	if rank < 0 || rank >= size {
		panic(fmt.Sprintf("kernels: ShardRange rank %d of %d", rank, size))
	}
	l := ShardLen(n, size)
	lo = min(rank*l, n)
	hi = min(lo+l, n)
	return lo, hi
}

// CheckCollective validates the operands of a collective for a
// communicator of size ranks and panics on misuse, with the messages every
// implementation shares: op is "AllReduce", "ReduceScatter", "AllGather"
// or "Broadcast"; rank and root matter for Broadcast only (src may be
// absent on a rank other than root).
func CheckCollective(op string, dst, src Tensor, size, rank, root int) {
	bad := func(format string, args ...any) {
		panic(fmt.Sprintf("kernels: %s: "+format, append([]any{op}, args...)...))
	}
	if dst.IsZero() {
		bad("absent dst")
	}
	if op == "Broadcast" {
		if root < 0 || root >= size {
			bad("root %d of %d ranks", root, size)
		}
		if src.IsZero() {
			if rank == root {
				bad("absent src on the root")
			}
			return
		}
	} else if src.IsZero() {
		bad("absent src")
	}
	if dst.DType != src.DType {
		bad("dst is %v, src %v", dst.DType, src.DType)
	}
	switch op {
	case "AllReduce", "ReduceScatter":
		if !dst.DType.IsFloat() {
			bad("sums need a float dtype, got %v", dst.DType)
		}
	}
	want := src.N
	switch op {
	case "ReduceScatter":
		if src.N != size*dst.N {
			bad("src has %d elements, want %d ranks x dst's %d (pad to ShardLen*Size)", src.N, size, dst.N)
		}
		return
	case "AllGather":
		want = size * src.N
	}
	if dst.N != want {
		bad("dst has %d elements, want %d", dst.N, want)
	}
}
