package cpu

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"strconv"
	"sync"

	"github.com/spill-ml/spill/kernels"
)

// The CPU backend's communicator (kernels.CommOpener, kernels.Comm) joins
// ranks of one process: goroutines, each with its own Backend, that met
// through an id from NewCommID. It does real reductions, so that the
// data-parallel engine can be tested without GPUs, and it is
// deterministic: a sum adds the ranks' contributions in rank order
// 0, 1, ..., Size-1 in float32 (x0 + x1 + ... exactly as a sequential
// loop would) and rounds once into the dtype, whatever order the ranks
// arrive in.
//
// Each collective is a round. The collectives a rank enqueues are numbered
// in enqueue order; when rank r's queue reaches round k, it hands in its
// source (a view of its buffer) and waits. The rank that completes the
// round checks that every rank issued the same collective (op, dtype,
// count, root), computes the whole result into a buffer of its own, and
// releases the others, which copy their part out. Computing the result
// before anyone writes makes every in-place form safe. A round that
// cannot complete (a mismatch, a rank that closed, Abort) fails on every
// rank's queue with an error instead of hanging; a rank that never
// enqueues the collective still leaves the others waiting, as on NCCL.

var _ kernels.CommOpener = (*Backend)(nil)

// commIDPrefix starts every id; the process id follows, so that an id
// carried to another process (spill train --nproc-per-node with the cpu
// backend) fails with a clear error instead of waiting.
const commIDPrefix = "spill-cpu-comm/"

// commRegistry holds the communicators that some but not all ranks have
// joined, by id.
var commRegistry struct {
	sync.Mutex
	pending map[string]*world
}

// NewCommID returns a fresh communicator id, valid in this process only.
func (b *Backend) NewCommID() ([]byte, error) {
	var nonce [16]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return nil, fmt.Errorf("kernels/cpu: communicator id: %w", err)
	}
	return fmt.Appendf(nil, "%s%d/%x", commIDPrefix, os.Getpid(), nonce), nil
}

// OpenComm joins the communicator id as rank of size, with b as the rank's
// device, and waits until all size ranks have joined (or ctx is done).
func (b *Backend) OpenComm(ctx context.Context, id []byte, rank, size int) (kernels.Comm, error) {
	if size < 1 || rank < 0 || rank >= size {
		return nil, fmt.Errorf("kernels/cpu: OpenComm: rank %d of %d ranks is out of range", rank, size)
	}
	rest, ok := bytes.CutPrefix(id, []byte(commIDPrefix))
	pid, _, _ := bytes.Cut(rest, []byte("/"))
	if !ok {
		return nil, fmt.Errorf("kernels/cpu: OpenComm: %q is not an id from the cpu backend's NewCommID", id)
	}
	if p, err := strconv.Atoi(string(pid)); err != nil || p != os.Getpid() {
		return nil, fmt.Errorf("kernels/cpu: OpenComm: the id comes from process %s, this is process %d: "+
			"the cpu backend's communicator joins ranks of one process only (use --device cuda for several processes)", pid, os.Getpid())
	}
	key := string(id)
	c := &comm{b: b, rank: rank}

	commRegistry.Lock()
	if commRegistry.pending == nil {
		commRegistry.pending = map[string]*world{}
	}
	w := commRegistry.pending[key]
	if w == nil {
		w = newWorld(size)
		commRegistry.pending[key] = w
	}
	var err error
	switch {
	case w.size != size:
		err = fmt.Errorf("kernels/cpu: OpenComm: rank %d expects %d ranks, but the ranks already there expect %d", rank, size, w.size)
	case w.members[rank] != nil:
		err = fmt.Errorf("kernels/cpu: OpenComm: rank %d of %d joined twice", rank, size)
	default:
		c.w = w
		w.members[rank] = c
		if w.joined++; w.joined == size {
			delete(commRegistry.pending, key)
			close(w.full)
		}
	}
	commRegistry.Unlock()
	if err != nil {
		return nil, err
	}

	select {
	case <-w.full:
		return c, nil
	case <-ctx.Done():
	}
	commRegistry.Lock()
	defer commRegistry.Unlock()
	select {
	case <-w.full: // completed meanwhile: the other ranks count on this one
		return c, nil
	default:
	}
	w.members[rank] = nil
	if w.joined--; w.joined == 0 {
		delete(commRegistry.pending, key)
	}
	return nil, fmt.Errorf("kernels/cpu: OpenComm: rank %d waiting for the other ranks (%d of %d joined): %w", rank, w.joined+1, size, ctx.Err())
}

// world is what the ranks of one communicator share.
type world struct {
	size    int
	members []*comm       // by rank; set under commRegistry's lock until full
	joined  int           // under commRegistry's lock
	full    chan struct{} // closed when every rank has joined

	abortOnce sync.Once
	aborted   chan struct{} // closed by Abort
	abortErr  error         // set before aborted is closed

	mu struct {
		sync.Mutex
		rounds map[int64]*round
		closed []bool // by rank: Close was called
	}
}

