package engine

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"

	"golang.org/x/sync/errgroup"

	"github.com/spill-ml/spill/kernels"
	"github.com/spill-ml/spill/kernels/cpu"
	"github.com/spill-ml/spill/offload"
	"github.com/spill-ml/spill/offload/exec"
	"github.com/spill-ml/spill/offload/plan"
	"github.com/spill-ml/spill/stream"
)

// hostLayer is a layer's state in host memory.
type hostLayer struct {
	master []byte // fp32 (nil when on disk)
	// weights is the compute-dtype copy that fetches read: the same
	// memory as master in fp32 runs without DelayedUpdate.
	weights []byte
	grads   []byte        // compute dtype landing buffer of the evictions
	m, v    []byte        // fp32 moments (nil when on disk)
	gradEv  kernels.Event // the copy of the step's final grads to the host
	// DelayedUpdate: the second weights and grads buffers. An update in
	// flight writes next (taken from spareW); waiting for it makes next
	// the weights the fetches read.
	spareW, spareG, next []byte
	// Speculate: the second copy of the layer's state the speculative
	// update writes (sMaster is the weights too in fp32, as master is),
	// whether the running step's update of the layer is speculative
	// (spec) and whether it is to be kept (keep: the copies swap when the
	// update is waited for, in waitLayer).
	sMaster, sWeights, sM, sV []byte
	spec, keep                bool

	done      chan struct{}
	err       error // the update's error, valid after done
	nonFinite bool  // eager update: the grads were not finite, nothing changed

	// The disk tier: the moments (and with DiskMaster the master) read
	// ahead for the queued update (buf, valid once loaded is closed, with
	// loadErr) and the write-back of the last update (stored closed when
	// it has finished, with storeErr).
	loaded, stored    chan struct{}
	buf               *diskBuf
	loadErr, storeErr error
}

// diskBuf holds one layer's state read from the disk tier, aligned for
// direct I/O: the moments and, with DiskMaster, the master (else nil).
type diskBuf struct{ m, v, master []byte }

// diskBuffers is how many layers' state the disk tier holds in host
// memory at once (plan.DiskBuffers).
const diskBuffers = plan.DiskBuffers

// hostState is the host side of an out-of-core trainer: the master
// weights, compute-dtype weights, gradient landing buffer and Adam moments
// (in RAM or on the disk tier) of every layer whose optimizer state is not
// on the device, the host memory they live in, and the host optimizer that
// updates them; and the device optimizer of the other layers (devState).
// It implements exec.Host. This file holds its memory and the access to
// its state; ooc_hostopt.go the host optimizer, ooc_disk.go the disk
// tier's read-ahead and write-back.
type hostState struct {
	m     *Model
	opts  *OffloadOptions
	table *offload.Table
	disk  *offload.Disk
	rec   *stream.Recorder
	host  []hostLayer
	tier  []offload.Tier // each layer's optimizer tier
	// mdisk: the disk layers' masters are on disk too (DiskMaster).
	mdisk bool
	dev   devState
	// The disk tier's pipeline: ahead queues the layers whose moments
	// the reader loads, in the order their updates are queued; bufs are
	// the free buffers; diskErr is the first failed write-back (after
	// which the moments on disk are not trusted).
	ahead   chan int
	bufs    chan *diskBuf
	diskMu  sync.Mutex
	diskErr error
	// work runs host optimizer updates one at a time, in the order they
	// are queued (the order the layers' gradients become final); each
	// update spreads over the cores itself.
	work chan func()
	// eager is the update of the running step when each layer's update
	// starts as soon as its gradients land (no clipping, no fp16 loss
	// scaling, no DelayedUpdate); nil when updates wait for the global
	// gradient norm.
	eager    *kernels.AdamWParams
	launched int // eager updates launched in the running step
	// spec is the update of the running step that speculative updates
	// (OffloadOptions.Speculate) assume: the gradients not clipped; nil
	// when there are none.
	spec *kernels.AdamWParams
	// specKept and specDropped count the speculative layer updates kept
	// and dropped so far.
	specKept, specDropped int
	// storeHook, if set, runs before each write of the disk tier and may
	// fail it (tests inject write failures).
	storeHook func(k offload.Key) error

	// Host memory: the pool and its slabs when the state is pinned.
	bytes  int64 // state bytes handed out
	pool   *offload.HostPool
	slabs  []*offload.HostBuf
	plain  []offload.HostMemory // the slabs of what only the host uses
	pinned bool
	note   string
	stage  *exec.Staging // the ring of a degraded pool, else nil
	slots  [][]byte      // host slots of offloaded activations, not yet handed out
	diskRW int64         // bytes the disk tier read and wrote (guarded by mu)
	mu     sync.Mutex
	tabErr error
}

