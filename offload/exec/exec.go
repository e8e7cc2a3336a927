// Package exec runs compiled step programs (offload/schedule) on a
// backend's queues: it allocates each interval's device block from the
// offload cache when the program says, fetches weights, gradients and
// offloaded activations from the host on the host-to-device queue, sends
// gradients and activations back on the device-to-host queue, orders the
// three queues with events, frees blocks in the program's order (their
// memory reused once their last user has run, the host waiting for that
// only when an allocation needs the memory), and
// keeps the residency table up to date.
//
// It knows nothing of what the layers compute. A Model binds the blocks
// and enqueues each op; a Host holds the layers' host copies and is told
// when a layer's final gradients have left the device (that is where a
// host optimizer starts). So any Go program with its own layers can train
// out of core with it:
//
//	prog, _ := schedule.Compile(spec)
//	ex, _ := exec.New(cfg, prog)
//	for step := range steps {
//		if err := ex.Run(ctx, prog, model, host); err != nil { ... }
//	}
//
// A program in which everything is persistent (schedule.Spec.Resident)
// runs with no allocation, transfer, free or host wait: per op the
// executor binds the op's blocks and enqueues it, nothing else. The
// engine's trainers, resident and out of core, run every placement
// through one Executor.
package exec

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/spill-ml/spill/kernels"
	"github.com/spill-ml/spill/offload"
	"github.com/spill-ml/spill/offload/schedule"
)

// Queue is an ordered stream of device work with events (stream.Stream
// implements it). One goroutine drives each Queue.
type Queue interface {
	// Queue is the backend queue the work goes to.
	Queue() kernels.Queue
	// Enqueue calls fn to enqueue work named op on the queue.
	Enqueue(op string, fn func(q kernels.Queue)) error
	// Record marks the current end of the queue.
	Record() (kernels.Event, error)
	// Wait makes work enqueued after it wait for e.
	Wait(e kernels.Event) error
}

// Queues are the three queues a program runs on.
type Queues struct {
	Compute, H2D, D2H Queue
}

// Model is what an executor runs: a list of layers that compute on the
// blocks the executor binds.
type Model interface {
	// Bind makes b the device memory of interval iv (of the program being
	// run) for the ops that follow, until another interval of the same
	// class, layer and micro-batch is bound. Checkpoints are bound before
	// activations (see schedule.Program.Uses).
	Bind(iv *schedule.Interval, b kernels.Buffer)
	// Run enqueues op on q, the compute queue, with every tensor it uses
	// bound. final lists the layers whose gradients are final for the
	// step once op has run (a model may take their statistics on q).
	// After a Forward the executor copies the start of the layer's
	// activations into its checkpoint (the output, or under a selective
	// policy schedule.Layer.SaveBytes of them); before a Recompute under a
	// selective policy it has copied that checkpoint back into the start
	// of the activations, so the op reruns only what the rest needs.
	Run(q kernels.Queue, op schedule.Op, final []int)
	// LayerName names layer l in traces and errors.
	LayerName(l int) string
}

// Feeder is an optional upgrade of Model for a model that moves its own
// inputs and outputs with the ops (a trainer uploads a micro-batch before
// its first forward and copies its losses back after its last): Feed is
// called before op is enqueued, Drain right after, both on the goroutine
// that called Run and outside the op's span. What they enqueue must be
// ordered with the compute queue.
type Feeder interface {
	Feed(op schedule.Op) error
	Drain(op schedule.Op) error
}

// Host holds the host copies of the layers' streamed state.
type Host interface {
	// Weights returns layer l's compute-dtype weights to copy to the
	// device, once any update of them in flight has finished. The bytes
	// must stay unchanged until the copy's event has passed.
	Weights(ctx context.Context, l int) ([]byte, error)
	// Grads is the buffer layer l's gradients are sent to (and fetched
	// back from to accumulate into), ParamBytes long.
	Grads(l int) []byte
	// GradsOut is called once the copy of layer l's final gradients of
	// the step into Grads(l) has been enqueued; ev passes when they have
	// landed. It runs on the goroutine that called Run.
	GradsOut(l int, ev kernels.Event)
}

// Copier moves host state to and from the device on a queue. The default
// enqueues the backend's copies directly; a Staging ring passes them
// through pinned buffers when the host state is not pinned.
type Copier interface {
	CopyIn(ctx context.Context, q Queue, name string, dst kernels.Tensor, src []byte) error
	CopyOut(ctx context.Context, q Queue, name string, dst []byte, src kernels.Tensor) error
}