func newWorld(size int) *world {
	w := &world{size: size, members: make([]*comm, size), full: make(chan struct{}), aborted: make(chan struct{})}
	w.mu.rounds = map[int64]*round{}
	w.mu.closed = make([]bool, size)
	return w
}

// collective describes one rank's call; every rank of a round must make
// the same one.
type collective struct {
	op    string // "AllReduce", "ReduceScatter", "AllGather", "Broadcast"
	dtype kernels.DType
	n     int // the per-rank count NCCL takes: dst.N, except src.N for AllGather
	root  int // Broadcast only
}

func (c collective) String() string {
	s := fmt.Sprintf("%s of %d %v", c.op, c.n, c.dtype)
	if c.op == "Broadcast" {
		s += fmt.Sprintf(" from rank %d", c.root)
	}
	return s
}

// round is one collective in progress.
type round struct {
	calls   []collective // by rank, valid where arrived
	src     [][]byte     // by rank: the source views handed in
	arrived []bool
	count   int // ranks arrived
	left    int // ranks that have not yet taken their result

	done   chan struct{} // closed when result or err is final
	final  bool          // done is closed (under world.mu)
	result []byte
	err    error
}

// comm is one rank's kernels.Comm.
type comm struct {
	b    *Backend
	w    *world
	rank int

	mu struct {
		sync.Mutex
		seq    int64  // the next collective's round number
		group  *queue // queue of the open group, or nil
		closed bool
	}
}

var _ kernels.Comm = (*comm)(nil)

func (c *comm) Rank() int { return c.rank }
func (c *comm) Size() int { return c.w.size }

func (c *comm) AllReduce(q kernels.Queue, dst, src kernels.Tensor) {
	c.enqueue(q, collective{op: "AllReduce", dtype: dst.DType, n: dst.N}, dst, src)
}

func (c *comm) ReduceScatter(q kernels.Queue, dst, src kernels.Tensor) {
	c.enqueue(q, collective{op: "ReduceScatter", dtype: dst.DType, n: dst.N}, dst, src)
}

func (c *comm) AllGather(q kernels.Queue, dst, src kernels.Tensor) {
	c.enqueue(q, collective{op: "AllGather", dtype: dst.DType, n: src.N}, dst, src)
}

func (c *comm) Broadcast(q kernels.Queue, dst, src kernels.Tensor, root int) {
	c.enqueue(q, collective{op: "Broadcast", dtype: dst.DType, n: dst.N, root: root}, dst, src)
}

// operand returns the bytes of t, which must be this rank's backend's.
func (c *comm) operand(op, name string, t kernels.Tensor) []byte {
	if t.IsZero() {
		return nil
	}
	if buf, ok := t.Buf.(*buffer); ok && buf.owner != c.b.alloc {
		panic(fmt.Sprintf("kernels/cpu: %s: %s is a buffer of another backend than rank %d's", op, name, c.rank))
	}
	return bytesOf(t)
}

func (c *comm) enqueue(kq kernels.Queue, call collective, dst, src kernels.Tensor) {
	kernels.CheckCollective(call.op, dst, src, c.w.size, c.rank, call.root)
	q := c.b.queue(kq)
	d, s := c.operand(call.op, "dst", dst), c.operand(call.op, "src", src)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mu.closed {
		panic(fmt.Sprintf("kernels/cpu: %s on a closed communicator (rank %d)", call.op, c.rank))
	}
	if c.mu.group != nil && c.mu.group != q {
		panic(fmt.Sprintf("kernels/cpu: %s on queue %s inside a group opened on queue %s", call.op, q.name, c.mu.group.name))
	}
	seq := c.mu.seq
	c.mu.seq++
	// Pushed under c.mu, so that a queue's rounds are in number order
	// even when goroutines enqueue concurrently.
	q.enqueue(call.op, func() error { return c.run(seq, call, d, s) })
}

func (c *comm) GroupStart(kq kernels.Queue) {
	q := c.b.queue(kq)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mu.group != nil {
		panic(fmt.Sprintf("kernels/cpu: GroupStart inside a group (rank %d): groups do not nest", c.rank))
	}
	c.mu.group = q
}

func (c *comm) GroupEnd(kq kernels.Queue) {
	q := c.b.queue(kq)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mu.group != q {
		panic(fmt.Sprintf("kernels/cpu: GroupEnd on queue %s without a GroupStart on it (rank %d)", q.name, c.rank))
	}
	c.mu.group = nil
}

// Abort fails every pending and future collective of every rank.
func (c *comm) Abort() error {
	w := c.w
	w.abortOnce.Do(func() {
		w.abortErr = fmt.Errorf("%w (by rank %d)", kernels.ErrCommAborted, c.rank)
		close(w.aborted)
	})
	return nil
}

