package engine

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"

	"github.com/spill-ml/spill/kernels"
	"github.com/spill-ml/spill/offload"
	"github.com/spill-ml/spill/stream"
)

// OffloadOptions say where a Trainer keeps each class of layer state when
// it trains out of core (NewOffloadTrainer). The engine's layer-streaming
// scheduler follows them exactly; offload.Plan chooses them (PlanOffload).
type OffloadOptions struct {
	// Weights is the home of the compute-dtype weights: TierDevice keeps
	// them resident, TierHost streams them layer by layer, Prefetch
	// accesses ahead of the compute.
	Weights offload.Tier
	// Grads is the home of the gradients: TierDevice keeps them resident
	// for the whole step; TierHost sends each layer's to the host as soon
	// as its backward is done (and back for the next micro-batch).
	Grads offload.Tier
	// Optimizer is where the fp32 master weights and the Adam moments live
	// and where AdamW runs: TierHost (in RAM) or TierDisk (the moments in
	// files under DiskDir, the master in RAM). The host optimizer is
	// offload.HostAdamW, bitwise identical to the CPU backend's kernel.
	Optimizer offload.Tier
	// Prefetch is how many layer accesses ahead streamed tensors are
	// fetched (>= 1 when Weights or Grads stream). Default 1.
	Prefetch int
	// Activations is each layer's activation policy; nil keeps all.
	// Recompute keeps only the layer's output (the next layer's input)
	// and reruns its forward before its backward. OffloadTo copies the
	// layer's activations to host memory once the next layer's forward
	// has read them and fetches them back (Prefetch accesses ahead) for
	// the backward. Both are ignored for the first and last layer.
	Activations []offload.ActPolicy
	// DeviceBudget is the hard limit of the device cache in bytes; 0 means
	// only the backend's own limit applies.
	DeviceBudget int64
	// DiskDir and DiskBudget configure the disk tier (Optimizer TierDisk).
	DiskDir    string
	DiskBudget int64
	// Recorder, if not nil, traces every op of the three streams and the
	// host optimizer.
	Recorder *stream.Recorder
	// DelayedUpdate runs the host optimizer of step t during the forward
	// and backward of step t+1 (DeepSpeed's delayed parameter update):
	// step t+1 computes on the weights of step t-1, one step stale, and
	// the update is off the critical path. The host keeps two copies of
	// the compute-dtype weights and of the gradients. Default off: every
	// step sees the weights of the previous update, as NewTrainer's do.
	DelayedUpdate bool
	// HostBudget is the budget of the host pool that holds the layer
	// state (master weights, moments, gradient and weight buffers,
	// offloaded activations) in pinned memory; 0 means what the state
	// needs (OffloadHostBytes). The pool checks RLIMIT_MEMLOCK (when its
	// memory counts against it) and MemAvailable first: when it would
	// degrade, or the state does not fit its budget, the state is kept in
	// ordinary Go memory instead and HostPinning says why. When it
	// degrades, the copies of that state to and from the device pass
	// through the degraded pool's small ring of pinned staging buffers.
	HostBudget int64
	// HostPinner supplies the pinned memory; nil means the backend's own
	// allocator when it has one (kernels.PinnedAllocator, CUDA's
	// cuMemHostAlloc), else unlocked anonymous mappings off the Go heap
	// (offload.MmapPinner).
	HostPinner offload.Pinner
	// HostLimits, if set, replaces offload.ReadLimits (tests).
	HostLimits func() (offload.Limits, error)
}

func (o *OffloadOptions) validate(m *Model) error {
	var errs []error
	if o.Weights != offload.TierDevice && o.Weights != offload.TierHost {
		errs = append(errs, fmt.Errorf("weights on %s: want device or host", o.Weights))
	}
	if o.Grads != offload.TierDevice && o.Grads != offload.TierHost {
		errs = append(errs, fmt.Errorf("grads on %s: want device or host", o.Grads))
	}
	if o.Optimizer != offload.TierHost && o.Optimizer != offload.TierDisk {
		errs = append(errs, fmt.Errorf("optimizer on %s: want host or disk", o.Optimizer))
	}
	if o.Optimizer == offload.TierDisk && (o.DiskDir == "" || o.DiskBudget <= 0) {
		errs = append(errs, fmt.Errorf("optimizer on disk needs a disk directory and budget"))
	}
	if o.Activations != nil && len(o.Activations) != len(m.Layers) {
		errs = append(errs, fmt.Errorf("%d activation policies for %d layers", len(o.Activations), len(m.Layers)))
	}
	if o.Prefetch < 0 {
		errs = append(errs, fmt.Errorf("prefetch %d must be >= 0", o.Prefetch))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("engine: offload options: %w", err)
	}
	return nil
}

// Tensor classes of the schedule.
const (
	tcWeights = iota
	tcGrads
	tcActs // a layer's full activations
	tcCkpt // a recomputed layer's output only
)

type accKind uint8

const (
	accFwd accKind = iota
	accRec         // recompute forward before backward
	accBwd
)

// access is one compute call of the schedule.
type access struct {
	kind  accKind
	layer int
	mb    int
}

// interval is one stretch of device residency of one tensor: a block is
// allocated at iteration allocAt (after the compute of that access is
// enqueued; -1 for the prologue), fetched or zeroed, used by the accesses
// start..end and freed at iteration end+1 (persistent ones never).
type interval struct {
	layer, class int
	start, end   int
	allocAt      int
	bytes        int64
	fetch        bool // copy the host copy in (weights, accumulated grads)
	zero         bool // zero it before its first use (grads of micro-batch 0)
	evict        bool // copy it to the host after its last use (grads)
	final        bool // its gradients are final at end: record norm statistics
	ckptOf       bool // ckpt: copied from the layer's acts after access start
	persistent   bool
	// Offloaded activations: the evicting interval (evict, class tcActs)
	// copies the block to host, the restoring one (fetch, src set) copies
	// it back once src's copy has landed.
	host []byte
	src  *interval

	block   *offload.Block
	fetchEv kernels.Event
	evictEv kernels.Event // acts: the copy to host
}

// schedule is the static program of one training step (or of one forward
// pass for evaluation) and the intervals of every device tensor.
type schedule struct {
	acc  []access
	ivs  []*interval
	uses [][]*interval // per access: the intervals it reads or writes
	// by iteration (index+1, so the prologue is 0)
	allocs [][]*interval
	ends   [][]*interval
}

func (o *OffloadOptions) recompute(m *Model, l int) bool { return o.policy(m, l) == offload.Recompute }

// policy is layer l's activation policy: Keep for the first and last.
func (o *OffloadOptions) policy(m *Model, l int) offload.ActPolicy {
	if o.Activations == nil || l == 0 || l == len(m.Layers)-1 {
		return offload.Keep
	}
	return o.Activations[l]
}