// Config is what an Executor runs with.
type Config struct {
	Backend kernels.Backend
	Queues  Queues
	// Cache holds the device blocks; it must be in Whole mode for
	// Program.Peak to be exact.
	Cache *offload.Cache
	// Table is the residency table the executor records every move in;
	// the layers' weights and gradients must have been added to it
	// (valid on the host) before the first Run. Persistent activations and output gradients (a resident program's)
	// are workspace: never recorded.
	Table *offload.Table
	// Copier, nil for direct copies.
	Copier Copier
	// HostAlloc returns n bytes of host memory for offloaded activations
	// (pinned where possible); nil means Go memory.
	HostAlloc func(n int64) []byte
	// AfterOp, if set, runs after op j has been enqueued and the blocks
	// around it freed and allocated (tests inspect the residency table).
	AfterOp func(j int)
}

// Traffic counts the bytes an executor has moved.
type Traffic struct {
	H2D, D2H int64
}

// Executor runs programs. Its methods are for one goroutine, except
// Traffic and Err.
type Executor struct {
	cfg Config
	// persistent blocks by (class, Interval.Block), shared by every program
	persistent map[[2]int]*offload.Block
	slots      map[*schedule.Program][][]byte
	devRefs    map[offload.Key]int
	// runs is each program's run state, reused by every Run of it
	runs     map[*schedule.Program]*run
	h2d, d2h atomic.Int64

	mu     sync.Mutex
	tabErr error
}

// New returns an executor for progs: it allocates their persistent
// blocks (shared between programs) and the host slots of their offloaded
// activations.
func New(cfg Config, progs ...*schedule.Program) (*Executor, error) {
	if cfg.Copier == nil {
		cfg.Copier = direct{cfg.Backend}
	}
	if cfg.HostAlloc == nil {
		cfg.HostAlloc = func(n int64) []byte { return offload.NewF32Bytes(n) }
	}
	e := &Executor{cfg: cfg, persistent: map[[2]int]*offload.Block{}, slots: map[*schedule.Program][][]byte{},
		devRefs: map[offload.Key]int{}, runs: map[*schedule.Program]*run{}}
	// Each persistent block, sized for the largest of its intervals in
	// any program.
	size := map[[2]int]int64{}
	var order []*schedule.Interval
	for _, p := range progs {
		for i := range p.Intervals {
			iv := &p.Intervals[i]
			k := [2]int{int(iv.Class), iv.Block}
			if !iv.Persistent {
				continue
			}
			if _, ok := size[k]; !ok {
				order = append(order, iv)
			}
			size[k] = max(size[k], iv.Bytes)
		}
	}
	// Layer by layer, as a trainer without a scheduler allocates them.
	slices.SortStableFunc(order, func(a, b *schedule.Interval) int { return cmp.Compare(a.Layer, b.Layer) })
	for _, iv := range order {
		k := [2]int{int(iv.Class), iv.Block}
		b, err := cfg.Cache.Alloc(size[k], iv.Class.Offload())
		if err != nil {
			e.Close()
			return nil, fmt.Errorf("exec: allocating resident %s of layer %d: %w", iv.Class.Offload(), iv.Layer, err)
		}
		e.persistent[k] = b
	}
	for _, p := range progs {
		var slots [][]byte
		for _, n := range p.HostSlots {
			slots = append(slots, cfg.HostAlloc(4*((n+3)/4)))
		}
		e.slots[p] = slots
		e.runs[p] = newRun(e, p)
	}
	return e, nil
}

// Close frees the persistent blocks (the queues must be idle).
func (e *Executor) Close() {
	for k, b := range e.persistent {
		e.cfg.Cache.Free(b)
		delete(e.persistent, k)
	}
}

// Resident is the persistent block of class c of layer l (Interval.Block;
// nil if no program holds one): what a caller that updates state on the
// device outside the programs (a device optimizer, checkpoints) works on
// while the queues are idle or ordered after the programs' work.
func (e *Executor) Resident(c schedule.Class, l int) *offload.Block {
	return e.persistent[[2]int{int(c), l}]
}

// Traffic is the bytes moved so far.
func (e *Executor) Traffic() Traffic { return Traffic{H2D: e.h2d.Load(), D2H: e.d2h.Load()} }

// Err is the first residency transition the table refused (a bookkeeping
// bug: the table no longer says where tensors are), or nil.
func (e *Executor) Err() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.tabErr
}