// devState is the device side of the layers whose optimizer state is on
// the device: the backend, the compute queue and the executor holding
// their persistent blocks. mu serialises the enqueues of the checkpoint
// and initialisation paths, which may come from several goroutines.
type devState struct {
	be kernels.Backend
	q  kernels.Queue
	ex *exec.Executor
	mu sync.Mutex
	// stage holds the buffers the fp32 masters of device layers are
	// filled in on the host (setDeviceMaster): at most stageN of them,
	// each as large as the largest device layer's, reused rather than
	// left to the garbage collector (whose heap may grow to twice what is
	// live), and dropped by dropStage once the masters are set.
	stage          chan []byte
	stageN, staged int
}

// devStageBytes bounds the host memory of the device layers' masters
// being filled (at least one layer's).
const devStageBytes = 2 << 30

// pinWorkers is how many slabs are pinned at once.
const pinWorkers = 4

// hostSlab is the largest pinned allocation the host state asks for: few
// large pins, not one per tensor.
const hostSlab = 1 << 30

// hostAlign is the alignment of each tensor within a slab.
const hostAlign = 256

// hostRequest is one host tensor of the host state: n bytes at an offset
// aligned to align within its slab. dma marks the tensors that copies to
// and from the device read or write (compute-dtype weights, gradients,
// activation slots), which are pinned; the others (fp32 masters that are
// not also the weights, Adam moments, the disk tier's buffers) only the
// host reads, and pinning them would only slow the start.
type hostRequest struct {
	n, align int64
	dma      bool
}

// hostRequests lists the host tensors NewOffloadTrainer allocates for m,
// in allocation order (see newHostState): per layer off the device its
// master (unless on disk), weights, gradients and moments (unless on
// disk), then the disk tier's buffers (aligned for direct I/O), then the
// programs' slots.
func hostRequests(m *Model, o *OffloadOptions, slots []int64) []hostRequest {
	var r []hostRequest
	add := func(ns ...int64) {
		for _, n := range ns {
			r = append(r, hostRequest{n, hostAlign, true})
		}
	}
	addHost := func(ns ...int64) {
		for _, n := range ns {
			r = append(r, hostRequest{n, hostAlign, false})
		}
	}
	// The fp32 master is what the device copies read only when it is the
	// weights too (fp32 compute without DelayedUpdate).
	addMaster := add
	if m.DType != kernels.F32 || o.DelayedUpdate {
		addMaster = addHost
	}
	es := int64(m.DType.Size())
	var ndisk int
	var maxDisk int64
	for i, l := range m.Layers {
		np := int64(l.NumParams())
		cb := np * es
		t := o.optTier(i)
		if t == offload.TierDevice {
			continue // all of it on the device
		}
		if o.forward {
			// The weights alone (forwardHost).
			if m.DType != kernels.F32 {
				addHost(4 * np)
				add(cb)
			} else {
				add(4 * np)
			}
			continue
		}
		if t == offload.TierDisk {
			ndisk++
			maxDisk = max(maxDisk, np)
		}
		// The rank's range when sharded (engine/zero.go), padded to
		// ShardLen, else np; the master whole in fp32 (the weights).
		ns := int64(o.shardCap(i, int(np)))
		if t != offload.TierDisk || !o.DiskMaster {
			if lo, hi := o.masterOf(m.DType, i, int(np)); hi-lo == int(np) {
				addMaster(4 * np)
			} else {
				addMaster(4 * ns)
			}
		}
		if m.DType != kernels.F32 || o.DelayedUpdate {
			add(cb)
		}
		add(cb)
		if o.DelayedUpdate {
			add(cb, cb)
		}
		if t == offload.TierHost {
			addHost(4*ns, 4*ns)
		}
		if o.Speculate && t == offload.TierHost {
			// The second copy (plan.SpecState): the master (the weights
			// in fp32), the weights, the moments.
			addMaster(4 * np)
			if m.DType != kernels.F32 {
				add(cb)
			}
			addHost(4*np, 4*np)
		}
	}
	for range min(ndisk, diskBuffers) {
		r = append(r, hostRequest{4 * maxDisk, offload.DiskAlign, false}, hostRequest{4 * maxDisk, offload.DiskAlign, false})
		if o.DiskMaster {
			r = append(r, hostRequest{4 * maxDisk, offload.DiskAlign, false})
		}
	}
	for _, n := range slots {
		add(4 * ((n + 3) / 4))
	}
	return r
}