// buildSchedule lays out the accesses of accum micro-batches (forward and
// backward when train, else forward only) and the residency intervals.
func buildSchedule(m *Model, o *OffloadOptions, B, T, accum int, train bool) *schedule {
	n := len(m.Layers)
	s := &schedule{}
	for k := 0; k < accum; k++ {
		for l := 0; l < n; l++ {
			s.acc = append(s.acc, access{accFwd, l, k})
		}
		if !train {
			continue
		}
		for l := n - 1; l >= 0; l-- {
			if o.recompute(m, l) {
				s.acc = append(s.acc, access{accRec, l, k})
			}
			s.acc = append(s.acc, access{accBwd, l, k})
		}
	}
	s.uses = make([][]*interval, len(s.acc))
	depth := max(o.Prefetch, 1)
	wbytes := func(l int) int64 { return int64(m.Layers[l].NumParams()) * int64(m.DType.Size()) }
	add := func(iv *interval, lookahead int) {
		iv.allocAt = iv.start - lookahead - 1
		if iv.persistent {
			iv.allocAt = -1
		}
		s.ivs = append(s.ivs, iv)
	}
	// Weights and grads: the accesses that need each layer's, merged into
	// one interval where they are adjacent.
	for l := 0; l < n; l++ {
		var wUses, gUses []int
		for j, a := range s.acc {
			needs := a.layer == l
			for _, t := range m.Layers[a.layer].Tied() {
				needs = needs || t == l
			}
			if !needs {
				continue
			}
			wUses = append(wUses, j)
			if a.kind == accBwd {
				gUses = append(gUses, j)
			}
		}
		for _, r := range runs(wUses, o.Weights == offload.TierDevice) {
			add(&interval{layer: l, class: tcWeights, start: r[0], end: r[1], bytes: wbytes(l), fetch: true,
				persistent: o.Weights == offload.TierDevice}, depth)
		}
		rs := runs(gUses, o.Grads == offload.TierDevice)
		for i, r := range rs {
			iv := &interval{layer: l, class: tcGrads, start: r[0], end: r[1], bytes: wbytes(l),
				zero: i == 0, fetch: i > 0, evict: true, final: i == len(rs)-1, persistent: o.Grads == offload.TierDevice}
			la := depth
			if iv.zero {
				la = 0
			}
			add(iv, la)
		}
	}
	// Activations.
	find := func(kind accKind, l, k int) int {
		for j, a := range s.acc {
			if a.kind == kind && a.layer == l && a.mb == k {
				return j
			}
		}
		return -1
	}
	for k := 0; k < accum; k++ {
		for l := 0; l < n; l++ {
			ab := m.Layers[l].ActivationBytes(B, T)
			f := find(accFwd, l, k)
			if !train {
				end := f
				if l+1 < n {
					end = find(accFwd, l+1, k)
				}
				add(&interval{layer: l, class: tcActs, start: f, end: end, bytes: ab}, 0)
				continue
			}
			switch o.policy(m, l) {
			case offload.Keep:
				add(&interval{layer: l, class: tcActs, start: f, end: find(accBwd, l, k), bytes: ab}, 0)
				continue
			case offload.OffloadTo:
				// Out: from the forward to the next layer's forward,
				// which reads the output. Back: from the next layer's
				// recompute or backward (which read it again) to the
				// layer's own backward, fetched ahead but never before
				// the copy out has been enqueued.
				out := &interval{layer: l, class: tcActs, start: f, end: find(accFwd, l+1, k), bytes: ab, evict: true}
				add(out, 0)
				back := find(accRec, l+1, k)
				if back < 0 {
					back = find(accBwd, l+1, k)
				}
				in := &interval{layer: l, class: tcActs, start: back, end: find(accBwd, l, k), bytes: ab, fetch: true, src: out}
				add(in, depth)
				in.allocAt = max(in.allocAt, out.end)
				continue
			}
			f1, b1 := find(accFwd, l+1, k), find(accBwd, l+1, k)
			add(&interval{layer: l, class: tcActs, start: f, end: f1, bytes: ab}, 0)
			ob := int64(m.Layers[l].OutputElems(B, T)) * int64(m.DType.Size())
			add(&interval{layer: l, class: tcCkpt, start: f1, end: b1, bytes: ob, ckptOf: true}, 0)
			add(&interval{layer: l, class: tcActs, start: find(accRec, l, k), end: find(accBwd, l, k), bytes: ab}, 0)
		}
	}
	s.allocs = make([][]*interval, len(s.acc)+1)
	s.ends = make([][]*interval, len(s.acc)+1)
	for _, iv := range s.ivs {
		at := max(iv.allocAt, -1) + 1
		s.allocs[at] = append(s.allocs[at], iv)
		s.ends[iv.end+1] = append(s.ends[iv.end+1], iv)
		for j := iv.start; j <= iv.end; j++ {
			s.uses[j] = append(s.uses[j], iv)
		}
	}
	return s
}

// runs splits sorted access indexes into runs of adjacent ones ([first,
// last] each), or one run over all when whole.
func runs(idx []int, whole bool) [][2]int {
	if len(idx) == 0 {
		return nil
	}
	if whole {
		return [][2]int{{idx[0], idx[len(idx)-1]}}
	}
	var out [][2]int
	cur := [2]int{idx[0], idx[0]}
	for _, j := range idx[1:] {
		if j == cur[1]+1 {
			cur[1] = j
			continue
		}
		out = append(out, cur)
		cur = [2]int{j, j}
	}
	return append(out, cur)
}

// roundBlock is the device cache's rounding in Whole mode.
func roundBlock(n int64) int64 { return (max(n, 1) + 511) &^ 511 }

// peak is the device bytes the schedule holds at most, besides the fixed
// buffers: exactly what the executor allocates, in the same order.
func (s *schedule) peak() int64 {
	var live, peak int64
	for it := 0; it <= len(s.acc); it++ {
		if it > 0 {
			for _, iv := range s.ends[it-1] {
				if !iv.persistent && it-1 > 0 {
					live -= roundBlock(iv.bytes)
				}
			}
		}
		for _, iv := range s.allocs[it] {
			live += roundBlock(iv.bytes)
		}
		peak = max(peak, live)
	}
	return peak
}

// hostLayer is a layer's state in host memory.
type hostLayer struct {
	master []byte // fp32
	// weights is the compute-dtype copy that fetches read: the same
	// memory as master in fp32 runs without DelayedUpdate.
	weights []byte
	grads   []byte        // compute dtype landing buffer of the evictions
	m, v    []byte        // fp32 moments (nil when on disk)
	gradEv  kernels.Event // the last copy of the grads to the host
	// DelayedUpdate: the second weights and grads buffers. An update in
	// flight writes next (taken from spareW); waiting for it makes next
	// the weights the fetches read.
	spareW, spareG, next []byte

	done      chan struct{}
	err       error // the update's error, valid after done
	nonFinite bool  // eager update: the grads were not finite, nothing changed
}

// offloadState is a Trainer's out-of-core machinery.
type offloadState struct {
	opts    OffloadOptions
	cache   *offload.Cache
	table   *offload.Table
	streams *stream.Set
	disk    *offload.Disk
	host    []hostLayer
	fixed   []*offload.Block
	train   *schedule
	eval    *schedule
	hbs     []HostBatch
	losses  [][]byte
	statBuf []byte
	// work runs host optimizer updates in the order they are queued, on
	// GOMAXPROCS goroutines.
	work chan func()
	// eager is the update of the running step when each layer's update
	// starts as soon as its gradients land (no clipping, no fp16 loss
	// scaling, no DelayedUpdate); nil when updates wait for the global
	// gradient norm.
	eager    *kernels.AdamWParams
	launched int // eager updates launched in the running step
	// storeHook, if set, runs before each write of the disk tier and may
	// fail it (tests inject write failures).
	storeHook func(k offload.Key) error
	// predicted device peak (schedule plus fixed buffers)
	fixedBytes int64
	hostBytes  int64
	cur        int // which of the pass's two gradient buffers is DIn
	// Host memory: the pool and its buffers when the state is pinned
	// (hostPinned), and what was decided.
	pool       *offload.HostPool
	hostBufs   []*offload.HostBuf
	hostPinned bool
	hostNote   string
	// stage, when the pool degraded, is the ring of pinned staging
	// buffers the copies of the unpinned state pass through.
	stage *stagingRing
	// Residency: devRefs counts the live device blocks of each tensor
	// (intervals of one tensor overlap with tied weights and deep
	// prefetch); tabErr is the first transition the table refused.
	devRefs map[offload.Key]int
	tabMu   sync.Mutex
	tabErr  error
	// accessHook, if set, runs after each access of a schedule is
	// enqueued and the blocks around it freed and allocated (tests).
	accessHook func(j int)
}