// rec keeps the first transition the table refused: the table is the
// record of where tensors are, a refusal is a bug, not a reason to fail
// the step.
func (e *Executor) rec(err error) {
	if err == nil {
		return
	}
	e.mu.Lock()
	if e.tabErr == nil {
		e.tabErr = err
	}
	e.mu.Unlock()
}

// key is the residency table's key of an interval's tensor; ok is false
// for output gradients and persistent activations, which the table does
// not track (pass workspace).
func key(iv *schedule.Interval) (offload.Key, bool) {
	k := offload.Key{Layer: iv.Layer, Class: iv.Class.Offload()}
	switch {
	case iv.Class == schedule.DGrad, iv.Class == schedule.TGrads:
		return k, false
	case iv.Persistent && (iv.Class == schedule.Acts || iv.Class == schedule.Ckpt):
		return k, false
	}
	switch iv.Class {
	case schedule.Ckpt:
		k.Part, k.MB = offload.PartCheckpoint, iv.MB
	case schedule.Acts:
		k.MB = iv.MB
	}
	return k, true
}

// landed completes k's copy from the device to the host if one is in
// flight: called once the copy's event has passed, or from a queue
// ordered after it.
func (e *Executor) landed(k offload.Key) {
	t := e.cfg.Table
	if r, ok := t.Get(k); ok && r.InFlight && r.Moving.From == offload.TierDevice {
		e.rec(t.EndCopy(k))
	}
}

// onDevice records that a block of iv's tensor is live on the device:
// fetched from the host (copied), or written there afresh.
func (e *Executor) onDevice(iv *schedule.Interval, copied bool) {
	k, ok := key(iv)
	if !ok {
		return
	}
	t := e.cfg.Table
	r, ok := t.Get(k)
	switch {
	case !ok:
		e.rec(t.Add(k, iv.Bytes, offload.TierDevice))
	case !copied:
		e.landed(k)
		e.rec(t.Overwrite(k, offload.TierDevice))
	case r.InFlight || !r.Valid.Has(offload.TierDevice):
		e.landed(k) // the fetch is queued after the copy out
		if r, _ = t.Get(k); !r.Valid.Has(offload.TierDevice) {
			e.rec(t.BeginCopy(k, offload.TierHost, offload.TierDevice))
			e.rec(t.EndCopy(k)) // valid for the queues ordered after the fetch
		}
	}
	if !iv.Persistent {
		e.devRefs[k]++
	}
}

// offDevice records that iv's block is freed (its copy to the host, if
// any, has landed): the last block of a tensor evicts its device copy, or
// drops activations that the backward has consumed.
func (e *Executor) offDevice(iv *schedule.Interval) {
	k, ok := key(iv)
	if !ok {
		return
	}
	e.landed(k)
	if e.devRefs[k]--; e.devRefs[k] > 0 {
		return
	}
	delete(e.devRefs, k)
	t := e.cfg.Table
	r, ok := t.Get(k)
	switch {
	case !ok || !r.Valid.Has(offload.TierDevice):
	case (iv.Class == schedule.Acts || iv.Class == schedule.Ckpt) && iv.Evict:
		e.rec(t.Evict(k, offload.TierDevice))
	case iv.Class == schedule.Acts || iv.Class == schedule.Ckpt:
		e.rec(t.Drop(k))
	default:
		e.rec(t.Evict(k, offload.TierDevice))
	}
}

// run is the state of the Runs of one program, reset by each.
type run struct {
	e       *Executor
	ctx     context.Context
	p       *schedule.Program
	m       Model
	h       Host
	feed    Feeder // m's, or nil
	blocks  []*offload.Block
	fetchEv []kernels.Event
	evictEv []kernels.Event
	gradEv  map[int]kernels.Event // the last copy of a layer's grads to the host
	pending []int                 // ended intervals, freed once their event passes
	pendEv  []kernels.Event
	landEnd []offload.Key // copies of persistent gradients to the host
	final   []int

	// What the op being enqueued runs (compute, one closure for every
	// op, so that enqueueing allocates nothing).
	cur   schedule.Op
	ckpts []int // checkpoints the op fills, from the activations acts
	acts  []int
	// restores are the selective checkpoints the op (a recompute) copies
	// back into the start of the activations restoreTo before it runs.
	restores, restoreTo []int
	compute             func(q kernels.Queue)
	// names[j] is op j's name in traces; needEv[j] whether anything that
	// ends at op j waits for its event (an eviction or a free).
	names  []string
	needEv []bool
}