// Close leaves the communicator: rounds that still wait for this rank,
// and every later one, fail on the other ranks.
func (c *comm) Close() error {
	c.mu.Lock()
	closed := c.mu.closed
	c.mu.closed = true
	c.mu.Unlock()
	if closed {
		return nil
	}
	w := c.w
	w.mu.Lock()
	defer w.mu.Unlock()
	w.mu.closed[c.rank] = true
	for seq, r := range w.mu.rounds {
		if !r.arrived[c.rank] {
			r.finishLocked(fmt.Errorf("kernels/cpu: collective #%d: rank %d closed the communicator before joining it", seq, c.rank))
		}
	}
	return nil
}

func (r *round) finishLocked(err error) {
	if r.final {
		return
	}
	r.err, r.final = err, true
	close(r.done)
}

// run is collective seq on this rank's queue: hand in src, wait for the
// round, copy this rank's part of the result into dst.
func (c *comm) run(seq int64, call collective, dst, src []byte) error {
	w := c.w
	select {
	case <-w.aborted:
		return w.abortErr
	default:
	}
	w.mu.Lock()
	r := w.mu.rounds[seq]
	if r == nil {
		r = &round{calls: make([]collective, w.size), src: make([][]byte, w.size), arrived: make([]bool, w.size),
			left: w.size, done: make(chan struct{})}
		w.mu.rounds[seq] = r
		for rank, closed := range w.mu.closed {
			if closed {
				r.finishLocked(fmt.Errorf("kernels/cpu: collective #%d (%v): rank %d has closed the communicator", seq, call, rank))
				break
			}
		}
	}
	r.calls[c.rank], r.src[c.rank], r.arrived[c.rank] = call, src, true
	r.count++
	last := r.count == w.size && !r.final
	w.mu.Unlock()

	if last {
		// Every rank has handed in its source and waits on done: nobody
		// writes the sources until done is closed.
		res, err := r.compute(seq)
		w.mu.Lock()
		r.result = res
		r.finishLocked(err)
		w.mu.Unlock()
	}
	select {
	case <-r.done:
	case <-w.aborted:
		return w.abortErr
	}
	if r.err == nil {
		c.takeResult(r, call, dst)
	}
	w.mu.Lock()
	if r.left--; r.left == 0 {
		delete(w.mu.rounds, seq)
	}
	w.mu.Unlock()
	return r.err
}

// takeResult copies this rank's part of the round's result into dst.
func (c *comm) takeResult(r *round, call collective, dst []byte) {
	switch call.op {
	case "ReduceScatter":
		copy(dst, r.result[c.rank*len(dst):])
	default:
		copy(dst, r.result)
	}
}

// compute checks that every rank made the same call and computes the
// whole result of the round.
func (r *round) compute(seq int64) ([]byte, error) {
	call := r.calls[0]
	for rank, other := range r.calls {
		if other != call {
			return nil, fmt.Errorf("kernels/cpu: collective #%d differs between ranks: rank 0 issued %v, rank %d %v", seq, call, rank, other)
		}
	}
	switch call.op {
	case "AllReduce", "ReduceScatter":
		return sumInRankOrder(r.src, call.dtype), nil
	case "AllGather":
		return bytes.Join(r.src, nil), nil
	default: // Broadcast
		return bytes.Clone(r.src[call.root]), nil
	}
}

// sumInRankOrder returns Σ srcs in dtype dt: per element, float32
// x0 + x1 + ... + x(n-1) added in that order and rounded once to dt.
func sumInRankOrder(srcs [][]byte, dt kernels.DType) []byte {
	n := len(srcs[0]) / dt.Size()
	acc := make([]float32, n)
	x := make([]float32, n)
	for rank, s := range srcs {
		loadFloats(x, s, dt)
		if rank == 0 {
			copy(acc, x) // not 0 + x0, which turns -0 into +0
			continue
		}
		for i, v := range x {
			acc[i] += v
		}
	}
	out := make([]byte, len(srcs[0]))
	StoreF32(out, dt, acc)
	return out
}

// loadFloats converts the little-endian elements of dtype dt in src into dst.
func loadFloats(dst []float32, src []byte, dt kernels.DType) {
	le := binary.LittleEndian
	switch dt {
	case kernels.F32:
		for i := range dst {
			dst[i] = math.Float32frombits(le.Uint32(src[4*i:]))
		}
	case kernels.BF16:
		for i := range dst {
			dst[i] = kernels.F32FromBF16(le.Uint16(src[2*i:]))
		}
	case kernels.F16:
		for i := range dst {
			dst[i] = kernels.F32FromF16(le.Uint16(src[2*i:]))
		}
	default:
		panic("kernels/cpu: sum of " + dt.String())
	}
}