// packSlabs lays the requests whose dma field equals dma out in slabs of
// at most hostSlab bytes (a larger request gets a slab of its own): the
// slab sizes and, per request, its slab and offset (the others' are left
// zero).
func packSlabs(req []hostRequest, dma bool) (slabs []int64, at [][2]int64) {
	at = make([][2]int64, len(req))
	for i, rq := range req {
		if rq.dma != dma {
			continue
		}
		n := rq.n
		off := int64(0)
		if k := len(slabs); k > 0 {
			off = (slabs[k-1] + rq.align - 1) &^ (rq.align - 1)
			if off+n <= hostSlab {
				slabs[k-1] = off + n
				at[i] = [2]int64{int64(k - 1), off}
				continue
			}
		}
		slabs = append(slabs, n)
		at[i] = [2]int64{int64(len(slabs) - 1), 0}
	}
	return slabs, at
}

// hostPoolBudget is what the pool must be able to pin for slabs: each
// rounded up to the pool's 4 KiB pages.
func hostPoolBudget(slabs []int64) int64 {
	var n int64
	for _, s := range slabs {
		n += (max(s, 1) + 4095) &^ 4095
	}
	return n
}

// newHostState allocates the host state of every layer of m and of the
// offloaded activations' slots (the slot sizes of the programs), records
// the layers' classes in table, and starts the optimizer worker.
func newHostState(be kernels.Backend, m *Model, o *OffloadOptions, table *offload.Table, slots []int64) (hs *hostState, err error) {
	hs = &hostState{m: m, opts: o, table: table, rec: o.Recorder, host: make([]hostLayer, len(m.Layers)), mdisk: o.DiskMaster}
	defer func() {
		if err != nil {
			hs.close()
			hs = nil
		}
	}()
	var ndisk int
	for i := range m.Layers {
		hs.tier = append(hs.tier, o.optTier(i))
		if hs.tier[i] == offload.TierDisk {
			ndisk++
		}
	}
	if ndisk > 0 {
		if hs.disk, err = offload.OpenDisk(offload.DiskConfig{Dir: o.DiskDir, Budget: o.DiskBudget}); err != nil {
			return hs, err
		}
	}
	req := hostRequests(m, o, slots)
	mem := hs.openMemory(be, req)
	next := 0
	take := func() []byte {
		b := mem(next, req[next])
		hs.bytes += req[next].n
		next++
		return b
	}
	for i, l := range m.Layers {
		h := &hs.host[i]
		np := int64(l.NumParams())
		h.done, h.stored = make(chan struct{}), make(chan struct{})
		close(h.done)
		close(h.stored)
		cb := np * int64(m.DType.Size())
		if hs.tier[i] == offload.TierDevice {
			// Everything on the device, in the executor's persistent
			// blocks: recorded there.
			for _, e := range []struct {
				cl offload.Class
				n  int64
			}{{offload.Weights, cb}, {offload.Master, 4 * np}, {offload.Grads, cb}, {offload.AdamM, 4 * np}, {offload.AdamV, 4 * np}} {
				if err = table.Add(offload.Key{Layer: i, Class: e.cl}, e.n, offload.TierDevice); err != nil {
					return hs, err
				}
			}
			continue
		}
		if o.forward {
			if err = hs.forwardHost(i, take); err != nil {
				return hs, err
			}
			continue
		}
		optTier := hs.tier[i]
		masterAt := offload.TierHost
		// Sharded, the master (but in fp32) and the moments are the
		// rank's range of buffers padded to ShardLen (hostRequests).
		mlo, mhi := o.masterOf(m.DType, i, int(np))
		slo, shi := o.shardOf(i, int(np))
		if optTier == offload.TierDisk && hs.mdisk {
			masterAt = offload.TierDisk
		} else {
			h.master = take()[:4*(mhi-mlo)]
		}
		h.weights = h.master
		if m.DType != kernels.F32 || o.DelayedUpdate {
			h.weights = take()
		}
		h.grads = take()
		if o.DelayedUpdate {
			h.spareW, h.spareG = take(), take()
		}
		if optTier == offload.TierDisk {
			for _, k := range hs.diskKeys(i) {
				if err = hs.disk.Create(k, 4*np); err != nil {
					return hs, err
				}
			}
		} else {
			h.m, h.v = take()[:4*(shi-slo)], take()[:4*(shi-slo)]
		}
		if o.Speculate && optTier == offload.TierHost {
			h.sMaster = take()
			h.sWeights = h.sMaster
			if m.DType != kernels.F32 {
				h.sWeights = take()
			}
			h.sM, h.sV = take(), take()
		}
		// The residency table records every class of the layer; the
		// executor moves the weights, gradients and activations.
		for _, e := range []struct {
			cl offload.Class
			n  int64
			at offload.Tier
		}{
			{offload.Weights, cb, offload.TierHost},
			{offload.Master, 4 * np, masterAt},
			{offload.Grads, cb, offload.TierHost},
			{offload.AdamM, 4 * np, optTier},
			{offload.AdamV, 4 * np, optTier},
		} {
			if err = table.Add(offload.Key{Layer: i, Class: e.cl}, e.n, e.at); err != nil {
				return hs, err
			}
		}
	}
	if ndisk > 0 {
		hs.bufs = make(chan *diskBuf, diskBuffers)
		for range min(diskBuffers, ndisk) {
			b := &diskBuf{m: take(), v: take()}
			if hs.mdisk {
				b.master = take()
			}
			hs.bufs <- b
		}
		hs.ahead = make(chan int, len(m.Layers))
		go hs.readAhead(hs.ahead)
	}
	for range slots {
		hs.slots = append(hs.slots, take())
	}
	work := make(chan func(), len(m.Layers))
	hs.work = work
	go func() {
		for fn := range work {
			fn()
		}
	}()
	return hs, nil
}