// rec keeps the first residency transition the table refused: the table
// is the record of where tensors are, a refusal is a bookkeeping bug, not
// a reason to fail the step.
func (st *offloadState) rec(err error) {
	if err == nil {
		return
	}
	st.tabMu.Lock()
	if st.tabErr == nil {
		st.tabErr = err
	}
	st.tabMu.Unlock()
}

// ivKey is the residency table's key of an interval's tensor.
func ivKey(iv *interval) offload.Key {
	k := offload.Key{Layer: iv.layer, Class: ivClass(iv)}
	if iv.class == tcCkpt {
		k.Part = offload.PartCheckpoint
	}
	return k
}

// landed completes k's copy from the device to the host if one is in
// flight: called once the copy's event has passed, or from a queue
// ordered after it.
func (st *offloadState) landed(k offload.Key) {
	if r, ok := st.table.Get(k); ok && r.InFlight && r.Moving.From == offload.TierDevice {
		st.rec(st.table.EndCopy(k))
	}
}

// onDevice records that a block of interval iv's tensor is live on the
// device: fetched from the host (copied), or written there afresh.
func (st *offloadState) onDevice(iv *interval, copied bool) {
	k := ivKey(iv)
	r, ok := st.table.Get(k)
	switch {
	case !ok:
		st.rec(st.table.Add(k, iv.bytes, offload.TierDevice))
	case !copied:
		st.landed(k)
		st.rec(st.table.Overwrite(k, offload.TierDevice))
	case r.InFlight || !r.Valid.Has(offload.TierDevice):
		st.landed(k) // the fetch is queued after the copy out
		if r, _ = st.table.Get(k); !r.Valid.Has(offload.TierDevice) {
			st.rec(st.table.BeginCopy(k, offload.TierHost, offload.TierDevice))
			st.rec(st.table.EndCopy(k)) // valid for the queues ordered after the fetch
		}
	}
	if !iv.persistent {
		st.devRefs[k]++
	}
}

// offDevice records that interval iv's block is freed (its copy to the
// host, if any, has landed): the last block of a tensor evicts its device
// copy, or drops activations that the backward has consumed.
func (st *offloadState) offDevice(iv *interval) {
	k := ivKey(iv)
	st.landed(k)
	if st.devRefs[k]--; st.devRefs[k] > 0 {
		return
	}
	delete(st.devRefs, k)
	r, ok := st.table.Get(k)
	switch {
	case !ok || !r.Valid.Has(offload.TierDevice):
	case iv.class == tcActs && iv.evict:
		st.rec(st.table.Evict(k, offload.TierDevice))
	case iv.class == tcActs || iv.class == tcCkpt:
		st.rec(st.table.Drop(k))
	default:
		st.rec(st.table.Evict(k, offload.TierDevice))
	}
}

// Residency is a snapshot of the out-of-core trainer's residency table:
// where each tensor of each layer has a valid copy (nil for a resident
// trainer). Between steps activations have no entries; during a step
// each live one has.
func (t *Trainer) Residency() []offload.Residency {
	if t.off == nil {
		return nil
	}
	return t.off.table.Snapshot()
}

// ResidencyErr is the first residency transition the table refused (a
// bookkeeping bug: the table no longer says where tensors are), or nil.
func (t *Trainer) ResidencyErr() error {
	if t.off == nil {
		return nil
	}
	t.off.tabMu.Lock()
	defer t.off.tabMu.Unlock()
	return t.off.tabErr
}

// hostAlloc returns n zeroed bytes of host state, from the pinned pool
// when there is one (else, or when the pool's budget is spent, Go memory).
func (st *offloadState) hostAlloc(n int64) []byte {
	st.hostBytes += n
	if n <= 0 || st.pool == nil {
		return offload.NewF32Bytes(n)
	}
	pins := st.pool.Stats().Pins
	b, ok, err := st.pool.TryAcquire(n)
	if err != nil || !ok {
		if st.hostPinned {
			why := "its budget is spent"
			if err != nil {
				why = err.Error()
			}
			st.hostPinned = false
			st.hostNote += fmt.Sprintf("; the pool could not hold a buffer of %s (%s): the rest is unpinned",
				kernels.FormatBytes(n), why)
		}
		return offload.NewF32Bytes(n)
	}
	st.hostBufs = append(st.hostBufs, b)
	if st.pool.Stats().Pins == pins {
		clear(b.Bytes()) // reused memory (fresh pins are zeroed)
	}
	return b.Bytes()
}

// openHostPool decides where the host state lives: in a pool of pinned
// memory of o.HostBudget bytes (need when 0), or, when the system cannot
// pin that much (the pool would degrade to a staging ring), in Go memory.
func (st *offloadState) openHostPool(be kernels.Backend, need int64, nbufs int) error {
	o := &st.opts
	budget := o.HostBudget
	if budget <= 0 {
		budget = need + int64(nbufs)*(4<<10) // the pool rounds buffers to pages
	}
	cfg := offload.HostConfig{Budget: max(budget, 1), Pinner: o.HostPinner, ReadLimits: o.HostLimits}
	if cfg.Pinner == nil {
		cfg.Pinner = offload.PinnerFor(be, false)
	}
	kind := "page-locked"
	if mp, ok := cfg.Pinner.(offload.MmapPinner); ok {
		kind = "anonymous mmap off the Go heap, not locked"
		if mp.Lock {
			kind = "anonymous mmap off the Go heap, mlocked"
		}
	}
	d, err := offload.DecideHost(cfg)
	if err != nil || d.Degraded {
		why := d.String()
		if err != nil {
			why = err.Error()
		}
		st.hostNote = fmt.Sprintf("host state (%s) in unpinned Go memory: %s", kernels.FormatBytes(need), why)
		if err == nil {
			if st.stage, err = newStagingRing(cfg); err != nil {
				st.hostNote += fmt.Sprintf("; copies unstaged: %v", err)
				return nil
			}
			st.hostNote += "; copies pass through the staging ring"
		}
		return nil
	}
	if st.pool, err = offload.NewHostPool(cfg); err != nil {
		return err
	}
	st.hostPinned = true
	st.hostNote = fmt.Sprintf("host state (%s) in the host pool (%s); %s", kernels.FormatBytes(need), kind, d)
	return nil
}

// stagingRing is the few pinned buffers of a degraded host pool through
// which the copies of unpinned host state pass: a buffer is reused only
// once the copy that last used it has passed its event.
type stagingRing struct {
	pool *offload.HostPool
	bufs []*offload.HostBuf
	evs  []kernels.Event
	next int
	uses int64 // chunks staged
}

func newStagingRing(cfg offload.HostConfig) (*stagingRing, error) {
	pool, err := offload.NewHostPool(cfg)
	if err != nil {
		return nil, err
	}
	d := pool.Decision()
	r := &stagingRing{pool: pool}
	for range d.StagingBuffers {
		b, ok, err := pool.TryAcquire(d.StagingSize)
		if err != nil || !ok {
			r.close()
			return nil, fmt.Errorf("engine: staging buffer %d of %d: %v", len(r.bufs)+1, d.StagingBuffers, err)
		}
		r.bufs = append(r.bufs, b)
	}
	r.evs = make([]kernels.Event, len(r.bufs))
	return r, nil
}