func newRun(e *Executor, p *schedule.Program) *run {
	r := &run{e: e, p: p,
		blocks:  make([]*offload.Block, len(p.Intervals)),
		fetchEv: make([]kernels.Event, len(p.Intervals)),
		evictEv: make([]kernels.Event, len(p.Intervals)),
		gradEv:  map[int]kernels.Event{},
		names:   make([]string, len(p.Ops)),
		needEv:  make([]bool, len(p.Ops)),
	}
	r.compute = r.runOp
	for j := range p.Ends {
		for _, i := range p.Ends[j] {
			if iv := &p.Intervals[i]; !iv.Persistent || iv.Evict {
				r.needEv[j] = true
			}
		}
	}
	return r
}

// runOp enqueues r.cur on the compute queue q.
func (r *run) runOp(cq kernels.Queue) {
	p := r.p
	for n, c := range r.restores {
		to := kernels.View(r.blocks[r.restoreTo[n]].Buffer(), 0, kernels.U8, int(p.Intervals[c].Bytes))
		r.e.cfg.Backend.CopyDevice(cq, to, r.view(c, kernels.U8))
	}
	r.m.Run(cq, r.cur, r.final)
	for n, c := range r.ckpts {
		out := kernels.View(r.blocks[r.acts[n]].Buffer(), 0, kernels.U8, int(p.Intervals[c].Bytes))
		r.e.cfg.Backend.CopyDevice(cq, r.view(c, kernels.U8), out)
	}
}

// Run executes program p once: it binds and enqueues every op of p on the
// compute queue, with the fetches, evictions, allocations and frees the
// program lays out. When p trains, each layer's final gradients are sent
// to h.Grads and reported to h.GradsOut. On return every queue has
// finished; on error every non-persistent block has been freed. p must be
// one of the programs the executor was made for.
func (e *Executor) Run(ctx context.Context, p *schedule.Program, m Model, h Host) (err error) {
	r := e.runs[p]
	if r == nil {
		return fmt.Errorf("exec: Run of a program the executor was not made for")
	}
	r.ctx, r.m, r.h = ctx, m, h
	r.feed, _ = m.(Feeder)
	clear(r.blocks)
	clear(r.fetchEv)
	clear(r.evictEv)
	clear(r.gradEv)
	r.pending, r.pendEv, r.landEnd = r.pending[:0], r.pendEv[:0], r.landEnd[:0]
	defer func() { r.ctx, r.m, r.h, r.feed = nil, nil, nil, nil }()
	q := e.cfg.Queues
	defer func() {
		if err == nil {
			return
		}
		// Nothing may use a block once it is freed.
		_ = sync3(context.Background(), q) // even when ctx is done: the work must finish first
		for _, k := range r.landEnd {
			e.landed(k)
		}
		for i, b := range r.blocks {
			if b != nil && !p.Intervals[i].Persistent {
				e.offDevice(&p.Intervals[i])
				e.cfg.Cache.Free(b)
			}
		}
	}()
	if err := r.iteration(0); err != nil {
		return err
	}
	for j, op := range p.Ops {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := r.op(j, op); err != nil {
			return err
		}
		// Free what ended at the previous op, then allocate and prefetch.
		r.release(j)
		if err := r.iteration(j + 1); err != nil {
			return err
		}
		if e.cfg.AfterOp != nil {
			e.cfg.AfterOp(j)
		}
	}
	r.release(len(p.Ops))
	if err := sync3(ctx, q); err != nil {
		return err
	}
	for _, k := range r.landEnd {
		e.landed(k)
	}
	return nil
}