// slotAlloc hands out the host slots of offloaded activations (exec
// Config.HostAlloc), in the order the programs list them.
func (hs *hostState) slotAlloc(n int64) []byte {
	b := hs.slots[0]
	hs.slots = hs.slots[1:]
	return b[:n]
}

// openMemory decides where the host state lives: the tensors that copies
// use (hostRequest.dma) in slabs of pinned memory from a pool (what the
// system can pin) and the others in slabs of ordinary anonymous memory
// (zero, faulted in on all cores before the run starts); or, when the system cannot pin that
// much (the pool would degrade to a staging ring), all of it in Go memory
// with the copies staged. It returns the function that yields request i's
// memory.
func (hs *hostState) openMemory(be kernels.Backend, req []hostRequest) func(i int, r hostRequest) []byte {
	o := hs.opts
	var need, dmaBytes int64
	for _, r := range req {
		need += r.n
		if r.dma {
			dmaBytes += r.n
		}
	}
	slabs, at := packSlabs(req, true)
	plainSlabs, plainAt := packSlabs(req, false)
	goMem := func(_ int, r hostRequest) []byte {
		if r.align > hostAlign {
			return offload.AlignedBytes(r.n)
		}
		return offload.NewF32Bytes(r.n)
	}
	// The pool asks for what the state needs, never for the run's whole
	// host budget: a budget above what the system may pin (the default is
	// most of MemAvailable) would degrade a pool that fits with room to
	// spare, and leave the state unpinned.
	budget := hostPoolBudget(slabs)
	if o.HostBudget > 0 && o.HostBudget < budget {
		budget = o.HostBudget
	}
	// The planner's host budget already leaves the margin for the system
	// (HostMargin and the profile's reserve): the pool may pin up to 95%
	// of what is available, not the pool's own default 80%.
	cfg := offload.HostConfig{Budget: max(budget, 1), Pinner: o.HostPinner, ReadLimits: o.HostLimits, AvailableFraction: 0.95}
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
	if err != nil || d.Degraded || d.Granted < hostPoolBudget(slabs) {
		why := d.String()
		if err != nil {
			why = err.Error()
		} else if !d.Degraded {
			why = fmt.Sprintf("the pool may pin %s, the state needs %s", kernels.FormatBytes(d.Granted),
				kernels.FormatBytes(hostPoolBudget(slabs)))
		}
		hs.note = fmt.Sprintf("host state (%s) in unpinned Go memory: %s", kernels.FormatBytes(need), why)
		if err == nil && d.Degraded {
			if hs.stage, err = exec.NewStaging(be, cfg); err != nil {
				hs.note += fmt.Sprintf("; copies unstaged: %v", err)
				return goMem
			}
			hs.note += fmt.Sprintf("; copies pass through %d pinned staging buffers of %s", d.StagingBuffers,
				kernels.FormatBytes(d.StagingSize))
		}
		return goMem
	}
	if hs.pool, err = offload.NewHostPool(cfg); err != nil {
		hs.note = fmt.Sprintf("host state (%s) in unpinned Go memory: %v", kernels.FormatBytes(need), err)
		return goMem
	}
	// The slabs are pinned a few at a time: pinning faults in and locks
	// every page, which one thread does at a GB or two a second.
	hs.slabs = make([]*offload.HostBuf, len(slabs))
	var g errgroup.Group
	g.SetLimit(pinWorkers)
	for i, s := range slabs {
		g.Go(func() error {
			b, ok, err := hs.pool.TryAcquire(max(s, 1))
			if err == nil && !ok {
				err = errors.New("over the pool's budget")
			}
			if err != nil {
				return fmt.Errorf("pinning a slab of %s failed (%w)", kernels.FormatBytes(s), err)
			}
			hs.slabs[i] = b
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		hs.releaseSlabs()
		hs.note = fmt.Sprintf("host state (%s) in unpinned Go memory: %v", kernels.FormatBytes(need), err)
		return goMem
	}
	for _, n := range plainSlabs {
		// Faulted in now, on all cores, rather than by the host AdamW's
		// first update (the moments are first touched there, and a fresh
		// machine faults a GB or so a second on one thread).
		b, err := offload.MmapPinner{Prefault: true}.Pin(max(n, 1))
		if err != nil {
			hs.releaseSlabs()
			hs.note = fmt.Sprintf("host state (%s) in unpinned Go memory: %v", kernels.FormatBytes(need), err)
			return goMem
		}
		hs.plain = append(hs.plain, b)
	}
	hs.pinned = true
	hs.note = fmt.Sprintf("host state (%s): %s that copies use pinned in %d slabs (%s; %s), %s only the host uses in %d slabs of ordinary memory",
		kernels.FormatBytes(need), kernels.FormatBytes(dmaBytes), len(slabs), kind, d, kernels.FormatBytes(need-dmaBytes), len(plainSlabs))
	return func(i int, r hostRequest) []byte {
		// Fresh pins and mappings are zero: nothing to clear.
		if r.dma {
			a := at[i]
			return hs.slabs[a[0]].Bytes()[a[1] : a[1]+r.n : a[1]+r.n]
		}
		a := plainAt[i]
		return hs.plain[a[0]].Bytes()[a[1] : a[1]+r.n : a[1]+r.n]
	}
}

// releaseSlabs gives back the pinned slabs and frees the ordinary ones.
func (hs *hostState) releaseSlabs() {
	for _, b := range hs.slabs {
		if b != nil {
			b.Release()
		}
	}
	for _, b := range hs.plain {
		if err := b.Free(); err != nil {
			hs.recErr(err)
		}
	}
	hs.slabs, hs.plain = nil, nil
}

// close waits for the updates and releases the host memory and the disk
// tier; no queued copy may use the memory any more.
func (hs *hostState) close() {
	for i := range hs.host {
		if hs.host[i].done != nil {
			<-hs.host[i].done
		}
		if hs.host[i].stored != nil {
			<-hs.host[i].stored
		}
	}
	if hs.work != nil {
		close(hs.work)
		hs.work = nil
	}
	if hs.ahead != nil {
		close(hs.ahead)
		hs.ahead = nil
	}
	if hs.disk != nil {
		_ = hs.disk.Close()
		hs.disk = nil
	}
	if hs.stage != nil {
		hs.stage.Close()
		hs.stage = nil
	}
	hs.releaseSlabs()
	hs.host = nil
	if hs.pool != nil {
		_ = hs.pool.Close()
		hs.pool = nil
	}
}

// rec keeps the first residency transition the table refused.
func (hs *hostState) recErr(err error) {
	if err == nil {
		return
	}
	hs.mu.Lock()
	if hs.tabErr == nil {
		hs.tabErr = err
	}
	hs.mu.Unlock()
}

// Weights implements exec.Host: layer l's compute-dtype weights, once its
// last update is done (except with DelayedUpdate, whose update runs
// during this step and writes the other buffer).
func (hs *hostState) Weights(ctx context.Context, l int) ([]byte, error) {
	if hs.tier[l] == offload.TierDevice {
		return nil, fmt.Errorf("engine: layer %s is updated on the device: its weights have no host copy", hs.m.Layers[l].Name())
	}
	if !hs.opts.DelayedUpdate {
		if err := hs.waitLayer(ctx, l); err != nil {
			return nil, err
		}
	}
	return hs.host[l].weights, nil
}

// Grads implements exec.Host.
func (hs *hostState) Grads(l int) []byte { return hs.host[l].grads }

// GradsOut implements exec.Host: with eager updates, layer l's update
// starts once its gradients have landed; with speculative ones, its
// speculative update.
func (hs *hostState) GradsOut(l int, ev kernels.Event) {
	hs.host[l].gradEv = ev
	switch {
	case hs.eager != nil:
		hs.launchUpdate(context.Background(), l, *hs.eager, true)
		hs.launched++
	case hs.spec != nil && hs.host[l].sM != nil:
		hs.launchSpec(context.Background(), l, *hs.spec)
	}
}

// setMaster stores layer i's fp32 master weights (and the compute copy,
// rounded as the device Cast rounds): fill writes the master in place.
func (hs *hostState) setMaster(i int, fill func(master []float32)) error {
	if err := hs.waitLayer(context.Background(), i); err != nil {
		return err
	}
	if hs.tier[i] == offload.TierDevice {
		return hs.setDeviceMaster(i, fill)
	}
	h := &hs.host[i]
	if hs.opts.sharded(i) {
		return hs.setShardMaster(i, fill)
	}
	master := h.master
	if master == nil {
		// On disk: filled in one of the disk tier's buffers (nothing
		// else uses them between steps) and stored.
		buf := <-hs.bufs
		defer func() { hs.bufs <- buf }()
		master = buf.master[:4*hs.m.Layers[i].NumParams()]
	}
	fill(offload.F32s(master))
	switch {
	case hs.m.DType == kernels.F32:
		if len(h.weights) > 0 && &h.weights[0] != &master[0] {
			copy(h.weights, master)
		}
	default:
		cpu.StoreF32(h.weights, hs.m.DType, offload.F32s(master))
	}
	if h.master == nil {
		ctx := context.Background()
		if err := hs.disk.Store(ctx, offload.Key{Layer: i, Class: offload.Master}, master).Wait(ctx); err != nil {
			return fmt.Errorf("engine: layer %s: storing its master weights: %w", hs.m.Layers[i].Name(), err)
		}
	}
	return hs.markHostModified(i)
}

// markHostModified records that layer i's weights and master changed on
// the host (device copies are stale).
func (hs *hostState) markHostModified(i int) error {
	for _, cl := range []offload.Class{offload.Weights, offload.Master} {
		k := offload.Key{Layer: i, Class: cl}
		if r, _ := hs.table.Get(k); r.Valid.Has(offload.TierHost) {
			if err := hs.table.Modified(k, offload.TierHost); err != nil {
				return err
			}
		}
	}
	return nil
}

// setMasters runs setMaster for every layer, the layers spread over the
// cores.
func (hs *hostState) setMasters(fill func(i int, master []float32)) error {
	if err := hs.waitUpdates(); err != nil {
		return err
	}
	var g errgroup.Group
	g.SetLimit(runtime.GOMAXPROCS(0))
	for i := range hs.host {
		g.Go(func() error { return hs.setMaster(i, func(m []float32) { fill(i, m) }) })
	}
	err := g.Wait()
	hs.dropStage()
	return err
}

// optim returns copies of layer i's master, m and v (fp32 bytes).
func (hs *hostState) optim(ctx context.Context, i int) (master, m, v []byte, err error) {
	if err := hs.waitUpdates(); err != nil {
		return nil, nil, nil, err
	}
	if hs.tier[i] == offload.TierDevice {
		return hs.deviceOptim(ctx, i)
	}
	h := &hs.host[i]
	if hs.tier[i] == offload.TierHost {
		return append([]byte(nil), h.master...), append([]byte(nil), h.m...), append([]byte(nil), h.v...), nil
	}
	n := 4 * int64(hs.m.Layers[i].NumParams())
	master, m, v = offload.NewF32Bytes(n), offload.NewF32Bytes(n), offload.NewF32Bytes(n)
	if h.master != nil {
		copy(master, h.master)
	}
	for j, k := range hs.diskKeys(i) {
		err = errors.Join(err, hs.disk.Load(ctx, k, [][]byte{m, v, master}[j]).Wait(ctx))
	}
	return master, m, v, err
}

// setOptim stores layer i's moments.
func (hs *hostState) setOptim(ctx context.Context, i int, m, v []byte) error {
	if err := hs.waitUpdates(); err != nil {
		return err
	}
	if hs.tier[i] == offload.TierDevice {
		return hs.setDeviceOptim(ctx, i, m, v)
	}
	h := &hs.host[i]
	if hs.tier[i] == offload.TierHost {
		es := 4
		np := hs.m.Layers[i].NumParams()
		copy(h.m, hs.opts.shardSlice(m, i, np, es)) // the rank's range when sharded
		copy(h.v, hs.opts.shardSlice(v, i, np, es))
		return nil
	}
	return errors.Join(hs.disk.Store(ctx, offload.Key{Layer: i, Class: offload.AdamM}, m).Wait(ctx),
		hs.disk.Store(ctx, offload.Key{Layer: i, Class: offload.AdamV}, v).Wait(ctx))
}

// Checkpoint tensors: a checkpoint streams each parameter's master and
// moments one tensor at a time from (and back to) the tier that holds
// them, so that saving or resuming takes at most one tensor's worth of
// extra host memory (engine/checkpoint.go). The caller has waited for the
// updates (waitUpdates) and runs no step meanwhile.

// ckptMaster, ckptM and ckptV are the tensors a checkpoint keeps of each
// parameter.
const (
	ckptMaster = iota
	ckptM
	ckptV
)

// ckptClass is the class of a checkpoint tensor kind.
var ckptClass = [3]offload.Class{offload.Master, offload.AdamM, offload.AdamV}

// tensorSource is parameter ps of layer i's tensor of kind (ckptMaster,
// ckptM, ckptV) for a checkpoint: data, a view of the host memory that
// holds it, or fill, which reads it from the device or the disk tier.
func (hs *hostState) tensorSource(ctx context.Context, i, kind int, ps ParamSpec) (data []byte, fill func([]byte) error) {
	lo, hi := 4*int64(ps.Offset), 4*int64(ps.Offset+ps.Elems())
	switch {
	case hs.opts.sharded(i):
		panic("engine: tensorSource of a sharded layer (gathered by Trainer.CheckpointTensors)")
	case hs.tier[i] == offload.TierDevice:
		return nil, func(dst []byte) error {
			hs.dev.mu.Lock()
			defer hs.dev.mu.Unlock()
			d := hs.devLayer(i)
			hs.dev.be.CopyToHost(hs.dev.q, dst, param([3]kernels.Tensor{d.master, d.m, d.v}[kind], ps))
			return hs.dev.q.Synchronize(ctx)
		}
	case hs.tier[i] == offload.TierDisk && (kind != ckptMaster || hs.mdisk):
		k := offload.Key{Layer: i, Class: ckptClass[kind]}
		return nil, func(dst []byte) error { return hs.disk.ReadAt(ctx, k, dst, lo) }
	}
	h := &hs.host[i]
	return [3][]byte{h.master, h.m, h.v}[kind][lo:hi], nil
}

// setTensor stores data as parameter ps of layer i's tensor of kind where
// the layer keeps it; a master also sets the compute-dtype weights (rounded
// as the device Cast rounds), whose device copies become stale.
func (hs *hostState) setTensor(ctx context.Context, i, kind int, ps ParamSpec, data []byte) error {
	lo, hi := 4*int64(ps.Offset), 4*int64(ps.Offset+ps.Elems())
	if hs.opts.sharded(i) {
		return hs.setShardTensor(i, kind, ps, data)
	}
	if hs.tier[i] == offload.TierDevice {
		hs.dev.mu.Lock()
		defer hs.dev.mu.Unlock()
		d := hs.devLayer(i)
		be, q := hs.dev.be, hs.dev.q
		be.CopyToDevice(q, param([3]kernels.Tensor{d.master, d.m, d.v}[kind], ps), data)
		if kind == ckptMaster && d.weights.Buf != d.master.Buf {
			be.Cast(q, param(d.weights, ps), param(d.master, ps))
		}
		return q.Synchronize(ctx) // data must outlive the copy
	}
	h := &hs.host[i]
	if hs.tier[i] == offload.TierDisk && (kind != ckptMaster || hs.mdisk) {
		if err := hs.disk.WriteAt(ctx, offload.Key{Layer: i, Class: ckptClass[kind]}, data, lo); err != nil {
			return err
		}
	} else {
		copy([3][]byte{h.master, h.m, h.v}[kind][lo:hi], data)
	}
	if kind != ckptMaster {
		return nil
	}
	es := int64(hs.m.DType.Size())
	w := h.weights[lo/4*es : hi/4*es]
	switch {
	case hs.m.DType != kernels.F32:
		cpu.StoreF32(w, hs.m.DType, offload.F32s(data))
	case h.master == nil || &w[0] != &h.master[lo]:
		copy(w, data)
	}
	return hs.markHostModified(i)
}