// take returns the next staging buffer once its last copy has passed.
func (r *stagingRing) take(ctx context.Context) (int, []byte, error) {
	i := r.next
	r.next = (i + 1) % len(r.bufs)
	r.uses++
	if ev := r.evs[i]; ev != nil {
		if err := ev.Synchronize(ctx); err != nil {
			return 0, nil, err
		}
		r.evs[i] = nil
	}
	return i, r.bufs[i].Bytes(), nil
}

// bytes is the pinned memory the ring holds.
func (r *stagingRing) bytes() int64 {
	var n int64
	for _, b := range r.bufs {
		n += int64(len(b.Bytes()))
	}
	return n
}

// close releases the buffers; no queued copy may use them any more.
func (r *stagingRing) close() {
	for _, b := range r.bufs {
		b.Release()
	}
	r.bufs = nil
	_ = r.pool.Close()
}

// copyIn enqueues on s the copy of host state src into dst: directly, or
// chunk by chunk through the staging ring (src is read now).
func (st *offloadState) copyIn(ctx context.Context, be kernels.Backend, s *stream.Stream, name string, dst kernels.Tensor, src []byte) error {
	r := st.stage
	if r == nil {
		return s.Enqueue(name, func(q kernels.Queue) { be.CopyToDevice(q, dst, src) })
	}
	es := int(dst.DType.Size())
	per := len(r.bufs[0].Bytes()) / es
	for off := 0; off < dst.N; off += per {
		n := min(per, dst.N-off)
		i, buf, err := r.take(ctx)
		if err != nil {
			return err
		}
		buf = buf[:n*es]
		copy(buf, src[off*es:(off+n)*es])
		part := kernels.View(dst.Buf, dst.Off+int64(off*es), dst.DType, n)
		if err := s.Enqueue(name, func(q kernels.Queue) { be.CopyToDevice(q, part, buf) }); err != nil {
			return err
		}
		if r.evs[i], err = s.Record(); err != nil {
			return err
		}
	}
	return nil
}

// copyOut enqueues on s the copy of src into host state dst: directly, or
// chunk by chunk through the staging ring, in which case dst is written
// before copyOut returns (it waits for each chunk).
func (st *offloadState) copyOut(ctx context.Context, be kernels.Backend, s *stream.Stream, name string, dst []byte, src kernels.Tensor) error {
	r := st.stage
	if r == nil {
		return s.Enqueue(name, func(q kernels.Queue) { be.CopyToHost(q, dst, src) })
	}
	es := int(src.DType.Size())
	per := len(r.bufs[0].Bytes()) / es
	for off := 0; off < src.N; off += per {
		n := min(per, src.N-off)
		_, buf, err := r.take(ctx)
		if err != nil {
			return err
		}
		buf = buf[:n*es]
		part := kernels.View(src.Buf, src.Off+int64(off*es), src.DType, n)
		if err := s.Enqueue(name, func(q kernels.Queue) { be.CopyToHost(q, buf, part) }); err != nil {
			return err
		}
		ev, err := s.Record()
		if err != nil {
			return err
		}
		if err := ev.Synchronize(ctx); err != nil {
			return err
		}
		copy(dst[off*es:(off+n)*es], buf)
	}
	return nil
}

// HostPinning reports how an out-of-core trainer holds its host state:
// pinned is true when all of it is in the host pool's buffers (page-locked,
// or on the CPU backend anonymous mappings off the Go heap); note says what
// the pool decided and why. A resident trainer returns false, "".
func (t *Trainer) HostPinning() (pinned bool, note string) {
	if t.off == nil {
		return false, ""
	}
	return t.off.hostPinned, t.off.hostNote
}