// sync3 waits for the three queues.
func sync3(ctx context.Context, q Queues) error {
	var errs []error
	for _, s := range []Queue{q.Compute, q.H2D, q.D2H} {
		if err := s.Queue().Synchronize(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// iteration allocates (and fetches or zeroes) Allocs[it] and refetches
// the persistent weights of Fetches[it].
func (r *run) iteration(it int) error {
	for _, i := range r.p.Allocs[it] {
		if err := r.allocate(i); err != nil {
			return err
		}
	}
	for _, i := range r.p.Fetches[it] {
		if err := r.fetchWeights(i); err != nil {
			return err
		}
	}
	return nil
}

func (r *run) view(i int, dt kernels.DType) kernels.Tensor {
	iv := &r.p.Intervals[i]
	return kernels.View(r.blocks[i].Buffer(), 0, dt, int(iv.Bytes)/dt.Size())
}

// allocate gives interval i its block and fills it as the program says.
func (r *run) allocate(i int) error {
	e, iv := r.e, &r.p.Intervals[i]
	if iv.Persistent {
		r.blocks[i] = e.persistent[[2]int{int(iv.Class), iv.Block}]
	} else {
		b, err := e.cfg.Cache.Alloc(iv.Bytes, iv.Class.Offload())
		if err != nil {
			return fmt.Errorf("exec: layer %s: %w\n%s", r.m.LayerName(iv.Layer), err, e.cfg.Cache.MemorySummary())
		}
		r.blocks[i] = b
	}
	r.fetchEv[i] = nil
	q := e.cfg.Queues
	switch {
	case iv.Class == schedule.Weights:
		if !iv.Persistent {
			return r.fetchWeights(i)
		}
		return nil
	case iv.Zero:
		e.cfg.Backend.Zero(q.Compute.Queue(), r.view(i, kernels.U8))
		e.onDevice(iv, false)
	case iv.Fetch && iv.Class == schedule.Grads:
		if ev := r.gradEv[iv.Layer]; ev != nil {
			if err := q.H2D.Wait(ev); err != nil {
				return err
			}
		}
		return r.fetch(i, "fetch g", r.h.Grads(iv.Layer))
	case iv.Fetch: // offloaded activations or tied gradients coming back, after their copy out
		if err := q.H2D.Wait(r.evictEv[iv.Src]); err != nil {
			return err
		}
		return r.fetch(i, "fetch acts", r.e.slots[r.p][iv.Slot][:iv.Bytes])
	case iv.Class != schedule.Grads:
		e.onDevice(iv, false)
	}
	return nil
}

// fetchWeights copies layer weights in: streamed ones every time,
// persistent ones only when the host has updated them since (the
// residency table says the device copy is stale).
func (r *run) fetchWeights(i int) error {
	iv := &r.p.Intervals[i]
	k, _ := key(iv)
	if res, _ := r.e.cfg.Table.Get(k); iv.Persistent && res.Valid.Has(offload.TierDevice) {
		return nil
	}
	src, err := r.h.Weights(r.ctx, iv.Layer)
	if err != nil {
		return err
	}
	return r.fetch(i, "fetch w", src)
}

// fetch enqueues the copy of src into interval i's block on the H2D
// queue and records the event its users wait for.
func (r *run) fetch(i int, what string, src []byte) error {
	e, iv := r.e, &r.p.Intervals[i]
	q := e.cfg.Queues.H2D
	dst := r.view(i, kernels.U8)
	if err := e.cfg.Copier.CopyIn(r.ctx, q, what+" "+r.m.LayerName(iv.Layer), dst, src[:iv.Bytes]); err != nil {
		return err
	}
	e.h2d.Add(iv.Bytes)
	e.onDevice(iv, true)
	ev, err := q.Record()
	r.fetchEv[i] = ev
	return err
}

// op binds and enqueues op j, then sends what ends with it to the host.
func (r *run) op(j int, op schedule.Op) error {
	e, p := r.e, r.p
	q := e.cfg.Queues
	r.final = r.final[:0]
	ckpts, restores := r.ckpts[:0], r.restores[:0]
	for _, i := range p.Uses[j] {
		iv := &p.Intervals[i]
		r.m.Bind(iv, r.blocks[i].Buffer())
		if ev := r.fetchEv[i]; ev != nil {
			if err := q.Compute.Wait(ev); err != nil {
				return err
			}
			r.fetchEv[i] = nil
		}
		if iv.CkptOf && iv.Start == j {
			ckpts = append(ckpts, i)
		}
		if iv.Restore && iv.End == j {
			restores = append(restores, i)
		}
		if iv.Class == schedule.Grads && iv.Final && iv.End == j && p.Spec.Train {
			r.final = append(r.final, iv.Layer)
		}
	}
	// The activations a checkpoint copies from: the layer's own, bound
	// for this op.
	acts := r.acts[:0]
	for _, c := range ckpts {
		for _, i := range p.Uses[j] {
			if a := &p.Intervals[i]; a.Class == schedule.Acts && a.Layer == p.Intervals[c].Layer && a.MB == p.Intervals[c].MB {
				acts = append(acts, i)
			}
		}
	}
	restoreTo := r.restoreTo[:0]
	for _, c := range restores {
		to := -1
		for _, i := range p.Uses[j] {
			if a := &p.Intervals[i]; a.Class == schedule.Acts && a.Layer == p.Intervals[c].Layer && a.MB == p.Intervals[c].MB {
				to = i
			}
		}
		if to < 0 {
			return fmt.Errorf("exec: op %v restores checkpoint %d with no activations of its layer", op, c)
		}
		restoreTo = append(restoreTo, to)
	}
	r.ckpts, r.acts, r.restores, r.restoreTo = ckpts, acts, restores, restoreTo
	if r.names[j] == "" {
		r.names[j] = [...]string{"fwd ", "recompute ", "bwd "}[op.Kind] + r.m.LayerName(op.Layer)
	}
	if r.feed != nil {
		if err := r.feed.Feed(op); err != nil {
			return err
		}
	}
	r.cur = op
	if err := q.Compute.Enqueue(r.names[j], r.compute); err != nil {
		return err
	}
	if r.feed != nil {
		if err := r.feed.Drain(op); err != nil {
			return err
		}
	}
	if !r.needEv[j] {
		return nil // nothing ends here but persistent blocks that stay put
	}
	ev, err := q.Compute.Record()
	if err != nil {
		return err
	}
	for _, i := range p.Ends[j] {
		done, err := r.evict(i, ev)
		if err != nil {
			return err
		}
		if !p.Intervals[i].Persistent {
			r.pending = append(r.pending, i)
			r.pendEv = append(r.pendEv, done)
		}
	}
	return nil
}

// evict sends interval i to the host after the compute event ev, if the
// program says so, and returns the event its block may be freed after.
func (r *run) evict(i int, ev kernels.Event) (kernels.Event, error) {
	e, iv := r.e, &r.p.Intervals[i]
	if !iv.Evict || (iv.Class == schedule.Grads && !r.p.Spec.Train) {
		return ev, nil
	}
	q := e.cfg.Queues.D2H
	if err := q.Wait(ev); err != nil {
		return nil, err
	}
	k, tracked := key(iv)
	t := e.cfg.Table
	var dst []byte
	what := "evict acts "
	if iv.Class == schedule.Grads {
		// The backward wrote the gradients on the device; they go to
		// the host.
		e.rec(t.Modified(k, offload.TierDevice))
		dst, what = r.h.Grads(iv.Layer), "evict g "
		if iv.Persistent {
			r.landEnd = append(r.landEnd, k)
		}
	} else {
		dst = e.slots[r.p][iv.Slot][:iv.Bytes]
	}
	if tracked {
		e.rec(t.BeginCopy(k, offload.TierDevice, offload.TierHost))
	}
	if err := e.cfg.Copier.CopyOut(r.ctx, q, what+r.m.LayerName(iv.Layer), dst[:iv.Bytes], r.view(i, kernels.U8)); err != nil {
		return nil, err
	}
	e.d2h.Add(iv.Bytes)
	done, err := q.Record()
	if err != nil {
		return nil, err
	}
	r.evictEv[i] = done
	if iv.Class == schedule.Grads {
		r.gradEv[iv.Layer] = done
		if iv.Final {
			r.h.GradsOut(iv.Layer, done)
		}
	}
	return done, nil
}

// release frees the pending intervals that ended before op `before`,
// without waiting for their events: the cache counts them freed at once
// and reuses their memory once the events have passed, waiting for them
// only when an allocation needs that memory (offload.Cache.FreeAfter).
// So the host enqueues ahead of the device as far as the memory lets it,
// and the device holds what the program's peak counts.
func (r *run) release(before int) {
	keep := 0
	for n, i := range r.pending {
		if r.p.Intervals[i].End >= before {
			r.pending[keep], r.pendEv[keep] = i, r.pendEv[n]
			keep++
			continue
		}
		r.e.offDevice(&r.p.Intervals[i])
		r.e.cfg.Cache.FreeAfter(r.blocks[i], r.pendEv[n])
		r.blocks[i] = nil
	}
	clear(r.pendEv[keep:])
	r.pending, r.pendEv = r.pending[:keep], r.pendEv[:keep]
}

// direct copies without staging.
type direct struct{ be kernels.Backend }

func (d direct) CopyIn(_ context.Context, q Queue, name string, dst kernels.Tensor, src []byte) error {
	return q.Enqueue(name, func(kq kernels.Queue) { d.be.CopyToDevice(kq, dst, src) })
}

func (d direct) CopyOut(_ context.Context, q Queue, name string, dst []byte, src kernels.Tensor) error {
	return q.Enqueue(name, func(kq kernels.Queue) { d.be.CopyToHost(kq, dst, src) })
}