// NewOffloadTrainer returns a Trainer that keeps the model's state where o
// says and streams it through the device: the same steps, bitwise, as
// NewTrainer's on the CPU backend, within a device budget that need not
// hold the weights, gradients and optimizer state.
func NewOffloadTrainer(be kernels.Backend, m *Model, to TrainerOptions, o OffloadOptions) (t *Trainer, err error) {
	if to.B <= 0 || to.T <= 0 || to.Accum <= 0 {
		return nil, fmt.Errorf("engine: trainer: batch %d, seq %d, accum %d must be positive", to.B, to.T, to.Accum)
	}
	if err := o.validate(m); err != nil {
		return nil, err
	}
	o.Prefetch = max(o.Prefetch, 1)
	st := &offloadState{opts: o, table: offload.NewTable(), devRefs: map[offload.Key]int{}}
	st.cache = offload.NewCache(be, offload.CacheConfig{Limit: o.DeviceBudget, Whole: true})
	t = &Trainer{be: be, model: m, opts: to, lossMul: 1, off: st}
	t.Scaler = NewLossScaler(m.DType, to.LossScale, to.ScaleWindow)
	defer func() {
		if err != nil {
			t.Close()
			t = nil
		}
	}()
	if st.streams, err = stream.NewSet(be, o.Recorder); err != nil {
		return t, err
	}
	t.q = st.streams.Compute.Queue()
	if o.Optimizer == offload.TierDisk {
		if st.disk, err = offload.OpenDisk(offload.DiskConfig{Dir: o.DiskDir, Budget: o.DiskBudget}); err != nil {
			return t, err
		}
	}
	n := len(m.Layers)
	t.st = &StateTable{Layers: make([]LayerState, n)}
	fixed := func(nb int64, cl offload.Class) kernels.Buffer {
		if err != nil {
			return nil
		}
		var b *offload.Block
		if b, err = st.cache.Alloc(max(nb, 1), cl); err != nil {
			return nil
		}
		st.fixed = append(st.fixed, b)
		st.fixedBytes += roundBlock(nb)
		return b.Buffer()
	}
	tensor := func(nel int, dt kernels.DType) kernels.Tensor {
		b := fixed(int64(nel)*int64(dt.Size()), offload.Workspace)
		if b == nil {
			return kernels.Tensor{}
		}
		return kernels.View(b, 0, dt, nel)
	}
	B, T := to.B, to.T
	p := &Pass{Ops: be, Model: m, Table: t.st, B: B, T: T}
	t.pass = p
	var scratch, grad int64
	for _, l := range m.Layers {
		scratch = max(scratch, l.ScratchBytes(B, T))
		grad = max(grad, int64(l.OutputElems(B, T))*int64(m.DType.Size()))
	}
	p.Scratch = fixed(scratch, offload.Workspace)
	p.grad[0] = fixed(grad, offload.Workspace)
	p.grad[1] = fixed(grad, offload.Workspace)
	t.allocIO(m, p, B, T, tensor)
	t.stats = tensor(2*n, kernels.F32)
	if err != nil {
		return t, fmt.Errorf("engine: allocating trainer buffers: %w", err)
	}
	// Host state, in the pinned pool when it fits.
	hostNeed := byteClasses(OffloadHostBytes(m, B, T, o)).total()
	if err = st.openHostPool(be, hostNeed, 8*n+2); err != nil {
		return t, err
	}
	st.host = make([]hostLayer, n)
	for i, l := range m.Layers {
		h := &st.host[i]
		np := int64(l.NumParams())
		h.master = st.hostAlloc(4 * np)
		h.weights = h.master
		cb := np * int64(m.DType.Size())
		if m.DType != kernels.F32 || o.DelayedUpdate {
			h.weights = st.hostAlloc(cb)
		}
		h.grads = st.hostAlloc(cb)
		if o.DelayedUpdate {
			h.spareW, h.spareG = st.hostAlloc(cb), st.hostAlloc(cb)
		}
		optTier := offload.TierHost
		if st.disk != nil {
			optTier = offload.TierDisk
			for _, cl := range []offload.Class{offload.AdamM, offload.AdamV} {
				if err = st.disk.Create(offload.Key{Layer: i, Class: cl}, 4*np); err != nil {
					return t, err
				}
			}
		} else {
			h.m, h.v = st.hostAlloc(4*np), st.hostAlloc(4*np)
		}
		h.done = make(chan struct{})
		close(h.done)
		// The residency table records every class of the layer; the
		// executor moves the weights, gradients and activations.
		for _, e := range []struct {
			cl offload.Class
			n  int64
			at offload.Tier
		}{
			{offload.Weights, cb, offload.TierHost},
			{offload.Master, 4 * np, offload.TierHost},
			{offload.Grads, cb, offload.TierHost},
			{offload.AdamM, 4 * np, optTier},
			{offload.AdamV, 4 * np, optTier},
		} {
			if err = st.table.Add(offload.Key{Layer: i, Class: e.cl}, e.n, e.at); err != nil {
				return t, err
			}
		}
	}
	inBytes := p.Input.N * 4
	st.hbs = make([]HostBatch, to.Accum)
	st.losses = make([][]byte, to.Accum)
	for k := range st.hbs {
		st.hbs[k] = HostBatch{Input: make([]byte, inBytes), Targets: make([]byte, p.Targets.Bytes())}
		st.losses[k] = make([]byte, p.Losses.Bytes())
	}
	t.hb = HostBatch{Input: make([]byte, inBytes), Targets: make([]byte, p.Targets.Bytes())}
	t.lossHost = make([]byte, p.Losses.Bytes())
	st.statBuf = make([]byte, 8*n)
	st.train = buildSchedule(m, &st.opts, B, T, to.Accum, true)
	st.eval = buildSchedule(m, &st.opts, B, T, 1, false)
	// Offloaded activations: one host buffer per layer, shared by the
	// micro-batches (micro-batch k+1's copy out follows k's copy back,
	// through the backward that waits for it).
	actHost := map[int][]byte{}
	for _, iv := range st.train.ivs {
		if iv.class == tcActs && iv.evict {
			if actHost[iv.layer] == nil {
				actHost[iv.layer] = st.hostAlloc(4 * actElems(iv))
			}
			iv.host = actHost[iv.layer]
		}
	}
	for _, iv := range st.train.ivs {
		if iv.src != nil {
			iv.host = iv.src.host
		}
	}
	work := make(chan func(), n)
	st.work = work
	for range max(1, runtime.GOMAXPROCS(0)) {
		go func() {
			for fn := range work {
				fn()
				// Let the goroutine driving the schedule run: with as
				// many workers as processors and a full queue it would
				// otherwise wait for preemption to enqueue the compute.
				runtime.Gosched()
			}
		}()
	}
	// Persistent tensors are allocated now, for good, and shared by the
	// training and evaluation schedules.
	resident := map[[2]int]*offload.Block{}
	for _, iv := range st.train.ivs {
		if iv.persistent {
			if iv.block, err = st.cache.Alloc(iv.bytes, ivClass(iv)); err != nil {
				return t, fmt.Errorf("engine: allocating resident %s: %w", ivClass(iv), err)
			}
			resident[[2]int{iv.layer, iv.class}] = iv.block
		}
	}
	for _, iv := range st.eval.ivs {
		if iv.persistent {
			iv.block = resident[[2]int{iv.layer, iv.class}]
		}
	}
	return t, nil
}

// actElems is the activation interval's size in float32 words (the
// activations are copied to the host as raw words).
func actElems(iv *interval) int64 { return (iv.bytes + 3) / 4 }

// actView is an offloaded activation block as raw float32 words.
func actView(iv *interval) kernels.Tensor {
	return kernels.View(iv.block.Buffer(), 0, kernels.F32, int(actElems(iv)))
}

func ivClass(iv *interval) offload.Class {
	switch iv.class {
	case tcWeights:
		return offload.Weights
	case tcGrads:
		return offload.Grads
	}
	return offload.Activations
}

// PredictedDevicePeak is the device memory the trainer's schedule holds at
// most (live blocks, as offload.CacheStats.PeakAllocated counts them),
// computed from the schedule before it runs.
func (t *Trainer) PredictedDevicePeak() int64 {
	if t.off == nil {
		return 0
	}
	return t.off.fixedBytes + max(t.off.train.peak(), t.off.eval.peak())
}

// Cache is the device cache of an out-of-core trainer (nil otherwise).
func (t *Trainer) Cache() *offload.Cache {
	if t.off == nil {
		return nil
	}
	return t.off.cache
}

// HostBytes is the host memory an out-of-core trainer holds for layer
// state (0 for a resident one).
func (t *Trainer) HostBytes() int64 {
	if t.off == nil {
		return 0
	}
	return t.off.hostBytes
}

func (st *offloadState) close(be kernels.Backend) {
	for i := range st.host {
		if st.host[i].done != nil {
			<-st.host[i].done
		}
	}
	if st.work != nil {
		close(st.work)
		st.work = nil
	}
	if st.streams != nil {
		_ = st.streams.Synchronize(context.Background())
		st.streams.Close()
	}
	freed := map[*offload.Block]bool{}
	for _, s := range []*schedule{st.train, st.eval} {
		if s == nil {
			continue
		}
		for _, iv := range s.ivs {
			if iv.block != nil && !freed[iv.block] {
				freed[iv.block] = true
				st.cache.Free(iv.block)
			}
			iv.block = nil
		}
	}
	for _, b := range st.fixed {
		st.cache.Free(b)
	}
	st.fixed = nil
	_ = st.cache.Close()
	if st.disk != nil {
		_ = st.disk.Close()
	}
	// No copy or update uses the host state any more.
	if st.stage != nil {
		st.stage.close()
		st.stage = nil
	}
	for _, b := range st.hostBufs {
		b.Release()
	}
	st.hostBufs, st.host = nil, nil
	if st.pool != nil {
		_ = st.pool.Close()
		st.pool = nil
	}
}

// waitUpdates waits for the host optimizer of the last step.
func (st *offloadState) waitUpdates() error {
	var errs []error
	for i := range st.host {
		if err := st.waitLayer(context.Background(), i); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// waitLayer waits for layer i's update and makes the weights it wrote
// (DelayedUpdate) the ones fetches read. It runs on the goroutine that
// drives the trainer.
func (st *offloadState) waitLayer(ctx context.Context, i int) error {
	h := &st.host[i]
	select {
	case <-h.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	if h.next != nil {
		h.weights, h.spareW, h.next = h.next, h.weights, nil
		k := offload.Key{Layer: i, Class: offload.Weights}
		if r, _ := st.table.Get(k); r.Valid.Has(offload.TierDevice) {
			_ = st.table.Modified(k, offload.TierHost) // the device copy is stale
		}
	}
	return h.err
}

// run executes schedule s: it uploads micro-batch k from st.hbs[k] at the
// start of its forward, copies its losses to st.losses[k] and, when
// training, records the gradient statistics of each layer when its
// gradients are final. On return every queue has finished.
func (t *Trainer) runSchedule(ctx context.Context, s *schedule, train bool) (err error) {
	st := t.off
	ss := st.streams
	m := t.model
	be := t.be
	var pending []*interval // ended, to free at the next iteration
	var pendEv []kernels.Event
	var landAtEnd []offload.Key // copies of resident gradients to the host
	defer func() {
		if err != nil {
			_ = ss.Synchronize(context.Background())
			for _, k := range landAtEnd {
				st.landed(k)
			}
			for _, iv := range s.ivs {
				if iv.block != nil && !iv.persistent {
					st.offDevice(iv) // the queues are idle
					st.cache.Free(iv.block)
					iv.block = nil
				}
			}
		}
	}()
	allocate := func(iv *interval) error {
		if iv.block == nil {
			b, err := st.cache.Alloc(iv.bytes, ivClass(iv))
			if err != nil {
				return fmt.Errorf("engine: layer %s: %w\n%s", m.Layers[iv.layer].Name(), err, st.cache.MemorySummary())
			}
			iv.block = b
		}
		h := &st.host[iv.layer]
		iv.fetchEv = nil
		if iv.class != tcWeights && iv.class != tcGrads {
			if iv.src == nil { // offloaded ones are recorded by fetchActs
				st.onDevice(iv, false)
			}
			return nil
		}
		view := iv.view(m)
		switch {
		case iv.zero:
			be.Zero(ss.Compute.Queue(), view)
			st.onDevice(iv, false)
		case iv.fetch && iv.class == tcWeights:
			// Resident weights are fetched only when the host optimizer
			// has updated them (the residency table says the device copy
			// is stale); streamed ones at every interval.
			k := offload.Key{Layer: iv.layer, Class: offload.Weights}
			if r, _ := st.table.Get(k); iv.persistent && r.Valid.Has(offload.TierDevice) {
				return nil
			}
			// Wait until the host optimizer has updated the layer, except
			// with delayed updates, which run during this step and write
			// the other buffer.
			if !st.opts.DelayedUpdate {
				if err := st.waitLayer(ctx, iv.layer); err != nil {
					return err
				}
			}
			if err := st.copyIn(ctx, be, ss.H2D, "fetch w "+m.Layers[iv.layer].Name(), view, h.weights); err != nil {
				return err
			}
			st.onDevice(iv, true)
			ev, err := ss.H2D.Record()
			if err != nil {
				return err
			}
			iv.fetchEv = ev
		case iv.fetch: // accumulated gradients
			if h.gradEv != nil {
				if err := ss.H2D.Wait(h.gradEv); err != nil {
					return err
				}
			}
			if err := st.copyIn(ctx, be, ss.H2D, "fetch g "+m.Layers[iv.layer].Name(), view, h.grads); err != nil {
				return err
			}
			st.onDevice(iv, true)
			ev, err := ss.H2D.Record()
			if err != nil {
				return err
			}
			iv.fetchEv = ev
		}
		return nil
	}
	// fetchActs brings offloaded activations back, after their copy out.
	fetchActs := func(iv *interval) error {
		if err := ss.H2D.Wait(iv.src.evictEv); err != nil {
			return err
		}
		view := actView(iv)
		if err := st.copyIn(ctx, be, ss.H2D, "fetch acts "+m.Layers[iv.layer].Name(), view, iv.host); err != nil {
			return err
		}
		st.onDevice(iv, true)
		ev, err := ss.H2D.Record()
		iv.fetchEv = ev
		return err
	}
	release := func(before int) error {
		keep, keepEv := 0, 0
		for i, iv := range pending {
			if iv.end >= before {
				pending[keep], pendEv[keepEv] = iv, pendEv[i]
				keep, keepEv = keep+1, keepEv+1
				continue
			}
			if err := pendEv[i].Synchronize(ctx); err != nil {
				return err
			}
			st.offDevice(iv)
			st.cache.Free(iv.block)
			iv.block = nil
		}
		pending, pendEv = pending[:keep], pendEv[:keepEv]
		return nil
	}
	allocate0 := allocate
	allocate = func(iv *interval) error {
		if err := allocate0(iv); err != nil {
			return err
		}
		if iv.class == tcActs && iv.src != nil {
			return fetchActs(iv)
		}
		return nil
	}
	for _, iv := range s.allocs[0] {
		if err := allocate(iv); err != nil {
			return err
		}
	}
	for j, a := range s.acc {
		if err := ctx.Err(); err != nil {
			return err
		}
		l := m.Layers[a.layer]
		p := t.pass
		// Bind the tensors of this access into the state table.
		for _, iv := range s.uses[j] {
			ls := &t.st.Layers[iv.layer]
			switch iv.class {
			case tcWeights:
				ls.Weights = iv.view(m)
			case tcGrads:
				ls.Grads = iv.view(m)
			case tcActs:
				ls.Acts = iv.block.Buffer()
			case tcCkpt:
				if !(a.kind == accFwd && a.layer == iv.layer+1) { // F(l+1) reads the full acts
					ls.Acts = iv.block.Buffer()
				}
			}
			if iv.fetchEv != nil {
				if err := ss.Compute.Wait(iv.fetchEv); err != nil {
					return err
				}
				iv.fetchEv = nil
			}
		}
		if a.kind == accFwd && a.layer == 0 {
			hb := &st.hbs[a.mb]
			if err := ss.Compute.Enqueue("upload", func(q kernels.Queue) { t.upload(hb) }); err != nil {
				return err
			}
		}
		name := [...]string{"fwd ", "recompute ", "bwd "}[a.kind] + l.Name()
		err := ss.Compute.Enqueue(name, func(q kernels.Queue) {
			switch a.kind {
			case accFwd, accRec:
				l.Forward(q, p, a.layer)
			case accBwd:
				n := len(m.Layers)
				if a.layer == n-1 {
					st.cur = 0
				}
				i := a.layer
				if i > 0 {
					ne := m.Layers[i-1].OutputElems(p.B, p.T)
					p.DIn = kernels.View(p.grad[st.cur], 0, m.DType, ne)
				} else {
					p.DIn = kernels.Tensor{}
				}
				l.Backward(q, p, i)
				p.DOut = p.DIn
				st.cur ^= 1
				if i == 0 {
					p.DOut, p.DIn = kernels.Tensor{}, kernels.Tensor{}
				}
			}
			if a.kind == accFwd && a.layer == len(m.Layers)-1 {
				be.CopyToHost(q, st.losses[a.mb], p.Losses)
			}
			for _, iv := range s.uses[j] {
				if iv.class == tcCkpt && iv.start == j {
					out := kernels.View(t.st.Layers[iv.layer].Acts, 0, m.DType, m.Layers[iv.layer].OutputElems(p.B, p.T))
					be.CopyDevice(q, kernels.View(iv.block.Buffer(), 0, m.DType, out.N), out)
				}
				if iv.end == j && iv.final && train {
					g := iv.view(m)
					be.SumSquares(q, t.stats.Slice(2*iv.layer, 1), g)
					be.CheckFinite(q, t.stats.Slice(2*iv.layer+1, 1), g)
				}
			}
		})
		if err != nil {
			return err
		}
		ev, err := ss.Compute.Record()
		if err != nil {
			return err
		}
		// Tensors whose residency ends here: gradients go to the host.
		for _, iv := range s.ends[j+1] {
			done := ev
			if iv.evict && iv.class == tcActs {
				if err := ss.D2H.Wait(ev); err != nil {
					return err
				}
				view := actView(iv)
				st.rec(st.table.BeginCopy(ivKey(iv), offload.TierDevice, offload.TierHost))
				if err := st.copyOut(ctx, be, ss.D2H, "evict acts "+m.Layers[iv.layer].Name(), iv.host, view); err != nil {
					return err
				}
				if done, err = ss.D2H.Record(); err != nil {
					return err
				}
				iv.evictEv = done
			} else if iv.evict && train {
				if err := ss.D2H.Wait(ev); err != nil {
					return err
				}
				view, h := iv.view(m), &st.host[iv.layer]
				// The backward wrote the gradients on the device; they
				// go back to the host.
				k := ivKey(iv)
				st.rec(st.table.Modified(k, offload.TierDevice))
				st.rec(st.table.BeginCopy(k, offload.TierDevice, offload.TierHost))
				if iv.persistent {
					landAtEnd = append(landAtEnd, k)
				}
				if err := st.copyOut(ctx, be, ss.D2H, "evict g "+m.Layers[iv.layer].Name(), h.grads, view); err != nil {
					return err
				}
				if done, err = ss.D2H.Record(); err != nil {
					return err
				}
				h.gradEv = done
				if iv.final && st.eager != nil {
					t.launchUpdate(ctx, iv.layer, *st.eager, true)
					st.launched++
				}
			}
			if !iv.persistent {
				pending = append(pending, iv)
				pendEv = append(pendEv, done)
			}
		}
		// Free what ended at the previous access, then prefetch.
		if err := release(j); err != nil {
			return err
		}
		for _, iv := range s.allocs[j+1] {
			if err := allocate(iv); err != nil {
				return err
			}
		}
		if st.accessHook != nil {
			st.accessHook(j)
		}
	}
	if err := release(len(s.acc)); err != nil {
		return err
	}
	if err := ss.Synchronize(ctx); err != nil {
		return err
	}
	for _, k := range landAtEnd {
		st.landed(k)
	}
	return nil
}

// view is the interval's block as the tensor of its class.
func (iv *interval) view(m *Model) kernels.Tensor {
	n := m.Layers[iv.layer].NumParams()
	return kernels.View(iv.block.Buffer(), 0, m.DType, n)
}

// offloadStep is TrainStep for an out-of-core trainer.
//
// Without gradient clipping, fp16 loss scaling or DelayedUpdate, each
// layer's host AdamW starts as soon as its final gradients have landed on
// the host, overlapped with the backward of the layers before it
// (ZeRO-Offload); the arithmetic is the resident trainer's. Such an eager
// update checks its layer's gradients first and leaves a layer whose
// gradients are not finite unchanged, but it cannot wait for the other
// layers' verdict: a step with non-finite gradients reports Skipped, as
// the resident trainer does, yet the layers whose gradients were finite
// have been updated. Otherwise the updates wait for the global norm, which
// is ready when the last backward is done (each layer's sum of squares is
// taken on the device as its gradients become final), and start in layer
// order, the order the next forward fetches them in.
func (t *Trainer) offloadStep(ctx context.Context, src BatchSource) (StepResult, error) {
	st := t.off
	o := t.opts
	r := StepResult{LR: o.Schedule.At(t.Step), LossScale: t.Scaler.Scale}
	for k := range st.hbs {
		if err := src.Next(ctx, &st.hbs[k]); err != nil {
			return r, err
		}
	}
	hp := kernels.AdamWParams{
		LR: float32(r.LR), Beta1: float32(o.Beta1), Beta2: float32(o.Beta2), Eps: float32(o.Eps),
		Step: t.Step + 1, WeightDecay: float32(o.WeightDecay),
	}
	st.eager = nil
	if o.GradClip <= 0 && !t.Scaler.Enabled && !st.opts.DelayedUpdate {
		e := hp
		e.GradScale = float32(1 / r.LossScale)
		st.eager = &e
	}
	// Zero the gradient statistics; the weights of each layer are fetched
	// once its last update is done (allocate).
	t.pass.LossGrad = float32(t.lossMul * t.Scaler.Scale / float64(t.TokensPerStep()))
	t.be.Zero(t.q, t.stats)
	eager := st.eager != nil
	st.launched = 0
	err := t.runSchedule(ctx, st.train, true)
	st.eager = nil
	if st.launched > 0 {
		// Updates have started: the step counts, whatever happens next.
		t.Step++
	}
	if err != nil {
		return r, err
	}
	if st.opts.DelayedUpdate {
		// The update of the last step ran during this one.
		if err := st.waitUpdates(); err != nil {
			return r, err
		}
	}
	var sum float64
	for k := range st.losses {
		var s float64
		for i := 0; i < t.nLoss; i++ {
			s += float64(math.Float32frombits(binary.LittleEndian.Uint32(st.losses[k][4*i:])))
		}
		sum += s * t.lossMul
	}
	r.Loss = sum / float64(t.TokensPerStep())
	t.be.CopyToHost(t.q, st.statBuf, t.stats)
	if err := t.q.Synchronize(ctx); err != nil {
		return r, err
	}
	var ss float32
	nonFinite := false
	for i := range t.model.Layers {
		ss += math.Float32frombits(binary.LittleEndian.Uint32(st.statBuf[8*i:]))
		nonFinite = nonFinite || math.Float32frombits(binary.LittleEndian.Uint32(st.statBuf[8*i+4:])) != 0
	}
	sumsq := float64(ss)
	overflow := nonFinite || math.IsNaN(sumsq) || math.IsInf(sumsq, 0)
	r.GradNorm = math.Sqrt(sumsq) / t.Scaler.Scale
	if overflow {
		r.GradNorm = math.Inf(1)
	}
	r.Skipped = t.Scaler.Update(overflow)
	if eager { // the updates are running
		return r, nil
	}
	t.Step++
	if r.Skipped {
		return r, nil
	}
	coef := 1.0
	if o.GradClip > 0 && r.GradNorm > o.GradClip {
		coef = o.GradClip / r.GradNorm
	}
	hp.GradScale = float32(coef / r.LossScale)
	for i := range st.host {
		t.launchUpdate(ctx, i, hp, false)
	}
	return r, nil
}

// launchUpdate queues the host optimizer of layer i with hp, after the
// layer's previous update; the next fetch of its weights waits for it.
// eager updates wait for the copy of the gradients to the host and skip a
// layer whose gradients are not finite. With DelayedUpdate the update
// writes the spare weights buffer and the next evictions land in the
// spare gradients buffer.
func (t *Trainer) launchUpdate(ctx context.Context, i int, hp kernels.AdamWParams, eager bool) {
	st := t.off
	h := &st.host[i]
	<-h.done
	grads, out := h.grads, h.weights
	switch {
	case st.opts.DelayedUpdate:
		out, h.next = h.spareW, h.spareW
		h.spareW = nil
		h.grads, h.spareG = h.spareG, h.grads
	case t.model.DType == kernels.F32:
		out = nil // the weights are the master
	}
	done := make(chan struct{})
	h.done, h.err, h.nonFinite = done, nil, false
	// The update writes the master, the moments and (in place, or with
	// DelayedUpdate once waitLayer swaps the buffers) the weights on the
	// host: any device copy of the weights is stale.
	for _, cl := range []offload.Class{offload.Weights, offload.Master, offload.AdamM, offload.AdamV} {
		k := offload.Key{Layer: i, Class: cl}
		if r, _ := st.table.Get(k); r.Valid.Has(offload.TierHost) {
			st.rec(st.table.Modified(k, offload.TierHost))
		}
	}
	gradEv := h.gradEv
	st.work <- func() {
		defer close(done)
		if eager && gradEv != nil {
			if h.err = gradEv.Synchronize(ctx); h.err != nil {
				return
			}
			if !offload.HostFinite(grads, t.model.DType) {
				h.nonFinite = true
				return
			}
		}
		end := st.opts.Recorder.Begin("optimizer", stream.Optimizer, "adamw "+t.model.Layers[i].Name())
		h.err = t.updateLayer(ctx, i, hp, grads, out)
		end()
	}
}

// updateLayer is AdamW on layer i's host state with gradients grads,
// writing the compute-dtype weights to out (nil: the master is the
// compute copy).
func (t *Trainer) updateLayer(ctx context.Context, i int, hp kernels.AdamWParams, grads, out []byte) error {
	st := t.off
	h := &st.host[i]
	l := t.model.Layers[i]
	dt := t.model.DType
	mb, vb := h.m, h.v
	if st.disk != nil {
		np := int64(l.NumParams())
		mb, vb = offload.NewF32Bytes(4*np), offload.NewF32Bytes(4*np)
		km, kv := offload.Key{Layer: i, Class: offload.AdamM}, offload.Key{Layer: i, Class: offload.AdamV}
		st.rec(errors.Join(st.table.BeginCopy(km, offload.TierDisk, offload.TierHost), st.table.BeginCopy(kv, offload.TierDisk, offload.TierHost)))
		err := errors.Join(st.disk.Load(ctx, km, mb).Wait(ctx), st.disk.Load(ctx, kv, vb).Wait(ctx))
		if err != nil {
			st.rec(errors.Join(st.table.AbortCopy(km), st.table.AbortCopy(kv)))
			return fmt.Errorf("engine: host optimizer, layer %s: %w", l.Name(), err)
		}
		st.rec(errors.Join(st.table.EndCopy(km), st.table.EndCopy(kv)))
	}
	master, m, v := offload.F32s(h.master), offload.F32s(mb), offload.F32s(vb)
	es := int(dt.Size())
	for _, ps := range l.Params() {
		p := hp
		if !ps.Decay {
			p.WeightDecay = 0
		}
		lo, hi := ps.Offset, ps.Offset+ps.Elems()
		var o []byte
		if out != nil {
			o = out[lo*es : hi*es]
		}
		if err := offload.HostAdamW(master[lo:hi], grads[lo*es:hi*es], dt, m[lo:hi], v[lo:hi], o, dt, p); err != nil {
			return err
		}
	}
	if st.disk != nil {
		km, kv := offload.Key{Layer: i, Class: offload.AdamM}, offload.Key{Layer: i, Class: offload.AdamV}
		// Written on the host, stored back, and the host copy freed.
		for _, k := range []offload.Key{km, kv} {
			st.rec(errors.Join(st.table.Modified(k, offload.TierHost), st.table.BeginCopy(k, offload.TierHost, offload.TierDisk)))
		}
		err := errors.Join(st.diskStore(ctx, km, mb), st.diskStore(ctx, kv, vb))
		for _, k := range []offload.Key{km, kv} {
			if err != nil {
				// The files may be torn: the host copy, dropped with mb
				// and vb, was the only good one.
				st.rec(st.table.AbortCopy(k))
				continue
			}
			st.rec(errors.Join(st.table.EndCopy(k), st.table.Evict(k, offload.TierHost)))
		}
		if err != nil {
			return fmt.Errorf("engine: host optimizer, layer %s: %w", l.Name(), err)
		}
	}
	return nil
}

// diskStore writes an optimizer file of the disk tier (through
// st.storeHook when a test sets one).
func (st *offloadState) diskStore(ctx context.Context, k offload.Key, b []byte) error {
	if st.storeHook != nil {
		if err := st.storeHook(k); err != nil {
			return err
		}
	}
	return st.disk.Store(ctx, k, b).Wait(ctx)
}

// offloadMicroLoss runs one forward pass over hb through the eval schedule.
func (t *Trainer) offloadMicroLoss(ctx context.Context, hb *HostBatch) (float64, error) {
	st := t.off
	if err := st.waitUpdates(); err != nil {
		return 0, err
	}
	hb0 := st.hbs[0]
	st.hbs[0] = *hb
	defer func() { st.hbs[0] = hb0 }()
	if err := t.runSchedule(ctx, st.eval, false); err != nil {
		return 0, err
	}
	var s float64
	for i := 0; i < t.nLoss; i++ {
		s += float64(math.Float32frombits(binary.LittleEndian.Uint32(st.losses[0][4*i:])))
	}
	return s * t.lossMul / float64(t.nLoss), nil
}

// setHostMaster stores a layer's fp32 master weights (and the compute
// copy, rounded as the device Cast rounds) in host memory.
func (t *Trainer) setHostMaster(i int, data []byte) error {
	st := t.off
	if err := st.waitUpdates(); err != nil {
		return err
	}
	h := &st.host[i]
	copy(h.master, data)
	switch {
	case t.model.DType == kernels.F32:
		if len(h.weights) > 0 && &h.weights[0] != &h.master[0] {
			copy(h.weights, data)
		}
	default:
		m := offload.F32s(h.master)
		for lo := 0; lo < len(m); lo += 4096 {
			hi := min(lo+4096, len(m))
			offloadStore(h.weights, t.model.DType, lo, m[lo:hi])
		}
	}
	for _, cl := range []offload.Class{offload.Weights, offload.Master} {
		k := offload.Key{Layer: i, Class: cl}
		if r, _ := st.table.Get(k); r.Valid.Has(offload.TierHost) {
			if err := st.table.Modified(k, offload.TierHost); err != nil {
				return err
			}
		}
	}
	return nil
}

// offloadStore rounds s into host array b of dtype dt at element lo.
func offloadStore(b []byte, dt kernels.DType, lo int, s []float32) {
	es := dt.Size()
	for i, x := range s {
		var h uint16
		if dt == kernels.BF16 {
			h = kernels.BF16FromF32(x)
		} else {
			h = kernels.F16FromF32(x)
		}
		binary.LittleEndian.PutUint16(b[(lo+i)*es:], h)
	}
}

// hostOptim returns copies of layer i's master, m and v (fp32 bytes).
func (t *Trainer) hostOptim(ctx context.Context, i int) (master, m, v []byte, err error) {
	st := t.off
	if err := st.waitUpdates(); err != nil {
		return nil, nil, nil, err
	}
	h := &st.host[i]
	master = append([]byte(nil), h.master...)
	if st.disk == nil {
		return master, append([]byte(nil), h.m...), append([]byte(nil), h.v...), nil
	}
	m, v = offload.NewF32Bytes(int64(len(master))), offload.NewF32Bytes(int64(len(master)))
	err = errors.Join(st.disk.Load(ctx, offload.Key{Layer: i, Class: offload.AdamM}, m).Wait(ctx),
		st.disk.Load(ctx, offload.Key{Layer: i, Class: offload.AdamV}, v).Wait(ctx))
	return master, m, v, err
}

// setHostOptim stores layer i's moments.
func (t *Trainer) setHostOptim(ctx context.Context, i int, m, v []byte) error {
	st := t.off
	if err := st.waitUpdates(); err != nil {
		return err
	}
	h := &st.host[i]
	if st.disk == nil {
		copy(h.m, m)
		copy(h.v, v)
		return nil
	}
	return errors.Join(st.disk.Store(ctx, offload.Key{Layer: i, Class: offload.AdamM}, m).Wait(ctx),
		st.disk.Store(ctx, offload.Key{Layer: i, Class: offload.AdamV}, v).Wait(ctx))
}
